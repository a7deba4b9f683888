"""The ONNX side of the ``dsa`` ops: schemas, FunctionProto bodies and exporter translations.

* :func:`register_schemas` registers an :class:`onnx.defs.OpSchema` per op so ``onnx.checker``
  (full check) and the onnxscript-based exporter accept ``dsa`` nodes.
* :func:`function_protos` builds one local function per op with only standard ONNX ops. ONNX
  Runtime and the TensorRT(-RTX) parser execute a node through it when no plugin is registered.
  Attention bodies are mask-based: the selected indices are scattered into a ``[B,S,T]`` mask and a
  masked softmax attention runs, so no ``[B,S,K,D]`` gather is ever materialized. The routed-experts
  bodies (:mod:`dsa_export.ops.moe_onnx`) loop over the active experts and tiles of their tokens.
* :func:`translation_table` maps the torch custom ops to onnxscript functions emitting the nodes.
"""

from __future__ import annotations

import functools

import onnx
from onnx import AttributeProto, FunctionProto, TensorProto, helper

from dsa_export.ops.contract import (
    DOMAIN,
    DOMAIN_VERSION,
    INDEXER_TOPK,
    MOE_ACTIVATIONS,
    MOE_EXPERTS_FP8,
    OPS,
    PLUGIN_ATTRIBUTES,
    SPARSE_ATTENTION,
    OpSpec,
)
from dsa_export.ops.onnx_graph import Body as _Body

_ATTR_TYPES = {"int": AttributeProto.INT, "float": AttributeProto.FLOAT, "string": AttributeProto.STRING}


def _schema(spec: OpSpec) -> onnx.defs.OpSchema:
    from onnx.defs import OpSchema

    option = OpSchema.FormalParameterOption
    type_vars: dict[tuple[str, ...] | str, str] = {}
    var_types: dict[str, tuple[str, ...]] = {}

    def formal(t) -> OpSchema.FormalParameter:
        var = t.type_var or type_vars.setdefault(t.types, f"T{len(type_vars)}")
        var_types[var] = t.types
        return OpSchema.FormalParameter(
            t.name, var, t.doc, param_option=option.Optional if t.optional else option.Single
        )

    inputs = [formal(t) for t in spec.inputs]
    outputs = [formal(t) for t in spec.outputs]
    attrs = []
    for attr in (*spec.attributes, *spec.plugin_attributes):
        kind = getattr(OpSchema.AttrType, attr.kind.upper())
        if attr.default is None:
            attrs.append(OpSchema.Attribute(attr.name, kind, attr.doc, required=True))
        else:
            attrs.append(OpSchema.Attribute(attr.name, helper.make_attribute(attr.name, attr.default), attr.doc))
    constraints = [(var, list(types), "") for var, types in var_types.items()]
    # Outputs of SparseAttention share q's dtype variable; indices share the int32 variable.
    return OpSchema(spec.name, DOMAIN, DOMAIN_VERSION, spec.doc, inputs=inputs, outputs=outputs,
                    type_constraints=constraints, attributes=attrs)


@functools.cache
def register_schemas() -> None:
    """Register the ``dsa`` schemas with ONNX (idempotent, also across already-registered ones)."""
    for spec in OPS.values():
        try:
            onnx.defs.get_schema(spec.name, DOMAIN_VERSION, DOMAIN)
            continue
        except onnx.defs.SchemaError:
            pass
        onnx.defs.register_schema(_schema(spec))


