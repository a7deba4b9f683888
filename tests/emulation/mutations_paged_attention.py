"""Injected bugs in the kernels of sparse attention over paged caches (float pools and FlashMLA's FP8 latent), split-KV decode: the harness must fail on each."""

from __future__ import annotations

from .build import Patch
from .mutations import SA, Mutant

MUTANTS: tuple[Mutant, ...] = (
    Mutant("pa-page-translation-off-by-one", "attention",
           (Patch(SA, "__ldg(p.blockTable + b * p.M + t / p.page);", "__ldg(p.blockTable + b * p.M + t / p.page + 1);"),),
           "a logical index is read from the next table entry's page: a wrong page (or past the row's table)"),
    Mutant("pa-logical-bound-off-by-one", "attention",
           (Patch(SA, "if (t < 0 || t >= p.M * p.page)", "if (t < 0 || t > p.M * p.page)"),),
           "an index equal to M*page is translated: the table entry one past the row's M entries is read"),
    Mutant("pa-combine-wrong-lse", "attention",
           (Patch(SA, "float const w = exp2f(p.partialLse[z * rows + row] - lseMax);",
                  "float const w = exp2f(p.partialLse[row] - lseMax);"),),
           "the combine weighs every split with the first split's log-sum-exp"),
    Mutant("pa-partial-lse-natural-log", "attention",
           (Patch(SA, "mRow[r] + log2f(total)", "mRow[r] + logf(total)"),),
           "the tensor-core kernel's partial log-sum-exp mixes log2 and natural units"),
    Mutant("pa-split-ranges-overlap", "attention",
           (Patch(SA, "int64_t const jEnd = min(p.K, jBegin + p.splitLen);",
                  "int64_t const jEnd = min(p.K, jBegin + p.splitLen + 1);", count=2),),
           "each split also takes the next split's first index: that key counts twice"),
    Mutant("pa-fp8-missing-barrier-after-dequantize", "attention",
           (Patch(SA, "sK + buf * BN * ldk, ldk);\n            __syncthreads();\n", "sK + buf * BN * ldk, ldk);\n"),),
           "warps run ldmatrix on K rows other warps have not dequantized yet"),
    Mutant("pa-fp8-scale-block-index", "attention",
           (Patch(SA, "p.Hkv * nScales + (cc * 8) / scaleBlock)", "p.Hkv * nScales + cc / scaleBlock)"),),
           "the dequantize takes the scale of the wrong channel block (index in 8-code chunks, not channels)"),
    Mutant("pa-fp8-generic-scale-block-index", "attention",
           (Patch(SA, "return __half2float(__half(h)) * p.kScale[slot * nScales + d / p.scaleBlock];",
                  "return __half2float(__half(h)) * p.kScale[slot * nScales + d % nScales];"),),
           "the generic kernel's FP8 decode takes the scale of the wrong channel block"),
    Mutant("pa-fp8-rope-offset", "attention",
           (Patch(SA, "mma::cpAsync16(kS + r * ldk + nC + cc * 8, src, t >= 0);",
                  "mma::cpAsync16(kS + r * ldk + nC - 8 + cc * 8, src, t >= 0);"),),
           "the RoPE channels land 8 columns early, over the dequantized latent"),
)
