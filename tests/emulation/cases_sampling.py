"""Emulator cases of token sampling on the device (greedy, temperature, top-p).

Each case is a function of (kernels, seed), as in cases.py, checked against the float64 rule
(dsa_export.runtime.generate.sample_rows) with the device's own draws by
tests/plugins/sampling_reference.check_tokens (exact, except within SAMPLE_EPS of a cumulative
boundary, where float32 and float64 may differ; see there).
"""

from __future__ import annotations

import numpy as np
import torch

from dsa_export.runtime.philox import philox_u53
from tests.plugins.sampling_reference import check_tokens

from .case_base import Case, _gen

_DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _lm_logits(B, V, gen, *, scale=3.0, peaks=4):
    """Language-model-like rows: a normal background and a few strong candidates."""
    x = torch.randn((B, V), generator=gen) * scale
    for b in range(B):
        idx = torch.randint(0, V, (peaks,), generator=gen)
        x[b, idx] += torch.rand((peaks,), generator=gen) * 6 + 4
    return x


def _settings(B, gen, kinds):
    """Per-row temperature, top_p, seed (uint64) and offset (int64) for row kinds g / t / p."""
    temps, tops = [], []
    for b in range(B):
        kind = kinds[b % len(kinds)]
        temps.append(0.0 if kind == "g" else float(torch.rand((), generator=gen)) * 1.5 + 0.3)
        tops.append(float(torch.rand((), generator=gen)) * 0.9 + 0.05 if kind == "p" else 1.0)
    seeds = np.array([int(s) for s in torch.randint(0, 2**62, (B,), generator=gen)], dtype=np.uint64)
    seeds[0] |= np.uint64(1 << 63)  # the high bit of the key
    offsets = np.array([int(o) for o in torch.randint(0, 2**40, (B,), generator=gen)], dtype=np.int64)
    return (torch.tensor(temps, dtype=torch.float32), torch.tensor(tops, dtype=torch.float32), seeds, offsets)


def sampling_case(B, V, dtype, kinds, *, steps=1, scale=3.0):
    """B rows of V logits in dtype with per-row kinds (g greedy, t temperature, p temperature + top-p),
    sampled at `steps` consecutive offsets, each call checked against the float64 rule."""
    def run(kl, seed):
        gen = _gen(seed)
        logits = _lm_logits(B, V, gen, scale=scale).to(_DT[dtype])
        temps, tops, seeds, offsets = _settings(B, gen, kinds)
        tolerated = 0
        for step in range(steps):
            got = kl.sample_tokens(logits, temps, tops, seeds, offsets + step).clone()
            # The reference sees the values the device read (float32 temperature and top_p).
            tolerated += check_tokens(got, logits, temps.double().numpy(), tops.double().numpy(), seeds,
                                      offsets + step, what=f"step {step}: ")
        assert tolerated <= 1, f"{tolerated} rows only within the boundary tolerance"
    return run


def greedy_ties(kl, seed):
    """Greedy rows: ties at the maximum go to the lowest index, across warps and 512-token chunks;
    NULL temperature is greedy too; a row of equal values gives 0."""
    V = 1300
    gen = _gen(seed)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn((6, V), generator=gen)
        x[0, [700, 999, 1299]] = 9.0           # first tie in the second chunk
        x[1, [3, 37, 515, 1030]] = 9.0         # ties in one warp, another warp, other chunks
        x[2] = 1.5                             # every value equal
        x[3, V - 1] = 50.0                     # the last token
        x[4, :] = -float("inf")
        x[4, [600, 601]] = -1.0                # -inf elsewhere
        x[5, [1299, 0]] = 9.0                  # lowest and highest index
        x = x.to(dtype)
        want = [700, 3, 0, V - 1, 600, 0]
        for temperature in (None, torch.zeros(6), torch.tensor([0.0, -1.0, 0.0, float("nan"), 0.0, 0.0])):
            got = kl.sample_tokens(x, temperature, 0.5, 123, 7).clone()
            assert got.tolist() == want, f"{dtype}, temperature {temperature}: {got.tolist()} != {want}"
        check_tokens(got, x, 0.0, 1.0, 123, 7)


