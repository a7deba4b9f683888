"""``dsa-export calibrate``."""

from __future__ import annotations

from pathlib import Path

import click

from dsa_export.cli.options import check_outputs, emit_report, json_options, say
from dsa_export.errors import DSAUsageError


@click.command(name="calibrate")
@click.argument("onnx_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the Q/DQ .onnx file (written atomically).")
@click.option("--precision", type=click.Choice(["int8", "fp8"]), default=None,
              help="Quantized type (default: the recipe's; int8 without one).")
@click.option("--method", type=click.Choice(["entropy", "percentile", "minmax"]), default=None,
              help="How activation ranges are chosen (default: the recipe's; entropy without one).")
@click.option("--data", default=None, metavar="DIR|SCRIPT|builtin",
              help="A folder of .npz/.npy inputs, a Polygraphy data-loader script (file.py[:func]), "
                   "or 'builtin' for the recipe's bundled demo inputs.")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="Calibration samples taken from the data; the rest is held out for the report. When the data "
                   "holds fewer, all of it is used and a warning says so.")
@click.option("--percentile", type=click.FloatRange(0, 100, min_open=True), default=None,
              help="Kept share of |x| in percent, for --method percentile.")
@click.option("--exclude", multiple=True, metavar="PATTERN",
              help="Keep matching nodes (fnmatch on node, output or weight name) in high precision; repeatable.")
@click.option("--quantize-indexer/--no-quantize-indexer", default=None,
              help="Also put Q/DQ on the q and k inputs of every DSAIndexerTopK (default: the recipe's).")
@click.option("--keep-indexer-projections/--quantize-indexer-projections", default=None,
              help="Keep the indexer's q/k projections (wq_b, wk) in high precision (default: the recipe's).")
@click.option("--experts", type=click.Choice(["int8", "fp8", "keep"]), default=None,
              help="Routed MoE experts: int8 (per expert per output channel), fp8 (the FP8 experts op, block "
                   "scales per expert) or keep (high precision). Default: the recipe's, else --precision.")
@click.option("--fp8-activations", type=click.Choice(["static", "dynamic"]), default=None,
              help="FP8 activation scales: static (one calibrated scale per tensor) or dynamic (one per token and "
                   "128 channels, computed at run time, as DeepSeek runs its FP8 GEMMs). Default: the recipe's.")
@click.option("--fp8-weights", type=click.Choice(["channel", "block"]), default=None,
              help="FP8 weight scales with dynamic activations: channel (one per output channel) or block (one per "
                   "128x128 block, DeepSeek's weight format). Default: the recipe's.")
@click.option("--indexer-hadamard/--no-indexer-hadamard", default=None,
              help="With --quantize-indexer and dynamic FP8: rotate the indexer's q and k by a Hadamard matrix "
                   "before quantizing them, as DeepSeek-V3.2's indexer does. Default: the recipe's.")
@click.option("--recipe", type=click.Path(dir_okay=False), default=None,
              help="A calibration recipe (default: the bundled one matching the file).")
