"""``dsa-export build``."""

from __future__ import annotations

from pathlib import Path

import click

from dsa_export.artifact.settings import BACKENDS, HARDWARE_COMPATIBILITY, PRECISIONS
from dsa_export.cli.options import (
    RTX_TARGET,
    StagePlanOptions,
    check_outputs,
    emit_report,
    json_options,
    say,
    stage_plan_options,
)


@click.command(name="build")
@click.argument("model", required=False)
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Artifact folder (built in a temporary sibling and renamed into place at the end).")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="Default: fp16 for a TensorRT engine on a GPU, else fp32. int8/fp8 calibrate first.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="auto: TensorRT with a GPU, else TensorRT-RTX, plus the ONNX Runtime artifact.")
@click.option("--min-shapes", default=None, metavar="DIM=N,...", help="Profile minimum, e.g. batch=1,sequence=1.")
@click.option("--opt-shapes", default=None, metavar="DIM=N,...", help="Profile optimum, e.g. batch=1,sequence=128.")
@click.option("--max-shapes", default=None, metavar="DIM=N,...", help="Profile maximum, e.g. batch=4,sequence=512.")
@click.option("--plugins", "plugin_library", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The DSA TensorRT plugin library (default: found like `dsa-export plugins path`).")
@click.option("--timing-cache", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="TensorRT timing cache to reuse and update (default: the one of the previous build in -o).")
@click.option("--version-compatible", is_flag=True, help="TensorRT: let newer TensorRT runtimes load the engine.")
@click.option("--hardware-compatibility", type=click.Choice(list(HARDWARE_COMPATIBILITY)), default="none",
              show_default=True, help="TensorRT: run on every Ampere+ GPU, or on GPUs of the same compute capability.")
@click.option("--optimization-level", type=click.IntRange(0, 5), default=3, show_default=True,
              help="TensorRT builder optimization level.")
@click.option("--rtx-target", "rtx_targets", type=RTX_TARGET, multiple=True, metavar="SMxy",
              help="TensorRT-RTX compute capability to build for (repeatable; default: the GPU here, else SM89).")
@click.option("--calibration-data", default=None,
              help="int8/fp8: calibration data (default: the model's bundled data). With --stages: a folder of token "
                   "ids (.npy [B, L] or .npz with input_ids); each stage is calibrated on what the stages before it "
                   "produce.")
@click.option("--skip-checks", is_flag=True, help="Build even when the compatibility checks find a blocking problem.")
@click.option("--no-validate", is_flag=True, help="Skip the ONNX Runtime vs torch validation stage.")
@click.option("--force", is_flag=True, help="Replace a non-empty OUTPUT folder that holds no previous build.")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True, help="GPU index to check and build for.")
@stage_plan_options(
    when="With stages", stages_type=click.STRING, devices=True, min_seq=2,
    gpus_help="GPUs to spread the stages over (stage i on GPU i mod N; default: the GPUs here).",
    stages_help="Build a Hugging Face checkpoint as pipeline stages (decode graphs, one build folder per stage, "
                "pipeline.json in -o); a stage export folder given as MODEL is built as its stages.")
@click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS",
              help="With stages: build each stage as a Ray task on a node with its own GPU (needs dsa-export[ray]).")
@click.option("--graph", type=click.Choice(["decode", "paged"]), default=None,
              help="With --stages from a checkpoint: the stages' graph (default decode; paged: cache pools written "
                   "in place, ragged batches, last-token logits).")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True,
              help="With --graph paged: what the cache pools store (auto: the graph's dtype; fp8: FP8 values with "
                   "float32 scales; see `dsa-export export --help`); fp8 builds need --backend onnxruntime until TensorRT "
                   "gets the FP8 cache plugin.")
