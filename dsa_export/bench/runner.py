"""Run the benchmark: every (backend, variant, L) case, then ratios, fits, FLOPs, sparsity, CSR
storage and the seed claims."""

from __future__ import annotations

import datetime as _dt
import logging
import math
import statistics
from dataclasses import asdict
from typing import Callable

import dsa_export.bench.flops as _flops
from dsa_export import __version__
from dsa_export.bench.backends import BACKEND_TYPES, Backend, host_environment
from dsa_export.bench.claims import CLAIM_MEMORY_SEQ, claims
from dsa_export.bench.gemm import GEMM_ROWS
from dsa_export.bench.harness import fit_power_law, time_calls
from dsa_export.bench.selection import csr_figures, measured_sparsity
from dsa_export.bench.settings import SELECTION_VARIANTS, BenchSettings

log = logging.getLogger(__name__)

SCHEMA = "dsa-export-bench/1"
__all__ = ["CLAIM_MEMORY_SEQ", "claims", "exponents", "over_budget", "ratios", "run_bench"]


def run_bench(settings: BenchSettings, progress: Callable[[str], None] | None = None) -> dict:
    """Time every case and return the report (see docs/bench.md for its keys)."""
    say = progress or (lambda _msg: None)
    started = _dt.datetime.now(_dt.timezone.utc)
    environment = {"dsa_export": __version__, **host_environment()}
    backends: list[Backend] = []
    for name in settings.backends:  # a backend that cannot run here fails before any work
        BACKEND_TYPES[name].check_available()
    try:
        for name in settings.backends:
            say(f"preparing {name}")
            backends.append(BACKEND_TYPES[name](settings))
        gemm: dict[str, dict[str, float]] = {}
        for backend in backends:
            rate = backend.gemm_gflops()
            if rate is not None:
                gemm[backend.name] = {"start": rate}
                say(f"{backend.name:<11} GEMM {rate:.1f} GFLOP/s (float32 {GEMM_ROWS}x{settings.block.hidden}"
                    f"x{settings.block.hidden})")
        cases: list[dict] = []
        sparsity_measured: dict[tuple[str, int], float] = {}
        memory_methods = {}
        for backend in backends:
            memory_methods[backend.name] = backend.memory_method
            for variant in settings.variants:
                measured: list[tuple[int, float]] = []
                warmup = settings.warmup
                for seq_len in settings.seq_lens:
                    case = {"backend": backend.name, "variant": variant, "seq_len": seq_len}
                    reason = backend.skip_reason(variant, seq_len)
                    if reason is None:
                        reason = over_budget(measured, seq_len, settings.time_budget_s)
                    if reason is not None:
                        case["skipped"] = reason
                        cases.append(case)
                        say(f"{backend.name:<11} {variant:<5} L={seq_len:<6} {reason}")
                        continue
                    case.update(_run_case(backend, variant, seq_len, settings, warmup))
                    if case["min_s"] > settings.warmup_below_s:
                        warmup = 0
                    if variant in SELECTION_VARIANTS and (variant, seq_len) not in sparsity_measured:
                        sparsity = measured_sparsity(variant, backend.selected_indices(variant), seq_len,
                                                     settings.block)
                        if sparsity is not None:
                            sparsity_measured[(variant, seq_len)] = sparsity
                    agreement = backend.agreement(variant, seq_len)
                    if agreement is not None:
                        case["agreement"] = agreement
                    case["gflops"] = achieved_gflops(settings.block, case, sparsity_measured.get((variant, seq_len)))
                    cases.append(case)
                    measured.append((seq_len, case["min_s"]))
                    peak = case.get("peak_bytes")
                    say(f"{backend.name:<11} {variant:<5} L={seq_len:<6} {case['median_s'] * 1e3:10.1f} ms"
                        + (f"  {peak / 2**20:8.1f} MiB" if peak is not None else "")
                        + f"  ({case['repeats']} timed, {case['warmup']} warm-up)"
                        + (f"  max |diff| vs torch {agreement['max_abs_diff']:.1e}" if agreement else ""))
        for backend in backends:
            if backend.name in gemm:
                gemm[backend.name]["end"] = backend.gemm_gflops()
            environment.update(backend.environment())
        environment["gemm_gflops"] = gemm
        storage = _csr_storage(settings, say)
    finally:
        for backend in backends:
            backend.close()
    environment["load_average_after"] = host_environment()["load_average_1_5_15"]
    report = {
        "schema": SCHEMA,
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round((_dt.datetime.now(_dt.timezone.utc) - started).total_seconds(), 1),
        "environment": environment,
        "config": asdict(settings.block),
        "settings": {
            "seq_lens": list(settings.seq_lens),
            "backends": list(settings.backends),
            "variants": list(settings.variants),
            "warmup": settings.warmup,
            "warmup_below_s": settings.warmup_below_s,
            "repeats": settings.repeats,
            "case_budget_s": settings.case_budget_s,
            "time_budget_s": settings.time_budget_s,
            "max_onnxruntime_seq": settings.max_onnxruntime_seq,
            "memory": settings.memory,
            "memory_method": memory_methods,
        },
        "cases": cases,
    }
    report["ratios"] = ratios(cases)
    report["exponents"] = exponents(cases)
    report["flops"] = [_flops.layer_flops(settings.block, n).to_dict() for n in settings.seq_lens]
    report["sparsity"] = sparsity_rows(settings, sparsity_measured)
    report["csr_storage"] = storage
    report["claims"] = claims(report, settings)
    report["notes"] = [case["skipped"] for case in cases if "skipped" in case]
    return report


