"""Probes tolerate every failure, fall back in order, and report the live machine honestly."""

from __future__ import annotations

import _ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from dsa_export.compat import probe as probe_module
from dsa_export.compat import probe_nvidia
from dsa_export.compat.probe import (
    PLUGIN_NOT_BUILT,
    plugin_library_state,
    probe_environment,
    probe_plugin_library,
)
from dsa_export.compat.probe_nvidia import (
    apply_visible_devices,
    parse_nvcc_version,
    parse_nvidia_smi_csv,
    probe_driver_and_gpus,
)
from dsa_export.compat.records import (
    COMPONENTS,
    ComponentRecord,
    EnvironmentProbe,
    GpuRecord,
    ProbeSettings,
    load_snapshot,
)
from dsa_export.errors import DSAUserError
from dsa_export.fileio import sha256_file

from .helpers import FIXTURES


def test_parse_nvidia_smi_with_compute_capability() -> None:
    text = "0, NVIDIA H200, 9.0, 143771, 580.95.05\n1, NVIDIA H200, 9.0, 143771, 580.95.05\n"
    driver, gpus = parse_nvidia_smi_csv(text)
    assert driver == "580.95.05"
    assert [(g.index, g.name, g.compute_capability, g.memory_total_mib) for g in gpus] == [
        (0, "NVIDIA H200", "9.0", 143771),
        (1, "NVIDIA H200", "9.0", 143771),
    ]


def test_parse_nvidia_smi_without_compute_capability() -> None:
    driver, gpus = parse_nvidia_smi_csv("0, Tesla T4, 15360, 470.57.02\n", with_compute_cap=False)
    assert (
        driver == "470.57.02"
        and gpus[0].compute_capability is None
        and gpus[0].memory_total_mib == 15360
    )


def test_parse_nvcc_version() -> None:
    text = (
        "Cuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0"
    )
    assert parse_nvcc_version(text) == "13.0.88"
    assert parse_nvcc_version("release 11.1") == "11.1"
    assert parse_nvcc_version("garbage") is None


def _fake_tool(folder: Path, name: str, script: str) -> Path:
    tool = folder / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return tool


