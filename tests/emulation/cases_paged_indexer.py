"""Emulator cases of the indexer + top-k over paged index-key caches (float pools and FP8 keys with one scale per token).

Each case is a function of (kernels, seed), as in cases.py, checked against the float64 references
(dsa_export.ops.reference's paged ones): the same selection as the reference up to ties at the k-th
place (the GPU tests' rule), -1 padding, and the deterministic order of the C ABI. Pool pages no row
names are filled with NaN: a kernel that read one would select or score garbage.
"""

from __future__ import annotations

import numpy as np
import torch

from dsa_export.ops.reference import (
    decode_fp8_reference,
    indexer_topk_paged_reference,
    paged_keys_reference,
)
from tests.plugins.test_kernels_gpu import DTYPES

from .case_base import Case, _gen, _randn


# ---- inputs ---------------------------------------------------------------------------------------
def paged_inputs(B, S, M, page, H, D, *, dtype="bf16", w_dtype="bf16", fp8=False, invalid=True, spare_pages=3,
                 ragged=True, gen):
    """q, k_pool (codes for FP8), k_scale_pool or None, w, block_table, query_start, lengths.

    The rows' pages are shuffled through a pool with `spare_pages` pages no row names (NaN, or the
    NaN code 0x7F and a NaN scale for FP8); with `invalid`, some table entries are -1 or >= P."""
    dt, wdt = DTYPES[dtype], DTYPES[w_dtype]
    T = M * page
    P = B * M + spare_pages
    perm = torch.randperm(P, generator=gen)
    table = perm[: B * M].view(B, M).to(torch.int32).clone()
    if invalid:
        r = torch.rand((B, M), generator=gen)
        table[r < 0.12] = -1
        table[(r >= 0.12) & (r < 0.2)] = P + 3
    q = _randn((B, S, H, D), dt, gen)
    w = _randn((B, S, H), wdt, gen, scale=H ** -0.5)
    named = {int(p) for p in table.flatten() if 0 <= int(p) < P}
    unnamed = [p for p in range(P) if p not in named]
    if fp8:
        values = torch.randn((P, page, D), generator=gen) * 2.0
        codes = values.to(torch.float8_e4m3fn).view(torch.uint8).clone()
        scales = (torch.rand((P, page), generator=gen) * 0.5 + 0.25).to(torch.float32)
        for p in unnamed:
            codes[p] = 0x7F
            scales[p] = float("nan")
        k_pool, k_scale = codes, scales
    else:
        k_pool = _randn((P, page, D), dt, gen)
        for p in unnamed:
            k_pool[p] = float("nan")
        k_scale = None
    if ragged:
        lengths = torch.randint(T // 3, T + 1, (B,), generator=gen, dtype=torch.int32)
        lengths[0] = T
        start = torch.tensor([int(torch.randint(0, max(int(n) - S, 0) + 1, (1,), generator=gen)) for n in lengths],
                             dtype=torch.int32)
    else:
        lengths = torch.full((B,), T, dtype=torch.int32)
        start = torch.full((B,), T - S, dtype=torch.int32)
    return q, k_pool, k_scale, w, table, start, lengths


def _keys64(k_pool, k_scale):
    if k_scale is None:
        return k_pool.double().numpy()
    return (decode_fp8_reference(k_pool.numpy()) * k_scale.numpy()[..., None].astype(np.float32)).astype(np.float64)


def check_paged_selection(got, q, k_pool, k_scale, w, table, start, lengths, *, topk, scale, causal,
                          max_tie_rows=None, order=True):
    """Selection of every row against the float64 reference (ties at the k-th place only), -1 padding,
    and (order=True) the C ABI's order: keys above the k-th score, then the ties, each ascending."""
    got = got.cpu().to(torch.int64)
    B, S, _ = got.shape
    q64, w64 = q.double().numpy(), w.double().numpy()
    keys_pool = _keys64(k_pool, k_scale)
    want = indexer_topk_paged_reference(q.float().numpy(), keys_pool.astype(np.float32) if k_scale is not None
                                        else k_pool.float().numpy(), w.float().numpy(), table.numpy(), start.numpy(),
                                        lengths.numpy(), topk=topk, scale=scale, causal=causal)
    ties = 0
    for b in range(B):
        keys, ok = paged_keys_reference(keys_pool, table.numpy(), b)
        scores = (np.maximum(np.einsum("shd,td->sht", q64[b], keys) * scale, 0.0) * w64[b][..., None]).sum(axis=1)
        for s in range(S):
            pos = int(start[b]) + s
            allowed = [t for t in range(keys.shape[0])
                       if ok[t] and t < int(lengths[b]) and (not causal or t <= pos)]
            row = got[b, s]
            cnt = min(topk, len(allowed))
            sel = row[:cnt].tolist()
            assert bool((row[cnt:] == -1).all()), f"row ({b},{s}): slots past {cnt} must be -1: {row.tolist()}"
            assert len(set(sel)) == cnt and all(t in set(allowed) for t in sel), (
                f"row ({b},{s}): selected {sel} not {cnt} distinct allowed keys")
            if cnt == 0:
                continue
            if cnt == len(allowed):
                if order:
                    assert sel == allowed, f"row ({b},{s}): every allowed key, in ascending order: {sel}"
                continue
            ref_sel = [int(t) for t in want[b, s, :cnt]]
            srow = scores[s]
            kth = min(srow[t] for t in ref_sel)
            if set(sel) != set(ref_sel):
                tol = 1e-5 * max(abs(srow[t]) for t in allowed) + 1e-12
                low = min(srow[t] for t in sel)
                assert low >= kth - tol, f"row ({b},{s}): selected a key scoring {low} below the k-th score {kth}"
                ties += 1
            if order:
                # the kernel's own k-th score (its float32 scores are not at hand): the lowest selected
                # in float64; keys strictly above come first in ascending order, then ascending ties.
                low = min(srow[t] for t in sel)
                above = [t for t in sel if srow[t] > low]
                assert above == sorted(above) and sel[len(above):] == sorted(sel[len(above):]), (
                    f"row ({b},{s}): not in the deterministic order: {sel}")
    limit = max(1, B * S // 50) if max_tie_rows is None else max_tie_rows
    assert ties <= limit, f"{ties} rows differ from the reference on ties"


def _call(kl, inputs, *, topk, scale, causal, workspace=None):
    q, k_pool, k_scale, w, table, start, lengths = inputs
    return kl.indexer_topk_paged(q, k_pool, w, table, start, lengths, topk=topk, scale=scale, causal=causal,
                                 k_scale_pool=k_scale, workspace=workspace).clone()


# ---- cases ----------------------------------------------------------------------------------------
def paged_case(B, S, M, page, H, D, topk, *, causal=True, dtype="bf16", w_dtype="bf16", fp8=False, invalid=True,
               ragged=True, order=False):
    def run(kl, seed):
        inputs = paged_inputs(B, S, M, page, H, D, dtype=dtype, w_dtype=w_dtype, fp8=fp8, invalid=invalid,
                              ragged=ragged, gen=_gen(seed))
        got = _call(kl, inputs, topk=topk, scale=D ** -0.5, causal=causal)
        assert got.shape == (B, S, topk) and got.dtype == torch.int32
        check_paged_selection(got, *inputs, topk=topk, scale=D ** -0.5, causal=causal, order=order)
    return run


def paged_exact_ties(kl, seed):
    """Every score is exactly 0 (q.k < 0): each row takes its lowest valid allowed positions, in order;
    then ties at the k-th place among distinct scores go to the lower positions."""
    gen = _gen(seed)
    B, S, M, page, H, D, topk = 2, 3, 8, 16, 16, 64, 20
    inputs = list(paged_inputs(B, S, M, page, H, D, gen=gen))
    q = -torch.ones((B, S, H, D), dtype=torch.bfloat16)
    k_pool = inputs[1]
    named = torch.isfinite(k_pool.float()).all(dim=-1).all(dim=-1)
    k_pool[named] = 1.0
    w = torch.ones((B, S, H), dtype=torch.bfloat16)
    inputs[0], inputs[1], inputs[3] = q, k_pool, w
    got = _call(kl, inputs, topk=topk, scale=0.125, causal=True)
    check_paged_selection(got, *inputs, topk=topk, scale=0.125, causal=True, max_tie_rows=0)
    table, start, lengths = inputs[4], inputs[5], inputs[6]
    for b in range(B):
        for s in range(S):
            ok = [t for t in range(M * page) if 0 <= int(table[b, t // page]) < k_pool.shape[0]
                  and t < int(lengths[b]) and t <= int(start[b]) + s]
            assert got[b, s, :min(topk, len(ok))].tolist() == ok[:topk], f"row ({b},{s}): {got[b, s].tolist()}"
    # distinct scores with a tie at the k-th place: positions of the first named page score 2, the rest 1
    q2 = torch.ones((B, S, H, D), dtype=torch.bfloat16)
    k2 = k_pool.clone()
    first = next(int(e) for e in table[0] if 0 <= int(e) < k_pool.shape[0])  # a valid page of row 0
    k2[first] = 2.0
    inputs[0], inputs[1] = q2, k2
    got = _call(kl, inputs, topk=topk, scale=1.0 / D, causal=False)
    check_paged_selection(got, *inputs, topk=topk, scale=1.0 / D, causal=False, max_tie_rows=0)


def paged_matches_contiguous(kl, seed):
    """An identity table over the contiguous cache (and the same pages shuffled through a pool) gives
    dsa_indexer_topk's indices, in the same order, bit for bit."""
    gen = _gen(seed)
    B, S, M, page, H, D, topk = 2, 4, 10, 16, 16, 64, 24
    T = M * page
    q, k = _randn((B, S, H, D), torch.bfloat16, gen), _randn((B, T, D), torch.bfloat16, gen)
    w = _randn((B, S, H), torch.float32, gen, scale=0.25)
    lengths = torch.tensor([T, T - 37], dtype=torch.int32)
    want = kl.indexer_topk(q, k, w, lengths, topk=topk, scale=0.125).clone()
    identity = torch.arange(B * M, dtype=torch.int32).view(B, M)
    start = torch.full((B,), T - S, dtype=torch.int32)
    got = kl.indexer_topk_paged(q, k.view(B * M, page, D), w, identity, start, lengths, topk=topk, scale=0.125).clone()
    assert torch.equal(got, want), "the identity table differs from the contiguous op"
    perm = torch.randperm(B * M + 2, generator=gen)
    pool = torch.full((B * M + 2, page, D), float("nan"), dtype=torch.bfloat16)
    pool[perm[: B * M]] = k.view(B * M, page, D)
    shuffled = perm[: B * M].view(B, M).to(torch.int32)
    got = kl.indexer_topk_paged(q, pool, w, shuffled, start, lengths, topk=topk, scale=0.125).clone()
    assert torch.equal(got, want), "shuffled pages differ from the contiguous op"


def multi_block_equals_one_block(kl, seed):
    """The multi-block top-k (forced; splits of 512 keys) gives the one-block top-k's indices in the same
    order: paged float and FP8 pools, the contiguous op, rows with every key tied (candidates overflowing
    a 64-entry shared buffer) and rows with fewer valid keys than topk."""
    gen = _gen(seed)
    previous = kl.indexer_topk_set_select_mode("auto")
    try:
        runs = []
        B, S, M, page, H, D, topk = 2, 2, 24, 64, 16, 64, 100
        runs.append(("paged-bf16", paged_inputs(B, S, M, page, H, D, w_dtype="fp32", gen=gen), topk, True))
        runs.append(("paged-fp8", paged_inputs(1, 2, 20, 64, H, D, fp8=True, w_dtype="fp32", gen=gen), 64, False))
        tied = list(paged_inputs(1, 2, 12, 64, H, D, gen=gen, ragged=False))
        tied[0] = -torch.ones_like(tied[0])  # every score 0: the boundary bin holds every valid key
        runs.append(("paged-all-tied", tuple(tied), 90, True))
        few = list(paged_inputs(1, 1, 12, 64, H, D, gen=gen, ragged=False))
        few[4][0, 2:] = -1  # 128 valid keys for a top-200 among 768 logical ones
        runs.append(("paged-few-valid", tuple(few), 200, False))
        for name, inputs, k, causal in runs:
            outs = {}
            for mode in ("one-block", "multi-block", "multi-block-small-buffer"):
                kl.indexer_topk_set_select_mode(mode)
                outs[mode] = _call(kl, inputs, topk=k, scale=D ** -0.5, causal=causal)
            check_paged_selection(outs["one-block"], *inputs, topk=k, scale=D ** -0.5, causal=causal, order=False)
            for mode in ("multi-block", "multi-block-small-buffer"):
                assert torch.equal(outs[mode], outs["one-block"]), f"{name}: {mode} differs from one-block"
        q, kc = _randn((1, 2, H, D), torch.bfloat16, gen), _randn((1, 1500, D), torch.bfloat16, gen)
        w = _randn((1, 2, H), torch.bfloat16, gen)
        outs = {}
        for mode in ("one-block", "multi-block", "multi-block-small-buffer"):
            kl.indexer_topk_set_select_mode(mode)
            outs[mode] = kl.indexer_topk(q, kc, w, topk=128, scale=0.125).clone()
        for mode in ("multi-block", "multi-block-small-buffer"):
            assert torch.equal(outs[mode], outs["one-block"]), f"contiguous: {mode} differs from one-block"
    finally:
        kl.indexer_topk_set_select_mode(previous)


def quantize_q_e4m3(q: torch.Tensor) -> torch.Tensor:
    """q as the FP8 MMA sees it (float32): each (query, head) row of D <= 128 values quantized to e4m3
    with the power-of-two scale 2^e, e = frexp(amax / 448).exponent (1 for an all-zero row)."""
    q32 = q.float()
    amax = q32.abs().amax(dim=-1, keepdim=True)
    _, e = torch.frexp(amax / 448.0)
    scale = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), e), torch.ones_like(amax))
    return (q32 / scale).to(torch.float8_e4m3fn).float() * scale


def fp8_mma_case(B, S, M, page, H, D, topk, *, dtype="bf16", w_dtype="fp32", causal=True):
    """FP8 keys through the e4m3 MMA (forced on; sm_89/sm_90): the selection of the reference whose q is
    quantized the same way; on sm_80 the switch changes nothing (16-bit MMA on decoded keys)."""
    def run(kl, seed):
        gen = _gen(seed)
        inputs = list(paged_inputs(B, S, M, page, H, D, dtype=dtype, w_dtype=w_dtype, fp8=True, ragged=False,
                                   gen=gen))
        previous = kl.indexer_topk_set_fp8_mma(True)
        try:
            before = kl.stats()["mma"]
            got = _call(kl, inputs, topk=topk, scale=D ** -0.5, causal=causal)
            ran = kl.stats()["mma"] - before
        finally:
            kl.indexer_topk_set_fp8_mma(previous)
        assert ran > 0, "no MMA ran"
        checked = list(inputs)
        if kl.device in ("sm90", "sm89"):
            checked[0] = quantize_q_e4m3(inputs[0])
        check_paged_selection(got, *checked, topk=topk, scale=D ** -0.5, causal=causal, order=True)
    return run


def paged_errors(kl, seed):
    """Forced multi-block beyond 8 rows, and a missing block table, are refused."""
    from dsa_export.plugins.kernels import KernelError

    gen = _gen(seed)
    inputs = paged_inputs(3, 3, 4, 16, 16, 64, gen=gen)
    previous = kl.indexer_topk_set_select_mode("multi-block")
    try:
        _call(kl, inputs, topk=8, scale=0.1, causal=True)
    except KernelError as exc:
        assert "multi-block" in str(exc), str(exc)
    else:
        raise AssertionError("a forced multi-block top-k of 9 rows was accepted")
    finally:
        kl.indexer_topk_set_select_mode(previous)


SMALL_CASES: list[Case] = [
    Case("pix-bf16-shuffled-invalid-ragged", "paged-indexer", paged_case(2, 3, 12, 16, 16, 64, 24, order=True)),
    Case("pix-fp16-noncausal-wfp32", "paged-indexer", paged_case(2, 2, 6, 32, 32, 64, 20, causal=False,
                                                                 dtype="fp16", w_dtype="fp32")),
    Case("pix-fp32-generic", "paged-indexer", paged_case(1, 3, 6, 16, 4, 32, 12, dtype="fp32", w_dtype="fp32")),
    Case("pix-fp8-bf16-decode-H64", "paged-indexer", paged_case(2, 1, 8, 32, 64, 64, 40, fp8=True, w_dtype="fp32",
                                                                order=True)),
    Case("pix-fp8-fp16-prefill", "paged-indexer", paged_case(1, 4, 6, 32, 16, 64, 24, fp8=True, dtype="fp16",
                                                             w_dtype="fp16")),
    Case("pix-fp8-fp32-generic", "paged-indexer", paged_case(1, 2, 5, 16, 4, 32, 10, fp8=True, dtype="fp32",
                                                             w_dtype="fp32")),
    Case("pix-fp8-sm75-generic", "paged-indexer", paged_case(1, 2, 5, 16, 16, 64, 12, fp8=True), device="sm75"),
    Case("pix-exact-ties", "paged-indexer", paged_exact_ties),
    Case("pix-matches-contiguous", "paged-indexer", paged_matches_contiguous),
    Case("pix-multi-block-equals-one-block", "paged-indexer", multi_block_equals_one_block),
    Case("pix-errors", "paged-indexer", paged_errors, schedules=("lockstep-copies-at-wait",)),
    Case("pix-fp8-mma-e4m3-sm90", "paged-indexer", fp8_mma_case(2, 2, 8, 32, 32, 128, 40)),
    Case("pix-fp8-mma-e4m3-sm89-fp16-D64", "paged-indexer", fp8_mma_case(1, 3, 6, 32, 16, 64, 24, dtype="fp16",
                                                                        w_dtype="fp16"), device="sm89"),
    Case("pix-fp8-mma-off-on-sm80", "paged-indexer", fp8_mma_case(1, 2, 6, 32, 16, 128, 24), device="sm80"),
]

#: DeepSeek-V3.2 widths (a command, not a CI test): 64 heads x 128, top-2048 over 32K paged keys
#: (pages of 64) at decode, where the launcher takes the multi-block top-k.
REAL_WIDTH_CASES: list[Case] = [
    Case("rw-pix-fp8-64x128-top2048-T32K", "paged-indexer",
         paged_case(1, 1, 512, 64, 64, 128, 2048, fp8=True, w_dtype="fp32", invalid=False, ragged=False,
                    order=True)),
    Case("rw-pix-bf16-64x128-top2048-T32K", "paged-indexer",
         paged_case(1, 1, 512, 64, 64, 128, 2048, w_dtype="fp32", invalid=True, ragged=False, order=True)),
]
