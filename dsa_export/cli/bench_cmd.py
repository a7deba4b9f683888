"""``dsa-export bench``: one DSA layer against the same layer with dense attention, across L
(``--case attention``), or one MoE layer's routed experts against transformers' (``--case moe``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dsa_export.cli.options import INT_LIST
from dsa_export.errors import DSAUsageError


class _NameList(click.ParamType):
    """A comma-separated list of known names (a tuple passes through: a default already converted)."""

    def choices(self) -> tuple[str, ...]:
        raise NotImplementedError

    def unknown_message(self, value) -> str:
        raise NotImplementedError

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        items = tuple(v.strip() for v in str(value).split(",") if v.strip())
        if not items or any(v not in self.choices() for v in items):
            self.fail(self.unknown_message(value), param, ctx)
        return items


class _VariantList(_NameList):
    name = "V,V,..."

    def choices(self) -> tuple[str, ...]:
        from dsa_export.bench.settings import VARIANTS

        return VARIANTS

    def unknown_message(self, value) -> str:
        return f"'{value}' names no known variant; choose from {', '.join(self.choices())}."


class _BackendList(_NameList):
    name = "B,B,..."

    def choices(self) -> tuple[str, ...]:
        from dsa_export.bench.settings import BACKENDS, MOE_BACKENDS

        return (*BACKENDS, *MOE_BACKENDS)

    def unknown_message(self, value) -> str:
        from dsa_export.bench.settings import BACKENDS, MOE_BACKENDS

        return (f"'{value}' names no known backend; choose from {', '.join(BACKENDS)} (--case attention) "
                f"or {', '.join(MOE_BACKENDS)} (--case moe).")


class _JsonFlag(click.Option):
    """``--json`` as every command has it (a flag: the report on stdout), shown as a flag in --help.
    It still takes a value for the older spellings: ``--json -`` (stdout, as the flag) and
    ``--json FILE`` (the report to FILE, as ``--json-out FILE`` writes it)."""

    def get_help_record(self, ctx):
        return "--json", self.help or ""


#: Options that belong to one case only (name of the parameter -> case).
_CASE_OPTIONS = {
    "seq_lens": ("attention", "--seq"), "topk": ("attention", "--topk"), "variants": ("attention", "--variants"),
    "block_size": ("attention", "--block-size"), "lsh_buckets": ("attention", "--lsh-buckets"),
    "max_onnxruntime_seq": ("attention", "--max-onnxruntime-seq"),
    "tokens": ("moe", "--tokens"), "experts": ("moe", "--experts"), "hidden": ("moe", "--hidden"),
    "intermediate": ("moe", "--intermediate"), "top_k": ("moe", "--top-k"), "dtype": ("moe", "--dtype"),
    "batched_mm_limit": ("moe", "--batched-mm-limit"),
}


@click.command(name="bench")
@click.option("--case", "case", type=click.Choice(["attention", "moe"]), default="attention", show_default=True,
              help="attention: one DSA layer against dense attention across L; moe: one MoE layer (router, "
                   "routed and shared experts) with our experts op against transformers' experts, across tokens.")
@click.option("--seq", "seq_lens", type=INT_LIST, default="1024,4096,16384", show_default=True,
              help="Sequence lengths L (prefill of L tokens). 1024,2048,4096,8192 finishes in about 1-2 "
                   "minutes on 2 CPU cores with OMP_WAIT_POLICY=PASSIVE and --variants dsa,dense; all four "
                   "layers at 1024,4096,8192,16384 took 3.4 minutes (the LSH layer is the slow one).")
@click.option("--topk", type=click.IntRange(min=1), default=512, show_default=True,
              help="Keys each query attends to in the DSA layer (and at most in the LSH layer; the block layer "
                   "attends to topk / block-size key blocks per query block).")
@click.option("--variants", type=_VariantList(), default="dsa,dense,block,lsh", show_default=True,
              help="Layers to time, all with the same q/k/v/o weights: dsa (lightning indexer + top-k + sparse "
                   "attention), dense (causal SDPA), block (block-sparse attention over key blocks chosen from "
                   "mean-pooled scores), lsh (Reformer LSH buckets, per head). dsa,dense is the faster set of "
                   "earlier releases.")
@click.option("--block-size", "block_size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Block size of the block layer (the CSR storage figures are computed at 32x32 and 64x64 "
                   "either way).")
@click.option("--lsh-buckets", "lsh_buckets", type=click.IntRange(min=2), default=8, show_default=True,
              help="LSH buckets per head of the lsh layer (even).")
@click.option("--backends", type=_BackendList(), default=None,
              help="attention (default torch,onnxruntime): torch (our CPU ops vs SDPA), onnxruntime (exported "
                   "layers on the CPU provider), cuda (plugin kernels vs CUDA SDPA; needs a GPU and the kernel "
                   "library). moe (default all): ours (our experts op), eager and batched_mm (transformers' "
                   "experts), onnxruntime (our layer exported, fp32).")
@click.option("--tokens", type=INT_LIST, default="1,4,16,64,256,1024,4096", show_default=True,
              help="--case moe: token counts N (one prefill of N tokens).")
@click.option("--experts", type=INT_LIST, default="16", show_default=True,
              help="--case moe: routed-expert counts, one layer each (16 experts of DeepSeek-V3.2 width are "
                   "2.6 GiB in fp32).")
@click.option("--hidden", type=click.IntRange(min=1), default=7168, show_default=True, help="--case moe: model width.")
@click.option("--intermediate", type=click.IntRange(min=1), default=2048, show_default=True,
              help="--case moe: width of each routed (and the shared) expert.")
@click.option("--top-k", "top_k", type=click.IntRange(min=1), default=8, show_default=True,
              help="--case moe: experts per token (4 groups, 3 eligible).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="--case moe: weights and activations (onnxruntime runs fp32 only).")
@click.option("--batched-mm-limit", "batched_mm_limit", type=click.FloatRange(min=0), default=4.0, show_default=True,
              help="--case moe: GiB of gathered expert weights above which batched_mm cases are skipped.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed calls per case at most (the median is reported).")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Untimed calls before each case (dropped once calls take over a second).")
@click.option("--case-budget", "case_budget_s", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="Seconds of timed calls per case after which repeats stop.")
@click.option("--max-onnxruntime-seq", type=click.IntRange(min=2), default=4096, show_default=True,
              help="Longest L run through ONNX Runtime (the dense export holds [B,H,L,L] scores and is also "
                   "skipped where those do not fit in memory; the DSA bodies run in bounded memory).")
@click.option("--time-budget", "time_budget_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds one call may take, measured or predicted from the curve so far (attention: 600 by "
                   "default; moe: 60); longer cases are skipped and say so.")
@click.option("--threads", type=click.IntRange(min=0), default=0, show_default=True,
              help="CPU threads for torch and ONNX Runtime (0: torch's default).")
@click.option("--no-memory", is_flag=True, help="Skip the peak-memory measurement.")
@click.option("--json", "json_arg", cls=_JsonFlag, is_flag=False, flag_value="-", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Print the report as JSON on stdout instead of the table (nothing else goes there).")
@click.option("--json-out", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the report as JSON to this file (atomically).")
@click.option("--markdown", "markdown_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown results file (date, machine, load, versions, tables) here.")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write log-log plots of latency and memory against L (or N for --case moe) to this PNG "
                   "(needs matplotlib).")
@click.pass_context
def command(ctx, case, seq_lens, topk, variants, block_size, lsh_buckets, backends, tokens, experts, hidden, intermediate, top_k, dtype, batched_mm_limit,
            repeats, warmup, case_budget_s, max_onnxruntime_seq, time_budget_s, threads, no_memory, json_arg, json_out,
            markdown_out, plot_out) -> None:
    """Time one DSA attention layer (indexer + top-k + sparse attention), the same layer with dense
    causal attention, with block-sparse attention and with LSH bucketed attention across sequence
    lengths (--case attention), or one DeepSeek-V3.2-width MoE layer with our routed-experts op
    against transformers' eager and batched_mm experts and ONNX Runtime across token counts
    (--case moe); report medians, peak memory next to them, ratios and growth exponents
    (attention also: the FLOP split, each selection's sparsity, the CSR storage of the block
    masks and the seed documents' claims with a verdict)."""
    from click.core import ParameterSource

    for name, (owner, flag) in _CASE_OPTIONS.items():
        if owner != case and ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            raise DSAUsageError(f"{flag} belongs to --case {owner}; drop it or pass --case {owner}.")
    if backends is not None and len(set(backends)) != len(backends):
        raise DSAUsageError(f"--backends lists a backend twice ({','.join(backends)}); name each once.")
    if plot_out is not None and plot_out.suffix.lower() != ".png":
        raise DSAUsageError(f"--plot writes a PNG, so its file name must end in .png, not '{plot_out.name}'.")
    from dsa_export.cli.options import check_outputs

    as_json = json_arg is not None and str(json_arg) == "-"
    if json_arg is not None and not as_json:
        if json_out is not None:
            raise DSAUsageError("--json FILE and --json-out FILE both name a file; keep --json-out.")
        json_out = json_arg

    check_outputs((json_out, "--json-out"), (markdown_out, "--markdown"), (plot_out, "--plot"))
    if case == "moe":
        settings = _moe_settings(backends, tokens, experts, hidden, intermediate, top_k, dtype, batched_mm_limit,
                                 repeats, warmup, case_budget_s, threads, no_memory, time_budget_s)
    else:
        settings = _attention_settings(backends, seq_lens, topk, repeats, warmup, case_budget_s, threads, no_memory,
                                       max_onnxruntime_seq, time_budget_s, variants, block_size, lsh_buckets)
    if plot_out is not None:
        from dsa_export.bench.plot import require_matplotlib

        require_matplotlib()
    from dsa_export.fileio import atomic_output

    to_stdout = as_json

    def progress(message: str) -> None:  # on stderr, with --json too: stdout holds only the report
        click.echo(message, err=True)

    if case == "moe":
        from dsa_export.bench.moe import run_moe_bench
        from dsa_export.bench.report import render_moe as render
        from dsa_export.bench.report import render_moe_markdown as render_markdown

        report = run_moe_bench(settings, progress=progress)
    else:
        from dsa_export.bench.report import render, render_markdown
        from dsa_export.bench.runner import run_bench

        report = run_bench(settings, progress=progress)
    text = json.dumps(report, indent=2)
    if to_stdout:
        click.echo(text)
    else:
        click.echo(render(report))
    if json_out is not None:
        with atomic_output(json_out) as tmp:
            tmp.write_text(text + "\n")
        if not to_stdout:
            click.echo(f"Wrote {json_out}.")
    if markdown_out is not None:
        with atomic_output(markdown_out) as tmp:
            tmp.write_text(render_markdown(report))
        if not to_stdout:
            click.echo(f"Wrote {markdown_out}.")
    if plot_out is not None:
        from dsa_export.bench.plot import save_moe_plot, save_plot

        with atomic_output(plot_out) as tmp:
            (save_moe_plot if case == "moe" else save_plot)(report, tmp)
        if not to_stdout:
            click.echo(f"Wrote {plot_out}.")


def _attention_settings(backends, seq_lens, topk, repeats, warmup, case_budget_s, threads, no_memory,
                        max_onnxruntime_seq, time_budget_s, variants=("dsa", "dense"), block_size=64, lsh_buckets=8):
    from dsa_export.bench.settings import BACKENDS, DEFAULT_BACKENDS, BenchSettings, BlockConfig

    backends = backends or DEFAULT_BACKENDS
    foreign = [b for b in backends if b not in BACKENDS]
    if foreign:
        raise DSAUsageError(f"--backends {','.join(foreign)} names no known backend of --case attention; choose "
                            f"from {', '.join(BACKENDS)}.")
    if min(seq_lens) < 2:
        raise DSAUsageError("every --seq length must be at least 2.")
    if len(set(variants)) != len(variants):
        raise DSAUsageError(f"--variants lists a variant twice ({','.join(variants)}); name each once.")
    if lsh_buckets % 2:
        raise DSAUsageError(f"--lsh-buckets must be even (the hash is argmax([xR, -xR])), not {lsh_buckets}.")
    return BenchSettings(
        seq_lens=seq_lens, backends=backends, variants=variants,
        block=BlockConfig(topk=topk, block_size=block_size, lsh_buckets=lsh_buckets), warmup=warmup,
        repeats=repeats, case_budget_s=case_budget_s, memory=not no_memory, threads=threads,
        max_onnxruntime_seq=max_onnxruntime_seq, **({} if time_budget_s is None else {"time_budget_s": time_budget_s}),
    )


def _moe_settings(backends, tokens, experts, hidden, intermediate, top_k, dtype, batched_mm_limit, repeats, warmup,
                  case_budget_s, threads, no_memory, time_budget_s):
    from dsa_export.bench.settings import MOE_BACKENDS, MoEBenchSettings, MoEConfig

    if backends is None:
        backends = MOE_BACKENDS if dtype == "fp32" else tuple(b for b in MOE_BACKENDS if b != "onnxruntime")
    foreign = [b for b in backends if b not in MOE_BACKENDS]
    if foreign:
        raise DSAUsageError(f"--backends {','.join(foreign)} names no known backend of --case moe; choose from "
                            f"{', '.join(MOE_BACKENDS)}.")
    try:
        return MoEBenchSettings(
            tokens=tokens, experts=experts, backends=backends, warmup=warmup, repeats=repeats,
            case_budget_s=case_budget_s, memory=not no_memory, threads=threads, batched_mm_limit_gib=batched_mm_limit,
            **({} if time_budget_s is None else {"time_budget_s": time_budget_s}),
            layer=MoEConfig(hidden=hidden, intermediate=intermediate, top_k=top_k, dtype=dtype),
        )
    except ValueError as exc:
        raise DSAUsageError(str(exc)) from None