def _without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_nvidia, "_probe_nvml", lambda: "nvidia-ml-py is not installed")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_driver_falls_back_to_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _without_nvml(monkeypatch)
    _fake_tool(tmp_path, "nvidia-smi", 'echo "0, NVIDIA A100-SXM4-80GB, 8.0, 81920, 550.54.15"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    record, gpus = probe_driver_and_gpus(ProbeSettings())
    assert record.found and record.version == "550.54.15"
    assert record.details["source"] == "nvidia-smi"
    assert record.details["fallback_reasons"] == ["nvidia-ml-py is not installed"]
    assert gpus[0].compute_capability == "8.0"


def test_old_nvidia_smi_without_compute_cap_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_nvml(monkeypatch)
    script = 'case "$1" in *compute_cap*) echo "Field compute_cap is not a valid field" >&2; exit 2;; esac\n'
    script += 'echo "0, Tesla T4, 15360, 450.80.02"\n'
    _fake_tool(tmp_path, "nvidia-smi", script)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    record, gpus = probe_driver_and_gpus(ProbeSettings())
    assert record.version == "450.80.02" and gpus[0].compute_capability is None
    assert "cannot report compute capability" in record.details["note"]


def test_hung_nvidia_smi_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _without_nvml(monkeypatch)
    _fake_tool(tmp_path, "nvidia-smi", "sleep 5\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(
        probe_nvidia, "_probe_procfs", lambda: "/proc/driver/nvidia/version does not exist"
    )
    started = time.monotonic()
    record, gpus = probe_driver_and_gpus(ProbeSettings(subprocess_timeout_s=0.3))
    assert time.monotonic() - started < 3
    assert not record.found and gpus == []
    assert "did not answer within 0.3 s" in record.reason


def test_a_crashing_probe_becomes_a_record(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(settings: ProbeSettings) -> ComponentRecord:
        raise RuntimeError("segfault avoided")

    monkeypatch.setitem(probe_module.PROBES, "nvcc", explode)
    result = probe_environment(ProbeSettings(components=("nvcc",)))
    record = result.component("nvcc")
    assert not record.found and record.reason == "probe failed: RuntimeError: segfault avoided"


def test_a_hanging_probe_is_cut_off_without_holding_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def hang(settings: ProbeSettings) -> ComponentRecord:
        time.sleep(10)
        return ComponentRecord("nvcc", True, "0")

    monkeypatch.setitem(probe_module.PROBES, "nvcc", hang)
    monkeypatch.setitem(
        probe_module.PROBES, "polygraphy", lambda s: ComponentRecord("polygraphy", True, "9.9")
    )
    started = time.monotonic()
    result = probe_environment(ProbeSettings(timeout_s=0.5, components=("nvcc", "polygraphy")))
    assert time.monotonic() - started < 3
    assert result.component("nvcc").reason.startswith("not probed (timed out after 0.5 s")
    assert result.component("nvcc").details == {"timed_out_s": 0.5}
    assert result.component("polygraphy").version == "9.9"


def test_plugin_library_env_var_pointing_nowhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DSA_EXPORT_PLUGIN_LIB", str(tmp_path / "missing.so"))
    record = probe_plugin_library(ProbeSettings())
    assert not record.found and "DSA_EXPORT_PLUGIN_LIB points to" in record.reason


def test_plugin_library_from_env_var_is_described(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSA_EXPORT_PLUGIN_LIB", _ctypes.__file__)
    record = probe_plugin_library(ProbeSettings())
    assert record.found
    assert record.details["sha256"] == sha256_file(_ctypes.__file__)
    assert record.details["source"] == "$DSA_EXPORT_PLUGIN_LIB"
    assert record.details["cuda_architectures"] == {"sass": [], "ptx": []}
    assert isinstance(record.details["needed"], list)


@pytest.mark.parametrize(
    ("find_library", "found", "reason_part"),
    [
        (lambda: None, False, PLUGIN_NOT_BUILT),
        (
            lambda: (_ for _ in ()).throw(FileNotFoundError("no build folder")),
            False,
            "no build folder",
        ),
        (lambda: _ctypes.__file__, True, None),
        (lambda: "/nonexistent/libdsa_plugins.so", False, "does not exist"),
    ],
)
def test_plugin_library_from_plugins_package(
    monkeypatch: pytest.MonkeyPatch, find_library, found, reason_part
) -> None:
    monkeypatch.delenv("DSA_EXPORT_PLUGIN_LIB", raising=False)
    monkeypatch.setitem(
        sys.modules, "dsa_export.plugins", types.SimpleNamespace(find_library=find_library)
    )
    record = probe_plugin_library(ProbeSettings())
    assert record.found is found
    if reason_part:
        assert reason_part in record.reason


def test_plugin_library_without_plugins_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSA_EXPORT_PLUGIN_LIB", raising=False)
    monkeypatch.setitem(sys.modules, "dsa_export.plugins", None)  # import raises ImportError
    record = probe_plugin_library(ProbeSettings())
    assert record.reason == "plugin library: not built (run `dsa-export plugins build`)"


def test_snapshot_round_trip_and_loading(tmp_path: Path) -> None:
    original = EnvironmentProbe.from_dict(
        json.loads((FIXTURES / "a100_cuda124_trt103.json").read_text())["probe"]
    )
    assert EnvironmentProbe.from_dict(original.to_dict()) == original
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"schema_version": 1, "environment": original.to_dict()}))
    assert load_snapshot(report) == original
    assert load_snapshot(FIXTURES / "a100_cuda124_trt103.json") == original


