"""Sparse-attention patterns beside the lightning indexer: block-sparse attention with a learned
block predictor, LSH bucketed attention, a Gumbel-top-k indexer and static (cached) selections.

Every pattern ends in one of the ``dsa`` ops, so it exports like the indexer does: block patterns
become the ``block_index [B,H,nqb,Kb]`` of ``DSABlockSparseAttention``, LSH buckets and static
patterns become the ``indices [B,S,K]`` of ``DSASparseAttention``. Every selection has a fixed
width (Kb, K), -1 padded, built with shape-static ops (TopK of a fixed k over padded scores,
running counts, gathers and scatters), so no exported graph has a data-dependent shape.
See docs/patterns.md for the designs, the constructions and what ran where.
"""

from __future__ import annotations

import zlib

import torch
import torch.nn.functional as F
from torch import nn

from dsa_export.nn.config import DSAModelConfig
from dsa_export.nn.layers import LightningIndexer, MLAttention, apply_rope
from dsa_export.ops import dsa_sparse_attention

#: The layer types of this module (the others are in :mod:`dsa_export.nn.layers`).
PATTERN_LAYER_TYPES = ("block", "predictor", "lsh", "gumbel", "static")


def _block_sparse_attention(q, k, v, block_index, *, block_size: int, scale: float, causal: bool = True):
    # Imported on use: the op is the newest of the domain, and the other patterns need none of it.
    from dsa_export.ops import dsa_block_sparse_attention

    return dsa_block_sparse_attention(q, k, v, block_index, block_size=block_size, scale=scale, causal=causal)


def _rope_prefix(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dim: int) -> torch.Tensor:
    """RoPE (halves form) on the leading ``dim`` channels, as the sliding-window layers do."""
    return torch.cat((apply_rope(x[..., :dim], cos, sin, False), x[..., dim:]), -1)


def _layer_seed(seed: int, index: int, what: str) -> int:
    return (seed * 1_000_003 + index * 7919 + zlib.crc32(what.encode())) % 2**63


# -- block patterns ----------------------------------------------------------------------------
def num_blocks(length, block_size: int):
    """``ceil(length / block_size)`` (works on symbolic sizes)."""
    return (length + block_size - 1) // block_size


