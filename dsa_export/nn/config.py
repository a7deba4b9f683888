"""Configuration of the reference DSA language model (:class:`dsa_export.nn.DSACausalLM`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

#: "block", "predictor", "lsh", "gumbel" and "static" are the patterns of dsa_export.nn.patterns.
LAYER_TYPES = ("local", "dsa", "hybrid", "dense", "block", "predictor", "lsh", "gumbel", "static")


@dataclass(frozen=True)
class DSAModelConfig:
    """Every field of the reference model; the defaults are the ``tiny`` demo.

    The layer schedule follows the seed design: sliding-window attention in the lowest layers
    (``local``), DeepSeek Sparse Attention in the middle (``dsa``) and a gated mix of sparse and
    dense attention on top (``hybrid``). ``dense`` is plain causal MLA attention.
    """

    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    layer_types: tuple[str, ...] = ("local", "dsa", "dsa", "hybrid")
    num_heads: int = 4
    #: MLA low-rank query/key-value compression (DeepSeek-V3 attention).
    q_lora_rank: int = 32
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    #: "mqa": queries absorbed into the latent space, one shared latent key/value head (how
    #: DeepSeek serves MLA); "expanded": per-head keys and values (how HF's eager model computes).
    mla_form: str = "mqa"
    mla_rope_interleave: bool = True
    #: Lightning indexer. Tiny models need >= 16 indexer heads to avoid exact score ties.
    index_n_heads: int = 16
    index_head_dim: int = 32
    index_topk: int = 32
    indexer_rope_interleave: bool = False
    #: Sliding-window layers: window length and head size.
    sliding_window: int = 16
    local_head_dim: int = 16
    #: Mixture of experts (DeepSeek-V3 style): with ``moe_experts`` > 0, every layer from index
    #: ``moe_first_dense`` on replaces the dense MLP with a sigmoid-routed MoE block (routed
    #: experts of ``moe_intermediate_size`` through the ``dsa`` op, plus ``moe_shared_experts``).
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_intermediate_size: int = 32
    moe_shared_experts: int = 1
    moe_first_dense: int = 1
    #: Group-limited routing: experts in ``moe_n_group`` groups, tokens pick from ``moe_topk_group``.
    moe_n_group: int = 1
    moe_topk_group: int = 1
    moe_norm_topk_prob: bool = True
    moe_routed_scaling_factor: float = 1.0
    #: Block-sparse layers ("block", "predictor"; heads of local_head_dim): block edge, key blocks
    #: kept per query block, and the predictor's hidden width, per-head feature width and gating.
    block_size: int = 32
    block_topk: int = 4
    predictor_hidden: int = 32
    predictor_dim: int = 16
    predictor_gating: str = "straight-through"
    #: LSH layers ("lsh"): buckets per head (even) and keys kept per query within its bucket.
    lsh_buckets: int = 4
    lsh_topk: int = 32
    #: Gumbel-top-k indexer layers ("gumbel"): noise scale in training mode.
    gumbel_temperature: float = 1.0
    #: Static-pattern layers ("static"): length of the calibration input the patterns are taken
    #: from (rows stored per layer).
    static_max_seq: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    seed: int = 0
    name: str = "custom"
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        bad = [t for t in self.layer_types if t not in LAYER_TYPES]
        if bad:
            raise ValueError(f"unknown layer type(s) {bad}; use {LAYER_TYPES}.")
        if self.mla_form not in ("mqa", "expanded"):
            raise ValueError(f"mla_form must be 'mqa' or 'expanded', not {self.mla_form!r}.")
        if self.qk_rope_head_dim % 2 or self.qk_rope_head_dim > self.index_head_dim:
            raise ValueError("qk_rope_head_dim must be even and at most index_head_dim.")
        if self.qk_rope_head_dim > self.local_head_dim:
            raise ValueError("qk_rope_head_dim must be at most local_head_dim.")
        if min(self.index_topk, self.sliding_window, self.num_heads, self.index_n_heads) < 1:
            raise ValueError("index_topk, sliding_window, num_heads and index_n_heads must be >= 1.")
        if self.moe_experts:
            self._check_moe()
        self._check_patterns()

    def _check_patterns(self) -> None:
        if min(self.block_size, self.block_topk, self.predictor_hidden, self.predictor_dim, self.lsh_topk,
               self.static_max_seq) < 1:
            raise ValueError("block_size, block_topk, predictor_hidden, predictor_dim, lsh_topk and static_max_seq "
                             "must be >= 1.")
        if self.predictor_gating not in ("straight-through", "soft"):
            raise ValueError(f"predictor_gating must be 'straight-through' or 'soft', not {self.predictor_gating!r}.")
        if self.lsh_buckets < 2 or self.lsh_buckets % 2:
            raise ValueError("lsh_buckets must be even and at least 2 (Reformer's argmax over [xR, -xR]).")
        if self.gumbel_temperature <= 0:
            raise ValueError("gumbel_temperature must be positive.")

    def _check_moe(self) -> None:
        e, groups = self.moe_experts, self.moe_n_group
        if e < 1 or groups < 1 or e % groups or not 1 <= self.moe_topk_group <= groups:
            raise ValueError("moe_n_group must divide moe_experts and 1 <= moe_topk_group <= moe_n_group.")
        if groups > 1 and e // groups < 2:
            raise ValueError("group-limited routing needs at least two experts per group.")
        if not 1 <= self.moe_top_k <= self.moe_topk_group * (e // groups):
            raise ValueError("moe_top_k must be between 1 and the experts of the selected groups.")
        if self.moe_intermediate_size < 1 or self.moe_shared_experts < 0 or self.moe_first_dense < 0:
            raise ValueError("moe_intermediate_size must be >= 1, moe_shared_experts and moe_first_dense >= 0.")

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` has a MoE block instead of the dense MLP."""
        return self.moe_experts > 0 and index >= self.moe_first_dense

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def attention_scale(self) -> float:
        return self.qk_head_dim**-0.5

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["layer_types"] = list(self.layer_types)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> DSAModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}.")
        values = dict(data)
        if "layer_types" in values:
            values["layer_types"] = tuple(values["layer_types"])
        return cls(**values)
