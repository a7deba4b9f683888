"""Rules: a probe snapshot plus the compatibility matrix become findings.

A finding has a stable id, a severity and two sentences: what is wrong and how to fix it. Severity
follows what the user asked for: a missing TensorRT is an error for ``--for-build --backend
tensorrt`` and only information for a plain ``check``. Errors that break the environment for any GPU
use (a driver too old for the installed CUDA runtime) are errors always. ``report.blocking`` lists
the error findings; the build command refuses to start while it is non-empty.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsa_export.compat.matrix import CompatibilityMatrix, load_matrix
from dsa_export.compat.probe import (
    COMPONENTS,
    EnvironmentProbe,
    GpuRecord,
    ProbeSettings,
    plugin_library_state,
    probe_environment,
)
from dsa_export.compat.versions import Version, format_version, parse_version, version_matches
from dsa_export.errors import DSAUsageError, DSAUserError

REPORT_SCHEMA_VERSION = 1
BACKENDS: tuple[str, ...] = ("auto", "tensorrt", "tensorrt-rtx", "onnxruntime")
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "fp8")
SEVERITIES: tuple[str, ...] = ("error", "warning", "info")
DEFAULT_BACKEND = "auto"
DEFAULT_PRECISION = "fp16"
DEFAULT_DEVICE = 0
# Backends whose builds need a GPU here. TensorRT-RTX builds ahead of time for a chosen compute
# capability without one (measured on the CPU-only development machine), so it is not listed.
GPU_BUILD_BACKENDS = ("tensorrt",)


@dataclass
class CheckSettings:
    """What the check is asked. ``None`` means the default."""

    for_build: bool = False  # check that an engine can be built; --backend/--precision imply it
    backend: str | None = None  # one of BACKENDS; None -> "auto" (pick the best available)
    precision: str | None = None  # one of PRECISIONS; None -> "fp16"; checked only for builds
    engine: Path | None = None  # also gate this engine (reads manifest.json next to it)
    device: int | None = None  # index of the GPU to check against; None -> 0
    matrix_path: Path | None = None  # None -> the packaged matrix.json
    probe: ProbeSettings | None = None  # how probing runs

    def validated(self) -> CheckSettings:
        """A copy with defaults filled in; DSAUsageError on values outside the allowed sets."""
        backend = self.backend or DEFAULT_BACKEND
        precision = self.precision or DEFAULT_PRECISION
        if backend not in BACKENDS:
            raise DSAUsageError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}.")
        if precision not in PRECISIONS:
            raise DSAUsageError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}.")
        for_build = self.for_build or self.backend is not None or self.precision is not None
        device = DEFAULT_DEVICE if self.device is None else self.device
        if device < 0:
            raise DSAUsageError(f"device index {device} is negative.")
        return dataclasses.replace(
            self, for_build=for_build, backend=backend, precision=precision, device=device
        )


@dataclass(frozen=True)
class Finding:
    """One problem or notice. ``id`` is stable across releases; scripts may match on it."""

    id: str
    severity: str  # error | warning | info
    component: str
    message: str  # one sentence: what is wrong
    fix: str  # one sentence: what to do
    source: str | None = None  # matrix row the finding rests on

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class CheckReport:
    """Findings for one request against one environment snapshot."""

    request: dict[str, Any]
    findings: list[Finding]
    environment: EnvironmentProbe
    matrix_version: str
    engine: dict[str, Any] | None = None

    @property
    def blocking(self) -> list[Finding]:
        """Error findings: what stops the requested build or engine load."""
        return [finding for finding in self.findings if finding.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.blocking

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        from dsa_export import __version__

        counts = {severity: 0 for severity in SEVERITIES}
        for finding in self.findings:
            counts[finding.severity] += 1
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "dsa_export_version": __version__,
            "matrix_version": self.matrix_version,
            "request": dict(self.request),
            "ok": self.ok,
            "blocking": [finding.id for finding in self.blocking],
            "counts": counts,
            "findings": [finding.to_dict() for finding in self.findings],
            "engine": self.engine,
            "environment": self.environment.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def manifest_record(report: CheckReport | None, skipped: bool) -> dict[str, Any]:
    """What a build manifest stores about the gate: whether it ran, was skipped, and what it said."""
    if skipped or report is None:
        return {"skipped": True, "findings": []}
    return {
        "skipped": False,
        "matrix_version": report.matrix_version,
        "findings": [{"id": f.id, "severity": f.severity} for f in report.findings],
    }


def require_no_blocking(report: CheckReport) -> None:
    """Raise DSAUserError naming the first blocking finding (the build command's gate)."""
    blocking = report.blocking
    if blocking:
        first = blocking[0]
        more = (
            f" ({len(blocking) - 1} more: run `dsa-export check --for-build` to see them)"
            if len(blocking) > 1
            else ""
        )
        raise DSAUserError(f"{first.message} {first.fix}{more} Pass --skip-checks to build anyway.")


# ---------------------------------------------------------------------------------------------
# Rule context


@dataclass
class RuleContext:
    """Everything a rule looks at."""

    probe: EnvironmentProbe
    matrix: CompatibilityMatrix
    for_build: bool
    backend: str  # resolved: "auto" only when nothing was asked
    precision: str
    gpu: GpuRecord | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def sm(self) -> Version | None:
        return (
            parse_version(self.gpu.compute_capability)
            if self.gpu and self.gpu.compute_capability
            else None
        )

    def asked(self, backend: str) -> bool:
        return self.for_build and self.backend == backend

    def severity(self, asked: bool, otherwise: str = "warning") -> str:
        return "error" if asked else otherwise

    def version(self, component: str) -> Version | None:
        return self.probe.version(component)

    def text(self, component: str) -> str:
        record = self.probe.component(component)
        return record.version or "unknown"


Rule = Callable[[RuleContext], Iterable[Finding]]


def _gpu_label(ctx: RuleContext) -> str:
    gpu = ctx.gpu
    return (
        f"GPU {gpu.index} ({gpu.name}, compute capability {gpu.compute_capability})"
        if gpu
        else "no GPU"
    )


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


def rule_cuda(ctx: RuleContext) -> Iterator[Finding]:
    runtime = ctx.probe.component("cuda_runtime")
    gpu_needed = ctx.for_build and ctx.backend in GPU_BUILD_BACKENDS
    if not runtime.found:
        if ctx.probe.component("driver").found or gpu_needed:
            yield Finding(
                "cuda_runtime_missing",
                ctx.severity(gpu_needed, "info"),
                "cuda_runtime",
                f"No CUDA runtime library was found ({runtime.reason}).",
                "Install the CUDA toolkit or the nvidia-cuda-runtime wheel matching your TensorRT, or set CUDA_HOME.",
            )
        return
    runtime_version = ctx.version("cuda_runtime")
    row = ctx.matrix.release_row("cuda", runtime_version)
    driver_version = ctx.version("driver")
    driver_cuda = ctx.version("cuda_driver") or parse_version(
        ctx.probe.component("driver").details.get("cuda_driver_version")
    )
    if row is not None and driver_version is not None:
        if not version_matches(driver_version, f">={row['minor_compat_floor']}"):
            yield Finding(
                "driver_too_old_for_cuda",
                "error",
                "driver",
                f"NVIDIA driver {ctx.text('driver')} is older than {row['minor_compat_floor']}, the oldest driver that can run CUDA {runtime.version}.",
                f"Install NVIDIA driver {row['driver_min']} or newer, or use a CUDA {format_version(driver_cuda) or 'runtime'} build of your stack.",
                row["source"],
            )
        elif not version_matches(driver_version, f">={row['driver_min']}"):
            yield Finding(
                "driver_minor_version_compat",
                "warning",
                "driver",
                f"NVIDIA driver {ctx.text('driver')} is older than {row['driver_min']}, which CUDA {runtime.version} ships with, so it runs under minor-version compatibility without PTX JIT.",
                f"Install NVIDIA driver {row['driver_min']} or newer so that plugin PTX can be JIT-compiled for this GPU.",
                row["source"],
            )
    elif (
        driver_cuda is not None
        and runtime_version is not None
        and driver_cuda[:1] < runtime_version[:1]
    ):
        yield Finding(
            "driver_too_old_for_cuda",
            "error",
            "driver",
            f"The NVIDIA driver supports CUDA {format_version(driver_cuda)} but the CUDA runtime is {runtime.version}.",
            "Install a driver for the runtime's CUDA major version, or a runtime that matches the driver.",
        )
    if row is not None and ctx.sm is not None and not version_matches(ctx.sm, row["sm"]):
        yield Finding(
            "cuda_gpu_unsupported",
            ctx.severity(gpu_needed),
            "cuda_runtime",
            f"CUDA {runtime.version} supports compute capability {row['sm']}, which excludes {_gpu_label(ctx)}.",
            "Use a CUDA release (and a TensorRT built for it) that still supports this GPU.",
            row["source"],
        )


def rule_cudnn(ctx: RuleContext) -> Iterator[Finding]:
    cudnn = ctx.probe.component("cudnn")
    if not cudnn.found:
        return
    built_for = parse_version(cudnn.details.get("built_for_cuda"))
    runtime = ctx.version("cuda_runtime")
    ort_asked = ctx.asked("onnxruntime")
    if built_for and runtime and built_for[0] != runtime[0]:
        yield Finding(
            "cudnn_cuda_mismatch",
            ctx.severity(ort_asked),
            "cudnn",
            f"cuDNN {cudnn.version} was built for CUDA {format_version(built_for)} but the CUDA runtime is {ctx.text('cuda_runtime')}.",
            f"Install the cuDNN build for CUDA {runtime[0]}.x (for example the nvidia-cudnn-cu{runtime[0]} wheel).",
        )
    row = ctx.matrix.release_row("cudnn", ctx.version("cudnn"))
    if row is not None and ctx.sm is not None:
        sm_spec: str = (
            row["sm_with_cuda13"]
            if runtime and runtime[0] >= 13 and row.get("sm_with_cuda13")
            else row["sm"]
        )
        if not version_matches(ctx.sm, sm_spec):
            yield Finding(
                "cudnn_gpu_unsupported",
                ctx.severity(ort_asked),
                "cudnn",
                f"cuDNN {cudnn.version} supports compute capability {sm_spec}, which excludes {_gpu_label(ctx)}.",
                "Install a cuDNN release that supports this GPU.",
                row["source"],
            )


def _rule_trt_family(
    ctx: RuleContext, component: str, backend: str, label: str
) -> Iterator[Finding]:
    record = ctx.probe.component(component)
    asked = ctx.asked(backend)
    if not record.found:
        if record.details.get("import_error"):
            yield Finding(
                f"{component}_import_failed",
                ctx.severity(asked),
                component,
                f"{label} is installed but does not load: {record.details['import_error']}.",
                f"Reinstall {label} for your CUDA major version and check LD_LIBRARY_PATH for a second, older copy.",
            )
        else:
            install = (
                "pip install tensorrt" if backend == "tensorrt" else "pip install dsa-export[rtx]"
            )
            yield Finding(
                f"{component}_missing",
                ctx.severity(asked, "info"),
                component,
                f"{label} is not installed, so `--backend {backend}` is unavailable here.",
                f"Install it (`{install}`, or NVIDIA's packages for your CUDA version).",
            )
        return
    module_version = parse_version(record.details.get("module_version"))
    library_version = parse_version(record.details.get("library_version"))
    if module_version and library_version and module_version[:3] != library_version[:3]:
        yield Finding(
            f"{component}_version_mismatch",
            ctx.severity(asked),
            component,
            f"The {label} Python module is {format_version(module_version)} but the library it would load is {format_version(library_version)}.",
            f"Install matching versions, or remove the stray library at {record.details.get('library_path')} from the loader path.",
        )
    row = ctx.matrix.release_row(component, ctx.version(component))
    if row is None:
        yield Finding(
            f"{component}_not_in_matrix",
            "info",
            component,
            f"{label} {record.version} is not in compatibility matrix {ctx.matrix.matrix_version}, so its CUDA and GPU support were not checked.",
            "Add a row for it to dsa_export/compat/matrix.json (see docs/compat.md) or upgrade dsa-export.",
        )
        return
    runtime = ctx.probe.component("cuda_runtime")
    if runtime.found and not version_matches(ctx.version("cuda_runtime"), row["cuda"]):
        yield Finding(
            f"{component}_cuda_unsupported",
            ctx.severity(asked),
            component,
            f"{label} {record.version} supports CUDA {_spec_text(row['cuda'])}, not the installed CUDA runtime {runtime.version}.",
            f"Install the {label} build for CUDA {runtime.version.split('.')[0] if runtime.version else ''}.x or a CUDA runtime it supports.",
            row["source"],
        )
    if ctx.sm is not None and not version_matches(ctx.sm, row["sm"]):
        yield Finding(
            f"{component}_gpu_unsupported",
            ctx.severity(asked),
            component,
            f"{label} {record.version} supports compute capability {_spec_text(row['sm'])}, which excludes {_gpu_label(ctx)}.",
            _unsupported_gpu_fix(ctx, component, backend),
            row["source"],
        )
    if (
        backend == "tensorrt"
        and row.get("cudnn_required")
        and not ctx.probe.component("cudnn").found
    ):
        yield Finding(
            "tensorrt_cudnn_missing",
            ctx.severity(asked),
            "cudnn",
            f"TensorRT {record.version} needs cuDNN {row.get('cudnn')} and none was found.",
            f"Install cuDNN {row.get('cudnn')} for your CUDA version.",
            row["source"],
        )
    if backend == "tensorrt-rtx" and asked and not row.get("plugins", True):
        yield Finding(
            "tensorrt_rtx_no_plugins",
            "info",
            component,
            "TensorRT-RTX loads no custom plugins, so DSA nodes are built from their ONNX function bodies (dense masked attention).",
            "Use `--backend tensorrt` with the dsa plugin library where the sparse kernels' speed matters.",
            row["source"],
        )


def _unsupported_gpu_fix(ctx: RuleContext, table: str, backend: str) -> str:
    if backend == "tensorrt-rtx":
        return "Use `--backend tensorrt` on this GPU (TensorRT-RTX targets GeForce/RTX Turing, Ampere, Ada and Blackwell)."
    newest = newest_release_supporting(ctx.matrix, table, ctx.sm)
    if newest is None:
        return "Build on a GPU that this TensorRT release supports."
    return f"Install TensorRT {newest}, the newest release in the matrix that supports compute capability {format_version(ctx.sm)}, or build on a newer GPU."


def newest_release_supporting(
    matrix: CompatibilityMatrix, table: str, sm: Version | None
) -> str | None:
    """Newest specific (major.minor) release of ``table`` whose SM range includes ``sm``."""
    if sm is None:
        return None
    candidates = [
        release
        for row in matrix.table(table)
        if (release := parse_version(row["release"])) is not None
        and len(release) >= 2
        and version_matches(sm, row["sm"])
    ]
    return format_version(max(candidates)) if candidates else None


def _spec_text(spec: str | list[str]) -> str:
    return spec if isinstance(spec, str) else ", ".join(spec)


def rule_tensorrt(ctx: RuleContext) -> Iterator[Finding]:
    yield from _rule_trt_family(ctx, "tensorrt", "tensorrt", "TensorRT")


def rule_tensorrt_rtx(ctx: RuleContext) -> Iterator[Finding]:
    yield from _rule_trt_family(ctx, "tensorrt_rtx", "tensorrt-rtx", "TensorRT-RTX")


def rule_precision(ctx: RuleContext) -> Iterator[Finding]:
    if not ctx.for_build or ctx.backend == "auto" or ctx.sm is None:
        return
    row = ctx.matrix.precision_row(ctx.backend, ctx.precision)
    if row is not None and not version_matches(ctx.sm, row["sm"]):
        yield Finding(
            "precision_unsupported",
            "error",
            "gpu",
            f"{ctx.precision.upper()} on {ctx.backend} needs compute capability {row['sm'].lstrip('>=')} or newer, and {_gpu_label(ctx)} is older.",
            "Choose a precision this GPU supports (--precision fp16 or fp32) or build on a newer GPU.",
            row["source"],
        )


def rule_onnxruntime(ctx: RuleContext) -> Iterator[Finding]:
    record = ctx.probe.component("onnxruntime")
    asked = ctx.asked("onnxruntime")
    distributions = record.details.get("distributions") or {}
    if len(distributions) > 1:
        yield Finding(
            "onnxruntime_conflicting_packages",
            ctx.severity(asked),
            "onnxruntime",
            f"Several ONNX Runtime packages share the `onnxruntime` module here ({', '.join(sorted(distributions))}), so the providers depend on install order.",
            "Uninstall all of them and install exactly one (onnxruntime-gpu on GPU machines).",
        )
    if not record.found:
        yield Finding(
            "onnxruntime_missing",
            ctx.severity(asked),
            "onnxruntime",
            f"ONNX Runtime is unavailable ({record.reason}), so ONNX validation cannot run.",
            "Install it with `pip install onnxruntime` (or onnxruntime-gpu on GPU machines).",
        )
        return
    providers = record.details.get("providers") or []
    if "CUDAExecutionProvider" not in providers:
        if ctx.gpu is not None and asked:
            yield Finding(
                "onnxruntime_cpu_only",
                "info",
                "onnxruntime",
                "This ONNX Runtime has no CUDA execution provider, so validation runs on the CPU.",
                "Install onnxruntime-gpu (and uninstall onnxruntime) to validate on the GPU.",
            )
        return
    row = ctx.matrix.release_row("onnxruntime_gpu", ctx.version("onnxruntime"))
    if row is None:
        return
    runtime = ctx.version("cuda_runtime")
    if runtime is not None and not version_matches(runtime, row["cuda"]):
        yield Finding(
            "onnxruntime_cuda_mismatch",
            ctx.severity(asked),
            "onnxruntime",
            f"onnxruntime-gpu {record.version} is built for CUDA {_spec_text(row['cuda'])} but the CUDA runtime is {ctx.text('cuda_runtime')}.",
            "Install the onnxruntime-gpu build for your CUDA major version.",
            row["source"],
        )
    cudnn = ctx.probe.component("cudnn")
    if not cudnn.found or not version_matches(ctx.version("cudnn"), row["cudnn"]):
        have = f"cuDNN {cudnn.version}" if cudnn.found else "no cuDNN"
        yield Finding(
            "onnxruntime_cudnn_mismatch",
            ctx.severity(asked),
            "onnxruntime",
            f"onnxruntime-gpu {record.version} needs cuDNN {row['cudnn']} but this machine has {have}.",
            "Install the cuDNN version its CUDA execution provider was built with (for example the matching nvidia-cudnn wheel).",
            row["source"],
        )
    trt = ctx.probe.component("tensorrt")
    if (
        "TensorrtExecutionProvider" in providers
        and trt.found
        and row.get("tensorrt")
        and not version_matches(ctx.version("tensorrt"), row["tensorrt"])
    ):
        yield Finding(
            "onnxruntime_tensorrt_mismatch",
            "warning",
            "onnxruntime",
            f"The TensorRT execution provider of onnxruntime-gpu {record.version} is built for TensorRT {row['tensorrt']} but TensorRT {trt.version} is installed.",
            f"Use the CUDA execution provider, or install TensorRT {row['tensorrt']} for ONNX Runtime's TensorRT provider.",
            row["source"],
        )


def rule_torch(ctx: RuleContext) -> Iterator[Finding]:
    record = ctx.probe.component("torch")
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
    driver_cuda = ctx.version("cuda_driver") or parse_version(
        ctx.probe.component("driver").details.get("cuda_driver_version")
    )
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
                f"The DSA plugin library has code for compute capability {', '.join(archs.get('sass', [])) or 'none'} and no usable PTX, which excludes {_gpu_label(ctx)}.",
                f"Rebuild it with `dsa-export plugins build --arch {ctx.gpu.compute_capability if ctx.gpu else ''}`.",
            )


