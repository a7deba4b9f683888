"""Dynamic FP8 activations: one scale per token and block of channels, computed at run time.

DeepSeek-V3/V3.2 and GLM-5 are trained and served with FP8 GEMMs whose activations are quantized
on the fly, one float32 scale per token and 128 channels (``act_quant`` in DeepSeek's inference
code: ``scale = amax / 448``), against weights in 128 x 128 blocks. A static per-tensor scale
calibrated offline cannot follow one token's outlier channels, and costs these models several
points of logit cosine (docs/quantize.md).

The form written into the ONNX file is the pair of TensorRT ONNX-parser ops made for this:

* ``trt::TRT_DynamicQuantize(x) -> (y, scale)`` with ``block_shape`` (the input's rank; ones
  except the last axis), ``output_type`` (FLOAT8E4M3FN) and ``scale_type`` (FLOAT). The TensorRT
  ONNX parser maps it to ``INetworkDefinition::addDynamicQuantizeV2`` (``IDynamicQuantizeLayer``
  with a block shape; TensorRT 11 documents FP8 output with FLOAT scales for it, NvInfer.h);
* ``trt::TRT_BlockDequantize(y, scale) -> x'`` with ``block_shape`` and ``output_dtype``, which
  the parser maps to an ``IDequantizeLayer`` with that block shape.

Both nodes are ONNX local functions whose bodies compute the same in standard ops (``Abs``,
``ReduceMax``, ``Div``, ``Cast`` to float8 with saturation, and back), so ONNX Runtime runs the
file on CPU, and a TensorRT parser without the native importer (the parser prefers its built-in
importer for an op type over a local function of the same name) imports the body instead. The
scale is ``max(amax, 2**-126) / 448``: an all-zero block gets the smallest normal scale, which
represents it exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper

from dsa_export.quantize.experts import fp8_block_size

TRT_DOMAIN = "trt"
DYNAMIC_QUANTIZE = "TRT_DynamicQuantize"
BLOCK_DEQUANTIZE = "TRT_BlockDequantize"
#: Channels per activation scale (DeepSeek's ``block_size``).
ACTIVATION_BLOCK = 128
E4M3_MAX = 448.0
#: Smallest normal float32: the floor of a block's amax, so an all-zero block divides by a number.
_TINY = float(np.finfo(np.float32).tiny)


def block_for(channels: int, largest: int = ACTIVATION_BLOCK) -> int | None:
    """The largest power of two up to ``largest`` dividing ``channels`` (the routed experts' block
    rule, :func:`~dsa_export.quantize.experts.fp8_block_size`); None if below 16 (TensorRT's
    smallest quantization block, and too small a block to be worth a scale)."""
    block = fp8_block_size(largest, channels, channels)
    return block if block >= 16 else None


def block_shape(rank: int, block: int) -> list[int]:
    return [1] * (rank - 1) + [block]


def _with_ref(node: onnx.NodeProto, name: str, function_attr: str, attr_type: int) -> onnx.NodeProto:
    """``node`` with attribute ``name`` taken from the function's attribute ``function_attr``."""
    ref = onnx.AttributeProto()
    ref.name = name
    ref.ref_attr_name = function_attr
    ref.type = attr_type
    node.attribute.append(ref)
    return node


def _node(op: str, inputs: list[str], outputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, **attrs)


def _block_scale_nodes(block: int, keepdims: int, scale: str) -> list[onnx.NodeProto]:
    """Nodes of a function body giving ``xf`` (``x`` as float32), ``blocks`` (``[..., C/block, block]``),
    ``qmax`` and ``scale`` = max(block amax, 2^-126) / 448 (``[..., C/block]``, or ``[..., C/block, 1]``
    with ``keepdims``)."""
    return [
        _node("Shape", ["x"], ["lead"], end=-1),
        _node("Constant", [], ["tail"], value_ints=[-1, block]),
        _node("Concat", ["lead", "tail"], ["blocked_shape"], axis=0),
        _node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        _node("Reshape", ["xf", "blocked_shape"], ["blocks"]),
        _node("Abs", ["blocks"], ["abs_blocks"]),
        _node("Constant", [], ["axis"], value_ints=[-1]),
        _node("ReduceMax", ["abs_blocks", "axis"], ["amax"], keepdims=keepdims),
        _node("Constant", [], ["tiny"], value_float=_TINY),
        _node("Max", ["amax", "tiny"], ["amax_safe"]),
        _node("Constant", [], ["qmax"], value_float=E4M3_MAX),
        _node("Div", ["amax_safe", "qmax"], [scale]),
    ]


