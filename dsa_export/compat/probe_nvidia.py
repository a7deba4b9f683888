"""Probes of NVIDIA's stack: driver and GPUs (NVML, nvidia-smi, procfs), the CUDA driver and
runtime, cuDNN, nvcc, TensorRT and TensorRT-RTX, and the shared-library helpers they use.

Every probe tolerates every failure and returns a :class:`ComponentRecord`; nothing here raises.
Shared libraries are queried with ctypes through entry points that do not create a CUDA context
(``cudaRuntimeGetVersion``, ``cuDriverGetVersion``, ``cudnnGetVersion``, ``getInferLibVersion``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from dsa_export.compat.records import (
    DEFAULT_SUBPROCESS_TIMEOUT_S,
    ComponentRecord,
    GpuRecord,
    ProbeSettings,
)
from dsa_export.compat.versions import (
    decode_cuda_version,
    decode_cudnn_version,
    decode_tensorrt_version,
    format_version,
)

# ---------------------------------------------------------------------------------------------
# Shared-library helpers


def _site_dirs() -> list[Path]:
    """site-packages folders, where pip wheels put nvidia/*/lib, tensorrt_libs, ..."""
    import site

    dirs = []
    try:
        dirs.extend(site.getsitepackages())
    except AttributeError:  # virtualenvs built by old tools
        pass
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        dirs.append(user)
    dirs.extend(p for p in sys.path if p.endswith("site-packages"))
    seen: list[Path] = []
    for entry in dirs:
        path = Path(entry)
        if path.is_dir() and path not in seen:
            seen.append(path)
    return seen


def _cuda_home_dirs() -> list[Path]:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    dirs = []
    for home in homes:
        if home:
            dirs.extend(
                [Path(home) / "lib64", Path(home) / "lib", Path(home) / "targets/x86_64-linux/lib"]
            )
    return dirs


def _wheel_lib_dirs(*relative: str) -> list[Path]:
    return [site / rel for site in _site_dirs() for rel in relative]


def _loaded_path(soname: str) -> str | None:
    """Where the dynamic loader found ``soname`` in this process (Linux /proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if os.path.basename(path).startswith(soname):
                    return path
    except OSError:
        pass
    return None


def _load_library(
    names: list[str], extra_dirs: list[Path]
) -> tuple[ctypes.CDLL | None, str | None, list[str]]:
    """Load the first of ``names`` the system loader finds, else the first file found in ``extra_dirs``.

    Returns (handle, path, errors); errors explain every attempt that failed.
    """
    errors: list[str] = []
    for name in names:
        try:
            handle = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(_first_line(exc))
            continue
        return handle, _loaded_path(name) or name, errors
    for directory in extra_dirs:
        for name in names:
            candidate = directory / name
            if not candidate.is_file():
                continue
            try:
                return ctypes.CDLL(str(candidate)), str(candidate), errors
            except OSError as exc:
                errors.append(f"{candidate}: {_first_line(exc)}")
    return None, None, errors


def _load_failures(errors: list[str]) -> str:
    """Loader errors other than "not found" (an undefined symbol, a wrong ELF class), joined."""
    real = [error for error in errors if "cannot open shared object file" not in error]
    return f" (found but failed to load: {'; '.join(real[:2])})" if real else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)


def _distribution_version(*names: str) -> dict[str, str]:
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


# ---------------------------------------------------------------------------------------------
# Driver and GPUs


def parse_nvidia_smi_csv(
    text: str, with_compute_cap: bool = True
) -> tuple[str | None, list[GpuRecord]]:
    """Parse ``nvidia-smi --query-gpu=index,name,[compute_cap,]memory.total,driver_version --format=csv,noheader,nounits``."""
    gpus: list[GpuRecord] = []
    driver: str | None = None
    for line in text.strip().splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        expected = 5 if with_compute_cap else 4
        if len(cells) != expected:
            continue
        if with_compute_cap:
            index, name, cap, memory, driver_version = cells
        else:
            index, name, memory, driver_version = cells
            cap = None
        driver = driver_version or driver
        gpus.append(
            GpuRecord(
                index=int(index),
                name=name,
                compute_capability=cap if cap and cap not in {"[N/A]", "N/A"} else None,
                memory_total_mib=int(float(memory)) if re.fullmatch(r"[\d.]+", memory) else None,
            )
        )
    return driver, gpus


def _probe_nvml() -> tuple[ComponentRecord, list[GpuRecord]] | str:
    """Driver and GPUs through nvidia-ml-py; a reason string when NVML is unusable."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return f"NVML unavailable ({_first_line(exc)})"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        details: dict[str, Any] = {"source": "nvml"}
        try:
            details["cuda_driver_version"] = format_version(
                decode_cuda_version(int(pynvml.nvmlSystemGetCudaDriverVersion()))
            )
        except Exception:  # pragma: no cover - very old drivers
            pass
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1 << 20)
            gpus.append(
                GpuRecord(
                    index,
                    name.decode() if isinstance(name, bytes) else str(name),
                    f"{major}.{minor}",
                    int(memory),
                )
            )
        details["gpu_count"] = len(gpus)
        return ComponentRecord("driver", True, driver, details=details), gpus
    except Exception as exc:  # e.g. NVMLError_GpuIsLost: let nvidia-smi have a go
        return f"NVML query failed ({type(exc).__name__}: {_first_line(exc)})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _probe_nvidia_smi(timeout_s: float) -> tuple[ComponentRecord, list[GpuRecord]] | str:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return "nvidia-smi is not on PATH"
    for with_cap in (True, False):
        fields = (
            "index,name,compute_cap,memory.total,driver_version"
            if with_cap
            else "index,name,memory.total,driver_version"
        )
        try:
            result = _run(
                [tool, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], timeout_s
            )
        except subprocess.TimeoutExpired:
            return f"nvidia-smi did not answer within {timeout_s:g} s"
        if result.returncode == 0:
            driver, gpus = parse_nvidia_smi_csv(result.stdout, with_compute_cap=with_cap)
            details: dict[str, Any] = {"source": "nvidia-smi", "gpu_count": len(gpus)}
            if not with_cap:
                details["note"] = "this nvidia-smi cannot report compute capability"
            return ComponentRecord("driver", driver is not None, driver, details=details), gpus
        if not with_cap:
            message = (result.stderr or result.stdout).strip().splitlines()
            return f"nvidia-smi failed: {message[0] if message else f'exit {result.returncode}'}"
    return "nvidia-smi failed"  # pragma: no cover - loop always returns


def _probe_procfs() -> ComponentRecord | str:
    path = Path("/proc/driver/nvidia/version")
    if not path.is_file():
        return f"{path} does not exist (no NVIDIA kernel module loaded)"
    match = re.search(
        r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)", path.read_text(errors="replace")
    )
    if match is None:
        return f"{path} has no version line"
    return ComponentRecord(
        "driver", True, match.group(1), details={"source": "procfs", "gpu_count": None}
    )


def apply_visible_devices(gpus: list[GpuRecord], visible: str) -> list[GpuRecord]:
    """The GPUs CUDA programs see under ``CUDA_VISIBLE_DEVICES``, renumbered from 0 as CUDA does.

    NVML and nvidia-smi ignore the variable, but the build runs on CUDA's device 0. Integer lists
    are applied (up to the first invalid entry, as CUDA does); UUID or MIG entries leave the list
    unchanged because the probes do not record UUIDs.
    """
    entries = [entry.strip() for entry in visible.split(",")] if visible.strip() else []
    by_index = {gpu.index: gpu for gpu in gpus}
    chosen: list[GpuRecord] = []
    for entry in entries:
        if not entry.isdigit():
            if not chosen and entry.upper().startswith(("GPU-", "MIG-")):
                return gpus
            break
        gpu = by_index.get(int(entry))
        if gpu is None or gpu in chosen:
            break
        chosen.append(gpu)
    return [dataclasses.replace(gpu, index=logical) for logical, gpu in enumerate(chosen)]


def probe_driver_and_gpus(settings: ProbeSettings) -> tuple[ComponentRecord, list[GpuRecord]]:
    """NVIDIA driver version and GPUs: NVML, else nvidia-smi, else /proc (driver only)."""
    reasons = []
    for attempt in (
        _probe_nvml,
        lambda: _probe_nvidia_smi(settings.subprocess_timeout_s or DEFAULT_SUBPROCESS_TIMEOUT_S),
    ):
        outcome = attempt()
        if isinstance(outcome, str):
            reasons.append(outcome)
            continue
        record, gpus = outcome
        if reasons:
            record.details["fallback_reasons"] = reasons
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            record.details["cuda_visible_devices"] = visible
            gpus = apply_visible_devices(gpus, visible)
            record.details["gpu_count"] = len(gpus)
        return record, gpus
    procfs = _probe_procfs()
    if isinstance(procfs, ComponentRecord):
        procfs.details["fallback_reasons"] = reasons
        return procfs, []
    reasons.append(procfs)
    return ComponentRecord(
        "driver", False, reason="no NVIDIA driver found: " + "; ".join(reasons)
    ), []


# ---------------------------------------------------------------------------------------------
# CUDA, cuDNN


def probe_cuda_driver(settings: ProbeSettings) -> ComponentRecord:
    """CUDA version the installed driver supports, from libcuda's ``cuDriverGetVersion``."""
    handle, path, errors = _load_library(["libcuda.so.1", "libcuda.so", "nvcuda.dll"], [])
    if handle is None:
        return ComponentRecord(
            "cuda_driver",
            False,
            reason="libcuda.so.1 is not loadable, so no NVIDIA driver is installed ("
            + (errors[0] if errors else "not found")
            + ")",
        )
    if path and "/stubs/" in path:
        return ComponentRecord(
            "cuda_driver", False, reason=f"only the CUDA stub library was found ({path})"
        )
    value = ctypes.c_int(0)
    status = handle.cuDriverGetVersion(ctypes.byref(value))
    if status != 0 or value.value == 0:
        return ComponentRecord(
            "cuda_driver",
            False,
            reason=f"cuDriverGetVersion failed with CUresult {status}",
            details={"path": path},
        )
    return ComponentRecord(
        "cuda_driver",
        True,
        format_version(decode_cuda_version(value.value)),
        details={"path": path, "raw": value.value},
    )


def probe_cuda_runtime(settings: ProbeSettings) -> ComponentRecord:
    """CUDA runtime (libcudart) version, and what it reports for the driver."""
    names = [f"libcudart.so.{major}" for major in ("13", "12", "11.0")] + ["libcudart.so"]
    dirs = _cuda_home_dirs() + _wheel_lib_dirs("nvidia/cu13/lib", "nvidia/cuda_runtime/lib")
    handle, path, errors = _load_library(names, dirs)
    if handle is None:
        return ComponentRecord(
            "cuda_runtime",
            False,
            reason="libcudart was not found on the loader path, in CUDA_HOME or in nvidia-* wheels"
            + _load_failures(errors),
        )
    runtime = ctypes.c_int(0)
    status = handle.cudaRuntimeGetVersion(ctypes.byref(runtime))
    if status != 0:
        return ComponentRecord(
            "cuda_runtime",
            False,
            reason=f"cudaRuntimeGetVersion failed with error {status}",
            details={"path": path},
        )
    details: dict[str, Any] = {"path": path, "raw": runtime.value}
    driver = ctypes.c_int(0)
    if handle.cudaDriverGetVersion(ctypes.byref(driver)) == 0:
        details["driver_reports"] = (
            format_version(decode_cuda_version(driver.value)) if driver.value else "no driver"
        )
    return ComponentRecord(
        "cuda_runtime", True, format_version(decode_cuda_version(runtime.value)), details=details
    )


def probe_cudnn(settings: ProbeSettings) -> ComponentRecord:
    """cuDNN version (``cudnnGetVersion``) and the CUDA runtime it was built for (``cudnnGetCudartVersion``)."""
    names = ["libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"]
    dirs = _cuda_home_dirs() + _wheel_lib_dirs("nvidia/cudnn/lib", "nvidia/cu13/lib", "torch/lib")
    handle, path, errors = _load_library(names, dirs)
    if handle is None:
        return ComponentRecord(
            "cudnn",
            False,
            reason="libcudnn was not found on the loader path, in CUDA_HOME or in nvidia-cudnn wheels"
            + _load_failures(errors),
        )
    handle.cudnnGetVersion.restype = ctypes.c_size_t
    raw = int(handle.cudnnGetVersion())
    details: dict[str, Any] = {"path": path, "raw": raw}
    try:
        handle.cudnnGetCudartVersion.restype = ctypes.c_size_t
        details["built_for_cuda"] = format_version(
            decode_cuda_version(int(handle.cudnnGetCudartVersion()))
        )
    except AttributeError:
        pass
    return ComponentRecord(
        "cudnn", True, format_version(decode_cudnn_version(raw)), details=details
    )


def parse_nvcc_version(text: str) -> str | None:
    """``"Cuda compilation tools, release 13.0, V13.0.88"`` -> ``"13.0.88"`` (or ``"13.0"``)."""
    match = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", text)
    if match:
        return match.group(2)
    match = re.search(r"release (\d+\.\d+)", text)
    return match.group(1) if match else None


def probe_nvcc(settings: ProbeSettings) -> ComponentRecord:
    tool = shutil.which("nvcc")
    if tool is None:
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if home and (Path(home) / "bin" / "nvcc").is_file():
                tool = str(Path(home) / "bin" / "nvcc")
                break
    if tool is None:
        return ComponentRecord(
            "nvcc", False, reason="nvcc is not on PATH, in CUDA_HOME/bin or in /usr/local/cuda/bin"
        )
    timeout = settings.subprocess_timeout_s or DEFAULT_SUBPROCESS_TIMEOUT_S
    try:
        result = _run([tool, "--version"], timeout)
    except subprocess.TimeoutExpired:
        return ComponentRecord(
            "nvcc", False, reason=f"`{tool} --version` did not answer within {timeout:g} s"
        )
    version = parse_nvcc_version(result.stdout)
    if version is None:
        return ComponentRecord(
            "nvcc",
            False,
            reason=f"`{tool} --version` printed no release number",
            details={"path": tool},
        )
    return ComponentRecord("nvcc", True, version, details={"path": tool})


# ---------------------------------------------------------------------------------------------
# TensorRT and TensorRT-RTX


def _library_version(handle: ctypes.CDLL) -> str:
    """Full TensorRT library version: the split getters (10.x+) include the build number."""
    try:
        parts = [
            int(getattr(handle, f"getInferLib{part}Version")())
            for part in ("Major", "Minor", "Patch", "Build")
        ]
        return format_version(tuple(parts)) or ""
    except AttributeError:
        handle.getInferLibVersion.restype = ctypes.c_int
        return format_version(decode_tensorrt_version(int(handle.getInferLibVersion()))) or ""


def _import_version(module_names: list[str]) -> tuple[str | None, str | None, str | None]:
    """(module name, version, error) for the first importable module of ``module_names``."""
    last_error = None
    for module_name in module_names:
        if importlib.util.find_spec(module_name) is None:
            continue
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # e.g. OSError "undefined symbol", ImportError of a CUDA lib
            last_error = f"import {module_name} failed: {_first_line(exc)}"
            continue
        return module_name, str(getattr(module, "__version__", "")) or None, None
    return None, None, last_error


def _package_dir(package: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(location) for location in spec.submodule_search_locations]


def _probe_trt_like(
    name: str, modules: list[str], libraries: list[str], lib_packages: list[str], label: str
) -> ComponentRecord:
    module_name, module_version, import_error = _import_version(modules)
    dirs = [d for package in lib_packages for d in _package_dir(package)]
    handle, path, errors = _load_library(libraries, dirs)
    details: dict[str, Any] = {}
    library_version = None
    if handle is not None:
        try:
            library_version = _library_version(handle)
            details["library_path"] = path
            details["library_version"] = library_version
        except AttributeError:
            details["library_error"] = f"{path} has no getInferLibVersion"
    else:
        details["library_error"] = (
            f"none of {', '.join(libraries)} could be loaded" + _load_failures(errors)
        )
    if module_name:
        details["module"] = module_name
        details["module_version"] = module_version
    if import_error:
        details["import_error"] = import_error
    version = module_version or library_version
    if version is None:
        reason = (
            import_error
            or f"{label} is not installed (no Python module {' or '.join(modules)}, no {libraries[-1]})"
        )
        return ComponentRecord(name, False, reason=reason, details=details)
    return ComponentRecord(name, True, version, details=details)


def probe_tensorrt(settings: ProbeSettings) -> ComponentRecord:
    """TensorRT: the ``tensorrt`` module version and libnvinfer's ``getInferLibVersion``."""
    return _probe_trt_like(
        "tensorrt",
        ["tensorrt"],
        ["libnvinfer.so.11", "libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so"],
        ["tensorrt_libs"],
        "TensorRT",
    )


def probe_tensorrt_rtx(settings: ProbeSettings) -> ComponentRecord:
    """TensorRT-RTX: the ``tensorrt_rtx`` (or PyPI ``tensorrt_rtx_bindings``) module and libtensorrt_rtx."""
    return _probe_trt_like(
        "tensorrt_rtx",
        ["tensorrt_rtx", "tensorrt_rtx_bindings"],
        ["libtensorrt_rtx.so.1", "libtensorrt_rtx.so"],
        ["tensorrt_rtx_libs"],
        "TensorRT-RTX",
    )
