"""Human-readable tables of a benchmark report."""

from __future__ import annotations


def _ms(case: dict | None) -> str:
    if case is None:
        return "-"
    if "skipped" in case:
        return "skipped"
    return f"{case['median_s'] * 1e3:.1f}"


def _mib(case: dict | None) -> str:
    if case is None or "skipped" in case or case.get("peak_bytes") is None:
        return "-"
    return f"{case['peak_bytes'] / 2**20:.0f}"


def _saving(fraction: float) -> str:
    return f"{100 * fraction:.0f}% less" if fraction >= 0 else f"{-100 * fraction:.0f}% more"


def results_rows(report: dict) -> list[list[str]]:
    """One row per (backend, L): times, ratio, memory, memory ratio."""
    cases = {(c["backend"], c["variant"], c["seq_len"]): c for c in report["cases"]}
    ratios = {(r["backend"], r["seq_len"]): r for r in report["ratios"]}
    rows = []
    for backend in report["settings"]["backends"]:
        for seq_len in report["settings"]["seq_lens"]:
            dsa, dense = cases.get((backend, "dsa", seq_len)), cases.get((backend, "dense", seq_len))
            ratio = ratios.get((backend, seq_len), {})
            rows.append([
                backend, str(seq_len), _ms(dsa), _ms(dense),
                f"{ratio['dense_over_dsa_time']:.2f}" if "dense_over_dsa_time" in ratio else "-",
                _mib(dsa), _mib(dense),
                f"{ratio['dsa_over_dense_memory']:.2f}" if "dsa_over_dense_memory" in ratio else "-",
            ])
    return rows


RESULT_HEADER = ["backend", "L", "DSA ms", "dense ms", "dense/DSA time", "DSA MiB", "dense MiB", "DSA/dense mem"]


