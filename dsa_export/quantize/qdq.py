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
import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dsa_export.errors import DSAUserError
from dsa_export.ops.contract import DOMAIN, SELECTING_OPS
from dsa_export.quantize.dynamic import (
    ACTIVATION_BLOCK,
    add_functions,
    block_for,
    dynamic_qdq_nodes,
)
from dsa_export.quantize.experts import (
    ExpertsTarget,
    MoEPlacement,
    expert_function_updates,
    find_experts,
    fp8_blocks,
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


def _indexer_inputs(node: onnx.NodeProto, name: str) -> IndexerInputs:
    """q, k and w of an indexer node, by the contract's input names (w is input 3 of the FP8 form);
    k is empty where the keys are stored quantized already (DSAIndexerTopKPagedFP8's uint8 codes)."""
    from dsa_export.ops.contract import FLOAT_TYPES, OPS

    inputs = OPS[node.op_type].inputs
    k_spec = inputs[1]
    k = node.input[1] if set(k_spec.types) <= set(FLOAT_TYPES) else ""
    return IndexerInputs(name, node.input[0], k, node.input[[t.name for t in inputs].index("w")])


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
        return sorted({name for ix in self.indexers for name in (ix.q, ix.k) if name})


def value_facts(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, list[int | None]]]:
    """Element type and shape (ints, None where dynamic) of every named value, from one ONNX shape
    inference (where the file does not say); a real-width stage is gigabytes, inferred once."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # custom domains without schemas: keep what the file records
        inferred = model
    graph = inferred.graph
    types = {i.name: i.data_type for i in graph.initializer}
    shapes: dict[str, list[int | None]] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type.elem_type
            if value.type.tensor_type.HasField("shape"):
                shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None
                                      for d in value.type.tensor_type.shape.dim]
    return types, shapes


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every named value (inferred where the file does not say)."""
    return value_facts(model)[0]


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
        if node.domain == DOMAIN and node.op_type in SELECTING_OPS \
                and len(node.input) >= 3:
            ix = _indexer_inputs(node, node_name(node, i))
            placement.indexers.append(ix)
            head_weight |= upstream_matmuls(graph, ix.w, op_types)
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
    *,
    dynamic: DynamicForm | None = None,
) -> onnx.ModelProto:
    """A copy of ``model`` with Q/DQ per ``placement``.

    ``activation_scales`` gives the per-tensor scale of every activation (already amax/qmax).
    ``extra_activations`` maps further tensors (the indexer's q/k when asked) to the indices of
    the nodes whose inputs should read them through Q/DQ. The routed experts of
    ``placement.experts`` are written in ``experts_precision`` (default: ``precision``), FP8 ones
    in blocks of at most ``expert_block_size``, with power-of-two scales if ``expert_scale_pow2``
    (see :mod:`.experts`). ``dynamic`` (FP8 only) scales the activations per token and block at
    run time instead (no ``activation_scales`` needed) and may quantize the weights in square
    blocks (see :class:`DynamicForm`).
    """
    out = copy.deepcopy(model)
    graph = out.graph
    types, shapes = value_facts(model)
    if dynamic is not None and precision.name != "fp8":
        raise ValueError("dynamic activations are FP8 only")
    initializers = {i.name: i for i in graph.initializer}
    needs_opset = precision.min_opset
    # activation -> node indices reading it through Q/DQ
    readers: dict[str, set[int]] = {}
    for target in placement.targets:
        readers.setdefault(target.activation, set()).add(target.index)
    for name, nodes in (extra_activations or {}).items():
        readers.setdefault(name, set()).update(nodes)
    missing = [] if dynamic is not None else sorted(set(readers) - set(activation_scales))
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
        base = target.weight
        block = dynamic.weight_block(values.shape) if dynamic is not None else None
        if block is not None:
            quantized, scale, axis = weight_blocks(values, target.weight_axis, block, precision,
                                                   dynamic.weight_scale_pow2)
            needs_opset = max(needs_opset, 21)
            attrs = {"axis": axis, "block_size": block}
        else:
            reduce_axis = 1 - target.weight_axis
            amax = np.abs(values.astype(np.float32)).max(axis=reduce_axis)
            scale = precision.scale(amax)
            shape = [1, 1]
            shape[target.weight_axis] = -1
            quantized = precision.quantize_array(values.astype(np.float32), scale.reshape(shape))
            attrs = {"axis": target.weight_axis}
        new_inits += [
            numpy_helper.from_array(quantized, f"{base}_quantized"),
            numpy_helper.from_array(scale.astype(float_type), f"{base}_scale"),
            zero_point(f"{base}_zero_point", precision.numpy_type, scale.shape),
        ]
        weight_nodes.append(helper.make_node(
            "DequantizeLinear", [f"{base}_quantized", f"{base}_scale", f"{base}_zero_point"],
            [f"{base}_dequantized"], name=f"{base}_DequantizeLinear", **attrs,
        ))
        dequantized_weight[target.weight] = f"{base}_dequantized"

    experts = rewrite_experts(graph, placement.experts, experts_precision or precision, expert_block_size,
                              expert_scale_pow2)
    new_inits += experts.initializers
    weight_nodes += experts.weight_nodes
    needs_opset = max(needs_opset, experts.min_opset)

    act_nodes: dict[str, list[onnx.NodeProto]] = {}
    read_as = {name: f"{name}_dequantized" for name in readers}
    if dynamic is not None:
        act_nodes, read_as, extra_inits, act_block = dynamic_activations(sorted(readers), types, shapes, dynamic)
        new_inits += extra_inits
        needs_opset = max(needs_opset, 21)
    for name in sorted(readers) if dynamic is None else ():
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
                    node.input[j] = read_as[name]
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
    if dynamic is not None and act_nodes:
        add_functions(out, opset_of(out), act_block)
    return out


