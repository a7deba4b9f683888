"""Settings of ``dsa-export build``: every field documented, every default written here once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsa_export.errors import DSAUsageError
from dsa_export.trt.profiles import DEFAULT_RANGE, ShapeRange

BACKENDS = ("auto", "tensorrt", "tensorrt-rtx", "onnxruntime")
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
HARDWARE_COMPATIBILITY = {"none": "none", "ampere+": "ampere_plus", "same-cc": "same_compute_capability"}

#: Precision when none is asked: fp32 unless a TensorRT engine is built for a GPU here (then fp16).
#: fp32 keeps the CPU artifacts (ONNX Runtime, the validation report) equal to torch elementwise.
DEFAULT_PRECISION_CPU = "fp32"
DEFAULT_PRECISION_TENSORRT = "fp16"
#: TensorRT-RTX compute capability targeted when no supported GPU is visible (Ada, RTX 40xx/L4/L40).
DEFAULT_RTX_TARGETS = ("SM89",)
#: ONNX Runtime graph optimizations saved into the artifact. BASIC is hardware independent; higher
#: levels write CPU-specific fused ops that other machines and execution providers cannot use.
DEFAULT_ORT_OPTIMIZATION = "basic"
#: Sequence lengths the validate step compares at (the traced export saw 64).
DEFAULT_VALIDATION_SEQ_LENS = (16, 64, 256)


@dataclass
class BuildSettings:
    """What ``build`` was asked. ``None`` means "use the default" (resolved by :meth:`resolved`).

    Attributes:
        model: MODEL spec (built-in name, ``file.py:factory``, HF dir) or an ``.onnx`` file; None is
            the built-in demo model.
        output: the artifact folder (built in a temporary sibling, renamed at the end).
        precision: fp32, fp16, bf16, int8 or fp8; None picks by backend (see above).
        backend: auto, tensorrt, tensorrt-rtx or onnxruntime. ``auto`` builds the best engine this
            machine can build and always adds the portable ONNX Runtime artifact.
        ranges: min/opt/max of the dynamic dims (batch, sequence) of the optimization profile.
        profiles: when not empty, replaces ``ranges`` for the engine: each entry becomes one
            optimization profile, in order (e.g. prefill: sequence 1..max with past_sequence 0/0/0;
            decode: sequence 1 with past_sequence 0..max), and the manifest's ``profiles.dims`` is
            the first. ``ranges`` stays what takes a single range (the ONNX Runtime artifact), so
            give it one that covers every profile. All profiles name the same dims.
        plugin_library: our TensorRT plugin library; None searches for it (TensorRT backend only).
        timing_cache: TensorRT timing cache to reuse and update; None keeps one in the output folder.
        version_compatible: TensorRT version-compatible engine.
        hardware_compatibility: none, ampere+ or same-cc (TensorRT's hardware compatibility level).
        optimization_level: TensorRT builder optimization level (0-5).
        rtx_targets: TensorRT-RTX compute capabilities (``SM89``...); None: the visible GPU if
            TensorRT-RTX supports it, else :data:`DEFAULT_RTX_TARGETS`.
        skip_checks: build even when the compatibility checks find a blocking problem.
        validate: run the validation step (ONNX Runtime vs torch) on the exported file.
        validation_seq_lens: sequence lengths the validation compares at.
        calibration_data: data for int8/fp8 calibration; None uses the model's bundled data.
        force: replace an existing non-empty output folder that is not a previous build.
        device: index of the GPU checked and built for.
        ort_optimization: graph optimization level saved into the ONNX Runtime artifact.
    """

    model: str | None = None
    output: Path = Path("out/demo")
    precision: str | None = None
    backend: str = "auto"
    ranges: ShapeRange = DEFAULT_RANGE
    profiles: tuple[ShapeRange, ...] = ()
    plugin_library: Path | None = None
    timing_cache: Path | None = None
    version_compatible: bool = False
    hardware_compatibility: str = "none"
    optimization_level: int = 3
    rtx_targets: tuple[str, ...] | None = None
    skip_checks: bool = False
    validate: bool = True
    validation_seq_lens: tuple[int, ...] = DEFAULT_VALIDATION_SEQ_LENS
    calibration_data: str | None = None
    force: bool = False
    device: int = 0
    ort_optimization: str = DEFAULT_ORT_OPTIMIZATION

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise DSAUsageError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}.")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise DSAUsageError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}.")
        if self.hardware_compatibility in HARDWARE_COMPATIBILITY:
            self.hardware_compatibility = HARDWARE_COMPATIBILITY[self.hardware_compatibility]
        if self.hardware_compatibility not in HARDWARE_COMPATIBILITY.values():
            raise DSAUsageError(
                f"hardware compatibility {self.hardware_compatibility!r} is not one of {', '.join(HARDWARE_COMPATIBILITY)}."
            )
        if not 0 <= self.optimization_level <= 5:
            raise DSAUsageError(f"optimization level {self.optimization_level} is not in 0..5.")
        self.output = Path(self.output)
        self.profiles = tuple(self.profiles)
        for index, profile in enumerate(self.profiles):
            if not isinstance(profile, ShapeRange):
                raise DSAUsageError(f"profile {index} is {profile!r}, not a ShapeRange of min/opt/max dims.")
        if self.profiles:
            names = [sorted(p.dims) for p in self.profiles]
            if any(n != names[0] for n in names):
                raise DSAUsageError(
                    "every optimization profile must give ranges for the same dims; got "
                    + "; ".join(f"profile {i}: {', '.join(n)}" for i, n in enumerate(names)) + "."
                )

    @property
    def model_is_onnx(self) -> bool:
        return bool(self.model) and str(self.model).endswith(".onnx")


def parse_shape_ranges(
    min_shapes: str | None, opt_shapes: str | None, max_shapes: str | None, base: ShapeRange = DEFAULT_RANGE
) -> ShapeRange:
    """``batch=1,sequence=1`` style options over ``base``; DSAUsageError on malformed text."""
    dims = {name: list(values) for name, values in base.dims.items()}
    for index, text, option in ((0, min_shapes, "--min-shapes"), (1, opt_shapes, "--opt-shapes"), (2, max_shapes, "--max-shapes")):
        if not text:
            continue
        for item in text.split(","):
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or not name or not value.strip().isdigit():
                raise DSAUsageError(f"{option} takes name=size pairs such as batch=1,sequence=128; got {text!r}.")
            dims.setdefault(name, list(dims.get(name, [int(value)] * 3)))
            dims[name][index] = int(value)
    try:
        return ShapeRange({name: tuple(values) for name, values in dims.items()})  # type: ignore[misc]
    except Exception as exc:  # ShapeRange raises DSAUserError with the reason
        raise DSAUsageError(str(exc)) from exc


__all__ = ["BACKENDS", "PRECISIONS", "BuildSettings", "parse_shape_ranges"]