def uniform_draws_exact(kl, seed):
    """Equal logits over V = 4096 tokens: the token is floor(u * V) exactly, so the device's Philox
    draws equal the host's in their 12 high bits, for every row's seed and offset."""
    B, V = 16, 4096
    gen = _gen(seed)
    x = torch.zeros((B, V), dtype=torch.float16)
    seeds = np.array([int(s) for s in torch.randint(0, 2**62, (B,), generator=gen)], dtype=np.uint64) * np.uint64(3)
    offsets = np.arange(B, dtype=np.int64) * 1000003 - 5  # a negative offset is its two's complement
    got = kl.sample_tokens(x, 1.0, None, seeds, offsets).clone().to(torch.int64).numpy()
    want = (philox_u53(seeds, offsets) >> np.uint64(53 - 12)).astype(np.int64)
    assert (got == want).all(), f"{got.tolist()} != {want.tolist()}"


def top_p_ties(kl, seed):
    """Ten tokens of probability 0.1 each (equal logits) and a negligible rest: top_p 0.35 keeps the
    four tied tokens of the lowest indices (mass before them 0, .1, .2, .3), as a stable sort does."""
    B, V = 32, 900
    gen = _gen(seed)
    x = torch.full((V,), -1e4)
    ties = torch.randperm(V, generator=gen)[:10].sort().values
    x[ties] = 0.0
    logits = x.expand(B, V).contiguous()
    seeds = np.arange(B, dtype=np.uint64) + np.uint64(seed % 1000)
    got = kl.sample_tokens(logits, 1.0, 0.35, seeds, 11).clone()
    assert set(got.tolist()) <= set(ties[:4].tolist()), f"{sorted(set(got.tolist()))} not in {ties[:4].tolist()}"
    assert len(set(got.tolist())) == 4, "32 draws should reach each of the four kept tokens"
    check_tokens(got, logits, 1.0, 0.35, seeds, 11, max_tolerated=0)
    # top_p 1 and no top_p give the same tokens (each of the ten now); a tiny top_p keeps the first.
    all_p = kl.sample_tokens(logits, 1.0, 1.0, seeds, 11).clone()
    assert torch.equal(all_p, kl.sample_tokens(logits, 1.0, None, seeds, 11).clone())
    check_tokens(all_p, logits, 1.0, 1.0, seeds, 11, max_tolerated=0)
    tiny = kl.sample_tokens(logits, 1.0, 1e-7, seeds, 11).clone()
    assert set(tiny.tolist()) == {int(ties[0])}, tiny.tolist()


def row_stride(kl, seed):
    """[B,S,V] logits: the last position through the row stride (no copy) equals the dense rows, and
    a [B,V] view of a wider buffer."""
    B, S, V = 4, 3, 777
    gen = _gen(seed)
    full = _lm_logits(B * S, V, gen).reshape(B, S, V).to(torch.bfloat16)
    temps = torch.tensor([0.0, 0.8, 1.2, 0.6])
    tops = torch.tensor([1.0, 0.9, 1.0, 0.5])
    seeds = np.array([5, 6, 7, 8], dtype=np.uint64)
    got = kl.sample_tokens(full, temps, tops, seeds, 3).clone()
    dense = kl.sample_tokens(full[:, -1, :].contiguous(), temps, tops, seeds, 3).clone()
    assert torch.equal(got, dense), f"{got.tolist()} != {dense.tolist()}"
    check_tokens(got, full[:, -1, :], temps.double().numpy(), tops.double().numpy(), seeds, 3)
    wide = torch.full((B, V + 50), float("nan"), dtype=torch.float32)  # the gaps must never be read
    wide[:, :V] = full[:, 0, :].float()
    got = kl.sample_tokens(wide[:, :V], temps, tops, seeds, 4).clone()
    check_tokens(got, full[:, 0, :].float(), temps.double().numpy(), tops.double().numpy(), seeds, 4)


