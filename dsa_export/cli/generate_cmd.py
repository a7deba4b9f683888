"""``dsa-export generate``."""

from __future__ import annotations

from pathlib import Path

import click

from dsa_export.cli.options import check_outputs, emit_report, json_options
from dsa_export.runtime.session import RUNTIME_CHOICES


@click.command(name="generate")
@click.argument("model_dir", metavar="DIR", type=click.Path(exists=True, path_type=Path))
@click.option("--prompt", "prompts", multiple=True,
              help="Text to continue (tokenized with the checkpoint's tokenizer.json); repeat for a batch (prompts of "
                   "different lengths need a paged graph).")
@click.option("--prompt-file", "prompt_file", type=click.File("r", encoding="utf-8"), default=None,
              help="Read the prompt text from FILE ('-': standard input), for prompts too long for a command line.")
@click.option("--input-ids", "input_ids", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Token ids to continue instead of --prompt: a .npy of integers, shape [B, L] (or [L]), or a .json "
                   "list of id lists (of different lengths over a paged graph).")
@click.option("--tokenizer", type=click.Path(exists=True, path_type=Path), default=None,
              help="tokenizer.json (or its folder); default: the one of the checkpoint the build came from.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="0: greedy (transformers' do_sample=False); otherwise sample from softmax(logits / T).")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
              help="With --temperature: sample among the most likely tokens whose probabilities add up to P.")
@click.option("--seed", type=int, default=None, help="Seed of the sampling (default: fresh).")
@click.option("--runtime", type=click.Choice(RUNTIME_CHOICES), default="auto", show_default=True,
              help="auto: each stage's engine where it can run here, else its ONNX Runtime artifact.")
@click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS",
              help="Run each stage in a Ray actor (one GPU each where the cluster has GPUs); needs dsa-export[ray].")
@click.option("--micro-batches", type=click.IntRange(min=1), default=1, show_default=True,
              help="Split the batch into parts that flow through the stages one after the other (stages overlap).")
@click.option("--prefill-chunk", type=click.IntRange(min=1), default=None,
              help="Feed each prompt in calls of at most N tokens (paged graphs): bounds the prefill's memory.")
