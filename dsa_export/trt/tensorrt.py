"""TensorRT 10.x / 11.x: build an engine from our ONNX with the DSA plugin library loaded.

TensorRT 11 networks are always strongly typed (the creation flag is deprecated and ignored, and
the precision builder flags are gone): precision comes from the ONNX file's types and its explicit
Q/DQ nodes. On TensorRT 10 we ask for a strongly typed network too, unless the file is fp32 and a
lower precision was asked, in which case the FP16/BF16 builder flags do it (weak typing).

The DSA nodes carry ``plugin_namespace="dsa"``. Whether the parser builds a registered plugin or
the node's local function has changed across releases (the function body wins from 9.0 to 10.6,
the plugin from 10.7), so with the plugin library loaded the parser gets the file without the
``dsa`` function bodies: it builds the plugin or fails. The engine inspector's layer list then
has to show one plugin layer per ``dsa`` node; a silent fallback to the O(S*T) bodies cannot pass.
Without a plugin library the bodies are built. With it, the paged graph's float cache pools are
written in place: each ScatterND that writes a ``past_*pool*`` input into its ``present_*pool*``
output becomes a DSAPagedCacheWrite plugin layer whose output aliases the pool
(:func:`use_in_place_pools`, ``PreviewFeature.ALIASED_PLUGIN_IO_10_03``, TensorRT 10.3+; older
ones keep the ScatterND, with a warning). Nothing here imports TensorRT until a function is
called, and a plugin library is loaded once per process (:func:`load_plugin_library`), so several
stages can be built in one process.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from dsa_export.errors import DSAUserError, require
from dsa_export.trt.profiles import DEFAULT_RANGE, ShapeRange, add_profiles, profile_ranges

log = logging.getLogger(__name__)

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
        profiles: when not empty, replaces ``ranges``: one optimization profile per entry, in order
            (a prefill profile and a decode profile, say).
        precision: fp32, fp16, bf16, int8 or fp8; int8/fp8 need a file with explicit Q/DQ.
        plugin_library: our ``libdsa_plugins.so``; None builds without plugins (function bodies).
        timing_cache: read before the build when it exists, written back after it; one TensorRT
            rejects (another GPU or version) is replaced by a fresh one, with a warning.
        version_compatible: BuilderFlag.VERSION_COMPATIBLE (newer runtimes may load the engine);
            the plugin library is then serialized into the plan.
        hardware_compatibility: none, ampere_plus or same_compute_capability.
        optimization_level: builder optimization level (0-5; TensorRT's default is 3).
        workspace_bytes: workspace memory pool limit; None leaves TensorRT's default.
    """

    ranges: ShapeRange = DEFAULT_RANGE
    profiles: tuple[ShapeRange, ...] = ()
    precision: str = "fp16"
    plugin_library: Path | None = None
    timing_cache: Path | None = None
    version_compatible: bool = False
    hardware_compatibility: str = "none"
    optimization_level: int = DEFAULT_OPTIMIZATION_LEVEL
    workspace_bytes: int | None = None


@dataclass
class TensorRTBuildResult:
    """What was built. ``profiles`` holds the input shapes of the first optimization profile,
    ``all_profiles`` those of every profile, in order."""

    engine: bytes
    version: str
    strongly_typed: bool
    profiles: dict[str, tuple[list[int], ...]]
    layers: int
    plugin_layers: int
    timing_cache: bytes | None
    all_profiles: list[dict[str, tuple[list[int], ...]]] = field(default_factory=list)
    dsa_nodes: int = 0  # dsa-domain nodes of the graph (each one plugin layer when the library is loaded)
    timing_cache_reused: bool = False  # the timing cache read was accepted by TensorRT
    plugins_serialized: bool = False  # the plugin library is serialized into the plan (version compatible)
    builder_flags: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: The paged graph's present pools the engine writes in place (DSAPagedCacheWrite plugin layers,
    #: each output aliased to its past pool, PreviewFeature.ALIASED_PLUGIN_IO_10_03 enabled).
    in_place_pools: list[str] = field(default_factory=list)


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


