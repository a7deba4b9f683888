"""Small graph helpers shared by the Q/DQ placement (:mod:`.qdq`) and the routed-experts rewrite
(:mod:`.experts`): names, types, opset bumps and upstream searches over an ONNX graph."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
STANDARD_DOMAINS = ("", "ai.onnx")

#: Inputs of these ops carry only a shape, not values: a search for the producers of a value
#: must not follow them (a Reshape's target shape may come from ``Shape`` of any tensor).
_SHAPE_ONLY_OPS = {"Shape", "Size"}


def node_name(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def is_standard(node: onnx.NodeProto) -> bool:
    return node.domain in STANDARD_DOMAINS


def upstream_matmuls(graph: onnx.GraphProto, value: str, op_types: tuple[str, ...]) -> set[int]:
    """Indices of the first MatMul/Gemm nodes (``op_types``) on every path upstream of ``value``.

    The search stops at those nodes and at shape-only ops, so it finds, for example, the router
    MatMul behind an experts node's ``topk_ids`` and not the attention projections that produced
    the router's input.
    """
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output}
    found, seen, stack = set(), set(), [value]
    while stack:
        name = stack.pop()
        if name in seen or name not in producer:
            continue
        seen.add(name)
        index = producer[name]
        node = graph.node[index]
        if is_standard(node) and node.op_type in op_types:
            found.add(index)
            continue
        if is_standard(node) and node.op_type in _SHAPE_ONLY_OPS:
            continue
        stack.extend(i for i in node.input if i)
    return found


def set_opset(model: onnx.ModelProto, minimum: int) -> None:
    """Raise the standard-domain opset of the graph and of every local function to ``minimum``.

    Used to reach opset 19 (float8/fp16 Q/DQ) or 21 (the FP8 experts op's blocked
    DequantizeLinear). The ops our exports use do not change meaning from 18 to 21: those versions
    add types (float8, int4), Cast's ``saturate`` (default on) and blocked quantization.
    """
    for imports in (model.opset_import, *(f.opset_import for f in model.functions)):
        for entry in imports:
            if entry.domain in STANDARD_DOMAINS and entry.version < minimum:
                entry.version = minimum


def opset_of(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in STANDARD_DOMAINS)


def zero_point(name: str, numpy_type: np.dtype, shape: tuple[int, ...] = ()) -> TensorProto:
    return numpy_helper.from_array(np.zeros(shape, dtype=numpy_type), name)


def numpy_float(elem_type: int):
    """The NumPy type of a float initializer's scales (bf16 has none in NumPy: float32)."""
    return {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}.get(elem_type, np.float32)
