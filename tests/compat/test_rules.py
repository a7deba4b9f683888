"""Rules: severity follows what was asked, and each rule fires on exactly its condition."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dsa_export.compat.probe import ComponentRecord, EnvironmentProbe
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

    report = run_checks(CheckSettings(), fixture_probe("cudnn805"))
    finding = next(f for f in report.findings if f.id == "cudnn_8_0_5_dsa_slowdown")
    assert finding.message.startswith("cuDNN 8.0.5 ") and finding.source
    fixed = _with(fixture_probe("cudnn805"), "cudnn", version="8.2.0")
    assert "cudnn_8_0_5_dsa_slowdown" not in _ids(run_checks(CheckSettings(), fixed))


def test_report_json_is_stable_and_complete(a100: EnvironmentProbe) -> None:
    first = run_checks(CheckSettings(backend="tensorrt", precision="fp8"), a100).to_json()
    second = run_checks(CheckSettings(backend="tensorrt", precision="fp8"), a100).to_json()
    assert first == second
    data = json.loads(first)
    assert set(data) == {
        "schema_version", "dsa_export_version", "matrix_version", "request", "ok",
        "blocking", "counts", "findings", "engine", "environment",
    }  # fmt: skip
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
