"""Settings of the benchmark stage: the layer that is timed and how it is timed, defaults written once."""

from __future__ import annotations

from dataclasses import dataclass

#: Backends ``dsa-export bench`` knows. ``cuda`` runs the plugin kernels through their C ABI and
#: needs a CUDA GPU plus the built kernel library.
BACKENDS = ("torch", "onnxruntime", "cuda")
DEFAULT_BACKENDS = ("torch", "onnxruntime")
DEFAULT_SEQ_LENS = (1024, 4096, 16384)
#: The sizes that finish in about 1-2 minutes on two CPU cores (the documented quick set).
QUICK_SEQ_LENS = (1024, 2048, 4096, 8192)
#: Longest L sent to ONNX Runtime unless raised: the dense export holds [B,H,S,T] scores (1 GiB per
#: 16 heads at S = 4096, 4 GiB at 8192) and takes seconds per call there; the DSA bodies run in
#: chunks of bounded memory (measured: under 0.5 GiB at 32K), so raise it to time them further.
DEFAULT_MAX_ONNXRUNTIME_SEQ = 4096
#: Seconds one call may take (predicted or measured) before a curve's longer lengths are skipped.
DEFAULT_TIME_BUDGET_S = 600.0
#: The layers ``--case attention`` times, all with the same q/k/v/o weights: ``dsa`` (lightning
#: indexer + top-k + sparse attention), ``dense`` (causal SDPA), ``block`` (block-sparse attention
#: over key blocks chosen from mean-pooled scores, the built-in ``block`` model's layer) and ``lsh``
#: (Reformer LSH buckets, the built-in ``lsh`` model's layer).
VARIANTS = ("dsa", "dense", "block", "lsh")
#: All four by default: the report's claims rows for the block-sparse and LSH designs need them.
DEFAULT_VARIANTS = VARIANTS
#: Layers that attend to a selection (their sparsity is measured); ``dense`` attends to every key.
SELECTION_VARIANTS = ("dsa", "block", "lsh")
#: Block sizes whose CSR storage the report computes for the block layer's selections (the
#: articles' 32x32 claim and their 64x64 blocks), whatever ``block_size`` is timed.
CSR_BLOCK_SIZES = (32, 64)