@click.option("--cache", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write a TensorRT 10 INT8 calibration cache here.")
@click.option("--from-cache", type=click.Path(dir_okay=False), default=None,
              help="Take the INT8 scales from this TensorRT calibration cache instead of calibrating.")
@click.option("--trt-version", default="10.3.0", show_default=True,
              help="TensorRT version named in the cache header.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the accuracy report as JSON here.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
@json_options
def command(onnx_file: Path, output: Path, precision, method, data, samples, percentile, exclude,
            quantize_indexer, keep_indexer_projections, experts, fp8_activations, fp8_weights, indexer_hadamard,
            recipe, cache, from_cache, trt_version, report,
            progress, as_json, json_out) -> None:
    """Calibrate ONNX_FILE (an fp32 export) and write it with explicit QuantizeLinear/DequantizeLinear.

    Q/DQ goes on MatMul/Gemm inputs only (weights per-channel, activations per-tensor, both
    symmetric; or, for FP8 with --fp8-activations dynamic, activations per token and 128
    channels at run time and weights in 128x128 blocks); the routed MoE experts get per-expert weight quantization; the dsa attention
    nodes, softmax, norms, the indexer's head-weight path and the MoE routers stay in high
    precision. Prints the accuracy report (cosine, SQNR, top-k overlap per DSA layer, router
    agreement per MoE layer) and exits 1 when it fails its thresholds (the files are still
    written, for inspection).
    """
    from dsa_export.errors import DSAUserError
    from dsa_export.quantize import QuantizeSettings, quantize, save
    from dsa_export.quantize.cache import version_number
    from dsa_export.quiet import progress_bars

    targets = [p.resolve() for p in (output, cache, report, json_out) if p is not None]
    if onnx_file.resolve() in targets or len(set(targets)) != len(targets):
        raise DSAUsageError("the input and the -o/--cache/--report/--json-out paths must all differ.")
    check_outputs((output, "-o"), (cache, "--cache"), (report, "--report"), (json_out, "--json-out"))
    if data is None and from_cache is None:
        raise DSAUsageError("give calibration data with --data DIR|SCRIPT|builtin (or scales with --from-cache).")
    if (data not in (None, "builtin") and not (data.endswith(".py") or ".py:" in data) and Path(data).is_file()
            and Path(data).suffix not in (".npz", ".npy")):
        raise DSAUsageError(f"--data '{data}' is neither a folder of .npz/.npy inputs, one .npz/.npy file, a .py "
                            "data-loader script nor 'builtin'; pass one of those.")
    if cache is not None:
        try:
            version_number(trt_version)  # refuse a bad version before any work
        except DSAUserError as exc:
            raise DSAUsageError(f"--trt-version: {exc}") from exc
    settings = QuantizeSettings(
        precision=precision, method=method, data=data, samples=samples, percentile=percentile,
        exclude=tuple(exclude), quantize_indexer=quantize_indexer,
        keep_indexer_projections=keep_indexer_projections, experts=experts, fp8_activations=fp8_activations,
        fp8_weights=fp8_weights, indexer_hadamard=indexer_hadamard, recipe=recipe, from_cache=from_cache,
        progress=progress_bars() if progress is None else progress,
    )
    warnings: list[str] = []
    if samples is not None and from_cache is not None:
        warnings.append(f"--samples {samples} has no effect with --from-cache (the scales come from the cache; all "
                        "the data is held out for the report).")
    if cache is not None and (precision or "int8") != "int8":
        raise DSAUsageError("--cache writes INT8 scales for TensorRT 10; drop it or use --precision int8.")
    import onnxruntime

    from dsa_export.quiet import quiet_onnxruntime
    from dsa_export.stages.record import verify_recorded_onnx

    quiet_onnxruntime(onnxruntime)
    verify_recorded_onnx(onnx_file)
    result = quantize(onnx_file, settings)
    save(result, output, cache=cache, report=report, trt_version=trt_version)
    r = result.recipe
    if from_cache is None and result.calibration_samples < r.samples:
        asked = f"--samples {samples}" if samples is not None else f"the recipe's {r.samples} samples"
        warnings.append(f"{asked} asked for {r.samples} calibration samples but the data holds only "
                        f"{result.calibration_samples}; calibrated on all {result.calibration_samples}.")
    for warning in warnings:
        click.echo(f"Warning: {warning}", err=True)
    moe = result.placement.moe
    experts = ""
    if moe.routing:
        forms = {"int8": "int8 per expert per output channel", "fp8": "FP8 (e4m3) with per-expert block scales"}
        quantized = len(moe.targets)
        experts = (f"routed experts of {quantized} of {len(moe.routing)} MoE layers {forms[r.experts_mode]}, "
                   if quantized else f"routed experts of {len(moe.routing)} MoE layers kept in high precision, ")
    say(
        f"Wrote {output}: {r.precision} Q/DQ on {len(result.placement.targets)} MatMul/Gemm nodes "
        f"({len(result.placement.skipped)} kept in high precision), {experts}"
        + (f"scales from {from_cache}" if from_cache else
           "activation scales per token at run time" if r.dynamic else
           f"{r.method} over {result.calibration_samples} samples")
        + f", recipe '{r.name}'.", as_json
    )
    if cache is not None:
        say(f"Wrote {cache}: TensorRT {trt_version} INT8 calibration cache, {len(result.activation_scales)} tensors.",
            as_json)
    if result.report is not None:
        say(result.report.table(), as_json)
        if report is not None:
            say(f"Wrote {report}.", as_json)
    import json

    emit_report({
        "input": str(onnx_file), "output": str(output), "precision": r.precision, "method": r.method,
        "recipe": r.name, "quantized_nodes": len(result.placement.targets), "kept_nodes": len(result.placement.skipped),
        "calibration_samples": result.calibration_samples, "scales_from": str(from_cache) if from_cache else None,
        "cache": str(cache) if cache is not None else None, "report_file": str(report) if report is not None else None,
        "report": json.loads(result.report.to_json()) if result.report is not None else None,
        "samples_requested": r.samples if from_cache is None else None, "warnings": warnings,
    }, as_json, json_out)
    if result.report is not None:
        if not result.report.passed:
            raise DSAUserError("the quantized model fails its accuracy thresholds (see the table above).")
