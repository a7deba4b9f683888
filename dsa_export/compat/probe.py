"""Probes of the GPU software stack: each says what it found or why it found nothing.

Every probe tolerates every failure (a missing library, a broken import, a hung tool) and returns a
:class:`ComponentRecord`; nothing here raises. Probes run only when :func:`probe_environment` is
called: importing this module touches neither TensorRT nor CUDA. Shared libraries are queried with
ctypes through entry points that do not create a CUDA context (``cudaRuntimeGetVersion``,
``cuDriverGetVersion``, ``cudnnGetVersion``, ``getInferLibVersion``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsa_export.compat.probe_nvidia import (
    _distribution_version,
    _first_line,
    probe_cuda_driver,
    probe_cuda_runtime,
    probe_cudnn,
    probe_driver_and_gpus,
    probe_nvcc,
    probe_tensorrt,
    probe_tensorrt_rtx,
)
from dsa_export.compat.records import (
    COMPONENTS,
    DEFAULT_IMPORT_TIMEOUT_S,
    DEFAULT_PROBE_TIMEOUT_S,
    PLUGIN_LIB_ENV,
    ComponentRecord,
    EnvironmentProbe,
    GpuRecord,
    ProbeSettings,
)
from dsa_export.compat.versions import (
    decode_cudnn_version,
    format_version,
)

# ---------------------------------------------------------------------------------------------
# Python frameworks


def probe_torch(settings: ProbeSettings) -> ComponentRecord:
    if importlib.util.find_spec("torch") is None:
        return ComponentRecord("torch", False, reason="torch is not installed")
    try:
        import torch
    except Exception as exc:
        return ComponentRecord("torch", False, reason=f"import torch failed: {_first_line(exc)}")
    cuda = torch.version.cuda
    details: dict[str, Any] = {
        "cuda": cuda,
        "cudnn": None,
        "cuda_available": False,
        "arch_list": [],
    }
    if cuda:
        cudnn = torch.backends.cudnn.version()
        details["cudnn"] = format_version(decode_cudnn_version(int(cudnn))) if cudnn else None
        details["cuda_available"] = bool(torch.cuda.is_available())
        if details["cuda_available"]:
            details["arch_list"] = list(torch.cuda.get_arch_list())
    return ComponentRecord("torch", True, str(torch.__version__), details=details)


def probe_onnxruntime(settings: ProbeSettings) -> ComponentRecord:
    distributions = _distribution_version(
        "onnxruntime",
        "onnxruntime-gpu",
        "onnxruntime-directml",
        "onnxruntime-openvino",
        "onnxruntime-training",
    )
    if importlib.util.find_spec("onnxruntime") is None:
        return ComponentRecord(
            "onnxruntime",
            False,
            reason="onnxruntime is not installed",
            details={"distributions": distributions},
        )
    try:
        import onnxruntime
    except Exception as exc:
        return ComponentRecord(
            "onnxruntime",
            False,
            reason=f"import onnxruntime failed: {_first_line(exc)}",
            details={"distributions": distributions},
        )
    details: dict[str, Any] = {
        "providers": list(onnxruntime.get_available_providers()),
        "device": onnxruntime.get_device(),
        "distributions": distributions,
    }
    try:
        from onnxruntime.capi import build_and_package_info as info

        for key in ("package_name", "cuda_version", "cudnn_version"):
            if getattr(info, key, None):
                details[f"build_{key}"] = str(getattr(info, key))
    except ImportError:
        pass
    return ComponentRecord("onnxruntime", True, str(onnxruntime.__version__), details=details)


def probe_polygraphy(settings: ProbeSettings) -> ComponentRecord:
    if importlib.util.find_spec("polygraphy") is None:
        return ComponentRecord("polygraphy", False, reason="polygraphy is not installed")
    try:
        import polygraphy
    except Exception as exc:
        return ComponentRecord(
            "polygraphy", False, reason=f"import polygraphy failed: {_first_line(exc)}"
        )
    return ComponentRecord("polygraphy", True, str(polygraphy.__version__))


# ---------------------------------------------------------------------------------------------
# Our plugin library

PLUGIN_NOT_BUILT = "not built (run `dsa-export plugins build`)"


def plugin_library_state(record: ComponentRecord) -> str:
    """Short phrase for why the plugin library is absent: "not built", "missing ($DSA_EXPORT_PLUGIN_LIB ...)"."""
    reason = (record.reason or "").removeprefix("plugin library: ")
    if reason.startswith(PLUGIN_NOT_BUILT):
        detail = reason[len(PLUGIN_NOT_BUILT) :].removeprefix(": ")
        return f"not built ({detail})" if detail else "not built"
    return f"missing ({reason})" if reason else "missing"


def locate_plugin_library() -> tuple[Path | None, str, str | None]:
    """(path, how it was found, reason when not found): DSA_EXPORT_PLUGIN_LIB first, then the plugins package."""
    env = os.environ.get(PLUGIN_LIB_ENV)
    if env:
        path = Path(env)
        if path.is_file():
            return path, f"${PLUGIN_LIB_ENV}", None
        return None, f"${PLUGIN_LIB_ENV}", f"${PLUGIN_LIB_ENV} points to {env}, which is not a file"
    try:
        plugins = importlib.import_module("dsa_export.plugins")
    except ImportError:
        return None, "dsa_export.plugins", PLUGIN_NOT_BUILT
    find_library = getattr(plugins, "find_library", None)
    if find_library is None:
        return None, "dsa_export.plugins", PLUGIN_NOT_BUILT
    try:
        found = find_library()
    except Exception as exc:  # the plugins package says why it has no library
        return None, "dsa_export.plugins.find_library()", f"{PLUGIN_NOT_BUILT}: {_first_line(exc)}"
    if not found:
        return None, "dsa_export.plugins.find_library()", PLUGIN_NOT_BUILT
    path = Path(found)
    if not path.is_file():
        return (
            None,
            "dsa_export.plugins.find_library()",
            f"{PLUGIN_NOT_BUILT}: find_library() returned {path}, which does not exist",
        )
    return path, "dsa_export.plugins.find_library()", None


def probe_plugin_library(settings: ProbeSettings) -> ComponentRecord:
    """Our plugin library: where it is, its sha256, and which TensorRT, CUDA and GPUs it was built for."""
    from dsa_export.compat.binaries import cuda_architectures, elf_needed_libraries
    from dsa_export.fileio import sha256_file

    path, source, reason = locate_plugin_library()
    if path is None:
        return ComponentRecord(
            "plugin_library", False, reason=f"plugin library: {reason}", details={"source": source}
        )
    details: dict[str, Any] = {"path": str(path), "source": source, "sha256": sha256_file(path)}
    try:
        needed = elf_needed_libraries(path)
        details["needed"] = needed
        details["built_for_tensorrt_major"] = _soname_major(
            needed, ("libnvinfer.so.", "libtensorrt_rtx.so.")
        )
        details["built_for_cuda_major"] = _soname_major(needed, ("libcudart.so.",))
    except (OSError, ValueError, IndexError) as exc:
        details["needed_error"] = _first_line(exc)
    try:
        details["cuda_architectures"] = cuda_architectures(path)
    except (OSError, ValueError) as exc:
        details["cuda_architectures_error"] = _first_line(exc)
    return ComponentRecord("plugin_library", True, None, details=details)


def _soname_major(needed: list[str], prefixes: tuple[str, ...]) -> str | None:
    for soname in needed:
        for prefix in prefixes:
            if soname.startswith(prefix):
                return soname[len(prefix) :].split(".")[0]
    return None


# ---------------------------------------------------------------------------------------------
# Orchestration

ProbeFunction = Callable[[ProbeSettings], ComponentRecord]

PROBES: dict[str, ProbeFunction] = {
    "cuda_driver": probe_cuda_driver,
    "cuda_runtime": probe_cuda_runtime,
    "cudnn": probe_cudnn,
    "nvcc": probe_nvcc,
    "tensorrt": probe_tensorrt,
    "tensorrt_rtx": probe_tensorrt_rtx,
    "onnxruntime": probe_onnxruntime,
    "torch": probe_torch,
    "polygraphy": probe_polygraphy,
    "plugin_library": probe_plugin_library,
}


# Probes that import Python packages; they run one after another.
# Cheap imports first and torch last, so a slow cold torch import can only time itself out.
IMPORTING_PROBES: tuple[str, ...] = (
    "polygraphy",
    "onnxruntime",
    "tensorrt_rtx",
    "tensorrt",
    "plugin_library",
    "torch",
)


def _guarded(name: str, function: Callable[[], Any]) -> Any:
    try:
        return function()
    except Exception as exc:  # a probe must never take the check down
        return ComponentRecord(
            name, False, reason=f"probe failed: {type(exc).__name__}: {_first_line(exc)}"
        )


def timed_out(record: ComponentRecord) -> float | None:
    """The seconds after which ``record``'s probe was given up (None: it finished)."""
    value = record.details.get("timed_out_s")
    return float(value) if isinstance(value, (int, float)) else None


