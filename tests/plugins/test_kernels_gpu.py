"""The CUDA kernels (through the C ABI) against the float64 torch references, on a GPU.

Selections are compared as sets; a row whose reference has a (near-)tie at the k-th place may
differ only among the tied keys. Attention is compared within 2e-2 (bf16), 1e-2 (fp16) and 1e-5
(fp32) of the output scale.
"""

from __future__ import annotations

import math
import zlib

import pytest

from . import plugin_reference as ref

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ATTN_TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _randn(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(dtype).cuda()


def assert_same_selection(got: torch.Tensor, q, k, w, lengths, *, topk, scale, causal):
    """Every row selects min(topk, n) distinct allowed keys whose scores match the reference's top set."""
    scores, n = ref.indexer_scores(q, k, w, lengths, scale=scale, causal=causal)
    expect = ref.indexer_topk(q, k, w, lengths, topk=topk, scale=scale, causal=causal)
    got = got.cpu().to(torch.int64)
    B, S, _ = got.shape
    mismatched_rows = 0
    for b in range(B):
        for s in range(S):
            row = got[b, s]
            cnt = min(topk, int(n[b, s]))
            valid = row[row >= 0]
            assert valid.numel() == cnt, f"row ({b},{s}): {valid.numel()} indices, expected {cnt}"
            assert bool((row[row < 0] == -1).all()), f"row ({b},{s}): padding must be -1"
            assert valid.unique().numel() == cnt, f"row ({b},{s}): duplicate indices"
            if cnt == 0:
                continue
            assert int(valid.max()) < int(n[b, s]), f"row ({b},{s}): selected a disallowed key"
            want = expect[b, s][:cnt].to(torch.int64)
            if set(valid.tolist()) == set(want.tolist()):
                continue
            # Only acceptable when the k-th place is a tie (within fp32 accumulation error).
            srow = scores[b, s]
            kth = srow[want].min()
            tol = 1e-5 * float(srow[: int(n[b, s])].abs().max()) + 1e-12
            got_scores = srow[valid]
            assert float(got_scores.min()) >= float(kth) - tol, (
                f"row ({b},{s}): selected a key scoring {float(got_scores.min())} below the k-th score {float(kth)}"
            )
            mismatched_rows += 1
    return mismatched_rows


INDEXER_CASES = [
    # name, B, S, T, H, D, topk, causal, with_lengths, dtype, w_dtype
    ("prefill-bf16", 2, 37, 300, 16, 64, 64, True, False, "bf16", "bf16"),
    ("prefill-fp16-wfp32", 2, 37, 300, 16, 64, 64, True, False, "fp16", "fp32"),
    ("prefill-fp32", 1, 20, 200, 16, 32, 32, True, False, "fp32", "fp32"),
    ("T-lt-topk", 2, 8, 50, 16, 64, 64, True, False, "bf16", "bf16"),
    ("decode-S1", 3, 1, 3000, 64, 128, 2048, True, False, "bf16", "fp32"),
    ("lengths", 3, 16, 700, 16, 64, 128, True, True, "bf16", "bf16"),
    ("noncausal-lengths", 2, 9, 500, 16, 64, 100, False, True, "fp16", "fp16"),
    ("heads-not-16", 1, 12, 400, 20, 64, 50, True, False, "bf16", "bf16"),
    ("D-not-16-generic", 1, 12, 400, 16, 40, 50, True, False, "bf16", "bf16"),
    ("long-T-multi-slice", 1, 4, 5000, 64, 128, 2048, True, False, "bf16", "fp32"),
    ("S-gt-T", 1, 10, 6, 16, 64, 4, True, False, "bf16", "bf16"),
]


@pytest.mark.parametrize("case", INDEXER_CASES, ids=[c[0] for c in INDEXER_CASES])
def test_indexer_topk_matches_reference(cuda_kernels, case):
    _, B, S, T, H, D, topk, causal, with_lengths, dt, wdt = case
    gen = _gen(zlib.crc32(case[0].encode()))
    dtype, w_dtype = DTYPES[dt], DTYPES[wdt]
    q = _randn((B, S, H, D), dtype, gen)
    k = _randn((B, T, D), dtype, gen)
    w = _randn((B, S, H), w_dtype, gen, scale=H ** -0.5)
    lengths = None
    if with_lengths:
        lengths = torch.randint(0, T + 1, (B,), generator=gen, dtype=torch.int32)
        lengths[0] = T  # keep one full row
        lengths = lengths.cuda()
    scale = D ** -0.5
    got = cuda_kernels.indexer_topk(q, k, w, lengths, topk=topk, scale=scale, causal=causal)
    torch.cuda.synchronize()
    assert got.shape == (B, S, topk) and got.dtype == torch.int32
    mismatched = assert_same_selection(got, q, k, w, lengths, topk=topk, scale=scale, causal=causal)
    assert mismatched <= max(1, B * S // 50), f"{mismatched} rows differ on ties"


def test_indexer_topk_small_workspace_chunks_rows(cuda_kernels):
    """A workspace of 3 rows forces the launcher to walk the rows in chunks."""
    B, S, T, H, D, topk = 2, 11, 900, 16, 64, 100
    gen = _gen(7)
    q, k = _randn((B, S, H, D), torch.bfloat16, gen), _randn((B, T, D), torch.bfloat16, gen)
    w = _randn((B, S, H), torch.float32, gen, scale=0.25)
    ws = torch.empty(3 * T * 4, dtype=torch.uint8, device="cuda")
    got = cuda_kernels.indexer_topk(q, k, w, topk=topk, scale=D ** -0.5, workspace=ws)
    torch.cuda.synchronize()
    assert assert_same_selection(got, q, k, w, None, topk=topk, scale=D ** -0.5, causal=True) <= 1


def test_indexer_topk_exact_ties_break_toward_lower_index(cuda_kernels):
    """All-zero scores (every q.k negative) tie everywhere: the kernel takes the lowest indices, like the reference."""
    B, S, T, H, D, topk = 1, 4, 300, 16, 64, 32
    q = -torch.ones((B, S, H, D), dtype=torch.bfloat16, device="cuda")
    k = torch.ones((B, T, D), dtype=torch.bfloat16, device="cuda")
    w = torch.ones((B, S, H), dtype=torch.bfloat16, device="cuda")
    got = cuda_kernels.indexer_topk(q, k, w, topk=topk, scale=0.125, causal=False).cpu()
    for s in range(S):
        assert sorted(got[0, s].tolist()) == list(range(topk))


def test_indexer_topk_workspace_too_small_is_an_error(cuda_kernels):
    from dsa_export.plugins.kernels import KernelError

    q = torch.zeros((1, 2, 16, 64), dtype=torch.bfloat16, device="cuda")
    k = torch.zeros((1, 100, 64), dtype=torch.bfloat16, device="cuda")
    w = torch.zeros((1, 2, 16), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(KernelError, match="workspace"):
        cuda_kernels.indexer_topk(q, k, w, topk=8, scale=1.0, workspace=torch.empty(16, dtype=torch.uint8, device="cuda"))


def _indices(B, S, T, K, gen, *, pad_frac=0.1, oob=True):
    """Unique random key indices per row with some -1 padding and out-of-range entries."""
    idx = torch.full((B, S, K), -1, dtype=torch.int32)
    for b in range(B):
        for s in range(S):
            n = min(K, T)
            perm = torch.randperm(T, generator=gen)[:n].to(torch.int32)
            idx[b, s, :n] = perm
    drop = torch.rand((B, S, K), generator=gen) < pad_frac
    idx[drop] = -1
    if oob:
        bad = torch.rand((B, S, K), generator=gen) < 0.02
        idx[bad] = T + 5
    return idx.cuda()


ATTN_CASES = [
    # name, B, S, T, H, Hkv, Dk, Dv, K, dtype
    ("mqa-576-512-h64-bf16", 1, 3, 3000, 64, 1, 576, 512, 2048, "bf16"),
    ("mqa-576-512-h128-bf16", 1, 2, 2500, 128, 1, 576, 512, 2048, "bf16"),
    ("mqa-576-512-h128-fp16", 2, 2, 1000, 128, 1, 576, 512, 300, "fp16"),
    ("mqa-576-512-h16-fp32", 1, 2, 500, 16, 1, 576, 512, 100, "fp32"),
    ("per-head-192-128-bf16", 2, 3, 600, 4, 4, 192, 128, 256, "bf16"),
    ("per-head-192-256-bf16", 1, 3, 600, 4, 4, 192, 256, 256, "bf16"),
    ("per-head-192-128-fp32", 1, 2, 300, 4, 4, 192, 128, 64, "fp32"),
    ("group16-64-128-bf16", 2, 3, 400, 32, 2, 64, 128, 70, "bf16"),
    ("group32-128-256-fp16", 1, 2, 400, 64, 2, 128, 256, 96, "fp16"),
    ("T-lt-K", 1, 4, 100, 64, 1, 576, 512, 256, "bf16"),
    ("S1-decode", 2, 1, 5000, 128, 1, 576, 512, 2048, "bf16"),
    ("odd-D-generic", 1, 2, 200, 8, 2, 72, 40, 33, "bf16"),
]


@pytest.mark.parametrize("case", ATTN_CASES, ids=[c[0] for c in ATTN_CASES])
def test_sparse_attention_matches_reference(cuda_kernels, case):
    _, B, S, T, H, Hkv, Dk, Dv, K, dt = case
    dtype = DTYPES[dt]
    gen = _gen(zlib.crc32(case[0].encode()))
    q = _randn((B, S, H, Dk), dtype, gen)
    k = _randn((B, T, Hkv, Dk), dtype, gen)
    v = _randn((B, T, Hkv, Dv), dtype, gen)
    idx = _indices(B, S, T, K, gen)
    scale = Dk ** -0.5
    got = cuda_kernels.sparse_attention(q, k, v, idx, scale=scale)
    torch.cuda.synchronize()
    want = ref.sparse_attention(q, k, v, idx, scale=scale)
    assert got.shape == (B, S, H, Dv) and got.dtype == dtype
    tol = ATTN_TOL[dtype]
    err = (got.double().cpu() - want).abs().max().item()
    bound = tol * max(want.abs().max().item(), 1e-3)
    assert math.isfinite(err) and err <= bound, f"max abs error {err:.3e} > {bound:.3e} ({dt})"


def test_sparse_attention_rows_without_valid_index_are_zero(cuda_kernels):
    B, S, T, H, Hkv, Dk, Dv, K = 1, 3, 50, 64, 1, 576, 512, 64
    gen = _gen(3)
    q = _randn((B, S, H, Dk), torch.bfloat16, gen)
    k = _randn((B, T, Hkv, Dk), torch.bfloat16, gen)
    v = _randn((B, T, Hkv, Dv), torch.bfloat16, gen)
    idx = torch.full((B, S, K), -1, dtype=torch.int32)
    idx[0, 1, :10] = torch.arange(10, dtype=torch.int32)
    idx[0, 2, :] = T + 1  # all out of range
    got = cuda_kernels.sparse_attention(q, k, v, idx.cuda(), scale=Dk ** -0.5).cpu()
    assert bool((got[0, 0] == 0).all()) and bool((got[0, 2] == 0).all())
    assert bool(got[0, 1].abs().sum() > 0)


def test_sparse_attention_uses_tensor_cores_for_mqa_bf16(cuda_kernels):
    major = torch.cuda.get_device_capability()[0]
    expect = "tensor-core" if major >= 8 else "generic"
    assert cuda_kernels.sparse_attention_path(128, 1, 576, 512, torch.bfloat16) == expect
    assert cuda_kernels.sparse_attention_path(4, 4, 192, 128, torch.bfloat16) == "generic"
    assert cuda_kernels.indexer_topk_path(64, 128, torch.bfloat16) == expect
