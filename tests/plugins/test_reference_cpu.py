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


def test_values_from_keys_reference_agrees_with_the_package_ops():
    """An empty v [B,0,Hkv,Dv] takes the values from the first Dv key channels in all three references
    (the kernels' float64 one, dsa_export.ops.reference and the torch op)."""
    from dsa_export.ops import dsa_sparse_attention

    sparse_attention_reference = pytest.importorskip("dsa_export.ops.reference").sparse_attention_reference
    gen = torch.Generator().manual_seed(8)
    B, S, T, H, Hkv, Dk, Dv, K = 2, 3, 30, 8, 2, 24, 16, 12
    q, k = torch.randn(B, S, H, Dk, generator=gen), torch.randn(B, T, Hkv, Dk, generator=gen)
    idx = torch.randint(-1, T + 2, (B, S, K), generator=gen, dtype=torch.int32)
    empty = k[:, :0, :, :Dv]
    mine = ref.sparse_attention(q, k, empty, idx, scale=0.3)
    assert mine.shape == (B, S, H, Dv)
    torch.testing.assert_close(mine, ref.sparse_attention(q, k, k[..., :Dv], idx, scale=0.3), atol=0, rtol=0)
    theirs = sparse_attention_reference(q.numpy(), k.numpy(), empty.numpy(), idx.numpy(), scale=0.3)
    torch.testing.assert_close(mine.float(), torch.from_numpy(theirs), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(dsa_sparse_attention(q, k, empty, idx, scale=0.3), mine.float(), atol=1e-5, rtol=1e-5)


def _moe_inputs(gen, N, K, E, H, I):
    x = torch.randn(N, H, generator=gen)
    ids = torch.randint(0, E, (N, K), generator=gen, dtype=torch.int32)
    ids[0, 0] = -1
    ids[1 % N, K - 1] = E + 2  # out of range: skipped
    ids[2 % N, :] = -1         # a token without any expert
    ids[3 % N, 1] = ids[3 % N, 0]  # the same expert twice in a row counts twice
    w = torch.rand(N, K, generator=gen)
    gate_up = torch.randn(E, 2 * I, H, generator=gen) * H ** -0.5
    down = torch.randn(E, H, I, generator=gen) * I ** -0.5
    return x, ids, w, gate_up, down


def test_moe_reference_matches_a_loop():
    gen = torch.Generator().manual_seed(11)
    N, K, E, H, I = 6, 3, 5, 8, 4
    x, ids, w, gate_up, down = _moe_inputs(gen, N, K, E, H, I)
    got = ref.moe_experts(x, ids, w, gate_up, down)
    assert got.dtype == torch.float64
    for n in range(N):
        want = torch.zeros(H, dtype=torch.float64)
        for k in range(K):
            e = int(ids[n, k])
            if not 0 <= e < E:
                continue
            g = gate_up[e, :I].double() @ x[n].double()
            u = gate_up[e, I:].double() @ x[n].double()
            want += float(w[n, k]) * (down[e].double() @ (g * torch.sigmoid(g) * u))
        torch.testing.assert_close(got[n], want)
    assert torch.all(got[2] == 0)


def test_block_quantization_round_trips_within_fp8_precision():
    gen = torch.Generator().manual_seed(12)
    w = torch.randn(3, 300, 200, generator=gen)
    q, scale = ref.quantize_blocks(w, 128)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 3, 2)
    back = ref.dequantize_blocks(q, scale, 128)
    # e4m3 keeps 3 mantissa bits: relative rounding error at most 2^-4 (normal range).
    rel = ((back - w.double()).abs() / w.double().abs().clamp(min=1e-3)).max()
    assert float(rel) <= 2 ** -4 + 1e-6
    # a block's largest magnitude maps to 448 exactly
    assert float(q[0, :128, :128].float().abs().max()) == 448.0


def test_moe_references_agree_with_the_package_ops():
    """Ties the kernels' float64 MoE reference to dsa_export.ops (torch op and NumPy reference)."""
    ops = pytest.importorskip("dsa_export.ops")
    reference = pytest.importorskip("dsa_export.ops.reference")
    if not hasattr(ops, "dsa_moe_experts"):
        pytest.skip("dsa_export.ops has no routed-experts op yet")
    gen = torch.Generator().manual_seed(13)
    N, K, E, H, I = 9, 4, 6, 32, 16
    x, ids, w, gate_up, down = _moe_inputs(gen, N, K, E, H, I)
    mine = ref.moe_experts(x, ids, w, gate_up, down)
    # their reference returns x's dtype: hand it float64 x to compare in float64
    theirs = reference.moe_experts_reference(x.double().numpy(), ids.numpy(), w.numpy(), gate_up.numpy(), down.numpy())
    torch.testing.assert_close(mine, torch.from_numpy(theirs).double(), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(ops.dsa_moe_experts(x, ids, w, gate_up, down).double(), mine, atol=1e-4, rtol=1e-4)
    q_gu, s_gu = ref.quantize_blocks(gate_up, 16)
    q_dn, s_dn = ref.quantize_blocks(down, 16)
    mine8 = ref.moe_experts(x, ids, w, q_gu, q_dn, s_gu, s_dn, block_size=16)
    theirs8 = reference.moe_experts_fp8_reference(
        x.double().numpy(), ids.numpy(), w.numpy(), q_gu.float().numpy(), q_dn.float().numpy(), s_gu.numpy(),
        s_dn.numpy(),
        block_size=16)
    # moe_experts_fp8_reference hands the dequantized weights to moe_experts_reference, which reads
    # its inputs through float32: fp8 * scale is rounded to float32 there, so agree to float32 precision.
    torch.testing.assert_close(mine8, torch.from_numpy(theirs8).double(), atol=1e-6, rtol=1e-5)
    op8 = ops.dsa_moe_experts_fp8(x, ids, w, q_gu, q_dn, s_gu, s_dn, block_size=16)
    torch.testing.assert_close(op8.double(), mine8, atol=1e-4, rtol=1e-4)
