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


#: Column names of the variants.
LABELS = {"dsa": "DSA", "dense": "dense", "block": "block", "lsh": "LSH"}


def _variants(report: dict) -> list[str]:
    return list(report["settings"].get("variants", ("dsa", "dense")))


def result_header(report: dict) -> list[str]:
    variants = _variants(report)
    others = [v for v in variants if v != "dense"] if "dense" in variants else []
    return ["backend", "L", *(f"{LABELS[v]} ms" for v in variants), *(f"dense/{LABELS[v]} time" for v in others),
            *(f"{LABELS[v]} MiB" for v in variants), *(f"{LABELS[v]}/dense mem" for v in others)]


def results_rows(report: dict) -> list[list[str]]:
    """One row per (backend, L): each variant's time, dense's time over each other's, their memory
    and each one's memory over dense's."""
    cases = {(c["backend"], c["variant"], c["seq_len"]): c for c in report["cases"]}
    ratios = {(r["backend"], r["seq_len"]): r for r in report["ratios"]}
    variants = _variants(report)
    others = [v for v in variants if v != "dense"] if "dense" in variants else []
    rows = []
    for backend in report["settings"]["backends"]:
        for seq_len in report["settings"]["seq_lens"]:
            ratio = ratios.get((backend, seq_len), {})
            row = [backend, str(seq_len)]
            row += [_ms(cases.get((backend, v, seq_len))) for v in variants]
            row += [f"{ratio[f'dense_over_{v}_time']:.2f}" if f"dense_over_{v}_time" in ratio else "-" for v in others]
            row += [_mib(cases.get((backend, v, seq_len))) for v in variants]
            row += [f"{ratio[f'{v}_over_dense_memory']:.2f}" if f"{v}_over_dense_memory" in ratio else "-"
                    for v in others]
            rows.append(row)
    return rows


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
        f"indexer {cfg['index_heads']} x {cfg['index_head_dim']}, top-k {cfg['topk']}, batch {cfg['batch']}"
        + (f"; block layer: {_blocks(cfg)} key blocks of {cfg.get('block_size')} per query block"
           if "block" in _variants(report) else "")
        + (f"; LSH layer: {cfg.get('lsh_buckets')} buckets per head, at most {cfg['topk']} keys per query"
           if "lsh" in _variants(report) else "") + ".",
        "",
        format_table(result_header(report), results_rows(report), markdown),
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
        if not parts or case["variant"] == "dense":
            continue
        selection = parts.get("indexer", parts.get("selection", 0.0))
        attention = parts.get("sparse_attention", parts.get("block_sparse_attention", 0.0))
        split_rows.append([
            case["backend"], case["variant"], str(case["seq_len"]), f"{selection * 1e3:.1f}", f"{attention * 1e3:.1f}",
            f"{max(0.0, case['median_s'] - selection - attention) * 1e3:.1f}",
            f"{100 * selection / (selection + attention):.0f}%" if selection + attention > 0 else "-",
            f"{100 * flops[case['seq_len']]['indexer_share']:.0f}%" if case["variant"] == "dsa" else "-",
        ])
    if split_rows:
        out += [format_table(["backend", "variant", "L", "selection ms", "attention ms", "rest ms",
                              "selection share of time", "indexer share of FLOPs"], split_rows, markdown),
                "(selection: the indexer + top-k for DSA, the pooled block scores + top-k for block, the hashing "
                "and bucket selections for LSH)", ""]
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
    sparsity = {(s.get("variant", "dsa"), s["seq_len"]): s for s in report["sparsity"]}
    flop_rows = []
    for f in report["flops"]:
        s = sparsity.get(("dsa", f["seq_len"]))
        if s is None:
            continue
        flop_rows.append([
            str(f["seq_len"]), f"{f['indexer'] / 1e9:.1f}", f"{f['sparse_attention'] / 1e9:.1f}",
            f"{f['dense_attention'] / 1e9:.1f}", f"{f['projections'] / 1e9:.1f}", f"{100 * f['indexer_share']:.0f}%",
            f"{f['dense_over_dsa']:.2f}", f"{100 * s['analytic']:.1f}%",
            f"{100 * s['measured']:.1f}%" if s["measured"] is not None else "-",
        ])
    if flop_rows:
        out += [format_table(
            ["L", "indexer GFLOP", "sparse attn GFLOP", "dense attn GFLOP", "projections GFLOP", "indexer share",
             "dense/DSA FLOPs", "sparsity", "measured"], flop_rows, markdown), ""]
    out += _sparsity_section(report, markdown)
    out += _csr_section(report, markdown)
    claim_rows = [[claim["claim"], LABELS.get(claim.get("variant", "dsa"), "-"), _claim_values(claim),
                   claim.get("verdict", "holds" if claim["agrees"] else "does not hold")]
                  for claim in report["claims"]]
    out.append(format_table(["seed claim", "layer", "measured here", "verdict"], claim_rows, markdown))
    for claim in report["claims"]:
        if claim.get("note"):
            out.append(f"  {claim['claim']} ({LABELS.get(claim.get('variant', 'dsa'), '-')}): {claim['note']}")
    for note in dict.fromkeys(report["notes"]):
        out.append(f"note: {note}")
    return "\n".join(out)


