"""Rules: severity follows what was asked, and each rule fires on exactly its condition."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dsa_export.compat.records import ComponentRecord, EnvironmentProbe
from dsa_export.compat.rules import (
    CheckSettings,
    manifest_record,
    require_no_blocking,
    run_checks,
)
from dsa_export.errors import DSAUsageError, DSAUserError


def _ids(report) -> list[str]:
    return [finding.id for finding in report.findings]


def _with(probe: EnvironmentProbe, name: str, **changes) -> EnvironmentProbe:
    """A copy of ``probe`` whose component ``name`` has ``changes`` (details merged)."""
    copy = EnvironmentProbe.from_dict(probe.to_dict())
    record = copy.component(name)
    details = {**record.details, **changes.pop("details", {})}
    copy.components[name] = dataclasses.replace(record, details=details, **changes)
    return copy


def _severity(report, finding_id: str) -> str:
    return next(f.severity for f in report.findings if f.id == finding_id)


def test_missing_driver_is_a_warning_until_a_gpu_build_is_asked(cpu_only: EnvironmentProbe) -> None:
    plain = run_checks(CheckSettings(), cpu_only)
    build = run_checks(CheckSettings(for_build=True, backend="tensorrt"), cpu_only)
    assert _severity(plain, "no_nvidia_driver") == "warning" and plain.exit_code == 0
    assert _severity(build, "no_nvidia_driver") == "error" and build.exit_code == 1


def test_backend_or_precision_implies_for_build() -> None:
    assert CheckSettings(backend="tensorrt").validated().for_build
    assert CheckSettings(precision="fp8").validated().for_build
    assert not CheckSettings().validated().for_build


@pytest.mark.parametrize(
    "settings",
    [CheckSettings(backend="tvm"), CheckSettings(precision="int4"), CheckSettings(device=-1)],
)
def test_invalid_settings_are_usage_errors(
    settings: CheckSettings, cpu_only: EnvironmentProbe
) -> None:
    with pytest.raises(DSAUsageError):
        run_checks(settings, cpu_only)


def test_driver_between_compat_floor_and_toolkit_driver_is_a_warning(
    a100: EnvironmentProbe,
) -> None:
    probe = _with(
        a100, "driver", version="535.104.05"
    )  # CUDA 12.4 wants 550.54.14, 12.x floor is 525.60.13
    report = run_checks(CheckSettings(backend="tensorrt"), probe)
    assert _severity(report, "driver_minor_version_compat") == "warning"
    assert "driver_too_old_for_cuda" not in _ids(report) and report.exit_code == 0


def test_driver_below_compat_floor_blocks_even_a_plain_check(a100: EnvironmentProbe) -> None:
    report = run_checks(CheckSettings(), _with(a100, "driver", version="470.82.01"))
    assert [f.id for f in report.blocking] == ["driver_too_old_for_cuda"]


def test_driver_check_falls_back_to_libcuda_for_cuda_releases_not_in_the_matrix(
    a100: EnvironmentProbe,
) -> None:
    probe = _with(a100, "cuda_runtime", version="14.0")
    probe = _with(probe, "driver", version="999.1")
    report = run_checks(CheckSettings(), probe)
    assert "driver_too_old_for_cuda" in _ids(report)  # libcuda says 12.4 < 14


def test_tensorrt_module_and_library_disagree(a100: EnvironmentProbe) -> None:
    probe = _with(a100, "tensorrt", details={"library_version": "10.0.1.6"})
    assert _severity(run_checks(CheckSettings(), probe), "tensorrt_version_mismatch") == "warning"
    assert (
        _severity(run_checks(CheckSettings(backend="tensorrt"), probe), "tensorrt_version_mismatch")
        == "error"
    )


def test_tensorrt_that_fails_to_import_is_named(a100: EnvironmentProbe) -> None:
    error = "import tensorrt failed: libnvinfer.so.10: undefined symbol: _ZN5cudnn"
    probe = _with(
        a100, "tensorrt", found=False, version=None, reason=error, details={"import_error": error}
    )
    report = run_checks(CheckSettings(backend="tensorrt"), probe)
    assert [f.id for f in report.blocking] == ["tensorrt_import_failed"]
    assert "undefined symbol" in report.blocking[0].message


def test_tensorrt_release_missing_from_matrix_is_information(a100: EnvironmentProbe) -> None:
    report = run_checks(
        CheckSettings(backend="tensorrt"), _with(a100, "tensorrt", version="7.2.3.4", details={})
    )
    assert _severity(report, "tensorrt_not_in_matrix") == "info"


def test_tensorrt_cuda_mismatch(a100: EnvironmentProbe) -> None:
    probe = _with(a100, "cuda_runtime", version="13.0")
    probe = _with(probe, "driver", version="580.95.05")
    probe = _with(probe, "cuda_driver", version="13.0")
    report = run_checks(CheckSettings(backend="tensorrt"), probe)
    assert "tensorrt_cuda_unsupported" in [f.id for f in report.blocking]


def test_plugin_library_built_for_another_tensorrt(h200: EnvironmentProbe) -> None:
    probe = _with(h200, "plugin_library", details={"built_for_tensorrt_major": "10"})
    assert [f.id for f in run_checks(CheckSettings(backend="tensorrt"), probe).blocking] == [
        "plugin_library_tensorrt_mismatch"
    ]
    assert (
        _severity(run_checks(CheckSettings(), probe), "plugin_library_tensorrt_mismatch")
        == "warning"
    )


@pytest.mark.parametrize(
    ("archs", "blocked"),
    [
        ({"sass": ["8.0"], "ptx": []}, True),
        ({"sass": ["8.0"], "ptx": ["12.0"]}, True),  # PTX only JITs forward
        ({"sass": ["8.0"], "ptx": ["8.0"]}, False),
        ({"sass": ["9.0"], "ptx": []}, False),
    ],
)
def test_plugin_library_gpu_coverage(h200: EnvironmentProbe, archs: dict, blocked: bool) -> None:
    probe = _with(h200, "plugin_library", details={"cuda_architectures": archs})
    report = run_checks(CheckSettings(backend="tensorrt"), probe)
    assert ("plugin_library_gpu_unsupported" in [f.id for f in report.blocking]) is blocked


def test_two_onnxruntime_packages_are_flagged(a100: EnvironmentProbe) -> None:
    probe = _with(
        a100,
        "onnxruntime",
        details={"distributions": {"onnxruntime": "1.18.0", "onnxruntime-gpu": "1.18.0"}},
    )
    assert (
        _severity(run_checks(CheckSettings(), probe), "onnxruntime_conflicting_packages")
        == "warning"
    )


def test_cudnn_built_for_other_cuda_major(a100: EnvironmentProbe) -> None:
    probe = _with(a100, "cudnn", details={"built_for_cuda": "11.8"})
    report = run_checks(CheckSettings(backend="onnxruntime"), probe)
    assert "cudnn_cuda_mismatch" in [f.id for f in report.blocking]


def test_gpu_index_out_of_range(a100: EnvironmentProbe) -> None:
    report = run_checks(CheckSettings(device=3), a100)
    assert [f.id for f in report.blocking] == ["gpu_index_out_of_range"]


def test_known_bad_message_names_the_installed_version() -> None:
    from .helpers import fixture_probe

    ort = CheckSettings(backend="onnxruntime")
    report = run_checks(ort, fixture_probe("cudnn805"))
    finding = next(f for f in report.findings if f.id == "cudnn_8_0_5_dsa_slowdown")
    assert "cuDNN 8.0.5 " in finding.message and "unverified" in finding.source
    fixed = _with(fixture_probe("cudnn805"), "cudnn", version="8.2.0")
    assert "cudnn_8_0_5_dsa_slowdown" not in _ids(run_checks(ort, fixed))


def test_report_json_is_stable_and_complete(a100: EnvironmentProbe) -> None:
    first = run_checks(CheckSettings(backend="tensorrt", precision="fp8"), a100).to_json()
    second = run_checks(CheckSettings(backend="tensorrt", precision="fp8"), a100).to_json()
    assert first == second
    data = json.loads(first)
    assert set(data) == {
        "schema_version", "dsa_export_version", "matrix_version", "matrix", "request", "ok",
        "blocking", "counts", "findings", "engine", "environment",
    }  # fmt: skip
    assert data["matrix"]["version"] == data["matrix_version"] and data["matrix"]["date"]
    assert data["ok"] is False and data["blocking"] == ["precision_unsupported"]
    assert data["request"] == {
        "for_build": True, "backend": "tensorrt", "resolved_backend": "tensorrt",
        "precision": "fp8", "device": 0, "engine": None,
    }  # fmt: skip
    severities = [f["severity"] for f in data["findings"]]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)


def test_gate_helpers(a100: EnvironmentProbe) -> None:
    blocked = run_checks(CheckSettings(backend="tensorrt", precision="fp8"), a100)
    with pytest.raises(
        DSAUserError, match="FP8 on tensorrt needs compute capability 8.9.*--skip-checks"
    ):
        require_no_blocking(blocked)
    require_no_blocking(run_checks(CheckSettings(backend="tensorrt"), a100))
    assert manifest_record(None, skipped=True) == {"skipped": True, "findings": []}
    record = manifest_record(blocked, skipped=False)
    assert (
        record["skipped"] is False
        and {"id": "precision_unsupported", "severity": "error"} in record["findings"]
    )


def test_a_component_missing_from_an_old_snapshot_is_not_probed(a100: EnvironmentProbe) -> None:
    probe = EnvironmentProbe.from_dict(a100.to_dict())
    del probe.components["polygraphy"]
    assert probe.component("polygraphy") == ComponentRecord(
        "polygraphy", False, reason="not probed"
    )
    assert "polygraphy_missing" in _ids(run_checks(CheckSettings(), probe))


def test_onnxruntime_tensorrt_provider_built_for_another_tensorrt(a100: EnvironmentProbe) -> None:
    report = run_checks(
        CheckSettings(), a100
    )  # onnxruntime-gpu 1.18 is built for TensorRT 10.0, 10.3 installed
    assert _severity(report, "onnxruntime_tensorrt_mismatch") == "warning"
    matching = _with(
        a100,
        "tensorrt",
        version="10.0.1.6",
        details={"module_version": "10.0.1.6", "library_version": "10.0.1.6"},
    )
    assert "onnxruntime_tensorrt_mismatch" not in _ids(run_checks(CheckSettings(), matching))


# ---------------------------------------------------------------------------------------------
# Gaps found when the matrix was checked against the vendors' documents


def test_onnxruntime_release_missing_from_matrix_is_information(a100: EnvironmentProbe) -> None:
    probe = _with(a100, "onnxruntime", version="1.99.0")
    assert _severity(run_checks(CheckSettings(), probe), "onnxruntime_not_in_matrix") == "info"


def test_cuda_release_missing_from_matrix_is_information_and_keeps_the_major_floor(
    a100: EnvironmentProbe,
) -> None:
    probe = _with(a100, "cuda_runtime", version="12.7")  # no CUDA 12.7 was ever released
    assert _severity(run_checks(CheckSettings(), probe), "cuda_not_in_matrix") == "info"
    old = _with(probe, "driver", version="520.61.05")  # below the 12.x floor of 525
    assert "driver_too_old_for_cuda" in [f.id for f in run_checks(CheckSettings(), old).blocking]


def test_tensorrt_driver_floor_is_checked() -> None:
    from .helpers import fixture_probe

    probe = _with(fixture_probe("l40s_cuda129_trt11"), "cuda_runtime", version="12.1")
    probe = _with(probe, "driver", version="530.30.02")  # runs CUDA 12.1, below TensorRT 11's r535
    report = run_checks(CheckSettings(backend="tensorrt"), probe)
    assert "tensorrt_driver_too_old" in [f.id for f in report.blocking]
    assert _severity(run_checks(CheckSettings(), probe), "tensorrt_driver_too_old") == "warning"


def test_cudnn_anecdote_is_information_for_cudnn_backends_only() -> None:
    from .helpers import fixture_probe

    probe = fixture_probe("cudnn805")
    assert "cudnn_8_0_5_dsa_slowdown" not in _ids(run_checks(CheckSettings(), probe))
    assert "cudnn_8_0_5_dsa_slowdown" not in _ids(
        run_checks(CheckSettings(backend="tensorrt"), probe)
    )
    ort = run_checks(CheckSettings(backend="onnxruntime"), probe)
    finding = next(f for f in ort.findings if f.id == "cudnn_8_0_5_dsa_slowdown")
    assert finding.severity == "info" and finding.message.startswith("Anecdote")


def test_cudnn_9_17_excludes_volta() -> None:
    from .helpers import fixture_probe

    probe = _with(
        fixture_probe("volta_trt105"),
        "cudnn",
        version="9.17.0",
        details={"built_for_cuda": "12.9", "raw": 91700},
    )
    report = run_checks(CheckSettings(backend="onnxruntime"), probe)
    assert "cudnn_gpu_unsupported" in [f.id for f in report.blocking]


def test_cudnn_release_missing_from_matrix_is_information(a100: EnvironmentProbe) -> None:
    probe = _with(a100, "cudnn", version="9.99.0", details={"built_for_cuda": "12.9"})
    assert _severity(run_checks(CheckSettings(), probe), "cudnn_not_in_matrix") == "info"


def test_implicit_int8_is_deprecated_from_tensorrt_10_1(a100: EnvironmentProbe) -> None:
    trt_10_0 = _with(
        a100,
        "tensorrt",
        version="10.0.1.6",
        details={"module_version": "10.0.1.6", "library_version": "10.0.1.6"},
    )
    int8 = CheckSettings(backend="tensorrt", precision="int8")
    assert "tensorrt10_implicit_int8_deprecated" not in _ids(run_checks(int8, trt_10_0))
    assert "tensorrt10_implicit_int8_deprecated" in _ids(run_checks(int8, a100))


def test_build_below_tensorrt_10_7_warns_that_function_bodies_win(a100: EnvironmentProbe) -> None:
    report = run_checks(CheckSettings(backend="tensorrt"), a100)  # TensorRT 10.3
    finding = next(f for f in report.findings if f.id == "tensorrt_function_bodies_before_plugins")
    assert finding.severity == "warning" and "10.7" in finding.fix
    trt_10_7 = _with(
        a100,
        "tensorrt",
        version="10.7.0.23",
        details={"module_version": "10.7.0.23", "library_version": "10.7.0.23"},
    )
    assert "tensorrt_function_bodies_before_plugins" not in _ids(
        run_checks(CheckSettings(backend="tensorrt"), trt_10_7)
    )


def test_a_finding_from_an_unverified_row_is_information_only(tmp_path) -> None:
    from dsa_export.compat.matrix import MATRIX_PATH

    from .helpers import fixture_probe

    data = json.loads(MATRIX_PATH.read_text())
    row = next(r for r in data["tensorrt"] if r["versions"].startswith(">=10.13.0,"))
    row["evidence"] = [e for e in row["evidence"] if "cuda" not in e["fields"]]
    row["unverified"] = {"cuda": "pretend no published text supports it"}
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(data))
    probe = fixture_probe("a10_cuda130_trt10130")
    report = run_checks(CheckSettings(backend="tensorrt", matrix_path=path), probe)
    finding = next(f for f in report.findings if f.id == "tensorrt_cuda_unsupported")
    assert finding.severity == "info" and finding.verified is False and report.ok


def test_the_toolkits_own_driver_runs_cuda_11_0_below_the_11x_floor(a100: EnvironmentProbe) -> None:
    probe = _with(a100, "cuda_runtime", version="11.0")
    ok = _with(probe, "driver", version="450.51.05")  # CUDA 11.0.2 GA's driver, below 450.80.02
    assert "driver_too_old_for_cuda" not in _ids(run_checks(CheckSettings(), ok))
    old = _with(probe, "driver", version="450.36.06")
    assert "driver_too_old_for_cuda" in [f.id for f in run_checks(CheckSettings(), old).blocking]


def test_onnxruntime_build_info_picks_the_build() -> None:
    from .helpers import fixture_probe

    ort = CheckSettings(backend="onnxruntime")
    cuda12 = _with(
        fixture_probe("a10g_cuda118_ort1181"), "onnxruntime", details={"build_cuda_version": "12.2"}
    )  # the CUDA 12 build of 1.18.1 (cuDNN 9) on a CUDA 11.8 machine
    blocked = [f.id for f in run_checks(ort, cuda12).blocking]
    assert blocked == ["onnxruntime_cuda_mismatch", "onnxruntime_cudnn_mismatch"]
    unknown = _with(
        fixture_probe("a10g_cuda118_ort1181"),
        "onnxruntime",
        version="1.22.0",
        details={"build_cuda_version": "11.8"},
    )  # 1.22 ships CUDA 12 packages only
    assert _severity(run_checks(ort, unknown), "onnxruntime_build_not_in_matrix") == "info"


def test_cudnn_without_a_build_for_the_cuda_major() -> None:
    from .helpers import fixture_probe

    probe = _with(
        fixture_probe("a10g_cuda118_ort1181"),
        "cudnn",
        version="9.17.0",
        details={"built_for_cuda": "11.8"},
    )  # cuDNN 9.17 ships CUDA 12 and 13 builds only
    report = run_checks(CheckSettings(backend="onnxruntime"), probe)
    assert "cudnn_cuda_unsupported" in [f.id for f in report.blocking]
