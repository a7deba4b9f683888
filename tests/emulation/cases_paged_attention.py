"""Emulator cases of sparse attention over paged caches (float pools and FlashMLA's FP8 latent), split-KV decode.

Each case is a function of (kernels, seed), as in cases.py, checked against the float64 references.
The pools are built so that reading anything the contract forbids shows: pages no row names hold NaN
(codes 0x7F, NaN scales and RoPE channels for the FP8 cache), the pages a row names are shuffled
through the pool, some table entries are invalid (-1, P + 3) and some indices point past M*page or
into an invalid page.
"""

from __future__ import annotations

import math

import torch

from tests.plugins import plugin_reference as ref
from tests.plugins.test_kernels_gpu import DTYPES

from .case_base import Case, _assert_close_attention, _gen, _randn


# ---- inputs -------------------------------------------------------------------------------------
def paged_layout(B, M, page, K, gen, *, spare_pages=3, invalid_entries=True, pad_frac=0.1):
    """(block_table [B,M] int32, P, named [P] bool, indices [B,S=?] builder): each row's M pages are
    distinct pool pages in a shuffled order, spare_pages pages are named by no row; with
    invalid_entries one entry of every row is -1 and (M > 2) one is P + 3."""
    P = B * M + spare_pages
    perm = torch.randperm(P, generator=gen)
    table = perm[: B * M].view(B, M).to(torch.int32).clone()
    if invalid_entries and M > 1:
        table[:, 1] = -1
        if M > 2:
            table[:, M - 1] = P + 3
    named = torch.zeros(P, dtype=torch.bool)
    valid = table[(table >= 0) & (table < P)].long()
    named[valid] = True
    return table, P, named


def logical_indices(B, S, M, page, K, gen, *, pad_frac=0.1):
    """[B,S,K] int32 distinct logical positions in [0, M*page), some -1 and some past M*page."""
    n = M * page
    idx = torch.full((B, S, K), -1, dtype=torch.int32)
    for b in range(B):
        for s in range(S):
            w = min(K, n)
            idx[b, s, :w] = torch.randperm(n, generator=gen)[:w].to(torch.int32)
    idx[torch.rand((B, S, K), generator=gen) < pad_frac] = -1
    r = torch.rand((B, S, K), generator=gen)
    idx[r < 0.02] = n
    idx[(r >= 0.02) & (r < 0.03)] = n + 7
    return idx


def _poison(pool, named):
    """NaN (or 0x7F codes) in every page no row names."""
    pool = pool.clone()
    fill = 0x7F if pool.dtype == torch.uint8 else float("nan")
    pool[~named] = fill
    return pool


def float_pools(B, M, page, Hkv, Dk, Dv, dtype, gen, *, explicit_v, **layout):
    table, P, named = paged_layout(B, M, page, 0, gen, **layout)
    k_pool = _poison(_randn((P, page, Hkv, Dk), dtype, gen), named)
    v_pool = _poison(_randn((P, page, Hkv, Dv), dtype, gen), named) if explicit_v else None
    return table, k_pool, v_pool