@click.option("--prefill-chunk", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --stages and a paged graph: the most prompt tokens per row one prefill call takes (the "
                   "prefill profile's sequence max; default --max-seq). The engines' activations are sized for N "
                   "tokens, and generate, serve and the C++ runtime feed longer prompts in chunks of N.")
@json_options
def command(model: str | None, output: Path, precision: str | None, backend: str, min_shapes: str | None,
            opt_shapes: str | None, max_shapes: str | None, plugin_library: Path | None, timing_cache: Path | None,
            version_compatible: bool, hardware_compatibility: str, optimization_level: int,
            rtx_targets: tuple[str, ...], calibration_data: str | None, skip_checks: bool, no_validate: bool,
            force: bool, device: int, stage_plan: StagePlanOptions, ray_address: str | None, graph: str | None,
            kv_cache_dtype: str, prefill_chunk: int | None, as_json: bool, json_out: Path | None) -> None:
    """Build MODEL (default: the built-in demo) into engines, an ONNX Runtime artifact and a manifest.

    MODEL is what `dsa-export export` takes, or an exported .onnx (the export step is then skipped;
    a Python factory the file records is not run, so the validate step is skipped for it).
    Stages: export -> validate -> calibrate (int8/fp8) -> check -> engine. Everything lands in OUTPUT
    at once at the end; a failure, Ctrl-C or SIGTERM leaves OUTPUT as it was (exit 130 on a signal).

    With --stages (or a stage export folder as MODEL) the model is built as pipeline stages: one
    build folder per stage (prefill and decode profiles, one shared timing cache) and
    OUTPUT/pipeline.json; each stage lands whole, and a stage that did not change is kept.
    """
    from dsa_export.artifact import BuildSettings, build, parse_shape_ranges
    from dsa_export.quiet import user_stderr

    check_outputs((json_out, "--json-out"), inputs=(Path(model) if model else None,))
    settings = BuildSettings(
        model=model, output=output, precision=precision, backend=backend,
        ranges=parse_shape_ranges(min_shapes, opt_shapes, max_shapes),
        plugin_library=plugin_library, timing_cache=timing_cache, version_compatible=version_compatible,
        hardware_compatibility=hardware_compatibility, optimization_level=optimization_level,
        rtx_targets=tuple(rtx_targets) or None, skip_checks=skip_checks,
        validate=not no_validate, calibration_data=calibration_data, force=force, device=device,
    )
    staged = stage_plan.stages is not None or (model is not None and (Path(model) / "pipeline.json").is_file())
    if not staged and any(v is not None for v in (stage_plan.gpu_memory, stage_plan.gpus, stage_plan.devices,
                                                  ray_address, graph)):
        raise click.UsageError("--gpu-memory, --gpus, --devices, --ray and --graph apply to stage builds; add --stages.")
    if prefill_chunk is not None and not staged:
        raise click.UsageError("--prefill-chunk applies to stage builds of paged graphs (a single build takes its "
                               "prefill length from --max-shapes sequence=N); add --stages N --graph paged.")
    from dsa_export.hf.model import check_kv_cache

    kv_cache = check_kv_cache(kv_cache_dtype, graph, fix="add --stages N --graph paged")
    if staged:
        _build_stages(model, output, settings, stage_plan, ray_address, graph, kv_cache, as_json, json_out,
                      prefill_chunk)
        return
    # SIGINT and SIGTERM are taken by the CLI's main thread (dsa_export.interrupts): no partial OUTPUT.
    result = build(settings, log=lambda line: click.echo(line, file=user_stderr()))
    say(result.summary_table(), as_json)
    emit_report({"output": str(result.output), "seconds": round(result.seconds, 2),
                 "steps": [vars(step) for step in result.steps], "manifest": result.manifest}, as_json, json_out)


def _build_stages(model, output, settings, stage_plan: StagePlanOptions, ray_address, graph, kv_cache, as_json,
                  json_out, prefill_chunk: int | None = None) -> None:
    import time

    from dsa_export.quiet import user_stderr
    from dsa_export.stages.builder import build_stages, stage_build_table
    from dsa_export.trt.profiles import DEFAULT_RANGE

    if model is None:
        raise click.UsageError("a stage build needs MODEL: a Hugging Face checkpoint directory or a stage export folder.")
    if graph is not None and stage_plan.stages is None:
        raise click.UsageError("--graph applies when building a checkpoint with --stages; a stage export folder keeps "
                               "the graph it was exported with.")
    if settings.ranges != DEFAULT_RANGE:
        raise click.UsageError("--min/--opt/--max-shapes do not apply to stage builds: their prefill and decode "
                               "profiles come from --max-batch and --max-seq.")
    count = stage_plan.stage_count()
    device_list = stage_plan.device_list()
    # int8/fp8 stages are calibrated on ONNX Runtime's CPU provider: they are exported in fp32 (FP8
    # checkpoint weights stay FP8), like the single-file build's calibration input.
    dtype = settings.precision if settings.precision in ("fp32", "fp16", "bf16") else (
        "fp32" if settings.precision in ("int8", "fp8") else None)
    began = time.perf_counter()
    pipeline, outcomes, report = build_stages(
        model, output, settings, stages=count, gpu_memory=stage_plan.gpu_memory, gpus=stage_plan.gpus,
        max_batch=stage_plan.max_batch, max_seq=stage_plan.max_seq, devices=device_list, ray=ray_address, dtype=dtype,
        graph=graph or "decode", kv_cache=kv_cache, prefill_chunk=prefill_chunk,
        say=lambda line: click.echo(line, file=user_stderr()))
    seconds = time.perf_counter() - began
    say(stage_build_table(outcomes) + f"\nBuilt {len(outcomes)} stages into {output} in {seconds:.1f} s; see "
        f"{output / 'pipeline.json'}.", as_json)
    if report is not None:
        say(report.table(), as_json)
    emit_report({"output": str(output), "seconds": round(seconds, 2), "stages": [vars(o) for o in outcomes],
                 "pipeline": pipeline.to_dict(), "pipeline_report": report.to_dict() if report is not None else None},
                as_json, json_out)
    if report is not None and not report.passed:
        # As `calibrate` does with a failing report: everything is written and shown, then exit 1.
        from dsa_export.errors import DSAUserError
        from dsa_export.stages.calibration import CALIBRATION_DIR
        from dsa_export.stages.report import REPORT_NAME, failure_sentence

        raise DSAUserError(failure_sentence(report, output / CALIBRATION_DIR / REPORT_NAME))
