"""The ONNX side of the ``dsa`` ops: schemas, FunctionProto bodies and exporter translations.

* :func:`register_schemas` registers an :class:`onnx.defs.OpSchema` per op so ``onnx.checker``
  (full check) and the onnxscript-based exporter accept ``dsa`` nodes.
* :func:`function_protos` builds one local function per op with only standard ONNX ops. ONNX
  Runtime and the TensorRT(-RTX) parser execute a node through it when no plugin is registered;
  the bodies written into files are ones TensorRT(-RTX) builds as they are, and
  :func:`use_onnxruntime_bodies` gives our ONNX Runtime sessions the faster trimmed attention.
  The DSA bodies (:mod:`dsa_export.ops.attention_onnx`, and :mod:`dsa_export.ops.paged_onnx` for
  their paged-cache forms) loop over chunks of queries, so their memory is one chunk's (never
  ``[B,S,T]``); so does the block-sparse body
  (:mod:`dsa_export.ops.block_onnx`) over chunks of query blocks; the routed-experts bodies
  (:mod:`dsa_export.ops.moe_onnx`) loop over the active experts and tiles of their tokens.
* :func:`translation_table` maps the torch custom ops to onnxscript functions emitting the nodes.
"""

from __future__ import annotations

import functools

import onnx
from onnx import FunctionProto, TensorProto, helper

from dsa_export.ops.contract import (
    DOMAIN,
    DOMAIN_VERSION,
    MOE_EXPERTS_FP8,
    OPS,
    PLUGIN_ATTRIBUTES,
    OpSpec,
    check_activation,
)


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


def function_protos(opset: int, *, fp8_body: str = "expert") -> list[FunctionProto]:
    """The local functions of the ``dsa`` ops whose body ``opset`` can express.

    DSAMoEExpertsFP8 needs opset 21 (float8 tensors, blocked DequantizeLinear); below that it has
    no body and a model using it must be exported at a higher opset. ``fp8_body`` picks its
    construction: ``expert`` (one expert dequantized at a time, for ONNX Runtime) or ``stack``
    (the one TensorRT(-RTX) can build), see :mod:`dsa_export.ops.moe_onnx`.
    """
    from dsa_export.ops.attention_onnx import indexer_function, sparse_attention_function
    from dsa_export.ops.block_onnx import block_sparse_attention_function
    from dsa_export.ops.moe_onnx import moe_experts_fp8_function, moe_experts_function
    from dsa_export.ops.paged_onnx import (
        indexer_paged_fp8_function,
        indexer_paged_function,
        sparse_attention_paged_fp8_function,
        sparse_attention_paged_function,
    )
    from dsa_export.ops.paged_write_onnx import paged_cache_write_function

    functions = [indexer_function(opset), sparse_attention_function(opset), block_sparse_attention_function(opset),
                 moe_experts_function(opset), indexer_paged_function(opset), sparse_attention_paged_function(opset),
                 indexer_paged_fp8_function(opset), sparse_attention_paged_fp8_function(opset),
                 paged_cache_write_function(opset)]
    if opset >= MOE_EXPERTS_FP8.min_opset:
        functions.append(moe_experts_fp8_function(opset, fp8_body))
    return functions


def _checked_activation(activation: str) -> str:
    from dsa_export.errors import DSAUserError

    return check_activation(activation, DSAUserError)


