"""Routed experts of MoE blocks: which ``dsa::DSAMoEExperts`` nodes get quantized, their routers
(kept in high precision), and the two quantized forms the graph rewrite writes.

The experts' weights are stacked initializers ``gate_up [E, 2I, H]`` and ``down [E, H, I]``. Both
forms leave the op's inputs as the op contract defines them (docs/quantize.md, "Routed experts"):

* **FP8**: the node becomes ``DSAMoEExpertsFP8`` with float8e4m3fn stacks and one float32 scale
  per ``block_size`` x ``block_size`` block of each expert (the contract's scale layout, DeepSeek's
  ``weight_scale_inv``): ONNX Runtime runs its function body, which dequantizes one expert at a
  time, and the plugin reads the FP8 weights. The contract's blocks are square, so a scale per
  output channel (a 1 x H block) does not fit it; blocks are the per-expert granularity here.
* **INT8**: the op has no INT8 form, so the stacks are stored as int8 with one scale per expert and
  output channel (``[E*2I]`` and ``[E*H]``) and dequantized by a per-axis ``DequantizeLinear``
  followed by a ``Reshape`` back to ``[E, 2I, H]`` in front of the unchanged ``DSAMoEExperts``
  node. That is exactly per expert per channel and runs in ONNX Runtime and TensorRT, but the
  dequantized stack is a whole float tensor at run time: memory is not bounded by one expert.

Activations into the experts are not quantized (weight-only): the op takes a float ``x`` in every
implementation, so a Q/DQ pair in front of it would add rounding and save nothing. Their
calibrated per-tensor range is recorded in the file's metadata for a future kernel.

The router of each experts node is found structurally: the first MatMul/Gemm upstream of its
``topk_ids`` and ``topk_weights`` inputs.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dsa_export.ops.contract import DOMAIN, MOE_EXPERTS, MOE_EXPERTS_FP8, PLUGIN_ATTRIBUTES
from dsa_export.quantize.graph import node_name, numpy_float, upstream_matmuls, zero_point
from dsa_export.quantize.precision import Precision

#: What the recipe's ``experts`` field may say: follow ``precision`` (None), a format, or keep.
EXPERT_MODES = ("int8", "fp8", "keep")
#: Stack dtypes the rewrite handles (bf16 files cannot be calibrated on ONNX Runtime's CPU provider).
_STACK_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16}


@dataclass(frozen=True)
class ExpertsTarget:
    """One ``DSAMoEExperts`` node whose weight stacks get quantized."""

    index: int
    node: str
    x: str
    topk_ids: str
    gate_up: str
    down: str
    experts: int
    intermediate: int
    hidden: int
    routers: tuple[str, ...]


@dataclass
class MoEPlacement:
    """Experts nodes to quantize, router nodes to keep, and why other experts nodes were left."""

    targets: list[ExpertsTarget] = field(default_factory=list)
    #: router MatMul/Gemm node index -> the experts node it routes for
    routers: dict[int, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    #: (node name, topk_ids input) of every routed-experts node, plain or FP8, in graph order
    routing: list[tuple[str, str]] = field(default_factory=list)


def is_experts_node(node: onnx.NodeProto) -> bool:
    return node.domain == DOMAIN and node.op_type in (MOE_EXPERTS.name, MOE_EXPERTS_FP8.name)


def find_experts(model: onnx.ModelProto, op_types: tuple[str, ...], exclude: tuple[str, ...] = (),
                 quantize: bool = True) -> MoEPlacement:
    """The MoE part of the placement; with ``quantize`` false only the routers are found."""
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    moe = MoEPlacement()
    for i, node in enumerate(graph.node):
        if not is_experts_node(node):
            continue
        name = node_name(node, i)
        moe.routing.append((name, node.input[1]))
        routers = set()
        for routing_input in node.input[1:3]:
            routers |= upstream_matmuls(graph, routing_input, op_types)
        for r in routers:
            moe.routers[r] = name
        if node.op_type != MOE_EXPERTS.name:
            moe.skipped[name] = "routed experts already FP8 (kept as they are)"
            continue
        gate_up, down = (initializers.get(v) for v in node.input[3:5])
        keys = [name, *node.output, *node.input[3:5]]
        pattern = next((p for p in exclude if any(fnmatch.fnmatchcase(k, p) for k in keys)), None)
        if pattern is not None:
            moe.skipped[name] = f"excluded by pattern '{pattern}'"
        elif not quantize:
            moe.skipped[name] = "routed experts kept in high precision by the recipe (experts: keep)"
        elif gate_up is None or down is None:
            moe.skipped[name] = "expert stacks are not initializers"
        elif gate_up.data_type not in _STACK_TYPES or down.data_type != gate_up.data_type:
            moe.skipped[name] = "expert stacks are not float32/float16 (bf16 files cannot be calibrated here)"
        else:
            e, two_i, h = gate_up.dims
            moe.targets.append(ExpertsTarget(
                index=i, node=name, x=node.input[0], topk_ids=node.input[1], gate_up=gate_up.name, down=down.name,
                experts=int(e), intermediate=int(two_i) // 2, hidden=int(h),
                routers=tuple(node_name(graph.node[r], r) for r in sorted(routers)),
            ))
    return moe


def fp8_block_size(requested: int, hidden: int, intermediate: int) -> int:
    """The largest power of two <= ``requested`` that divides ``hidden`` and ``intermediate``.

    Whole blocks only: TensorRT's blocked dequantize (the FP8 op's ``stack`` body) and the plugin's
    tensor-core path want dimensions that are multiples of the block. DeepSeek-V3.2 and GLM-5 get 128.
    """
    block = 1 << max(0, int(math.floor(math.log2(max(1, requested)))))
    while block > 1 and (hidden % block or intermediate % block):
        block //= 2
    return block


def fp8_blocks(values: np.ndarray, block: int, precision: Precision, pow2: bool) -> tuple[np.ndarray, np.ndarray]:
    """float8 values and float32 block scales ``[E, R/b, C/b]`` of a float stack ``[E, R, C]``;
    ``pow2`` rounds each scale up to a power of two (DeepSeek's ``scale_fmt: ue8m0``)."""
    e, rows, cols = values.shape
    blocks = values.astype(np.float32).reshape(e, rows // block, block, cols // block, block)
    scale = precision.scale(np.abs(blocks).max(axis=(2, 4)))  # [E, R/b, C/b], 1 where a block is all zero
    if pow2:
        scale = np.exp2(np.ceil(np.log2(scale))).astype(np.float32)
    quantized = precision.quantize_array(blocks, scale[:, :, None, :, None]).reshape(e, rows, cols)
    return quantized, scale.astype(np.float32)


def _int8_rows(values: np.ndarray, precision: Precision, float_type) -> tuple[np.ndarray, np.ndarray]:
    """int8 ``[E*R, C]`` and one scale per expert and output row ``[E*R]`` of a float stack ``[E, R, C]``."""
    rows = values.astype(np.float32).reshape(-1, values.shape[-1])
    scale = precision.scale(np.abs(rows).max(axis=1))
    return precision.quantize_array(rows, scale[:, None]), scale.astype(float_type)


@dataclass
class ExpertsRewrite:
    """What :func:`rewrite_experts` adds to a graph (the caller places the nodes first)."""

    initializers: list[TensorProto] = field(default_factory=list)
    weight_nodes: list[onnx.NodeProto] = field(default_factory=list)
    min_opset: int = 0


def rewrite_experts(graph: onnx.GraphProto, targets: list[ExpertsTarget], precision: Precision,
                    block_size: int = 128, scale_pow2: bool = False) -> ExpertsRewrite:
    """Quantize the stacks of ``targets`` in ``graph`` (in place; the old stacks are left for the
    caller's unused-initializer sweep). ``precision`` picks the form (see the module docstring);
    FP8 blocks are at most ``block_size`` wide, with power-of-two scales if ``scale_pow2``."""
    initializers = {i.name: i for i in graph.initializer}
    out = ExpertsRewrite()
    for target in targets:
        if precision.name == "fp8":
            _to_fp8_node(graph.node[target.index], target, initializers, precision, block_size, scale_pow2, out)
        else:
            _int8_stacks(graph.node[target.index], target, initializers, precision, out)
    return out


def _to_fp8_node(node: onnx.NodeProto, target: ExpertsTarget, initializers: dict[str, TensorProto],
                 precision: Precision, block_size: int, scale_pow2: bool, out: ExpertsRewrite) -> None:
    """Turn ``node`` into a DSAMoEExpertsFP8 node over FP8 stacks and their block scales."""
    block = fp8_block_size(block_size, target.hidden, target.intermediate)
    weights, scales = [], []
    for stack in (target.gate_up, target.down):
        quantized, scale = fp8_blocks(numpy_helper.to_array(initializers[stack]), block, precision, scale_pow2)
        out.initializers += [numpy_helper.from_array(quantized, f"{stack}_fp8"),
                             numpy_helper.from_array(scale, f"{stack}_block_scale")]
        weights.append(f"{stack}_fp8")
        scales.append(f"{stack}_block_scale")
    activation = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "activation"), b"silu")
    node.CopyFrom(helper.make_node(
        MOE_EXPERTS_FP8.name, [*node.input[:3], *weights, *scales], list(node.output), name=node.name,
        domain=DOMAIN, activation=activation.decode() if isinstance(activation, bytes) else activation,
        block_size=block, **PLUGIN_ATTRIBUTES,
    ))
    out.min_opset = max(out.min_opset, MOE_EXPERTS_FP8.min_opset)