def dynamic_quantize_function(opset: int, block: int) -> onnx.FunctionProto:
    """``TRT_DynamicQuantize(x) -> (y, scale)``: ``block`` channels per scale along the last axis,
    symmetric, FP8 e4m3.

    The body is a blocked QuantizeLinear (opset 21) with the scales computed from ``x``, the
    standard form ONNX Runtime runs and TensorRT-RTX builds (an FP8 tensor in TensorRT must come
    from a quantize layer, not from a Cast; a per-axis form of dynamic length does not parse).
    ``block_size`` is an attribute there, so the body is made for the file's one block size and
    the nodes' ``block_shape`` carries the same number (:func:`dynamic_qdq_nodes`).
    """
    nodes = [
        *_block_scale_nodes(block, keepdims=0, scale="scale_f"),
        _with_ref(_node("QuantizeLinear", ["xf", "scale_f"], ["y"], axis=-1, block_size=block), "output_dtype",
                  "output_type", onnx.AttributeProto.INT),
        _with_ref(_node("Cast", ["scale_f"], ["scale"]), "to", "scale_type", onnx.AttributeProto.INT),
    ]
    return helper.make_function(
        TRT_DOMAIN, DYNAMIC_QUANTIZE, ["x"], ["y", "scale"], nodes,
        [helper.make_opsetid("", opset)], attributes=["block_shape", "output_type", "scale_type"],
        doc_string=f"Dynamic symmetric quantization, one scale per {block} channels of the last axis (TensorRT's "
                   "IDynamicQuantizeLayer); scale = max(amax, 2^-126) / 448, y = saturate_e4m3(x / scale).",
    )


def block_dequantize_function(opset: int, block: int, float_codes: bool = False) -> onnx.FunctionProto:
    """``TRT_BlockDequantize(y, scale) -> x``: ``y`` times its block's scale, in ``output_dtype``;
    ``float_codes``: ``y`` holds the e4m3 values in float32 (:func:`_float_codes_function`).

    The body reads the FP8 codes with a unit-scale DequantizeLinear and multiplies them by the
    block scales (the same numbers as a blocked DequantizeLinear): with a blocked
    DequantizeLinear of run-time scales in front of a MatMul of FP8 weights, TensorRT-RTX 1.7
    fuses an FP8 GEMM that needs constant scales and fails to build
    (``MyelinCheckException: CHECK(is_constant())``); this form builds.
    """
    read_codes = [_node("Identity", ["y"], ["codes"])] if float_codes else [
        _node("Constant", [], ["one"], value_float=1.0),
        _node("DequantizeLinear", ["y", "one"], ["codes"]),
    ]
    nodes = [
        *read_codes,
        _node("Shape", ["y"], ["lead"], end=-1),
        _node("Constant", [], ["tail"], value_ints=[-1, block]),
        _node("Concat", ["lead", "tail"], ["blocked_shape"], axis=0),
        _node("Reshape", ["codes", "blocked_shape"], ["code_blocks"]),
        _node("Cast", ["scale"], ["scale_f"], to=TensorProto.FLOAT),
        _node("Constant", [], ["axis"], value_ints=[-1]),
        _node("Unsqueeze", ["scale_f", "axis"], ["scale_blocks"]),
        _node("Mul", ["code_blocks", "scale_blocks"], ["blocks"]),
        _node("Shape", ["y"], ["full"]),
        _node("Reshape", ["blocks", "full"], ["xf"]),
        _with_ref(_node("Cast", ["xf"], ["x"]), "to", "output_dtype", onnx.AttributeProto.INT),
    ]
    return helper.make_function(
        TRT_DOMAIN, BLOCK_DEQUANTIZE, ["y", "scale"], ["x"], nodes,
        [helper.make_opsetid("", opset)], attributes=["block_shape", "output_dtype"],
        doc_string=f"Dequantization, one scale per {block} channels of the last axis (TensorRT's IDequantizeLayer "
                   "with a block shape).",
    )


