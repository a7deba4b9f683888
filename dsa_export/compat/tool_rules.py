"""Rules about the tools around the GPU stack: the driver's presence, torch, nvcc, Polygraphy and the plugin library.

They read only the probe snapshot; the rules that read the matrix are in :mod:`dsa_export.compat.rulebook`.
"""

from __future__ import annotations

from collections.abc import Iterator

from dsa_export.compat.findings import Finding
from dsa_export.compat.probe import plugin_library_state, timed_out
from dsa_export.compat.rule_context import GPU_BUILD_BACKENDS, RuleContext, driver_cuda_version, gpu_label
from dsa_export.compat.versions import format_version, parse_version


def rule_driver(ctx: RuleContext) -> Iterator[Finding]:
    driver = ctx.probe.component("driver")
    gpu_needed = ctx.for_build and ctx.backend in GPU_BUILD_BACKENDS
    if not driver.found:
        yield Finding(
            "no_nvidia_driver",
            ctx.severity(gpu_needed),
            "driver",
            "No NVIDIA driver was found, so no engine can run here and only TensorRT-RTX can build one (ahead of time, for a chosen GPU).",
            "Run TensorRT builds and engines on a machine with an NVIDIA GPU and driver; export, ONNX Runtime (CPU) validation and calibration work here.",
        )
        return
    if not ctx.probe.gpus and driver.details.get("gpu_count") == 0:
        yield Finding(
            "no_gpu",
            ctx.severity(gpu_needed),
            "driver",
            f"The NVIDIA driver {driver.version} is installed but reports no GPU.",
            "Check CUDA_VISIBLE_DEVICES, the container's GPU access (--gpus) and `nvidia-smi`.",
        )
    if ctx.extra.get("device_missing"):
        yield Finding(
            "gpu_index_out_of_range",
            "error",
            "driver",
            f"GPU index {ctx.extra['device_missing']} was asked for but only {len(ctx.probe.gpus)} GPU(s) are visible.",
            "Pass a --device index below the number of GPUs listed by `nvidia-smi`.",
        )


def rule_torch(ctx: RuleContext) -> Iterator[Finding]:
    record = ctx.probe.component("torch")
    seconds = timed_out(record)
    if seconds is not None:
        yield Finding(
            "torch_not_probed",
            "warning",
            "torch",
            f"PyTorch was not probed: importing it took longer than {seconds:g} s (a busy machine or a cold file "
            "cache), so its version and CUDA build are unknown.",
            "Run the check again, with a larger --timeout if it happens again.",
        )
        return
    if not record.found:
        yield Finding(
            "torch_missing",
            "warning",
            "torch",
            f"PyTorch is unavailable ({record.reason}), so export and reference validation cannot run.",
            "Install torch (see the README for the supported versions).",
        )
        return
    torch_cuda = parse_version(record.details.get("cuda"))
    if ctx.gpu is not None and torch_cuda is None:
        yield Finding(
            "torch_cpu_only",
            "info",
            "torch",
            f"PyTorch {record.version} is a CPU build, so reference outputs are computed on the CPU.",
            "Install a CUDA build of torch to compute references on the GPU (optional).",
        )
    driver_cuda = driver_cuda_version(ctx)
    if torch_cuda and driver_cuda and torch_cuda[0] > driver_cuda[0]:
        yield Finding(
            "torch_cuda_newer_than_driver",
            "warning",
            "torch",
            f"PyTorch {record.version} is built for CUDA {format_version(torch_cuda)} but the driver supports only CUDA {format_version(driver_cuda)}.",
            "Upgrade the NVIDIA driver or install the torch build for the driver's CUDA version.",
        )


def rule_nvcc(ctx: RuleContext) -> Iterator[Finding]:
    nvcc = ctx.probe.component("nvcc")
    driver_cuda = ctx.version("cuda_driver")
    nvcc_version = ctx.version("nvcc")
    if nvcc_version and driver_cuda and nvcc_version[:2] > driver_cuda[:2]:
        yield Finding(
            "nvcc_newer_than_driver",
            "warning",
            "nvcc",
            f"nvcc {nvcc.version} is newer than the CUDA {format_version(driver_cuda)} the driver supports, so plugins it compiles may not load here.",
            "Upgrade the driver, or compile the plugins with a CUDA toolkit no newer than the driver.",
        )
    if not nvcc.found and ctx.asked("tensorrt") and not ctx.probe.component("plugin_library").found:
        yield Finding(
            "nvcc_missing",
            "warning",
            "nvcc",
            "nvcc was not found, so the DSA plugin library cannot be built here.",
            "Install the CUDA toolkit (or set CUDA_HOME) and run `dsa-export plugins build`.",
        )


def rule_polygraphy(ctx: RuleContext) -> Iterator[Finding]:
    record = ctx.probe.component("polygraphy")
    seconds = timed_out(record)
    if seconds is not None:
        yield Finding(
            "polygraphy_not_probed",
            "warning",
            "polygraphy",
            f"Polygraphy was not probed: importing it took longer than {seconds:g} s.",
            "Run the check again, with a larger --timeout if it happens again.",
        )
        return
    if not record.found:
        yield Finding(
            "polygraphy_missing",
            "warning",
            "polygraphy",
            f"Polygraphy is unavailable ({record.reason}), so cross-backend validation cannot run.",
            "Install it with `pip install polygraphy`.",
        )


def rule_plugin_library(ctx: RuleContext) -> Iterator[Finding]:
    record = ctx.probe.component("plugin_library")
    asked = ctx.asked("tensorrt")
    if not record.found:
        yield Finding(
            "plugin_library_missing",
            "warning" if asked else "info",
            "plugin_library",
            f"The DSA plugin library is {plugin_library_state(record)}, so TensorRT builds DSA nodes from their dense ONNX function bodies.",
            "Run `dsa-export plugins build` (or set DSA_EXPORT_PLUGIN_LIB to the built library).",
        )
        return
    built_major = record.details.get("built_for_tensorrt_major")
    trt = ctx.version("tensorrt")
    if built_major and trt and str(trt[0]) != str(built_major):
        yield Finding(
            "plugin_library_tensorrt_mismatch",
            ctx.severity(asked),
            "plugin_library",
            f"The DSA plugin library links TensorRT {built_major}.x but TensorRT {ctx.text('tensorrt')} is installed, so loading it fails with undefined symbols.",
            "Rebuild it with `dsa-export plugins build` against the installed TensorRT.",
        )
    archs = record.details.get("cuda_architectures")
    if archs and ctx.sm is not None:
        sass = {parse_version(a) for a in archs.get("sass", [])}
        ptx = [parse_version(a) for a in archs.get("ptx", [])]
        if ctx.sm[:2] not in {v[:2] for v in sass if v} and not any(
            v and v[:2] <= ctx.sm[:2] for v in ptx
        ):
            yield Finding(
                "plugin_library_gpu_unsupported",
                ctx.severity(asked),
                "plugin_library",
                f"The DSA plugin library has code for compute capability {', '.join(archs.get('sass', [])) or 'none'} and no usable PTX, which excludes {gpu_label(ctx)}.",
                f"Rebuild it with `dsa-export plugins build --arch {ctx.gpu.compute_capability if ctx.gpu else ''}`.",
            )
