"""Export a checkpoint as pipeline stages: one ONNX file per stage and ``pipeline.json`` on top.

The stage split comes from the planner (:func:`dsa_export.stages.plan.plan_stages`: contiguous layer
ranges that fit a GPU, or N balanced stages). Stages are exported one at a time, each streamed from
the safetensors (about one layer plus one tensor block in memory, whatever the model), into
``DIR/stage_KK/model.onnx`` (+ ``model.onnx.data``). ``pipeline.json`` is rewritten atomically
after every stage, so an interrupted run keeps what it finished: a stage whose key (model
reference, settings, tool version) is unchanged and whose files still match their recorded sizes
and sha256 is kept, not exported again. A run that stops (Ctrl-C, SIGTERM, an error) before its
first stage is complete removes the output folder again if it created it: nothing is left that a
later run could resume from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from dsa_export import __version__, interrupts
from dsa_export.errors import DSAUserError
from dsa_export.export.settings import ExportSettings
from dsa_export.fileio import make_parents, sha256_file
from dsa_export.integrity import remember_hashes
from dsa_export.manifest import ONNX_NAME, TensorSpec, write_manifest
from dsa_export.stages.plan import DEFAULT_MAX_SEQ
from dsa_export.stages.record import PIPELINE_NAME, Pipeline, StageFiles, StageLink, read_pipeline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageExportSettings:
    """How to cut and export the stages.

    Attributes:
        stages: ``"auto"`` (fewest stages that fit ``gpu_memory``) or a stage count.
        gpu_memory: memory of one GPU (bytes or text such as ``"141GiB"``); None with a stage
            count: no fit check.
        gpus: GPUs available (a plan needing more is refused).
        max_batch, max_seq: the profile maximum the caches and activations are planned for.
        graph: ``prefill``, ``decode`` or ``paged``.
        prefill_chunk: paged graphs: prompt tokens per row and prefill call the stages will be
            built for (``build --prefill-chunk``); the plan sizes activations for one such call.
        dequantize_fp8: write FP8 checkpoints' weights dequantized (in ``export.dtype``).
        kv_cache: ``fp8`` for FP8 cache pools (paged graphs), empty for the graph's dtype.
        export: settings of each stage's export.
    """

    stages: str | int = "auto"
    gpu_memory: int | str | None = None
    gpus: int | None = None
    max_batch: int = 1
    max_seq: int = DEFAULT_MAX_SEQ
    graph: str = "prefill"
    prefill_chunk: int | None = None
    dequantize_fp8: bool = False
    kv_cache: str = ""
    export: ExportSettings = field(default_factory=ExportSettings)


@dataclass
class StageOutcome:
    index: int
    layers: tuple[int, int]
    status: str  # "exported" | "kept"
    seconds: float
    weight_bytes: int
    checkpoint_bytes: int


def _stage_dir(index: int) -> str:
    return f"stage_{index:02d}"


def _checkpoint_bytes(checkpoint, start: int, stop: int, embed: bool, head: bool) -> int:
    prefixes = tuple(f"model.layers.{i}." for i in range(start, stop))
    if embed:
        prefixes += ("model.embed_tokens.",)
    if head:
        prefixes += ("model.norm.", "lm_head.")
    return sum(t.nbytes for key, t in checkpoint.tensors.items() if key.startswith(prefixes))


def _io_specs(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The stage's inputs and outputs as pipeline.json records them: by the code that writes a
    build's manifest (:func:`dsa_export.manifest.io_specs`, token-id ranges included)."""
    import onnx

    from dsa_export.manifest import io_specs

    return io_specs(onnx.load(str(path), load_external_data=False))


def _links(stages: list[StageFiles]) -> list[StageLink]:
    links = []
    for before, after in zip(stages, stages[1:]):
        produced = {t.name for t in before.outputs}
        if "hidden_states_out" in produced:
            links.append(StageLink(before.index, after.index, "hidden_states_out", "hidden_states"))
        if "topk_indices" in produced:
            links.append(StageLink(before.index, after.index, "topk_indices", "prev_topk_indices"))
    return links


def _kept(entry: StageFiles | None, key: str, folder: Path) -> bool:
    """A finished stage from an earlier run with the same key whose files are intact (checked as
    every reader checks them: :meth:`StageFiles.verify`)."""
    if entry is None or entry.key != key or set(entry.sha256) != set(entry.sizes):
        return False
    try:
        entry.verify(folder)
    except DSAUserError as exc:
        log.info("exporting stage %d again: %s", entry.index, exc)
        return False
    return True


