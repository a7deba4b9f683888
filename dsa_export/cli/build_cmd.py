"""``dsa-export build``."""

from __future__ import annotations

from pathlib import Path

import click

from dsa_export.build.settings import BACKENDS, HARDWARE_COMPATIBILITY, PRECISIONS
from dsa_export.cli.options import RTX_TARGET, check_outputs, emit_report, json_options, say


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
@click.option("--calibration-data", default=None, help="int8/fp8: calibration data (default: the model's bundled data).")
@click.option("--skip-checks", is_flag=True, help="Build even when the compatibility checks find a blocking problem.")
@click.option("--no-validate", is_flag=True, help="Skip the ONNX Runtime vs torch validation stage.")
@click.option("--force", is_flag=True, help="Replace a non-empty OUTPUT folder that holds no previous build.")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True, help="GPU index to check and build for.")
@json_options
def command(model: str | None, output: Path, precision: str | None, backend: str, min_shapes: str | None,
            opt_shapes: str | None, max_shapes: str | None, plugin_library: Path | None, timing_cache: Path | None,
            version_compatible: bool, hardware_compatibility: str, optimization_level: int,
            rtx_targets: tuple[str, ...], calibration_data: str | None, skip_checks: bool, no_validate: bool,
            force: bool, device: int, as_json: bool, json_out: Path | None) -> None:
    """Build MODEL (default: the built-in demo) into engines, an ONNX Runtime artifact and a manifest.

    MODEL is what `dsa-export export` takes, or an exported .onnx (the export stage is then skipped;
    a Python factory the file records is not run, so the validate stage is skipped for it).
    Stages: export -> validate -> calibrate (int8/fp8) -> check -> engine. Everything lands in OUTPUT
    at once at the end; a failure, Ctrl-C or SIGTERM leaves OUTPUT as it was (exit 130 on a signal).
    """
    from dsa_export.build import BuildSettings, build, parse_shape_ranges

    check_outputs((json_out, "--json-out"), inputs=(Path(model) if model else None,))
    settings = BuildSettings(
        model=model, output=output, precision=precision, backend=backend,
        ranges=parse_shape_ranges(min_shapes, opt_shapes, max_shapes),
        plugin_library=plugin_library, timing_cache=timing_cache, version_compatible=version_compatible,
        hardware_compatibility=hardware_compatibility, optimization_level=optimization_level,
        rtx_targets=tuple(rtx_targets) or None, skip_checks=skip_checks,
        validate=not no_validate, calibration_data=calibration_data, force=force, device=device,
    )
    # SIGINT and SIGTERM are taken by the CLI's main thread (dsa_export.interrupts): no partial OUTPUT.
    result = build(settings, log=lambda line: click.echo(line, err=True))
    say(result.summary_table(), as_json)
    emit_report({"output": str(result.output), "seconds": round(result.seconds, 2),
                 "stages": [vars(stage) for stage in result.stages], "manifest": result.manifest}, as_json, json_out)
