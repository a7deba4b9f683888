"""A recording stand-in for the ``tensorrt`` module (test double), honest for the version it pretends to be.

Full TensorRT is not installable here, so :func:`fake_tensorrt` records what
:func:`dsa_export.trt.tensorrt.build_engine` and the runtime ask of the TensorRT Python API. Where
that API's answers differ by release, the double answers as that release does (checked against
the NVIDIA/TensorRT headers and python/src bindings of 10.0 to 11.1):

- ``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` is 1 on 10.x (0 is the deprecated EXPLICIT_BATCH)
  and 0 on 11.x, where it is deprecated and ignored;
- 11.x has no FP16/BF16/INT8/FP8 builder flags (networks are strongly typed);
- ``HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY`` exists from 10.9;
- ``IPluginRegistry.load_library`` returns None when any of the library's creators is already
  registered (NvInferRuntimeCommon.h), so a second load of the same library fails;
  ``get_creator(type, version, namespace)`` returns None for an unknown creator;
- ``IBuilderConfig.add_optimization_profile`` returns the new profile's index, -1 for an invalid one;
  ``set_timing_cache`` returns a bool; ``create_timing_cache`` returns None for bytes it cannot read;
- the ONNX parser builds a node's local function instead of a registered plugin before 10.7, the
  plugin from 10.7, and fails on a custom node that has neither;
- the engine inspector lists layer types only for engines built with ``ProfilingVerbosity.DETAILED``;
- ``IExecutionContext.set_tensor_address`` returns a bool;
- ``PreviewFeature.ALIASED_PLUGIN_IO_10_03`` (a plugin output aliased to an input) exists from 10.3;
  ``IBuilderConfig.set_preview_feature(feature, enable)`` turns one on.
It checks our calls, not TensorRT.
"""

from __future__ import annotations

import json
import types

import onnx

from dsa_export.ops.contract import DOMAIN, PLUGIN_NAMESPACE, PLUGIN_OPS, PLUGIN_VERSION

#: Timing cache bytes the double cannot read / that another GPU wrote.
UNREADABLE_CACHE = b"garbage"
OTHER_GPU_CACHE = b"other-gpu"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2])


def _enum(**members):
    return types.SimpleNamespace(**members)


