"""Medians, budgets and power-law fits of the timing harness, on synthetic timings."""

from __future__ import annotations

import math

import pytest

from dsa_export.bench.harness import fit_power_law, time_calls


class FakeClock:
    """A clock where call i of the timed function takes ``durations[i]`` seconds."""

    def __init__(self, durations):
        self.durations = list(durations)
        self.now = 0.0
        self.calls = 0

    def __call__(self):
        return self.now

    def work(self):
        self.now += self.durations[self.calls]
        self.calls += 1


def test_median_of_the_timed_calls_excludes_warmup():
    clock = FakeClock([100.0, 3.0, 1.0, 2.0, 50.0, 4.0])
    timing = time_calls(clock.work, warmup=1, repeats=5, budget_s=1e9, clock=clock)
    assert timing.seconds == [3.0, 1.0, 2.0, 50.0, 4.0]
    assert timing.median == 3.0 and timing.warmup == 1
    assert timing.to_dict() == {"median_s": 3.0, "min_s": 1.0, "max_s": 50.0, "repeats": 5, "warmup": 1}


def test_budget_stops_repeats_but_one_call_always_runs():
    clock = FakeClock([2.0, 2.0, 2.0, 2.0])
    assert time_calls(clock.work, warmup=0, repeats=4, budget_s=3.0, clock=clock).seconds == [2.0, 2.0]
    clock = FakeClock([30.0, 1.0])
    assert time_calls(clock.work, warmup=0, repeats=2, budget_s=1.0, clock=clock).seconds == [30.0]


def test_first_call_wraps_exactly_one_timed_call():
    clock = FakeClock([1.0, 2.0, 3.0])
    wrapped = []

    def first_call(thunk):
        wrapped.append(clock.calls)
        return thunk()

    timing = time_calls(clock.work, warmup=0, repeats=3, budget_s=1e9, first_call=first_call, clock=clock)
    assert wrapped == [0] and timing.seconds == [1.0, 2.0, 3.0] and clock.calls == 3


@pytest.mark.parametrize("exponent,coefficient", [(2.0, 3e-9), (1.0, 0.5), (1.37, 2.0), (0.0, 7.0)])
def test_fit_recovers_a_known_power_law(exponent, coefficient):
    lengths = [1024, 2048, 4096, 8192, 16384]
    fit = fit_power_law(lengths, [coefficient * n**exponent for n in lengths])
    assert fit is not None and fit.points == 5
    assert fit.exponent == pytest.approx(exponent, abs=1e-9)
    assert fit.coefficient == pytest.approx(coefficient, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.per_doubling == pytest.approx(2**exponent)


def test_fit_is_least_squares_on_logs():
    # log y = 2 log L + noise of +-0.1 alternating: the slope stays between the extremes.
    lengths = [2.0**i for i in range(10, 15)]
    noise = [0.1, -0.1, 0.1, -0.1, 0.1]
    fit = fit_power_law(lengths, [n**2 * math.exp(e) for n, e in zip(lengths, noise)])
    xs = [math.log(n) for n in lengths]
    ys = [2 * x + e for x, e in zip(xs, noise)]
    mx, my = sum(xs) / 5, sum(ys) / 5
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert fit.exponent == pytest.approx(slope) and 0.9 < fit.r2 < 1.0


def test_fit_needs_two_distinct_positive_lengths():
    assert fit_power_law([1024], [1.0]) is None
    assert fit_power_law([1024, 1024], [1.0, 2.0]) is None
    assert fit_power_law([1024, 2048], [0.0, 1.0]) is None
    assert fit_power_law([1024, 2048], [1.0, 4.0]).exponent == pytest.approx(2.0)
