"""Build a model cut into pipeline stages: one build folder (engine + ONNX Runtime artifact) per stage.

``dsa-export build HF_DIR --stages auto|N -o DIR`` exports the stages' decode graphs into
``DIR/export`` (:func:`dsa_export.stages.export.export_stages`, resumable), then builds each stage
into ``DIR/stage_KK`` with the ordinary build (:func:`dsa_export.artifact.build`: validate, check,
engine, ONNX Runtime artifact, each stage folder renamed into place when it is complete). A stage
export folder made earlier (``export --stages --graph decode``) can be given instead of HF_DIR.

Each stage's engine gets two optimization profiles (when the backend takes several): *prefill*
(the whole prompt, no past) and *decode* (one token, a past of up to ``max_seq - 1``); all stages
share one timing cache (``DIR/timing.cache``). ``DIR/pipeline.json`` lists the stages in order with
their build folder, GPU (``devices``, else stage ``i`` on GPU ``i mod gpus``), the tensors they hand
on (``links``), the caches they keep and the hashes of their files. It is rewritten after every
stage, so an interrupted build resumes: a stage whose ONNX files and build settings are unchanged
(its ``build_key``) and whose build folder still verifies is kept.

With ``--precision int8|fp8`` every stage is calibrated on what the float stages before it produce
(:mod:`dsa_export.stages.calibration`), and once all are built the quantized stages are run
chained against the float ones on the held-out calibration files
(:mod:`dsa_export.stages.report`, ``DIR/calibration/pipeline_report.json``).

With ``ray`` (an address, or ``auto``), every stage is built by a Ray task on a node with a GPU of
its own (``num_gpus=1`` when the cluster has GPUs: an engine must be built on the GPU type it runs
on); the folder must be on a filesystem every node sees at the same path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from dsa_export import __version__
from dsa_export.artifact.settings import BuildSettings
from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.hf.sizes import check_prefill_chunk
from dsa_export.manifest import MANIFEST_NAME, read_manifest, write_manifest
from dsa_export.stages.plan import DEFAULT_MAX_SEQ
from dsa_export.stages.record import PIPELINE_NAME, Pipeline, read_pipeline
from dsa_export.trt.profiles import ShapeRange

if TYPE_CHECKING:
    from dsa_export.stages.report import PipelineReport

log = logging.getLogger(__name__)

EXPORT_DIR = "export"
TIMING_CACHE = "timing.cache"


@dataclass
class StageBuildOutcome:
    index: int
    layers: tuple[int, int]
    device: int
    status: str  # "built" | "kept"
    seconds: float
    backends: list[str]


Dims = dict[str, tuple[int, int, int]]


def decode_profiles(max_batch: int, max_seq: int, opt_seq: int | None = None) -> tuple[Dims, Dims]:
    """(prefill, decode) min/opt/max of a stage's decode graph dims (batch, sequence,
    past_sequence, total_sequence)."""
    if max_seq < 2:
        raise DSAUsageError(f"--max-seq must be at least 2 (a prompt and one generated token); got {max_seq}.")
    opt = min(opt_seq or 128, max_seq - 1)
    batch = (1, 1, max_batch)
    prefill = {"batch": batch, "sequence": (1, opt, max_seq), "past_sequence": (0, 0, 0),
               "total_sequence": (1, opt, max_seq)}
    decode = {"batch": batch, "sequence": (1, 1, 1), "past_sequence": (1, opt, max_seq - 1),
              "total_sequence": (2, opt + 1, max_seq)}
    return prefill, decode


def _recorded_prefill_chunk(exported: Pipeline, folder: Path) -> int | None:
    """The ``--prefill-chunk`` a stage export was planned for (its plan in pipeline.json), or None."""
    chunk = exported.plan.get("prefill_chunk")
    if chunk is None:
        return None
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise DSAUserError(f"{folder / PIPELINE_NAME} records a prefill chunk of {chunk!r}, not a positive whole "
                           "number; export the stages again (or pass --prefill-chunk N).")
    return chunk


def paged_profiles(max_batch: int, max_seq: int, page: int, opt_seq: int | None = None,
                   prefill_chunk: int | None = None) -> tuple[Dims, Dims]:
    """(prefill, decode) min/opt/max of a paged graph's dims (batch, sequence, max_pages, pages):
    a block table of up to ``max_seq / page`` pages per row, and pools of up to twice the pages
    ``max_batch`` full sequences need (the stage's pools grow by doubling), plus the scratch page.
    ``prefill_chunk``: the prefill profile's sequence max (default ``max_seq``); longer prompts are
    fed in chunks of it, each reading the caches the earlier ones wrote."""
    if max_seq < 2:
        raise DSAUsageError(f"--max-seq must be at least 2 (a prompt and one generated token); got {max_seq}.")
    check_prefill_chunk(prefill_chunk, "paged")
    opt = min(opt_seq or 128, max_seq - 1)
    longest = min(prefill_chunk or max_seq, max_seq)
    blocks = -(-max_seq // page)
    opt_blocks = -(-opt // page)
    batch = (1, 1, max_batch)
    pages = (2, 1 + opt_blocks, 2 * (1 + max_batch * blocks))
    prefill = {"batch": batch, "sequence": (1, min(opt, longest), longest), "max_pages": (1, opt_blocks, blocks),
               "pages": pages}
    decode = {"batch": batch, "sequence": (1, 1, 1), "max_pages": (1, opt_blocks, blocks), "pages": pages}
    return prefill, decode


def combined(profiles: Sequence[Dims]) -> ShapeRange:
    """One range covering every profile (for backends that take one)."""
    dims: Dims = {}
    for profile in profiles:
        for name, (lo, opt, hi) in profile.items():
            old = dims.get(name)
            dims[name] = (lo, opt, hi) if old is None else (min(old[0], lo), max(old[1], opt), max(old[2], hi))
    return ShapeRange(dims)


def _visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _build_key(stage, settings: BuildSettings) -> str:
    """What a stage's build depends on: its files' hashes, the build settings, the tool version.

    Calibration feeds inside the stage build's folder (``calibration/<data digest>/stage_KK``) count
    by that relative path, which names the data by its digest: a stage build that was moved or
    copied keeps its stages on resume."""
    values = {k: str(v) for k, v in vars(settings).items() if k not in ("model", "output", "force", "timing_cache")}
    if settings.calibration_data and settings.output:
        with contextlib.suppress(ValueError):
            values["calibration_data"] = Path(settings.calibration_data).resolve().relative_to(
                Path(settings.output).resolve().parent).as_posix()
    record = {"files": stage.sha256, "tool": __version__, "settings": values}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _kept(folder: Path, previous, key: str) -> bool:
    if previous is None or previous.build_key != key or previous.build is None:
        return False
    build = folder / previous.build
    if not (build / MANIFEST_NAME).is_file():
        return False
    try:
        manifest = read_manifest(build)
        manifest.verify([manifest.artifact(name) for name in manifest.files])
    except DSAUserError as exc:
        log.info("building stage %d again: %s", previous.index, exc)
        return False
    return True


def build_one_stage(settings: BuildSettings) -> list[str]:
    """One stage's build (also the body of the Ray task); returns the backends built."""
    from dsa_export.artifact import build

    manifest = build(settings, log=lambda line: log.info("%s", line)).manifest
    engine = (manifest.get("engine") or {}).get("backend")
    return [name for name in (engine, "onnxruntime" if manifest.get("onnxruntime") else None) if name]


def _check_fp8_pool_backend(settings: BuildSettings) -> None:
    if settings.backend != "onnxruntime":
        raise DSAUsageError("FP8 cache pools (--kv-cache-dtype fp8) cannot be built into a TensorRT engine yet (it "
                            "takes no uint8 tensors inside a network; the in-place FP8 write needs the kernels' "
                            "plugin): build the stages with --backend onnxruntime.")


def build_stages(model: str | Path, output: str | Path, settings: BuildSettings, *, stages: str | int | None = None,
                 gpu_memory: str | int | None = None, gpus: int | None = None, max_batch: int = 1,
                 max_seq: int = DEFAULT_MAX_SEQ,
                 devices: Sequence[int] | None = None, ray: str | None = None, dtype: str | None = None,
                 graph: str = "decode", kv_cache: str = "", prefill_chunk: int | None = None,
                 say: Callable[[str], None] = print
                 ) -> tuple[Pipeline, list[StageBuildOutcome], PipelineReport | None]:
    """Export (from an HF directory, ``graph`` decode or paged) and build every stage of ``model``
    into ``output``. An int8/fp8 build also returns its whole-pipeline accuracy report
    (:mod:`dsa_export.stages.report`; None when no calibration file was held out), written
    to ``output/calibration/pipeline_report.json``; the caller decides what a failing one means."""
    from dsa_export.export.settings import ExportSettings
    from dsa_export.stages.export import StageExportSettings, export_stages

    model, output = Path(model), Path(output)
    if kv_cache == "fp8":
        _check_fp8_pool_backend(settings)
    if output.exists() and not output.is_dir():
        raise DSAUsageError(f"-o '{output}' is a file; -o takes a folder to build the stages into.")
    if output.is_dir() and any(output.iterdir()) and not (output / PIPELINE_NAME).is_file() and not settings.force:
        raise DSAUserError(f"{output} exists, is not empty and holds no stage build; choose another -o or pass --force.")
    if (model / "config.json").is_file():
        check_prefill_chunk(prefill_chunk, graph)
    if (model / PIPELINE_NAME).is_file():
        if stages is not None:
            raise DSAUsageError(f"{model} is already cut into stages; drop --stages (or give the checkpoint directory).")
        export_folder = model
        exported = read_pipeline(model)
        if any(stage.build is not None for stage in exported.stages):
            raise DSAUsageError(f"{model} is a stage build, not a stage export; pass its export/ folder or the checkpoint.")
        if prefill_chunk is None:  # the chunk the stages were planned for (export --prefill-chunk)
            prefill_chunk = _recorded_prefill_chunk(exported, model)
    elif (model / "config.json").is_file():
        if stages is None:
            raise DSAUsageError("building a checkpoint as pipeline stages needs --stages auto|N.")
        export_folder = output / EXPORT_DIR
        # Calibration (int8/fp8) quantizes float weights: an FP8 checkpoint's are dequantized for it
        # (the FP8 experts recipe gives DeepSeek's expert bytes back).
        from dsa_export.hf.loader import inspect_checkpoint

        dequantize = settings.precision in ("int8", "fp8") and inspect_checkpoint(model).fp8
        say(f"Exporting the stages of {model} into {export_folder} ...")
        exported, _ = export_stages(model, export_folder, StageExportSettings(
            stages=stages, gpu_memory=gpu_memory, gpus=gpus, max_batch=max_batch, max_seq=max_seq, graph=graph,
            prefill_chunk=prefill_chunk, dequantize_fp8=dequantize, kv_cache=kv_cache, export=ExportSettings(**({"dtype": dtype} if dtype else {}))), progress=False)
    else:
        raise DSAUserError(f"{model} is neither a Hugging Face checkpoint directory nor a stage export folder "
                           "(no config.json, no pipeline.json).")
    if any(spec.dtype == "uint8" and "_pool_" in spec.name for stage in exported.stages for spec in stage.inputs):
        _check_fp8_pool_backend(settings)
    check_prefill_chunk(prefill_chunk, exported.graph, fix="export the stages with --graph paged")
    if exported.graph not in ("decode", "paged"):
        raise DSAUserError(f"the stages in {export_folder} are {exported.graph} graphs; a stage build needs decode or "
                           "paged graphs (export them with --graph paged), so that generation can keep caches.")
    count = len(exported.stages)
    if devices is not None and len(devices) != count:
        raise DSAUsageError(f"--devices names {len(devices)} GPU(s) for {count} stages; give one per stage.")
    gpu_count = gpus or _visible_gpus() or 1
    previous = {}
    if (output / PIPELINE_NAME).is_file():
        try:
            previous = {s.index: s for s in read_pipeline(output).stages}
        except DSAUserError as exc:
            log.warning("ignoring the existing %s (%s)", output / PIPELINE_NAME, exc)
    if exported.graph == "paged":
        from dsa_export.runtime.paged import page_size

        prefill, decode = paged_profiles(max_batch, max_seq, page_size(exported.stages[0].inputs),
                                         prefill_chunk=prefill_chunk)
    else:
        prefill, decode = decode_profiles(max_batch, max_seq)
    calibration: list[Path] | None = None
    if settings.precision in ("int8", "fp8"):
        calibration = _calibration_feeds(export_folder, exported, settings, output, say)
    # The engine gets both profiles; the ONNX Runtime artifact (one range) takes their union.
    base = replace(settings, ranges=combined((prefill, decode)), profiles=(ShapeRange(prefill), ShapeRange(decode)),
                   timing_cache=output / TIMING_CACHE, force=True, model=None, output=output)
    output.mkdir(parents=True, exist_ok=True)
    rel_export = Path(os.path.relpath(export_folder.resolve(), output.resolve()))
    entries, outcomes, jobs = [], [], []
    for stage in exported.stages:
        device = int(devices[stage.index]) if devices is not None else stage.index % gpu_count
        folder = f"stage_{stage.index:02d}"
        stage_settings = replace(base, model=str(export_folder / stage.onnx), output=output / folder, device=device)
        if calibration is not None:  # each stage calibrates on the float outputs of the stages before it
            stage_settings = replace(stage_settings, calibration_data=str(calibration[stage.index]))
        key = _build_key(stage, stage_settings)
        entry = replace(stage, onnx=(rel_export / stage.onnx).as_posix(),
                        data=(rel_export / stage.data).as_posix() if stage.data else None,
                        sha256={(rel_export / k).as_posix(): v for k, v in stage.sha256.items()},
                        sizes={(rel_export / k).as_posix(): v for k, v in stage.sizes.items()},
                        build=folder, device=device, build_key=key)
        entries.append(entry)
        if _kept(output, previous.get(stage.index), key):
            outcomes.append(StageBuildOutcome(stage.index, stage.layers, device, "kept", 0.0, []))
            continue
        jobs.append((len(entries) - 1, stage_settings))
    pipeline = replace(exported, model=_relative_model(exported.model, export_folder, output), stages=entries)

    pending = {n for n, _ in jobs}

    def record(done: set[int]) -> None:
        # A stage not (re)built yet has no build key, so that a resumed build builds it.
        now = [entry if entry.index in done else replace(entry, build_key=None) for entry in entries]
        write_manifest(replace(pipeline, stages=now).to_dict(), output / PIPELINE_NAME)

    done = {entry.index for n, entry in enumerate(entries) if n not in pending}
    record(done)
    if ray is not None:
        outcomes += _build_on_ray(ray, jobs, entries, say)
        done |= {entries[n].index for n, _ in jobs}
    else:
        for n, stage_settings in jobs:
            entry = entries[n]
            say(f"Building stage {entry.index + 1}/{count} (layers {entry.layers[0]}:{entry.layers[1]}, GPU "
                f"{entry.device}) into {stage_settings.output} ...")
            began = time.perf_counter()
            backends = build_one_stage(stage_settings)
            outcomes.append(StageBuildOutcome(entry.index, entry.layers, entry.device, "built",
                                              time.perf_counter() - began, backends))
            done.add(entry.index)
            record(done)
    record(done)
    outcomes.sort(key=lambda o: o.index)
    report = None
    if calibration is not None:  # the quantized stages chained, against the float stages
        from dsa_export.stages.report import stage_build_report

        report = stage_build_report(export_folder, output, Path(str(settings.calibration_data)), calibration[0].parent,
                                    entries, kept=all(o.status == "kept" for o in outcomes), say=say)
    return replace(pipeline, stages=entries), outcomes, report


def _calibration_feeds(export_folder: Path, exported, settings: BuildSettings, output: Path,
                       say: Callable[[str], None]) -> list[Path]:
    """Every stage's calibration feeds, made from the user's token ids by running the exported
    stages in order (:mod:`dsa_export.stages.calibration`); kept under
    ``output/calibration/<digest of the data>/`` so that a resumed build reuses them."""
    from dsa_export.stages.calibration import CALIBRATION_DIR, data_digest, stage_calibration_data

    data = settings.calibration_data
    if not data or data == "builtin" or ".py" in data:
        raise DSAUsageError(f"--precision {settings.precision} of a stage build calibrates every stage on what the "
                            "stages before it produce: pass --calibration-data DIR, a folder of token ids (.npy [B, L] "
                            "or .npz with input_ids) of real text.")
    folder = Path(data)
    if not folder.is_dir():
        raise DSAUserError(f"--calibration-data '{folder}' is not a folder; a stage build calibrates from a folder of "
                           ".npy token ids ([B, L]) or .npz files with input_ids.")
    return stage_calibration_data(export_folder, exported, folder, output / CALIBRATION_DIR / data_digest(folder), say)


def _relative_model(model: dict, export_folder: Path, output: Path) -> dict:
    """The model record of the export, its relative path re-based on the build folder."""
    if not model.get("relative") or not model.get("path"):
        return dict(model)
    absolute = (export_folder / model["path"]).resolve()
    return {**model, "path": Path(os.path.relpath(absolute, output.resolve())).as_posix()}


def _build_on_ray(address: str, jobs, entries, say: Callable[[str], None]) -> list[StageBuildOutcome]:
    from dsa_export.stages.ray_actors import connect

    ray = connect(address)
    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    task = ray.remote(max_retries=0)(_timed_build)
    refs = []
    for n, stage_settings in jobs:
        entry = entries[n]
        say(f"Building stage {entry.index + 1}/{len(entries)} on Ray ({'one GPU' if gpus else 'CPU'}) ...")
        refs.append((entry, task.options(num_gpus=gpus, num_cpus=0 if gpus else 1).remote(
            replace(stage_settings, device=0))))
    outcomes = []
    for entry, ref in refs:
        try:
            seconds, backends = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, DSAUserError):
                raise DSAUserError(f"stage {entry.index}: {cause}") from None
            raise
        outcomes.append(StageBuildOutcome(entry.index, entry.layers, entry.device, "built", seconds, backends))
    return outcomes


def _timed_build(settings: BuildSettings) -> tuple[float, list[str]]:
    began = time.perf_counter()
    backends = build_one_stage(settings)
    return time.perf_counter() - began, backends


def stage_build_table(outcomes: list[StageBuildOutcome]) -> str:
    rows = [f"{'stage':>5}  {'layers':<9} {'GPU':>3}  {'status':<7} {'time':>8}  backends"]
    for o in outcomes:
        rows.append(f"{o.index:>5}  {f'{o.layers[0]}:{o.layers[1]}':<9} {o.device:>3}  {o.status:<7} "
                    f"{o.seconds:>7.1f}s  {', '.join(o.backends) or '-'}")
    return "\n".join(rows)


__all__ = ["StageBuildOutcome", "build_stages", "decode_profiles", "stage_build_table"]
