"""Log-log plots of latency and peak memory against L, or against tokens for the MoE case
(matplotlib, the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path

from dsa_export.errors import DSAUserError

INSTALL_HINT = "pip install 'dsa-export[bench]'"


def require_matplotlib() -> None:
    """Fail with one sentence when matplotlib is missing (checked before any timing starts)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise DSAUserError(
            f"--plot needs matplotlib, which is not installed; run `{INSTALL_HINT}` (or pip install matplotlib) "
            "or leave out --plot."
        ) from exc


_STYLE = {"dsa": "-", "dense": "--", "block": "-.", "lsh": ":"}
_COLORS = {"torch": "tab:blue", "onnxruntime": "tab:orange", "cuda": "tab:green"}


def save_plot(report: dict, path: str | Path) -> Path:
    """Write a two-panel PNG (latency, peak memory) and return its path."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(10, 4), dpi=80)
    curves: dict[tuple[str, str], list[dict]] = {}
    for case in report["cases"]:
        if "skipped" not in case:
            curves.setdefault((case["backend"], case["variant"]), []).append(case)
    for (backend, variant), points in curves.items():
        points.sort(key=lambda c: c["seq_len"])
        lengths = [p["seq_len"] for p in points]
        fit = report["exponents"].get(f"{backend}/{variant}", {})
        label = f"{backend} {variant}"
        t_label = label + (f" (L^{fit['time']['exponent']:.2f})" if "time" in fit else "")
        style = dict(color=_COLORS.get(backend, "tab:gray"), linestyle=_STYLE.get(variant, "-"), marker="o", markersize=4)
        ax_time.plot(lengths, [p["median_s"] * 1e3 for p in points], label=t_label, **style)
        mem = [(p["seq_len"], p["peak_bytes"] / 2**20) for p in points if p.get("peak_bytes")]
        if mem:
            m_label = label + (f" (L^{fit['memory']['exponent']:.2f})" if "memory" in fit else "")
            ax_mem.plot([m[0] for m in mem], [m[1] for m in mem], label=m_label, **style)
    cfg, env = report["config"], report["environment"]
    threads = env.get("torch_threads") or env.get("onnxruntime_threads")
    where = env.get("gpu") or f"CPU, {threads} thread{'' if threads == 1 else 's'}"
    for ax, ylabel in ((ax_time, "median latency (ms)"), (ax_mem, "peak memory of one call (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7)
    fig.suptitle(
        f"one attention layer: {' / '.join(report['settings'].get('variants', ('dsa', 'dense')))} "
        f"(top-k {cfg['topk']}), {cfg['heads']} heads x {cfg['head_dim']}, "
        f"hidden {cfg['hidden']}; {where}, {report['date'][:10]}", fontsize=9,
    )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)
    return out


_MOE_COLORS = {"ours": "tab:blue", "eager": "tab:red", "batched_mm": "tab:purple", "onnxruntime": "tab:orange"}
_MOE_STYLES = ("-", "--", ":", "-.")


def save_moe_plot(report: dict, path: str | Path) -> Path:
    """The MoE case as a two-panel PNG (latency, peak memory against tokens); returns its path."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(10, 4), dpi=80)
    curves: dict[tuple[int, str], list[dict]] = {}
    for case in report["cases"]:
        if "skipped" not in case:
            curves.setdefault((case["experts"], case["backend"]), []).append(case)
    styles = {e: _MOE_STYLES[i % len(_MOE_STYLES)] for i, e in enumerate(report["settings"]["experts"])}
    for (experts, backend), points in curves.items():
        points.sort(key=lambda c: c["tokens"])
        fit = report["exponents"].get(f"E{experts}/{backend}", {})
        label = f"{backend} E={experts}"
        style = dict(color=_MOE_COLORS.get(backend, "tab:gray"), linestyle=styles[experts], marker="o", markersize=4)
        t_label = label + (f" (N^{fit['time']['exponent']:.2f})" if "time" in fit else "")
        ax_time.plot([p["tokens"] for p in points], [p["median_s"] * 1e3 for p in points], label=t_label, **style)
        mem = [(p["tokens"], p["peak_bytes"] / 2**20) for p in points if p.get("peak_bytes")]
        if mem:
            ax_mem.plot([m[0] for m in mem], [m[1] for m in mem], label=label, **style)
    cfg, env = report["config"], report["environment"]
    threads = env.get("torch_threads")
    for ax, ylabel in ((ax_time, "median latency (ms)"), (ax_mem, "peak memory of one call (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens N")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7)
    fig.suptitle(
        f"one MoE layer: hidden {cfg['hidden']}, experts of {cfg['intermediate']}, top-{cfg['top_k']}, {cfg['dtype']}; "
        f"CPU, {threads} thread{'' if threads == 1 else 's'}, {report['date'][:10]}", fontsize=9,
    )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)
    return out