def _indexer_function(opset: int) -> FunctionProto:
    """Body of DSAIndexerTopK. It reads ``lengths``, which the exporter therefore always supplies."""
    b = _Body("idx")
    f32 = TensorProto.FLOAT
    qf, kf, wf = b("Cast", "q", to=f32), b("Cast", "k", to=f32), b("Cast", "w", to=f32)
    # scores[b,s,t] = sum_h w[b,s,h] * ReLU(scale * q[b,s,h] . k[b,t]).
    k_t = b("Unsqueeze", b("Transpose", kf, perm=[0, 2, 1]), b.const([1]))  # [B,1,D,T]
    relu = b("Relu", b("Mul", b("MatMul", qf, k_t), b.ref("scale", AttributeProto.FLOAT)))  # [B,S,H,T]
    weighted = b("Mul", relu, b("Unsqueeze", wf, b.const([-1])))
    scores = b("ReduceSum", weighted, b.const([2]), keepdims=0)  # [B,S,T]

    # Allowed keys: t <= T - S + s when causal, and t < lengths[b].
    q_shape, k_shape = b("Shape", "q"), b("Shape", "k")
    s_len = b("Gather", q_shape, b.const(1), axis=0)
    t_len = b("Gather", k_shape, b.const(1), axis=0)
    key_pos = b("Range", b.const(0), t_len, b.const(1))  # [T]
    query_pos = b("Add", b("Range", b.const(0), s_len, b.const(1)), b("Sub", t_len, s_len))  # [S]
    causal_ok = b("LessOrEqual", b("Unsqueeze", key_pos, b.const([0])), b("Unsqueeze", query_pos, b.const([1])))
    not_causal = b("Equal", b.ref("causal", AttributeProto.INT), b.const(0))
    allowed = b("Unsqueeze", b("Or", causal_ok, not_causal), b.const([0]))  # [1,S,T]
    lengths = b("Cast", "lengths", to=TensorProto.INT64)
    in_length = b("Less", b("Unsqueeze", key_pos, b.const([0])), b("Unsqueeze", lengths, b.const([1])))  # [B,T]
    allowed = b("And", allowed, b("Unsqueeze", in_length, b.const([1])))  # [B,S,T]

    # Append topk columns of -inf so TopK always has the constant K = topk, whatever T is; a
    # selected position is kept only where it is an allowed key.
    neg_inf = b("Constant", value=helper.make_tensor("v", f32, [], [float("-inf")]))
    masked = b("Where", allowed, scores, neg_inf)
    topk = b("Reshape", b.ref("topk", AttributeProto.INT), b.const([1]))
    pad_shape = b("Concat", b("Slice", q_shape, b.const([0]), b.const([2])), topk, axis=0)  # [B,S,topk]
    padded = b("Concat", masked, b("Expand", neg_inf, pad_shape), axis=2)
    allowed_f = b("Cast", allowed, to=f32)
    allowed_padded = b("Concat", allowed_f, b("Expand", b.const(0.0, f32), pad_shape), axis=2)
    _, top_idx = b("TopK", padded, topk, axis=-1, largest=1, sorted=1, outputs=2)
    valid = b("Greater", b("GatherElements", allowed_padded, top_idx, axis=2), b.const(0.0, f32))
    b("Cast", b("Where", valid, top_idx, b.const(-1)), to=TensorProto.INT32)
    b.rename_last("indices")
    return _function(INDEXER_TOPK, b, opset)


def _sparse_attention_function(opset: int) -> FunctionProto:
    """Body of DSASparseAttention: scatter the indices into a [B,S,T] mask, then masked attention."""
    b = _Body("sa")
    f32 = TensorProto.FLOAT
    q_shape, k_shape, v_shape = b("Shape", "q"), b("Shape", "k"), b("Shape", "v")
    t_len = b("Gather", k_shape, b.const(1), axis=0)
    # Invalid entries (-1 or outside [0,T)) are redirected to an extra column T that is dropped.
    idx = b("Cast", "indices", to=TensorProto.INT64)
    in_range = b("And", b("GreaterOrEqual", idx, b.const(0)), b("Less", idx, t_len))
    safe = b("Where", in_range, idx, t_len)
    mask_shape = b("Concat", b("Slice", q_shape, b.const([0]), b.const([2])),
                   b("Add", b("Reshape", t_len, b.const([1])), b.const([1])), axis=0)  # [B,S,T+1]
    zeros = b("ConstantOfShape", mask_shape, value=helper.make_tensor("v", f32, [1], [0.0]))
    ones = b("Expand", b.const(1.0, f32), b("Shape", safe))
    scattered = b("ScatterElements", zeros, safe, ones, axis=2)
    t_end = b("Reshape", t_len, b.const([1]))
    mask = b("Greater", b("Slice", scattered, b.const([0]), t_end, b.const([2])), b.const(0.0, f32))  # [B,S,T]

    # Group query heads by kv head: q [B,S,H,Dk] -> [B,Hkv,G,S,Dk]; k -> [B,Hkv,1,Dk,T].
    hkv = b("Slice", k_shape, b.const([2]), b.const([3]))
    dk = b("Slice", q_shape, b.const([3]), b.const([4]))
    grouped = b("Concat", b("Slice", q_shape, b.const([0]), b.const([2])), hkv, b.const([-1]), dk, axis=0)
    qg = b("Transpose", b("Reshape", b("Cast", "q", to=f32), grouped), perm=[0, 2, 3, 1, 4])
    kg = b("Unsqueeze", b("Transpose", b("Cast", "k", to=f32), perm=[0, 2, 3, 1]), b.const([2]))
    vg = b("Unsqueeze", b("Transpose", b("Cast", "v", to=f32), perm=[0, 2, 1, 3]), b.const([2]))
    logits = b("Mul", b("MatMul", qg, kg), b.ref("scale", AttributeProto.FLOAT))  # [B,Hkv,G,S,T]
    mask5 = b("Unsqueeze", mask, b.const([1, 2]))  # [B,1,1,S,T]
    # A finite fill keeps fully masked rows NaN-free; they are zeroed below.
    masked = b("Where", mask5, logits, b.const(-1e30, f32))
    probs = b("Softmax", masked, axis=-1)
    any_valid = b("ReduceMax", b("Cast", mask5, to=f32), b.const([-1]), keepdims=1)  # [B,1,1,S,1]
    out = b("Mul", b("MatMul", probs, vg), any_valid)  # [B,Hkv,G,S,Dv]
    out_shape = b("Concat", b("Slice", q_shape, b.const([0]), b.const([3])),
                  b("Slice", v_shape, b.const([3]), b.const([4])), axis=0)  # [B,S,H,Dv]
    out = b("Reshape", b("Transpose", out, perm=[0, 3, 1, 2, 4]), out_shape)
    b("CastLike", out, "q")
    b.rename_last("out")
    return _function(SPARSE_ATTENTION, b, opset)


