"""Injected bugs in the kernels of the indexer + top-k over paged index-key caches (float pools and FP8 keys with one scale per token): the harness must fail on each."""

from __future__ import annotations

from .build import Patch  # noqa: F401
from .mutations import Mutant

MUTANTS: tuple[Mutant, ...] = ()
