"""Timing and fitting: warm-up, repeats within a budget, medians, and growth exponents in L."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class Timing:
    """Seconds of the timed calls of one case, and how many warm-up calls preceded them."""

    seconds: list[float] = field(default_factory=list)
    warmup: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def to_dict(self) -> dict:
        return {
            "median_s": self.median,
            "min_s": min(self.seconds),
            "max_s": max(self.seconds),
            "repeats": len(self.seconds),
            "warmup": self.warmup,
        }


def time_calls(
    fn: Callable[[], object],
    *,
    warmup: int,
    repeats: int,
    budget_s: float,
    first_call: Callable[[Callable[[], object]], object] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then up to ``repeats`` times timed.

    Timed calls stop early once they have used ``budget_s`` seconds (at least one always runs), so
    a case whose single call takes many seconds does not run for minutes; the report says how
    many ran. ``first_call`` wraps the first timed call (peak-memory measurement) without adding
    a call of its own: its bookkeeping happens outside the timed interval.
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1.")
    for _ in range(warmup):
        fn()
    timing = Timing(warmup=warmup)
    spent = 0.0
    for i in range(repeats):
        if i == 0 and first_call is not None:
            elapsed = first_call(lambda: _timed(fn, clock))
        else:
            elapsed = _timed(fn, clock)
        timing.seconds.append(float(elapsed))  # type: ignore[arg-type]
        spent += float(elapsed)  # type: ignore[arg-type]
        if spent >= budget_s:
            break
    return timing


def _timed(fn: Callable[[], object], clock: Callable[[], float]) -> float:
    start = clock()
    fn()
    return clock() - start


@dataclass(frozen=True)
class PowerFit:
    """``y = coefficient * L ** exponent`` fitted by least squares on log(y) against log(L)."""

    exponent: float
    coefficient: float
    r2: float
    points: int

    @property
    def per_doubling(self) -> float:
        """Growth factor of y when L doubles."""
        return 2.0**self.exponent

    def to_dict(self) -> dict:
        return {
            "exponent": self.exponent,
            "per_doubling": self.per_doubling,
            "coefficient": self.coefficient,
            "r2": self.r2,
            "points": self.points,
        }


def fit_power_law(lengths: Sequence[float], values: Sequence[float]) -> PowerFit | None:
    """Least-squares line through ``(log L, log y)``; None with fewer than two distinct positive points."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(lengths, values) if x > 0 and y > 0]
    if len({x for x, _ in pairs}) < 2:
        return None
    n = len(pairs)
    mean_x = sum(x for x, _ in pairs) / n
    mean_y = sum(y for _, y in pairs) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in pairs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in pairs)
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in pairs)
    ss_tot = sum((y - mean_y) ** 2 for _, y in pairs)
    # A flat curve (all log y equal up to rounding) is fitted exactly by slope 0.
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 1e-18 else 1.0
    return PowerFit(exponent=slope, coefficient=math.exp(intercept), r2=r2, points=n)