def block_mean(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mean of ``x [B,S,...]`` over each block of ``block_size`` positions: ``[B,ceil(S/bs),...]``.

    The last block may be partial; it is averaged over the positions it has.
    """
    b, s = x.shape[0], x.shape[1]
    nb = num_blocks(s, block_size)
    pad = nb * block_size - s
    padded = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
    sums = padded.reshape(b, nb, block_size, *x.shape[2:]).sum(2)
    starts = torch.arange(nb, device=x.device) * block_size
    counts = (s - starts).clamp(max=block_size).to(sums.dtype)
    return sums / counts.view(1, nb, *([1] * (x.dim() - 2)))


def allowed_blocks(nqb: int, nkb: int, causal: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(allowed, diagonal)`` bool ``[nqb, nkb]``: the key blocks a query block may use and its own block.

    The layers here attend over their own sequence (T == S), so query block i holds the same
    positions as key block i; under ``causal`` it may use key blocks j <= i.
    """
    qi = torch.arange(nqb, device=device)[:, None]
    kj = torch.arange(nkb, device=device)[None, :]
    diagonal = kj == qi
    allowed = kj <= qi if causal else torch.ones_like(diagonal)
    return allowed, diagonal


def block_index_from_logits(logits: torch.Tensor, max_blocks: int, *, gate: bool,
                            causal: bool = True) -> torch.Tensor:
    """The int32 ``block_index [B,H,nqb,max_blocks]`` of per-head block logits ``[B,H,nqb,nkb]``.

    A key block is a candidate when it is allowed (causal) and, with ``gate``, gated on
    (``sigmoid(logit) > 0.5``, i.e. ``logit > 0``); the diagonal block is always kept so no row is
    empty. Of the candidates the ``max_blocks`` with the highest logits are kept (the diagonal
    first), the rest of the row is -1. The scores are padded with ``max_blocks`` columns of -inf
    so that one TopK of the fixed k ``max_blocks`` serves every sequence length.
    """
    b, h, nqb, nkb = logits.shape
    allowed, diagonal = allowed_blocks(nqb, nkb, causal, logits.device)
    logits = logits.float()
    keep = allowed & (logits > 0) if gate else allowed.expand(b, h, nqb, nkb)
    scores = torch.where(keep, logits, float("-inf"))
    scores = torch.where(diagonal, float("inf"), scores)
    padding = torch.full((b, h, nqb, max_blocks), float("-inf"), device=logits.device)
    values, index = torch.cat((scores, padding), -1).topk(max_blocks, dim=-1)
    return torch.where(values > float("-inf"), index, -1).to(torch.int32)


def block_mask_from_index(block_index: torch.Tensor, nkb: int) -> torch.Tensor:
    """float ``[B,H,nqb,nkb]``: 1 where ``block_index`` selects a key block (its -1 slots ignored)."""
    valid = block_index >= 0
    target = torch.where(valid, block_index, nkb).long()
    mask = torch.zeros((*block_index.shape[:3], nkb + 1), device=block_index.device)
    mask.scatter_(-1, target, 1.0)
    return mask[..., :nkb]


def block_gated_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_gate: torch.Tensor, *,
                          block_size: int, scale: float, causal: bool = True) -> torch.Tensor:
    """Dense attention weighted by a block gate: the training path and the reference of the block layers.

    ``out[s] = sum_t g[s,t] e^(score[s,t]) v[t] / sum_t g[s,t] e^(score[s,t])`` over the causal
    keys, ``g`` the gate ``[B,H,nqb,nkb]`` spread over its blocks. With a 0/1 gate this is
    block-sparse attention over the selected blocks; with a soft or straight-through gate the
    gradient reaches the gate's logits. q ``[B,S,H,Dk]``, k/v ``[B,S,Hkv,D]``; O(S^2) memory.
    """
    s, t, h = q.shape[1], k.shape[1], q.shape[2]
    k = k.repeat_interleave(h // k.shape[2], 2) if k.shape[2] != h else k
    v = v.repeat_interleave(h // v.shape[2], 2) if v.shape[2] != h else v
    gate = block_gate.repeat_interleave(block_size, 2).repeat_interleave(block_size, 3)[:, :, :s, :t]
    scores = torch.einsum("bshd,bthd->bhst", q.float(), k.float()) * scale
    if causal:
        allowed = torch.arange(t, device=q.device)[None, :] <= torch.arange(s, device=q.device)[:, None] + (t - s)
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.exp(scores - scores.amax(-1, keepdim=True).detach()) * gate
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
    return torch.einsum("bhst,bthd->bshd", weights, v.float()).to(q.dtype)


class BlockPatternPredictor(nn.Module):
    """Per-head block logits ``[B,H,nb,nb]`` from mean-pooled blocks of the layer input.

    ``Linear -> GELU -> Linear`` maps each pooled block to a query-side and a key-side feature of
    ``feature_dim`` per head; the logit of (query block i, key block j) is their scaled dot
    product plus a per-head bias. A sigmoid of the logit is the block's gate.
    """

    def __init__(self, hidden: int, heads: int, block_size: int, hidden_dim: int, feature_dim: int):
        super().__init__()
        self.heads, self.block_size, self.feature_dim = heads, block_size, feature_dim
        self.fc1 = nn.Linear(hidden, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, 2 * heads * feature_dim)
        self.bias = nn.Parameter(torch.zeros(heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = block_mean(x, self.block_size)  # [B,nb,hidden]
        b, nb = pooled.shape[0], pooled.shape[1]
        features = self.fc2(F.gelu(self.fc1(pooled))).view(b, nb, 2, self.heads, self.feature_dim)
        fq, fk = features.unbind(2)
        logits = torch.einsum("bihr,bjhr->bhij", fq, fk) * self.feature_dim**-0.5
        return logits + self.bias.view(1, -1, 1, 1)


def gate_from_logits(logits: torch.Tensor, block_index: torch.Tensor, gating: str) -> torch.Tensor:
    """The training gate ``[B,H,nqb,nkb]`` of the predictor.

    ``straight-through``: the forward value is the hard selection (exactly what inference and the
    exported graph compute), the gradient is that of ``sigmoid(logits)``. ``soft``: ``sigmoid``
    itself on the allowed blocks (forward differs from inference; no block is cut off).
    """
    soft = torch.sigmoid(logits.float())
    if gating == "soft":
        allowed, _ = allowed_blocks(logits.shape[2], logits.shape[3], True, logits.device)
        return soft * allowed
    hard = block_mask_from_index(block_index, logits.shape[3])
    return hard + soft - soft.detach()


class BlockSparseSelfAttention(nn.Module):
    """Multi-head causal attention over selected key blocks, through DSABlockSparseAttention.

    ``pattern="pooled"`` (layer type ``block``): the blocks of each query block are the
    ``block_topk`` key blocks whose mean-pooled keys score highest against its mean-pooled queries
    (parameter-free). ``pattern="predictor"``: a :class:`BlockPatternPredictor` gates the blocks
    (``sigmoid > 0.5``) and the ``block_topk`` highest gated ones are kept. The diagonal block is
    always kept. In training mode the layer runs :func:`block_gated_attention` (dense, so the
    predictor learns through its gate); in eval mode and in exported graphs, the block-sparse op.
    """

    def __init__(self, cfg: DSAModelConfig, pattern: str):
        super().__init__()
        if pattern not in ("pooled", "predictor"):
            raise ValueError(f"pattern must be 'pooled' or 'predictor', not {pattern!r}.")
        self.cfg, self.pattern = cfg, pattern
        h, d = cfg.num_heads, cfg.local_head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * h * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.predictor = (
            BlockPatternPredictor(cfg.hidden_size, h, cfg.block_size, cfg.predictor_hidden, cfg.predictor_dim)
            if pattern == "predictor" else None
        )

    @property
    def scale(self) -> float:
        return self.cfg.local_head_dim**-0.5

    def block_logits(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if self.predictor is not None:
            return self.predictor(x)
        pq, pk = block_mean(q, self.cfg.block_size), block_mean(k, self.cfg.block_size)
        return torch.einsum("bihd,bjhd->bhij", pq.float(), pk.float()) * self.scale

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg, (b, s, _) = self.cfg, x.shape
        q, k, v = self.qkv_proj(x).view(b, s, 3, cfg.num_heads, cfg.local_head_dim).unbind(2)
        q, k = _rope_prefix(q, cos, sin, cfg.qk_rope_head_dim), _rope_prefix(k, cos, sin, cfg.qk_rope_head_dim)
        logits = self.block_logits(x, q, k)
        block_index = block_index_from_logits(logits, cfg.block_topk, gate=self.predictor is not None)
        if self.training:
            gate = (gate_from_logits(logits, block_index, cfg.predictor_gating) if self.predictor is not None
                    else block_mask_from_index(block_index, logits.shape[3]))
            out = block_gated_attention(q, k, v, gate, block_size=cfg.block_size, scale=self.scale)
        else:
            out = _block_sparse_attention(q, k, v, block_index, block_size=cfg.block_size, scale=self.scale)
        return self.o_proj(out.reshape(b, s, -1))


# -- LSH ---------------------------------------------------------------------------------------
def lsh_buckets(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Reformer's angular LSH, ``argmax([xR, -xR])`` per head: x ``[B,S,H,D]``, R ``[H,D,nb/2]`` -> int64
    buckets ``[B,H,S]``."""
    projected = torch.einsum("bshd,hdr->bhsr", x.float(), rotations.float())
    return torch.cat((projected, -projected), -1).argmax(-1)


def bucket_selections(buckets: torch.Tensor, k: int, n_buckets: int) -> torch.Tensor:
    """int32 ``[N,S,k]``: for each query, the up-to-``k`` latest keys at or before it in its bucket.

    Static shapes and no sort: a query's rank in the order by ``(bucket, position)`` is the number
    of tokens in lower buckets plus the number of earlier tokens of its bucket, both read from a
    running count of a one-hot ``[N,S,n_buckets]``; scattering positions to their ranks gives that
    order, in which the keys of a query's bucket that precede it are the entries just before it.
    Its candidates are the entries at its rank minus 0..k-1, valid while fewer than the tokens of
    its bucket up to it; -1 fills the rest. Cost O(S (n_buckets + k)). ``buckets`` is ``[N,S]``
    with values in ``[0, n_buckets)``.
    """
    n, s = buckets.shape
    buckets = buckets.long()
    onehot = (buckets[:, :, None] == torch.arange(n_buckets, device=buckets.device)).to(torch.int32)
    running = onehot.cumsum(1)  # [N,S,nb]: tokens of each bucket in [0, p]
    totals = running[:, -1]  # [N,nb]
    lower = totals.cumsum(-1) - totals  # tokens in lower buckets
    upto = running.gather(-1, buckets[:, :, None]).squeeze(-1)  # tokens of p's bucket in [0, p], p included
    rank = (lower.gather(-1, buckets) + upto - 1).long()
    positions = torch.arange(s, device=buckets.device).expand(n, s)
    order = torch.empty_like(rank).scatter_(-1, rank, positions)
    offsets = torch.arange(k, device=buckets.device)
    candidate = (rank[:, :, None] - offsets).clamp(min=0).reshape(n, s * k)
    key = order.gather(-1, candidate).view(n, s, k)
    return torch.where(offsets < upto[:, :, None], key, -1).to(torch.int32)


def bucket_mask(buckets: torch.Tensor, k: int) -> torch.Tensor:
    """bool ``[N,S,S]``, the dense form of :func:`bucket_selections` (tests, training losses).

    Query p may use key t when both are in one bucket, t <= p, and fewer than k keys of that bucket
    lie in (t, p]: the k latest keys of its bucket, itself included.
    """
    same = buckets[:, :, None] == buckets[:, None, :]
    s = buckets.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=buckets.device).tril()
    eligible = same & causal
    # keys of the bucket in [t, p]: reverse cumulative count along t
    newer = eligible.flip(-1).cumsum(-1).flip(-1)
    return eligible & (newer <= k)


class LSHAttention(nn.Module):
    """Reformer-style shared-QK attention inside LSH buckets, through DSASparseAttention.

    One projection gives each head's shared query/key vector; keys are its unit-norm form (as in
    Reformer). Buckets come from fixed, seeded random rotations of the keys (before RoPE, so the
    bucket depends on content only); each query attends to the ``lsh_topk`` latest keys of its
    bucket at or before it (itself always among them). The heads are folded into the batch so that
    each head has its own selection: the op runs on ``[B*H, S, 1, D]``.
    """

    def __init__(self, cfg: DSAModelConfig, index: int = 0):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.num_heads, cfg.local_head_dim
        self.qk_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        generator = torch.Generator().manual_seed(_layer_seed(cfg.seed, index, "lsh.rotations"))
        self.register_buffer("rotations", torch.randn(h, d, cfg.lsh_buckets // 2, generator=generator))

    def buckets(self, keys: torch.Tensor) -> torch.Tensor:
        return lsh_buckets(keys, self.rotations)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg, (b, s, _) = self.cfg, x.shape
        h, d, r = cfg.num_heads, cfg.local_head_dim, cfg.qk_rope_head_dim
        qk = self.qk_proj(x).view(b, s, h, d)
        v = self.v_proj(x).view(b, s, h, d)
        keys = F.normalize(qk, dim=-1)
        indices = bucket_selections(self.buckets(keys).reshape(b * h, s), cfg.lsh_topk, cfg.lsh_buckets)
        q, keys = _rope_prefix(qk, cos, sin, r), _rope_prefix(keys, cos, sin, r)

        def fold(t: torch.Tensor) -> torch.Tensor:  # [B,S,H,D] -> [B*H,S,1,D]
            return t.transpose(1, 2).reshape(b * h, s, 1, d)

        out = dsa_sparse_attention(fold(q), fold(keys), fold(v), indices, scale=d**-0.5)
        return self.o_proj(out.view(b, h, s, d).transpose(1, 2).reshape(b, s, h * d))


# -- Gumbel top-k ------------------------------------------------------------------------------
def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, scale: float,
                 causal: bool = True) -> torch.Tensor:
    """The lightning indexer's float32 scores ``[B,S,T]`` (disallowed keys -inf), dense in torch."""
    s, t = q.shape[1], k.shape[1]
    logits = torch.einsum("bshd,btd->bsht", q.float(), k.float()) * scale
    scores = (w.float()[..., None] * logits.relu()).sum(2)
    if causal:
        allowed = torch.arange(t, device=q.device)[None, :] <= torch.arange(s, device=q.device)[:, None] + (t - s)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores


def gumbel_noise(shape, generator: torch.Generator, device=None) -> torch.Tensor:
    """Standard Gumbel samples ``-log(-log U)``, U uniform in (0, 1)."""
    u = torch.rand(shape, generator=generator, device=device).clamp(1e-10, 1.0 - 1e-7)
    return -torch.log(-torch.log(u))


def topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """int32 ``[..., k]`` of the ``k`` best finite entries of each row, -1 where a row has fewer."""
    kk = min(k, scores.shape[-1])
    values, index = scores.topk(kk, dim=-1)
    index = torch.where(values > float("-inf"), index, -1)
    if kk < k:
        index = F.pad(index, (0, k - kk), value=-1)
    return index.to(torch.int32)


def relaxed_topk(scores: torch.Tensor, k: int, temperature: float) -> torch.Tensor:
    """A differentiable (relaxed) k-hot ``[..., T]`` of ``scores`` (-inf: never chosen), the continuous
    relaxation of Gumbel-top-k: k rounds of softmax, each round's mass taken out of the next
    (``p = softmax(alpha / temperature)``, ``alpha += log(1 - p)``, Xie and Ermon 2019). A row sums
    to min(k, its finite entries): a row with fewer allowed keys than k stops after its last one."""
    alpha = scores.float()
    allowed = torch.isfinite(alpha).sum(-1, keepdim=True)
    khot = torch.zeros_like(alpha)
    for round_ in range(k):
        step = torch.nan_to_num(torch.softmax(alpha / temperature, -1))  # no finite score: zeros
        khot = khot + step * (allowed > round_)
        alpha = alpha + torch.log((1.0 - step).clamp_min(1e-30))
    return khot


class GumbelTopKIndexer(LightningIndexer):
    """The lightning indexer with Gumbel-top-k sampling in training.

    Training mode: the top ``index_topk`` of ``score + temperature * Gumbel`` (noise on allowed
    keys only, drawn from the module's own seeded generator, so a run is reproducible). Eval mode
    and export: exactly :class:`LightningIndexer` (``DSAIndexerTopK``, deterministic).
    :meth:`relaxed_mask` gives the differentiable k-hot of the same perturbed scores.
    """

    def __init__(self, cfg: DSAModelConfig, seed: int = 0):
        super().__init__(cfg)
        self.temperature = cfg.gumbel_temperature
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def reseed(self, seed: int | None = None) -> None:
        """Restart the noise sequence (at ``seed``, default the construction seed)."""
        self.generator.manual_seed(self.seed if seed is None else seed)

    def scores(self, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self._rope(self.wq_b(q_resid).view(b, s, self.n_heads, self.head_dim), cos, sin)
        k = self._rope(self.k_norm(self.wk(x)), cos, sin)
        w = self.weights_proj(x) * self.n_heads**-0.5
        return index_scores(q, k, w, self.head_dim**-0.5, causal=True)

    def perturbed_scores(self, x, q_resid, cos, sin) -> torch.Tensor:
        scores = self.scores(x, q_resid, cos, sin)
        noise = gumbel_noise(scores.shape, self.generator).to(scores.device)
        return scores + self.temperature * noise  # -inf stays -inf

    def relaxed_mask(self, x, q_resid, cos, sin) -> torch.Tensor:
        """Differentiable k-hot ``[B,S,T]`` of a Gumbel-perturbed sample (training losses)."""
        return relaxed_topk(self.perturbed_scores(x, q_resid, cos, sin), self.topk, self.temperature)

    def forward(self, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x, q_resid, cos, sin)
        return topk_indices(self.perturbed_scores(x, q_resid, cos, sin), self.topk)


# -- static patterns ---------------------------------------------------------------------------
def check_static_pattern(pattern, causal: bool = True) -> torch.Tensor:
    """A user's selection as int32 ``[max_seq, K]``; entries -1 or key positions (<= row under causal)."""
    pattern = torch.as_tensor(pattern)
    if pattern.dim() != 2 or pattern.shape[0] < 1 or pattern.shape[1] < 1:
        raise ValueError(f"a static pattern is [max_seq, K] with both >= 1, not {tuple(pattern.shape)}.")
    if pattern.is_floating_point() or pattern.is_complex() or pattern.dtype == torch.bool:
        raise ValueError(f"a static pattern holds integer key positions, not {pattern.dtype}.")
    pattern = pattern.to(torch.int64)
    rows = torch.arange(pattern.shape[0])[:, None]
    limit = rows if causal else torch.full_like(rows, pattern.shape[0] - 1)
    bad = (pattern < -1) | (pattern > limit)
    if bad.any():
        r, c = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"static pattern entry [{r},{c}] = {int(pattern[r, c])} is not -1 or a key position "
                         f"0..{int(limit[r, 0])}{' (causal: at most the row)' if causal else ''}.")
    for row in pattern:
        kept = row[row >= 0]
        if kept.unique().numel() != kept.numel():
            raise ValueError("a static pattern row names a key twice; give each key once per row.")
    return pattern.to(torch.int32)


def slice_static_pattern(pattern: torch.Tensor, seq_len) -> torch.Tensor:
    """The ``[S, K]`` rows of a stored ``[max_seq, K]`` pattern for a run of S tokens.

    Rule: row s is the stored row s for s < max_seq; queries past max_seq reuse the last stored row
    (its keys are all before them, so it stays causal); keys >= S become -1 (a causal pattern has
    none). Written as a Gather of clamped positions so the exported rows follow S symbolically.
    """
    rows = torch.arange(seq_len, device=pattern.device).clamp(max=pattern.shape[0] - 1)
    selected = pattern.index_select(0, rows)
    return torch.where(selected < seq_len, selected, -1).to(torch.int32)


class StaticPatternIndexer(nn.Module):
    """A fixed selection in place of the indexer: stored in the graph as a constant, or fed as an input.

    Until :meth:`freeze` (or :func:`freeze_static_patterns`) it runs a live
    :class:`LightningIndexer` (the calibration indexer); freezing records that indexer's selection
    on a calibration input (batch row 0, its length is ``max_seq``) and drops the indexer, so its
    weights and its ``DSAIndexerTopK`` leave the graph. :meth:`set_pattern` stores a user's array
    instead. ``fed`` (set by :class:`FedStaticPatternLM`) overrides the stored pattern with a graph
    input. The selection is shared by the whole batch.
    """

    def __init__(self, cfg: DSAModelConfig):
        super().__init__()
        self.topk = cfg.index_topk
        self.calibration_indexer: LightningIndexer | None = LightningIndexer(cfg)
        self.register_buffer("pattern", torch.empty(0, cfg.index_topk, dtype=torch.int32))
        self.recording = False
        self.fed: torch.Tensor | None = None

    @property
    def frozen(self) -> bool:
        return self.pattern.shape[0] > 0

    def set_pattern(self, pattern, causal: bool = True) -> None:
        """Store a user's ``[max_seq, K]`` selection (K need not equal index_topk) and drop the indexer."""
        self.pattern = check_static_pattern(pattern, causal).to(self.pattern.device)
        self.calibration_indexer = None

    def forward(self, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        if self.fed is not None:
            return slice_static_pattern(self.fed, s)[None].expand(b, -1, -1)
        if not self.frozen:
            if self.calibration_indexer is None:
                raise RuntimeError("this static-pattern layer has neither a pattern nor an indexer to compute one.")
            indices = self.calibration_indexer(x, q_resid, cos, sin)
            if self.recording:
                self.pattern = indices[0].to(torch.int32).clone()
            return indices
        return slice_static_pattern(self.pattern, s)[None].expand(b, -1, -1)


def static_indexers(model: nn.Module) -> list[StaticPatternIndexer]:
    return [m for m in model.modules() if isinstance(m, StaticPatternIndexer)]


@torch.no_grad()
def freeze_static_patterns(model: nn.Module, calibration_input: torch.Tensor) -> nn.Module:
    """Compute every static layer's pattern once from ``calibration_input [1, max_seq]`` and store it.

    Runs the model once with the calibration indexers live (each layer sees the activations the
    layers below produce), records each selection and drops the indexers. Returns ``model``.
    """
    layers = [m for m in static_indexers(model) if not m.frozen]
    was_training = model.training
    model.eval()
    for layer in layers:
        layer.recording = True
    try:
        model(calibration_input)
    finally:
        for layer in layers:
            layer.recording = False
        model.train(was_training)
    for layer in layers:
        layer.calibration_indexer = None
    return model


class FedStaticPatternLM(nn.Module):
    """``(input_ids [B,S], patterns [L,S,K]) -> logits``: the static layers' selections as a graph input.

    ``patterns[i]`` replaces the stored pattern of the i-th static layer (same slicing rule, so
    rows may also be longer than S). Export with ``patterns`` axis 1 tied to the sequence.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.layers = static_indexers(model)
        if not self.layers:
            raise ValueError("the model has no static-pattern layer to feed.")

    def forward(self, input_ids: torch.Tensor, patterns: torch.Tensor) -> torch.Tensor:
        for layer, pattern in zip(self.layers, patterns.unbind(0)):
            layer.fed = pattern
        try:
            return self.model(input_ids)
        finally:
            for layer in self.layers:
                layer.fed = None


# -- the layer factory -------------------------------------------------------------------------
def make_pattern_attention(cfg: DSAModelConfig, layer_type: str, index: int = 0) -> nn.Module:
    """The attention module of one of :data:`PATTERN_LAYER_TYPES`."""
    if layer_type == "block":
        return BlockSparseSelfAttention(cfg, "pooled")
    if layer_type == "predictor":
        return BlockSparseSelfAttention(cfg, "predictor")
    if layer_type == "lsh":
        return LSHAttention(cfg, index)
    attention = MLAttention(cfg, sparse=True, dense=False)
    if layer_type == "gumbel":
        attention.indexer = GumbelTopKIndexer(cfg, seed=_layer_seed(cfg.seed, index, "gumbel"))
    elif layer_type == "static":
        attention.indexer = StaticPatternIndexer(cfg)
    else:
        raise ValueError(f"unknown pattern layer type {layer_type!r}; use {PATTERN_LAYER_TYPES}.")
    return attention