#: Quantize ops of the graph: ONNX's, and TensorRT's dynamic one (``trt::TRT_DynamicQuantize``,
#: FP8 activations scaled per token at run time; dsa_export/quantize/dynamic.py).
_QUANTIZE_OPS = ("QuantizeLinear", "TRT_DynamicQuantize")
_QDQ_OPS = (*_QUANTIZE_OPS, "DequantizeLinear", "TRT_BlockDequantize")


def has_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type in _QDQ_OPS for n in model.graph.node)


def is_calibrated(model: onnx.ModelProto) -> bool:
    """Whether the graph quantizes activations (a ``QuantizeLinear`` or a dynamic quantize: what
    calibration inserts). A checkpoint's FP8 weights alone (``DequantizeLinear`` of initializers)
    are not a calibration."""
    return any(n.op_type in _QUANTIZE_OPS for n in model.graph.node)


def dsa_nodes(model: onnx.ModelProto) -> int:
    """Number of ``dsa``-domain nodes with a plugin the graph runs, counting those inside the other
    local functions it calls (ops without a plugin, such as the paged ones, always build their
    function bodies and so become no plugin layer)."""
    from dsa_export.ops.contract import DOMAIN, PLUGIN_OPS

    functions = {(f.domain, f.name): f for f in model.functions if f.domain != DOMAIN}

    def count(nodes, seen: tuple) -> int:
        total = 0
        for node in nodes:
            if node.domain == DOMAIN:
                total += node.op_type in PLUGIN_OPS
            elif (node.domain, node.op_type) in functions and (node.domain, node.op_type) not in seen:
                key = (node.domain, node.op_type)
                total += count(functions[key].node, (*seen, key))
        return total

    return count(model.graph.node, ())


def strip_dsa_functions(model: onnx.ModelProto) -> int:
    """Remove, in place, the local functions of the ``dsa`` ops that have a plugin; returns how many.

    With them gone such a node can only become a plugin layer: a parser that does not find the
    registered plugin fails instead of building the body. Ops without a plugin keep their bodies.
    """
    from dsa_export.ops.contract import DOMAIN, PLUGIN_OPS

    keep = [f for f in model.functions if f.domain != DOMAIN or f.name not in PLUGIN_OPS]
    removed = len(model.functions) - len(keep)
    if removed:
        del model.functions[:]
        model.functions.extend(keep)
    return removed


#: The preview feature that lets a plugin's output alias an input (TensorRT 10.3+).
ALIASED_PLUGIN_IO = "ALIASED_PLUGIN_IO_10_03"


def use_in_place_pools(trt, model: onnx.ModelProto, warnings: list[str]) -> list[str]:
    """With the plugin library loaded: replace, in place, the paged graph's float pool writes
    (ScatterND of a past_*pool* graph input into its present_*pool* output) by DSAPagedCacheWrite
    nodes, whose plugin writes the pool in its own buffer (:mod:`dsa_export.ops.paged_write_onnx`);
    returns the present pools so written. A TensorRT without ``PreviewFeature.ALIASED_PLUGIN_IO_10_03``
    (before 10.3) cannot alias a plugin's output: the graph then keeps its ScatterND (each call copies
    the pools, as before) and a warning says so. FP8 caches' uint8 code pools always keep ScatterND."""
    from dsa_export.ops.paged_write_onnx import paged_cache_writes, use_paged_cache_write

    if hasattr(getattr(trt, "PreviewFeature", None), ALIASED_PLUGIN_IO):
        return use_paged_cache_write(model)
    writes = paged_cache_writes(model)
    if writes:
        warnings.append(f"TensorRT {trt.__version__} has no PreviewFeature.{ALIASED_PLUGIN_IO} (it came in 10.3): "
                        f"the {len(writes)} cache pool(s) stay written by ScatterND, which copies each pool on every "
                        "call; TensorRT 10.3 or later writes them in place.")
    return []


