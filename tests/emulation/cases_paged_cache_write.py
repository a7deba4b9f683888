"""Emulator cases of the paged cache write (``dsa_paged_cache_write``, DSAPagedCacheWrite): the paged
graph's ScatterND of a call's new tokens into a pool, in place.

Each case is a function of (kernels, seed), as in cases.py, checked bit for bit against the rule
written out below: every token whose (page, offset) lies in the pool is written, every other one is
skipped, and every other byte of the pool keeps its value. Each call holds, in a shuffled order,
real tokens (distinct slots on pages >= 1), padding tokens (all on the scratch slot, page 0 offset
0, each element of which holds one of theirs) and tokens out of range in every way (negative, equal to the
bound, past it, and values that a 32-bit truncation would bring back into range). The widths cover
DeepSeek's latent (576) and index keys (128) and odd widths whose rows are not a multiple of 16
bytes, placed so that some rows take the 16-byte body with its element tail and others only
element copies.
"""

from __future__ import annotations

import torch

from .case_base import Case, _gen

_DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_BITS = {4: torch.int32, 2: torch.int16}


def out_of_range(P: int, page: int) -> list[tuple[int, int]]:
    """(page, offset) pairs no write may follow: each bound, past it, negative, and values whose low
    32 bits name a slot of the pool."""
    return [(-1, 0), (P, 0), (P + 5, 3), (2**32 + 1, 0), (-(2**40), 5), (1, -1), (1, page), (1, 2**32 + 2),
            (2**62, 2**62)]


