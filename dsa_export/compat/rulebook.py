"""The rules that read the matrix, and RULES, the order all rules run in.

Severity follows what the user asked for (``RuleContext.severity``) and becomes ``info`` when the
matrix fact a finding rests on is unverified (``RuleContext.finding``), so that only facts with a
published source can block a build. Every release the matrix does not know gets an info finding
``*_not_in_matrix`` and no guess. Rules that read only the probe are in
:mod:`dsa_export.compat.tool_rules`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dsa_export.compat.findings import Finding
from dsa_export.compat.matrix import CompatibilityMatrix
from dsa_export.compat.records import COMPONENTS
from dsa_export.compat.rule_context import (
    GPU_BUILD_BACKENDS,
    Rule,
    RuleContext,
    driver_cuda_version,
    gpu_label,
)
from dsa_export.compat.tool_rules import (
    rule_driver,
    rule_nvcc,
    rule_plugin_library,
    rule_polygraphy,
    rule_torch,
)
from dsa_export.compat.versions import Version, format_version, parse_version, version_matches


def _spec_text(spec: str | list[str]) -> str:
    """A spec for a sentence: ``["11", "12.0-12.2"]`` reads "11.x, 12.0-12.2"."""
    specs = [spec] if isinstance(spec, str) else spec
    return ", ".join(f"{one}.x" if one.isdigit() else one for one in specs)


def _majors(spec: str | list[str]) -> set[int]:
    """CUDA majors named by a spec such as ``["11", "12.0-12.9"]``."""
    specs = [spec] if isinstance(spec, str) else spec
    majors = set()
    for one in specs:
        bound = parse_version(one)
        if bound is not None:
            majors.add(bound[0])
    return majors


def rule_cuda(ctx: RuleContext) -> Iterator[Finding]:
    """The driver against the CUDA runtime: the toolkit's own driver, else its major's minor-version floor."""
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
    major = ctx.matrix.release_row("cuda_major", runtime_version)
    if row is None:
        yield ctx.not_in_matrix(
            "cuda_not_in_matrix", "cuda_runtime", "CUDA", "its toolkit driver and GPU support"
        )
    driver_version = ctx.version("driver")
    driver_cuda = driver_cuda_version(ctx)
    if driver_version is not None and (row is not None or major is not None):
        own = row["driver_min"] if row is not None else None
        floor = major["minor_compat_floor"] if major is not None else None
        if own is not None and version_matches(driver_version, f">={own}"):
            pass
        elif floor is not None and version_matches(driver_version, f">={floor}"):
            if own is not None:
                yield ctx.finding(
                    "driver_minor_version_compat",
                    "warning",
                    "driver",
                    f"NVIDIA driver {ctx.text('driver')} is older than {own}, which CUDA {runtime.version} ships with, so it runs under minor-version compatibility without PTX JIT.",
                    f"Install NVIDIA driver {own} or newer so that plugin PTX can be JIT-compiled for this GPU.",
                    row,
                    ("driver_min",),
                )
        elif floor is not None:
            yield ctx.finding(
                "driver_too_old_for_cuda",
                "error",
                "driver",
                f"NVIDIA driver {ctx.text('driver')} is older than {floor}, the oldest driver that can run CUDA {runtime.version}.",
                f"Install NVIDIA driver {own or floor} or newer, or use a CUDA {format_version(driver_cuda) or 'runtime'} build of your stack.",
                major,
                ("minor_compat_floor",),
            )
    elif driver_cuda is not None and runtime_version is not None and driver_cuda[:1] < runtime_version[:1]:
        yield Finding(
            "driver_too_old_for_cuda",
            "error",
            "driver",
            f"The NVIDIA driver supports CUDA {format_version(driver_cuda)} but the CUDA runtime is {runtime.version}.",
            "Install a driver for the runtime's CUDA major version, or a runtime that matches the driver.",
        )
    if row is not None and "sm" in row and ctx.sm is not None and not version_matches(ctx.sm, row["sm"]):
        yield ctx.finding(
            "cuda_gpu_unsupported",
            ctx.severity(gpu_needed),
            "cuda_runtime",
            f"CUDA {runtime.version} supports compute capability {row['sm']}, which excludes {gpu_label(ctx)}.",
            "Use a CUDA release (and a TensorRT built for it) that still supports this GPU.",
            row,
            ("sm",),
        )


def _pick_build(builds: list[dict[str, Any]], version: Version | None) -> dict[str, Any] | None:
    """The build listing ``version``, else the first one for its CUDA major."""
    if version is None:
        return None
    for build in builds:
        if version_matches(version, build["cuda"]):
            return build
    return next((b for b in builds if version[0] in _majors(b["cuda"])), None)


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
    if row is None:
        yield ctx.not_in_matrix("cudnn_not_in_matrix", "cudnn", "cuDNN", "its CUDA and GPU support")
        return
    target = runtime or built_for
    build = _pick_build(row["builds"], target)
    if target is None:
        return
    if build is None:
        listed = _spec_text([b["cuda"] for b in row["builds"]])
        yield ctx.finding(
            "cudnn_cuda_unsupported",
            ctx.severity(ort_asked),
            "cudnn",
            f"cuDNN {cudnn.version} has builds for CUDA {listed} only, and none for CUDA {format_version(target)}.",
            f"Install a cuDNN release with a CUDA {target[0]}.x build.",
            row,
            ("builds",),
        )
        return
    if not version_matches(target, build["cuda"]):
        yield ctx.finding(
            "cudnn_cuda_not_listed",
            "info",
            "cudnn",
            f"cuDNN {cudnn.version} for CUDA {target[0]}.x lists CUDA {build['cuda']}, not {format_version(target)}, so it runs here under CUDA minor-version compatibility only.",
            "Nothing to do unless cuDNN misbehaves; a cuDNN release that lists this CUDA version is the tested combination.",
            row,
            ("builds",),
        )
    if ctx.sm is not None and not version_matches(ctx.sm, build["sm"]):
        yield ctx.finding(
            "cudnn_gpu_unsupported",
            ctx.severity(ort_asked),
            "cudnn",
            f"cuDNN {cudnn.version} for CUDA {target[0]}.x supports compute capability {build['sm']}, which excludes {gpu_label(ctx)}.",
            "Install a cuDNN release that supports this GPU.",
            row,
            ("builds",),
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
        yield ctx.not_in_matrix(
            f"{component}_not_in_matrix", component, label, "its CUDA and GPU support"
        )
        return
    runtime = ctx.probe.component("cuda_runtime")
    runtime_version = ctx.version("cuda_runtime")
    if runtime.found and not version_matches(runtime_version, row["cuda"]):
        yield ctx.finding(
            f"{component}_cuda_unsupported",
            ctx.severity(asked),
            component,
            f"{label} {record.version} has builds for CUDA {_spec_text(row['cuda'])}, not for the installed CUDA runtime {runtime.version}.",
            f"Install the {label} build for CUDA {runtime.version.split('.')[0] if runtime.version else ''}.x or a CUDA runtime it supports.",
            row,
            ("cuda",),
        )
    floors = row.get("driver_min") or {}
    driver_version = ctx.version("driver")
    floor = floors.get(str(runtime_version[0])) if runtime_version else None
    cuda_floor = ctx.matrix.release_row("cuda_major", runtime_version)
    if cuda_floor is not None and floor and version_matches(floor, f"<={cuda_floor['minor_compat_floor']}"):
        floor = None  # no stricter than CUDA's own floor, which rule_cuda checks
    if floor and driver_version is not None and not version_matches(driver_version, f">={floor}"):
        yield ctx.finding(
            f"{component}_driver_too_old",
            ctx.severity(asked),
            "driver",
            f"{label} {record.version} needs NVIDIA driver {floor} or newer for its CUDA {runtime_version[0]}.x build, and the driver is {ctx.text('driver')}.",
            f"Install NVIDIA driver {floor} or newer.",
            row,
            ("driver_min",),
        )
    if ctx.sm is not None and not version_matches(ctx.sm, row["sm"]):
        yield ctx.finding(
            f"{component}_gpu_unsupported",
            ctx.severity(asked),
            component,
            f"{label} {record.version} supports compute capability {_spec_text(row['sm'])}, which excludes {gpu_label(ctx)}.",
            _unsupported_gpu_fix(ctx, component, backend),
            row,
            ("sm",),
        )
    if backend == "tensorrt-rtx" and asked and not row.get("plugins", True):
        yield ctx.finding(
            "tensorrt_rtx_no_plugins",
            "info",
            component,
            "TensorRT-RTX loads no custom plugins, so DSA nodes are built from their ONNX function bodies (dense masked attention).",
            "Use `--backend tensorrt` with the dsa plugin library where the sparse kernels' speed matters.",
            row,
            ("plugins",),
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
    """The newest release of ``table`` whose SM range includes ``sm`` (the lower bound of its row)."""
    if sm is None:
        return None
    candidates = [
        release
        for row in matrix.table(table)
        if (release := parse_version(row["versions"])) is not None and version_matches(sm, row["sm"])
    ]
    return format_version(max(candidates)) if candidates else None


def rule_tensorrt(ctx: RuleContext) -> Iterator[Finding]:
    yield from _rule_trt_family(ctx, "tensorrt", "tensorrt", "TensorRT")


def rule_tensorrt_rtx(ctx: RuleContext) -> Iterator[Finding]:
    yield from _rule_trt_family(ctx, "tensorrt_rtx", "tensorrt-rtx", "TensorRT-RTX")


def rule_precision(ctx: RuleContext) -> Iterator[Finding]:
    if not ctx.for_build or ctx.backend == "auto" or ctx.sm is None:
        return
    row = ctx.matrix.precision_row(ctx.backend, ctx.precision)
    if row is not None and not version_matches(ctx.sm, row["sm"]):
        yield ctx.finding(
            "precision_unsupported",
            "error",
            "gpu",
            f"{ctx.precision.upper()} on {ctx.backend} needs compute capability {row['sm'].lstrip('>=')} or newer, and {gpu_label(ctx)} is older.",
            "Choose a precision this GPU supports (--precision fp16 or fp32) or build on a newer GPU.",
            row,
            ("sm",),
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
        yield ctx.not_in_matrix(
            "onnxruntime_not_in_matrix", "onnxruntime", "onnxruntime-gpu", "the CUDA and cuDNN it was built for"
        )
        return
    yield from _onnxruntime_build(ctx, record, row, asked)
    trt = ctx.probe.component("tensorrt")
    if (
        "TensorrtExecutionProvider" in providers
        and trt.found
        and row.get("tensorrt")
        and not version_matches(ctx.version("tensorrt"), row["tensorrt"])
    ):
        yield ctx.finding(
            "onnxruntime_tensorrt_mismatch",
            "warning",
            "onnxruntime",
            f"The TensorRT execution provider of onnxruntime-gpu {record.version} is built for TensorRT {row['tensorrt']} but TensorRT {trt.version} is installed.",
            f"Use the CUDA execution provider, or install TensorRT {row['tensorrt']} for ONNX Runtime's TensorRT provider.",
            row,
            ("tensorrt",),
        )


def _onnxruntime_build(
    ctx: RuleContext, record: Any, row: dict[str, Any], asked: bool
) -> Iterator[Finding]:
    """The CUDA and cuDNN of the installed build: the one its build info names, else the PyPI one."""
    built_for = parse_version(record.details.get("build_cuda_version"))
    if built_for is not None:
        build = next((b for b in row["builds"] if built_for[0] in _majors(b["cuda"])), None)
        which = f"the CUDA {built_for[0]}.x build of onnxruntime-gpu {record.version}"
        if build is None:
            yield ctx.not_in_matrix(
                "onnxruntime_build_not_in_matrix",
                "onnxruntime",
                f"The CUDA {built_for[0]}.x build of onnxruntime-gpu",
                "the cuDNN it was built for",
            )
            return
    else:
        build = next(b for b in row["builds"] if b["pypi"])
        which = f"onnxruntime-gpu {record.version} from PyPI"
    runtime = ctx.version("cuda_runtime")
    if runtime is not None and not version_matches(runtime, build["cuda"]):
        yield ctx.finding(
            "onnxruntime_cuda_mismatch",
            ctx.severity(asked),
            "onnxruntime",
            f"{which[0].upper()}{which[1:]} is built for CUDA {_spec_text(build['cuda'])} but the CUDA runtime is {ctx.text('cuda_runtime')}.",
            "Install the onnxruntime-gpu build for your CUDA major version.",
            row,
            ("builds",),
        )
    cudnn = ctx.probe.component("cudnn")
    if not cudnn.found or not version_matches(ctx.version("cudnn"), build["cudnn"]):
        have = f"cuDNN {cudnn.version}" if cudnn.found else "no cuDNN"
        yield ctx.finding(
            "onnxruntime_cudnn_mismatch",
            ctx.severity(asked),
            "onnxruntime",
            f"{which[0].upper()}{which[1:]} needs cuDNN {build['cudnn']} but this machine has {have}.",
            "Install the cuDNN version its CUDA execution provider was built with (for example the matching nvidia-cudnn wheel).",
            row,
            ("builds",),
        )


def rule_known_bad(ctx: RuleContext) -> Iterator[Finding]:
    """Data-only rules: a ``when`` over versions, backend, precision and GPU, and the sentences to say."""
    for row in ctx.matrix.table("known_bad"):
        if not _when_matches(ctx, row["when"]):
            continue
        values = {name: ctx.text(name) for name in COMPONENTS}
        component = next((key for key in row["when"] if key in COMPONENTS), "environment")
        yield ctx.finding(
            row["id"],
            row["severity"],
            component,
            row["message"].format(**values),
            row["fix"].format(**values),
            row,
            ("when",),
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

__all__ = ["GPU_BUILD_BACKENDS", "RULES", "Rule", "RuleContext", "newest_release_supporting"]
