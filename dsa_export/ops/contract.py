"""The op contract of the ``dsa`` ONNX domain (version 1), as data.

This module is the bottom of the package: the exporter, the ONNX schemas, the references, the
runtimes and the plugin library all read op names, attributes and I/O from here, so the contract
is written down once.

Ops: the two DeepSeek Sparse Attention ops (``DSAIndexerTopK``, ``DSASparseAttention``) and their
paged-cache forms (``DSAIndexerTopKPaged``, ``DSASparseAttentionPaged``: keys read from a pool of pages
through a per-sequence block table, no plugin yet; ``DSAIndexerTopKPagedFP8``,
``DSASparseAttentionPagedFP8``: the same over FP8 caches stored as uint8 codes with float32 scales,
the serving kernels' layouts), the block-sparse attention of the DSA articles
(``DSABlockSparseAttention``: per-head lists of key blocks, see docs/ops.md) and the routed experts of a mixture-of-experts block (``DSAMoEExperts``, and ``DSAMoEExpertsFP8`` for
DeepSeek's FP8 block-scaled expert weights: an ONNX function body cannot test whether an optional
input is present, so the FP8 form is its own op), and the paged graph's cache write
(``DSAPagedCacheWrite``: ScatterND of a call's tokens into a pool, which the TensorRT plugin does in
place; only a TensorRT build puts it into a graph).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import dsa_export.ops.sizes as _sizes

DOMAIN = "dsa"
DOMAIN_VERSION = 1
PLUGIN_NAMESPACE = "dsa"
PLUGIN_VERSION = "1"

#: Attributes every custom node carries so that TensorRT (10.7+) picks the registered plugin.
PLUGIN_ATTRIBUTES = {"plugin_namespace": PLUGIN_NAMESPACE, "plugin_version": PLUGIN_VERSION}

FLOAT_TYPES = ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")
FP8_TYPES = ("tensor(float8e4m3fn)",)

#: Standard-domain opset of a model without FP8 ops (see docs/ops.md on the default opset).
BASE_OPSET = 18


@dataclass(frozen=True)
class OpTensor:
    name: str
    shape: str  # documentation of the symbolic shape, e.g. "[B,S,H_I,D]"
    types: tuple[str, ...]
    optional: bool = False
    doc: str = ""
    #: Name of the schema's type variable; inputs sharing it must have the same dtype. Empty:
    #: one variable per distinct ``types`` tuple.
    type_var: str = ""


@dataclass(frozen=True)
class AttrSpec:
    name: str
    kind: str  # "int" | "float" | "string"
    default: int | float | str | None = None  # None: required
    doc: str = ""


@dataclass(frozen=True)
class OpSpec:
    name: str
    doc: str
    inputs: tuple[OpTensor, ...]
    outputs: tuple[OpTensor, ...]
    attributes: tuple[AttrSpec, ...]
    torch_name: str = ""  # the torch.library op, "dsa::<torch_name>"
    #: Lowest standard-domain opset its function body can be written in.
    min_opset: int = BASE_OPSET
    #: Whether the plugin library (plugins/) registers a TensorRT plugin creator for the op. An op
    #: without one runs through its function body everywhere, TensorRT included (see docs/ops.md,
    #: "Paged caches"): a build that loads the plugin library must keep that op's body.
    has_plugin: bool = True
    #: ``output_dims(input dims, attrs) -> dims`` of the op's one output (symbolic dims pass
    #: through): what the exporter writes into value_info (:mod:`dsa_export.ops.sizes`).
    output_dims: Callable[[list, dict], list] | None = None
    #: ``workspace_bytes(input shapes, attrs) -> bytes``: peak working memory of the function body
    #: on ONNX Runtime, what the runtimes' and validation's memory estimates add up.
    workspace_bytes: Callable[[list, dict], int] | None = None
    #: Its output is a selection of key positions (a lightning indexer): the one the accuracy
    #: reports compare as top-k overlap and calibration keeps in high precision.
    selects: bool = False
    #: It attends to a selection (indices or block lists) given as an input.
    consumes_selection: bool = False
    plugin_attributes: tuple[AttrSpec, ...] = field(
        default=(
            AttrSpec("plugin_namespace", "string", PLUGIN_NAMESPACE, "TensorRT plugin namespace."),
            AttrSpec("plugin_version", "string", PLUGIN_VERSION, "TensorRT plugin version."),
        )
    )

    @property
    def qualified_name(self) -> str:
        return f"{DOMAIN}::{self.name}"

    @property
    def output_type_input(self) -> int | None:
        """Index of the input whose dtype the (first) output has: the one sharing its type
        variable; None when the output has one fixed type (the indexers' int32 positions)."""
        out = self.outputs[0]
        if len(out.types) == 1:
            return None
        key = out.type_var or out.types
        return next(i for i, t in enumerate(self.inputs) if (t.type_var or t.types) == key)


INDEXER_TOPK = OpSpec(
    output_dims=_sizes.selection_dims, workspace_bytes=_sizes.indexer_bytes, selects=True,
    name="DSAIndexerTopK",
    torch_name="indexer_topk",
    doc=(
        "Lightning indexer + top-k of DeepSeek Sparse Attention. "
        "score[b,s,t] = sum_h w[b,s,h] * ReLU(scale * q[b,s,h,:] . k[b,t,:]); query s sits at absolute "
        "position T-S+s and, when causal, may select keys t <= T-S+s; keys t >= lengths[b] are never "
        "selected. Output: the positions of the min(topk, allowed) highest-scoring keys, -1 in the "
        "remaining slots. Order within a row is unspecified."
    ),
    inputs=(
        OpTensor("q", "[B,S,H_I,D]", FLOAT_TYPES, doc="Indexer queries."),
        OpTensor("k", "[B,T,D]", FLOAT_TYPES, doc="Indexer keys, one per token shared by all heads."),
        # w has its own type: the models compute weights_proj in float32 (transformers keeps it in
        # float32 even in bf16 checkpoints) while q and k are half precision.
        OpTensor("w", "[B,S,H_I]", FLOAT_TYPES, type_var="TW",
                   doc="Per-head weights of each query (float32, or q's dtype)."),
        OpTensor("lengths", "[B]", ("tensor(int32)",), optional=True, doc="Valid keys per batch row."),
    ),
    outputs=(OpTensor("indices", "[B,S,topk]", ("tensor(int32)",), doc="Selected key positions, -1 padded."),),
    attributes=(
        AttrSpec("topk", "int", None, "Number of keys to select per query."),
        AttrSpec("scale", "float", None, "Scale inside the ReLU (index_head_dim ** -0.5)."),
        AttrSpec("causal", "int", 1, "1: query at T-S+s selects keys t <= T-S+s only."),
    ),
)

SPARSE_ATTENTION = OpSpec(
    output_dims=_sizes.attention_dims, workspace_bytes=_sizes.attention_bytes, consumes_selection=True,
    name="DSASparseAttention",
    torch_name="sparse_attention",
    doc=(
        "Attention of every query head over the keys selected for its query (shared by all heads): "
        "out[b,s,h] = softmax_j(scale * q[b,s,h] . k[b,i_j,g(h)]) @ val[b,i_j,g(h)] over the valid "
        "indices i_j (entries of -1 or outside [0,T) are skipped), g(h) = h // (H / Hkv). The values "
        "val are v, or, when v has no rows ([B,0,Hkv,Dv]), the first Dv channels of the keys "
        "(Dv <= Dk; DeepSeek's absorbed MLA, whose values are the first kv_lora_rank latent channels). "
        "A row with no valid index gives zeros. Indices in a row are distinct (as DSAIndexerTopK emits "
        "them). Accumulates in float32; the output has q's dtype."
    ),
    inputs=(
        OpTensor("q", "[B,S,H,Dk]", FLOAT_TYPES),
        OpTensor("k", "[B,T,Hkv,Dk]", FLOAT_TYPES),
        # Values from keys is an empty v, not an absent one: a function body cannot test whether an
        # optional input is present, and the empty v still carries Dv in its shape, so every
        # consumer that takes the output shape from v (exporter, plugin, fake kernel) stays right.
        OpTensor("v", "[B,T,Hkv,Dv] or [B,0,Hkv,Dv]", FLOAT_TYPES,
                   doc="Values, or no rows: the values are then the first Dv channels of k's rows."),
        OpTensor("indices", "[B,S,K]", ("tensor(int32)",)),
    ),
    outputs=(OpTensor("out", "[B,S,H,Dv]", FLOAT_TYPES),),
    attributes=(AttrSpec("scale", "float", None, "Softmax scale."),),
)

BLOCK_SPARSE_ATTENTION = OpSpec(
    output_dims=_sizes.attention_dims, workspace_bytes=_sizes.block_attention_bytes,
    consumes_selection=True,
    name="DSABlockSparseAttention",
    torch_name="block_sparse_attention",
    doc=(
        "Attention of every query head over the key blocks selected for its query block: query block i "
        "holds queries i*bs .. i*bs+bs-1 (the last one may be shorter), key block j holds keys "
        "j*bs .. min(T, j*bs+bs)-1, and block_index[b,h,i,:] lists the key blocks head h of query block i "
        "attends to. out[b,s,h] = softmax_t(scale * q[b,s,h] . k[b,t,g(h)]) @ v[b,t,g(h)] over the keys t of "
        "the listed blocks, g(h) = h // (H / Hkv); with causal=1 only keys t <= T-S+s (query s sits at "
        "absolute position T-S+s). Entries outside [0, ceil(T/bs)) (-1 pads) are ignored and a block "
        "listed twice counts once (the row is the set of its listed blocks). A row with no allowed key "
        "gives zeros. Accumulates in float32; the output has q's dtype."
    ),
    inputs=(
        OpTensor("q", "[B,S,H,Dk]", FLOAT_TYPES),
        OpTensor("k", "[B,T,Hkv,Dk]", FLOAT_TYPES),
        OpTensor("v", "[B,T,Hkv,Dv]", FLOAT_TYPES),
        OpTensor("block_index", "[B,H,ceil(S/bs),Kb]", ("tensor(int32)",),
                   doc="Key blocks of each (head, query block), -1 padded."),
    ),
    outputs=(OpTensor("out", "[B,S,H,Dv]", FLOAT_TYPES),),
    attributes=(
        AttrSpec("block_size", "int", None, "Edge bs of the square blocks (queries and keys)."),
        AttrSpec("scale", "float", None, "Softmax scale."),
        AttrSpec("causal", "int", 1, "1: query at T-S+s attends to keys t <= T-S+s only, inside its blocks."),
    ),
)


_PAGED_DOC = (
    " Paged cache: the keys live in a pool of pages allocated once (k_pool [P,page,...], P >= 1) and "
    "block_table[b, j] names the page that holds the logical positions j*page .. j*page+page-1 of row b, so "
    "logical key t of row b is k_pool[block_table[b, t // page], t % page] for t < M*page; a block_table "
    "entry outside [0,P) makes its page's keys invalid. Indices are logical positions."
)

#: Inputs and outputs every paged op (or every paged indexer) shares.
_BLOCK_TABLE = OpTensor("block_table", "[B,M]", ("tensor(int32)",), doc="Page of each block of page positions, per row.")
_QUERY_START = OpTensor("query_start", "[B]", ("tensor(int32)",), doc="Logical position of each row's first query.")
_LENGTHS = OpTensor("lengths", "[B]", ("tensor(int32)",), doc="Valid keys per row (logical positions < lengths[b]).")
_INDEXER_Q = OpTensor("q", "[B,S,H_I,D]", FLOAT_TYPES, doc="Indexer queries.")
_INDEXER_W = OpTensor("w", "[B,S,H_I]", FLOAT_TYPES, type_var="TW",
                      doc="Per-head weights of each query (float32, or q's dtype).")
_SELECTION = OpTensor("indices", "[B,S,K]", ("tensor(int32)",), doc="Selected logical key positions, -1 padded.")
_PAGED_INDICES = OpTensor("indices", "[B,S,topk]", ("tensor(int32)",), doc="Selected logical key positions, -1 padded.")

INDEXER_TOPK_PAGED = OpSpec(
    output_dims=_sizes.selection_dims, workspace_bytes=_sizes.indexer_paged_bytes, selects=True,
    name="DSAIndexerTopKPaged",
    torch_name="indexer_topk_paged",
    doc=(
        "DSAIndexerTopK over a paged key cache. score[b,s,t] = sum_h w[b,s,h] * ReLU(scale * q[b,s,h,:] . "
        "key[b,t,:]) with key[b,t] the logical key t of row b; query s of row b sits at logical position "
        "query_start[b] + s (each row its own past length: ragged batches) and selects among the keys "
        "t < min(lengths[b], M*page) whose page entry is valid and, when causal, t <= query_start[b] + s. "
        "Output: the logical positions of the min(topk, allowed) highest-scoring keys, ties to the lower "
        "position, -1 in the remaining slots; order within a row is unspecified." + _PAGED_DOC
    ),
    inputs=(
        _INDEXER_Q,
        OpTensor("k_pool", "[P,page,D]", FLOAT_TYPES, doc="Pool of indexer-key pages (q's dtype)."),
        _INDEXER_W, _BLOCK_TABLE, _QUERY_START, _LENGTHS,
    ),
    outputs=(_PAGED_INDICES,),
    attributes=(
        AttrSpec("topk", "int", None, "Number of keys to select per query."),
        AttrSpec("scale", "float", None, "Scale inside the ReLU (index_head_dim ** -0.5)."),
        AttrSpec("causal", "int", 1, "1: query at query_start[b]+s selects keys t <= query_start[b]+s only."),
    ),
)

SPARSE_ATTENTION_PAGED = OpSpec(
    output_dims=_sizes.attention_dims, workspace_bytes=_sizes.attention_paged_bytes,
    consumes_selection=True,
    name="DSASparseAttentionPaged",
    torch_name="sparse_attention_paged",
    doc=(
        "DSASparseAttention over a paged key/value cache: out[b,s,h] = softmax_j(scale * q[b,s,h] . "
        "key[b,i_j,g(h)]) @ val[b,i_j,g(h)] over the valid logical indices i_j, g(h) = h // (H / Hkv), with "
        "key[b,t] the logical key t of row b. An index is skipped when it is < 0 or >= M*page or its page "
        "entry is invalid. The values are v_pool's (same pages as k_pool), or, when v_pool has no pages "
        "([0,page,Hkv,Dv]), the first Dv channels of the keys (Dv <= Dk; DeepSeek's absorbed MLA). A row with "
        "no valid index gives zeros. Indices in a row are distinct. Accumulates in float32; the output has "
        "q's dtype." + _PAGED_DOC
    ),
    inputs=(
        OpTensor("q", "[B,S,H,Dk]", FLOAT_TYPES),
        OpTensor("k_pool", "[P,page,Hkv,Dk]", FLOAT_TYPES, doc="Pool of key pages."),
        OpTensor("v_pool", "[P,page,Hkv,Dv] or [0,page,Hkv,Dv]", FLOAT_TYPES,
                   doc="Pool of value pages, or no pages: the values are then the first Dv channels of the keys."),
        _SELECTION, _BLOCK_TABLE,
    ),
    outputs=(OpTensor("out", "[B,S,H,Dv]", FLOAT_TYPES),),
    attributes=(AttrSpec("scale", "float", None, "Softmax scale."),),
)


UINT8_TYPES = ("tensor(uint8)",)

_FP8_CACHE_DOC = (
    " FP8 cache: the codes are stored as uint8 bit patterns of float8 e4m3fn values (ONNX's ScatterND, "
    "Gather, Concat and Where take no float8 tensors); decode(code) is the float value of the pattern "
    "(0x7F and 0xFF are NaN; an encoder never writes them) and a decoded value is the float32 product "
    "decode(code) * scale."
)

INDEXER_TOPK_PAGED_FP8 = OpSpec(
    output_dims=_sizes.selection_dims, workspace_bytes=_sizes.indexer_paged_fp8_bytes, selects=True,
    name="DSAIndexerTopKPagedFP8",
    torch_name="indexer_topk_paged_fp8",
    doc=(
        "DSAIndexerTopKPaged over an FP8 index-key cache (DeepGEMM's layout): the key of a pool slot is "
        "float32(decode(k_pool[p, i, :]) * k_scale_pool[p, i, 0]), one scale per token; selection exactly "
        "DSAIndexerTopKPaged's on those keys." + _FP8_CACHE_DOC + _PAGED_DOC
    ),
    inputs=(
        _INDEXER_Q,
        OpTensor("k_pool", "[P,page,D]", UINT8_TYPES, doc="Pool of indexer-key pages: e4m3fn bit patterns."),
        OpTensor("k_scale_pool", "[P,page,1]", ("tensor(float)",), type_var="TS",
                   doc="Scale of each pool slot's key (key = decode(code) * scale)."),
        _INDEXER_W, _BLOCK_TABLE, _QUERY_START, _LENGTHS,
    ),
    outputs=(_PAGED_INDICES,),
    attributes=INDEXER_TOPK_PAGED.attributes,
    has_plugin=False,
)

SPARSE_ATTENTION_PAGED_FP8 = OpSpec(
    output_dims=_sizes.attention_fp8_dims, workspace_bytes=_sizes.attention_paged_fp8_bytes,
    consumes_selection=True,
    name="DSASparseAttentionPagedFP8",
    torch_name="sparse_attention_paged_fp8",
    doc=(
        "DSASparseAttentionPaged over an FP8 latent cache (FlashMLA's layout, DeepSeek's absorbed MLA): the "
        "key row of a pool slot (kv head g) is concat(decode(k_pool[p, i, g, :]) * its block scales, "
        "k_rope_pool[p, i, g, :]) of width C+R, channel c of the first C scaled by k_scale_pool[p, i, g, "
        "c // block_size]; the values are the decoded first C channels (Dv = C). out[b,s,h] = "
        "softmax_j(scale * q[b,s,h] . key[b,i_j,g(h)]) @ val[b,i_j,g(h)] over the valid logical indices, "
        "skipped and invalid exactly as in DSASparseAttentionPaged; a row with no valid index gives zeros. "
        "Accumulates in float32; the output has q's dtype." + _FP8_CACHE_DOC + _PAGED_DOC
    ),
    inputs=(
        OpTensor("q", "[B,S,H,C+R]", FLOAT_TYPES),
        OpTensor("k_pool", "[P,page,Hkv,C]", UINT8_TYPES,
                   doc="Pool of latent pages: e4m3fn bit patterns of the first C (nope) channels."),
        OpTensor("k_scale_pool", "[P,page,Hkv,C/block_size]", ("tensor(float)",), type_var="TS",
                   doc="One scale per block_size channels of each pool slot's codes."),
        OpTensor("k_rope_pool", "[P,page,Hkv,R]", FLOAT_TYPES, type_var="TR",
                   doc="The R RoPE channels of each pool slot, unquantized (bfloat16 in serving)."),
        _SELECTION, _BLOCK_TABLE,
    ),
    outputs=(OpTensor("out", "[B,S,H,C]", FLOAT_TYPES),),
    attributes=(
        AttrSpec("scale", "float", None, "Softmax scale."),
        AttrSpec("block_size", "int", 128, "Channels per scale of k_scale_pool (C is a multiple of it)."),
    ),
    has_plugin=False,
)


PAGED_CACHE_WRITE = OpSpec(
    output_dims=_sizes.pool_dims,
    name="DSAPagedCacheWrite",
    doc=(
        "The paged graph's cache write: present = pool with present[indices[b,s,0], indices[b,s,1], :] = "
        "updates[b,s,:] for every (b, s) whose page lies in [0,P) and offset in [0,page); every other (b, s) "
        "is skipped, and every other slot keeps pool's values. Tokens naming the same slot (only the padding "
        "tokens on the scratch slot, page 0 offset 0) leave one of their values in each element. Its function "
        "body is ONNX ScatterND(pool, indices, updates). Not emitted by the exporter: a TensorRT build with the "
        "plugin library puts it in place of the ScatterND that writes a past_*_pool graph input into its "
        "present_*_pool graph output (dsa_export.ops.paged_write_onnx), and the plugin writes the pool in place "
        "(its output aliases input 0)."
    ),
    inputs=(
        OpTensor("pool", "[P,page,W]", FLOAT_TYPES, type_var="T", doc="A cache pool (float32/float16/bfloat16)."),
        OpTensor("indices", "[B,S,2]", ("tensor(int64)",), doc="(page, offset) of each new token."),
        OpTensor("updates", "[B,S,W]", FLOAT_TYPES, type_var="T", doc="The new tokens' rows (pool's dtype)."),
    ),
    outputs=(OpTensor("present", "[P,page,W]", FLOAT_TYPES, type_var="T", doc="The pool with the tokens written."),),
    attributes=(),
)


def block_count(length: int, block_size: int) -> int:
    """Blocks of ``block_size`` covering ``length`` positions (the last one may be partial).

    Plain arithmetic, so a symbolic length (torch.export) stays symbolic.
    """
    return (length + block_size - 1) // block_size


_MOE_DOC = (
    "Routed experts of a mixture-of-experts block: out[n] = sum_k topk_weights[n,k] * "
    "down[e] @ (act(gate[e] @ x[n]) * (up[e] @ x[n])), e = topk_ids[n,k], where gate[e] and up[e] "
    "are rows 0..I-1 and I..2I-1 of gate_up[e] (transformers' packing). Slots whose id lies "
    "outside [0,E) are skipped (-1 marks an empty slot); an expert that appears twice in a row "
    "contributes twice. Accumulates in float32; the output has x's dtype."
)

_MOE_INPUTS = (
    OpTensor("x", "[N,H]", FLOAT_TYPES, type_var="T", doc="Token activations, tokens flattened."),
    OpTensor("topk_ids", "[N,K]", ("tensor(int32)",), doc="Expert of each routing slot; outside [0,E): skipped."),
    # The routers compute their weights in float32 (transformers does so in bf16 checkpoints too).
    OpTensor("topk_weights", "[N,K]", FLOAT_TYPES, type_var="TW",
               doc="Weight of each routing slot (float32, or x's dtype)."),
)

_ACTIVATION = AttrSpec("activation", "string", "silu", "Activation of the gate projection; only 'silu'.")

#: The activations the op (every implementation) supports.
MOE_ACTIVATIONS = ("silu",)


def check_activation(activation, error: type[Exception] = ValueError) -> str:
    """The routed-experts ``activation`` attribute as text (ONNX hands bytes), refused with one
    sentence when the contract does not define it: the one check every form of the op (torch op,
    reference, ONNX translation, checked wrapper) calls; ``error`` is the exception to raise
    (:class:`~dsa_export.errors.DSAUserError` where a user's model is at fault)."""
    text = activation.decode() if isinstance(activation, bytes) else str(activation)
    if text not in MOE_ACTIVATIONS:
        raise error(f"activation {text!r} is not supported by the routed-experts op; use one of "
                    f"{', '.join(MOE_ACTIVATIONS)} (a model with SiLU experts).")
    return text

MOE_EXPERTS = OpSpec(
    output_dims=_sizes.experts_dims, workspace_bytes=_sizes.experts_bytes,
    name="DSAMoEExperts",
    torch_name="moe_experts",
    doc=_MOE_DOC,
    inputs=(
        *_MOE_INPUTS,
        OpTensor("gate_up", "[E,2I,H]", FLOAT_TYPES, type_var="T",
                   doc="Gate (rows 0..I-1) and up (rows I..2I-1) projections of every expert, x's dtype."),
        OpTensor("down", "[E,H,I]", FLOAT_TYPES, type_var="T", doc="Down projection of every expert, x's dtype."),
    ),
    outputs=(OpTensor("out", "[N,H]", FLOAT_TYPES, type_var="T"),),
    attributes=(_ACTIVATION,),
)

MOE_EXPERTS_FP8 = OpSpec(
    output_dims=_sizes.experts_dims, workspace_bytes=_sizes.experts_bytes,
    name="DSAMoEExpertsFP8",
    torch_name="moe_experts_fp8",
    doc=_MOE_DOC + (
        " gate_up and down are float8e4m3fn with one float32 scale per (block_size x block_size) "
        "block (DeepSeek's weight_scale_inv layout): weight = fp8 value * scale of its block; the "
        "last block of a dimension that is not a multiple of block_size is partial."
    ),
    inputs=(
        *_MOE_INPUTS,
        OpTensor("gate_up", "[E,2I,H]", FP8_TYPES, type_var="TQ", doc="FP8 gate/up projections."),
        OpTensor("down", "[E,H,I]", FP8_TYPES, type_var="TQ", doc="FP8 down projections."),
        OpTensor("gate_up_scale", "[E,ceil(2I/bs),ceil(H/bs)]", ("tensor(float)",), type_var="TS",
                   doc="Block scales of gate_up."),
        OpTensor("down_scale", "[E,ceil(H/bs),ceil(I/bs)]", ("tensor(float)",), type_var="TS",
                   doc="Block scales of down."),
    ),
    outputs=(OpTensor("out", "[N,H]", FLOAT_TYPES, type_var="T"),),
    attributes=(_ACTIVATION, AttrSpec("block_size", "int", 128, "Edge of the square scale blocks.")),
    # float8 tensors and blocked DequantizeLinear need opset 21.
    min_opset=21,
)

#: Every op of the domain, by ONNX op_type.
OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (INDEXER_TOPK, SPARSE_ATTENTION, BLOCK_SPARSE_ATTENTION, MOE_EXPERTS, MOE_EXPERTS_FP8,
                 INDEXER_TOPK_PAGED, SPARSE_ATTENTION_PAGED, INDEXER_TOPK_PAGED_FP8, SPARSE_ATTENTION_PAGED_FP8,
                 PAGED_CACHE_WRITE)
}

#: The ops the plugin library registers a creator for (``has_plugin``): the plugin layers a
#: TensorRT build with the library loaded must contain, one per node of these types.
PLUGIN_OPS: dict[str, OpSpec] = {name: spec for name, spec in OPS.items() if spec.has_plugin}

#: The ops whose output is a selection of key positions (the lightning indexers, contiguous and paged).
SELECTING_OPS: tuple[str, ...] = tuple(name for name, spec in OPS.items() if spec.selects)
#: The ops that attend to a selection given as an input.
SELECTION_CONSUMERS: tuple[str, ...] = tuple(name for name, spec in OPS.items() if spec.consumes_selection)