def export_stages(checkpoint_dir: str | Path, out_dir: str | Path, settings: StageExportSettings = StageExportSettings(),
                  *, progress: bool = True) -> tuple[Pipeline, list[StageOutcome]]:
    """Plan, then export every stage of ``checkpoint_dir`` into ``out_dir``; returns the pipeline."""
    from dsa_export.hf.loader import inspect_checkpoint
    from dsa_export.stages.plan import plan_stages

    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    ckpt = inspect_checkpoint(checkpoint_dir)
    if settings.dequantize_fp8 and not ckpt.fp8:
        raise DSAUserError(f"'{checkpoint_dir}' stores no FP8 weights; drop --dequantize-fp8.")
    explicit = settings.gpu_memory is not None
    # One handle for the whole command: config.json is read once here and every shard header once
    # (by the planner's first use of ckpt.weights); the references and stage exports reuse both.
    plan = plan_stages(ckpt, gpu_memory_bytes=settings.gpu_memory if explicit else 1 << 60,
                       stages=settings.stages, gpus=settings.gpus, max_batch=settings.max_batch,
                       max_seq=settings.max_seq, dtype=settings.export.dtype if settings.dequantize_fp8 or not ckpt.fp8
                       else None, cache_dtype=settings.kv_cache or None, strict=explicit, graph=settings.graph or "prefill",
                       prefill_chunk=settings.prefill_chunk)
    if settings.stages == "auto" and not explicit:
        raise DSAUserError("--stages auto needs --gpu-memory (e.g. 141GiB) to know what fits; pass it, or a stage "
                           "count such as --stages 4.")
    try:
        created = make_parents(out_dir)
    except OSError as exc:
        raise DSAUserError(f"cannot create the output folder '{out_dir}' ({exc.strerror}); choose another -o.") from exc
    if not created:
        return _export_stages(checkpoint_dir, out_dir, settings, progress, ckpt, plan, explicit)
    # The folders this run created (created[-1] is the outermost) are removed again until
    # pipeline.json records a finished stage: on an error or interrupt here, and by the interrupt
    # watchdog if the process has to be ended.
    registration = contextlib.ExitStack()
    registration.enter_context(interrupts.temporary(created[-1]))
    finished: list[bool] = []

    def first_stage_recorded() -> None:
        finished.append(True)
        registration.close()

    try:
        return _export_stages(checkpoint_dir, out_dir, settings, progress, ckpt, plan, explicit,
                              on_first_stage=first_stage_recorded)
    except BaseException:
        if not finished:
            interrupts.remove(created[-1])
        raise
    finally:
        registration.close()


def _export_stages(checkpoint_dir: Path, out_dir: Path, settings: StageExportSettings, progress: bool, ckpt, plan,
                   explicit: bool, on_first_stage=None) -> tuple[Pipeline, list[StageOutcome]]:
    from dsa_export.hf.source import hf_reference

    previous: dict[int, StageFiles] = {}
    if (out_dir / PIPELINE_NAME).is_file():
        try:
            previous = {s.index: s for s in read_pipeline(out_dir).stages}
        except DSAUserError as exc:
            log.warning("ignoring the existing %s (%s)", out_dir / PIPELINE_NAME, exc)
    checkpoint = ckpt.weights
    n = ckpt.num_layers
    whole = hf_reference(ckpt, graph=settings.graph, dequantize_fp8=settings.dequantize_fp8, kv_cache=settings.kv_cache)
    stages: list[StageFiles] = []
    outcomes: list[StageOutcome] = []
    plan_data = json.loads(plan.to_json())
    if not explicit:
        plan_data["gpu_memory_bytes"] = None  # no GPU size given: the stage count alone decided
    settings_record = {"ops": settings.export.ops, "dtype": settings.export.dtype, "opset": settings.export.opset,
                       "batch": settings.export.batch, "seq_len": settings.export.seq_len, "seed": settings.export.seed}
    for stage_plan in plan.stages:
        start, stop = stage_plan.start, stage_plan.stop
        embed, head = start == 0, stop == n
        reference = hf_reference(ckpt, graph=settings.graph, layers=(start, stop), embed=embed, head=head,
                                 dequantize_fp8=settings.dequantize_fp8, kv_cache=settings.kv_cache)
        key = hashlib.sha256(json.dumps({"reference": reference.to_json(), "settings": settings_record,
                                         "tool": __version__}, sort_keys=True).encode()).hexdigest()
        folder = _stage_dir(stage_plan.index)
        onnx_rel = f"{folder}/{ONNX_NAME}"
        began = time.perf_counter()
        entry = previous.get(stage_plan.index)
        if _kept(entry, key, out_dir):
            assert entry is not None
            stages.append(entry)
            outcomes.append(StageOutcome(entry.index, entry.layers, "kept", 0.0, entry.weight_bytes,
                                         entry.checkpoint_bytes))
            continue
        result = _export_one(reference, ckpt, settings, out_dir / onnx_rel, stage_plan.index, len(plan.stages),
                             stage_plan.weight_bytes if progress else None)
        data_rel = f"{onnx_rel}.data" if result.external_bytes else None
        sha = {onnx_rel: sha256_file(out_dir / onnx_rel)}
        sizes = {onnx_rel: (out_dir / onnx_rel).stat().st_size}
        if data_rel is not None:
            sha[data_rel] = result.data_sha256 or sha256_file(out_dir / data_rel)
            sizes[data_rel] = (out_dir / data_rel).stat().st_size
        remember_hashes(out_dir, sha)  # readers verify the stage against pipeline.json without hashing again
        inputs, outputs = _io_specs(out_dir / onnx_rel)
        ckpt_bytes = _checkpoint_bytes(checkpoint, start, stop, embed, head)
        entry = StageFiles(
            index=stage_plan.index, layers=(start, stop), embed=embed, head=head, onnx=onnx_rel, data=data_rel,
            sha256=sha, sizes=sizes, inputs=inputs, outputs=outputs, weight_bytes=result.weight_bytes,
            checkpoint_bytes=ckpt_bytes, key=key, plan=plan_data["stages"][stage_plan.index],
        )
        stages.append(entry)
        outcomes.append(StageOutcome(entry.index, entry.layers, "exported", time.perf_counter() - began,
                                     result.weight_bytes, ckpt_bytes))
        # Record progress after every stage: an interrupted run resumes from here.
        _write(out_dir, whole, ckpt, settings, plan_data, settings_record, stages + [
            s for i, s in sorted(previous.items()) if i > stage_plan.index])
        if on_first_stage is not None:
            on_first_stage()
            on_first_stage = None
    pipeline = _write(out_dir, whole, ckpt, settings, plan_data, settings_record, stages)
    return pipeline, outcomes


