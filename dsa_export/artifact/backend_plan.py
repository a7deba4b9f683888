"""Which artifacts a build makes, and why (:func:`plan_backends`): TensorRT with a GPU, else
TensorRT-RTX ahead of time for the targets it supports, plus the ONNX Runtime artifact; and the
default precision of each choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsa_export.artifact.settings import (
    DEFAULT_PRECISION_CPU,
    DEFAULT_PRECISION_TENSORRT,
    DEFAULT_RTX_TARGETS,
    BuildSettings,
)
from dsa_export.errors import DSAUserError


@dataclass
class BackendPlan:
    """Which artifacts this build makes, and why."""

    engine: str | None  # "tensorrt" | "tensorrt-rtx" | None
    onnxruntime: bool
    reason: str
    rtx_targets: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)

    @property
    def backends(self) -> list[str]:
        return [b for b in (self.engine, "onnxruntime" if self.onnxruntime else None) if b]



# ---------------------------------------------------------------------------------------------
# Backend choice


def _rtx_supported_sms(probe) -> list[str]:
    from dsa_export.compat.matrix import load_matrix

    row = load_matrix().release_row("tensorrt_rtx", probe.version("tensorrt_rtx"))
    return [str(sm) for sm in (row or {}).get("sm", [])]


def _sm_name(cc: str) -> str:
    return "SM" + cc.replace(".", "")


def plan_backends(settings: BuildSettings, probe) -> BackendPlan:
    """Resolve ``settings.backend`` against what is installed here; ``auto`` says why it chose."""
    gpus = probe.gpus
    gpu = gpus[settings.device] if settings.device < len(gpus) else None
    trt = probe.component("tensorrt")
    rtx = probe.component("tensorrt_rtx")
    rtx_note = "TensorRT-RTX loads no plugins, so the dsa nodes run as their ONNX function bodies"

    def rtx_targets() -> tuple[tuple[str, ...], str]:
        if settings.rtx_targets:
            return tuple(settings.rtx_targets), "the compute capabilities asked for"
        if gpu is not None and gpu.compute_capability:
            if gpu.compute_capability in _rtx_supported_sms(probe):
                return (_sm_name(gpu.compute_capability),), f"GPU {gpu.index} ({gpu.name})"
            return (), f"GPU {gpu.index} ({gpu.name}, compute capability {gpu.compute_capability}) is not supported by TensorRT-RTX"
        return DEFAULT_RTX_TARGETS, "no GPU is visible, so it is built ahead of time for the default target"

    if settings.backend == "tensorrt":
        return BackendPlan("tensorrt", False, "asked for with --backend tensorrt")
    if settings.backend == "onnxruntime":
        return BackendPlan(None, True, "asked for with --backend onnxruntime")
    if settings.backend == "tensorrt-rtx":
        targets, why = rtx_targets()
        if not targets:
            raise DSAUserError(f"Cannot build for TensorRT-RTX: {why}; pass --rtx-target (e.g. SM89) or use --backend tensorrt.")
        return BackendPlan("tensorrt-rtx", False, f"asked for with --backend tensorrt-rtx; targets {', '.join(targets)} ({why}); {rtx_note}", targets)
    # auto
    if trt.found and gpu is not None:
        return BackendPlan(
            "tensorrt", True,
            f"auto: TensorRT {trt.version} and GPU {gpu.index} ({gpu.name}, compute capability {gpu.compute_capability}) "
            "are present: a TensorRT engine with the DSA plugins and the portable ONNX Runtime artifact",
        )
    missing = "TensorRT is not installed" if not trt.found else "no GPU is visible for TensorRT"
    if rtx.found:
        targets, why = rtx_targets()
        if targets:
            return BackendPlan(
                "tensorrt-rtx", True,
                f"auto: {missing} and TensorRT-RTX {rtx.version} is: a TensorRT-RTX engine for {', '.join(targets)} "
                f"({why}) and the portable ONNX Runtime artifact; {rtx_note}",
                targets,
            )
        return BackendPlan(None, True, f"auto: {missing} and {why}, so only the ONNX Runtime artifact")
    return BackendPlan(None, True, f"auto: {missing} and TensorRT-RTX is not installed, so only the ONNX Runtime artifact")


def default_precision(plan: BackendPlan) -> str:
    return DEFAULT_PRECISION_TENSORRT if plan.engine == "tensorrt" else DEFAULT_PRECISION_CPU