#: Growth exponent assumed for a curve's next call when only one of its lengths has run (the
#: dense layer's attention is quadratic; the others grow slower, so this errs on the long side).
ASSUMED_EXPONENT = 2.0


def over_budget(measured: list[tuple[int, float]], seq_len: int, budget_s: float) -> str | None:
    """Why a curve's call at ``seq_len`` is skipped: its predicted time exceeds the budget.

    The prediction extends the curve's last measured call with the growth of its last two points
    (clamped to L^1..L^2.5; :data:`ASSUMED_EXPONENT` with one point). A call that already took
    longer than the budget stops the curve as well.
    """
    if not measured:
        return None
    last_len, last_s = measured[-1]
    if last_s > budget_s:
        return f"skipped: one call at L={last_len} took {last_s:.0f} s, longer than the {budget_s:g} s time budget"
    exponent = ASSUMED_EXPONENT
    if len(measured) >= 2:
        (l0, t0), (l1, t1) = measured[-2], measured[-1]
        if t0 > 0 and t1 > 0 and l1 > l0:
            exponent = min(2.5, max(1.0, math.log(t1 / t0) / math.log(l1 / l0)))
    predicted = last_s * (seq_len / last_len) ** exponent
    if predicted > budget_s:
        return (f"skipped: one call predicted at {predicted:.0f} s ({last_s:.1f} s at L={last_len}, growing as "
                f"L^{exponent:.2f}), over the {budget_s:g} s time budget (--time-budget)")
    return None


def sparsity_rows(settings: BenchSettings, measured: dict[tuple[str, int], float]) -> list[dict]:
    """Per selection variant and L: the analytic sparsity (dsa, block: fixed by K or Kb) and the
    measured one (from the selection of a timed call; None where no backend returned it)."""
    cfg, rows = settings.block, []
    for variant in (v for v in settings.variants if v in SELECTION_VARIANTS):
        for n in settings.seq_lens:
            analytic = {"dsa": _flops.sparsity(n, cfg.topk),
                        "block": _flops.block_sparsity(n, cfg.block_size, cfg.blocks_per_query_block)}.get(variant)
            rows.append({"variant": variant, "seq_len": n, "analytic": analytic, "measured": measured.get((variant, n))})
    return rows


def _csr_storage(settings: BenchSettings, say: Callable[[str], None]) -> list[dict]:
    """CSR storage of the block layer's selections at every L (torch, after the timed cases)."""
    if "block" not in settings.variants:
        return []
    from dsa_export.bench.block import make_blocks, make_input

    block = make_blocks(settings.block, ("block",))["block"]
    rows = []
    for n in settings.seq_lens:
        for row in csr_figures(block, make_input(settings.block, n)):
            rows.append(row)
            say(f"csr storage L={n:<6} {row['block_size']}x{row['block_size']} blocks, {row['blocks_per_query_block']} "
                f"per query block: CSR {row['csr_bytes']} B (int32) vs dense block mask {row['dense_block_bytes']} B "
                f"({row['saving_vs_dense_block']:.2f}x less), density {100 * row['density']:.1f}%")
    return rows