@dataclass(frozen=True)
class BlockConfig:
    """Shapes of the attention layer that is timed (one layer, batch 1 unless ``batch`` says so).

    The DSA variant is: q/k/v projections (``heads`` query heads and ``kv_heads`` key/value heads of
    ``head_dim``; the default single kv head is the MQA form in which DeepSeek serves MLA),
    the lightning indexer (``index_heads`` x ``index_head_dim`` queries, one shared LayerNorm'd
    key per token, per-head weights), top-``topk`` selection, sparse attention over the selected
    keys, output projection. The dense variant shares every weight and replaces indexer + top-k +
    sparse attention with causal softmax attention over all earlier keys. RoPE is left out: it is
    O(L) and identical in every variant.

    The ``block`` variant attends, per query head and block of ``block_size`` queries, to the
    ``blocks_per_query_block`` key blocks whose mean-pooled keys score highest against its
    mean-pooled queries (the diagonal block always among them; the built-in ``block`` model's
    selection), through DSABlockSparseAttention. The ``lsh`` variant is Reformer's shared-QK LSH
    attention of the built-in ``lsh`` model: each head's queries are also its (unit-norm) keys,
    hashed into ``lsh_buckets`` buckets by seeded random rotations; each query attends to the
    ``topk`` latest keys of its bucket (itself included), through DSASparseAttention with the heads
    folded into the batch; values come from the layer's kv head(s).

    Attributes:
        hidden: model width (input and output features of the layer).
        heads: attention (query) heads.
        kv_heads: key/value heads, a divisor of ``heads``; 1 is MQA (MLA's absorbed form).
        head_dim: query/key and value size per head.
        index_heads: lightning-indexer heads.
        index_head_dim: lightning-indexer query/key size.
        topk: keys each query attends to in the DSA variant, and at most in the LSH variant.
        batch: batch size of the timed inputs.
        seed: seed of the weights and inputs.
        block_size: query and key block size of the block variant.
        block_topk: key blocks per query block of the block variant; None: ``topk // block_size``
            (at least 1), so that it attends to as many keys per query as the DSA variant.
        lsh_buckets: LSH buckets per head (even: the hash is ``argmax([xR, -xR])``).
    """

    hidden: int = 1024
    heads: int = 16
    kv_heads: int = 1
    head_dim: int = 64
    index_heads: int = 4
    index_head_dim: int = 64
    topk: int = 512
    batch: int = 1
    seed: int = 0
    block_size: int = 64
    block_topk: int | None = None
    lsh_buckets: int = 8

    def __post_init__(self) -> None:
        for name in ("hidden", "heads", "kv_heads", "head_dim", "index_heads", "index_head_dim", "topk", "batch",
                     "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1.")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads}).")
        if self.block_topk is not None and self.block_topk < 1:
            raise ValueError("block_topk must be at least 1.")
        if self.lsh_buckets < 2 or self.lsh_buckets % 2:
            raise ValueError(f"lsh_buckets must be even and at least 2, not {self.lsh_buckets}.")

    @property
    def blocks_per_query_block(self) -> int:
        """Key blocks each query block of the block variant attends to."""
        return self.block_topk if self.block_topk is not None else max(1, self.topk // self.block_size)

    def blocks_at(self, block_size: int) -> int:
        """Key blocks per query block that attend to as many keys as the timed block variant, at
        another block size (the CSR storage figures at 32x32 and 64x64)."""
        return max(1, self.blocks_per_query_block * self.block_size // block_size)


@dataclass(frozen=True)
class BenchSettings:
    """Everything that shapes one benchmark run.

    Attributes:
        seq_lens: sequence lengths L (prefill: L queries over L keys), run in increasing order.
        backends: which of :data:`BACKENDS` to run, in this order.
        variants: which of :data:`VARIANTS` to time on every backend, in this order (the ratios
            and speed-up claims need ``dense``).
        block: the layer that is timed.
        warmup: untimed calls before the timed ones at every (backend, variant, L) while calls
            are short: once a call at a shorter L took more than ``warmup_below_s`` seconds, longer
            L get none (first-call costs are milliseconds, invisible next to such calls).
        warmup_below_s: see ``warmup``.
        repeats: timed calls at most; the report keeps their median (and min/max).
        case_budget_s: timed calls of one case stop once they have used this many seconds (at
            least one runs), so that slow cases at long L do not run for minutes.
        memory: measure the peak memory of one extra call per case.
        threads: CPU threads for torch and ONNX Runtime; 0 keeps torch's current setting.
        max_onnxruntime_seq: longest L run through ONNX Runtime; longer ones are skipped with a note.
            The DSA file's bodies hold one chunk of queries at a time; the dense file's SDPA holds
            [B,H,L,L] scores, so its cases are also skipped where those would not fit in memory.
        time_budget_s: a call predicted (from the curve's last two lengths) or measured to take
            longer than this is not run; its case says so. The default lets the dense layer run
            at 64K tokens on two cores (about 1-3 minutes) and stops it past that.
    """

    seq_lens: tuple[int, ...] = DEFAULT_SEQ_LENS
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    block: BlockConfig = BlockConfig()
    warmup: int = 1
    warmup_below_s: float = 1.0
    repeats: int = 3
    case_budget_s: float = 10.0
    memory: bool = True
    threads: int = 0
    max_onnxruntime_seq: int = DEFAULT_MAX_ONNXRUNTIME_SEQ
    time_budget_s: float = DEFAULT_TIME_BUDGET_S

    def __post_init__(self) -> None:
        if self.time_budget_s <= 0:
            raise ValueError("the time budget must be positive.")
        if not self.seq_lens or min(self.seq_lens) < 2:
            raise ValueError("sequence lengths must be at least 2.")
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown or not self.backends:
            raise ValueError(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}.")
        if len(set(self.backends)) != len(self.backends):
            raise ValueError("a backend is listed twice.")
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            raise ValueError(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}.")
        if len(set(self.variants)) != len(self.variants):
            raise ValueError("a variant is listed twice.")
        if self.repeats < 1 or self.warmup < 0 or self.threads < 0 or self.case_budget_s <= 0:
            raise ValueError("repeats must be at least 1, warmup and threads at least 0, the case budget positive.")
        object.__setattr__(self, "seq_lens", tuple(sorted(set(self.seq_lens))))


#: What ``dsa-export bench`` times: one attention layer (DSA against dense) or one MoE layer
#: (our routed-experts op against transformers' experts implementations).
CASES = ("attention", "moe")
#: MoE backends: ``ours`` (the block with the routed experts as the ``dsa::moe_experts`` torch op),
#: transformers' ``eager`` and ``batched_mm`` experts in the same block, and ``onnxruntime`` (our
#: block exported, the experts node run through its function body on the CPU provider).
MOE_BACKENDS = ("ours", "eager", "batched_mm", "onnxruntime")
DEFAULT_MOE_TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
DEFAULT_MOE_EXPERTS = (16,)
MOE_DTYPES = ("fp32", "bf16")
#: transformers' ``batched_mm`` gathers every routing slot's weight matrices (``tokens * top_k *
#: 3 * hidden * intermediate`` values: 1.3 GiB per token in fp32 at DeepSeek-V3.2 width); cases that
#: would gather more than this many GiB are skipped.
DEFAULT_BATCHED_MM_LIMIT_GIB = 4.0


@dataclass(frozen=True)
class MoEConfig:
    """Shapes of the MoE layer that is timed: transformers' ``DeepseekV32MoE`` (sigmoid router with
    correction bias and group-limited top-k, routed experts, shared experts), batch 1.

    Attributes:
        hidden: model width (DeepSeek-V3.2: 7168).
        intermediate: width of each routed expert (``moe_intermediate_size``, 2048).
        top_k: experts per token (8).
        n_group, topk_group: group-limited routing: experts in ``n_group`` groups, tokens choose
            among ``topk_group`` of them (DeepSeek-V3.2 has 8 / 4 over 256 experts; 4 / 3 keeps a
            real choice with 16 experts).
        shared_experts: always-active experts of width ``intermediate`` (1).
        routed_scaling_factor: DeepSeek-V3.2's 2.5.
        dtype: ``fp32`` or ``bf16`` weights and activations (the router computes in float32).
        seed: seed of the weights and tokens.
    """

    hidden: int = 7168
    intermediate: int = 2048
    top_k: int = 8
    n_group: int = 4
    topk_group: int = 3
    shared_experts: int = 1
    routed_scaling_factor: float = 2.5
    dtype: str = "fp32"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden", "intermediate", "top_k", "n_group", "topk_group"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1.")
        if self.dtype not in MOE_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(MOE_DTYPES)}, not {self.dtype!r}.")

    def check_experts(self, experts: int) -> None:
        """Raise ValueError when ``experts`` cannot be routed with this config."""
        per_group, rem = divmod(experts, self.n_group)
        if rem or per_group < 2 or self.topk_group > self.n_group:
            raise ValueError(f"{experts} experts do not split into {self.n_group} groups of at least two "
                             f"(topk_group {self.topk_group}); pick a multiple of {2 * self.n_group}.")
        if self.top_k > self.topk_group * per_group:
            raise ValueError(f"top_k {self.top_k} exceeds the {self.topk_group * per_group} experts of "
                             f"{self.topk_group} groups of {experts} experts.")


