"""TensorRT-RTX: parse an ONNX file and build an ahead-of-time engine, on a machine without a GPU.

TensorRT-RTX has no plugin support, so custom ``dsa`` nodes are inlined from their ONNX function
bodies by its parser. Its AOT builder targets the compute capabilities given (Ampere and newer
consumer/workstation GPUs; it does not support Hopper), so this proves a graph parses and builds
here, while production engines for data-center GPUs come from full TensorRT.

An engine build is minutes of native code, and an exception raised in one of its Python callbacks
(Ctrl-C reaching the logger) is swallowed by TensorRT-RTX. Interrupts therefore only set a flag
(:func:`dsa_export.interrupts.native_call`): the builder's progress monitor returns False from
``step_complete`` once it is set, the builder stops, and the build raises KeyboardInterrupt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx

from dsa_export import interrupts
from dsa_export.errors import DSAUserError, require
from dsa_export.trt.profiles import DEFAULT_RANGE, ShapeRange, add_profiles, profile_ranges

RTX_MODULE = "tensorrt_rtx_bindings"
RTX_INSTALL = "pip install tensorrt-rtx-cu13-bindings tensorrt-rtx-cu13-libs"
DEFAULT_TARGETS = ("SM89",)


def rtx():
    """The TensorRT-RTX Python module, or a clear error naming the install command."""
    return require(RTX_MODULE, "Building with TensorRT-RTX", RTX_INSTALL)


def rtx_version() -> str | None:
    try:
        return rtx().__version__
    except DSAUserError:
        return None


@dataclass
class RtxBuildResult:
    """``profiles``: input shapes of the first optimization profile; ``all_profiles``: of each, in order."""

    engine: bytes
    version: str
    targets: tuple[str, ...]
    profiles: dict[str, tuple[list[int], ...]]
    layers: int
    warnings: list[str] = field(default_factory=list)
    all_profiles: list[dict[str, tuple[list[int], ...]]] = field(default_factory=list)


def _logger(trt, sink: list[str]):
    class _Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if severity <= trt.ILogger.Severity.WARNING:
                sink.append(f"{severity.name}: {msg}")

    return _Logger()


def _progress_monitor(trt):
    """Stops the build (``step_complete`` returns False) once an interrupt asked to."""

    class _Progress(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name, parent_phase, num_steps):
            pass

        def step_complete(self, phase_name, step):
            return not interrupts.cancelled()

        def phase_finish(self, phase_name):
            pass

    return _Progress()


@dataclass
class ParsedNetwork:
    """Keeps the logger alive as long as the builder and network that use it."""

    builder: object
    network: object
    parser: object
    logger: object
    messages: list[str]


def parse_onnx(path: str | Path) -> ParsedNetwork:
    """Parse ``path`` with TensorRT-RTX's ONNX parser; raises a user error on parse errors."""
    trt = rtx()
    messages: list[str] = []
    logger = _logger(trt, messages)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    # The FP8 experts body ONNX Runtime runs (one expert dequantized at a time) is not one
    # TensorRT(-RTX) can build, nor is the trimmed sparse-attention body that files of earlier
    # exports carry (files carry the static one now); give the parser the constructions it
    # builds, in memory (the external data is read from beside the file).
    from dsa_export.ops.moe_onnx import has_fp8_experts
    from dsa_export.ops.onnx_ops import use_tensorrt_bodies

    model = onnx.load(str(path), load_external_data=False)
    use_tensorrt_bodies(model)
    from dsa_export.quantize.dynamic import has_dynamic_qdq, inline_for_rtx

    if has_dynamic_qdq(model):
        # TensorRT-RTX 1.7 imports trt::TRT_DynamicQuantize natively but builds it only for blocks
        # of 16 ("Dynamic Quantization Op block_size 128 is not supported"); it gets the functions
        # with the e4m3 values held in float32 (the same numbers), inlined before the FP8 experts
        # bodies so that they are not inlined in their FP8 form.
        model = inline_for_rtx(model)
    if has_fp8_experts(model):
        # Inlined here: two FP8 experts nodes inlined by the parser give layers of the same name.
        from onnx.inliner import inline_local_functions

        model = inline_local_functions(model)
    with interrupts.native_call():
        parsed = parser.parse(model.SerializeToString(), str(path))
    if not parsed:
        errors = "; ".join(parser.get_error(i).desc() for i in range(parser.num_errors))
        raise DSAUserError(f"TensorRT-RTX could not parse '{path}': {errors}")
    return ParsedNetwork(builder, network, parser, logger, messages)


def check_targets(targets: tuple[str, ...]) -> tuple[str, ...]:
    """The targets upper-cased, or a usage error naming those TensorRT-RTX cannot build for."""
    trt = rtx()
    known = [c for c in trt.ComputeCapability.__members__ if c.startswith("SM")]
    wanted = tuple(t.upper() for t in targets)
    unknown = [t for t in wanted if t not in known]
    if unknown:
        from dsa_export.errors import DSAUsageError

        raise DSAUsageError(f"--rtx-target {', '.join(unknown)} is not a compute capability TensorRT-RTX "
                            f"{trt.__version__} builds for; choose from {', '.join(known)}.")
    return wanted


def build_engine(
    path: str | Path,
    ranges: ShapeRange = DEFAULT_RANGE,
    targets: tuple[str, ...] = DEFAULT_TARGETS,
    profiles: tuple[ShapeRange, ...] = (),
) -> RtxBuildResult:
    """AOT-build ``path`` for the given compute capabilities: one optimization profile of ``ranges``,
    or, when ``profiles`` is not empty, one per entry of it, in order."""
    trt = rtx()
    parsed = parse_onnx(path)
    builder, network, messages = parsed.builder, parsed.network, parsed.messages
    config = builder.create_builder_config()
    model = onnx.load(str(path), load_external_data=False)
    all_profiles = add_profiles(
        builder, config, model, profile_ranges(ranges, profiles), f"TensorRT-RTX {trt.__version__}", path
    )
    config.num_compute_capabilities = len(targets)
    for i, target in enumerate(targets):
        try:
            cc = getattr(trt.ComputeCapability, target)
        except AttributeError:
            known = [c for c in trt.ComputeCapability.__members__ if c.startswith("SM")]
            raise DSAUserError(f"TensorRT-RTX cannot target {target}; choose from {', '.join(known)}.") from None
        config.set_compute_capability(cc, i)
    monitor = _progress_monitor(trt)
    config.progress_monitor = monitor
    with interrupts.native_call():
        engine = builder.build_serialized_network(network, config)
    if engine is None:
        detail = "; ".join(m for m in messages if m.startswith("ERROR"))[:500]
        raise DSAUserError(f"TensorRT-RTX failed to build an engine from '{path}': {detail or 'see the log'}")
    return RtxBuildResult(
        engine=bytes(engine), version=trt.__version__, targets=tuple(targets), profiles=all_profiles[0],
        layers=network.num_layers, warnings=[m for m in messages if m.startswith("WARNING")], all_profiles=all_profiles,
    )
