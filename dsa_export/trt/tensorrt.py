"""TensorRT 10.x / 11.x: build an engine from our ONNX with the DSA plugin library loaded.

TensorRT 11 networks are always strongly typed (the creation flag is deprecated and ignored, and
the precision builder flags are gone): precision comes from the ONNX file's types and its explicit
Q/DQ nodes. On TensorRT 10 we ask for a strongly typed network too, unless the file is fp32 and a
lower precision was asked, in which case the FP16/BF16 builder flags do it (weak typing).

The DSA nodes carry ``plugin_namespace="dsa"``; from TensorRT 10.7 the parser turns them into plugin
layers when our library's creators are registered, and otherwise inlines their ONNX function bodies.
Before 10.7 (9.0 to 10.6) the parser prefers a node's local function to a registered plugin, so
the bodies are built even with the library loaded (`check --for-build` warns about it).
Nothing here imports TensorRT until a function is called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx

from dsa_export.errors import DSAUserError, require
from dsa_export.trt.profiles import DEFAULT_RANGE, ShapeRange, input_profiles

TRT_MODULE = "tensorrt"
TRT_INSTALL = "pip install tensorrt --extra-index-url https://pypi.nvidia.com"
DEFAULT_OPTIMIZATION_LEVEL = 3
HARDWARE_LEVELS = {"none": None, "ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}
WEAK_TYPING_FLAGS = {"fp16": "FP16", "bf16": "BF16"}
ONNX_FLOAT_NAMES = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}


def tensorrt():
    """The TensorRT Python module, or a clear error naming the install command."""
    return require(TRT_MODULE, "Building with TensorRT", TRT_INSTALL)


def major_version(trt) -> int:
    return int(str(trt.__version__).split(".")[0])


@dataclass
class TensorRTBuildSettings:
    """How one TensorRT engine is built. Defaults here; ``BuildSettings`` maps the CLI onto it.

    Attributes:
        ranges: min/opt/max of each named dynamic dim (one optimization profile).
        precision: fp32, fp16, bf16, int8 or fp8; int8/fp8 need a file with explicit Q/DQ.
        plugin_library: our ``libdsa_plugins.so``; None builds without plugins (function bodies).
        timing_cache: read before the build when it exists, written back after it.
        version_compatible: BuilderFlag.VERSION_COMPATIBLE (newer runtimes may load the engine).
        hardware_compatibility: none, ampere_plus or same_compute_capability.
        optimization_level: builder optimization level (0-5; TensorRT's default is 3).
        workspace_bytes: workspace memory pool limit; None leaves TensorRT's default.
    """

    ranges: ShapeRange = DEFAULT_RANGE
    precision: str = "fp16"
    plugin_library: Path | None = None
    timing_cache: Path | None = None
    version_compatible: bool = False
    hardware_compatibility: str = "none"
    optimization_level: int = DEFAULT_OPTIMIZATION_LEVEL
    workspace_bytes: int | None = None


@dataclass
class TensorRTBuildResult:
    engine: bytes
    version: str
    strongly_typed: bool
    profiles: dict[str, tuple[list[int], ...]]
    layers: int
    plugin_layers: int
    timing_cache: bytes | None
    builder_flags: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class _CapturingLogger:
    """Build the logger class lazily (it subclasses trt.ILogger)."""

    @staticmethod
    def make(trt, sink: list[str]):
        class Logger(trt.ILogger):
            def __init__(self):
                trt.ILogger.__init__(self)

            def log(self, severity, msg):
                if severity <= trt.ILogger.Severity.WARNING:
                    sink.append(f"{getattr(severity, 'name', severity)}: {msg}")

        return Logger()


def file_precision(model: onnx.ModelProto) -> str:
    """fp32/fp16/bf16: the float type of the file's first float graph input or output."""
    for value in [*model.graph.input, *model.graph.output]:
        name = ONNX_FLOAT_NAMES.get(value.type.tensor_type.elem_type)
        if name:
            return name
    for init in model.graph.initializer:
        name = ONNX_FLOAT_NAMES.get(init.data_type)
        if name:
            return name
    return "fp32"


def has_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def build_engine(path: str | Path, settings: TensorRTBuildSettings, trt_module=None) -> TensorRTBuildResult:
    """Parse ``path``, configure the builder from ``settings`` and return the serialized engine."""
    trt = trt_module if trt_module is not None else tensorrt()
    major = major_version(trt)
    if major < 10:
        raise DSAUserError(f"TensorRT {trt.__version__} is too old; dsa-export builds with TensorRT 10 or 11.")
    model = onnx.load(str(path), load_external_data=False)
    typed = file_precision(model)
    precision = settings.precision
    if precision in ("int8", "fp8") and not has_qdq(model):
        raise DSAUserError(
            f"--precision {precision} needs a file with explicit Q/DQ nodes and '{path}' has none; "
            "let `dsa-export build` calibrate it (give MODEL, not an .onnx) or pass a calibrated model."
        )
    weak_flag = None
    if precision in WEAK_TYPING_FLAGS and typed != precision:
        if major >= 11:
            raise DSAUserError(
                f"TensorRT {trt.__version__} builds strongly typed networks only and '{path}' is {typed}; "
                f"export it at {precision} (give MODEL to `dsa-export build --precision {precision}`)."
            )
        weak_flag = WEAK_TYPING_FLAGS[precision]
    strongly_typed = weak_flag is None

    messages: list[str] = []
    logger = _CapturingLogger.make(trt, messages)
    trt.init_libnvinfer_plugins(logger, "")
    if settings.plugin_library is not None:
        registry = trt.get_plugin_registry()
        if registry.load_library(str(settings.plugin_library)) is None:
            raise DSAUserError(
                f"TensorRT could not load the plugin library {settings.plugin_library}; check that it was built "
                "against this TensorRT version (`dsa-export plugins path --json` shows the headers it used)."
            )
    builder = trt.Builder(logger)
    flags = 0
    if strongly_typed and major == 10:  # on 11 the flag is deprecated and every network is strongly typed
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    # Where no plugin takes a node, the parser builds its function body: give it the constructions
    # TensorRT builds (static sparse-attention chunks, the stacked FP8 experts), in memory.
    import onnx as onnx_lib

    from dsa_export.ops.onnx_ops import use_tensorrt_bodies

    model = onnx_lib.load(str(path), load_external_data=False)
    swapped = use_tensorrt_bodies(model)
    parsed = parser.parse(model.SerializeToString(), str(path)) if swapped else parser.parse_from_file(str(path))
    if not parsed:
        errors = "; ".join(str(parser.get_error(i).desc()) for i in range(parser.num_errors))
        raise DSAUserError(f"TensorRT could not parse '{path}': {errors}")

    config = builder.create_builder_config()
    config.builder_optimization_level = int(settings.optimization_level)
    if settings.workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(settings.workspace_bytes))
    builder_flags: list[str] = []
    if weak_flag is not None:
        config.set_flag(getattr(trt.BuilderFlag, weak_flag))
        builder_flags.append(weak_flag)
    if settings.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
        builder_flags.append("VERSION_COMPATIBLE")
        if settings.plugin_library is not None:
            # A version-compatible engine runs in the lean runtime, which loads serialized plugin
            # libraries only (and the loading runtime must allow engine host code).
            config.plugins_to_serialize = [str(settings.plugin_library)]
    level = HARDWARE_LEVELS.get(settings.hardware_compatibility, "?")
    if level == "?":
        raise DSAUserError(
            f"hardware compatibility {settings.hardware_compatibility!r} is not one of {', '.join(HARDWARE_LEVELS)}."
        )
    if level is not None:
        if not hasattr(trt.HardwareCompatibilityLevel, level):
            raise DSAUserError(f"TensorRT {trt.__version__} has no hardware compatibility level {level}; upgrade TensorRT.")
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, level)

    profiles = input_profiles(model, settings.ranges)
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in profiles.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)

    cache_bytes = b""
    if settings.timing_cache is not None and Path(settings.timing_cache).is_file():
        cache_bytes = Path(settings.timing_cache).read_bytes()
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)

    plugin_layers = sum(
        1 for i in range(network.num_layers) if "PLUGIN" in str(getattr(network.get_layer(i), "type", ""))
    )
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        detail = "; ".join(m for m in messages if m.startswith(("ERROR", "INTERNAL_ERROR")))[:500]
        raise DSAUserError(f"TensorRT failed to build an engine from '{path}': {detail or 'see the log with -v'}")
    new_cache = config.get_timing_cache()
    return TensorRTBuildResult(
        engine=bytes(engine),
        version=str(trt.__version__),
        strongly_typed=strongly_typed,
        profiles=profiles,
        layers=int(network.num_layers),
        plugin_layers=plugin_layers,
        timing_cache=bytes(new_cache.serialize()) if new_cache is not None else None,
        builder_flags=builder_flags,
        warnings=[m for m in messages if m.startswith("WARNING")],
    )


__all__ = ["TensorRTBuildResult", "TensorRTBuildSettings", "build_engine", "file_precision", "tensorrt"]