def rule_known_bad(ctx: RuleContext) -> Iterator[Finding]:
    for row in ctx.matrix.table("known_bad"):
        if not _when_matches(ctx, row["when"]):
            continue
        values = {name: ctx.text(name) for name in COMPONENTS}
        component = next((key for key in row["when"] if key in COMPONENTS), "environment")
        yield Finding(
            row["id"],
            row["severity"],
            component,
            row["message"].format(**values),
            row["fix"].format(**values),
            row["source"],
        )


def _when_matches(ctx: RuleContext, when: dict[str, Any]) -> bool:
    for key, spec in when.items():
        if key == "precision":
            if not ctx.for_build or ctx.precision not in spec:
                return False
        elif key == "backend":
            if not ctx.for_build or ctx.backend not in spec:
                return False
        elif key == "sm":
            if ctx.sm is None or not version_matches(ctx.sm, spec):
                return False
        elif ctx.version(key) is None or not version_matches(ctx.version(key), spec):
            return False
    return True


RULES: tuple[Rule, ...] = (
    rule_driver,
    rule_cuda,
    rule_cudnn,
    rule_tensorrt,
    rule_tensorrt_rtx,
    rule_precision,
    rule_onnxruntime,
    rule_torch,
    rule_nvcc,
    rule_polygraphy,
    rule_plugin_library,
    rule_known_bad,
)


