"""The kernel cases the emulator runs: every kernel family of the C ABI at small sizes (CI) and at
DeepSeek-V3.2 widths (``python -m tests.emulation --real-width``), each checked against the float64
references of tests/plugins/plugin_reference.py (tied to dsa_export.ops.reference by
tests/plugins/test_reference_cpu.py) with the tolerances the GPU tests use.

A case is a function of (kernels, seed): its inputs come from the seed, so any failure reproduces
alone with ``python -m tests.emulation --case NAME --seed SEED --schedule ORDER-copies-at-MODE``.
"""

from __future__ import annotations

import torch

from tests.plugins import plugin_reference as ref

# The GPU tests' checks and bounds (test_kernels_gpu.py derives MOE_TOL), so that the emulated and
# the real kernels are held to the same standard.
from tests.plugins.test_kernels_gpu import DTYPES, _moe_check, _moe_routing, assert_same_selection

from . import cases_paged_attention, cases_paged_cache_write, cases_paged_indexer, cases_sampling
from .case_base import Case, _assert_close_attention, _gen, _randn, kl_schedule_other


# ---- indexer + top-k ----------------------------------------------------------------------------
def check_selection(got, q, k, w, lengths, *, topk, scale, causal, max_tie_rows):
    """The GPU tests' selection check (same keys as the reference, or ties at the k-th place only)."""
    tie_rows = assert_same_selection(got, q, k, w, lengths, topk=topk, scale=scale, causal=causal)
    assert tie_rows <= max_tie_rows, f"{tie_rows} rows differ from the reference on ties"