def extreme_logits(kl, seed):
    """-inf entries, huge magnitudes, tiny and huge temperatures: never NaN, always the rule's token."""
    gen = _gen(seed)
    V = 600
    cases = []
    x = torch.randn((4, V), generator=gen) * 3
    x[:, ::3] = -float("inf")
    cases.append((x, [0.7, 1.0, 0.2, 5.0], [1.0, 0.8, 0.95, 0.3]))
    big = torch.randn((4, V), generator=gen) * 1e37
    big[0, 17] = 3e38
    cases.append((big, [1.0, 1e36, 3e37, 1e-3], [1.0, 0.9, 1.0, 0.5]))
    h = (torch.randn((4, V), generator=gen) * 2e4).clamp(-65504, 65504).to(torch.float16)
    h[1, 5] = 65504
    h[2, :300] = -float("inf")
    cases.append((h, [1.0, 3e3, 1e4, 0.01], [0.9, 1.0, 0.6, 1.0]))
    b16 = (torch.randn((4, V), generator=gen) * 1e30).to(torch.bfloat16)
    cases.append((b16, [1e30, 2e29, 1.0, 5e30], [0.99, 0.7, 1.0, 1.0]))
    for i, (logits, temps, tops) in enumerate(cases):
        temps, tops = torch.tensor(temps), torch.tensor(tops)
        seeds = np.array([11, 12, 13, 14], dtype=np.uint64) + np.uint64(i)
        for step in range(3):
            got = kl.sample_tokens(logits, temps, tops, seeds, step).clone()
            check_tokens(got, logits, temps.double().numpy(), tops.double().numpy(), seeds, step,
                         what=f"case {i} step {step}: ")


def determinism(kl, seed):
    """The same call under another schedule gives the same ids; a row's id does not depend on the
    other rows of the batch."""
    from .case_base import kl_schedule_other

    gen = _gen(seed)
    B, V = 6, 1100
    logits = _lm_logits(B, V, gen, scale=1.0).to(torch.float16)
    temps, tops, seeds, offsets = _settings(B, gen, "tpp")
    first = kl.sample_tokens(logits, temps, tops, seeds, offsets).clone()
    kl.configure(kl_schedule_other(kl), seed=seed + 1, device=kl.device)
    second = kl.sample_tokens(logits, temps, tops, seeds, offsets).clone()
    assert torch.equal(first, second), f"{first.tolist()} != {second.tolist()}"
    alone = kl.sample_tokens(logits[2:3], temps[2:3], tops[2:3], seeds[2:3], offsets[2:3]).clone()
    assert int(alone[0]) == int(first[2]), "a row's token depends on the other rows"


def invalid_arguments(kl, seed):
    from dsa_export.plugins.kernels import KernelError

    x = torch.zeros((2, 10))
    for call in (lambda: kl._lib.dsa_sample_tokens(kl._staged(x).data_ptr(), 5, kl._empty((2,), torch.int32, x)
                                                   .data_ptr(), None, None, None, None, 2, 10, 0, None),
                 lambda: kl._lib.dsa_sample_tokens(kl._staged(x).data_ptr(), 10, kl._empty((2,), torch.int32, x)
                                                   .data_ptr(), None, None, None, None, 2, 10, 7, None)):
        try:
            kl._check(call(), "dsa_sample_tokens")
        except KernelError:
            pass
        else:
            raise AssertionError("invalid arguments were accepted")
    assert kl.sample_tokens(torch.zeros((0, 10))).shape == (0,)


SMALL_CASES: list[Case] = [
    Case("samp-greedy-ties", "sampling", greedy_ties),
    Case("samp-uniform-draws-exact", "sampling", uniform_draws_exact),
    Case("samp-temperature-fp32", "sampling", sampling_case(6, 1500, "fp32", "t", steps=2)),
    Case("samp-top-p-fp16", "sampling", sampling_case(6, 1000, "fp16", "p", steps=2, scale=1.5)),
    Case("samp-mixed-rows-bf16", "sampling", sampling_case(8, 700, "bf16", "gtpp")),
    Case("samp-top-p-ties", "sampling", top_p_ties),
    Case("samp-row-stride", "sampling", row_stride),
    Case("samp-extreme-logits", "sampling", extreme_logits),
    Case("samp-determinism", "sampling", determinism),
    Case("samp-invalid-arguments", "sampling", invalid_arguments, schedules=("lockstep-copies-at-wait",)),
]

#: DeepSeek-V3.2 widths (a command, not a CI test): the 129280-token vocabulary, a batch of 8 with
#: greedy, temperature and top-p rows.
REAL_WIDTH_CASES: list[Case] = [
    Case("rw-samp-v129280-b8-bf16", "sampling", sampling_case(8, 129280, "bf16", "gtpp", steps=3, scale=2.0)),
]
