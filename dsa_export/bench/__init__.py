"""The benchmark stage: one DSA attention layer against the same layer with dense causal attention,
block-sparse attention and LSH bucketed attention, across sequence lengths and runtimes, with
medians, peak memory, growth exponents, FLOP counts, sparsity, the CSR storage of block masks,
plots and the seed documents' claims next to the measurements (docs/bench.md)."""

from dsa_export.bench.flops import FlopCount, layer_flops, sparsity
from dsa_export.bench.harness import PowerFit, Timing, fit_power_law, time_calls
from dsa_export.bench.runner import run_bench
from dsa_export.bench.settings import BACKENDS, BenchSettings, BlockConfig

__all__ = [
    "BACKENDS", "BenchSettings", "BlockConfig", "FlopCount", "PowerFit", "Timing", "fit_power_law",
    "layer_flops", "run_bench", "sparsity", "time_calls",
]