def indexer_case(B, S, T, H, D, topk, *, causal=True, lengths=False, dtype="bf16", w_dtype="bf16",
                 workspace_rows=None):
    def run(kl, seed):
        gen = _gen(seed)
        dt, wdt = DTYPES[dtype], DTYPES[w_dtype]
        q, k = _randn((B, S, H, D), dt, gen), _randn((B, T, D), dt, gen)
        w = _randn((B, S, H), wdt, gen, scale=H ** -0.5)
        lens = None
        if lengths:
            lens = torch.randint(0, T + 1, (B,), generator=gen, dtype=torch.int32)
            lens[0] = T
        ws = None
        if workspace_rows is not None:
            ws = kl._empty((workspace_rows * T * 4,), torch.uint8, q)
        got = kl.indexer_topk(q, k, w, lens, topk=topk, scale=D ** -0.5, causal=causal, workspace=ws)
        assert got.shape == (B, S, topk) and got.dtype == torch.int32
        check_selection(got.clone(), q, k, w, lens, topk=topk, scale=D ** -0.5, causal=causal,
                        max_tie_rows=max(1, B * S // 50))
    return run


def indexer_exact_ties(kl, seed):
    """Every q.k is negative, so every score is exactly 0: each row must take the lowest key indices."""
    B, S, T, H, D, topk = 1, 3, 150, 16, 64, 32
    q = -torch.ones((B, S, H, D), dtype=torch.bfloat16)
    k = torch.ones((B, T, D), dtype=torch.bfloat16)
    w = torch.ones((B, S, H), dtype=torch.bfloat16)
    got = kl.indexer_topk(q, k, w, topk=topk, scale=0.125, causal=False).clone()
    for s in range(S):
        assert sorted(got[0, s].tolist()) == list(range(topk)), f"row {s}: {sorted(got[0, s].tolist())}"
    # Ties at the k-th place among distinct scores: keys 0..9 score 2, keys 10.. score 1; top-16 takes
    # all ten 2s and then the six lowest-indexed 1s.
    k2 = torch.ones((B, T, D), dtype=torch.bfloat16)
    k2[:, :10] = 2.0
    q2 = torch.ones((B, S, H, D), dtype=torch.bfloat16)
    got = kl.indexer_topk(q2, k2, w, topk=16, scale=1.0 / D, causal=False).clone()
    for s in range(S):
        assert sorted(got[0, s].tolist()) == list(range(16)), f"row {s}: {sorted(got[0, s].tolist())}"


def indexer_deterministic_order(kl, seed):
    """Two runs give the same indices in the same order (the sparse attention's summation order)."""
    gen = _gen(seed)
    q, k = _randn((1, 6, 16, 64), torch.bfloat16, gen), _randn((1, 400, 64), torch.bfloat16, gen)
    w = _randn((1, 6, 16), torch.float32, gen, scale=0.25)
    first = kl.indexer_topk(q, k, w, topk=64, scale=0.125).clone()
    kl.configure(kl_schedule_other(kl), seed=seed + 1, device=kl.device)
    second = kl.indexer_topk(q, k, w, topk=64, scale=0.125).clone()
    assert torch.equal(first, second), "the order of a row's indices changed between two runs"


def indexer_workspace_too_small(kl, seed):
    from dsa_export.plugins.kernels import KernelError

    q = torch.zeros((1, 2, 16, 64), dtype=torch.bfloat16)
    k = torch.zeros((1, 100, 64), dtype=torch.bfloat16)
    w = torch.zeros((1, 2, 16), dtype=torch.bfloat16)
    try:
        kl.indexer_topk(q, k, w, topk=8, scale=1.0, workspace=kl._empty((16,), torch.uint8, q))
    except KernelError as exc:
        assert "workspace" in str(exc), str(exc)
    else:
        raise AssertionError("a 16-byte workspace was accepted")


# ---- sparse attention ---------------------------------------------------------------------------
def _indices(B, S, T, K, gen, *, pad_frac=0.1, oob=True):
    idx = torch.full((B, S, K), -1, dtype=torch.int32)
    for b in range(B):
        for s in range(S):
            n = min(K, T)
            idx[b, s, :n] = torch.randperm(T, generator=gen)[:n].to(torch.int32)
    idx[torch.rand((B, S, K), generator=gen) < pad_frac] = -1
    if oob:  # out of range, right at the boundary (T) and beyond it
        r = torch.rand((B, S, K), generator=gen)
        idx[r < 0.02] = T
        idx[(r >= 0.02) & (r < 0.03)] = T + 5
    return idx


def attention_case(B, S, T, H, Hkv, Dk, Dv, K, dtype="bf16", *, values_from_keys=False):
    def run(kl, seed):
        gen = _gen(seed)
        dt = DTYPES[dtype]
        q = _randn((B, S, H, Dk), dt, gen)
        k = _randn((B, T, Hkv, Dk), dt, gen)
        idx = _indices(B, S, T, K, gen)
        scale = Dk ** -0.5
        if values_from_keys:
            empty_v = k[:, :0, :, :Dv]
            got = kl.sparse_attention(q, k, empty_v, idx, scale=scale).clone()
            _assert_close_attention(got, ref.sparse_attention(q, k, empty_v, idx, scale=scale), dt)
            explicit = kl.sparse_attention(q, k, k[..., :Dv].contiguous(), idx, scale=scale).clone()
            assert torch.equal(got, explicit), "values from keys differ from the same channels passed as v"
        else:
            v = _randn((B, T, Hkv, Dv), dt, gen)
            got = kl.sparse_attention(q, k, v, idx, scale=scale).clone()
            assert got.shape == (B, S, H, Dv) and got.dtype == dt
            _assert_close_attention(got, ref.sparse_attention(q, k, v, idx, scale=scale), dt)
    return run


def attention_against_ops_reference(kl, seed):
    """The MQA tensor-core path against dsa_export.ops.reference (NumPy float64) itself."""
    from dsa_export.ops.reference import sparse_attention_reference

    gen = _gen(seed)
    B, S, T, H, Dk, Dv, K = 1, 2, 120, 16, 144, 128, 48
    q, k = _randn((B, S, H, Dk), torch.bfloat16, gen), _randn((B, T, 1, Dk), torch.bfloat16, gen)
    v = _randn((B, T, 1, Dv), torch.bfloat16, gen)
    idx = _indices(B, S, T, K, gen)
    got = kl.sparse_attention(q, k, v, idx, scale=Dk ** -0.5).clone()
    want = sparse_attention_reference(q.float().numpy(), k.float().numpy(), v.float().numpy(), idx.numpy(),
                                      scale=Dk ** -0.5)
    _assert_close_attention(got, torch.from_numpy(want).double(), torch.bfloat16)


def attention_rows_without_valid_index(kl, seed):
    gen = _gen(seed)
    B, S, T, H, Dk, Dv, K = 1, 3, 50, 16, 144, 128, 64
    q, k = _randn((B, S, H, Dk), torch.bfloat16, gen), _randn((B, T, 1, Dk), torch.bfloat16, gen)
    v = _randn((B, T, 1, Dv), torch.bfloat16, gen)
    idx = torch.full((B, S, K), -1, dtype=torch.int32)
    idx[0, 1, :10] = torch.arange(10, dtype=torch.int32)
    idx[0, 2, :] = T + 1
    got = kl.sparse_attention(q, k, v, idx, scale=Dk ** -0.5).clone()
    assert bool((got[0, 0] == 0).all()) and bool((got[0, 2] == 0).all()), "rows without a valid index must be 0"
    assert bool(got[0, 1].abs().sum() > 0)


def attention_no_keys(kl, seed):
    """T = 0 with K > 0 (TensorRT passes NULL for the empty key and value tensors): every row is 0."""
    q = torch.randn((1, 2, 16, 144)).to(torch.bfloat16)
    idx = torch.zeros((1, 2, 8), dtype=torch.int32)
    for dv, hkv in ((128, 1), (40, 2)):
        k = torch.zeros((1, 0, hkv, 144), dtype=torch.bfloat16)
        out = kl.sparse_attention(q, k, torch.zeros((1, 0, hkv, dv), dtype=torch.bfloat16), idx, scale=1.0).clone()
        assert out.shape == (1, 2, 16, dv) and bool((out == 0).all())


# ---- block-sparse attention ---------------------------------------------------------------------
def block_sparse_case(B, S, T, H, Hkv, Dk, Dv, bs, Kb, causal, dtype):
    from tests.plugins.test_block_sparse_gpu import _compare, _pattern

    def run(kl, seed):
        gen = _gen(seed)
        dt = DTYPES[dtype]
        q, k, v = _randn((B, S, H, Dk), dt, gen), _randn((B, T, Hkv, Dk), dt, gen), _randn((B, T, Hkv, Dv), dt, gen)
        index = _pattern(B, H, -(-S // bs), -(-T // bs), Kb, gen, causal=causal)
        got = kl.block_sparse_attention(q, k, v, index, block_size=bs, scale=Dk ** -0.5, causal=causal).clone()
        assert got.shape == (B, S, H, Dv) and got.dtype == dt
        _compare(got, q, k, v, index, bs=bs, scale=Dk ** -0.5, causal=causal)
    return run


def block_sparse_unlisted_blocks_never_read(kl, seed):
    from tests.plugins.test_block_sparse_gpu import _compare

    B, S, H, D, bs = 1, 128, 4, 64, 32
    n = S // bs
    gen = _gen(seed)
    q, k, v = (torch.randn(B, S, H, D, generator=gen), torch.randn(B, S, 1, D, generator=gen),
               torch.randn(B, S, 1, D, generator=gen))
    index = torch.full((B, H, n, 2), -1, dtype=torch.int32)
    for i in range(n):
        index[0, :, i, 0] = i - i % 2
    index[0, 1, 3] = -1
    for dtype in (torch.float32, torch.bfloat16):
        pk, pv = k.clone(), v.clone()
        for j in range(1, n, 2):
            pk[:, j * bs:(j + 1) * bs] = float("nan")
            pv[:, j * bs:(j + 1) * bs] = float("nan")
        got = kl.block_sparse_attention(*(x.to(dtype) for x in (q, pk, pv)), index, block_size=bs,
                                        scale=D ** -0.5).clone()
        assert not torch.isnan(got).any(), "an unlisted block was read"
        assert torch.count_nonzero(got[0, 3 * bs:4 * bs, 1]) == 0
        _compare(got, *(x.to(dtype) for x in (q, k, v)), index, bs=bs, scale=D ** -0.5, causal=True)


def block_sparse_no_keys(kl, seed):
    q = torch.randn(1, 8, 2, 64).to(torch.bfloat16)
    k = torch.zeros(1, 0, 1, 64, dtype=torch.bfloat16)
    out = kl.block_sparse_attention(q, k, k, torch.zeros(1, 2, 1, 2, dtype=torch.int32), block_size=16,
                                    scale=0.125).clone()
    assert torch.count_nonzero(out) == 0
    k = torch.randn(1, 8, 1, 64).to(torch.bfloat16)
    out = kl.block_sparse_attention(q, k, k.clone(), torch.zeros(1, 2, 1, 0, dtype=torch.int32), block_size=16,
                                    scale=0.125).clone()
    assert torch.count_nonzero(out) == 0


# ---- routed experts -----------------------------------------------------------------------------
def _moe_args(N, K, E, H, I, dtype, *, fp8, block_size, w_dtype, gen, experts=None):
    ids = _moe_routing(N, K, E, gen, experts=experts)  # -1 slots, out-of-range ids, a token without experts
    x = torch.randn(N, H, generator=gen).to(dtype)
    w = (torch.rand(N, K, generator=gen) / K).to(w_dtype)
    gate_up = torch.randn(E, 2 * I, H, generator=gen) * H ** -0.5
    down = torch.randn(E, H, I, generator=gen) * I ** -0.5
    if fp8:
        gate_up, gus = ref.quantize_blocks(gate_up, block_size)
        down, dns = ref.quantize_blocks(down, block_size)
        return (x, ids, w, gate_up, down, gus, dns)
    return (x, ids, w, gate_up.to(dtype), down.to(dtype), None, None)


def moe_case(N, K, E, H, I, dtype, *, fp8=False, block_size=128, w_dtype="fp32", paths=(None,), bitwise=False,
             experts=None):
    def run(kl, seed):
        dt = DTYPES[dtype]
        args = _moe_args(N, K, E, H, I, dt, fp8=fp8, block_size=block_size, w_dtype=DTYPES[w_dtype], gen=_gen(seed),
                         experts=experts)
        outs = {}
        for path in paths:
            outs[path] = kl.moe_experts(*args, block_size=block_size, path=path).clone()
            _moe_check(outs[path], args, dt, fp8, block_size, f"path {path or 'auto'}")
        if bitwise:
            tc = [p for p in paths if p and p.startswith("tensor-core")]
            for p in tc[1:]:
                assert torch.equal(outs[tc[0]], outs[p]), f"{p} differs in bits from {tc[0]}"
    return run


def moe_passes_and_batch_invariance(kl, seed):
    dt = torch.float16
    args = _moe_args(60, 8, 16, 128, 64, dt, fp8=False, block_size=128, w_dtype=torch.float32, gen=_gen(seed))
    whole = kl.moe_experts(*args).clone()
    x, ids, w, gu, dn, _, _ = args
    min_ws = kl.moe_experts_min_workspace_size(8, 16, 128, 64, dt)
    chunked = kl.moe_experts(x, ids, w, gu, dn, workspace=kl._empty((3 * min_ws,), torch.uint8, x)).clone()
    assert torch.equal(chunked, whole), "running in passes changed the bits"
    part = kl.moe_experts(x[10:17], ids[10:17], w[10:17], gu, dn).clone()
    assert torch.equal(part, whole[10:17]), "a token's output depends on the other tokens of the batch"


def moe_empty(kl, seed):
    args = _moe_args(20, 4, 8, 64, 32, torch.bfloat16, fp8=False, block_size=128, w_dtype=torch.float32,
                     gen=_gen(seed))
    x, ids, w, gu, dn, _, _ = args
    got = kl.moe_experts(x, torch.full_like(ids, -1), w, gu, dn).clone()
    assert bool((got == 0).all())
    assert kl.moe_experts(x[:0], ids[:0], w[:0], gu, dn).shape == (0, x.shape[1])


# ---- which kernels run: the *_path() queries against what the emulator saw ------------------------
def path_agreement(kl, seed):
    """Each *_path() answer equals what a call with the same arguments runs: "tensor-core" exactly when
    the call executed mma.sync, on every emulated device (their shared-memory limits differ)."""
    gen = _gen(seed)
    bf16 = torch.bfloat16
    checked = 0
    for device in ("sm90", "sm89", "sm80", "sm75"):
        kl.configure(kl.schedule, seed=seed, device=device)
        for H, Hkv, Dk, Dv in ((16, 1, 576, 512), (16, 1, 1024, 512), (32, 2, 64, 128), (4, 4, 192, 128)):
            q, k, v = _randn((1, 1, H, Dk), bf16, gen), _randn((1, 40, Hkv, Dk), bf16, gen), _randn((1, 40, Hkv, Dv), bf16, gen)
            said = kl.sparse_attention_path(H, Hkv, Dk, Dv, bf16)
            before = kl.stats()["mma"]
            kl.sparse_attention(q, k, v, _indices(1, 1, 40, 16, gen), scale=0.1)
            ran = "tensor-core" if kl.stats()["mma"] > before else "generic"
            assert said == ran, f"{device}: sparse_attention_path{(H, Hkv, Dk, Dv)} says {said}, the call ran {ran}"
            checked += 1
        for H, D in ((16, 64), (64, 128), (16, 40)):
            q, k, w = _randn((1, 2, H, D), bf16, gen), _randn((1, 70, D), bf16, gen), _randn((1, 2, H), bf16, gen)
            said = kl.indexer_topk_path(H, D, bf16)
            before = kl.stats()["mma"]
            kl.indexer_topk(q, k, w, topk=8, scale=0.1)
            ran = "tensor-core" if kl.stats()["mma"] > before else "generic"
            assert said == ran, f"{device}: indexer_topk_path{(H, D)} says {said}, the call ran {ran}"
            checked += 1
        for Dk, Dv, bs in ((128, 128, 64), (64, 64, 16), (64, 64, 24), (128, 256, 64)):
            q, k, v = _randn((1, bs, 2, Dk), bf16, gen), _randn((1, bs, 1, Dk), bf16, gen), _randn((1, bs, 1, Dv), bf16, gen)
            said = kl.block_sparse_attention_path(Dk, Dv, bs, bf16)
            before = kl.stats()["mma"]
            kl.block_sparse_attention(q, k, v, torch.zeros((1, 2, 1, 1), dtype=torch.int32), block_size=bs, scale=0.1)
            ran = "tensor-core" if kl.stats()["mma"] > before else "generic"
            assert said == ran, f"{device}: block_sparse_attention_path{(Dk, Dv, bs)} says {said}, the call ran {ran}"
            checked += 1
        for N, H, I in ((4, 128, 64), (70, 128, 64)):
            args = _moe_args(N, 4, 8, H, I, bf16, fp8=False, block_size=128, w_dtype=torch.float32, gen=gen)
            said = kl.moe_experts_path(N, 4, 8, H, I, bf16)
            before = kl.stats()["mma"]
            kl.moe_experts(*args)
            ran = "generic" if kl.stats()["mma"] == before else "tensor-core"
            assert (said == "generic") == (ran == "generic"), (
                f"{device}: moe_experts_path{(N, H, I)} says {said}, the call ran {ran}")
            checked += 1
    assert checked > 0


# ---- registries ---------------------------------------------------------------------------------
SMALL_CASES: list[Case] = [
    # indexer: tensor-core (bf16/fp16, w in T's dtype or fp32) and generic (fp32, D % 16 != 0, sm_75)
    Case("ix-tc-bf16", "indexer", indexer_case(2, 13, 150, 16, 64, 32)),
    Case("ix-tc-fp16-wfp32", "indexer", indexer_case(1, 9, 200, 32, 64, 40, dtype="fp16", w_dtype="fp32")),
    Case("ix-generic-fp32", "indexer", indexer_case(1, 6, 90, 4, 32, 16, dtype="fp32", w_dtype="fp32")),
    Case("ix-generic-D40", "indexer", indexer_case(1, 5, 120, 16, 40, 20)),
    Case("ix-lengths-noncausal", "indexer", indexer_case(3, 7, 180, 16, 64, 30, causal=False, lengths=True,
                                                         dtype="fp16", w_dtype="fp16")),
    Case("ix-T-lt-topk", "indexer", indexer_case(2, 6, 40, 16, 64, 64)),
    Case("ix-S-gt-T", "indexer", indexer_case(1, 10, 6, 16, 64, 4)),
    Case("ix-decode-S1", "indexer", indexer_case(2, 1, 700, 16, 64, 256, w_dtype="fp32")),
    # 64 heads: QB = 4 query slots per logits CTA, of which decode fills one (the other m-tiles are skipped).
    Case("ix-decode-S1-H64", "indexer", indexer_case(2, 1, 300, 64, 64, 48, w_dtype="fp32")),
    Case("ix-multi-slice-T", "indexer", indexer_case(1, 2, 2300, 16, 64, 100, w_dtype="fp32")),
    Case("ix-small-workspace", "indexer", indexer_case(2, 7, 160, 16, 64, 24, workspace_rows=3)),
    Case("ix-exact-ties", "indexer", indexer_exact_ties),
    Case("ix-deterministic-order", "indexer", indexer_deterministic_order),
    Case("ix-workspace-too-small", "indexer", indexer_workspace_too_small),
    Case("ix-sm75-generic", "indexer", indexer_case(1, 5, 100, 16, 64, 16), device="sm75"),
    # sparse attention: MQA tensor-core (DeepSeek's 576/512 form), grouped, per-head generic, fp32
    Case("sa-tc-mqa-576-512-bf16", "attention", attention_case(1, 2, 300, 32, 1, 576, 512, 100)),
    Case("sa-tc-mqa-144-128-fp16", "attention", attention_case(2, 2, 200, 16, 1, 144, 128, 64, "fp16")),
    Case("sa-tc-group16-64-128-bf16", "attention", attention_case(2, 2, 150, 32, 2, 64, 128, 40)),
    Case("sa-generic-per-head-bf16", "attention", attention_case(1, 2, 100, 4, 4, 192, 128, 40)),
    Case("sa-generic-fp32", "attention", attention_case(1, 2, 100, 4, 2, 72, 40, 33, "fp32")),
    Case("sa-vfk-tc-576-512-bf16", "attention", attention_case(1, 2, 200, 16, 1, 576, 512, 64, values_from_keys=True)),
    Case("sa-vfk-generic-72-40-fp32", "attention", attention_case(1, 2, 80, 4, 2, 72, 40, 33, "fp32",
                                                                  values_from_keys=True)),
    Case("sa-ops-reference", "attention", attention_against_ops_reference),
    Case("sa-rows-without-valid-index", "attention", attention_rows_without_valid_index),
    Case("sa-no-keys", "attention", attention_no_keys),
    Case("sa-sm75-generic", "attention", attention_case(1, 2, 100, 16, 1, 144, 128, 40), device="sm75"),
    # block-sparse
    Case("bs-tc-bf16-bs16", "block-sparse", block_sparse_case(1, 48, 48, 4, 2, 64, 64, 16, 3, True, "bf16")),
    Case("bs-tc-fp16-ragged", "block-sparse", block_sparse_case(2, 50, 50, 2, 1, 64, 64, 32, 2, True, "fp16")),
    Case("bs-tc-bf16-chunked-prefill", "block-sparse", block_sparse_case(1, 20, 150, 4, 2, 128, 128, 64, 3, True,
                                                                         "bf16")),
    Case("bs-tc-fp16-noncausal", "block-sparse", block_sparse_case(1, 40, 36, 2, 2, 32, 32, 16, 3, False, "fp16")),
    Case("bs-generic-fp32", "block-sparse", block_sparse_case(1, 40, 40, 2, 2, 40, 24, 16, 3, True, "fp32")),
    Case("bs-generic-bf16-bs24", "block-sparse", block_sparse_case(1, 50, 50, 2, 1, 64, 64, 24, 3, True, "bf16")),
    Case("bs-unlisted-blocks", "block-sparse", block_sparse_unlisted_blocks_never_read),
    Case("bs-no-keys", "block-sparse", block_sparse_no_keys),
    # routed experts: every kernel family, FP8 block scales (full and partial blocks), passes
    Case("moe-paths-bf16", "moe", moe_case(40, 4, 8, 128, 64, "bf16",
                                           paths=("generic", "tensor-core-16", "tensor-core-64", "tensor-core-128"),
                                           bitwise=True)),
    Case("moe-paths-fp8", "moe", moe_case(24, 4, 8, 256, 128, "bf16", fp8=True,
                                          paths=("generic", "tensor-core-16", "tensor-core-64"), bitwise=True)),
    Case("moe-fp8-partial-blocks-fp16", "moe", moe_case(30, 4, 8, 192, 160, "fp16", fp8=True)),
    Case("moe-fp8-bs64-bf16-weights", "moe", moe_case(20, 4, 8, 192, 128, "bf16", fp8=True, block_size=64,
                                                      w_dtype="bf16")),
    Case("moe-fp32-generic", "moe", moe_case(20, 4, 8, 96, 40, "fp32")),
    Case("moe-fp8-bs24-generic", "moe", moe_case(12, 4, 4, 96, 64, "bf16", fp8=True, block_size=24)),
    Case("moe-passes-batch-invariance", "moe", moe_passes_and_batch_invariance),
    Case("moe-empty", "moe", moe_empty),
    Case("moe-sm89-auto", "moe", moe_case(16, 4, 8, 256, 128, "bf16"), device="sm89"),
    Case("path-queries-match-launches", "paths", path_agreement, schedules=("lockstep-copies-at-wait",)),
]

#: DeepSeek-V3.2 widths (minutes each under the emulator): a command, not a CI test.
REAL_WIDTH_CASES: list[Case] = [
    Case("rw-sa-mla-h128-576-512-k2048-bf16", "attention", attention_case(1, 2, 2500, 128, 1, 576, 512, 2048)),
    Case("rw-sa-mla-vfk-h128-k2048-bf16", "attention", attention_case(1, 1, 2500, 128, 1, 576, 512, 2048,
                                                                        values_from_keys=True)),
    Case("rw-ix-64x128-top2048-T4100", "indexer", indexer_case(1, 2, 4100, 64, 128, 2048, w_dtype="fp32")),
    Case("rw-moe-h7168-i2048-bf16", "moe", moe_case(4, 8, 8, 7168, 2048, "bf16")),
    Case("rw-moe-h7168-i2048-fp8", "moe", moe_case(4, 8, 8, 7168, 2048, "bf16", fp8=True)),
    Case("rw-bs-h16-d128-bs64", "block-sparse", block_sparse_case(1, 256, 1024, 16, 1, 128, 128, 64, 4, True, "bf16")),
]

# Kernel families added since ABI 5 keep their cases in their own modules (they import Case and the
# shared helpers from case_base).
for _family in (cases_paged_attention, cases_paged_indexer, cases_sampling, cases_paged_cache_write):
    SMALL_CASES += _family.SMALL_CASES
    REAL_WIDTH_CASES += _family.REAL_WIDTH_CASES

CASES = {c.name: c for c in SMALL_CASES + REAL_WIDTH_CASES}
assert len(CASES) == len(SMALL_CASES) + len(REAL_WIDTH_CASES), "two cases share a name"