def format_table(header: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def render(report: dict, markdown: bool = False) -> str:
    """Results, growth exponents, FLOP split and claims as text (or Markdown tables)."""
    cfg = report["config"]
    out = [
        f"Layer: hidden {cfg['hidden']}, {cfg['heads']} heads x {cfg['head_dim']} ({cfg['kv_heads']} kv head(s)), "
        f"indexer {cfg['index_heads']} x {cfg['index_head_dim']}, top-k {cfg['topk']}, batch {cfg['batch']}.",
        "",
        format_table(RESULT_HEADER, results_rows(report), markdown),
        "",
    ]
    exp_rows = []
    for name, entry in report["exponents"].items():
        t, m = entry.get("time"), entry.get("memory")
        exp_rows.append([
            name,
            f"{t['exponent']:.2f}" if t else "-", f"{t['per_doubling']:.2f}" if t else "-",
            f"{m['exponent']:.2f}" if m else "-",
        ])
    out += [format_table(["curve", "time exponent", "time x per doubling", "memory exponent"], exp_rows, markdown), ""]
    flops = {f["seq_len"]: f for f in report["flops"]}
    split_rows = []
    for case in report["cases"]:
        parts = case.get("parts_median_s")
        if not parts or case["variant"] != "dsa":
            continue
        indexer, attention = parts.get("indexer", 0.0), parts.get("sparse_attention", 0.0)
        split_rows.append([
            case["backend"], str(case["seq_len"]), f"{indexer * 1e3:.1f}", f"{attention * 1e3:.1f}",
            f"{max(0.0, case['median_s'] - indexer - attention) * 1e3:.1f}",
            f"{100 * indexer / (indexer + attention):.0f}%" if indexer + attention > 0 else "-",
            f"{100 * flops[case['seq_len']]['indexer_share']:.0f}%",
        ])
    if split_rows:
        out += [format_table(["backend", "L", "indexer+top-k ms", "sparse attn ms", "rest ms",
                              "indexer share of time", "indexer share of FLOPs"], split_rows, markdown), ""]
    out += _gflops_section(report, markdown)
    agreement_rows = []
    for case in report["cases"]:
        a = case.get("agreement")
        if not a:
            continue
        same = a.get("max_abs_diff_same_selection")
        agreement_rows.append([
            case["backend"], case["variant"], str(case["seq_len"]), f"{a['max_abs_diff']:.1e}",
            f"{a['max_abs_reference']:.2f}",
            (f"{a['selection_differs']} of {a['queries']}"
             + (f" ({a['near_tie_rows']} near ties)" if "near_tie_rows" in a else "")) if "queries" in a else "-",
            f"{same:.1e}" if same is not None else "-", f"{a['cosine']:.9f}",
        ])
    if agreement_rows:
        out += [format_table(["backend", "variant", "L", "max abs diff vs torch", "max abs torch",
                              "queries selecting other keys", "max abs diff (same keys)", "cosine"],
                             agreement_rows, markdown), ""]
    sparsity = {s["seq_len"]: s for s in report["sparsity"]}
    flop_rows = []
    for f in report["flops"]:
        s = sparsity[f["seq_len"]]
        flop_rows.append([
            str(f["seq_len"]), f"{f['indexer'] / 1e9:.1f}", f"{f['sparse_attention'] / 1e9:.1f}",
            f"{f['dense_attention'] / 1e9:.1f}", f"{f['projections'] / 1e9:.1f}", f"{100 * f['indexer_share']:.0f}%",
            f"{f['dense_over_dsa']:.2f}", f"{100 * s['analytic']:.1f}%",
            f"{100 * s['measured']:.1f}%" if s["measured"] is not None else "-",
        ])
    out += [format_table(
        ["L", "indexer GFLOP", "sparse attn GFLOP", "dense attn GFLOP", "projections GFLOP", "indexer share",
         "dense/DSA FLOPs", "sparsity", "measured"], flop_rows, markdown), ""]
    claim_rows = []
    for claim in report["claims"]:
        if claim["claim"].startswith("85-90%"):
            values = ", ".join(
                f"L={m['seq_len']}: {100 * (m['measured'] if m['measured'] is not None else m['analytic']):.1f}%"
                for m in claim["measured"])
        else:
            values = ", ".join(f"{m['backend']} L={m['seq_len']}: "
                               + (f"{m['value']:.2f}x (FLOPs {m['flop_ratio']:.2f}x)" if "faster" in claim["claim"]
                                  else _saving(m["value"]))
                               for m in claim["measured"]) or "not measured"
        claim_rows.append([claim["claim"], values, "yes" if claim["agrees"] else "no"])
    out.append(format_table(["seed claim", "measured here", "agrees"], claim_rows, markdown))
    for claim in report["claims"]:
        if claim.get("note"):
            out.append(f"  {claim['claim']}: {claim['note']}")
    for note in dict.fromkeys(report["notes"]):
        out.append(f"note: {note}")
    return "\n".join(out)


_PARTS = (("layer", "layer"), ("indexer", "indexer+top-k"), ("sparse_attention", "sparse attn"),
          ("dense_attention", "dense attn"))


def _gflops_section(report: dict, markdown: bool) -> list[str]:
    """Achieved GFLOP/s of each layer and timed part, next to the run's measured GEMM rate."""
    gemm = report["environment"].get("gemm_gflops", {})
    rows = []
    for case in report["cases"]:
        rates = case.get("gflops")
        if not rates:
            continue
        limit = gemm.get(case["backend"], {})
        reference = max(limit.values()) if limit else None
        cells = [case["backend"], case["variant"], str(case["seq_len"])]
        for key, _ in _PARTS:
            value = rates.get(key)
            cells.append("-" if value is None else f"{value:.1f}" + (f" ({100 * value / reference:.0f}%)"
                                                                      if reference else ""))
        rows.append(cells)
    if not rows:
        return []
    lines = [format_table(["backend", "variant", "L", *(f"{label} GFLOP/s" for _, label in _PARTS)], rows,
                          markdown)]
    if gemm:
        lines.append("GEMM rate of this run (float32 2048 x hidden x hidden, best of 5, at the start and end): "
                     + "; ".join(f"{backend} " + ", ".join(f"{value:.1f}" for value in rate.values() if value is not None)
                                 + " GFLOP/s" for backend, rate in gemm.items())
                     + ". Percentages are of the higher one of each backend; FLOPs as counted below (indexer+top-k: "
                       "the causal index scores only).")
    return [*lines, ""]


def environment_lines(report: dict) -> list[str]:
    """Where and when the numbers were taken: date, machine, load, versions (GPU, driver, CUDA on GPUs)."""
    env = report["environment"]
    lines = [f"- date: {report['date']} (run took {report['duration_s']:.0f} s)"]
    if env.get("gpu"):
        lines.append(f"- GPU: {env['gpu']} (compute capability {env.get('compute_capability')}), "
                     f"driver {env.get('driver') or 'unknown'}, CUDA {env.get('cuda')}")
    lines.append(f"- CPU: {env.get('cpu')}, {env.get('cpu_count')} cores visible, "
                 f"load average (1/5/15 min) {env.get('load_average_1_5_15')} before, "
                 f"{env.get('load_average_after')} after")
    versions = [f"{k} {env[k]}" for k in ("dsa_export", "torch", "transformers", "onnxruntime", "python") if env.get(k)]
    threads = [f"{k.split('_')[0]} {env[k]}" for k in ("torch_threads", "onnxruntime_threads") if env.get(k)]
    lines.append("- versions: " + ", ".join(versions) + (f"; threads: {', '.join(threads)}" if threads else ""))
    if env.get("threading_env"):
        lines.append("- threading environment: " + ", ".join(f"{k}={v}" for k, v in env["threading_env"].items()))
    settings = report["settings"]
    lines.append(f"- timing: {settings['warmup']} warm-up call(s) while calls take under "
                 f"{settings['warmup_below_s']:g} s, up to {settings['repeats']} timed calls within "
                 f"{settings['case_budget_s']:g} s per case, median reported")
    for backend, method in settings.get("memory_method", {}).items():
        lines.append(f"- memory ({backend}): {method}")
    return lines


def render_markdown(report: dict) -> str:
    """A results file: environment, then the tables of :func:`render` as Markdown."""
    return "\n".join(["# dsa-export bench results", "", *environment_lines(report), "", render(report, markdown=True), ""])


def _moe_cell(case: dict | None) -> str:
    """``ms (MiB)`` of one MoE case: time and the peak memory of one call side by side."""
    if case is None:
        return "-"
    if "skipped" in case:
        return "skipped"
    mib = f" ({case['peak_bytes'] / 2**20:.0f})" if case.get("peak_bytes") is not None else ""
    return f"{case['median_s'] * 1e3:.1f}{mib}"


def moe_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    """One row per (experts, tokens): every backend's ``ms (MiB)``, then each one's time over eager's."""
    backends = report["settings"]["backends"]
    cases = {(c["experts"], c["backend"], c["tokens"]): c for c in report["cases"]}
    ratios = {(r["experts"], r["backend"], r["tokens"]): r for r in report["ratios"]}
    others = [b for b in backends if b != "eager"]
    header = ["E", "N", *(f"{b} ms (MiB)" for b in backends)]
    if "eager" in backends:
        header += [f"{b}/eager time" for b in others]
    rows = []
    for experts in report["settings"]["experts"]:
        for tokens in report["settings"]["tokens"]:
            row = [str(experts), str(tokens), *(_moe_cell(cases.get((experts, b, tokens))) for b in backends)]
            if "eager" in backends:
                for b in others:
                    r = ratios.get((experts, b, tokens))
                    row.append(f"{r['time_vs_eager']:.2f}" if r else "-")
            rows.append(row)
    return header, rows


def render_moe(report: dict, markdown: bool = False) -> str:
    """The MoE case's results, growth exponents and output agreement as text (or Markdown)."""
    cfg = report["config"]
    out = [
        f"MoE layer: hidden {cfg['hidden']}, routed experts of {cfg['intermediate']}, top-{cfg['top_k']} "
        f"({cfg['n_group']} groups, {cfg['topk_group']} eligible), {cfg['shared_experts']} shared expert(s), "
        f"{cfg['dtype']}, batch 1. Cells: median ms (peak MiB of one call, beyond the weights).",
        "",
    ]
    header, rows = moe_rows(report)
    out += [format_table(header, rows, markdown), ""]
    exp_rows = []
    for name, entry in report["exponents"].items():
        t, m = entry.get("time"), entry.get("memory")
        exp_rows.append([name, f"{t['exponent']:.2f}" if t else "-", f"{t['per_doubling']:.2f}" if t else "-",
                         f"{m['exponent']:.2f}" if m else "-"])
    out += [format_table(["curve", "time exponent in N", "time x per doubling", "memory exponent"], exp_rows,
                         markdown), ""]
    layer_rows = []
    for layer in report["layers"]:
        for backend, a in layer["agreement"].items():
            layer_rows.append([str(layer["experts"]), f"{layer['weight_bytes'] / 2**30:.2f}", backend, str(a["tokens"]),
                               f"{a['max_abs_diff'] / a['max_abs_reference']:.1e}" if a["max_abs_reference"] else "-",
                               f"{a['cosine']:.9f}"])
    out += [format_table(["E", "weights GiB", "backend", "N", "max abs diff / max abs eager", "cosine to eager"],
                         layer_rows, markdown)]
    for layer in report["layers"]:
        if layer.get("onnxruntime_load_rss_bytes") is not None:
            out.append(f"E={layer['experts']}: onnxruntime export {layer['onnxruntime_export_s']:g} s, session load "
                       f"{layer['onnxruntime_load_s']:g} s, +{layer['onnxruntime_load_rss_bytes'] / 2**30:.2f} GiB resident")
    for note in report["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out)


def render_moe_markdown(report: dict) -> str:
    """A results file for the MoE case: environment, then the tables of :func:`render_moe`."""
    return "\n".join(["# dsa-export bench results (MoE layer)", "", *environment_lines(report), "",
                      render_moe(report, markdown=True), ""])