def layout(B, S, P, page, gen, *, pad=2, bad=3, align=1):
    """indices [B,S,2] int64 and the rows' kinds ("real", "pad", "bad"), shuffled. ``align`` > 1:
    even real rows get a slot with (slot - row) % align == 0 (pool and update rows equally aligned
    modulo 16 for a row of that many 16-byte periods), odd ones a slot without."""
    rows = B * S
    n_real = rows - pad - bad
    assert n_real >= 0 and n_real <= (P - 1) * page, "the case asks for more real tokens than slots"
    kinds = ["real"] * n_real + ["pad"] * pad + ["bad"] * bad
    kinds = [kinds[i] for i in torch.randperm(rows, generator=gen).tolist()]
    free = [page + i for i in torch.randperm((P - 1) * page, generator=gen).tolist()]  # slots on pages >= 1
    wrong = out_of_range(P, page)
    idx = torch.zeros((rows, 2), dtype=torch.int64)
    n_bad = 0
    for r, kind in enumerate(kinds):
        if kind == "real":
            want = align == 1 or r % 2 == 0
            pick = next((s for s in free if ((s - r) % align == 0) == want), free[0])
            free.remove(pick)
            idx[r] = torch.tensor([pick // page, pick % page])
        elif kind == "bad":
            idx[r] = torch.tensor(wrong[(n_bad + int(torch.randint(0, len(wrong), (), generator=gen))) % len(wrong)])
            n_bad += 1
    return idx.view(B, S, 2), kinds


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_BITS[t.element_size()])


def check_write(got, pool, idx, updates, kinds):
    """``got`` is ``pool`` with the real tokens written, one padding token's row on the scratch slot
    (when there is one) and every other byte unchanged."""
    P, page, W = pool.shape
    flat_idx, flat_upd = idx.view(-1, 2), updates.reshape(-1, W)
    want = _bits(pool).clone()
    for r, kind in enumerate(kinds):
        if kind == "real":
            want[flat_idx[r, 0], flat_idx[r, 1]] = _bits(flat_upd[r])
    pads = [r for r, kind in enumerate(kinds) if kind == "pad"]
    have = _bits(got)
    if pads:
        # The padding tokens race for the scratch slot; their warps may interleave, so each element
        # holds that element of one of them (the slot is never read as a token).
        scratch = have[0, 0]
        from_pad = torch.stack([_bits(flat_upd[r]) == scratch for r in pads]).any(dim=0)
        assert from_pad.all(), ("elements " + str((~from_pad).nonzero().flatten().tolist()[:8])
                                + " of the scratch slot (page 0, offset 0) hold none of the padding tokens' values")
        want[0, 0] = scratch
    wrong = (have != want).any(dim=-1)
    if wrong.any():
        slots = wrong.nonzero().tolist()
        writers = [r for r in range(len(kinds)) if flat_idx[r].tolist() in slots[:1]]
        cols = (have[tuple(slots[0])] != want[tuple(slots[0])]).nonzero().flatten().tolist()
        raise AssertionError(f"{len(slots)} pool slot(s) differ from the rule, first (page, offset) {slots[0]} "
                             f"(written by rows {writers}) in elements {cols[:8]}{'...' if len(cols) > 8 else ''}")


def write_case(B, S, P, page, W, dtype, *, pad=2, bad=3, align=1):
    def run(kl, seed):
        gen = _gen(seed)
        dt = _DT[dtype]
        pool = torch.randn((P, page, W), generator=gen).to(dt)
        updates = torch.randn((B, S, W), generator=gen).to(dt)
        updates.view(-1)[:: max(1, W - 1)][:3] = float("nan")  # NaNs travel as bits
        idx, kinds = layout(B, S, P, page, gen, pad=pad, bad=bad, align=align)
        got = kl.paged_cache_write(pool, idx, updates).clone()
        assert got.shape == pool.shape and got.dtype == dt
        check_write(got, pool, idx, updates, kinds)
    return run


def nothing_in_range(kl, seed):
    """Every token out of range: the pool keeps every byte."""
    gen = _gen(seed)
    P, page, W = 3, 16, 40
    pool = torch.randn((P, page, W), generator=gen).to(torch.bfloat16)
    wrong = out_of_range(P, page)
    idx = torch.tensor(wrong, dtype=torch.int64).view(1, len(wrong), 2)
    updates = torch.randn((1, len(wrong), W), generator=gen).to(torch.bfloat16)
    got = kl.paged_cache_write(pool, idx, updates).clone()
    check_write(got, pool, idx, updates, ["bad"] * len(wrong))


def empty_calls(kl, seed):
    """No token, or a pool without pages: nothing runs and the call succeeds; bad arguments fail
    with the library's message."""
    gen = _gen(seed)
    pool = torch.randn((2, 8, 24), generator=gen)
    got = kl.paged_cache_write(pool, torch.zeros((2, 0, 2), dtype=torch.int64), torch.zeros((2, 0, 24))).clone()
    assert torch.equal(_bits(got), _bits(pool))
    kl.paged_cache_write(torch.zeros((0, 8, 24)), torch.zeros((1, 3, 2), dtype=torch.int64), torch.ones((1, 3, 24)))
    status = kl._lib.dsa_paged_cache_write(None, None, None, 1, 1, 2, 0, 24, 0, None)
    assert status == 1 and b"page >= 1" in kl._lib.dsa_last_error(), kl._lib.dsa_last_error()


SMALL_CASES: list[Case] = [
    # DeepSeek widths: the latent row (576) in float32, the index keys (128) in bf16 and fp16
    Case("pcw-w576-fp32", "cache-write", write_case(2, 5, 4, 64, 576, "fp32")),
    Case("pcw-w128-bf16", "cache-write", write_case(3, 6, 3, 16, 128, "bf16", pad=3)),
    Case("pcw-w128-fp16-decode", "cache-write", write_case(6, 1, 4, 16, 128, "fp16", pad=1, bad=2)),
    # odd widths: rows of 74 / 52 / 88 bytes (body + element tail, or elements only), and 14 bytes
    Case("pcw-odd-w37-fp16", "cache-write", write_case(2, 9, 3, 16, 37, "fp16", align=8)),
    Case("pcw-odd-w13-fp32", "cache-write", write_case(2, 9, 3, 16, 13, "fp32", align=4)),
    Case("pcw-odd-w44-bf16", "cache-write", write_case(3, 5, 3, 8, 44, "bf16", align=2)),
    Case("pcw-w7-bf16-elements-only", "cache-write", write_case(2, 4, 3, 8, 7, "bf16")),
    Case("pcw-nothing-in-range", "cache-write", nothing_in_range),
    Case("pcw-empty-and-bad-arguments", "cache-write", empty_calls, schedules=("lockstep-copies-at-wait",)),
]

REAL_WIDTH_CASES: list[Case] = [
    # a prefill chunk of 256 tokens of DeepSeek's latent into a 64-page pool (bf16)
    Case("rw-pcw-w576-s256-bf16", "cache-write", write_case(1, 256, 64, 64, 576, "bf16", pad=4, bad=9)),
]
