"""The torch ops against the NumPy references, across the shapes the contract names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dsa_export.ops import dsa_indexer_topk, dsa_sparse_attention
from dsa_export.ops.reference import indexer_topk_reference, sparse_attention_reference


def _rand(*shape, gen, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def _as_sets(indices: np.ndarray) -> list[set[int]]:
    return [set(int(i) for i in row if i >= 0) for row in indices.reshape(-1, indices.shape[-1])]


INDEXER_CASES = [
    # B, S, T, H, D, topk
    (2, 7, 7, 16, 8, 4),  # prefill, S == T
    (1, 3, 40, 16, 16, 8),  # chunked prefill, S < T
    (2, 1, 33, 16, 8, 16),  # decode, S = 1
    (2, 5, 6, 16, 8, 20),  # T < topk: rows padded with -1
    (3, 12, 12, 4, 32, 12),  # topk == T
]


@pytest.mark.parametrize("case", INDEXER_CASES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_indexer_topk_matches_reference(case, causal, with_lengths):
    b, s, t, h, d, topk = case
    gen = torch.Generator().manual_seed(hash(case) % 2**31)
    q, k, w = _rand(b, s, h, d, gen=gen), _rand(b, t, d, gen=gen), _rand(b, s, h, gen=gen)
    lengths = torch.tensor([max(0, t - 3 * i) for i in range(b)], dtype=torch.int32) if with_lengths else None
    got = dsa_indexer_topk(q, k, w, lengths, topk=topk, scale=d**-0.5, causal=causal).numpy()
    want = indexer_topk_reference(q.numpy(), k.numpy(), w.numpy(), None if lengths is None else lengths.numpy(),
                                  topk=topk, scale=d**-0.5, causal=causal)
    assert got.shape == (b, s, topk) and got.dtype == np.int32
    assert _as_sets(got) == _as_sets(want)
    assert ((got >= 0).sum(-1) == (want >= 0).sum(-1)).all()


def test_indexer_rows_with_no_allowed_key_are_all_minus_one():
    gen = torch.Generator().manual_seed(0)
    q, k, w = _rand(2, 4, 16, 8, gen=gen), _rand(2, 4, 8, gen=gen), _rand(2, 4, 16, gen=gen)
    got = dsa_indexer_topk(q, k, w, torch.tensor([0, 2], dtype=torch.int32), topk=3, scale=0.3)
    assert (got[0] == -1).all()
    assert set(got[1, 0].tolist()) == {0, -1}  # position 0 may only see key 0
    assert (got[1] < 2).all()


def test_indexer_ties_break_toward_lower_index():
    # Every score ties at zero (ReLU of negative logits): the lowest allowed positions win.
    q = -torch.ones(1, 2, 16, 4)
    k = torch.ones(1, 10, 4)
    w = torch.ones(1, 2, 16)
    got = dsa_indexer_topk(q, k, w, topk=3, scale=1.0, causal=True)
    assert got.tolist() == [[[0, 1, 2], [0, 1, 2]]]


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 0), (torch.bfloat16, 0)])
def test_indexer_low_precision_selects_like_reference_on_same_inputs(dtype, tol):
    gen = torch.Generator().manual_seed(3)
    q, k, w = _rand(2, 9, 16, 16, gen=gen, dtype=dtype), _rand(2, 9, 16, gen=gen, dtype=dtype), _rand(2, 9, 16, gen=gen, dtype=dtype)
    got = dsa_indexer_topk(q, k, w, topk=4, scale=0.25).numpy()
    # The reference computes from the same (rounded) inputs in float64; torch accumulates in fp32.
    want = indexer_topk_reference(q.float().numpy(), k.float().numpy(), w.float().numpy(), topk=4, scale=0.25)
    assert _as_sets(got) == _as_sets(want)


def _distinct_indices(b, s, k, t, gen, invalid_fraction=0.25):
    rows = []
    for _ in range(b * s):
        perm = torch.randperm(t + 4, generator=gen)[:k]  # may reach past T: out-of-range entries
        drop = torch.rand(k, generator=gen) < invalid_fraction
        rows.append(torch.where(drop, torch.full_like(perm, -1), perm))
    return torch.stack(rows).reshape(b, s, k).to(torch.int32)


ATTN_CASES = [
    # B, S, T, H, Hkv, Dk, Dv, K
    (2, 5, 12, 8, 1, 24, 16, 6),  # MQA (one latent head)
    (1, 4, 9, 4, 4, 16, 8, 5),  # expanded, Hkv == H
    (2, 3, 20, 6, 2, 8, 12, 7),  # grouped
    (1, 1, 30, 4, 1, 16, 16, 8),  # decode
]


@pytest.mark.parametrize("case", ATTN_CASES)
def test_sparse_attention_matches_reference_fp32(case):
    b, s, t, h, hkv, dk, dv, k_sel = case
    gen = torch.Generator().manual_seed(hash(case) % 2**31)
    q, k, v = _rand(b, s, h, dk, gen=gen), _rand(b, t, hkv, dk, gen=gen), _rand(b, t, hkv, dv, gen=gen)
    idx = _distinct_indices(b, s, k_sel, t, gen)
    got = dsa_sparse_attention(q, k, v, idx, scale=dk**-0.5).numpy()
    want = sparse_attention_reference(q.numpy(), k.numpy(), v.numpy(), idx.numpy(), scale=dk**-0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,rtol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_sparse_attention_low_precision(dtype, rtol):
    gen = torch.Generator().manual_seed(5)
    b, s, t, h, dk, dv, k_sel = 2, 6, 16, 8, 32, 16, 8
    q, k, v = (_rand(b, s, h, dk, gen=gen, dtype=dtype), _rand(b, t, 1, dk, gen=gen, dtype=dtype),
               _rand(b, t, 1, dv, gen=gen, dtype=dtype))
    idx = _distinct_indices(b, s, k_sel, t, gen)
    got = dsa_sparse_attention(q, k, v, idx, scale=dk**-0.5)
    assert got.dtype == dtype
    want = sparse_attention_reference(q.float().numpy(), k.float().numpy(), v.float().numpy(), idx.numpy(), scale=dk**-0.5)
    np.testing.assert_allclose(got.float().numpy(), want, rtol=rtol, atol=rtol)


def test_sparse_attention_rows_without_valid_index_are_zero():
    gen = torch.Generator().manual_seed(1)
    q, k, v = _rand(1, 3, 4, 8, gen=gen), _rand(1, 5, 1, 8, gen=gen), _rand(1, 5, 1, 8, gen=gen)
    idx = torch.tensor([[[-1, -1], [7, -3], [0, -1]]], dtype=torch.int32)
    out = dsa_sparse_attention(q, k, v, idx, scale=0.5)
    assert torch.count_nonzero(out[0, :2]) == 0
    torch.testing.assert_close(out[0, 2], v[0, 0, 0].expand(4, -1))  # one key: softmax weight 1


def test_chunking_gives_the_same_result(monkeypatch):
    from dsa_export.ops import torch_ops

    gen = torch.Generator().manual_seed(2)
    q, k, w = _rand(2, 33, 16, 8, gen=gen), _rand(2, 33, 8, gen=gen), _rand(2, 33, 16, gen=gen)
    qa, ka, va = _rand(2, 33, 4, 8, gen=gen), _rand(2, 33, 1, 8, gen=gen), _rand(2, 33, 1, 8, gen=gen)
    whole_idx = dsa_indexer_topk(q, k, w, topk=5, scale=0.3)
    whole_out = dsa_sparse_attention(qa, ka, va, whole_idx, scale=0.3)
    monkeypatch.setattr(torch_ops, "_CHUNK_BYTES", 1)  # one query row per attention chunk
    monkeypatch.setattr(torch_ops, "_INDEXER_TILE", 1)  # one indexer row per chunk, one key per tile
    monkeypatch.setattr(torch_ops, "_KEY_BLOCK", 1)
    assert torch.equal(dsa_indexer_topk(q, k, w, topk=5, scale=0.3), whole_idx)
    torch.testing.assert_close(dsa_sparse_attention(qa, ka, va, whole_idx, scale=0.3), whole_out)


def test_fake_kernels_pass_opcheck():
    gen = torch.Generator().manual_seed(0)
    q, k, w = _rand(2, 5, 16, 8, gen=gen), _rand(2, 7, 8, gen=gen), _rand(2, 5, 16, gen=gen)
    torch.library.opcheck(torch.ops.dsa.indexer_topk.default, (q, k, w, None, 3, 0.3, True),
                          test_utils=("test_schema", "test_faketensor"))
    idx = dsa_indexer_topk(q, k, w, topk=3, scale=0.3)
    qa, ka, va = _rand(2, 5, 4, 8, gen=gen), _rand(2, 7, 2, 8, gen=gen), _rand(2, 7, 2, 6, gen=gen)
    torch.library.opcheck(torch.ops.dsa.sparse_attention.default, (qa, ka, va, idx, 0.3),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: dsa_indexer_topk(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), topk=1, scale=1.0), "expects q"),
        (lambda: dsa_indexer_topk(torch.zeros(1, 2, 3, 4), torch.zeros(1, 5, 4), torch.zeros(1, 2, 3), topk=0, scale=1.0), "topk"),
        (lambda: dsa_sparse_attention(torch.zeros(1, 2, 3, 4), torch.zeros(1, 5, 2, 4), torch.zeros(1, 5, 2, 4),
                                      torch.zeros(1, 2, 3, dtype=torch.int32), scale=1.0), "multiple"),
    ],
)
def test_bad_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("case", ATTN_CASES)
def test_sparse_attention_values_from_keys(case):
    # v=None: the values are the first Dv channels of the keys (MLA's absorbed form); the op gets
    # the contract's empty v and must equal the same call with v = k[..., :Dv] given explicitly.
    b, s, t, h, hkv, dk, _, k_sel = case
    dv = dk // 2
    gen = torch.Generator().manual_seed(hash(case) % 2**31 + 1)
    q, k = _rand(b, s, h, dk, gen=gen), _rand(b, t, hkv, dk, gen=gen)
    idx = _distinct_indices(b, s, k_sel, t, gen)
    got = dsa_sparse_attention(q, k, None, idx, scale=dk**-0.5, v_head_dim=dv)
    assert got.shape == (b, s, h, dv)
    torch.testing.assert_close(got, dsa_sparse_attention(q, k, k[..., :dv].contiguous(), idx, scale=dk**-0.5))
    want = sparse_attention_reference(q.numpy(), k.numpy(), np.zeros((b, 0, hkv, dv), np.float32), idx.numpy(),
                                      scale=dk**-0.5)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_sparse_attention_trailing_invalid_slots_are_skipped_exactly():
    # The op trims slots past the last valid one of a chunk; slots in the middle stay masked.
    gen = torch.Generator().manual_seed(9)
    q, k, v = _rand(1, 4, 4, 8, gen=gen), _rand(1, 12, 1, 8, gen=gen), _rand(1, 12, 1, 8, gen=gen)
    idx = torch.tensor([[[3, -1, 5, -1, -1, -1], [0, 1, -1, -1, -1, -1], [-1, -1, -1, -1, -1, -1],
                         [11, -1, -1, 2, -1, -1]]], dtype=torch.int32)
    want = sparse_attention_reference(q.numpy(), k.numpy(), v.numpy(), idx.numpy(), scale=0.4)
    np.testing.assert_allclose(dsa_sparse_attention(q, k, v, idx, scale=0.4).numpy(), want, rtol=1e-6, atol=1e-6)


def test_values_from_keys_argument_checks():
    q, k = torch.zeros(1, 2, 4, 8), torch.zeros(1, 5, 1, 8)
    idx = torch.zeros(1, 2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="v_head_dim"):
        dsa_sparse_attention(q, k, None, idx, scale=1.0)
    with pytest.raises(ValueError, match="v_head_dim"):
        dsa_sparse_attention(q, k, None, idx, scale=1.0, v_head_dim=9)
    with pytest.raises(ValueError, match="Dv <= Dk"):
        dsa_sparse_attention(q, k, torch.zeros(1, 0, 1, 9), idx, scale=1.0)
    torch.library.opcheck(torch.ops.dsa.sparse_attention.default, (q, k, k[:, :0, :, :6], idx, 0.3),
                          test_utils=("test_schema", "test_faketensor"))


def _reference_top(scores: torch.Tensor, kk: int) -> list[list[int]]:
    # Stable descending order: ties at the k-th value go to the lower key index.
    order = torch.from_numpy(np.argsort(-scores.double().numpy(), axis=-1, kind="stable")[:, :kk].copy())
    return order.sort(-1).values.tolist()


@pytest.mark.parametrize("pattern", ["random", "sampled-ties", "sample-misses", "flat"])
def test_long_row_selection_is_exact(pattern):
    # Rows of at least _FILTER_RATIO * topk keys are filtered by a sampled threshold first; every
    # way that filter can go (enough candidates, ties, too few candidates, flat rows) must give
    # exactly the contract's top-k.
    from dsa_export.ops import torch_ops

    gen = torch.Generator().manual_seed(3)
    rows, n, kk = 6, 4096, 100
    assert n >= torch_ops._FILTER_RATIO * kk
    scores = torch.rand(rows, n, generator=gen)
    sampled = torch.arange(0, n, torch_ops._SAMPLE_STRIDE)
    if pattern == "sampled-ties":
        scores[:, sampled] = 10.0  # 256 tied keys at the top: the lowest 100 win
    elif pattern == "sample-misses":
        scores[:3, sampled[:20]] = 50.0  # rows 0-2: the sample's threshold leaves fewer than kk candidates
    elif pattern == "flat":
        scores = (torch.rand(rows, n, generator=gen) < 0.7).float()  # most keys tie: no filtering
    scores[1, -7:] = float("-inf")  # disallowed keys of a causal tail
    got = torch_ops._top_positions(scores, kk)
    assert got.tolist() == _reference_top(scores, kk)


@pytest.mark.parametrize("causal", [True, False])
def test_indexer_long_context_matches_reference(causal):
    # T large enough for the filtered selection and several key blocks per chunk.
    gen = torch.Generator().manual_seed(11)
    b, s, t, h, d, topk = 2, 5, 3000, 16, 8, 64
    q, k, w = _rand(b, s, h, d, gen=gen), _rand(b, t, d, gen=gen), _rand(b, s, h, gen=gen)
    lengths = torch.tensor([t, 2100], dtype=torch.int32)
    got = dsa_indexer_topk(q, k, w, lengths, topk=topk, scale=d**-0.5, causal=causal).numpy()
    want = indexer_topk_reference(q.numpy(), k.numpy(), w.numpy(), lengths.numpy(), topk=topk, scale=d**-0.5,
                                  causal=causal)
    assert _as_sets(got) == _as_sets(want)
    assert (np.diff(got, axis=-1) > 0).all()  # ascending positions
