"""Injected bugs: each is a small patch of a kernel source that a GPU would run wrongly (or racily),
and the harness must fail on every one of them (``python -m tests.emulation --mutations``). A
mutant that passes means the harness has a blind spot.

The bugs are of the kinds a review found the harness must catch: missing barriers, off-by-one
bounds, a pipeline wait one stage short, a commit left out, a top-k overrun, a wrong MMA sub-tile
or fragment (transposed load), a wrong block-scale index, a missing zero-fill.
"""

from __future__ import annotations

from dataclasses import dataclass

from .build import Patch

SA = "dsaSparseAttentionPlugin/dsaSparseAttentionKernel.cu"
IX = "dsaIndexerTopKPlugin/dsaIndexerTopKKernel.cu"
BS = "dsaBlockSparseAttentionPlugin/dsaBlockSparseAttentionKernel.cu"
MOE_GEMM = "dsaMoEExpertsPlugin/dsaMoEExpertsGemm.cu"
MOE_ROUTE = "dsaMoEExpertsPlugin/dsaMoEExpertsRouting.cu"


@dataclass(frozen=True)
class Mutant:
    name: str
    kernel: str  #: the case family (cases.Case.kernel) whose cases must catch it
    patches: tuple[Patch, ...]
    why: str


MUTANTS: tuple[Mutant, ...] = (
    Mutant("sa-missing-barrier-after-wait", "attention",
           (Patch(SA, "            mma::cpAsyncWait<0>();\n        }\n        __syncthreads();\n",
                  "            mma::cpAsyncWait<0>();\n        }\n"),),
           "threads read K tiles other threads' copies have not landed yet"),
    Mutant("sa-wait-one-stage-short", "attention",
           (Patch(SA, "mma::cpAsyncWait<1>();", "mma::cpAsyncWait<2>();"),),
           "the double-buffered pipeline reads the current tile while its group is still in flight"),
    Mutant("sa-commit-left-out", "attention",
           (Patch(SA, "            loadTile(tile + 1, buf ^ 1);\n            mma::cpAsyncCommit();\n",
                  "            loadTile(tile + 1, buf ^ 1);\n"),),
           "without the commit, wait_group<1> keeps the current tile's group in flight"),
    Mutant("sa-index-bound-off-by-one", "attention",
           (Patch(SA, "idxS[r] = (t >= 0 && t < p.T) ? t : -1;", "idxS[r] = (t >= 0 && t <= p.T) ? t : -1;"),),
           "an index equal to T is gathered: a read one row past the keys"),
    Mutant("sa-missing-barrier-before-refill", "attention",
           (Patch(SA, "            idxS[r] = (t >= 0 && t < p.T) ? t : -1;\n        }\n        __syncthreads();\n",
                  "            idxS[r] = (t >= 0 && t < p.T) ? t : -1;\n        }\n"),),
           "the K/V copies read a tile's indices from shared memory before the threads that load them have "
           "written them, and a fast warp refills a tile buffer while slower warps still read it"),
    Mutant("sa-wrong-mma-subtile", "attention",
           (Patch(SA, "mma::mma16816<T>(sacc[1], a, bf[2], bf[3]);", "mma::mma16816<T>(sacc[1], a, bf[0], bf[1]);"),),
           "the second 8 keys of a 16-key tile reuse the first 8 keys' B fragment"),
    Mutant("sa-value-load-not-transposed", "attention",
           (Patch(SA, "mma::ldmatrixX4Trans(bf, vRow + kk * ldv + nt * 8);", "mma::ldmatrixX4(bf, vRow + kk * ldv + nt * 8);"),),
           "P @ V takes V's fragment without .trans: a wrong MMA fragment layout"),
    Mutant("ix-topk-overrun", "indexer",
           (Patch(IX, "if (rank < needEq)", "if (rank <= needEq)"),),
           "one tied key too many is written: past the row's topk slots"),
    Mutant("ix-missing-barrier-after-histogram", "indexer",
           (Patch(IX, "                atomicAdd(sHist + bin, static_cast<uint32_t>(__popc(peers)));\n            }\n        }\n        __syncthreads();\n",
                  "                atomicAdd(sHist + bin, static_cast<uint32_t>(__popc(peers)));\n            }\n        }\n"),),
           "warp 0 scans the histogram before the other warps have added to it"),
    Mutant("ix-scan-missing-shuffle-stage", "indexer",
           (Patch(IX, "for (int off = 1; off < 32; off <<= 1)", "for (int off = 1; off < 16; off <<= 1)"),),
           "the histogram's warp prefix scan stops one __shfl_up_sync stage short: lanes 16-31 (bins 127..0) "
           "miss the keys counted by lanes 0-15, so the k-th key's bin is misplaced"),
    Mutant("ix-scan-inclusive-for-exclusive", "indexer",
           (Patch(IX, "uint32_t above = inclusive - laneTotal;", "uint32_t above = inclusive;"),),
           "each lane takes the keys of its own 8 bins as keys above them: the k-th key's bin is misplaced"),
    Mutant("bs-missing-barrier-after-wait", "block-sparse",
           (Patch(BS, "            mma::cpAsyncWait<0>();\n        }\n        __syncthreads();\n",
                  "            mma::cpAsyncWait<0>();\n        }\n"),),
           "threads read K/V tiles other threads' copies have not landed yet"),
    Mutant("moe-pipeline-wait-one-stage-short", "moe",
           (Patch(MOE_GEMM, "mma::cpAsyncWait<kSTAGES - 2>();", "mma::cpAsyncWait<kSTAGES - 1>();"),),
           "the multi-stage GEMM pipeline computes on a stage whose copies are still in flight"),
    Mutant("moe-histogram-not-zeroed", "moe",
           (Patch(MOE_ROUTE, "        sHist[e] = 0;\n    }\n    __syncthreads();\n    int64_t const begin",
                  "        sHist[e] = 0;\n    }\n    int64_t const begin"),),
           "some threads count experts before others have cleared the histogram"),
)

# Kernel families added since ABI 5 keep their injected bugs in their own modules.
from . import (  # noqa: E402
    mutations_paged_attention,
    mutations_paged_cache_write,
    mutations_paged_indexer,
    mutations_sampling,
)

MUTANTS = (MUTANTS + mutations_paged_attention.MUTANTS + mutations_paged_indexer.MUTANTS + mutations_sampling.MUTANTS
           + mutations_paged_cache_write.MUTANTS)

MUTANTS_BY_NAME = {m.name: m for m in MUTANTS}
assert len(MUTANTS_BY_NAME) == len(MUTANTS), "two injected bugs share a name"
