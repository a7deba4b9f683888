"""Where Q/DQ goes in a ``dsa`` graph, and the graph rewrite that puts it there.

Placement follows what TensorRT fuses into INT8/FP8 GEMMs: a QuantizeLinear/DequantizeLinear pair
on the activation input of each MatMul/Gemm (per-tensor, symmetric) and a DequantizeLinear of a
quantized weight initializer (per output channel, symmetric). Nothing else is quantized:

* the ``dsa`` custom nodes keep their high-precision inputs (their producers' Q/DQ sits outside
  them) unless the caller asks for Q/DQ on the indexer's q and k;
* softmax, the norms and every activation-by-activation MatMul (attention scores, softmax @ V,
  MLA's absorbed query projection) have no weight initializer and stay in high precision;
* the indexer's head-weight path (``weights_proj``, the MatMul feeding the ``w`` input of
  ``DSAIndexerTopK``) stays in high precision, as DeepSeek-V3.2 keeps it in FP32;
* an MoE router stays in high precision: its expert choice is as discrete as the indexer's. In
  plugin-mode files it is the first MatMul/Gemm upstream of a routed-experts node's ``topk_ids`` /
  ``topk_weights``; elsewhere (native files, transformers' own experts) a MatMul whose scores reach
  a standard TopK through elementwise, shape and masking ops;
* the routed experts (``dsa::DSAMoEExperts``) are quantized per expert by :mod:`.experts`; the
  shared experts are plain MatMuls and get the treatment above.
"""

from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dsa_export.ops.contract import DOMAIN, INDEXER_TOPK, INDEXER_TOPK_PAGED
from dsa_export.quantize.experts import (
    ExpertsTarget,
    MoEPlacement,
    expert_function_updates,
    find_experts,
    rewrite_experts,
)
from dsa_export.quantize.graph import (
    FLOAT_TYPES,
    node_name,
    numpy_float,
    opset_of,
    set_opset,
    upstream_matmuls,
    zero_point,
)
from dsa_export.quantize.precision import Precision

DEFAULT_OP_TYPES = ("MatMul", "Gemm")


@dataclass(frozen=True)
class QuantTarget:
    """One MatMul/Gemm whose activation and weight inputs get Q/DQ."""

    index: int
    node: str
    op_type: str
    activation: str
    weight: str
    weight_axis: int  # output-channel axis of the weight initializer


@dataclass
class IndexerInputs:
    node: str
    q: str
    k: str
    w: str


@dataclass
class Placement:
    """The quantization plan of one graph; ``skipped`` says why each candidate was left alone."""

    targets: list[QuantTarget] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    indexers: list[IndexerInputs] = field(default_factory=list)
    #: routed-experts nodes whose stacks get quantized, and every MoE layer's routing
    moe: MoEPlacement = field(default_factory=MoEPlacement)

    @property
    def experts(self) -> list[ExpertsTarget]:
        return self.moe.targets

    @property
    def activations(self) -> list[str]:
        return sorted({t.activation for t in self.targets})

    @property
    def indexer_activations(self) -> list[str]:
        return sorted({name for ix in self.indexers for name in (ix.q, ix.k)})


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every named value (inferred where the file does not say)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # custom domains without schemas: keep what the file records
        inferred = model
    graph = inferred.graph
    types = {i.name: i.data_type for i in graph.initializer}
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type.elem_type
    return types


#: Ops a router's scores pass through between its MatMul and the TopK that picks experts.
#: ``Where`` is transformers' group masking (``masked_fill``) in front of the expert TopK.
_ROUTER_PATH_OPS = {"Sigmoid", "Softmax", "Add", "Mul", "Div", "Cast", "Reshape", "View", "Squeeze", "Unsqueeze",
                    "Transpose", "ReduceSum", "Sub", "Flatten", "Where", "Expand"}


