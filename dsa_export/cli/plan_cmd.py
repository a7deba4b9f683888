"""``dsa-export plan``: how to split a checkpoint into pipeline stages, one per GPU.

Plain arithmetic over config.json and the safetensors headers (see ``dsa_export.stages.plan``): no
torch, transformers or onnx is imported, so it answers in about a second for a 671B model.
"""

from __future__ import annotations

from pathlib import Path

import click

from dsa_export.cli.options import StageCount, StagePlanOptions, stage_plan_options
from dsa_export.errors import DSAUserError
from dsa_export.stages.plan import DTYPE_BYTES, StagesDoNotFit, plan_stages

_DTYPES = ["auto", *DTYPE_BYTES]


@click.command(name="plan")
@click.argument("hf_dir", type=click.Path(path_type=Path))
@stage_plan_options(stages_default="auto", require_gpu_memory=True,
                    stages_help="auto: the fewest stages that fit, balanced; N: N stages with the smallest largest "
                                "stage.")
@click.option("--dtype", type=click.Choice(_DTYPES), default="auto", show_default=True,
              help="Weights as an export with --dtype writes them; auto keeps the checkpoint's (FP8 stays FP8).")
@click.option("--cache-dtype", type=click.Choice([*_DTYPES, "fp8"]), default="auto", show_default=True,
              help="Decode cache dtype; auto follows the activations (bf16 for FP8/bf16 checkpoints); fp8: the "
                   "paged graph's FP8 pools (--graph paged; build --kv-cache-dtype fp8).")
@click.option("--reserve", default="2GiB", show_default=True, metavar="SIZE",
              help="Per-GPU reserve for the CUDA context, TensorRT scratch and allocator slack.")
@click.option("--graph", type=click.Choice(["decode", "paged"]), default="decode", show_default=True,
              help="The stages' graph: decode (a prefill returns every position's logits) or paged (the serving "
                   "graph: last-token logits).")
@click.option("--prefill-chunk", type=int, default=None, metavar="N",
              help="Paged graphs: prompt tokens per row and prefill call (as build --prefill-chunk); activations "
                   "are those of one such call. Default: the whole --max-seq prompt in one call.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def command(hf_dir: Path, stage_plan: StagePlanOptions, dtype: str, cache_dtype: str, reserve: str, graph: str,
            prefill_chunk: int | None, as_json: bool) -> None:
    """Split the checkpoint HF_DIR (or its config.json) into contiguous pipeline stages that fit one GPU each.

    Each stage's total is its weights (exact from the safetensors headers when all shards are
    present, else from config.json) + its decode caches for --max-batch rows of --max-seq tokens +
    the activations of a --max-seq prefill (--graph paged --prefill-chunk N: of an N-token prefill
    call) + --reserve. Formulas: docs/plan.md.
    """
    stages = stage_plan.stages
    kwargs = dict(
        gpu_memory_bytes=stage_plan.gpu_memory, stages=stages, gpus=stage_plan.gpus, max_batch=stage_plan.max_batch,
        max_seq=stage_plan.max_seq,
        dtype=None if dtype == "auto" else dtype, cache_dtype=None if cache_dtype == "auto" else cache_dtype,
        reserve_bytes=reserve, graph=graph, prefill_chunk=prefill_chunk,
    )
    # The checkpoint is untrusted: plan_stages checks config.json field by field (and refuses a
    # model too large to plan by arithmetic) before any work; those refusals pass straight through.
    try:
        plan = plan_stages(hf_dir, **kwargs)
    except StagesDoNotFit as exc:
        if stages == "auto":
            raise
        # A stage count that does not fit: show what it would take, then fail.
        try:
            plan = plan_stages(hf_dir, **kwargs, strict=False)
        except DSAUserError:
            raise exc from None
        click.echo(plan.to_json() if as_json else plan.render_table())
        raise
    click.echo(plan.to_json() if as_json else plan.render_table())


__all__ = ["StageCount", "command"]  # StageCount lives in dsa_export.cli.options; still importable here
