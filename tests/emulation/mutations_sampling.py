"""Injected bugs in the kernels of token sampling on the device (greedy, temperature, top-p): the harness must fail on each."""

from __future__ import annotations

from .build import Patch
from .mutations import Mutant

SAMP = "dsaSampling/dsaSamplingKernel.cu"

MUTANTS: tuple[Mutant, ...] = (
    Mutant("samp-missing-barrier-after-argmax-reduction", "sampling",
           (Patch(SAMP, "    __syncthreads(); // the warps' partial results are in shared memory\n    if (warp == 0)\n",
                  "    if (warp == 0)\n"),),
           "warp 0 reduces the warps' arg max partials before the other warps have written them"),
    Mutant("samp-ties-to-higher-index", "sampling",
           (Patch(SAMP, "return v1 > v2 || (v1 == v2 && i1 < i2);", "return v1 > v2 || (v1 == v2 && i1 > i2);"),),
           "greedy ties go to the highest index (numpy's arg max and a stable sort take the lowest)"),
    Mutant("samp-prefix-sum-off-by-one", "sampling",
           (Patch(SAMP, "massBase + massBefore + (inclusive - m) + tiesKeptBefore * wStar",
                  "massBase + massBefore + inclusive + tiesKeptBefore * wStar"),),
           "the inverse CDF takes the inclusive prefix for the exclusive one: each token's interval is "
           "shifted by its own mass"),
    Mutant("samp-missing-barrier-after-histogram", "sampling",
           (Patch(SAMP, "            __syncthreads(); // the histogram is complete\n", ""),),
           "warp 0 scans the top-p mass histogram before the other warps have added to it"),
    Mutant("samp-scan-missing-shuffle-stage", "sampling",
           (Patch(SAMP, "for (int off = 1; off < 32; off <<= 1)", "for (int off = 1; off < 16; off <<= 1)", count=2),),
           "the warp prefix scans (top-p bins and the inverse CDF) stop one __shfl_up_sync stage short"),
    Mutant("samp-philox-round-short", "sampling",
           (Patch(SAMP, "for (int r = 0; r < 10; ++r)", "for (int r = 0; r < 9; ++r)"),),
           "Philox4x32-9 instead of -10: the device's draws no longer equal the host's"),
)