def _int8_stacks(node: onnx.NodeProto, target: ExpertsTarget, initializers: dict[str, TensorProto],
                 precision: Precision, out: ExpertsRewrite) -> None:
    """Feed ``node`` int8 stacks through per-axis DequantizeLinear + Reshape (one scale per expert and row)."""
    for j, stack in ((3, target.gate_up), (4, target.down)):
        tensor = initializers[stack]
        if tensor.data_type != TensorProto.FLOAT:
            out.min_opset = max(out.min_opset, 19)  # fp16 scales
        quantized, scale = _int8_rows(numpy_helper.to_array(tensor), precision, numpy_float(tensor.data_type))
        out.initializers += [
            numpy_helper.from_array(quantized, f"{stack}_quantized"),
            numpy_helper.from_array(scale, f"{stack}_scale"),
            zero_point(f"{stack}_zero_point", precision.numpy_type, scale.shape),
            numpy_helper.from_array(np.array(tensor.dims, np.int64), f"{stack}_shape"),
        ]
        out.weight_nodes += [
            helper.make_node("DequantizeLinear", [f"{stack}_quantized", f"{stack}_scale", f"{stack}_zero_point"],
                             [f"{stack}_dequantized_rows"], name=f"{stack}_DequantizeLinear", axis=0),
            helper.make_node("Reshape", [f"{stack}_dequantized_rows", f"{stack}_shape"],
                             [f"{stack}_dequantized"], name=f"{stack}_Reshape"),
        ]
        node.input[j] = f"{stack}_dequantized"


