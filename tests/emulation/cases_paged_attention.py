"""Emulator cases of sparse attention over paged caches (float pools and FlashMLA's FP8 latent), split-KV decode.

Each case is a function of (kernels, seed), as in cases.py, checked against the float64 references.
"""

from __future__ import annotations

from .cases import Case

SMALL_CASES: list[Case] = []

#: DeepSeek-V3.2 widths (a command, not a CI test).
REAL_WIDTH_CASES: list[Case] = []
