"""Injected bugs in the kernels of the indexer + top-k over paged index-key caches (float pools and FP8 keys with one scale per token): the harness must fail on each."""

from __future__ import annotations

from .build import Patch
from .mutations import Mutant

IX = "dsaIndexerTopKPlugin/dsaIndexerTopKKernel.cu"

MUTANTS: tuple[Mutant, ...] = (
    Mutant("pix-page-translation-off-by-one", "paged-indexer",
           (Patch(IX, "return page >= 0 && page < p.P ? page * p.page + t % p.page : -1;",
                  "return page >= 0 && page < p.P ? page * p.page + (t + 1) % p.page : -1;"),),
           "logical key t reads the pool row of key t + 1 of its page (the last wraps to the page's first)"),
    Mutant("pix-invalid-entry-accepted", "paged-indexer",
           (Patch(IX, "    return page >= 0 && page < p.P;", "    return page < p.P;"),),
           "a negative table entry counts as a valid page: its keys are selectable"),
    Mutant("pix-fp8-scale-of-wrong-token", "paged-indexer",
           (Patch(IX, "sc1 = scale * sKs[buf * BN + nt * 8 + 2 * c + 1];", "sc1 = scale * sKs[buf * BN + nt * 8 + 2 * c];"),),
           "the odd key of each MMA column pair takes the scale of the even key before it"),
    Mutant("pix-histogram-merge-misses-a-block", "paged-indexer",
           (Patch(IX, "for (int64_t sp = 0; sp < nSplit; ++sp)", "for (int64_t sp = 1; sp < nSplit; ++sp)"),),
           "the multi-block top-k merges the splits' histograms without the first split's"),
    Mutant("pix-candidates-overflow-shared-buffer", "paged-indexer",
           (Patch(IX, "bool const staged = candCount <= mb.candCap;", "bool const staged = true;"),),
           "the boundary bin's candidates are staged in shared memory whatever their number"),
    Mutant("pix-merge-rank-dropped", "paged-indexer",
           (Patch(IX, "out[i + lowerBound(g2, candGt, v)] = v;", "out[i] = v;"),),
           "keys above the boundary bin are written without the candidates ranked before them"),
    Mutant("pix-fp8-mma-b-fragment-half-chunk", "paged-indexer",
           (Patch(IX, "((lane >> 3) & 1) * kVec;", "((lane >> 3) & 1) * 8;"),),
           "the e4m3 MMA's second B register (k 16..31) is loaded 8 bytes in instead of 16: a wrong fragment"),
    Mutant("pix-fp8-mma-q-scale-of-wrong-row", "paged-indexer",
           (Patch(IX, "acc[i][nt][2] *= sQs[r0 + 8];", "acc[i][nt][2] *= sQs[r0];"),),
           "rows 8-15 of an m-tile take the q scale of rows 0-7 for their even keys"),
)