def expert_function_updates(model: onnx.ModelProto, opset: int) -> None:
    """Attach the FP8 experts op's function body if a node needs it and drop the plain one if no
    node uses it any more (the exporter attaches the bodies of the ops a file uses)."""
    from dsa_export.ops.moe_onnx import moe_experts_fp8_function

    used = {n.op_type for n in model.graph.node if n.domain == DOMAIN}
    present = {f.name for f in model.functions if f.domain == DOMAIN}
    if MOE_EXPERTS_FP8.name in used and MOE_EXPERTS_FP8.name not in present:
        model.functions.append(moe_experts_fp8_function(opset))
    if MOE_EXPERTS.name not in used and MOE_EXPERTS.name in present:
        kept = [f for f in model.functions if not (f.domain == DOMAIN and f.name == MOE_EXPERTS.name)]
        del model.functions[:]
        model.functions.extend(kept)


def expert_forms(qmodel: onnx.ModelProto, targets: list[ExpertsTarget], scale_pow2: bool = False) -> dict[str, dict]:
    """How each quantized experts node of the rewritten ``qmodel`` stores its weights."""
    nodes = {n.name: n for n in qmodel.graph.node if n.name}
    forms = {}
    for target in targets:
        node = nodes[target.node]
        if node.op_type == MOE_EXPERTS_FP8.name:
            block = next(a.i for a in node.attribute if a.name == "block_size")
            forms[target.node] = {"op": node.op_type, "weights": "float8e4m3fn", "block_size": block,
                                  "scales": f"one float32 scale per {block}x{block} block of each expert"
                                  + (", a power of two" if scale_pow2 else "")}
        else:
            forms[target.node] = {"op": node.op_type, "weights": "int8",
                                  "scales": "one scale per expert and output channel ([E*2I] and [E*H])"}
    return forms


def experts_table(moe: MoEPlacement, forms: dict[str, dict], amax: dict[str, float], qmax: dict[str, float]) -> dict:
    """The ``dsa_export.moe_experts`` metadata: per experts node, its weight form, its router and
    the calibrated range of its input ``x`` (weight-only: the graph does not use it)."""
    table = {}
    layers = {name: i for i, (name, _) in enumerate(moe.routing)}
    for target in moe.targets:
        entry: dict = {"layer": layers[target.node], "experts": target.experts, "intermediate": target.intermediate,
                       "hidden": target.hidden, "router": list(target.routers), **forms.get(target.node, {})}
        if target.x in amax:
            a = float(amax[target.x])
            entry["x"] = {"tensor": target.x, "amax": a, "activations": "not quantized (weight-only)",
                          **{f"{name}_scale": float(np.float32(a / q if a > 0 else 1.0)) for name, q in qmax.items()}}
        table[target.node] = entry
    return table
