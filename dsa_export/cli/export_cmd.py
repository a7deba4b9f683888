"""``dsa-export export``."""

from __future__ import annotations

import time
from pathlib import Path

import click

from dsa_export.cli.options import (
    LAYER_SPAN,
    StagePlanOptions,
    check_outputs,
    emit_report,
    json_options,
    say,
    stage_plan_options,
)
from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.export.settings import DTYPES, OPS_MODES, SUPPORTED_OPSETS


@click.command(name="export")
@click.argument("model", required=False)
@click.option("-o", "--output", "output", type=click.Path(path_type=Path), required=True,
              help="The .onnx file to write (atomically); with --stages, the folder for the stages and pipeline.json.")
@click.option("--ops", type=click.Choice(OPS_MODES), default="plugin", show_default=True,
              help="plugin: dsa custom nodes with function bodies; native: standard ONNX ops only.")
@click.option("--batch", type=click.IntRange(min=2), default=2, show_default=True,
              help="Batch of the traced example (the axis stays dynamic).")
@click.option("--seq-len", type=click.IntRange(min=2), default=64, show_default=True,
              help="Sequence length of the traced example (the axis stays dynamic).")
@click.option("--dtype", type=click.Choice(list(DTYPES)), default=None,
              help="Weights and activations. Default: a Hugging Face checkpoint's own dtype (bf16 for "
                   "DeepSeek-V3.2 and GLM-5), fp32 for other models. FP8 weights stay FP8 unless --dequantize-fp8.")
@click.option("--opset", type=click.IntRange(SUPPORTED_OPSETS.start, SUPPORTED_OPSETS.stop - 1), default=None,
              help="Standard-domain ONNX opset. Default: 18, or 21 for FP8 weights (blocked DequantizeLinear).")
@click.option("--graph", type=click.Choice(["prefill", "decode", "paged"]), default=None,
              help="Hugging Face models: prefill (the whole prompt; default for one file), a decode step with "
                   "explicit caches concatenated each step (default with --stages), or paged: the serving step "
                   "(cache pools of 64-token pages written in place, ragged rows, chunked prefill, last-token "
                   "logits; what `generate` runs best).")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True,
              help="Paged graphs: what the cache pools store. auto: the graph's dtype; fp8: FlashMLA's FP8 latent "
                   "(e4m3 values, a float32 scale per 128 channels, the RoPE channels in the graph's dtype: 656 bytes a "
                   "token in a bf16 graph at DeepSeek-V3.2's "
                   "widths, 1152 in bf16) and FP8 index keys with a float32 scale per token (132 bytes, 256 in bf16).")
@click.option("--layers", type=LAYER_SPAN, default=None, metavar="A:B",
              help="Hugging Face models: export decoder layers A..B-1 only (hidden states in and out).")
@stage_plan_options(
    when="With --stages",
    stages_help="Hugging Face models: export pipeline stages (auto: the fewest that fit --gpu-memory; N: N "
                "balanced stages), one decode-graph .onnx per stage (--graph paged or prefill for those graphs) plus "
                "pipeline.json in the -o folder; resumable.")
