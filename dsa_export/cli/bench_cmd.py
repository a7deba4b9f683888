"""``dsa-export bench``: one DSA layer against the same layer with dense attention, across L."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dsa_export.cli.options import INT_LIST
from dsa_export.errors import DSAUsageError


class _BackendList(click.ParamType):
    name = "B,B,..."

    def convert(self, value, param, ctx):
        from dsa_export.bench.settings import BACKENDS

        if isinstance(value, tuple):
            return value
        items = tuple(v.strip() for v in str(value).split(",") if v.strip())
        unknown = [v for v in items if v not in BACKENDS]
        if not items or unknown:
            self.fail(f"'{value}' names no known backend; choose from {', '.join(BACKENDS)}.", param, ctx)
        return items


@click.command(name="bench")
@click.option("--seq", "seq_lens", type=INT_LIST, default="1024,4096,16384", show_default=True,
              help="Sequence lengths L (prefill of L tokens). 1024,2048,4096,8192 finishes in about 3 "
                   "minutes on 2 CPU cores.")
@click.option("--topk", type=click.IntRange(min=1), default=512, show_default=True,
              help="Keys each query attends to in the DSA layer.")
@click.option("--backends", type=_BackendList(), default="torch,onnxruntime", show_default=True,
              help="torch (our CPU ops vs SDPA), onnxruntime (exported layers on the CPU provider), "
                   "cuda (plugin kernels vs CUDA SDPA; needs a GPU and the kernel library).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed calls per case at most (the median is reported).")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Untimed calls before each case (dropped once calls take over a second).")
@click.option("--case-budget", "case_budget_s", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="Seconds of timed calls per case after which repeats stop.")
@click.option("--max-onnxruntime-seq", type=click.IntRange(min=2), default=4096, show_default=True,
              help="Longest L run through ONNX Runtime, whose function bodies hold [B,H,L,L] scores.")
@click.option("--threads", type=click.IntRange(min=0), default=0, show_default=True,
              help="CPU threads for torch and ONNX Runtime (0: torch's default).")
@click.option("--no-memory", is_flag=True, help="Skip the peak-memory measurement.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report as JSON here ('-' for stdout, then no table).")
@click.option("--markdown", "markdown_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown results file (date, machine, load, versions, tables) here.")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write log-log plots of latency and memory against L to this PNG (needs matplotlib).")
def command(seq_lens, topk, backends, repeats, warmup, case_budget_s, max_onnxruntime_seq, threads, no_memory,
            json_out, markdown_out, plot_out) -> None:
    """Time one DSA attention layer (indexer + top-k + sparse attention) against the same layer with
    dense causal attention across sequence lengths; report medians, peak memory, ratios, growth
    exponents in L, the FLOP split and the seed documents' claims next to the measurements."""
    from dsa_export.bench.settings import BenchSettings, BlockConfig

    if min(seq_lens) < 2:
        raise DSAUsageError("every --seq length must be at least 2.")
    if len(set(backends)) != len(backends):
        raise DSAUsageError(f"--backends lists a backend twice ({','.join(backends)}); name each once.")
    if plot_out is not None and plot_out.suffix.lower() != ".png":
        raise DSAUsageError(f"--plot writes a PNG, so its file name must end in .png, not '{plot_out.name}'.")
    if plot_out is not None:
        from dsa_export.bench.plot import require_matplotlib

        require_matplotlib()
    settings = BenchSettings(
        seq_lens=seq_lens, backends=backends, block=BlockConfig(topk=topk), warmup=warmup, repeats=repeats,
        case_budget_s=case_budget_s, memory=not no_memory, threads=threads, max_onnxruntime_seq=max_onnxruntime_seq,
    )
    from dsa_export.bench.report import render
    from dsa_export.bench.runner import run_bench
    from dsa_export.fileio import atomic_output

    to_stdout = json_out is not None and str(json_out) == "-"
    report = run_bench(settings, progress=None if to_stdout else lambda msg: click.echo(msg, err=True))
    text = json.dumps(report, indent=2)
    if to_stdout:
        click.echo(text)
    else:
        click.echo(render(report))
        if json_out is not None:
            with atomic_output(json_out) as tmp:
                tmp.write_text(text + "\n")
            click.echo(f"Wrote {json_out}.")
    if markdown_out is not None:
        from dsa_export.bench.report import render_markdown

        with atomic_output(markdown_out) as tmp:
            tmp.write_text(render_markdown(report))
        if not to_stdout:
            click.echo(f"Wrote {markdown_out}.")
    if plot_out is not None:
        from dsa_export.bench.plot import save_plot

        with atomic_output(plot_out) as tmp:
            save_plot(report, tmp)
        if not to_stdout:
            click.echo(f"Wrote {plot_out}.")