def _blocks(cfg: dict) -> int:
    kb = cfg.get("block_topk")
    return kb if kb is not None else max(1, cfg["topk"] // cfg.get("block_size", 64))


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _claim_values(claim: dict) -> str:
    """The measured figures of one claim row, in words."""
    measured = claim["measured"]
    if claim["claim"].startswith("85-90%"):
        return ", ".join(f"L={m['seq_len']}: "
                         + _percent(m["measured"] if m["measured"] is not None else m["analytic"])
                         for m in measured) or "not measured"
    if "CSR" in claim["claim"]:
        at_claim = [m for m in measured if m["block_size"] == 32] or measured  # the claim's 32x32 (all: table)
        return ", ".join(f"{m['block_size']}x{m['block_size']} L={m['seq_len']}: {m['value']:.2f}x"
                         for m in at_claim) or "not measured"
    if "faster" in claim["claim"]:
        return ", ".join(f"{m['backend']} L={m['seq_len']}: {m['value']:.2f}x"
                         + (f" (FLOPs {m['flop_ratio']:.2f}x)" if m.get("flop_ratio") is not None else "")
                         for m in measured) or "not measured"
    return ", ".join(f"{m['backend']} L={m['seq_len']}: {_saving(m['value'])}" for m in measured) or "not measured"


def _sparsity_section(report: dict, markdown: bool) -> list[str]:
    """Measured (analytic) sparsity of every selection variant at every L."""
    variants = [v for v in _variants(report) if v != "dense"]
    if not variants:
        return []
    by_key = {(s.get("variant", "dsa"), s["seq_len"]): s for s in report["sparsity"]}
    rows = []
    for n in report["settings"]["seq_lens"]:
        row = [str(n)]
        for v in variants:
            s = by_key.get((v, n), {})
            cell = _percent(s.get("measured"))
            if s.get("analytic") is not None:
                cell += f" ({_percent(s['analytic'])})"
            row.append(cell)
        rows.append(row)
    return [format_table(["L", *(f"{LABELS[v]} sparsity" for v in variants)], rows, markdown),
            "(sparsity: 1 - attended (query, key) pairs / causal pairs, measured from a timed call's selection; "
            "analytic value in parentheses where K or Kb fixes it)", ""]


def _csr_section(report: dict, markdown: bool) -> list[str]:
    """CSR storage of the block layer's selections against the dense block masks."""
    rows = [[str(r["seq_len"]), f"{r['block_size']}x{r['block_size']}", str(r["blocks_per_query_block"]),
             f"{100 * r['density']:.1f}%", str(r["csr_bytes"]), str(r["dense_block_bytes"]),
             f"{r['saving_vs_dense_block']:.2f}x", str(r["dense_block_bit_bytes"]),
             f"{r['saving_vs_dense_block_bit']:.2f}x", str(r["narrowest_csr_bytes"]),
             f"{r['saving_vs_element_mask']:.0f}x"]
            for r in report.get("csr_storage", [])]
    if not rows:
        return []
    return [format_table(["L", "blocks", "blocks per query block", "density", "CSR B (int32)", "bool block mask B",
                          "bool/CSR", "bit block mask B", "bit/CSR", "CSR B (narrowest ints)", "element mask/CSR"],
                         rows, markdown),
            "(CSR storage of the block layer's selections, ops.csr.csr_storage: row pointers + column ids, per head "
            "and query block; the same keys per query at both block sizes)", ""]


_PARTS = (("layer", "layer"), ("indexer", "indexer+top-k"), ("selection", "selection"),
          ("sparse_attention", "sparse attn"), ("block_sparse_attention", "block-sparse attn"),
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
