"""Injected bugs in the kernels of sparse attention over paged caches (float pools and FlashMLA's FP8 latent), split-KV decode: the harness must fail on each."""

from __future__ import annotations

from .build import Patch  # noqa: F401
from .mutations import Mutant

MUTANTS: tuple[Mutant, ...] = ()