def fake_tensorrt(version: str, plan: bytes | None = b"ftrt-fake-plan", plugin_ok: bool = True,
                  library_creators: tuple[str, ...] = tuple(PLUGIN_OPS), engine_plugin_layers: int | None = None,
                  profile_ok: bool = True):
    """A fake ``tensorrt`` of ``version``.

    ``plugin_ok=False``: the library cannot be loaded at all (built for another TensorRT).
    ``library_creators``: the creators a loaded library registers. ``engine_plugin_layers``: the
    number of plugin layers the engine inspector reports instead of those the parser made.
    ``profile_ok=False``: ``add_optimization_profile`` finds every profile invalid (-1).
    """
    major, minor = _version(version)
    calls: dict = {"flags": [], "profiles": [], "added_profiles": [], "plugins": [], "cache_in": None,
                   "cache_set": [], "deserialized": 0, "preview_features": []}
    trt = types.SimpleNamespace(__version__=version, __name__="tensorrt", calls=calls)

    class ILogger:
        Severity = _enum(INTERNAL_ERROR=0, ERROR=1, WARNING=2, INFO=3, VERBOSE=4)

        def __init__(self):
            pass

    trt.ILogger = ILogger
    trt.init_libnvinfer_plugins = lambda logger, namespace: calls.setdefault("init_plugins", namespace)

    registered: set[str] = set()

    class Registry:
        def load_library(self, path):
            calls["plugins"].append(path)
            if not plugin_ok or registered & set(library_creators):
                return None  # "fail and return nullptr if any of the plugins are already registered"
            registered.update(library_creators)
            return object()

        def get_creator(self, name, version, plugin_namespace=""):
            if name in registered and version == PLUGIN_VERSION and plugin_namespace == PLUGIN_NAMESPACE:
                return types.SimpleNamespace(name=name)
            return None

    registry = Registry()
    trt.get_plugin_registry = lambda: registry
    trt.registered = registered
    if major >= 11:
        trt.NetworkDefinitionCreationFlag = _enum(STRONGLY_TYPED=0, PREFER_JIT_PYTHON_PLUGINS=1,
                                                  PREFER_AOT_PYTHON_PLUGINS=2)
        trt.BuilderFlag = _enum(DEBUG="DEBUG", VERSION_COMPATIBLE="VERSION_COMPATIBLE")
    else:
        trt.NetworkDefinitionCreationFlag = _enum(EXPLICIT_BATCH=0, STRONGLY_TYPED=1)
        trt.BuilderFlag = _enum(FP16="FP16", INT8="INT8", BF16="BF16", FP8="FP8",
                                VERSION_COMPATIBLE="VERSION_COMPATIBLE")
    levels = {"NONE": "NONE", "AMPERE_PLUS": "AMPERE_PLUS"}
    if (major, minor) >= (10, 9):
        levels["SAME_COMPUTE_CAPABILITY"] = "SAME_COMPUTE_CAPABILITY"
    trt.HardwareCompatibilityLevel = _enum(**levels)
    previews = {"PROFILE_SHARING_0806": "PROFILE_SHARING_0806"} if major == 10 else {}
    if (major, minor) >= (10, 3):
        previews["ALIASED_PLUGIN_IO_10_03"] = "ALIASED_PLUGIN_IO_10_03"
    trt.PreviewFeature = _enum(**previews)
    trt.MemoryPoolType = _enum(WORKSPACE="WORKSPACE")
    trt.ProfilingVerbosity = _enum(LAYER_NAMES_ONLY="LAYER_NAMES_ONLY", NONE="NONE", DETAILED="DETAILED")
    trt.LayerInformationFormat = _enum(ONELINE="ONELINE", JSON="JSON")

    class Layer:
        def __init__(self, name, kind):
            self.name, self.type = name, kind

    class Network:
        def __init__(self):
            self.layers: list[Layer] = []

        @property
        def num_layers(self):
            return len(self.layers)

        def get_layer(self, i):
            return self.layers[i]

    class Error:
        def __init__(self, text):
            self.text = text

        def desc(self):
            return self.text

    class Parser:
        def __init__(self, network, logger):
            self.network, self.errors = network, []

        @property
        def num_errors(self):
            return len(self.errors)

        def get_error(self, i):
            return self.errors[i]

        def parse_from_file(self, path):
            calls["parsed"] = path
            return self._import(onnx.load(str(path), load_external_data=False))

        def parse(self, model, path=None):  # path: where the external data lies
            calls["parsed"] = path
            return self._import(onnx.load_from_string(bytes(model)))

        def _import(self, model):
            calls["parsed_model"] = model
            functions = {f.name: f for f in model.functions if f.domain == DOMAIN}
            if "DSASparseAttention" in functions:
                calls["static_attention"] = not any(n.op_type == "ReduceMax" and "used" in "".join(n.output)
                                                    for n in functions["DSASparseAttention"].node)
            for node in model.graph.node:
                if node.domain != DOMAIN:
                    self.network.layers.append(Layer(node.name, "LayerType.ELEMENTWISE"))
                    continue
                plugin_wins = node.op_type in registered and (
                    (major, minor) >= (10, 7) or node.op_type not in functions)
                if plugin_wins:
                    self.network.layers.append(Layer(node.name, "LayerType.PLUGIN_V3"))
                elif node.op_type in functions:
                    self.network.layers += [Layer(f"{node.name}/{n.op_type}", "LayerType.ELEMENTWISE")
                                            for n in functions[node.op_type].node]
                else:
                    self.errors.append(Error(f"No importer registered for op: {node.op_type}"))
                    return False
            return True

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, lo, opt, hi):
            calls["profiles"].append((name, list(lo), list(opt), list(hi)))
            self.shapes[name] = (list(lo), list(opt), list(hi))

    class Cache:
        def __init__(self, data):
            self.data = bytes(data)

        def serialize(self):
            return self.data + b"+tuned"

    class Config:
        builder_optimization_level = None
        hardware_compatibility_level = None
        plugins_to_serialize = None

        def __init__(self):
            self.profiling_verbosity = trt.ProfilingVerbosity.LAYER_NAMES_ONLY
            self.cache = None
            self.profiles = []

        def set_memory_pool_limit(self, pool, size):
            calls["workspace"] = size

        def set_flag(self, flag):
            calls["flags"].append(flag)

        def set_preview_feature(self, feature, enable):
            assert feature in vars(trt.PreviewFeature).values(), feature
            calls["preview_features"].append((feature, bool(enable)))

        def add_optimization_profile(self, profile):
            if not profile_ok:
                return -1
            self.profiles.append(profile)
            calls["added_profiles"].append(dict(profile.shapes))
            return len(self.profiles) - 1

        def create_timing_cache(self, data):
            calls["cache_in"] = bytes(data)
            return None if bytes(data).startswith(UNREADABLE_CACHE) else Cache(data)

        def set_timing_cache(self, cache, ignore_mismatch):
            calls["cache_set"].append(cache.data)
            if cache.data.startswith(OTHER_GPU_CACHE) and not ignore_mismatch:
                return False
            self.cache = cache
            return True

        def get_timing_cache(self):
            return self.cache

    built: dict[bytes, dict] = {}

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            calls["network_flags"] = flags
            return Network()

        def create_builder_config(self):
            calls["config"] = Config()
            return calls["config"]

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            if plan is not None:
                plugins = sum(1 for layer in network.layers if "PLUGIN" in layer.type)
                built[plan] = {"layers": network.layers, "verbosity": config.profiling_verbosity,
                               "plugin_layers": plugins if engine_plugin_layers is None else engine_plugin_layers,
                               "version_compatible": "VERSION_COMPATIBLE" in calls["flags"]}
            return plan

    class Inspector:
        def __init__(self, info):
            self.info = info

        def get_engine_information(self, fmt):
            assert fmt == trt.LayerInformationFormat.JSON
            info = self.info
            if info["verbosity"] != trt.ProfilingVerbosity.DETAILED:
                return json.dumps({"Layers": [layer.name for layer in info["layers"]], "Bindings": []})
            layers = [{"Name": f"plugin{i}", "LayerType": "PluginV3"} for i in range(info["plugin_layers"])]
            layers += [{"Name": layer.name, "LayerType": "ElementWise"} for layer in info["layers"]
                       if "PLUGIN" not in layer.type]
            return json.dumps({"Layers": layers, "Bindings": []})

    class Engine:
        def __init__(self, info):
            self.info = info

        def create_engine_inspector(self):
            return Inspector(self.info)

    class Runtime:
        def __init__(self, logger):
            self.engine_host_code_allowed = False

        def deserialize_cuda_engine(self, data):
            calls["deserialized"] += 1
            info = built.get(bytes(data))
            if info is None or (info["version_compatible"] and not self.engine_host_code_allowed):
                return None
            return Engine(info)

    trt.Builder, trt.OnnxParser, trt.Runtime = Builder, Parser, Runtime
    return trt


