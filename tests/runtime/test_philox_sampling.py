"""The host side of the device sampler: Philox4x32-10 (dsa_export.runtime.philox) and the shared
sampling rule (dsa_export.runtime.generate.sample_rows / choose_tokens with draws)."""

from __future__ import annotations

import numpy as np
import pytest

from dsa_export.runtime.generate import SamplingSettings, choose_tokens, sample_rows
from dsa_export.runtime.philox import philox4x32_10, philox_u53, philox_uniform

# Random123's known answers for Philox4x32-10 (its kat_vectors).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def test_philox_known_answers_one_by_one_and_vectorised():
    for counter, key, want in KAT:
        assert tuple(int(x) for x in philox4x32_10(counter, key)[0]) == want
    got = philox4x32_10([c for c, _, _ in KAT], [k for _, k, _ in KAT])
    assert [tuple(map(int, row)) for row in got] == [w for _, _, w in KAT]


def test_draws_are_the_documented_words():
    # u53 = ((x1 << 32) | x0) >> 11 with key (seed lo, hi), counter (offset lo, hi, 0, 0); the C++
    # runtime's host test checks the same values (tools/cpp_runtime/host_test.cpp).
    assert int(philox_u53(0, 0)) == (0xE169C58D << 32 | 0x6627E8D5) >> 11 == 0x1C2D38B1ACC4FD
    assert int(philox_u53(np.uint64(123), 7)) == 0xC133DCE0611E9
    assert int(philox_u53(np.uint64(2**63 + 5), 2**40 + 3)) == 0x1D0A46356E6BD6
    # A negative offset is its two's complement.
    assert int(philox_u53(np.uint64(9), -1)) == int(philox_u53(np.uint64(9), np.uint64(2**64 - 1)))
    u = philox_uniform(np.arange(1000, dtype=np.uint64), np.arange(1000))
    assert u.shape == (1000,) and u.min() >= 0 and u.max() < 1 and 0.45 < u.mean() < 0.55
    assert np.array_equal(u, philox_u53(np.arange(1000, dtype=np.uint64), np.arange(1000)) * 2.0 ** -53)


def test_choose_tokens_takes_draws_and_keeps_its_generator_path():
    gen = np.random.default_rng(0)
    logits = gen.normal(size=(6, 300)) * 3
    settings = SamplingSettings(temperature=0.8, top_p=0.7)
    draws = gen.random((6, 1))
    by_rng = choose_tokens(logits, settings, np.random.default_rng(5))
    assert np.array_equal(by_rng, sample_rows(logits, 0.8, 0.7, np.random.default_rng(5).random((6, 1))))
    assert np.array_equal(choose_tokens(logits, settings, draws=draws), sample_rows(logits, 0.8, 0.7, draws))
    u = philox_uniform(np.arange(6, dtype=np.uint64), 3)
    assert np.array_equal(choose_tokens(logits, settings, draws=u), sample_rows(logits, 0.8, 0.7, u))
    with pytest.raises(ValueError):
        choose_tokens(logits, settings)
    # Greedy consumes no draw.
    rng = np.random.default_rng(1)
    assert np.array_equal(choose_tokens(logits, SamplingSettings(), rng), logits.argmax(-1))
    assert rng.random() == np.random.default_rng(1).random()


def test_per_row_settings_equal_one_call_per_row():
    gen = np.random.default_rng(2)
    logits = gen.normal(size=(5, 200)) * 2
    temps = np.array([0.0, 0.5, 1.0, 1.5, 0.7])
    tops = np.array([0.3, 1.0, 0.9, 0.5, 1.0])
    u = gen.random(5)
    got = sample_rows(logits, temps, tops, u)
    for b in range(5):
        one = choose_tokens(logits[b:b + 1], SamplingSettings(temperature=temps[b], top_p=tops[b]), draws=u[b:b + 1])
        assert got[b] == one[0]


def test_rule_details():
    # Greedy ties: the lowest index. Top-p ties: stable, lowest indices first.
    row = np.full((1, 10), -50.0)
    row[0, [7, 2, 5]] = 1.0
    assert sample_rows(row, 0.0, 1.0, 0.5)[0] == 2
    for u, want in ((1e-9, 2), (0.49, 2), (0.51, 5), (0.999, 5)):
        assert sample_rows(row, 1.0, 0.5, u)[0] == want  # mass before 2: 0, 5: 1/3 < 0.5, 7: 2/3 -> dropped
    # (u = 0 exactly, probability 2^-53, takes token 0 even without mass: the float64 rule's edge,
    # which the device, counting integer masses, does not share.)
    # The inverse CDF counts cumulative probabilities below u, clamped to V - 1.
    flat = np.zeros((1, 4))
    assert [int(sample_rows(flat, 1.0, 1.0, u)[0]) for u in (0.0, 0.25, 0.2500001, 0.999999, 1.0)] == [0, 0, 1, 3, 3]
