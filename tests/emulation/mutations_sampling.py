"""Injected bugs in the kernels of token sampling on the device (greedy, temperature, top-p): the harness must fail on each."""

from __future__ import annotations

from .build import Patch  # noqa: F401
from .mutations import Mutant

MUTANTS: tuple[Mutant, ...] = ()