def translation_table() -> dict:
    """``custom_translation_table`` for :func:`torch.onnx.export` emitting ``dsa`` nodes."""
    import onnxscript
    import torch

    register_schemas()
    import dsa_export.ops.block_torch  # noqa: F401  (registers torch.ops.dsa.block_sparse_attention)
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

    def indexer_topk_paged(q, k_pool, w, block_table, query_start, lengths, topk: int, scale: float, causal: bool):
        return dsa.DSAIndexerTopKPaged(q, k_pool, w, block_table, query_start, lengths, topk=topk, scale=scale,
                                       causal=int(causal), **PLUGIN_ATTRIBUTES)

    def sparse_attention_paged(q, k_pool, v_pool, indices, block_table, scale: float):
        return dsa.DSASparseAttentionPaged(q, k_pool, v_pool, indices, block_table, scale=scale, **PLUGIN_ATTRIBUTES)

    def indexer_topk_paged_fp8(q, k_pool, k_scale_pool, w, block_table, query_start, lengths, topk: int,
                               scale: float, causal: bool):
        return dsa.DSAIndexerTopKPagedFP8(q, k_pool, k_scale_pool, w, block_table, query_start, lengths, topk=topk,
                                          scale=scale, causal=int(causal), **PLUGIN_ATTRIBUTES)

    def sparse_attention_paged_fp8(q, k_pool, k_scale_pool, k_rope_pool, indices, block_table, scale: float,
                                   block_size: int = 128):
        return dsa.DSASparseAttentionPagedFP8(q, k_pool, k_scale_pool, k_rope_pool, indices, block_table, scale=scale,
                                              block_size=int(block_size), **PLUGIN_ATTRIBUTES)

    def block_sparse_attention(q, k, v, block_index, block_size: int, scale: float, causal: bool):
        return dsa.DSABlockSparseAttention(q, k, v, block_index, block_size=int(block_size), scale=scale,
                                           causal=int(causal), **PLUGIN_ATTRIBUTES)

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
        torch.ops.dsa.indexer_topk_paged.default: indexer_topk_paged,
        torch.ops.dsa.sparse_attention_paged.default: sparse_attention_paged,
        torch.ops.dsa.indexer_topk_paged_fp8.default: indexer_topk_paged_fp8,
        torch.ops.dsa.sparse_attention_paged_fp8.default: sparse_attention_paged_fp8,
        torch.ops.dsa.block_sparse_attention.default: block_sparse_attention,
        torch.ops.dsa.moe_experts.default: moe_experts,
        torch.ops.dsa.moe_experts_fp8.default: moe_experts_fp8,
    }


def use_tensorrt_bodies(model) -> bool:
    """Swap, in place, the function bodies TensorRT(-RTX)'s parser cannot build for the ones it
    can: the static sparse-attention chunks (what exported files carry already; files of older
    exports may hold the trimmed ones), the stacked FP8 experts and the FP8-cache paged bodies
    that cast the uint8 code pool first (TensorRT takes uint8 only into a Cast, see
    :data:`dsa_export.ops.paged_onnx.FP8_CACHE_BODIES`). Returns whether any was swapped (both
    parsers, :mod:`dsa_export.trt.rtx` and :mod:`dsa_export.trt.tensorrt`, call this before parsing).
    The full-TensorRT build with the plugin library also turns the paged graph's pool writes into
    in-place DSAPagedCacheWrite nodes (:func:`dsa_export.ops.paged_write_onnx.use_paged_cache_write`);
    TensorRT-RTX, which has no plugins, keeps their ScatterND."""
    from dsa_export.ops.attention_onnx import use_attention_body
    from dsa_export.ops.moe_onnx import use_fp8_body
    from dsa_export.ops.paged_onnx import use_fp8_cache_bodies, use_whole_row_indexer

    swapped = use_attention_body(model, "static")
    swapped = use_whole_row_indexer(model) or swapped
    swapped = use_fp8_cache_bodies(model, "cast") or swapped
    return use_fp8_body(model, "stack") or swapped


def use_onnxruntime_bodies(model) -> bool:
    """Swap, in place, the sparse-attention body of a plugin-mode file for the ``trimmed`` one,
    which ONNX Runtime runs faster (it skips the slots after a chunk's last valid index, most of
    them on prompts shorter than K) with the same values; TensorRT cannot build it, so files carry
    the ``static`` one. The routed experts' body likewise becomes ``dense`` (decode-sized calls
    multiply the expert stacks in place; TensorRT-RTX fails to build it in bf16, so files carry
    ``loop``). Every ONNX Runtime session dsa-export opens on a file applies this
    (:func:`dsa_export.runtime.onnxrt.session`, the artifact's optimized model, calibration).
    Returns whether the model has either function (a ``native`` file has none: nothing to swap)."""
    from dsa_export.ops.attention_onnx import use_attention_body
    from dsa_export.ops.moe_onnx import use_moe_body

    attention = use_attention_body(model, "trimmed")
    return use_moe_body(model, "dense") or attention