@pytest.mark.parametrize("content", ["{not json", '{"schema_version": 7}', "[1, 2]"])
def test_bad_snapshots_are_user_errors(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "snapshot.json"
    bad.write_text(content)
    with pytest.raises(DSAUserError):
        load_snapshot(bad)


def _machine_has_nvidia_driver() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia/version").exists()


def test_live_probe_reports_every_component_with_version_or_reason() -> None:
    result = probe_environment()
    assert list(result.to_dict()["components"]) == list(COMPONENTS)
    for name in COMPONENTS:
        record = result.component(name)
        if record.found:
            assert record.version or name == "plugin_library", record
        else:
            assert record.reason, record
    driver = result.component("driver")
    if _machine_has_nvidia_driver():
        assert driver.found and result.gpus
    else:
        assert not driver.found and driver.reason.startswith("no NVIDIA driver found")
        assert not result.component("cuda_driver").found
        assert result.gpus == []
    if shutil.which("nvcc"):
        assert result.component("nvcc").found


def test_importing_the_package_loads_no_gpu_stack() -> None:
    code = (
        "import sys, dsa_export, dsa_export.compat, dsa_export.cli.check_cmd;"
        "heavy = {'torch', 'tensorrt', 'tensorrt_rtx', 'tensorrt_rtx_bindings', 'onnxruntime', 'pynvml'};"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("reason", "state"),
    [
        (f"plugin library: {PLUGIN_NOT_BUILT}", "not built"),
        (f"plugin library: {PLUGIN_NOT_BUILT}: no build folder", "not built (no build folder)"),
        (
            "plugin library: $DSA_EXPORT_PLUGIN_LIB points to /x.so, which is not a file",
            "missing ($DSA_EXPORT_PLUGIN_LIB points to /x.so, which is not a file)",
        ),
    ],
)
def test_plugin_library_state_reads_well_inside_a_sentence(reason: str, state: str) -> None:
    assert plugin_library_state(ComponentRecord("plugin_library", False, reason=reason)) == state


@pytest.mark.parametrize(
    ("visible", "names"),
    [
        ("2,0", ["c", "a"]),
        ("1", ["b"]),
        ("", []),
        ("1,7,0", ["b"]),  # CUDA stops at the first invalid ordinal
        ("GPU-8d4c2a1e-0000-0000-0000-000000000000", ["a", "b", "c"]),  # UUIDs are not recorded
    ],
)
def test_cuda_visible_devices_renumbers_gpus(visible: str, names: list[str]) -> None:
    gpus = [GpuRecord(i, name, "9.0") for i, name in enumerate("abc")]
    chosen = apply_visible_devices(gpus, visible)
    assert [g.name for g in chosen] == names
    if names != ["a", "b", "c"]:
        assert [g.index for g in chosen] == list(range(len(names)))


def test_driver_probe_applies_cuda_visible_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_nvml(monkeypatch)
    lines = "0, NVIDIA A100, 8.0, 81920, 550.54.15\n1, NVIDIA H100, 9.0, 81559, 550.54.15\n"
    _fake_tool(tmp_path, "nvidia-smi", f'printf "{lines}"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    record, gpus = probe_driver_and_gpus(ProbeSettings())
    assert [(g.index, g.name) for g in gpus] == [(0, "NVIDIA H100")]
    assert record.details["cuda_visible_devices"] == "1" and record.details["gpu_count"] == 1


class _FakeMemory:
    total = 143771 * (1 << 20)


def _fake_pynvml(fail_on: str | None = None) -> types.SimpleNamespace:
    """A stand-in for nvidia-ml-py with one H200; ``fail_on`` names a call that raises."""

    def call(name, value):
        def function(*args):
            if name == fail_on:
                raise RuntimeError(f"{name} failed")
            return value

        return function

    return types.SimpleNamespace(
        nvmlInit=call("nvmlInit", None),
        nvmlShutdown=call("nvmlShutdown", None),
        nvmlSystemGetDriverVersion=call("nvmlSystemGetDriverVersion", b"580.95.05"),
        nvmlSystemGetCudaDriverVersion=call("nvmlSystemGetCudaDriverVersion", 13000),
        nvmlDeviceGetCount=call("nvmlDeviceGetCount", 1),
        nvmlDeviceGetHandleByIndex=call("nvmlDeviceGetHandleByIndex", object()),
        nvmlDeviceGetName=call("nvmlDeviceGetName", "NVIDIA H200"),
        nvmlDeviceGetCudaComputeCapability=call("nvmlDeviceGetCudaComputeCapability", (9, 0)),
        nvmlDeviceGetMemoryInfo=call("nvmlDeviceGetMemoryInfo", _FakeMemory()),
    )


def test_driver_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    record, gpus = probe_driver_and_gpus(ProbeSettings())
    assert record.version == "580.95.05" and record.details["source"] == "nvml"
    assert record.details["cuda_driver_version"] == "13.0"
    assert [(g.name, g.compute_capability, g.memory_total_mib) for g in gpus] == [
        ("NVIDIA H200", "9.0", 143771)
    ]


@pytest.mark.parametrize(
    ("fail_on", "reason"),
    [("nvmlInit", "NVML unavailable"), ("nvmlDeviceGetHandleByIndex", "NVML query failed")],
)
def test_nvml_failures_fall_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fail_on: str, reason: str
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail_on))
    _fake_tool(tmp_path, "nvidia-smi", 'echo "0, NVIDIA H200, 9.0, 143771, 580.95.05"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    record, gpus = probe_driver_and_gpus(ProbeSettings())
    assert record.details["source"] == "nvidia-smi" and len(gpus) == 1
    assert record.details["fallback_reasons"][0].startswith(reason)
