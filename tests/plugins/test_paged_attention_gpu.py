"""Paged sparse attention kernels (float pools, FlashMLA's FP8 latent cache, split-KV decode) through
the C ABI against the float64 references, on a GPU.

The inputs are the emulator cases' (tests/emulation/cases_paged_attention.py): shuffled pages, invalid
table entries, NaN in pages no row names, indices past M*page. Tolerances as test_kernels_gpu.py;
split results against the unsplit one within cases_paged_attention.SPLIT_TOL.
"""

from __future__ import annotations

import math

import pytest

from . import plugin_reference as ref

torch = pytest.importorskip("torch")

from tests.emulation import cases as _emulator_cases  # noqa: F401  (cases_paged_attention imports it)
from tests.emulation.cases_paged_attention import (
    SPLIT_TOL,
    float_pools,
    fp8_pools,
    logical_indices,
)

pytestmark = pytest.mark.gpu

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ATTN_TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _close(got, want, dtype, what=""):
    err = (got.double().cpu() - want).abs().max().item()
    bound = ATTN_TOL[dtype] * max(want.abs().max().item(), 1e-3)
    assert math.isfinite(err) and err <= bound, f"{what}max abs error {err:.3e} > {bound:.3e}"


def _cuda(*ts):
    return [t.cuda() if t is not None else None for t in ts]


# (name, B, S, H, Hkv, Dk, Dv, K, page, M, dtype, explicit_v)
FLOAT_CASES = [
    ("mqa-576-512-vfk-bf16", 2, 2, 64, 1, 576, 512, 256, 64, 8, "bf16", False),
    ("mqa-144-128-vpool-fp16", 2, 3, 16, 1, 144, 128, 100, 16, 12, "fp16", True),
    ("group-64-128-bf16", 1, 4, 32, 2, 64, 128, 80, 16, 10, "bf16", True),
    ("generic-fp32", 2, 2, 4, 2, 72, 40, 33, 8, 8, "fp32", True),
]


@pytest.mark.parametrize("case", FLOAT_CASES, ids=[c[0] for c in FLOAT_CASES])
@pytest.mark.parametrize("num_splits", [1, 3, 0])
def test_paged_attention_matches_reference(cuda_kernels, case, num_splits):
    _, B, S, H, Hkv, Dk, Dv, K, page, M, dtype, explicit_v = case
    dt = DTYPES[dtype]
    gen = _gen(len(case[0]) + num_splits)
    table, k_pool, v_pool = float_pools(B, M, page, Hkv, Dk, Dv, dt, gen, explicit_v=explicit_v)
    q = torch.randn((B, S, H, Dk), generator=gen).to(dt)
    idx = logical_indices(B, S, M, page, K, gen)
    want = ref.sparse_attention_paged(q, k_pool, v_pool if explicit_v else k_pool[:0, :, :, :Dv], idx, table,
                                      scale=Dk ** -0.5)
    qc, kc, vc, ic, tc = _cuda(q, k_pool, v_pool, idx, table)
    got = cuda_kernels.sparse_attention_paged(qc, kc, vc, ic, tc, scale=Dk ** -0.5, v_head_dim=Dv,
                                              num_splits=num_splits)
    torch.cuda.synchronize()
    assert got.shape == (B, S, H, Dv) and got.dtype == dt
    assert not torch.isnan(got).any(), "a page no row names (NaN) was read"
    _close(got, want, dt)


# (name, B, S, H, Hkv, C, R, K, block_size, page, M, dtype, rope dtype)
FP8_CASES = [
    ("flashmla-h128-k2048-decode", 1, 1, 128, 1, 512, 64, 2048, 128, 64, 40, "bf16", "bf16"),
    ("flashmla-h64-b4-s2", 4, 2, 64, 1, 512, 64, 512, 128, 64, 12, "bf16", "bf16"),
    ("fp16-c128-r64", 2, 2, 16, 1, 128, 64, 90, 64, 16, 8, "fp16", "fp16"),
    ("generic-fp32-q-bf16-rope", 1, 2, 4, 1, 64, 16, 30, 32, 8, 6, "fp32", "bf16"),
]