def _function(spec: OpSpec, body: _Body, opset: int) -> FunctionProto:
    return helper.make_function(
        DOMAIN,
        spec.name,
        inputs=[t.name for t in spec.inputs],
        outputs=[t.name for t in spec.outputs],
        nodes=body.nodes,
        opset_imports=[helper.make_opsetid("", opset)],
        attributes=[a.name for a in spec.attributes],
        doc_string=spec.doc,
    )


def function_protos(opset: int, *, fp8_body: str = "expert") -> list[FunctionProto]:
    """The local functions of the ``dsa`` ops whose body ``opset`` can express.

    DSAMoEExpertsFP8 needs opset 21 (float8 tensors, blocked DequantizeLinear); below that it has
    no body and a model using it must be exported at a higher opset. ``fp8_body`` picks its
    construction: ``expert`` (one expert dequantized at a time, for ONNX Runtime) or ``stack``
    (the one TensorRT(-RTX) can build), see :mod:`dsa_export.ops.moe_onnx`.
    """
    from dsa_export.ops.moe_onnx import moe_experts_fp8_function, moe_experts_function

    functions = [_indexer_function(opset), _sparse_attention_function(opset), moe_experts_function(opset)]
    if opset >= MOE_EXPERTS_FP8.min_opset:
        functions.append(moe_experts_fp8_function(opset, fp8_body))
    return functions


def _checked_activation(activation: str) -> str:
    from dsa_export.errors import DSAUserError

    if activation not in MOE_ACTIVATIONS:
        raise DSAUserError(f"the routed-experts op supports activation {', '.join(MOE_ACTIVATIONS)}, not "
                           f"{activation!r}; use a model with SiLU experts.")
    return activation


def translation_table() -> dict:
    """``custom_translation_table`` for :func:`torch.onnx.export` emitting ``dsa`` nodes."""
    import onnxscript
    import torch

    register_schemas()
    import dsa_export.ops.torch_ops  # noqa: F401  (registers torch.ops.dsa)

    dsa = onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)
    op = onnxscript.opset18

    def indexer_topk(q, k, w, lengths, topk: int, scale: float, causal: bool):
        if lengths is None:
            # The function body reads lengths; with no padding every key of the row is valid.
            t_len = op.Gather(op.Shape(k), op.Constant(value_ints=[1]), axis=0)
            batch = op.Gather(op.Shape(k), op.Constant(value_ints=[0]), axis=0)
            lengths = op.Expand(op.Cast(t_len, to=TensorProto.INT32), batch)
        return dsa.DSAIndexerTopK(q, k, w, lengths, topk=topk, scale=scale, causal=int(causal),
                                  **PLUGIN_ATTRIBUTES)

    def sparse_attention(q, k, v, indices, scale: float):
        return dsa.DSASparseAttention(q, k, v, indices, scale=scale, **PLUGIN_ATTRIBUTES)

    def moe_experts(x, topk_ids, topk_weights, gate_up, down, activation: str = "silu"):
        return dsa.DSAMoEExperts(x, topk_ids, topk_weights, gate_up, down, activation=_checked_activation(activation),
                                 **PLUGIN_ATTRIBUTES)

    def moe_experts_fp8(x, topk_ids, topk_weights, gate_up, down, gate_up_scale, down_scale, block_size: int = 128,
                        activation: str = "silu"):
        return dsa.DSAMoEExpertsFP8(x, topk_ids, topk_weights, gate_up, down, gate_up_scale, down_scale,
                                    activation=_checked_activation(activation), block_size=int(block_size),
                                    **PLUGIN_ATTRIBUTES)

    return {
        torch.ops.dsa.indexer_topk.default: indexer_topk,
        torch.ops.dsa.sparse_attention.default: sparse_attention,
        torch.ops.dsa.moe_experts.default: moe_experts,
        torch.ops.dsa.moe_experts_fp8.default: moe_experts_fp8,
    }