# ---------------------------------------------------------------------------------------------
# Running the checks


def resolve_backend(
    requested: str,
    for_build: bool,
    probe: EnvironmentProbe,
    gpu: GpuRecord | None,
    matrix: CompatibilityMatrix,
) -> str:
    """``auto`` becomes the best backend the environment can build with; other values stay."""
    if requested != "auto" or not for_build:
        return requested
    if gpu is not None and probe.component("tensorrt").found:
        return "tensorrt"
    rtx = matrix.release_row("tensorrt_rtx", probe.version("tensorrt_rtx"))
    sm = parse_version(gpu.compute_capability) if gpu and gpu.compute_capability else None
    if (
        probe.component("tensorrt_rtx").found
        and rtx is not None
        and sm is not None
        and version_matches(sm, rtx["sm"])
    ):
        return "tensorrt-rtx"
    return "onnxruntime"


_SEVERITY_RANK = {severity: rank for rank, severity in enumerate(SEVERITIES)}
_COMPONENT_RANK = {
    name: rank for rank, name in enumerate(("driver", "gpu", *COMPONENTS, "engine", "environment"))
}


def _selected_gpu(probe: EnvironmentProbe, device: int | None) -> GpuRecord | None:
    index = DEFAULT_DEVICE if device is None else device
    return probe.gpus[index] if index < len(probe.gpus) else None


