"""What every emulator case module shares: the Case record, seeded inputs and the attention
tolerance check (the GPU tests' bounds), so that the family modules (cases_*.py) and cases.py
import them from here and cases.py can list every family's cases without an import cycle."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tests.plugins.test_kernels_gpu import ATTN_TOL


@dataclass(frozen=True)
class Case:
    name: str
    kernel: str  # indexer | attention | block-sparse | moe | sampling | cache-write
    run: Callable[..., None] = field(repr=False)
    device: str = "sm90"
    #: schedule names to run under (None: every schedule); cases that check decisions, not races
    schedules: tuple[str, ...] | None = None

    def seed(self, schedule_seed: int) -> int:
        return zlib.crc32(self.name.encode()) ^ schedule_seed


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(dtype)


def kl_schedule_other(kl):
    from .harness import Schedule

    return Schedule("scrambled", "issue", resident_ctas=4, yield_probability=0.5)


def _assert_close_attention(got, want, dtype, what=""):
    tol = ATTN_TOL[dtype]
    err = (got.double() - want).abs().max().item() if want.numel() else 0.0
    bound = tol * max(want.abs().max().item() if want.numel() else 0.0, 1e-3)
    assert math.isfinite(err) and err <= bound, f"{what}max abs error {err:.3e} > {bound:.3e}"