@pytest.mark.parametrize("case", FP8_CASES, ids=[c[0] for c in FP8_CASES])
def test_paged_fp8_attention_matches_reference_and_splits_agree(cuda_kernels, case):
    _, B, S, H, Hkv, C, R, K, bs, page, M, dtype, rope_dtype = case
    dt = DTYPES[dtype]
    gen = _gen(len(case[0]))
    table, codes, scales, rope = fp8_pools(B, M, page, Hkv, C, R, bs, DTYPES[rope_dtype], gen)
    q = torch.randn((B, S, H, C + R), generator=gen).to(dt)
    idx = logical_indices(B, S, M, page, K, gen)
    scale = (C + R) ** -0.5
    want = ref.sparse_attention_paged_fp8(q, codes, scales, rope, idx, table, scale=scale, block_size=bs)
    args = _cuda(q, codes, scales, rope, idx, table)
    outs = {}
    for n in (1, 4, 0):
        outs[n] = cuda_kernels.sparse_attention_paged_fp8(*args, scale=scale, block_size=bs, num_splits=n)
        torch.cuda.synchronize()
        assert not torch.isnan(outs[n]).any(), f"num_splits={n}: a page no row names (NaN) was read"
        _close(outs[n], want, dt, f"num_splits={n}: ")
    base = outs[1].double()
    bound = SPLIT_TOL[dt] * max(base.abs().max().item(), 1e-3)
    for n in (4, 0):
        assert (outs[n].double() - base).abs().max().item() <= bound, f"num_splits={n} differs from the unsplit result"


def test_paged_attention_decode_splits_automatically_and_is_deterministic(cuda_kernels):
    B, S, H, C, R, K = 1, 1, 128, 512, 64, 2048
    assert cuda_kernels.sparse_attention_paged_num_splits(B, S, H, 1, K, 0) > 1
    assert cuda_kernels.sparse_attention_paged_num_splits(B, S, H, 1, K, 3) == 3
    assert cuda_kernels.sparse_attention_paged_workspace_size(B, S, H, 1, C, K, 1) == 0
    gen = _gen(7)
    table, codes, scales, rope = fp8_pools(B, 40, 64, 1, C, R, 128, torch.bfloat16, gen)
    q = torch.randn((B, S, H, C + R), generator=gen).to(torch.bfloat16)
    idx = logical_indices(B, S, 40, 64, K, gen)
    args = _cuda(q, codes, scales, rope, idx, table)
    first = cuda_kernels.sparse_attention_paged_fp8(*args, scale=0.04)
    second = cuda_kernels.sparse_attention_paged_fp8(*args, scale=0.04)
    torch.cuda.synchronize()
    assert torch.equal(first, second)


def test_paged_attention_equals_contiguous_bits(cuda_kernels):
    gen = _gen(3)
    B, S, H, Dk, Dv, page, M, K = 2, 2, 64, 576, 512, 64, 4, 200
    q = torch.randn((B, S, H, Dk), generator=gen).to(torch.bfloat16)
    k = torch.randn((B, M * page, 1, Dk), generator=gen).to(torch.bfloat16)
    idx = logical_indices(B, S, M, page, K, gen)
    perm = torch.randperm(B * M, generator=gen)
    pool = torch.empty((B * M, page, 1, Dk), dtype=torch.bfloat16)
    pool[perm] = k.reshape(B * M, page, 1, Dk)
    qc, kc, pc, ic, tc = _cuda(q, k, pool, idx, perm.view(B, M).to(torch.int32))
    want = cuda_kernels.sparse_attention(qc, kc, None, ic, scale=0.05, v_head_dim=Dv)
    got = cuda_kernels.sparse_attention_paged(qc, pc, None, ic, tc, scale=0.05, v_head_dim=Dv, num_splits=1)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def test_paged_attention_workspace_too_small_is_an_error(cuda_kernels):
    from dsa_export.plugins.kernels import KernelError

    gen = _gen(5)
    table, k_pool, _ = float_pools(1, 4, 16, 1, 64, 64, torch.bfloat16, gen, explicit_v=False)
    q = torch.randn((1, 1, 16, 64), generator=gen).to(torch.bfloat16)
    idx = logical_indices(1, 1, 4, 16, 64, gen)
    qc, kc, ic, tc = _cuda(q, k_pool, idx, table)
    with pytest.raises(KernelError, match="workspace"):
        cuda_kernels.sparse_attention_paged(qc, kc, None, ic, tc, scale=0.1, v_head_dim=64, num_splits=2,
                                            workspace=torch.empty(16, dtype=torch.uint8, device="cuda"))