def achieved_gflops(cfg, case: dict, sparsity: float | None = None) -> dict[str, float]:
    """GFLOP/s of the layer and of its timed parts, from the counted FLOPs and median times (the
    LSH layer's attention FLOPs from its measured ``sparsity``; without it, no layer rate)."""
    counts = _flops.layer_flops(cfg, case["seq_len"])
    lsh_attention = None
    if case["variant"] == "lsh" and sparsity is not None:
        lsh_attention = round(4 * cfg.batch * cfg.heads * cfg.head_dim * (1.0 - sparsity)
                              * _flops.causal_pairs(case["seq_len"]))
    total = counts.total(case["variant"])
    if total is None and lsh_attention is not None:
        total = counts.projections + lsh_attention
    result = {"layer": total / case["median_s"] / 1e9} if total is not None else {}
    part_flops = {"indexer": counts.indexer_scores, "dense_attention": counts.dense_attention,
                  "block_sparse_attention": counts.block_attention,
                  "sparse_attention": lsh_attention if case["variant"] == "lsh" else counts.sparse_attention}
    for part, seconds in case.get("parts_median_s", {}).items():
        if part_flops.get(part) is not None and seconds > 0:
            result[part] = part_flops[part] / seconds / 1e9
    return result


def _run_case(backend: Backend, variant: str, seq_len: int, settings: BenchSettings, warmup: int) -> dict:
    fn = backend.call(variant, seq_len)
    backend.part_seconds.clear()
    peak: dict[str, int | None] = {}

    def first_call(thunk: Callable[[], float]) -> float:
        elapsed, peak["bytes"] = backend.measure_peak(thunk)
        return elapsed

    timing = time_calls(
        fn, warmup=warmup, repeats=settings.repeats, budget_s=settings.case_budget_s,
        first_call=first_call if settings.memory else None,
    )
    result = timing.to_dict()
    # Parts of the timed calls only (the warm-up calls come first in each list).
    parts = {name: statistics.median(values[-len(timing.seconds):])
             for name, values in backend.part_seconds.items() if len(values) >= len(timing.seconds)}
    if parts:
        result["parts_median_s"] = parts
    if settings.memory:
        result["peak_bytes"] = peak.get("bytes")
    return result


def _index(cases: list[dict]) -> dict[tuple[str, str, int], dict]:
    return {(c["backend"], c["variant"], c["seq_len"]): c for c in cases if "skipped" not in c}


def ratios(cases: list[dict]) -> list[dict]:
    """Per backend and L where dense ran: dense time over each other variant's time (> 1: that
    variant is faster; ``dense_over_<variant>_time``) and its memory over dense's
    (``<variant>_over_dense_memory``)."""
    done = _index(cases)
    rows = []
    for (backend, variant, seq_len), dense in sorted(done.items()):
        if variant != "dense":
            continue
        row: dict = {"backend": backend, "seq_len": seq_len}
        for other in ("dsa", "block", "lsh"):
            case = done.get((backend, other, seq_len))
            if case is None:
                continue
            row[f"dense_over_{other}_time"] = dense["median_s"] / case["median_s"]
            if case.get("peak_bytes") and dense.get("peak_bytes"):
                row[f"{other}_over_dense_memory"] = case["peak_bytes"] / dense["peak_bytes"]
        if len(row) > 2:
            rows.append(row)
    return rows


def exponents(cases: list[dict]) -> dict[str, dict]:
    """Fitted growth exponent in L of every curve's median time (``time``) and peak memory (``memory``)."""
    curves: dict[str, list[dict]] = {}
    for case in cases:
        if "skipped" not in case:
            curves.setdefault(f"{case['backend']}/{case['variant']}", []).append(case)
    result = {}
    for name, points in curves.items():
        entry = {}
        fit = fit_power_law([p["seq_len"] for p in points], [p["median_s"] for p in points])
        if fit is not None:
            entry["time"] = fit.to_dict()
        mem = [(p["seq_len"], p["peak_bytes"]) for p in points if p.get("peak_bytes")]
        fit = fit_power_law([m[0] for m in mem], [m[1] for m in mem]) if mem else None
        if fit is not None:
            entry["memory"] = fit.to_dict()
        if entry:
            result[name] = entry
        # The timed parts of the curve (indexer, sparse attention, dense attention) as curves of their own.
        parts = sorted({part for p in points for part in p.get("parts_median_s", {})})
        for part in parts:
            timed = [(p["seq_len"], p["parts_median_s"][part]) for p in points if p.get("parts_median_s", {}).get(part)]
            fit = fit_power_law([t[0] for t in timed], [t[1] for t in timed]) if len(timed) >= 2 else None
            if fit is not None:
                result[f"{name}/{part}"] = {"time": fit.to_dict()}
    return result