def tiny_dsa_model(path, nodes: int = 2, functions: bool = True, past: bool = False):
    """A small ONNX file with ``nodes`` dsa nodes (with an Identity local function body unless
    ``functions`` is False) between standard ops; input ``x`` ``[batch, sequence]``, and with
    ``past`` a second input ``past`` ``[batch, past_sequence]`` concatenated in front of it."""
    from onnx import TensorProto, helper

    graph_nodes = [helper.make_node("Relu", ["x"], ["h0"], name="relu")]
    for i in range(nodes):
        graph_nodes.append(helper.make_node("DSAIndexerTopK", [f"h{i}"], [f"h{i + 1}"], domain=DOMAIN, name=f"dsa{i}",
                                            plugin_namespace=PLUGIN_NAMESPACE, plugin_version=PLUGIN_VERSION))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence"])]
    if past:
        inputs.append(helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", "past_sequence"]))
        graph_nodes.append(helper.make_node("Concat", ["past", f"h{nodes}"], ["joined"], name="concat", axis=1))
        graph_nodes.append(helper.make_node("Relu", ["joined"], ["y"], name="out"))
        output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "total"])
    else:
        graph_nodes.append(helper.make_node("Relu", [f"h{nodes}"], ["y"], name="out"))
        output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence"])
    graph = helper.make_graph(graph_nodes, "tiny", inputs, [output])
    body = [helper.make_function(DOMAIN, "DSAIndexerTopK", ["q"], ["out"],
                                 [helper.make_node("Identity", ["q"], ["out"])],
                                 [helper.make_opsetid("", 18)])] if functions else []
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)],
                              functions=body)
    onnx.save(model, str(path))
    return path


def tiny_paged_model(path, fp8_pool: bool = False, extra_reader: bool = False):
    """A paged graph's cache writes alone: ``present_latent_pool_0 = ScatterND(past_latent_pool_0,
    indices, new)`` of a float32 pool ``[pages, 4, 8]``, a Shape read of the pool, and with ``fp8_pool``
    a second, uint8 pool written the same way (an FP8 cache's codes); with ``extra_reader`` a
    ReduceSum reads the float pool too. Output ``y`` is the written pool's row sums."""
    from onnx import TensorProto, helper

    def value(name, elem, dims):
        return helper.make_tensor_value_info(name, elem, dims)

    pool = ["pages", 4, 8]
    inputs = [value("past_latent_pool_0", TensorProto.FLOAT, pool),
              value("indices", TensorProto.INT64, ["batch", "sequence", 2]),
              value("new", TensorProto.FLOAT, ["batch", "sequence", 8])]
    outputs = [value("y", TensorProto.FLOAT, ["pages", 4]), value("present_latent_pool_0", TensorProto.FLOAT, pool)]
    nodes = [helper.make_node("ScatterND", ["past_latent_pool_0", "indices", "new"], ["present_latent_pool_0"],
                              name="write0"),
             helper.make_node("Shape", ["past_latent_pool_0"], ["pool_shape"], name="shape"),
             helper.make_node("ReduceSum", ["present_latent_pool_0", "axes"], ["y"], name="sum", keepdims=0)]
    initializers = [helper.make_tensor("axes", TensorProto.INT64, [1], [2])]
    if extra_reader:
        nodes.append(helper.make_node("ReduceSum", ["past_latent_pool_0", "axes"], ["z"], name="old", keepdims=0))
        outputs.append(value("z", TensorProto.FLOAT, ["pages", 4]))
    if fp8_pool:
        inputs += [value("past_index_key_pool_0", TensorProto.UINT8, pool),
                   value("codes", TensorProto.UINT8, ["batch", "sequence", 8])]
        outputs.append(value("present_index_key_pool_0", TensorProto.UINT8, pool))
        nodes.append(helper.make_node("ScatterND", ["past_index_key_pool_0", "indices", "codes"],
                                      ["present_index_key_pool_0"], name="write1"))
    graph = helper.make_graph(nodes, "paged", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(path))
    return path