@click.option("--prefill-chunk", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --stages --graph paged: the most prompt tokens per row one prefill call will take (as build "
                   "--prefill-chunk): the plan sizes activations for one such call, and pipeline.json records N, which "
                   "a later build of the folder uses unless given its own.")
@click.option("--dequantize-fp8", is_flag=True,
              help="Hugging Face models stored in FP8: write the weights dequantized (in --dtype, default bf16) "
                   "for runtimes without FP8.")
@json_options
def command(model: str | None, output: Path, ops: str, batch: int, seq_len: int, dtype: str | None, opset: int | None,
            graph: str | None, kv_cache_dtype: str, layers: str | None, stage_plan: StagePlanOptions,
            prefill_chunk: int | None, dequantize_fp8: bool, as_json: bool, json_out: Path | None) -> None:
    """Export MODEL to ONNX with DSA custom ops.

    MODEL is a built-in model name (default: tiny), path/file.py:factory, where factory()
    returns (module, example_inputs) and may accept batch= and seq_len= keywords, or a local
    Hugging Face directory of a deepseek_v32 (DeepSeek-V3.2) or glm_moe_dsa (GLM-5) model.
    Checkpoints are read one tensor at a time and written straight into the file (external data
    past 2 GB): memory stays at about one layer, whatever the model.

    A path/file.py:factory is Python code that dsa-export imports and runs because you named it;
    files only record it, and no later command runs it unless you pass it again (--reference).
    """
    from dsa_export.errors import trace_errors
    from dsa_export.export import ExportSettings
    from dsa_export.quiet import progress_bars, third_party_output, user_stderr
    from dsa_export.sources import resolve

    if model and ":" in model and Path(model.rsplit(":", 1)[0]).resolve() == output.resolve():
        raise DSAUsageError("the output path is the model file itself; choose another -o.")
    if model and Path(model).is_dir() and output.resolve() == Path(model).resolve():
        raise DSAUsageError("the output path is the checkpoint folder itself; choose another -o.")
    stages, gpu_memory, gpus = stage_plan.stages, stage_plan.gpu_memory, stage_plan.gpus
    is_hf = bool(model) and Path(model).is_dir()
    if not is_hf and (graph or layers or dequantize_fp8 or kv_cache_dtype != "auto" or stages is not None):
        raise DSAUsageError("--graph, --layers, --stages, --kv-cache-dtype and --dequantize-fp8 apply to Hugging Face "
                            "model directories only.")
    from dsa_export.hf.model import check_kv_cache
    from dsa_export.hf.sizes import check_prefill_chunk

    kv_cache = check_kv_cache(kv_cache_dtype, graph)
    if stages is None and (gpu_memory or gpus):
        raise DSAUsageError("--gpu-memory and --gpus apply to --stages only.")
    if prefill_chunk is not None and stages is None:
        raise DSAUsageError("--prefill-chunk applies to stage exports of paged graphs (a single export's prefill "
                            "length is its caller's); add --stages N --graph paged.")
    if stages is not None:
        check_prefill_chunk(prefill_chunk, graph or "decode")
    if stages is not None and layers:
        raise DSAUsageError("--layers and --stages exclude each other: a stage is a layer range the planner chooses.")
    if stages == "auto" and not gpu_memory:
        raise DSAUsageError("--stages auto needs --gpu-memory (e.g. 141GiB) to know what fits; pass it, or a stage "
                            "count such as --stages 4.")
    settings = ExportSettings(ops=ops, batch=batch, seq_len=seq_len, dtype=dtype, opset=opset)
    start = time.perf_counter()
    # Every output is checked before the model is read or traced.
    check_outputs((json_out, "--json-out"))
    if stages is not None:
        from dsa_export.fileio import check_output_path

        if output.exists() and not output.is_dir():
            raise DSAUsageError(f"-o '{output}' is a file; with --stages pass a folder.")
        check_output_path(output, "-o", folder=True, inside=True)
        _export_stages(Path(model), output, settings, stage_plan, graph or "decode", dequantize_fp8, kv_cache, start,
                       as_json, json_out, prefill_chunk)
        return
    if output.is_dir():
        raise DSAUsageError(f"-o '{output}' is a folder; pass the .onnx file to write (or use --stages).")
    check_outputs((output, "-o"), (Path(str(output) + ".data"), "-o (its external data)"))
    if is_hf:
        from dsa_export.hf.loader import inspect_checkpoint
        from dsa_export.hf.source import hf_reference, hf_source, parse_layers

        ckpt = inspect_checkpoint(model)  # the one read of config.json and the shard headers
        try:
            span = parse_layers(layers, ckpt.num_layers) if layers else None
        except DSAUserError as exc:
            raise DSAUsageError(str(exc)) from exc
        reference = hf_reference(ckpt, graph=graph or "prefill", layers=span, dequantize_fp8=dequantize_fp8,
                                 kv_cache=kv_cache)
        source = hf_source(reference, batch=batch, seq_len=seq_len, seed=settings.seed, dtype=dtype, checkpoint=ckpt)
    else:
        source = resolve(model, batch=batch, seq_len=seq_len, seed=settings.seed)
    from dsa_export import interrupts
    from dsa_export.export import export_to_file

    # The exporter stages large files in a hidden sibling folder: removed if the process is ended.
    def step(text: str) -> None:  # torch.export says nothing for tens of seconds; on a terminal, say what runs
        click.echo(f"Exporting {source.spec}: {text} ...", file=user_stderr())

    with interrupts.temporaries_of(output), trace_errors(source.spec), third_party_output():
        result = export_to_file(source, settings, output, step=step if progress_bars() else None)
    seconds = time.perf_counter() - start
    data = f", {result.external_bytes / 2**30:.2f} GiB of weights in {output.name}.data" if result.external_bytes else ""
    say(f"Exported {source.spec} to {output} ({ops} ops, {result.dsa_nodes} dsa nodes, {result.settings.dtype}, "
        f"opset {result.settings.opset}{data}) in {seconds:.1f} s.", as_json)
    report = {"output": str(output), "model": source.spec, "ops": ops, "dsa_nodes": result.dsa_nodes,
              "dtype": result.settings.dtype, "opset": result.settings.opset, "weight_bytes": result.weight_bytes,
              "external_data": f"{output}.data" if result.external_bytes else None,
              "external_bytes": result.external_bytes, "seconds": round(seconds, 2)}
    emit_report(report, as_json, json_out)


def _export_stages(model: Path, output: Path, settings, stage_plan: StagePlanOptions, graph, dequantize_fp8, kv_cache,
                   start, as_json: bool, json_out: Path | None, prefill_chunk: int | None = None) -> None:
    from dsa_export.stages.export import StageExportSettings, export_stages, stage_table

    stage_settings = StageExportSettings(stages=stage_plan.stages, gpu_memory=stage_plan.gpu_memory,
                                         gpus=stage_plan.gpus, max_batch=stage_plan.max_batch,
                                         max_seq=stage_plan.max_seq, graph=graph, prefill_chunk=prefill_chunk,
                                         dequantize_fp8=dequantize_fp8, kv_cache=kv_cache,
                                         export=settings)
    pipeline, outcomes = export_stages(model, output, stage_settings)
    say(stage_table(outcomes), as_json)
    kept = sum(o.status == "kept" for o in outcomes)
    say(f"Exported {len(pipeline.stages)} stages of {pipeline.num_layers} layers to {output} "
        f"({kept} kept from an earlier run) in {time.perf_counter() - start:.1f} s; see {output / 'pipeline.json'}.",
        as_json)
    emit_report({"output": str(output), "pipeline": str(output / "pipeline.json"), **pipeline.to_dict(),
                 "outcomes": [vars(o) for o in outcomes], "seconds": round(time.perf_counter() - start, 2)},
                as_json, json_out)
