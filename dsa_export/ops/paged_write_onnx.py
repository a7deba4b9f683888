"""The paged graph's cache write as a ``dsa`` node, for a full TensorRT build with the plugin library.

The paged graph (:mod:`dsa_export.hf.model`, ``PagedStep.write``) writes each call's new tokens into
its cache pools with ONNX ScatterND: ``present_X_pool_i = ScatterND(past_X_pool_i, indices, new)``.
ONNX Runtime writes that in place when the caller binds one buffer to both names (IO binding).
TensorRT's parser maps ScatterND to a scatter layer that does not alias its input, so every call
copies every pool into a second buffer.

:func:`use_paged_cache_write` replaces each such ScatterND, in memory, by a ``DSAPagedCacheWrite``
node (:data:`dsa_export.ops.contract.PAGED_CACHE_WRITE`) whose local function body is that same
ScatterND (:func:`paged_cache_write_function`): ONNX Runtime runs the rewritten graph with the same
bits, and TensorRT builds the plugin of ``plugins/dsaPagedCacheWritePlugin``, whose output aliases
its pool input (``getAliasedInput(0) == 0``, honoured with ``PreviewFeature.ALIASED_PLUGIN_IO_10_03``,
which :mod:`dsa_export.trt.tensorrt` enables when the graph has such a node).

A ScatterND is rewritten only when all of these hold, and is left as it is otherwise:

* its data input is a graph input ``past_<name>`` with ``<name>`` containing ``pool``, and its output
  is the graph output ``present_<name>``: the pair a runtime binds to one buffer;
* the pool is float32, float16 or bfloat16 and 3-D, the indices int64 ``[B,S,2]`` and the updates 3-D
  (an FP8 cache's uint8 code pools stay ScatterND: TensorRT takes uint8 only into a Cast);
* its ``reduction`` is ``none``;
* no other node reads the past pool's values (a ``Shape`` or ``Size`` may read its shape): once the
  two names share a buffer, the past pool's content is the written one.

TensorRT-RTX has no plugins: only the full-TensorRT build uses this pass.
"""

from __future__ import annotations

import onnx
from onnx import FunctionProto, TensorProto, helper

from dsa_export.ops.contract import DOMAIN, DOMAIN_VERSION, PAGED_CACHE_WRITE, PLUGIN_ATTRIBUTES

#: The graph inputs and outputs of the paged graph's pools (dsa_export.hf.model.PAST / PRESENT).
PAST, PRESENT = "past_", "present_"
#: Pool dtypes the plugin writes in place.
FLOAT_POOLS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
#: Ops that read only a tensor's shape: they may still read the past pool.
SHAPE_READERS = ("Shape", "Size")


def paged_cache_write_function(opset: int) -> FunctionProto:
    """DSAPagedCacheWrite's local function: ``present = ScatterND(pool, indices, updates)``."""
    spec = PAGED_CACHE_WRITE
    names = [t.name for t in spec.inputs]
    node = helper.make_node("ScatterND", names, [spec.outputs[0].name], name=f"{spec.name}/ScatterND")
    return helper.make_function(DOMAIN, spec.name, inputs=names, outputs=[spec.outputs[0].name], nodes=[node],
                                opset_imports=[helper.make_opsetid("", opset)], attributes=[], doc_string=spec.doc)


def _tensor_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto.Tensor]:
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    return {v.name: v.type.tensor_type for v in values if v.type.HasField("tensor_type")}


def _dims(t: onnx.TypeProto.Tensor | None) -> list[int | str] | None:
    if t is None or not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]


def _readers(nodes) -> dict[str, list[onnx.NodeProto]]:
    """Which nodes read each value, subgraphs of control-flow nodes included (as their node)."""
    readers: dict[str, list[onnx.NodeProto]] = {}

    def names(node):
        yield from node.input
        for attr in node.attribute:
            for graph in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                for inner in graph.node:
                    yield from names(inner)

    for node in nodes:
        for name in set(names(node)):
            readers.setdefault(name, []).append(node)
    return readers


def rewritable(model: onnx.ModelProto, node: onnx.NodeProto, types=None, readers=None) -> str:
    """Why ``node`` cannot become a DSAPagedCacheWrite, or "" when it can (the rules in the module doc)."""
    if node.op_type != "ScatterND" or node.domain not in ("", "ai.onnx") or len(node.input) != 3:
        return "not a ScatterND"
    reduction = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "reduction"), b"none")
    if reduction not in (b"none", "none"):
        return f"reduction {reduction!r}"
    past, indices, updates = node.input
    present = node.output[0]
    if not past.startswith(PAST) or "pool" not in past or present != PRESENT + past[len(PAST):]:
        return f"writes {past} into {present}, not past_*pool* into its present_*pool*"
    if past not in {i.name for i in model.graph.input} or present not in {o.name for o in model.graph.output}:
        return f"{past} / {present} are not a graph input and a graph output"
    types = _tensor_types(model) if types is None else types
    pool, idx, upd = types.get(past), types.get(indices), types.get(updates)
    if pool is None or pool.elem_type not in FLOAT_POOLS:
        return f"{past} is not a float32/float16/bfloat16 pool"
    pool_dims, idx_dims, upd_dims = _dims(pool), _dims(idx), _dims(upd)
    if (pool_dims is None or len(pool_dims) != 3 or idx is None or idx.elem_type != TensorProto.INT64
            or idx_dims is None or len(idx_dims) != 3 or idx_dims[2] != 2 or upd_dims is None or len(upd_dims) != 3):
        return (f"needs a pool [P,page,W], int64 indices [B,S,2] and updates [B,S,W] "
                f"(got {pool_dims}, {idx_dims}, {upd_dims})")
    readers = _readers(model.graph.node) if readers is None else readers
    others = [n.op_type for n in readers.get(past, []) if n is not node and n.op_type not in SHAPE_READERS]
    if others:
        return f"{past} is also read by {', '.join(others)}"
    return ""


def _writes(model: onnx.ModelProto) -> list[int]:
    types, readers = _tensor_types(model), _readers(model.graph.node)
    return [i for i, node in enumerate(model.graph.node)
            if node.op_type == "ScatterND" and not rewritable(model, node, types, readers)]


def paged_cache_writes(model: onnx.ModelProto) -> list[str]:
    """The present pools :func:`use_paged_cache_write` would write in place, in graph order."""
    return [model.graph.node[i].output[0] for i in _writes(model)]


def use_paged_cache_write(model: onnx.ModelProto) -> list[str]:
    """Replace, in place, every ScatterND that writes a float ``past_*pool*`` graph input into its
    ``present_*pool*`` graph output by a DSAPagedCacheWrite node (same inputs and output, its
    function added when the model lacks it); returns the present pools so written, in graph order."""
    written: list[str] = []
    for i in _writes(model):
        node = model.graph.node[i]
        new = helper.make_node(PAGED_CACHE_WRITE.name, list(node.input), list(node.output),
                               name=f"{node.name or node.output[0]}/{PAGED_CACHE_WRITE.name}", domain=DOMAIN,
                               **PLUGIN_ATTRIBUTES)
        model.graph.node[i].CopyFrom(new)
        written.append(node.output[0])
    if written:
        if not any(o.domain == DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
        if not any(f.domain == DOMAIN and f.name == PAGED_CACHE_WRITE.name for f in model.functions):
            opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
            model.functions.append(paged_cache_write_function(opset))
    return written