@click.option("--no-verify", is_flag=True, help="Open the files without checking their recorded sizes and sha256.")
@json_options
def command(model_dir: Path, prompts: tuple[str, ...], prompt_file, input_ids: Path | None, tokenizer: Path | None,
            max_new_tokens: int, temperature: float, top_p: float, seed: int | None, runtime: str,
            ray_address: str | None, micro_batches: int, prefill_chunk: int | None, no_verify: bool, as_json: bool,
            json_out: Path | None) -> None:
    """Generate tokens from DIR: a stage build or stage export (pipeline.json), a build folder or a
    decode- or paged-graph .onnx (a paged graph takes prompts of different lengths).

    Prefill feeds the prompt with empty caches, then decode feeds one token per step; each stage
    keeps its own caches. Tokens are printed as they come (text with one --prompt, ids with
    --input-ids; several prompts print each continuation at the end); prefill and decode tokens/s
    go to stderr. --json prints the generated ids and the timings as one JSON object on stdout
    instead.
    """
    import numpy as np

    from dsa_export.runtime import generate as gen

    if sum(bool(x) for x in (prompts, prompt_file is not None, input_ids is not None)) != 1:
        raise click.UsageError("give the prompt as --prompt TEXT, --prompt-file FILE or --input-ids FILE (one of "
                               "them).")
    texts = list(prompts)
    if prompt_file is not None:
        try:
            texts = [prompt_file.read()]
        except UnicodeDecodeError as exc:
            raise click.UsageError(f"--prompt-file is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
    if temperature == 0 and (top_p != 1.0 or seed is not None):
        raise click.UsageError("--top-p and --seed apply to sampling; add --temperature T (> 0).")
    check_outputs((json_out, "--json-out"))
    record = pipeline_record(model_dir)  # pipeline.json, read once for the tokenizer and the stages
    checkpoint = gen.checkpoint_dir(model_dir, record)
    text_stream = None
    if texts:
        if tokenizer is None and checkpoint is None:
            recorded = gen.recorded_checkpoint(model_dir, record)
            if recorded is not None:
                raise click.UsageError(f"{model_dir} was made from the checkpoint {recorded}, which is not there any "
                                       "more (a copied or moved build); pass its tokenizer with --tokenizer FILE, or "
                                       "token ids with --input-ids.")
            raise click.UsageError(f"{model_dir} records no Hugging Face checkpoint to take a tokenizer from; pass "
                                   "--tokenizer FILE or token ids with --input-ids.")
        tok = gen.load_tokenizer(tokenizer or checkpoint)  # type: ignore[arg-type]
        ids = [np.asarray(tok.encode(text).ids, dtype=np.int64) for text in texts]
        if any(row.size == 0 for row in ids):
            raise click.UsageError("a --prompt encodes to no tokens; give some text.")
        text_stream = gen.TextStream(tok, ids)
    else:
        ids = gen.read_input_ids(input_ids)  # type: ignore[arg-type]
    streaming = not as_json and (text_stream is None or len(ids) == 1)
    eos, pad = gen.end_of_sequence(checkpoint)
    settings = gen.SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                                    eos_token_ids=eos, pad_token_id=pad, micro_batches=micro_batches,
                                    prefill_chunk=prefill_chunk)
    model = _open(model_dir, runtime, ray_address, not no_verify, record)
    try:
        gen.require_decode_graph(model)
        for note in model.notes:
            click.echo(note, err=True)

        def stream(chosen) -> None:
            if text_stream is not None:
                pieces = text_stream.push(chosen)
                if streaming:
                    click.echo(pieces[0], nl=False)
            elif streaming:
                click.echo(" ".join(str(int(t)) for t in chosen))

        if text_stream is not None and streaming:
            click.echo(texts[0], nl=False)
        result = gen.generate(model, ids, settings, on_tokens=stream)
    finally:
        model.close()
    if text_stream is not None:
        tails = text_stream.flush()
        if streaming:
            click.echo(tails[0])
        elif not as_json:
            for row, text in enumerate(texts):
                click.echo(f"[{row}] {text}{text_stream.generated(row)}")
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    batch = result.tokens.shape[0]
    timing = (f"prefill: {result.prompt_tokens} tokens in {result.prefill_seconds:.3f} s "
              f"({result.prefill_tokens_per_s:.1f} tokens/s); decode: {batch * result.steps} tokens in "
              f"{result.decode_seconds:.3f} s ({result.decode_tokens_per_s:.1f} tokens/s)")
    click.echo(timing, err=True)
    report = {"model": str(model_dir), "runtime": model.kind, "prompt_ids": [list(map(int, row)) for row in ids],
              **result.to_dict()}
    if text_stream is not None:
        report["text"] = text_stream.generated()
        if len(ids) > 1:
            report["texts"] = [text_stream.generated(row) for row in range(len(ids))]
    emit_report(report, as_json, json_out)


def pipeline_record(model_dir: Path):
    """The :class:`~dsa_export.stages.record.Pipeline` of a pipeline folder (read and checked once
    per command), None for one model."""
    from dsa_export.stages.record import read_pipeline
    from dsa_export.stages.session import is_pipeline

    return read_pipeline(model_dir) if is_pipeline(model_dir) else None


def _open(model_dir: Path, runtime: str, ray_address: str | None, verify: bool, record=None):
    from dsa_export.stages.session import PipelineSession, is_pipeline

    if record is not None or is_pipeline(model_dir):
        if ray_address is not None:
            from dsa_export.stages.ray_actors import open_on_ray

            return open_on_ray(model_dir, ray_address, runtime, verify=verify, pipeline=record)
        return PipelineSession.open(model_dir, runtime, verify=verify, pipeline=record)
    if ray_address is not None:
        raise click.UsageError(f"--ray runs pipeline stages; {model_dir} is one model (no pipeline.json).")
    from dsa_export.runtime import load

    return PipelineSession.of_session(load(model_dir, runtime, verify=verify))