def probe_environment(settings: ProbeSettings | None = None) -> EnvironmentProbe:
    """Run every probe concurrently, each bounded by a timeout, and collect the records. A probe
    that does not finish in time is recorded as not probed (``details["timed_out_s"]``), not as
    missing."""
    settings = settings or ProbeSettings()
    timeout = settings.timeout_s or DEFAULT_PROBE_TIMEOUT_S  # the library and tool probes together
    import_timeout = settings.timeout_s or DEFAULT_IMPORT_TIMEOUT_S  # the Python imports together
    wanted = settings.components or COMPONENTS
    started = time.perf_counter()
    results: dict[str, Any] = {}

    def run(name: str, function: Callable[[], Any]) -> None:
        results[name] = _guarded(name, function)

    jobs: dict[str, Callable[[], Any]] = {}
    if "driver" in wanted:
        jobs["driver"] = lambda: probe_driver_and_gpus(settings)
    for name, probe in PROBES.items():
        if name in wanted:
            jobs[name] = functools.partial(probe, settings)
    # Probes that import Python packages share one thread: concurrent imports of packages that
    # import each other can trip the import system's deadlock detection. Library and tool probes
    # each get their own thread. Daemon threads: a probe stuck in a driver call must not keep the
    # process alive.
    importing = [name for name in IMPORTING_PROBES if name in jobs]
    groups = [importing] + [[name] for name in jobs if name not in IMPORTING_PROBES]

    def run_group(names: list[str]) -> None:
        for name in names:
            run(name, jobs[name])

    groups = [group for group in groups if group]
    threads = [threading.Thread(target=run_group, args=(group,), daemon=True) for group in groups]
    for thread in threads:
        thread.start()
    now = time.monotonic()
    limits = {name: (import_timeout if name in IMPORTING_PROBES else timeout) for name in jobs}
    for thread, group in zip(threads, groups):
        thread.join(max(0.0, now + limits[group[0]] - time.monotonic()))

    components: dict[str, ComponentRecord] = {}
    gpus: list[GpuRecord] = []
    for name in jobs:
        outcome = results.get(name)
        if outcome is None:
            components[name] = ComponentRecord(
                name,
                False,
                reason=f"not probed (timed out after {limits[name]:g} s; raise --timeout)",
                details={"timed_out_s": limits[name]},
            )
        elif isinstance(outcome, tuple):  # driver probe
            components[name], gpus = outcome
        else:
            components[name] = outcome
    host = {
        "system": platform.system(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    return EnvironmentProbe(components, gpus, host, round(time.perf_counter() - started, 3))
