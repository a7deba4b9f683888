"""Injected bugs in the paged cache write (DSAPagedCacheWrite): the harness must fail on each."""

from __future__ import annotations

from .build import Patch
from .mutations import Mutant

PCW = "dsaPagedCacheWritePlugin/dsaPagedCacheWriteKernel.cu"

MUTANTS: tuple[Mutant, ...] = (
    Mutant("pcw-offset-bound-off-by-one", "cache-write",
           (Patch(PCW, "offset < 0 || offset >= p.page)", "offset < 0 || offset > p.page)"),),
           "an offset equal to the page size is written: slot 0 of the next page, or past the pool's end"),
    Mutant("pcw-tail-skipped", "cache-write",
           (Patch(PCW, "    copyElements(dst + done, src + done, p.W - done, lane); // the tail\n", ""),),
           "rows that take the 16-byte body leave their last elements (a row not a multiple of 16 bytes) unwritten"),
    Mutant("pcw-bounds-check-removed", "cache-write",
           (Patch(PCW, "if (page < 0 || page >= p.P || offset < 0 || offset >= p.page)", "if (false)"),),
           "out-of-range (page, offset) pairs are written: outside the pool"),
    Mutant("pcw-index-truncated-to-32-bits", "cache-write",
           (Patch(PCW, "int64_t const page = __ldg(p.indices + 2 * row);",
                  "int64_t const page = static_cast<int32_t>(__ldg(p.indices + 2 * row));"),),
           "a page index read as 32 bits: 2^32 + 1 becomes page 1 and overwrites a slot"),
)
