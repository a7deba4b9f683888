"""Philox4x32-10, the counter-based generator of the device sampler (``dsa_sample_tokens``), in NumPy.

Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11;
the generator of Random123, curand and torch's CUDA generator) maps a 128-bit counter and a 64-bit
key to 128 random bits. The sampler draws one uniform per row: key = the row's seed (low word,
high word), counter = (offset low, offset high, 0, 0) with the offset the row's decode step, and

    u53 = ((x1 << 32) | x0) >> 11,   u = u53 / 2**53 in [0, 1)

from the first two output words, so the draw of any (seed, step) is reproducible on the host, and
``choose_tokens(..., draws=philox_uniform(seeds, steps))`` repeats the device's choice in float64.
Vectorised over rows; exact (uint64 arithmetic on 32-bit words).
"""

from __future__ import annotations

import numpy as np

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_LO = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def philox4x32_10(counter, key) -> np.ndarray:
    """``[N, 4]`` uint32 outputs of Philox4x32-10 for ``[N, 4]`` counters and ``[N, 2]`` keys (uint32 words)."""
    ctr = np.asarray(counter, dtype=np.uint64).reshape(-1, 4) & _LO
    k = np.asarray(key, dtype=np.uint64).reshape(-1, 2) & _LO
    c0, c1, c2, c3 = (ctr[:, i].copy() for i in range(4))
    k0, k1 = k[:, 0].copy(), k[:, 1].copy()
    for _ in range(10):
        p0 = _M0 * c0  # < 2**64: both factors are below 2**32
        p1 = _M1 * c2
        c0, c1, c2, c3 = ((p1 >> _32) ^ c1 ^ k0, p1 & _LO, (p0 >> _32) ^ c3 ^ k1, p0 & _LO)
        k0 = (k0 + _W0) & _LO
        k1 = (k1 + _W1) & _LO
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def _words(values) -> tuple[np.ndarray, np.ndarray]:
    """Low and high 32-bit words of 64-bit integers (negative offsets as their two's complement)."""
    v = np.asarray(values)
    v = v.astype(np.int64).view(np.uint64) if v.dtype.kind == "i" else v.astype(np.uint64)
    return v & _LO, v >> _32


def philox_u53(seeds, offsets) -> np.ndarray:
    """``[N]`` uint64 draws u53 in [0, 2**53) for per-row seeds and offsets (broadcast to one shape)."""
    seeds, offsets = np.broadcast_arrays(np.asarray(seeds), np.asarray(offsets))
    s_lo, s_hi = _words(seeds.ravel())
    o_lo, o_hi = _words(offsets.ravel())
    zero = np.zeros_like(o_lo)
    x = philox4x32_10(np.stack([o_lo, o_hi, zero, zero], axis=-1), np.stack([s_lo, s_hi], axis=-1)).astype(np.uint64)
    return (((x[:, 1] << _32) | x[:, 0]) >> np.uint64(11)).reshape(seeds.shape)


def philox_uniform(seeds, offsets) -> np.ndarray:
    """``[N]`` float64 uniforms u = u53 / 2**53 in [0, 1) (exact), the device sampler's draws."""
    return philox_u53(seeds, offsets).astype(np.float64) * 2.0 ** -53
