"""FLOPs of the timed layer, counted from its shapes, and the sparsity of DSA's selection.

One multiply-add counts as 2 FLOPs; softmax, LayerNorm, top-k selection and the ReLU itself are
left out (they are O(L) or O(L*T) comparisons, not multiply-adds). Prefill of L tokens: the query
at position p (0-based) may attend to the p + 1 keys 0..p.

- causal pairs ``P(L) = L (L + 1) / 2``
- selected pairs ``N(L, K) = sum_p min(K, p + 1)`` = ``P(L)`` if L <= K, else ``K (K + 1) / 2 + (L - K) K``
- projections (both variants): ``2 B L d (H D + 2 Hkv D) + 2 B L H D d`` (q/k/v in, o out)
- indexer projections: ``2 B L d (H_I D_I + D_I + H_I)`` (indexer queries, key, head weights)
- indexer scores: ``B P(L) H_I (2 D_I + 2)`` (q.k per head, then the weighted head sum)
- main attention, DSA: ``4 B H D N(L, K)`` (q.k and p.v over the selected keys)
- main attention, dense: ``4 B H D P(L)``
- sparsity of the selection: ``1 - N(L, K) / P(L)``, the share of causal (query, key) pairs DSA skips
- block-sparse layer (blocks of ``bs``, ``Kb`` key blocks per query block): query block i (``n_i``
  queries) attends to ``min(i + 1, Kb)`` causal key blocks, its diagonal block among them, so
  ``N_block(L) = sum_i n_i (n_i + 1) / 2 + (min(i + 1, Kb) - 1) bs n_i``; main attention
  ``4 B H D N_block(L)``, block scores of the pooled queries and keys ``2 B H nb^2 D``
- LSH layer: its pairs depend on the buckets, so they are counted from the measured selection
  (``4 B H D`` times the attended pairs of each head)

The CPU indexer op scores all L x L pairs and masks the upper triangle afterwards, so it performs
about twice the indexer-score FLOPs counted here; the counts are those of the computation, not of
one implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsa_export.bench.settings import BlockConfig


def causal_pairs(seq_len: int) -> int:
    return seq_len * (seq_len + 1) // 2


def selected_pairs(seq_len: int, topk: int) -> int:
    if seq_len <= topk:
        return causal_pairs(seq_len)
    return topk * (topk + 1) // 2 + (seq_len - topk) * topk


def sparsity(seq_len: int, topk: int) -> float:
    """Share of the causal (query, key) pairs that DSA's main attention skips."""
    return 1.0 - selected_pairs(seq_len, topk) / causal_pairs(seq_len)


def block_pairs(seq_len: int, block_size: int, blocks: int) -> int:
    """Causal (query, key) pairs the block layer attends to (per head): see the module docstring."""
    total = 0
    for i in range(-(-seq_len // block_size)):
        n = min(block_size, seq_len - i * block_size)
        total += n * (n + 1) // 2 + (min(i + 1, blocks) - 1) * block_size * n
    return total


def block_sparsity(seq_len: int, block_size: int, blocks: int) -> float:
    """Share of the causal (query, key) pairs the block layer skips."""
    return 1.0 - block_pairs(seq_len, block_size, blocks) / causal_pairs(seq_len)


def sparsity_range(topk: int, low: float, high: float) -> tuple[int, int] | None:
    """The shortest and longest L whose sparsity lies in ``[low, high]`` for this top-k."""
    first = _first_length_reaching(topk, low)
    last = _first_length_reaching(topk, high)
    if first is None:
        return None
    # sparsity grows with L, so [first, last) is the range; `last` is the first L above `high`.
    upper = (last - 1) if last is not None and sparsity(last, topk) > high else last
    if upper is None or upper < first:
        return None
    return first, upper


def _first_length_reaching(topk: int, target: float, limit: int = 1 << 40) -> int | None:
    """The smallest L with ``sparsity(L, topk) >= target`` (sparsity is non-decreasing in L)."""
    lo, hi = 1, topk
    while sparsity(hi, topk) < target:
        if hi >= limit:
            return None
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if sparsity(mid, topk) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one layer call at one L (see the module docstring for the formulas)."""

    seq_len: int
    projections: int
    indexer_projections: int
    indexer_scores: int
    sparse_attention: int
    dense_attention: int
    block_selection: int = 0
    block_attention: int = 0

    @property
    def indexer(self) -> int:
        return self.indexer_projections + self.indexer_scores

    @property
    def dsa_total(self) -> int:
        return self.projections + self.indexer + self.sparse_attention

    @property
    def dense_total(self) -> int:
        return self.projections + self.dense_attention

    @property
    def block_total(self) -> int:
        return self.projections + self.block_selection + self.block_attention

    def total(self, variant: str) -> int | None:
        """FLOPs of one call of ``variant`` (None for lsh, whose pairs depend on its buckets)."""
        return {"dsa": self.dsa_total, "dense": self.dense_total, "block": self.block_total}.get(variant)

    @property
    def indexer_share(self) -> float:
        """Indexer FLOPs over indexer + main (sparse) attention FLOPs."""
        return self.indexer / (self.indexer + self.sparse_attention)

    def to_dict(self) -> dict:
        return {
            "seq_len": self.seq_len,
            "projections": self.projections,
            "indexer_projections": self.indexer_projections,
            "indexer_scores": self.indexer_scores,
            "indexer": self.indexer,
            "sparse_attention": self.sparse_attention,
            "dense_attention": self.dense_attention,
            "dsa_total": self.dsa_total,
            "dense_total": self.dense_total,
            "block_selection": self.block_selection,
            "block_attention": self.block_attention,
            "block_total": self.block_total,
            "indexer_share": self.indexer_share,
            "dense_over_dsa": self.dense_total / self.dsa_total,
        }


def layer_flops(cfg: BlockConfig, seq_len: int) -> FlopCount:
    b, length, d = cfg.batch, seq_len, cfg.hidden
    h, hkv, dh = cfg.heads, cfg.kv_heads, cfg.head_dim
    hi, di = cfg.index_heads, cfg.index_head_dim
    n_blocks = -(-length // cfg.block_size)
    return FlopCount(
        seq_len=seq_len,
        projections=2 * b * length * d * (h * dh + 2 * hkv * dh) + 2 * b * length * h * dh * d,
        indexer_projections=2 * b * length * d * (hi * di + di + hi),
        indexer_scores=b * causal_pairs(length) * hi * (2 * di + 2),
        sparse_attention=4 * b * h * dh * selected_pairs(length, cfg.topk),
        dense_attention=4 * b * h * dh * causal_pairs(length),
        block_selection=2 * b * h * n_blocks * n_blocks * dh,
        block_attention=4 * b * h * dh * block_pairs(length, cfg.block_size, cfg.blocks_per_query_block),
    )
