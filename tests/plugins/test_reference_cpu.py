"""The float64 references the GPU tests trust, checked against plain loops on CPU."""

from __future__ import annotations

import pytest

from . import plugin_reference as ref

torch = pytest.importorskip("torch")


def test_indexer_reference_matches_a_loop():
    gen = torch.Generator().manual_seed(0)
    B, S, T, H, D, topk = 2, 5, 9, 3, 4, 4
    q, k = torch.randn(B, S, H, D, generator=gen), torch.randn(B, T, D, generator=gen)
    w = torch.randn(B, S, H, generator=gen)
    lengths = torch.tensor([9, 6], dtype=torch.int32)
    got = ref.indexer_topk(q, k, w, lengths, topk=topk, scale=0.5, causal=True)
    for b in range(B):
        for s in range(S):
            n = min(T - S + s + 1, int(lengths[b]))
            scores = []
            for t in range(n):
                val = sum(float(w[b, s, h]) * max(0.0, 0.5 * float(q[b, s, h] @ k[b, t])) for h in range(H))
                scores.append((-val, t))
            want = [t for _, t in sorted(scores)[:topk]] + [-1] * max(0, topk - n)
            assert got[b, s].tolist() == want


def test_indexer_reference_breaks_ties_toward_lower_index():
    q = -torch.ones(1, 1, 2, 4)
    k = torch.ones(1, 6, 4)
    w = torch.ones(1, 1, 2)
    got = ref.indexer_topk(q, k, w, topk=3, scale=1.0, causal=True)
    assert got[0, 0].tolist() == [0, 1, 2]


def test_sparse_attention_reference_matches_a_loop():
    gen = torch.Generator().manual_seed(1)
    B, S, T, H, Hkv, Dk, Dv, K = 1, 3, 7, 4, 2, 5, 3, 4
    q = torch.randn(B, S, H, Dk, generator=gen)
    k, v = torch.randn(B, T, Hkv, Dk, generator=gen), torch.randn(B, T, Hkv, Dv, generator=gen)
    idx = torch.tensor([[[0, 3, -1, 6], [9, -1, 2, 2], [-1, -1, 7, -5]]], dtype=torch.int32)
    got = ref.sparse_attention(q, k, v, idx, scale=0.3)
    for s in range(S):
        for h in range(H):
            g = h // (H // Hkv)
            sel = [int(i) for i in idx[0, s] if 0 <= int(i) < T]
            if not sel:
                assert torch.all(got[0, s, h] == 0)
                continue
            logits = torch.stack([0.3 * (q[0, s, h].double() @ k[0, i, g].double()) for i in sel])
            p = torch.softmax(logits, 0)
            want = sum(p[j] * v[0, i, g].double() for j, i in enumerate(sel))
            torch.testing.assert_close(got[0, s, h], want)


def test_float64_references_agree_with_the_package_ops():
    """Ties the kernels' float64 references to dsa_export.ops, the contract's torch implementation."""
    from dsa_export.ops import dsa_indexer_topk, dsa_sparse_attention

    gen = torch.Generator().manual_seed(7)
    B, S, T, H, D = 2, 6, 40, 16, 16
    q, k, w = torch.randn(B, S, H, D, generator=gen), torch.randn(B, T, D, generator=gen), torch.randn(B, S, H, generator=gen)
    lengths = torch.tensor([40, 31], dtype=torch.int32)
    for topk in (8, 64):
        mine = ref.indexer_topk(q, k, w, lengths, topk=topk, scale=0.25, causal=True)
        ours = dsa_indexer_topk(q, k, w, lengths, topk=topk, scale=0.25, causal=True)
        assert [set(r.tolist()) for r in mine.reshape(-1, topk)] == [set(r.tolist()) for r in ours.reshape(-1, topk)]
    qa, ka, va = torch.randn(B, S, 8, 24, generator=gen), torch.randn(B, T, 1, 24, generator=gen), torch.randn(B, T, 1, 16, generator=gen)
    idx = dsa_indexer_topk(q, k, w, lengths, topk=8, scale=0.25)
    torch.testing.assert_close(ref.sparse_attention(qa, ka, va, idx, scale=0.2).float(),
                               dsa_sparse_attention(qa, ka, va, idx, scale=0.2), atol=1e-5, rtol=1e-5)