def fp8_pools(B, M, page, Hkv, C, R, block_size, rope_dtype, gen, **layout):
    """FlashMLA's FP8 latent cache: codes of latent rows quantized per block_size channels (scale =
    amax / 448), float32 scales, RoPE channels in rope_dtype; unnamed pages poisoned."""
    table, P, named = paged_layout(B, M, page, 0, gen, **layout)
    latent = torch.randn((P, page, Hkv, C // block_size, block_size), generator=gen)
    latent = latent * torch.rand((P, page, Hkv, C // block_size, 1), generator=gen).add(0.25)
    scales = (latent.abs().amax(dim=-1) / 448.0).clamp(min=1e-8)
    codes = (latent / scales.unsqueeze(-1)).to(torch.float8_e4m3fn).view(torch.uint8).reshape(P, page, Hkv, C)
    rope = _randn((P, page, Hkv, R), rope_dtype, gen)
    return table, _poison(codes, named), _poison(scales.float(), named), _poison(rope, named)


def _values_spec(k_pool, Dv):
    """The contract's v_pool without pages (values from keys) for the reference."""
    return k_pool[:0, :, :, :Dv]


# ---- cases --------------------------------------------------------------------------------------
def paged_case(B, S, H, Hkv, Dk, Dv, K, *, page=16, M=5, dtype="bf16", explicit_v=False, splits=(1,)):
    """Float pools: the kernel against the float64 reference, for every forced split count."""
    def run(kl, seed):
        gen = _gen(seed)
        dt = DTYPES[dtype]
        table, k_pool, v_pool = float_pools(B, M, page, Hkv, Dk, Dv, dt, gen, explicit_v=explicit_v)
        q = _randn((B, S, H, Dk), dt, gen)
        idx = logical_indices(B, S, M, page, K, gen)
        scale = Dk ** -0.5
        want = ref.sparse_attention_paged(q, k_pool, v_pool if explicit_v else _values_spec(k_pool, Dv), idx, table,
                                          scale=scale)
        outs = {}
        for n in splits:
            got = kl.sparse_attention_paged(q, k_pool, v_pool, idx, table, scale=scale, v_head_dim=Dv,
                                            num_splits=n).clone()
            assert got.shape == (B, S, H, Dv) and got.dtype == dt
            _assert_close_attention(got, want, dt, f"num_splits={n}: ")
            outs[n] = got
        _check_splits_agree(outs, dt, kl, B, S, H, Hkv, K)
    return run


def paged_fp8_case(B, S, H, Hkv, C, R, K, *, block_size=64, page=16, M=5, dtype="bf16", rope_dtype="bf16",
                   splits=(1,), auto=False):
    """FP8 latent cache: the kernel against the float64 reference of the decoded rows."""
    def run(kl, seed):
        gen = _gen(seed)
        dt = DTYPES[dtype]
        table, codes, scales, rope = fp8_pools(B, M, page, Hkv, C, R, block_size, DTYPES[rope_dtype], gen)
        q = _randn((B, S, H, C + R), dt, gen)
        idx = logical_indices(B, S, M, page, K, gen)
        scale = (C + R) ** -0.5
        want = ref.sparse_attention_paged_fp8(q, codes, scales, rope, idx, table, scale=scale, block_size=block_size)
        outs = {}
        for n in splits + ((0,) if auto else ()):
            got = kl.sparse_attention_paged_fp8(q, codes, scales, rope, idx, table, scale=scale, block_size=block_size,
                                                num_splits=n).clone()
            assert got.shape == (B, S, H, C) and got.dtype == dt
            _assert_close_attention(got, want, dt, f"num_splits={n}: ")
            outs[n] = got
        if auto:
            made = kl.sparse_attention_paged_num_splits(B, S, H, Hkv, K, 0)
            assert made > 1, f"a decode call (B*S = {B * S}) over K = {K} indices was not split ({made})"
        _check_splits_agree(outs, dt, kl, B, S, H, Hkv, K)
    return run


#: How close a split result must be to the unsplit one, relative to the largest output: 1e-3 where
#: the dtype can hold it; bf16 outputs differ in their last bit (2^-8) where the partial sums round
#: on different sides, and P is rounded to bf16 against a different running maximum.
SPLIT_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _check_splits_agree(outs, dt, kl, B, S, H, Hkv, K):
    if 1 not in outs:
        return
    base = outs[1].double()
    bound = SPLIT_TOL[dt] * max(base.abs().max().item(), 1e-3)
    for n, got in outs.items():
        made = kl.sparse_attention_paged_num_splits(B, S, H, Hkv, K, n)
        if n > 1:
            assert made > 1, f"num_splits={n} made {made} splits"
        err = (got.double() - base).abs().max().item()
        assert math.isfinite(err) and err <= bound, f"num_splits={n} ({made} splits) vs 1: {err:.3e} > {bound:.3e}"
        # The whole output to 1e-3 relative (the split-KV bar) in fp16 and fp32. In bf16 each split
        # rounds its probabilities to bf16 against its own running maximum before P @ V (as FlashMLA
        # does), so split and unsplit outputs differ by about one bf16 rounding of P (measured
        # 1.8e-3 at 2 splits): held to 2^-8, both staying within the float64 reference's bound.
        rel = ((got.double() - base).norm() / base.norm().clamp_min(1e-30)).item()
        limit = 2.0 ** -8 if dt == torch.bfloat16 else 1e-3
        assert rel <= limit, f"num_splits={n} ({made} splits) vs 1: relative error {rel:.3e} > {limit:.3e}"


def paged_equals_contiguous(kl, seed):
    """A contiguous cache laid out as pages (shuffled through the pool) gives the contiguous kernel's bits."""
    gen = _gen(seed)
    B, S, H, Dk, Dv, page, M, K = 2, 2, 16, 144, 128, 16, 4, 40
    T = M * page
    q, k = _randn((B, S, H, Dk), torch.bfloat16, gen), _randn((B, T, 1, Dk), torch.bfloat16, gen)
    idx = logical_indices(B, S, M, page, K, gen)
    perm = torch.randperm(B * M, generator=gen)
    pool = torch.empty((B * M, page, 1, Dk), dtype=torch.bfloat16)
    pool[perm] = k.reshape(B * M, page, 1, Dk)
    table = perm.view(B, M).to(torch.int32)
    want = kl.sparse_attention(q, k, k[:, :0, :, :Dv], idx, scale=0.1).clone()
    got = kl.sparse_attention_paged(q, pool, None, idx, table, scale=0.1, v_head_dim=Dv, num_splits=1).clone()
    assert torch.equal(got, want), "the paged kernel differs in bits from the contiguous one on the same keys"


def paged_rows_without_valid_index(kl, seed):
    """Rows whose indices are all -1, past M*page or in invalid pages are 0; K == 0 and M == 0 zero everything."""
    gen = _gen(seed)
    B, S, H, Dk, Dv, page, M, K = 1, 3, 16, 64, 128, 8, 3, 24
    table = torch.tensor([[2, -1, 0]], dtype=torch.int32)
    k_pool = _randn((3, page, 1, Dk), torch.bfloat16, gen)
    k_pool[1] = float("nan")  # named by no row
    v_pool = _randn((3, page, 1, Dv), torch.bfloat16, gen)
    v_pool[1] = float("nan")
    q = _randn((B, S, H, Dk), torch.bfloat16, gen)
    idx = torch.full((B, S, K), -1, dtype=torch.int32)
    idx[0, 1, :5] = torch.tensor([0, 3, 17, 20, 23], dtype=torch.int32)  # pages 0 and 2 of the row
    idx[0, 2, :8] = torch.arange(8, 16, dtype=torch.int32)             # all in the invalid page
    idx[0, 2, 8] = M * page
    for n in (1, 2):
        got = kl.sparse_attention_paged(q, k_pool, v_pool, idx, table, scale=0.125, num_splits=n).clone()
        assert bool((got[0, 0] == 0).all()) and bool((got[0, 2] == 0).all()), "rows without a valid index must be 0"
        assert not torch.isnan(got).any() and bool(got[0, 1].abs().sum() > 0)
        _assert_close_attention(got, ref.sparse_attention_paged(q, k_pool, v_pool, idx, table, scale=0.125),
                                torch.bfloat16)
    out = kl.sparse_attention_paged(q, k_pool, v_pool, idx[:, :, :0], table, scale=0.125).clone()
    assert bool((out == 0).all())
    out = kl.sparse_attention_paged(q, k_pool, v_pool, idx, table[:, :0], scale=0.125).clone()
    assert bool((out == 0).all())


def paged_split_deterministic(kl, seed):
    """The same split call twice, under another schedule, gives the same bits."""
    from .case_base import kl_schedule_other

    gen = _gen(seed)
    table, codes, scales, rope = fp8_pools(1, 6, 16, 1, 128, 64, 64, torch.bfloat16, gen)
    q = _randn((1, 1, 16, 192), torch.bfloat16, gen)
    idx = logical_indices(1, 1, 6, 16, 90, gen)
    first = kl.sparse_attention_paged_fp8(q, codes, scales, rope, idx, table, scale=0.07, block_size=64,
                                          num_splits=3).clone()
    kl.configure(kl_schedule_other(kl), seed=seed + 1, device=kl.device)
    second = kl.sparse_attention_paged_fp8(q, codes, scales, rope, idx, table, scale=0.07, block_size=64,
                                           num_splits=3).clone()
    assert torch.equal(first, second), "a split call changed bits between two runs"


def paged_split_schedule_for_a_stated_sm_count(kl, seed):
    """num_splits = -N plans as the automatic schedule would on a GPU of N SMs, on any device (what
    the TensorRT plugin sizes its workspace with): on the emulated H200 (132 SMs) -132 is the
    automatic schedule, bit for bit; another count changes only the split count, not the result."""
    gen = _gen(seed)
    table, codes, scales, rope = fp8_pools(1, 40, 16, 1, 128, 64, 64, torch.bfloat16, gen)
    q = _randn((1, 1, 16, 192), torch.bfloat16, gen)
    idx = logical_indices(1, 1, 40, 16, 600, gen)
    auto, stated = (kl.sparse_attention_paged_num_splits(1, 1, 16, 1, 600, n) for n in (0, -132))
    assert auto == stated > 1, (auto, stated)
    assert kl.sparse_attention_paged_num_splits(1, 1, 16, 1, 600, -1) == 1  # one CTA fills a 1-SM GPU
    assert kl.sparse_attention_paged_workspace_size(1, 1, 16, 1, 128, 600, -132) == \
        kl.sparse_attention_paged_workspace_size(1, 1, 16, 1, 128, 600, 0)
    args = (q, codes, scales, rope, idx, table)
    want = kl.sparse_attention_paged_fp8(*args, scale=0.07, block_size=64, num_splits=0).clone()
    got = kl.sparse_attention_paged_fp8(*args, scale=0.07, block_size=64, num_splits=-132).clone()
    assert torch.equal(want, got), "num_splits=-132 on a 132-SM device is not the automatic schedule"
    unsplit = kl.sparse_attention_paged_fp8(*args, scale=0.07, block_size=64, num_splits=-1).float()
    assert torch.allclose(unsplit, want.float(), rtol=8e-3, atol=8e-3 * want.float().abs().max().item())


def paged_fp8_dequant_races(kl, seed):
    """The FP8 tile's in-shared-memory dequantize under a schedule that switches threads often (one
    CTA, a yield at 90% of the scale loads): the only switch points inside the dequantize pass are its
    __ldg of the scales, which the default schedules take rarely, so without this case a missing
    barrier between the dequantize and the ldmatrix reads hides in every default schedule."""
    from .harness import Schedule

    gen = _gen(seed)
    table, codes, scales, rope = fp8_pools(1, 5, 16, 1, 128, 64, 64, torch.bfloat16, gen)
    q = _randn((1, 2, 16, 192), torch.bfloat16, gen)
    idx = logical_indices(1, 2, 5, 16, 64, gen)
    want = ref.sparse_attention_paged_fp8(q, codes, scales, rope, idx, table, scale=0.07, block_size=64)
    for k in range(3):
        kl.configure(Schedule("scrambled", "issue", resident_ctas=1, yield_probability=0.9), seed=seed + k,
                     device=kl.device)
        got = kl.sparse_attention_paged_fp8(q, codes, scales, rope, idx, table, scale=0.07, block_size=64,
                                            num_splits=1).clone()
        _assert_close_attention(got, want, torch.bfloat16, f"schedule seed {seed + k}: ")


def paged_workspace_too_small(kl, seed):
    from dsa_export.plugins.kernels import KernelError

    gen = _gen(seed)
    table, k_pool, _ = float_pools(1, 4, 16, 1, 64, 64, torch.bfloat16, gen, explicit_v=False)
    q = _randn((1, 1, 16, 64), torch.bfloat16, gen)
    idx = logical_indices(1, 1, 4, 16, 64, gen)
    try:
        kl.sparse_attention_paged(q, k_pool, None, idx, table, scale=0.1, v_head_dim=64, num_splits=2,
                                  workspace=kl._empty((16,), torch.uint8, q))
    except KernelError as exc:
        assert "workspace" in str(exc), str(exc)
    else:
        raise AssertionError("a 16-byte workspace was accepted for 2 splits")


SMALL_CASES: list[Case] = [
    # float pools: tensor-core MQA (values from keys), grouped with an explicit v_pool, generic fp32
    Case("pa-tc-mqa-vfk-bf16", "attention", paged_case(2, 2, 16, 1, 144, 128, 48)),
    Case("pa-tc-group-vpool-fp16", "attention", paged_case(1, 2, 32, 2, 64, 128, 40, dtype="fp16", explicit_v=True)),
    Case("pa-generic-fp32-vpool", "attention", paged_case(2, 2, 4, 2, 72, 40, 33, dtype="fp32", explicit_v=True,
                                                          page=8, M=6)),
    Case("pa-generic-fp32-vfk", "attention", paged_case(1, 2, 4, 1, 72, 40, 30, dtype="fp32", page=8, M=5)),
    Case("pa-equals-contiguous", "attention", paged_equals_contiguous),
    Case("pa-rows-without-valid-index", "attention", paged_rows_without_valid_index),
    Case("pa-workspace-too-small", "attention", paged_workspace_too_small, schedules=("lockstep-copies-at-wait",)),
    # FP8 latent: tensor-core (bf16 q and RoPE), generic (fp32 q over a bf16 RoPE pool)
    Case("pa-fp8-tc-bf16", "attention", paged_fp8_case(2, 2, 16, 1, 128, 64, 40)),
    Case("pa-fp8-dequant-races", "attention", paged_fp8_dequant_races, schedules=("lockstep-copies-at-wait",)),
    Case("pa-fp8-generic-fp32q", "attention", paged_fp8_case(1, 2, 4, 1, 64, 16, 30, block_size=32,
                                                             dtype="fp32", page=8, M=6)),
    # split-KV: forced 1/2/several splits equal to the unsplit result; the automatic decode schedule
    Case("pa-split-tc-fp16", "attention", paged_case(1, 1, 16, 1, 144, 128, 150, dtype="fp16", M=12,
                                                     splits=(1, 2, 5))),
    Case("pa-split-generic-fp32", "attention", paged_case(1, 2, 4, 2, 40, 24, 100, dtype="fp32", page=8, M=16,
                                                          explicit_v=True, splits=(1, 3))),
    Case("pa-fp8-split-auto-bf16", "attention", paged_fp8_case(1, 1, 16, 1, 128, 64, 600, M=40,
                                                               splits=(1, 2), auto=True)),
    Case("pa-split-deterministic", "attention", paged_split_deterministic, schedules=("lockstep-copies-at-wait",)),
    Case("pa-split-schedule-for-stated-sms", "attention", paged_split_schedule_for_a_stated_sm_count,
         schedules=("lockstep-copies-at-wait",)),
    # sm_75: the generic kernel for every form
    Case("pa-sm75-generic-bf16", "attention", paged_case(1, 2, 16, 1, 144, 128, 40, splits=(1, 2)), device="sm75"),
    Case("pa-fp8-sm75-generic", "attention", paged_fp8_case(1, 1, 16, 1, 128, 64, 40, splits=(1, 2)),
         device="sm75"),
]

#: DeepSeek-V3.2 widths (a command, not a CI test): H = 128 heads over FlashMLA's FP8 latent cache
#: (C = 512 FP8 + R = 64 bf16 RoPE, scales per 128 channels), K = 2048 of a 3000-token past in pages
#: of 64, unsplit and split (batch 1 decode: automatic and forced).
REAL_WIDTH_CASES: list[Case] = [
    Case("rw-pa-fp8-h128-k2048-decode-split", "attention",
         paged_fp8_case(1, 1, 128, 1, 512, 64, 2048, block_size=128, page=64, M=48, splits=(1, 4), auto=True)),
    Case("rw-pa-fp8-h128-k2048-s2", "attention",
         paged_fp8_case(2, 2, 128, 1, 512, 64, 2048, block_size=128, page=64, M=40)),
    # The split-KV bar (split equals unsplit to 1e-3 relative) at DeepSeek's widths in fp16, where
    # the output can hold it: 576-wide latent pages, values from keys, 1 vs 4 and 8 splits.
    Case("rw-pa-h128-576-512-k2048-decode-split-fp16", "attention",
         paged_case(1, 1, 128, 1, 576, 512, 2048, page=64, M=48, dtype="fp16", splits=(1, 4, 8))),
]