def plugin_layers(trt, plan: bytes, logger, version_compatible: bool) -> int:
    """Plugin layers of the built engine, from the engine inspector's layer list.

    Needs the engine built with ``ProfilingVerbosity.DETAILED``: with less the JSON lists layer
    names only. TensorRT names the types ``PluginV2``/``PluginV3``.
    """
    runtime = trt.Runtime(logger)
    if version_compatible:
        runtime.engine_host_code_allowed = True  # the lean runtime embedded in the plan
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise DSAUserError("TensorRT built an engine it cannot deserialize to inspect its layers; see the log with -v.")
    inspector = engine.create_engine_inspector()
    text = inspector.get_engine_information(trt.LayerInformationFormat.JSON) if inspector is not None else None
    try:
        layers = json.loads(text)["Layers"] if text else None
    except (ValueError, KeyError, TypeError):
        layers = None
    if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
        raise DSAUserError(
            f"TensorRT {trt.__version__}'s engine inspector gave no layer types, so the plugin layers cannot be "
            "counted; this is a bug in dsa-export (the build asks for detailed profiling verbosity), please report it."
        )
    return sum(1 for layer in layers if str(layer.get("LayerType", "")).startswith("Plugin"))


def use_timing_cache(config, data: bytes, source: Path | None, warnings: list[str]) -> bool:
    """Give ``config`` the timing cache ``data`` (b"": a fresh one); returns whether ``data`` was reused.

    ``create_timing_cache`` returns None (or raises) for bytes it cannot read, and
    ``set_timing_cache(ignore_mismatch=False)`` returns False for a cache of another GPU or
    TensorRT version: the build then goes on with a fresh cache, with a warning.
    """
    if data:
        reason = None
        try:
            cache = config.create_timing_cache(data)
        except Exception as exc:
            cache, reason = None, f"TensorRT could not read it: {exc}"
        if cache is None:
            reason = reason or "TensorRT could not read it"
        else:
            try:
                if config.set_timing_cache(cache, ignore_mismatch=False):
                    return True
                reason = "it was made by another GPU or TensorRT version"
            except Exception as exc:
                reason = f"TensorRT refused it: {exc}"
        message = f"the timing cache {source} was not reused ({reason}); building with a fresh one, which replaces it."
        log.warning(message)
        warnings.append(f"WARNING: {message}")
    cache = config.create_timing_cache(b"")
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        raise DSAUserError("TensorRT could not create an empty timing cache; see the log with -v.")
    return False


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
    library = None
    if settings.plugin_library is not None:
        from dsa_export.plugins.library import load_plugin_library

        library = load_plugin_library(trt, settings.plugin_library)
    builder = trt.Builder(logger)
    flags = 0
    if strongly_typed and major == 10:  # on 11 the flag is deprecated and every network is strongly typed
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    # Where no plugin takes a node, the parser builds its function body: give it the constructions
    # TensorRT builds (static sparse-attention chunks, which files of earlier exports lack, and the
    # stacked FP8 experts), in memory. With
    # the plugin library loaded there are no dsa bodies to fall back to. The original path tells
    # the parser where the external data lies.
    from dsa_export.ops.onnx_ops import use_tensorrt_bodies
    from dsa_export.ops.paged_onnx import use_fp8_cache_bodies

    warnings: list[str] = []
    # With the plugin library, the paged graph's float pools are written in place by the plugin
    # (its output aliased to the pool input): counted as dsa nodes below, their bodies stripped.
    in_place = use_in_place_pools(trt, model, warnings) if library is not None else []
    nodes = dsa_nodes(model)
    check_plugins = library is not None and nodes > 0
    # Plugin-less ops keep their bodies; the FP8-cache ones in the form TensorRT takes (uint8 into a Cast only).
    changed = ((bool(strip_dsa_functions(model)) | use_fp8_cache_bodies(model, "cast") | bool(in_place))
               if check_plugins else use_tensorrt_bodies(model))
    parsed = parser.parse(model.SerializeToString(), str(path)) if changed else parser.parse_from_file(str(path))
    if not parsed:
        errors = "; ".join(str(parser.get_error(i).desc()) for i in range(parser.num_errors))
        hint = (" (the dsa function bodies were removed so that only the plugins can build these nodes: check that "
                f"{library} registers them)") if check_plugins else ""
        raise DSAUserError(f"TensorRT could not parse '{path}': {errors}{hint}")

    config = builder.create_builder_config()
    config.builder_optimization_level = int(settings.optimization_level)
    if check_plugins:
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # layer types for the inspector
    if settings.workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(settings.workspace_bytes))
    if in_place:
        # Lets TensorRT honour the plugin's getAliasedInput (it is never asked otherwise).
        config.set_preview_feature(getattr(trt.PreviewFeature, ALIASED_PLUGIN_IO), True)
    builder_flags: list[str] = []
    if weak_flag is not None:
        config.set_flag(getattr(trt.BuilderFlag, weak_flag))
        builder_flags.append(weak_flag)
    plugins_serialized = False
    if settings.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
        builder_flags.append("VERSION_COMPATIBLE")
        if check_plugins:
            # A version-compatible engine runs in the lean runtime, which loads serialized plugin
            # libraries only (and the loading runtime must allow engine host code).
            config.plugins_to_serialize = [str(library)]
            plugins_serialized = True
    level = HARDWARE_LEVELS.get(settings.hardware_compatibility, "?")
    if level == "?":
        raise DSAUserError(
            f"hardware compatibility {settings.hardware_compatibility!r} is not one of {', '.join(HARDWARE_LEVELS)}."
        )
    if level is not None:
        if not hasattr(trt.HardwareCompatibilityLevel, level):
            raise DSAUserError(f"TensorRT {trt.__version__} has no hardware compatibility level {level}; upgrade TensorRT.")
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, level)

    all_profiles = add_profiles(builder, config, model, profile_ranges(settings.ranges, settings.profiles),
                                f"TensorRT {trt.__version__}", path)

    cache_bytes = b""
    if settings.timing_cache is not None and Path(settings.timing_cache).is_file():
        cache_bytes = Path(settings.timing_cache).read_bytes()
    cache_reused = use_timing_cache(config, cache_bytes, settings.timing_cache, warnings)

    engine = builder.build_serialized_network(network, config)
    if engine is None:
        detail = "; ".join(m for m in messages if m.startswith(("ERROR", "INTERNAL_ERROR")))[:500]
        raise DSAUserError(f"TensorRT failed to build an engine from '{path}': {detail or 'see the log with -v'}")
    plan = bytes(engine)
    layers_of_plugins = 0
    if check_plugins:
        layers_of_plugins = plugin_layers(trt, plan, logger, settings.version_compatible)
        if layers_of_plugins != nodes:
            raise DSAUserError(
                f"the TensorRT {trt.__version__} engine built from '{path}' has {layers_of_plugins} plugin "
                f"layer(s) for {nodes} dsa node(s), so some were not built by the plugins of {library}; rebuild the plugin library "
                "for this TensorRT version (`dsa-export plugins build`) and build again."
            )
    new_cache = config.get_timing_cache()
    return TensorRTBuildResult(
        engine=plan,
        version=str(trt.__version__),
        strongly_typed=strongly_typed,
        profiles=all_profiles[0],
        all_profiles=all_profiles,
        layers=int(network.num_layers),
        plugin_layers=layers_of_plugins,
        dsa_nodes=nodes,
        timing_cache=bytes(new_cache.serialize()) if new_cache is not None else None,
        timing_cache_reused=cache_reused,
        plugins_serialized=plugins_serialized,
        builder_flags=builder_flags,
        warnings=warnings + [m for m in messages if m.startswith("WARNING")],
        in_place_pools=in_place,
    )


__all__ = [
    "TensorRTBuildResult", "TensorRTBuildSettings", "build_engine", "dsa_nodes", "file_precision", "plugin_layers",
    "strip_dsa_functions", "tensorrt", "use_in_place_pools", "use_timing_cache",
]
