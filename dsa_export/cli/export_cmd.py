"""``dsa-export export``."""

from __future__ import annotations

import time
from pathlib import Path

import click

from dsa_export.export.settings import DEFAULT_OPSET, DTYPES, OPS_MODES, SUPPORTED_OPSETS
from dsa_export.errors import DSAUsageError


@click.command(name="export")
@click.argument("model", required=False)
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the .onnx file (written atomically).")
@click.option("--ops", type=click.Choice(OPS_MODES), default="plugin", show_default=True,
              help="plugin: dsa custom nodes with function bodies; native: standard ONNX ops only.")
@click.option("--batch", type=click.IntRange(min=2), default=2, show_default=True,
              help="Batch of the traced example (the axis stays dynamic).")
@click.option("--seq-len", type=click.IntRange(min=2), default=64, show_default=True,
              help="Sequence length of the traced example (the axis stays dynamic).")
@click.option("--dtype", type=click.Choice(list(DTYPES)), default="fp32", show_default=True)
@click.option("--opset", type=click.IntRange(SUPPORTED_OPSETS.start, SUPPORTED_OPSETS.stop - 1),
              default=DEFAULT_OPSET, show_default=True, help="Standard-domain ONNX opset.")
@click.option("--graph", type=click.Choice(["prefill", "decode"]), default=None,
              help="Hugging Face models: prefill (default) or a decode step with explicit caches.")
@click.option("--layers", default=None, metavar="A:B",
              help="Hugging Face models: export decoder layers A..B-1 only (hidden states in and out).")
@click.option("--dequantize-fp8", is_flag=True, help="Hugging Face models stored in FP8: dequantize on load.")
def command(model: str | None, output: Path, ops: str, batch: int, seq_len: int, dtype: str, opset: int,
            graph: str | None, layers: str | None, dequantize_fp8: bool) -> None:
    """Export MODEL to ONNX with DSA custom ops.

    MODEL is a built-in model name (default: tiny), path/file.py:factory, where factory()
    returns (module, example_inputs) and may accept batch= and seq_len= keywords, or a local
    Hugging Face directory of a deepseek_v32 (DeepSeek-V3.2) or glm_moe_dsa (GLM-5) model.
    """
    from dsa_export.export import ExportSettings, export_model, save_model
    from dsa_export.sources import resolve

    if model and ":" in model and Path(model.rsplit(":", 1)[0]).resolve() == output.resolve():
        raise DSAUsageError("the output path is the model file itself; choose another -o.")
    if model and Path(model).is_dir():
        from dsa_export.hf.loader import inspect_checkpoint
        from dsa_export.hf.source import format_spec, parse_layers

        ckpt = inspect_checkpoint(model)
        span = parse_layers(layers, ckpt.num_layers) if layers else None
        model = format_spec(model, graph or "prefill", span, dequantize_fp8)
    elif graph or layers or dequantize_fp8:
        raise DSAUsageError("--graph, --layers and --dequantize-fp8 apply to Hugging Face model directories only.")
    settings = ExportSettings(ops=ops, batch=batch, seq_len=seq_len, dtype=dtype, opset=opset)
    start = time.perf_counter()
    source = resolve(model, batch=batch, seq_len=seq_len, seed=settings.seed)
    onnx_model = export_model(source, settings)
    save_model(onnx_model, output)
    custom = sum(1 for n in onnx_model.graph.node if n.domain == "dsa")
    click.echo(
        f"Exported {source.spec} to {output} ({ops} ops, {custom} dsa nodes, {dtype}, opset {opset}) "
        f"in {time.perf_counter() - start:.1f} s."
    )
