"""The CUDA kernels (through the C ABI) against the float64 torch references, on a GPU.

Selections are compared as sets; a row whose reference has a (near-)tie at the k-th place may
differ only among the tied keys. Attention is compared within 2e-2 (bf16), 1e-2 (fp16) and 1e-5
(fp32) of the output scale. Routed experts: see MOE_TOL for the bounds and why.
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


# Values from keys: the contract's empty v [B,0,Hkv,Dv] means the values are the first Dv channels
# of k's rows (DeepSeek's absorbed MLA: Dk = 576, Dv = 512). Held to dsa_export.ops.reference with
# the same empty v, and to the same kernel given those channels as an explicit v: the kernel reads
# the value operand out of the K tile with the same arithmetic, so the two forms agree bit for bit.
VFK_CASES = [
    # name, B, S, T, H, Hkv, Dk, Dv, K, dtype
    ("vfk-small-tc-144-128-bf16", 2, 3, 300, 16, 1, 144, 128, 64, "bf16"),
    ("vfk-small-tc-dv-eq-dk-fp16", 1, 2, 300, 32, 2, 128, 128, 96, "fp16"),
    ("vfk-small-generic-72-40-bf16", 1, 2, 200, 8, 2, 72, 40, 33, "bf16"),
    ("vfk-small-generic-72-40-fp32", 1, 3, 200, 4, 2, 72, 40, 33, "fp32"),
    ("vfk-per-head-192-128-bf16", 1, 2, 400, 4, 4, 192, 128, 100, "bf16"),
    ("vfk-mla-576-512-h128-bf16", 1, 2, 2500, 128, 1, 576, 512, 2048, "bf16"),
    ("vfk-mla-576-512-h64-fp16", 1, 2, 3000, 64, 1, 576, 512, 2048, "fp16"),
    ("vfk-mla-576-512-h16-fp32", 1, 2, 500, 16, 1, 576, 512, 100, "fp32"),
    ("vfk-mla-S1-decode-h128-bf16", 2, 1, 5000, 128, 1, 576, 512, 2048, "bf16"),
    ("vfk-mla-T-lt-K-h64-bf16", 1, 4, 100, 64, 1, 576, 512, 256, "bf16"),
]


def _ops_reference_attention(q, k, v, idx, *, scale):
    """dsa_export.ops.reference (NumPy, float64 inside) on the same inputs, as float64 torch. That
    module imports onnx; where onnx is missing, the float64 torch reference of this folder, which
    test_reference_cpu.py ties to it (empty v included)."""
    try:
        from dsa_export.ops.reference import sparse_attention_reference
    except ImportError:
        return ref.sparse_attention(q, k, v, idx, scale=scale)

    def arr(t):
        return t.float().cpu().numpy()  # bf16/fp16 -> fp32 is exact

    out = sparse_attention_reference(arr(q), arr(k), arr(v), idx.cpu().numpy(), scale=scale)
    return torch.from_numpy(out).double()


@pytest.mark.parametrize("case", VFK_CASES, ids=[c[0] for c in VFK_CASES])
def test_sparse_attention_values_from_keys_matches_reference(cuda_kernels, case):
    _, B, S, T, H, Hkv, Dk, Dv, K, dt = case
    dtype = DTYPES[dt]
    gen = _gen(zlib.crc32(case[0].encode()))
    q = _randn((B, S, H, Dk), dtype, gen)
    k = _randn((B, T, Hkv, Dk), dtype, gen)
    idx = _indices(B, S, T, K, gen)
    scale = Dk ** -0.5
    empty_v = k[:, :0, :, :Dv]  # the contract's form: a view of k with no rows
    got = cuda_kernels.sparse_attention(q, k, empty_v, idx, scale=scale)
    torch.cuda.synchronize()
    assert got.shape == (B, S, H, Dv) and got.dtype == dtype
    want = _ops_reference_attention(q, k, empty_v, idx, scale=scale)
    tol = ATTN_TOL[dtype]
    err = (got.double().cpu() - want).abs().max().item()
    bound = tol * max(want.abs().max().item(), 1e-3)
    assert math.isfinite(err) and err <= bound, f"max abs error {err:.3e} > {bound:.3e} ({dt})"
    explicit = cuda_kernels.sparse_attention(q, k, k[..., :Dv].contiguous(), idx, scale=scale)
    assert torch.equal(got, explicit), "values from keys differ from the same channels passed as v"
    by_dim = cuda_kernels.sparse_attention(q, k, None, idx, scale=scale, v_head_dim=Dv)
    assert torch.equal(got, by_dim)
    detached = torch.empty((B, 0, Hkv, Dv), dtype=dtype, device="cuda")  # an empty v not viewing k
    assert torch.equal(got, cuda_kernels.sparse_attention(q, k, detached, idx, scale=scale))


def test_sparse_attention_values_from_keys_rows_without_valid_index_are_zero(cuda_kernels):
    B, S, T, H, Hkv, Dk, Dv, K = 1, 3, 50, 64, 1, 576, 512, 64
    gen = _gen(4)
    q = _randn((B, S, H, Dk), torch.bfloat16, gen)
    k = _randn((B, T, Hkv, Dk), torch.bfloat16, gen)
    idx = torch.full((B, S, K), -1, dtype=torch.int32)
    idx[0, 1, :10] = torch.arange(10, dtype=torch.int32)
    idx[0, 2, :] = T + 1  # all out of range
    got = cuda_kernels.sparse_attention(q, k, k[:, :0, :, :Dv], idx.cuda(), scale=Dk ** -0.5).cpu()
    assert bool((got[0, 0] == 0).all()) and bool((got[0, 2] == 0).all())
    assert bool(got[0, 1].abs().sum() > 0)


def test_sparse_attention_values_from_keys_refuses_bad_forms(cuda_kernels):
    q = torch.zeros((1, 2, 16, 64), dtype=torch.bfloat16, device="cuda")
    k = torch.zeros((1, 40, 1, 64), dtype=torch.bfloat16, device="cuda")
    idx = torch.zeros((1, 2, 8), dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="Dv <= Dk"):
        cuda_kernels.sparse_attention(q, k, torch.zeros((1, 0, 1, 128), dtype=torch.bfloat16, device="cuda"), idx,
                                      scale=1.0)
    with pytest.raises(ValueError, match="T or 0 rows"):
        cuda_kernels.sparse_attention(q, k, torch.zeros((1, 7, 1, 32), dtype=torch.bfloat16, device="cuda"), idx,
                                      scale=1.0)
    # T = 0: nothing to read in either form, every row is 0.
    out = cuda_kernels.sparse_attention(q, k[:, :0], torch.zeros((1, 0, 1, 128), dtype=torch.bfloat16, device="cuda"),
                                        idx, scale=1.0)
    assert out.shape == (1, 2, 16, 128) and bool((out == 0).all())


def test_sparse_attention_uses_tensor_cores_for_mqa_bf16(cuda_kernels):
    major = torch.cuda.get_device_capability()[0]
    expect = "tensor-core" if major >= 8 else "generic"
    assert cuda_kernels.sparse_attention_path(128, 1, 576, 512, torch.bfloat16) == expect
    assert cuda_kernels.sparse_attention_path(4, 4, 192, 128, torch.bfloat16) == "generic"
    assert cuda_kernels.indexer_topk_path(64, 128, torch.bfloat16) == expect


# ---------------------------------------------------------------------------------------------
# Routed experts (DSAMoEExperts / DSAMoEExpertsFP8).
#
# Bounds on max|out - ref| / max|ref| (ref in float64). The kernels accumulate in fp32 and round
# twice: the SiLU * up activation to x's dtype (it is the down GEMM's MMA operand) and the output.
# Each rounding is at most 2^-9 (bf16) / 2^-12 (fp16) relative per element; the activation error
# averages over the I terms of the down dot product, so the max error over a case stays near
# 2-3 output roundings: 1e-2 for bf16 (about 5x 2^-9) and 2e-3 for fp16 (about 8x 2^-12). FP8
# weights are dequantized (fp8 * block scale, exact in fp32) and rounded once more to x's dtype,
# one more error of the same size in both GEMMs: 2e-2 / 4e-3. float32 runs the CUDA-core path in
# fp32 throughout: 2e-5 (H, I <= 512 terms of fp32 sums).
MOE_TOL = {
    (torch.float32, False): 2e-5, (torch.float16, False): 2e-3, (torch.bfloat16, False): 1e-2,
    (torch.float32, True): 2e-5, (torch.float16, True): 4e-3, (torch.bfloat16, True): 2e-2,
}


def _moe_routing(N, K, E, gen, *, empty_frac=0.1, oob_frac=0.02, experts=None):
    """topk_ids [N,K] int32 with -1 slots, out-of-range ids and (through `experts`) unused experts;
    some tokens get no expert at all, and repeated experts in a row are allowed."""
    pool = torch.arange(E) if experts is None else torch.as_tensor(experts)
    ids = pool[torch.randint(0, pool.numel(), (N, K), generator=gen)].to(torch.int32)
    r = torch.rand((N, K), generator=gen)
    ids[r < empty_frac] = -1
    ids[(r >= empty_frac) & (r < empty_frac + oob_frac)] = E + 3
    if N > 4:
        ids[N // 3] = -1  # a token without experts: its output is exactly 0
    return ids


def _moe_case(N, K, E, H, I, dtype, *, fp8=False, block_size=128, w_dtype=torch.float32, seed=0, experts=None):
    gen = _gen(seed)
    x = torch.randn(N, H, generator=gen).to(dtype)
    ids = _moe_routing(N, K, E, gen, experts=experts)
    w = (torch.rand(N, K, generator=gen) / K).to(w_dtype)
    gate_up = torch.randn(E, 2 * I, H, generator=gen) * H ** -0.5
    down = torch.randn(E, H, I, generator=gen) * I ** -0.5
    if fp8:
        gate_up, gu_scale = ref.quantize_blocks(gate_up, block_size)
        down, dn_scale = ref.quantize_blocks(down, block_size)
        scales = (gu_scale.cuda(), dn_scale.cuda())
    else:
        gate_up, down = gate_up.to(dtype), down.to(dtype)
        scales = (None, None)
    return (x.cuda(), ids.cuda(), w.cuda(), gate_up.cuda(), down.cuda(), *scales)


def _moe_check(got, args, dtype, fp8, block_size, what):
    want = ref.moe_experts(*args, block_size=block_size)
    assert got.shape == args[0].shape and got.dtype == dtype
    scale = max(want.abs().max().item(), 1e-6)
    err = (got.double() - want).abs().max().item()
    tol = MOE_TOL[(dtype, fp8)]
    assert math.isfinite(err) and err <= tol * scale, f"{what}: max abs error {err:.3e} > {tol} * {scale:.3e}"
    ids = args[1]
    E = args[3].shape[0]
    silent = ~((ids >= 0) & (ids < E)).any(dim=1)
    assert bool((got[silent] == 0).all()), f"{what}: tokens without a valid expert must be exactly 0"
    return err / scale


MOE_CASES = [
    # name, N, K, E, H, I, dtype, fp8, block_size, topk_weights dtype
    ("decode-N1-E256-bf16", 1, 8, 256, 256, 128, "bf16", False, 128, "fp32"),
    ("decode-N4-E64-fp16", 4, 8, 64, 128, 64, "fp16", False, 128, "fp16"),
    ("N64-E256-bf16", 64, 8, 256, 256, 128, "bf16", False, 128, "bf16"),
    ("N300-E64-bf16-medium", 300, 8, 64, 512, 256, "bf16", False, 128, "fp32"),
    ("N4096-E256-bf16-large", 4096, 8, 256, 256, 128, "bf16", False, 128, "fp32"),
    ("N2048-E16-fp16-large", 2048, 8, 16, 256, 192, "fp16", False, 128, "fp32"),
    ("N65-E16-fp32-generic", 65, 4, 16, 96, 40, "fp32", False, 128, "fp32"),
    ("N40-E8-bf16-H100-generic", 40, 8, 8, 100, 36, "bf16", False, 128, "bf16"),
    ("fp8-N33-E32-bf16", 33, 8, 32, 512, 256, "bf16", True, 128, "fp32"),
    ("fp8-N1-E256-bf16-decode", 1, 8, 256, 512, 256, "bf16", True, 128, "fp32"),
    ("fp8-N1024-E32-fp16-partial-blocks", 1024, 8, 32, 256, 320, "fp16", True, 128, "fp32"),
    ("fp8-N200-E16-bf16-bs64", 200, 8, 16, 192, 128, "bf16", True, 64, "bf16"),
    ("fp8-N20-E8-fp32-generic", 20, 8, 8, 64, 48, "fp32", True, 32, "fp32"),
    ("fp8-N50-E8-bf16-bs24-generic", 50, 8, 8, 96, 64, "bf16", True, 24, "fp32"),
]


@pytest.mark.parametrize("case", MOE_CASES, ids=[c[0] for c in MOE_CASES])
def test_moe_experts_matches_reference(cuda_kernels, case):
    name, N, K, E, H, I, dt, fp8, bs, wdt = case
    dtype = DTYPES[dt]
    args = _moe_case(N, K, E, H, I, dtype, fp8=fp8, block_size=bs, w_dtype=DTYPES[wdt], seed=zlib.crc32(name.encode()))
    got = cuda_kernels.moe_experts(*args, block_size=bs)
    torch.cuda.synchronize()
    _moe_check(got, args, dtype, fp8, bs, name)


def test_moe_experts_empty_experts_and_all_slots_invalid(cuda_kernels):
    """Only 3 of 64 experts receive tokens; then no slot is valid at all (all outputs 0)."""
    args = _moe_case(257, 8, 64, 128, 64, torch.bfloat16, experts=[5, 17, 63], seed=21)
    _moe_check(cuda_kernels.moe_experts(*args), args, torch.bfloat16, False, 128, "three experts used")
    x, ids, w, gu, dn, _, _ = args
    got = cuda_kernels.moe_experts(x, torch.full_like(ids, -1), w, gu, dn)
    assert bool((got == 0).all())
    assert cuda_kernels.moe_experts(x[:0], ids[:0], w[:0], gu, dn).shape == (0, x.shape[1])


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_moe_experts_paths_agree_and_tensor_core_tiles_are_bitwise_equal(cuda_kernels, fp8):
    """Every kernel family is within tolerance; the three tensor-core tile heights share one k order,
    so they give the same bits (which is what makes the output independent of the batch)."""
    args = _moe_case(300, 8, 32, 256, 128, torch.bfloat16, fp8=fp8, seed=22)
    outs = {}
    for path in ("generic", "tensor-core-16", "tensor-core-64", "tensor-core-128"):
        outs[path] = cuda_kernels.moe_experts(*args, path=path)
        _moe_check(outs[path], args, torch.bfloat16, fp8, 128, path)
    assert torch.equal(outs["tensor-core-16"], outs["tensor-core-64"])
    assert torch.equal(outs["tensor-core-16"], outs["tensor-core-128"])


def test_moe_experts_is_deterministic_and_batch_invariant(cuda_kernels):
    args = _moe_case(1024, 8, 64, 256, 128, torch.bfloat16, seed=23)
    first = cuda_kernels.moe_experts(*args)
    again = cuda_kernels.moe_experts(*args)
    assert torch.equal(first, again), "two runs on the same inputs differ"
    x, ids, w, gu, dn, _, _ = args
    part = cuda_kernels.moe_experts(x[100:137], ids[100:137], w[100:137], gu, dn)  # a decode-sized batch
    assert torch.equal(part, first[100:137]), "a token's output depends on the other tokens of the batch"


def test_moe_experts_small_workspace_runs_in_passes(cuda_kernels):
    args = _moe_case(500, 8, 32, 128, 64, torch.float16, seed=24)
    whole = cuda_kernels.moe_experts(*args)
    x, ids, w, gu, dn, _, _ = args
    min_ws = cuda_kernels.moe_experts_min_workspace_size(8, 32, 128, 64, torch.float16)
    ws = torch.empty(3 * min_ws, dtype=torch.uint8, device="cuda")  # a few tokens per pass
    chunked = cuda_kernels.moe_experts(x, ids, w, gu, dn, workspace=ws)
    assert torch.equal(chunked, whole)


def test_moe_experts_workspace_too_small_is_an_error(cuda_kernels):
    from dsa_export.plugins.kernels import KernelError

    x, ids, w, gu, dn, _, _ = _moe_case(4, 2, 4, 64, 32, torch.bfloat16, seed=25)
    with pytest.raises(KernelError, match="workspace"):
        cuda_kernels.moe_experts(x, ids, w, gu, dn, workspace=torch.empty(64, dtype=torch.uint8, device="cuda"))


def test_moe_experts_forced_tensor_core_path_rejects_fp32(cuda_kernels):
    from dsa_export.plugins.kernels import KernelError

    args = _moe_case(4, 2, 4, 64, 32, torch.float32, seed=26)
    with pytest.raises(KernelError, match="tensor-core"):
        cuda_kernels.moe_experts(*args, path="tensor-core-16")


def test_moe_experts_path_choice(cuda_kernels):
    major = torch.cuda.get_device_capability()[0]
    tc = major >= 8
    path = cuda_kernels.moe_experts_path
    assert path(1, 8, 256, 7168, 2048, torch.bfloat16) == ("tensor-core-16" if tc else "generic")
    assert path(4096, 8, 256, 7168, 2048, torch.bfloat16) == ("tensor-core-128" if tc else "generic")
    fp8 = torch.float8_e4m3fn
    assert path(4096, 8, 256, 7168, 2048, torch.bfloat16, fp8) == ("tensor-core-128" if tc else "generic")
    assert path(1024, 8, 256, 7168, 2048, torch.float16) == ("tensor-core-64" if tc else "generic")
    assert path(16, 8, 256, 7168, 2048, torch.float32) == "generic"
    assert path(16, 8, 256, 7168, 2048, torch.bfloat16, fp8, 100) == "generic"


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_moe_experts_at_deepseek_width(cuda_kernels, fp8):
    """H = 7168, I = 2048, top-8 (64 of the 256 experts to bound memory: 5.6 GB bf16), decode and a prefill chunk."""
    N, K, E, H, I = 64, 8, 64, 7168, 2048
    gen = _gen(27)
    x = torch.randn(N, H, generator=gen).to(torch.bfloat16).cuda()
    ids = _moe_routing(N, K, E, gen).cuda()
    w = (torch.rand(N, K, generator=gen) / K).cuda()
    cuda_gen = torch.Generator(device="cuda").manual_seed(27)
    gate_up = torch.randn(E, 2 * I, H, device="cuda", generator=cuda_gen) * H ** -0.5
    down = torch.randn(E, H, I, device="cuda", generator=cuda_gen) * I ** -0.5
    if fp8:
        gate_up, gu_s = ref.quantize_blocks(gate_up, 128)
        down, dn_s = ref.quantize_blocks(down, 128)
        args = (x, ids, w, gate_up, down, gu_s, dn_s)
    else:
        args = (x, ids, w, gate_up.to(torch.bfloat16), down.to(torch.bfloat16), None, None)
    del gate_up, down
    for n in (1, N):
        sub = (args[0][:n], args[1][:n], args[2][:n], *args[3:])
        got = cuda_kernels.moe_experts(*sub)
        torch.cuda.synchronize()
        _moe_check(got, sub, torch.bfloat16, fp8, 128, f"deepseek width N={n}")
