"""The float64 check of the device sampler (dsa_sample_tokens), shared by the emulator cases
(tests/emulation/cases_sampling.py) and the GPU tests (test_sampling_gpu.py).

The rule is dsa_export.runtime.generate.sample_rows with the device's own draws (Philox4x32-10 of
each row's seed and offset, dsa_export.runtime.philox). Greedy rows must match exactly. A sampled
row must match exactly too, unless the float64 rule's draw u, or its top-p cut, lies within
SAMPLE_EPS of a cumulative boundary: the device computes exp((l - max) / T) in float32 (relative
error at most |x| * 2^-23 + 2 ulp of expf, |x| < 28 for any token with mass) and drops masses
below 2^-40 of the largest, so its cumulative probabilities are within a few 1e-6 of the float64
ones; then the token it chose must own an interval that contains u within SAMPLE_EPS, under a
nucleus that the float64 rule could also have cut within SAMPLE_EPS of top_p.
"""

from __future__ import annotations

import numpy as np
import torch

from dsa_export.runtime.generate import sample_rows
from dsa_export.runtime.philox import philox_uniform

#: How far from a cumulative boundary the float32 device and the float64 rule may disagree.
SAMPLE_EPS = 1e-5


def _tolerated(row: np.ndarray, temperature: float, top_p: float, u: float, token: int) -> bool:
    """Whether ``token`` is a float32 neighbour of the float64 rule's choice: u within SAMPLE_EPS of its
    interval, under a nucleus the float64 rule cuts within SAMPLE_EPS of top_p."""
    x = row / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    V = row.size
    order = np.argsort(-p, kind="stable")
    if top_p < 1:
        before = np.cumsum(p[order]) - p[order]
        lo = max(1, int((before < top_p - SAMPLE_EPS).sum()))
        hi = max(1, int((before < top_p + SAMPLE_EPS).sum()))
    else:
        lo = hi = V
    for n in range(lo, hi + 1):
        q = np.zeros(V)
        q[order[:n]] = p[order[:n]]
        q /= q.sum()
        cum = np.cumsum(q)
        start = cum[token - 1] if token > 0 else 0.0
        if q[token] > 0 and start - SAMPLE_EPS <= u <= cum[token] + SAMPLE_EPS:
            return True
    return False


def check_tokens(got: torch.Tensor, logits: torch.Tensor, temperature, top_p, seeds, offsets, *,
                 max_tolerated: int = 1, what: str = "") -> int:
    """Compare the device's ids with the float64 rule; returns the rows taken by the tolerance."""
    got = got.to(torch.int64).numpy()
    rows = logits.to(torch.float64).numpy()
    B = rows.shape[0]
    temps = np.broadcast_to(np.asarray(0.0 if temperature is None else temperature, dtype=np.float64), (B,))
    tops = np.broadcast_to(np.asarray(1.0 if top_p is None else top_p, dtype=np.float64), (B,))
    u = philox_uniform(np.asarray(0 if seeds is None else seeds, dtype=np.uint64),
                       np.asarray(0 if offsets is None else offsets, dtype=np.int64))
    u = np.broadcast_to(u, (B,))
    want = sample_rows(rows, temps, tops, u)
    assert got.shape == (B,), f"{what}shape {got.shape}"
    tolerated = 0
    for b in range(B):
        if got[b] == want[b]:
            continue
        greedy = not temps[b] > 0
        assert not greedy and 0 <= got[b] < rows.shape[1] and _tolerated(rows[b], temps[b], tops[b], u[b], got[b]), (
            f"{what}row {b}: device chose {got[b]}, the float64 rule {want[b]} (temperature {temps[b]}, "
            f"top_p {tops[b]}, u {u[b]!r})")
        tolerated += 1
    assert tolerated <= max_tolerated, f"{what}{tolerated} rows only within the boundary tolerance"
    return tolerated