def _write(out_dir: Path, whole, ckpt, settings: StageExportSettings, plan_data: dict, settings_record: dict,
           stages: list[StageFiles]) -> Pipeline:
    reference = json.loads(whole.relative_to(out_dir.resolve()).to_json())
    pipeline = Pipeline(model=reference, model_type=ckpt.model_type, num_layers=ckpt.num_layers, graph=settings.graph,
                        settings=settings_record, plan=plan_data, stages=stages, links=_links(stages),
                        tool_version=__version__)
    write_manifest(pipeline.to_dict(), out_dir / PIPELINE_NAME)
    return pipeline


def _export_one(reference, ckpt, settings: StageExportSettings, path: Path, index: int, count: int,
                progress_bytes: int | None):
    import sys

    from dsa_export.errors import trace_errors
    from dsa_export.export.exporter import export_to_file
    from dsa_export.hf.source import hf_source
    from dsa_export.quiet import progress_bars, third_party_output

    source = hf_source(reference, batch=settings.export.batch, seq_len=settings.export.seq_len,
                       seed=settings.export.seed, dtype=settings.export.dtype, checkpoint=ckpt)
    bar = None
    if progress_bytes is not None:
        from tqdm import tqdm

        # The planner's weight bytes: what the stage writes, give or take precision-kept tensors.
        # Our own bar: made before third-party output is caught, so it keeps the real stderr.
        desc = f"stage {index + 1}/{count} layers {reference.layers[0]}:{reference.layers[1]}"
        if not progress_bars():  # a log, not a terminal: one line per stage instead of a bar
            print(f"{desc}: exporting ...", file=sys.stderr, flush=True)
        bar = tqdm(total=progress_bytes, unit="B", unit_scale=True, unit_divisor=1024, leave=True, file=sys.stderr,
                   disable=not progress_bars(), desc=desc)

    def step(name: str, nbytes: int) -> None:
        if bar is not None:
            if "layers." in name:
                bar.set_postfix_str(f"layer {name.split('layers.')[1].split('.')[0]}", refresh=False)
            bar.update(nbytes)

    try:
        from dsa_export import interrupts

        with interrupts.temporaries_of(path), trace_errors(source.spec), third_party_output():
            return export_to_file(source, settings.export, path, progress=step)
    finally:
        if bar is not None:
            bar.close()


def stage_table(outcomes: list[StageOutcome]) -> str:
    """One line per stage: layers, status, time, ONNX weight bytes next to the checkpoint's."""
    rows = [f"{'stage':>5}  {'layers':<9} {'status':<9} {'time':>8}  {'onnx weights':>12}  {'checkpoint':>12}"]
    for o in outcomes:
        rows.append(f"{o.index:>5}  {f'{o.layers[0]}:{o.layers[1]}':<9} {o.status:<9} {o.seconds:>7.1f}s  "
                    f"{human_bytes(o.weight_bytes):>12}  {human_bytes(o.checkpoint_bytes):>12}")
    return "\n".join(rows)


def human_bytes(n: int) -> str:
    """``12.3 GiB``, ``456.0 MiB``, ``789 B``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"

