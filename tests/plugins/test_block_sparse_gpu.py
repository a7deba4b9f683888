"""The DSABlockSparseAttention CUDA kernels (through the C ABI) against a float64 reference, on a GPU.

The reference here is torch float64 (GPU machines may lack onnx, which dsa_export.ops.reference
imports); ``test_float64_reference_matches_the_ops_reference`` ties it to the op reference on CPU.
Outputs are compared within 2e-2 (bf16), 1e-2 (fp16) and 1e-5 (fp32) of the output scale.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def reference_rows(q, k, v, index, *, block_size, scale, causal, blocks=None):
    """float64 ``{(b, h, i): [rows of query block i, Dv]}`` for the given (or all) query blocks."""
    b_, s, h_, _ = q.shape
    t, hkv = k.shape[1], k.shape[2]
    bs = block_size
    n_kb = -(-t // bs)
    group = h_ // hkv
    q64, k64, v64 = q.double(), k.double(), v.double()
    index = index.cpu()
    if blocks is None:
        blocks = [(b, h, i) for b in range(b_) for h in range(h_) for i in range(index.shape[2])]
    out = {}
    for b, h, i in blocks:
        listed = sorted({int(j) for j in index[b, h, i] if 0 <= int(j) < n_kb})
        rows = torch.arange(i * bs, min(s, i * bs + bs), device=q.device)
        result = torch.zeros(rows.numel(), v.shape[3], dtype=torch.float64, device=q.device)
        if listed:
            keys = torch.cat([torch.arange(j * bs, min(t, j * bs + bs)) for j in listed]).to(q.device)
            logits = q64[b, rows, h] @ k64[b, keys, h // group].T * scale  # [rows, keys]
            if causal:
                logits = logits.masked_fill(keys[None, :] > (t - s + rows)[:, None], float("-inf"))
            seen = torch.isfinite(logits).any(-1)
            probs = torch.softmax(logits, -1).nan_to_num(0.0)
            result = torch.where(seen[:, None], probs @ v64[b, keys, h // group], 0.0)
        out[(b, h, i)] = result
    return out


def _pattern(b, h, n_qb, n_kb, kb, gen, *, causal=True, invalid=0.15):
    """Lists of mostly allowed blocks (diagonal first when causal) with pads, repeats and out-of-range ids."""
    index = torch.full((b, h, n_qb, kb), -1, dtype=torch.int32)
    for bi in range(b):
        for hi in range(h):
            for i in range(n_qb):
                hi_block = min(i, n_kb - 1) if causal else n_kb - 1
                picks = torch.randint(0, hi_block + 1, (kb,), generator=gen)
                if causal:
                    picks[0] = hi_block
                index[bi, hi, i] = picks.to(torch.int32)
    noise = torch.rand(index.shape, generator=gen)
    index = torch.where(noise < invalid, -1, index)
    index = torch.where((noise > 1 - invalid / 3), n_kb + 3, index)  # out of range: ignored
    return index.to(torch.int32)


def _case(B, S, T, H, Hkv, Dk, Dv, bs, Kb, causal, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, Dk, generator=gen).to(dtype)
    k = torch.randn(B, T, Hkv, Dk, generator=gen).to(dtype)
    v = torch.randn(B, T, Hkv, Dv, generator=gen).to(dtype)
    index = _pattern(B, H, -(-S // bs), -(-T // bs), Kb, gen, causal=causal)
    return q, k, v, index


def _compare(got, q, k, v, index, *, bs, scale, causal, blocks=None):
    want = reference_rows(q, k, v, index, block_size=bs, scale=scale, causal=causal, blocks=blocks)
    tol = TOL[q.dtype]
    worst = 0.0
    for (b, h, i), rows in want.items():
        out = got[b, i * bs:i * bs + rows.shape[0], h].double()
        scale_ = max(1.0, float(rows.abs().max()))
        err = float((out - rows).abs().max()) / scale_
        worst = max(worst, err)
        assert err <= tol, f"query block {i} of head {h}, batch row {b}: error {err:.2e} > {tol}"
    return worst


CASES = [
    # name, B, S, T, H, Hkv, Dk, Dv, block_size, Kb, causal, dtype
    ("tc-bf16-bs16", 1, 64, 64, 4, 2, 64, 64, 16, 3, True, "bf16"),
    ("tc-fp16-ragged", 2, 100, 100, 4, 1, 64, 64, 32, 3, True, "fp16"),
    ("tc-bf16-chunked-prefill", 1, 50, 173, 8, 2, 128, 128, 64, 4, True, "bf16"),
    ("tc-bf16-decode", 2, 1, 1000, 16, 1, 128, 128, 64, 8, True, "bf16"),
    ("tc-bf16-dv256", 1, 128, 128, 4, 4, 128, 256, 64, 3, True, "bf16"),
    ("tc-fp16-noncausal", 1, 96, 80, 4, 2, 32, 32, 16, 4, False, "fp16"),
    ("generic-fp32", 1, 70, 70, 4, 2, 40, 24, 16, 4, True, "fp32"),
    ("generic-bf16-bs24", 1, 60, 60, 4, 1, 64, 64, 24, 3, True, "bf16"),
    ("generic-fp16-dv48", 1, 40, 40, 2, 2, 64, 48, 16, 2, True, "fp16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_block_sparse_attention_matches_reference(cuda_kernels, case):
    _, B, S, T, H, Hkv, Dk, Dv, bs, Kb, causal, dtype = case
    q, k, v, index = _case(B, S, T, H, Hkv, Dk, Dv, bs, Kb, causal, DTYPES[dtype], seed=hash(case) % 2**31)
    q, k, v = q.cuda(), k.cuda(), v.cuda()
    got = cuda_kernels.block_sparse_attention(q, k, v, index.cuda(), block_size=bs, scale=Dk**-0.5, causal=causal)
    torch.cuda.synchronize()
    assert got.shape == (B, S, H, Dv) and got.dtype == q.dtype
    _compare(got, q, k, v, index, bs=bs, scale=Dk**-0.5, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("hkv", [1, 16])
def test_block_sparse_attention_at_realistic_size(cuda_kernels, hkv):
    # 4096 tokens, 16 heads of 128, blocks of 64 with 10% of the block grid listed; checked on a
    # sample of query blocks (early, diagonal-heavy, last).
    B, S, H, D, bs = 1, 4096, 16, 128, 64
    n = S // bs
    kb = math.ceil(0.1 * n)
    q, k, v, index = _case(B, S, S, H, hkv, D, D, bs, kb, True, torch.bfloat16, seed=hkv)
    q, k, v = q.cuda(), k.cuda(), v.cuda()
    got = cuda_kernels.block_sparse_attention(q, k, v, index.cuda(), block_size=bs, scale=D**-0.5)
    torch.cuda.synchronize()
    blocks = [(0, h, i) for h in (0, 7, 15) for i in (0, 1, 5, n // 2, n - 1)]
    _compare(got, q, k, v, index, bs=bs, scale=D**-0.5, causal=True, blocks=blocks)


@pytest.mark.gpu
def test_unlisted_blocks_are_never_read_and_empty_rows_are_zero(cuda_kernels):
    B, S, H, D, bs = 1, 256, 4, 64, 32
    n = S // bs
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, S, H, D, generator=gen), torch.randn(B, S, 1, D, generator=gen),
               torch.randn(B, S, 1, D, generator=gen))
    index = torch.full((B, H, n, 2), -1, dtype=torch.int32)
    for i in range(n):
        index[0, :, i, 0] = i - i % 2  # even blocks only
    index[0, 1, 3] = -1  # an empty list: zeros
    for dtype in (torch.float32, torch.bfloat16):
        poisoned_k, poisoned_v = k.clone(), v.clone()
        for j in range(1, n, 2):
            poisoned_k[:, j * bs:(j + 1) * bs] = float("nan")
            poisoned_v[:, j * bs:(j + 1) * bs] = float("nan")
        args = [x.to(dtype).cuda() for x in (q, poisoned_k, poisoned_v)]
        got = cuda_kernels.block_sparse_attention(*args, index.cuda(), block_size=bs, scale=D**-0.5)
        torch.cuda.synchronize()
        assert not torch.isnan(got).any()
        assert torch.count_nonzero(got[0, 3 * bs:4 * bs, 1]) == 0
        _compare(got, *(x.to(dtype).cuda() for x in (q, k, v)), index, bs=bs, scale=D**-0.5, causal=True)


@pytest.mark.gpu
def test_no_keys_and_no_slots_give_zeros(cuda_kernels):
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(1, 0, 1, 64, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(1, 0, 1, 64, dtype=torch.bfloat16, device="cuda")
    out = cuda_kernels.block_sparse_attention(q, k, v, torch.zeros(1, 2, 1, 2, dtype=torch.int32, device="cuda"),
                                              block_size=16, scale=0.125)
    assert torch.count_nonzero(out) == 0
    k = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16, device="cuda")
    out = cuda_kernels.block_sparse_attention(q, k, k.clone(), torch.zeros(1, 2, 1, 0, dtype=torch.int32,
                                                                              device="cuda"),
                                              block_size=16, scale=0.125)
    assert torch.count_nonzero(out) == 0


@pytest.mark.gpu
def test_path_choice(cuda_kernels):
    major = torch.cuda.get_device_capability()[0]
    expect = "tensor-core" if major >= 8 else "generic"
    assert cuda_kernels.block_sparse_attention_path(128, 128, 64, torch.bfloat16) == expect
    assert cuda_kernels.block_sparse_attention_path(128, 128, 64, torch.float32) == "generic"
    assert cuda_kernels.block_sparse_attention_path(64, 64, 24, torch.float16) == "generic"


def test_float64_reference_matches_the_ops_reference():
    """CPU: the reference above equals dsa_export.ops.reference's (ties the GPU checks to the contract)."""
    reference = pytest.importorskip("dsa_export.ops.reference", reason="dsa_export.ops.reference needs onnx")
    for causal in (True, False):
        q, k, v, index = _case(2, 13, 19, 4, 2, 8, 6, 4, 3, causal, torch.float32, seed=int(causal))
        want = reference.block_sparse_attention_reference(q.numpy(), k.numpy(), v.numpy(), index.numpy(),
                                                          block_size=4, scale=0.3, causal=causal)
        got = torch.zeros(want.shape, dtype=torch.float64)
        for (b, h, i), rows in reference_rows(q, k, v, index, block_size=4, scale=0.3, causal=causal).items():
            got[b, i * 4:i * 4 + rows.shape[0], h] = rows
        torch.testing.assert_close(got, torch.from_numpy(want).double(), rtol=1e-6, atol=1e-6)