def dynamic_qdq_nodes(tensor: str, rank: int, channels: int, block: int,
                      output_dtype: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The nodes putting ``tensor`` through dynamic FP8 quantization, and their initializer; the
    result is ``{tensor}_dequantized`` (the static Q/DQ's name, so readers are rewired alike).

    A Reshape to ``[0, ..., 0, channels]`` first pins the blocked axis for TensorRT, which needs
    it known at build time (IDynamicQuantizeLayer, and a blocked quantize layer) and cannot
    always infer it through the exported graph's computed shapes.
    """
    shape = block_shape(rank, block)
    pin = onnx.numpy_helper.from_array(np.array([0] * (rank - 1) + [channels], np.int64), f"{tensor}_pinned_shape")
    nodes = [
        helper.make_node("Reshape", [tensor, pin.name], [f"{tensor}_pinned"], name=f"{tensor}_PinChannels"),
        helper.make_node(DYNAMIC_QUANTIZE, [f"{tensor}_pinned"], [f"{tensor}_quantized", f"{tensor}_block_scale"],
                         name=f"{tensor}_DynamicQuantize", domain=TRT_DOMAIN, block_shape=shape,
                         output_type=TensorProto.FLOAT8E4M3FN, scale_type=TensorProto.FLOAT),
        helper.make_node(BLOCK_DEQUANTIZE, [f"{tensor}_quantized", f"{tensor}_block_scale"],
                         [f"{tensor}_dequantized"], name=f"{tensor}_BlockDequantize", domain=TRT_DOMAIN,
                         block_shape=shape, output_dtype=output_dtype),
    ]
    return nodes, [pin]


def add_functions(model: onnx.ModelProto, opset: int, block: int) -> None:
    """Attach (or replace) the two local functions and import the ``trt`` domain."""
    keep = [f for f in model.functions if f.domain != TRT_DOMAIN]
    del model.functions[:]
    model.functions.extend([*keep, dynamic_quantize_function(opset, block), block_dequantize_function(opset, block)])
    if not any(o.domain == TRT_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(TRT_DOMAIN, 1))


def has_dynamic_qdq(model: onnx.ModelProto) -> bool:
    return any(n.domain == TRT_DOMAIN and n.op_type == DYNAMIC_QUANTIZE for n in model.graph.node)


def _float_codes_function(opset: int, block: int) -> onnx.FunctionProto:
    """``TRT_DynamicQuantize`` whose ``y`` holds the e4m3 values as float32: rounding to e4m3
    (round half to even on 3 mantissa bits, subnormals below 2^-6) computed in float ops.

    The same numbers as the FP8 body, in a form with no FP8 tensor: TensorRT-RTX 1.7 builds the
    blocked quantize with run-time scales in a small graph, but not in a tiny GLM-5 stage graph
    with FP8 experts (its Myelin compiler: ``quantize_lowering.cpp:580: CHECK(sym_eql(src_dims,
    dst_dims))``), and with FP8 weights its FP8 GEMM fusion wants constant activation scales.
    """
    nodes = [
        *_block_scale_nodes(block, keepdims=1, scale="scale_k"),
        _node("Div", ["blocks", "scale_k"], ["v"]),
        _node("Abs", ["v"], ["a_raw"]),
        _node("Min", ["a_raw", "qmax"], ["a"]),
        # The binade of a: e = floor(log2 a), corrected by one where the float log lands beside it.
        _node("Max", ["a", "tiny"], ["a_pos"]),
        _node("Log", ["a_pos"], ["ln_a"]),
        _node("Constant", [], ["ln2"], value_float=float(np.log(2.0))),
        _node("Div", ["ln_a", "ln2"], ["log2_a"]),
        _node("Floor", ["log2_a"], ["e0"]),
        _node("Constant", [], ["two"], value_float=2.0),
        _node("Pow", ["two", "e0"], ["p0"]),
        _node("Greater", ["p0", "a"], ["too_high"]),
        _node("Mul", ["p0", "two"], ["p1"]),
        _node("LessOrEqual", ["p1", "a"], ["too_low"]),
        _node("Cast", ["too_high"], ["down"], to=TensorProto.FLOAT),
        _node("Cast", ["too_low"], ["up"], to=TensorProto.FLOAT),
        _node("Sub", ["e0", "down"], ["e1"]),
        _node("Add", ["e1", "up"], ["e2"]),
        _node("Constant", [], ["min_exp"], value_float=-6.0),
        _node("Max", ["e2", "min_exp"], ["e"]),
        _node("Constant", [], ["mantissa_bits"], value_float=3.0),
        _node("Sub", ["e", "mantissa_bits"], ["step_exp"]),
        _node("Pow", ["two", "step_exp"], ["step"]),
        _node("Div", ["a", "step"], ["steps"]),
        _node("Round", ["steps"], ["rounded"]),
        _node("Mul", ["rounded", "step"], ["magnitude"]),
        _node("Sign", ["v"], ["sign"]),
        _node("Mul", ["sign", "magnitude"], ["codes"]),
        _node("Shape", ["x"], ["full"]),
        _node("Reshape", ["codes", "full"], ["y"]),
        _node("Squeeze", ["scale_k", "axis"], ["scale_f"]),
        _with_ref(_node("Cast", ["scale_f"], ["scale"]), "to", "scale_type", onnx.AttributeProto.INT),
    ]
    return helper.make_function(
        TRT_DOMAIN, DYNAMIC_QUANTIZE, ["x"], ["y", "scale"], nodes, [helper.make_opsetid("", opset)],
        attributes=["block_shape", "output_type", "scale_type"],
        doc_string="Dynamic FP8 quantization with the e4m3 values held in float32 (TensorRT-RTX's form).",
    )


def float_codes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose two functions hold the e4m3 values in float32 (the same numbers)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    block = next(int(helper.get_attribute_value(a)[-1]) for n in model.graph.node
                 if n.domain == TRT_DOMAIN and n.op_type == DYNAMIC_QUANTIZE for a in n.attribute
                 if a.name == "block_shape")
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    keep = [f for f in out.functions if f.domain != TRT_DOMAIN]
    del out.functions[:]
    out.functions.extend([*keep, _float_codes_function(opset, block),
                          block_dequantize_function(opset, block, float_codes=True)])
    for node in out.graph.node:
        if node.domain == TRT_DOMAIN and node.op_type == DYNAMIC_QUANTIZE:
            for attr in node.attribute:
                if attr.name == "output_type":
                    attr.i = TensorProto.FLOAT
    return out


def inline_for_rtx(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as TensorRT-RTX 1.7 builds it: the two functions in their float-codes form
    (:func:`_float_codes_function`), inlined so that their layers get distinct names. Its native
    dynamic quantize builds blocks of 16 only ("Dynamic Quantization Op block_size 128 is not
    supported"); the engine computes the same numbers with float GEMMs."""
    from onnx.inliner import inline_selected_functions

    return inline_selected_functions(float_codes(model),
                                     [(TRT_DOMAIN, DYNAMIC_QUANTIZE), (TRT_DOMAIN, BLOCK_DEQUANTIZE)])


def reference(x: np.ndarray, block: int) -> np.ndarray:
    """What the pair computes, in NumPy (float32 in, float32 out): the tests' oracle."""
    from dsa_export.quantize.fp8 import FP8

    shape = x.shape
    groups = x.astype(np.float32).reshape(*shape[:-1], shape[-1] // block, block)
    scale = np.maximum(np.abs(groups).max(-1, keepdims=True), np.float32(_TINY)) / np.float32(E4M3_MAX)
    return (FP8.quantize_array(groups, scale).astype(np.float32) * scale).reshape(shape)


__all__ = ["ACTIVATION_BLOCK", "BLOCK_DEQUANTIZE", "DYNAMIC_QUANTIZE", "TRT_DOMAIN", "add_functions", "block_for",
           "block_shape", "dynamic_qdq_nodes", "has_dynamic_qdq", "inline_for_rtx", "reference"]