def _sorted(findings: list[Finding]) -> list[Finding]:
    """Severity first, then component in report order, then id: the stable order of the report."""
    return sorted(
        findings,
        key=lambda f: (_SEVERITY_RANK[f.severity], _COMPONENT_RANK.get(f.component, 99), f.id),
    )


def evaluate(
    settings: CheckSettings, probe: EnvironmentProbe, matrix: CompatibilityMatrix
) -> tuple[list[Finding], str]:
    """Apply RULES to a snapshot: the sorted findings and the backend ``auto`` resolved to."""
    gpu = _selected_gpu(probe, settings.device)
    extra: dict[str, Any] = {}
    if probe.gpus and gpu is None:
        extra["device_missing"] = settings.device
    backend = resolve_backend(
        settings.backend or DEFAULT_BACKEND, settings.for_build, probe, gpu, matrix
    )
    precision = settings.precision or DEFAULT_PRECISION
    ctx = RuleContext(probe, matrix, settings.for_build, backend, precision, gpu, extra)
    return _sorted([finding for rule in RULES for finding in rule(ctx)]), backend


def run_checks(
    settings: CheckSettings | None = None, probe: EnvironmentProbe | None = None
) -> CheckReport:
    """Probe the environment (unless a snapshot is given), apply the rules, and gate an engine if asked.

    Raises DSAUsageError for invalid settings and DSAUserError when ``settings.engine`` is not an
    engine with a readable manifest; every environment problem becomes a finding instead.
    """
    settings = (settings or CheckSettings()).validated()
    matrix = load_matrix(settings.matrix_path)
    requirements = None
    if settings.engine is not None:  # a file that is not an engine fails before the slow probing
        from dsa_export.compat.engine_gate import read_requirements

        requirements = read_requirements(Path(settings.engine))
    if probe is None:
        probe = probe_environment(settings.probe)
    findings, resolved = evaluate(settings, probe, matrix)
    engine_info = None
    if requirements is not None:
        from dsa_export.compat.engine_gate import compare_engine

        engine_findings = compare_engine(requirements, probe, device=settings.device or 0)
        engine_info = {"path": str(settings.engine), "requirements": requirements.to_dict()}
        findings = _sorted(findings + engine_findings)
    request = {
        "for_build": settings.for_build,
        "backend": settings.backend,
        "resolved_backend": resolved if settings.for_build else None,
        "precision": settings.precision if settings.for_build else None,
        "device": settings.device,
        "engine": str(settings.engine) if settings.engine else None,
    }
    return CheckReport(request, findings, probe, matrix.matrix_version, engine_info)
