"""The op contract of the ``dsa`` ONNX domain (version 1), as data.

This module is the bottom of the package: the exporter, the ONNX schemas, the references, the
runtimes and the plugin library all read op names, attributes and I/O from here, so the contract
is written down once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DOMAIN = "dsa"
DOMAIN_VERSION = 1
PLUGIN_NAMESPACE = "dsa"
PLUGIN_VERSION = "1"

#: Attributes every custom node carries so that TensorRT (10.15+) picks the registered plugin.
PLUGIN_ATTRIBUTES = {"plugin_namespace": PLUGIN_NAMESPACE, "plugin_version": PLUGIN_VERSION}

FLOAT_TYPES = ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")


@dataclass(frozen=True)
class TensorSpec:
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
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attributes: tuple[AttrSpec, ...]
    torch_name: str = ""  # the torch.library op, "dsa::<torch_name>"
    plugin_attributes: tuple[AttrSpec, ...] = field(
        default=(
            AttrSpec("plugin_namespace", "string", PLUGIN_NAMESPACE, "TensorRT plugin namespace."),
            AttrSpec("plugin_version", "string", PLUGIN_VERSION, "TensorRT plugin version."),
        )
    )

    @property
    def qualified_name(self) -> str:
        return f"{DOMAIN}::{self.name}"


INDEXER_TOPK = OpSpec(
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
        TensorSpec("q", "[B,S,H_I,D]", FLOAT_TYPES, doc="Indexer queries."),
        TensorSpec("k", "[B,T,D]", FLOAT_TYPES, doc="Indexer keys, one per token shared by all heads."),
        # w has its own type: the models compute weights_proj in float32 (transformers keeps it in
        # float32 even in bf16 checkpoints) while q and k are half precision.
        TensorSpec("w", "[B,S,H_I]", FLOAT_TYPES, type_var="TW",
                   doc="Per-head weights of each query (float32, or q's dtype)."),
        TensorSpec("lengths", "[B]", ("tensor(int32)",), optional=True, doc="Valid keys per batch row."),
    ),
    outputs=(TensorSpec("indices", "[B,S,topk]", ("tensor(int32)",), doc="Selected key positions, -1 padded."),),
    attributes=(
        AttrSpec("topk", "int", None, "Number of keys to select per query."),
        AttrSpec("scale", "float", None, "Scale inside the ReLU (index_head_dim ** -0.5)."),
        AttrSpec("causal", "int", 1, "1: query at T-S+s selects keys t <= T-S+s only."),
    ),
)

SPARSE_ATTENTION = OpSpec(
    name="DSASparseAttention",
    torch_name="sparse_attention",
    doc=(
        "Attention of every query head over the keys selected for its query (shared by all heads): "
        "out[b,s,h] = softmax_j(scale * q[b,s,h] . k[b,i_j,g(h)]) @ v[b,i_j,g(h)] over the valid "
        "indices i_j (entries of -1 or outside [0,T) are skipped), g(h) = h // (H / Hkv). A row "
        "with no valid index gives zeros. Indices in a row are distinct (as DSAIndexerTopK emits "
        "them). Accumulates in float32; the output has q's dtype."
    ),
    inputs=(
        TensorSpec("q", "[B,S,H,Dk]", FLOAT_TYPES),
        TensorSpec("k", "[B,T,Hkv,Dk]", FLOAT_TYPES),
        TensorSpec("v", "[B,T,Hkv,Dv]", FLOAT_TYPES),
        TensorSpec("indices", "[B,S,K]", ("tensor(int32)",)),
    ),
    outputs=(TensorSpec("out", "[B,S,H,Dv]", FLOAT_TYPES),),
    attributes=(AttrSpec("scale", "float", None, "Softmax scale."),),
)

#: Every op of the domain, by ONNX op_type.
OPS: dict[str, OpSpec] = {spec.name: spec for spec in (INDEXER_TOPK, SPARSE_ATTENTION)}