def _feeds_topk(graph: onnx.GraphProto, output: str, depth: int = 6) -> bool:
    """Whether ``output`` reaches a standard TopK within ``depth`` elementwise/shape ops: an MoE
    router, whose expert choice is as load-bearing as the indexer's (kept in high precision)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for value in node.input:
            consumers.setdefault(value, []).append(node)
    frontier = [output]
    for _ in range(depth):
        nxt = []
        for value in frontier:
            for node in consumers.get(value, []):
                if node.domain in ("", "ai.onnx") and node.op_type == "TopK":
                    return True
                if node.domain in ("", "ai.onnx") and node.op_type in _ROUTER_PATH_OPS:
                    nxt.extend(node.output)
        frontier = nxt
    return False


def plan(
    model: onnx.ModelProto,
    op_types: tuple[str, ...] = DEFAULT_OP_TYPES,
    exclude: tuple[str, ...] = (),
    keep_indexer_projections: bool = False,
    quantize_experts: bool = True,
) -> Placement:
    """Decide which MatMul/Gemm nodes get Q/DQ. ``exclude`` holds fnmatch patterns matched
    against node names, their output names and their weight names; ``keep_indexer_projections``
    also keeps the indexer's q/k projections (``wq_b``, ``wk``) in high precision;
    ``quantize_experts`` false keeps the routed-experts stacks as they are."""
    graph = model.graph
    types = tensor_types(model)
    initializers = {i.name: i for i in graph.initializer}
    placement = Placement()
    head_weight: set[int] = set()
    projections: set[int] = set()
    for i, node in enumerate(graph.node):
        if node.domain == DOMAIN and node.op_type in (INDEXER_TOPK.name, INDEXER_TOPK_PAGED.name) \
                and len(node.input) >= 3:
            placement.indexers.append(IndexerInputs(node_name(node, i), node.input[0], node.input[1], node.input[2]))
            head_weight |= upstream_matmuls(graph, node.input[2], op_types)
            if keep_indexer_projections:
                for value in node.input[:2]:
                    projections |= upstream_matmuls(graph, value, op_types)
    placement.moe = find_experts(model, op_types, exclude, quantize_experts)
    placement.skipped.update(placement.moe.skipped)
    for i, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type not in op_types:
            continue
        name = node_name(node, i)
        activation, weight = node.input[0], node.input[1]
        keys = [name, *node.output, weight]
        pattern = next((p for p in exclude if any(fnmatch.fnmatchcase(k, p) for k in keys)), None)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if pattern is not None:
            placement.skipped[name] = f"excluded by pattern '{pattern}'"
        elif i in head_weight:
            placement.skipped[name] = "indexer head-weight path (kept in high precision)"
        elif i in projections:
            placement.skipped[name] = "indexer q/k projection (kept in high precision by the recipe)"
        elif i in placement.moe.routers:
            placement.skipped[name] = (f"MoE router of {placement.moe.routers[i]} (picks the experts; kept in "
                                       "high precision)")
        elif _feeds_topk(graph, node.output[0]):
            placement.skipped[name] = "MoE router (feeds a TopK; kept in high precision)"
        elif weight not in initializers or activation in initializers:
            placement.skipped[name] = "no weight initializer (activation x activation stays in high precision)"
        elif len(initializers[weight].dims) != 2 or initializers[weight].data_type not in FLOAT_TYPES:
            placement.skipped[name] = "weight is not a 2-D float matrix"
        elif types.get(activation) not in FLOAT_TYPES:
            placement.skipped[name] = "activation is not a float tensor"
        elif node.op_type == "Gemm" and attrs.get("transA", 0):
            placement.skipped[name] = "Gemm with transA is not quantized"
        else:
            axis = 0 if node.op_type == "Gemm" and attrs.get("transB", 0) else 1
            placement.targets.append(QuantTarget(i, name, node.op_type, activation, weight, axis))
    return placement


def _scalar(name: str, value, elem_type: int) -> TensorProto:
    return helper.make_tensor(name, elem_type, [], [float(value)] if elem_type in FLOAT_TYPES else [int(value)])


def insert_qdq(
    model: onnx.ModelProto,
    placement: Placement,
    activation_scales: dict[str, np.float32],
    precision: Precision,
    extra_activations: dict[str, list[int]] | None = None,
    experts_precision: Precision | None = None,
    expert_block_size: int = 128,
    expert_scale_pow2: bool = False,
) -> onnx.ModelProto:
    """A copy of ``model`` with Q/DQ per ``placement``.

    ``activation_scales`` gives the per-tensor scale of every activation (already amax/qmax).
    ``extra_activations`` maps further tensors (the indexer's q/k when asked) to the indices of
    the nodes whose inputs should read them through Q/DQ. The routed experts of
    ``placement.experts`` are written in ``experts_precision`` (default: ``precision``), FP8 ones
    in blocks of at most ``expert_block_size``, with power-of-two scales if ``expert_scale_pow2``
    (see :mod:`.experts`).
    """
    out = copy.deepcopy(model)
    graph = out.graph
    types = tensor_types(model)
    initializers = {i.name: i for i in graph.initializer}
    needs_opset = precision.min_opset
    # activation -> node indices reading it through Q/DQ
    readers: dict[str, set[int]] = {}
    for target in placement.targets:
        readers.setdefault(target.activation, set()).add(target.index)
    for name, nodes in (extra_activations or {}).items():
        readers.setdefault(name, set()).update(nodes)
    missing = sorted(set(readers) - set(activation_scales))
    if missing:
        raise ValueError(f"no scale for activation(s) {missing}")

    new_inits: list[TensorProto] = []
    weight_nodes: list[onnx.NodeProto] = []
    dequantized_weight: dict[str, str] = {}
    for target in placement.targets:
        if target.weight in dequantized_weight:
            continue
        tensor = initializers[target.weight]
        values = numpy_helper.to_array(tensor)
        float_type = numpy_float(tensor.data_type)
        if tensor.data_type != TensorProto.FLOAT:
            needs_opset = max(needs_opset, 19)
        reduce_axis = 1 - target.weight_axis
        amax = np.abs(values.astype(np.float32)).max(axis=reduce_axis)
        scale = precision.scale(amax)
        shape = [1, 1]
        shape[target.weight_axis] = -1
        quantized = precision.quantize_array(values.astype(np.float32), scale.reshape(shape))
        base = target.weight
        new_inits += [
            numpy_helper.from_array(quantized, f"{base}_quantized"),
            numpy_helper.from_array(scale.astype(float_type), f"{base}_scale"),
            zero_point(f"{base}_zero_point", precision.numpy_type, scale.shape),
        ]
        weight_nodes.append(helper.make_node(
            "DequantizeLinear", [f"{base}_quantized", f"{base}_scale", f"{base}_zero_point"],
            [f"{base}_dequantized"], name=f"{base}_DequantizeLinear", axis=target.weight_axis,
        ))
        dequantized_weight[target.weight] = f"{base}_dequantized"

    experts = rewrite_experts(graph, placement.experts, experts_precision or precision, expert_block_size,
                              expert_scale_pow2)
    new_inits += experts.initializers
    weight_nodes += experts.weight_nodes
    needs_opset = max(needs_opset, experts.min_opset)

    act_nodes: dict[str, list[onnx.NodeProto]] = {}
    for name in sorted(readers):
        elem_type = types.get(name, TensorProto.FLOAT)
        if elem_type != TensorProto.FLOAT:
            needs_opset = max(needs_opset, 19)
        new_inits += [
            _scalar(f"{name}_scale", activation_scales[name], elem_type),
            zero_point(f"{name}_zero_point", precision.numpy_type),
        ]
        act_nodes[name] = [
            helper.make_node("QuantizeLinear", [name, f"{name}_scale", f"{name}_zero_point"],
                             [f"{name}_quantized"], name=f"{name}_QuantizeLinear"),
            helper.make_node("DequantizeLinear", [f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"],
                             [f"{name}_dequantized"], name=f"{name}_DequantizeLinear"),
        ]

    for name, nodes in readers.items():
        for index in nodes:
            node = graph.node[index]
            for j, value in enumerate(node.input):
                if value == name:
                    node.input[j] = f"{name}_dequantized"
    for target in placement.targets:
        node = graph.node[target.index]
        node.input[1] = dequantized_weight[target.weight]

    graph_inputs = {i.name for i in graph.input}
    ordered: list[onnx.NodeProto] = list(weight_nodes)
    ordered += [n for name in sorted(readers) if name in graph_inputs for n in act_nodes[name]]
    for node in graph.node:
        ordered.append(node)
        for value in node.output:
            if value in act_nodes:
                ordered.extend(act_nodes[value])
    del graph.node[:]
    graph.node.extend(ordered)

    still_used = {v for n in graph.node for v in n.input} | {o.name for o in graph.output}
    kept = [i for i in graph.initializer if i.name in still_used]
    del graph.initializer[:]
    graph.initializer.extend(kept + new_inits)
    set_opset(out, needs_opset)
    if placement.experts:
        expert_function_updates(out, opset_of(out))
    return out
