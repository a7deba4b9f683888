"""FLOP formulas and sparsity on a configuration small enough to count by hand."""

from __future__ import annotations

import pytest
import torch

from dsa_export.bench.flops import causal_pairs, layer_flops, selected_pairs, sparsity, sparsity_range
from dsa_export.bench.settings import BlockConfig

SMALL = BlockConfig(hidden=8, heads=2, kv_heads=1, head_dim=4, index_heads=2, index_head_dim=4, topk=3)


def test_counts_of_a_hand_counted_layer():
    f = layer_flops(SMALL, 5)
    # causal pairs 1+2+3+4+5 = 15; selected min(3, p+1) = 1+2+3+3+3 = 12
    assert (causal_pairs(5), selected_pairs(5, 3)) == (15, 12)
    assert f.projections == 2 * 5 * 8 * (2 * 4 + 2 * 4) + 2 * 5 * 8 * 8 == 1920
    assert f.indexer_projections == 2 * 5 * 8 * (8 + 4 + 2) == 1120
    assert f.indexer_scores == 15 * 2 * (2 * 4 + 2) == 300
    assert f.sparse_attention == 4 * 2 * 4 * 12 == 384
    assert f.dense_attention == 4 * 2 * 4 * 15 == 480
    assert f.indexer_share == pytest.approx(1420 / (1420 + 384))
    assert f.to_dict()["dense_over_dsa"] == pytest.approx((1920 + 480) / (1920 + 1420 + 384))
    assert layer_flops(BlockConfig(batch=3), 64).dense_attention == 3 * layer_flops(BlockConfig(), 64).dense_attention


@pytest.mark.parametrize("topk", [1, 7, 512])
def test_selected_pairs_match_a_direct_sum(topk):
    for seq_len in (1, 2, 5, topk - 1, topk, topk + 1, 3 * topk + 5):
        if seq_len >= 1:
            assert selected_pairs(seq_len, topk) == sum(min(topk, p + 1) for p in range(seq_len))


def test_sparsity_of_the_default_config():
    assert sparsity(512, 512) == 0.0
    assert sparsity(2048, 512) == pytest.approx(1 - (512 * 513 / 2 + 1536 * 512) / (2048 * 2049 / 2))
    assert sparsity(8192, 512) == pytest.approx(0.8789, abs=1e-4)


def test_sparsity_range_is_exact_at_both_ends():
    low, high = sparsity_range(512, 0.85, 0.90)
    assert sparsity(low, 512) >= 0.85 > sparsity(low - 1, 512)
    assert sparsity(high, 512) <= 0.90 < sparsity(high + 1, 512)


def test_the_indexer_op_selects_exactly_the_counted_pairs():
    # The measured sparsity counts valid indices; it equals the analytic one only if the op fills
    # min(topk, allowed) slots of every row.
    from dsa_export.ops import dsa_indexer_topk

    g = torch.Generator().manual_seed(0)
    seq_len, topk = 40, 9
    q, k, w = torch.randn(2, seq_len, 16, 8, generator=g), torch.randn(2, seq_len, 8, generator=g), torch.randn(2, seq_len, 16, generator=g)
    indices = dsa_indexer_topk(q, k, w, topk=topk, scale=0.35, causal=True)
    assert int((indices >= 0).sum()) == 2 * selected_pairs(seq_len, topk)
