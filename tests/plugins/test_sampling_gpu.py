"""The device sampler (dsa_sample_tokens) against the float64 rule, on a GPU.

The same checks as the emulator's cases (tests/emulation/cases_sampling.py), on CUDA tensors:
greedy rows exactly; sampled rows exactly, except within SAMPLE_EPS of a cumulative boundary
(tests/plugins/sampling_reference.py). Skips without a GPU or a built libdsa_kernels.so.
"""

from __future__ import annotations

import numpy as np
import pytest

from dsa_export.runtime.philox import philox_u53

from .sampling_reference import check_tokens

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _logits(B, V, seed, dtype, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((B, V), generator=gen) * scale
    for b in range(B):
        x[b, torch.randint(0, V, (4,), generator=gen)] += 8.0
    return x.to(dtype)


def _settings(B, seed):
    gen = np.random.default_rng(seed)
    kinds = ["g", "t", "p", "p"]
    temps = np.array([0.0 if kinds[b % 4] == "g" else gen.uniform(0.3, 1.8) for b in range(B)], dtype=np.float32)
    tops = np.array([gen.uniform(0.05, 0.95) if kinds[b % 4] == "p" else 1.0 for b in range(B)], dtype=np.float32)
    seeds = gen.integers(0, 2**63, B, dtype=np.uint64) | np.uint64(1 << 63)
    offsets = gen.integers(0, 2**40, B, dtype=np.int64)
    return temps, tops, seeds, offsets


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("B, V", [(8, 1500), (8, 129280), (33, 32000)])
def test_sample_tokens_matches_the_float64_rule(cuda_kernels, dtype, B, V):
    logits = _logits(B, V, B * 7919 + V, DTYPES[dtype])
    temps, tops, seeds, offsets = _settings(B, V)
    tolerated = 0
    for step in range(4):
        got = cuda_kernels.sample_tokens(logits.cuda(), torch.from_numpy(temps).cuda(), torch.from_numpy(tops).cuda(),
                                         seeds, offsets + step)
        torch.cuda.synchronize()
        tolerated += check_tokens(got.cpu(), logits, temps.astype(np.float64), tops.astype(np.float64), seeds,
                                  offsets + step)
    assert tolerated <= 1


def test_greedy_ties_go_to_the_lowest_index(cuda_kernels):
    x = torch.randn((3, 4000))
    x[0, [2600, 3999, 1030]] = 9.0
    x[1] = 0.5
    x[2, [0, 3999]] = 9.0
    got = cuda_kernels.sample_tokens(x.cuda(), None).cpu()
    assert got.tolist() == [1030, 0, 0]


def test_uniform_rows_take_the_philox_draws(cuda_kernels):
    B, V = 64, 4096
    seeds = np.arange(B, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    offsets = np.arange(B, dtype=np.int64) - 3
    got = cuda_kernels.sample_tokens(torch.zeros((B, V), device="cuda"), 1.0, None, seeds, offsets).cpu().numpy()
    assert (got == (philox_u53(seeds, offsets) >> np.uint64(41)).astype(np.int64)).all()


def test_last_position_of_a_sequence_through_the_row_stride(cuda_kernels):
    full = _logits(12, 5000, 3, torch.bfloat16).reshape(4, 3, 5000).cuda()
    temps = torch.tensor([0.0, 0.8, 1.1, 0.6], device="cuda")
    tops = torch.tensor([1.0, 0.9, 1.0, 0.5], device="cuda")
    a = cuda_kernels.sample_tokens(full, temps, tops, 5, 9)
    b = cuda_kernels.sample_tokens(full[:, -1].contiguous(), temps, tops, 5, 9)
    assert torch.equal(a, b)


def test_runs_are_reproducible_and_rows_independent(cuda_kernels):
    logits = _logits(16, 129280, 11, torch.bfloat16).cuda()
    temps, tops, seeds, offsets = _settings(16, 5)
    args = (torch.from_numpy(temps).cuda(), torch.from_numpy(tops).cuda(), seeds, offsets)
    first = cuda_kernels.sample_tokens(logits, *args)
    assert all(torch.equal(first, cuda_kernels.sample_tokens(logits, *args)) for _ in range(5))
    alone = cuda_kernels.sample_tokens(logits[5:6], *(a[5:6] for a in args))
    assert int(alone[0]) == int(first[5])