@dataclass(frozen=True)
class MoEBenchSettings:
    """Everything that shapes one MoE benchmark run (timing fields as in :class:`BenchSettings`).

    Attributes:
        tokens: token counts N (one prefill of N tokens, batch 1), run in increasing order.
        experts: routed-expert counts E; each builds its own layer, one after the other.
        backends: which of :data:`MOE_BACKENDS` to run (ONNX Runtime always last per layer, after
            the torch weights are freed).
        layer: the layer's shapes.
        batched_mm_limit_gib: largest weight gather ``batched_mm`` may make (see above).
    """

    tokens: tuple[int, ...] = DEFAULT_MOE_TOKENS
    experts: tuple[int, ...] = DEFAULT_MOE_EXPERTS
    backends: tuple[str, ...] = MOE_BACKENDS
    layer: MoEConfig = MoEConfig()
    warmup: int = 1
    warmup_below_s: float = 1.0
    repeats: int = 3
    case_budget_s: float = 10.0
    memory: bool = True
    threads: int = 0
    time_budget_s: float = 60.0
    batched_mm_limit_gib: float = DEFAULT_BATCHED_MM_LIMIT_GIB

    def __post_init__(self) -> None:
        if not self.tokens or min(self.tokens) < 1:
            raise ValueError("token counts must be at least 1.")
        if not self.experts:
            raise ValueError("give at least one expert count.")
        for experts in self.experts:
            self.layer.check_experts(experts)
        unknown = [b for b in self.backends if b not in MOE_BACKENDS]
        if unknown or not self.backends:
            raise ValueError(f"unknown MoE backend(s) {unknown}; choose from {', '.join(MOE_BACKENDS)}.")
        if len(set(self.backends)) != len(self.backends):
            raise ValueError("a backend is listed twice.")
        if "onnxruntime" in self.backends and self.layer.dtype != "fp32":
            raise ValueError("the onnxruntime MoE backend runs fp32 only (ONNX Runtime's CPU provider has no bf16 "
                             "GEMMs); drop it or use --dtype fp32.")
        if self.repeats < 1 or self.warmup < 0 or self.threads < 0 or self.case_budget_s <= 0:
            raise ValueError("repeats must be at least 1, warmup and threads at least 0, the case budget positive.")
        if self.batched_mm_limit_gib < 0:
            raise ValueError("the batched_mm limit cannot be negative.")
        object.__setattr__(self, "tokens", tuple(sorted(set(self.tokens))))
        object.__setattr__(self, "experts", tuple(sorted(set(self.experts))))