@dataclass(frozen=True)
class DynamicForm:
    """FP8 as DeepSeek-V3/V3.2 and GLM-5 run it (their ``act_quant`` and 128 x 128 weight blocks).

    Attributes:
        activation_block: channels per activation scale, at most (halved until it divides every
            quantized activation's channels; one block size per file).
        weight_block_size: edge of a weight's square scale block, at most (halved until it divides
            both dimensions; below 16 the weight keeps one scale per output channel); None keeps
            per-channel weights.
        weight_scale_pow2: round weight block scales up to a power of two (``scale_fmt: ue8m0``).
        hadamard: tensors rotated by a normalized Hadamard matrix before their quantization (the
            indexer's q and k, as DeepSeek-V3.2's indexer does: q.k is unchanged, outliers spread).
    """

    activation_block: int = ACTIVATION_BLOCK
    weight_block_size: int | None = 128
    weight_scale_pow2: bool = False
    hadamard: tuple[str, ...] = ()

    def weight_block(self, shape: tuple[int, ...]) -> int | None:
        if self.weight_block_size is None:
            return None
        return block_for(math.gcd(*shape), self.weight_block_size)


def weight_blocks(values: np.ndarray, out_axis: int, block: int, precision: Precision,
                  pow2: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """(quantized weight, scales, blocked axis) of a 2-D weight in ``block`` x ``block`` scale blocks.

    A blocked DequantizeLinear blocks one axis (the input-channel one), so each square block's
    scale is repeated over its ``block`` output channels: ``[K/b, N]`` for a MatMul weight
    ``[K, N]`` (axis 0), ``[N, K/b]`` for a ``Gemm transB`` weight ``[N, K]`` (axis 1).
    """
    in_axis = 1 - out_axis
    canonical = np.moveaxis(values.astype(np.float32), out_axis, 0)  # [N, K]
    codes, scale = fp8_blocks(canonical[None], block, precision, pow2)  # the routed experts' block quantizer
    codes, scale = codes[0], scale[0]  # [N, K], [N/b, K/b]
    per_row = np.repeat(scale, block, axis=0)  # [N, K/b]
    if out_axis == 0:
        return codes, per_row, in_axis
    return np.ascontiguousarray(codes.T), np.ascontiguousarray(per_row.T), in_axis


def _hadamard(size: int) -> np.ndarray:
    """The ``size`` x ``size`` Hadamard matrix scaled to be orthogonal (``size`` a power of two)."""
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < size:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(size)).astype(np.float32)


def dynamic_activations(names: list[str], types: dict[str, int], dims: dict[str, list[int | None]],
                        form: DynamicForm) -> tuple[dict, dict[str, str], list[TensorProto], int]:
    """The dynamic FP8 Q/DQ of every activation of ``names``: (nodes after each producer, the
    name each reader reads instead, new initializers, the file's block size)."""
    channels = {}
    for name in names:
        shape = dims.get(name)
        if not shape or shape[-1] is None:
            raise DSAUserError(f"the channels of activation '{name}' (its last dimension) are not known statically, so "
                               "it cannot get per-block dynamic scales; export the model with static hidden sizes.")
        channels[name] = shape[-1]
    block = block_for(math.gcd(*channels.values()), form.activation_block) if channels else form.activation_block
    if block is None:
        widths = sorted(set(channels.values()))
        raise DSAUserError(f"the quantized activations' channel counts {widths} have no common block of 16 or more, "
                           "which dynamic FP8 scales need; use static activations (calibrated per tensor).")
    nodes: dict[str, list[onnx.NodeProto]] = {}
    read_as: dict[str, str] = {}
    inits: list[TensorProto] = []
    for name in names:
        elem_type = types.get(name, TensorProto.FLOAT)
        source = name
        nodes[name] = []
        if name in form.hadamard:
            size = channels[name]
            if size & (size - 1):
                raise DSAUserError(f"'{name}' has {size} channels, not a power of two, so it cannot be rotated by a "
                                   "Hadamard matrix; drop the indexer rotation.")
            matrix = f"hadamard_{size}"
            if not any(i.name == matrix for i in inits):
                inits.append(numpy_helper.from_array(_hadamard(size).astype(numpy_float(elem_type)), matrix))
            source = f"{name}_rotated"
            nodes[name].append(helper.make_node("MatMul", [name, matrix], [source], name=f"{name}_Hadamard"))
        qdq, pin = dynamic_qdq_nodes(source, len(dims[name]), channels[name], block, elem_type)
        nodes[name] += qdq
        inits += pin
        read_as[name] = f"{source}_dequantized"
    return nodes, read_as, inits, block
