"""Calibration data for the stages of a pipeline, stage after stage.

Calibrating stage ``k`` (``build --stages N --precision int8|fp8``) needs the tensors stage ``k``
takes: the hidden states (and GLM-5's hand-over selections) that the stages before it produce for
the calibration prompts. :func:`stage_calibration_data` runs the exported stages in order on ONNX
Runtime's CPU provider, unquantized, one calibration sample at a time (memory: one sample's
activations and one stage's weights per session), and writes for every stage a folder of ``.npz``
feeds holding exactly that stage's inputs, which the single-file calibration then reads
(``--calibration-data`` of that stage's build). Each stage is calibrated on the float activations
of the stages before it, as a quantized pipeline is calibrated stage by stage.

The user's data is token ids: a folder of ``.npy`` files (``[B, L]`` or ``[L]`` integers) or
``.npz`` files with ``input_ids`` (and optionally ``attention_mask``). Over paged graphs every
sample is one prefill call (fresh pools holding just the sample's pages); over decode graphs the
first half of the sample fills the caches and the recorded call feeds the second half with that
past, so that the calibrated tensors include attention over cached keys.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dsa_export.errors import DSAUserError
from dsa_export.manifest import TensorSpec
from dsa_export.runtime.generate import read_input_ids
from dsa_export.stages.record import Pipeline

#: Where a stage build keeps its stages' calibration feeds (one folder per data digest).
CALIBRATION_DIR = "calibration"


def _samples(data: Path) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """(label, input_ids [B, L], attention_mask or None) of every file of ``data``."""
    if not data.is_dir():
        raise DSAUserError(f"--calibration-data '{data}' is not a folder; a stage build calibrates from a folder of "
                           ".npy token ids ([B, L]) or .npz files with input_ids.")
    files = sorted(p for p in data.iterdir() if p.suffix in (".npy", ".npz") and p.is_file())
    if not files:
        raise DSAUserError(f"--calibration-data '{data}' holds no .npy or .npz files; give token ids of real text.")
    samples = []
    for path in files:
        if path.suffix == ".npy":  # the same token-id files `generate --input-ids` reads
            samples.append((path.name, read_input_ids(path), None))
            continue
        try:
            with np.load(path, allow_pickle=False) as archive:
                if "input_ids" not in archive.files:
                    raise DSAUserError(f"calibration file '{path}' has no input_ids array; a stage build takes token "
                                       "ids (input_ids, optionally attention_mask).")
                ids = archive["input_ids"]
                mask = archive["attention_mask"] if "attention_mask" in archive.files else None
        except DSAUserError:
            raise
        except Exception as exc:  # numpy raises several kinds on a bad file
            raise DSAUserError(f"cannot read calibration file '{path}' ({type(exc).__name__}: {exc}).") from exc
        ids = ids[None, :] if ids.ndim == 1 else ids
        if ids.ndim != 2 or ids.shape[1] < 1 or not np.issubdtype(ids.dtype, np.integer):
            raise DSAUserError(f"calibration file '{path}' holds {ids.dtype} of shape {list(ids.shape)}; a stage build "
                               "takes integer token ids of shape [B, L].")
        if mask is not None and mask.shape != ids.shape:
            raise DSAUserError(f"calibration file '{path}': attention_mask {list(mask.shape)} does not match input_ids "
                               f"{list(ids.shape)}.")
        samples.append((path.name, ids.astype(np.int64), None if mask is None else mask.astype(np.int64)))
    return samples


def data_digest(data: Path) -> str:
    """A digest of the calibration files (names and bytes): stage builds calibrated from other data
    are built again."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(data).iterdir() if p.suffix in (".npy", ".npz") and p.is_file()):
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def _empty(spec: TensorSpec, sizes: dict[str, int]) -> np.ndarray:
    shape = [d if isinstance(d, int) else sizes[d] for d in spec.shape]
    return np.zeros(shape, dtype=np.float32 if spec.dtype == "bfloat16" else np.dtype(spec.dtype))


def _call_feeds(stage_inputs: list[TensorSpec], graph: str, ids: np.ndarray, mask: np.ndarray | None,
                page: int | None, past: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs of one call of ``ids`` that are not handed over by an earlier stage; ``past``:
    the stage's ``present_*`` caches of the call before (decode graphs), else empty caches."""
    batch, length = ids.shape
    feeds: dict[str, np.ndarray] = {"input_ids": ids}
    if graph == "paged":
        blocks = math.ceil(length / page)
        feeds["query_start"] = np.zeros(batch, np.int32)
        feeds["query_lengths"] = np.full(batch, length, np.int32)
        feeds["block_table"] = (1 + np.arange(batch * blocks, dtype=np.int32)).reshape(batch, blocks)
        sizes = {"pages": 1 + batch * blocks}
    else:
        before = next(iter(past.values())).shape[1] if past else 0
        total = before + length
        feeds["attention_mask"] = mask[:, :total] if mask is not None else np.ones((batch, total), np.int64)
        sizes = {"batch": batch, "past_sequence": 0}
    for spec in stage_inputs:
        if spec.name.startswith("past_"):
            feeds[spec.name] = past.get(spec.name) if spec.name in past else _empty(spec, sizes)
    return feeds


def stage_calibration_data(folder: Path, pipeline: Pipeline, data: Path, output: Path,
                           say: Callable[[str], None] = print) -> list[Path]:
    """Write ``output/stage_KK/*.npz`` (every stage's inputs for every sample of ``data``) and
    return those folders, in stage order. ``folder`` holds the exported stages of ``pipeline``."""
    from dsa_export.fileio import atomic_output
    from dsa_export.runtime.paged import page_size
    from dsa_export.stages.session import open_stage

    samples = _samples(Path(data))
    page = page_size(pipeline.stages[0].inputs) if pipeline.graph == "paged" else None
    folders = [output / f"stage_{stage.index:02d}" for stage in pipeline.stages]
    if all(f.is_dir() and len(list(f.glob("*.npz"))) == len(samples) for f in folders):
        say(f"Calibration feeds of the {len(folders)} stages are in {output} already.")
        return folders
    say(f"Running {len(samples)} calibration sample(s) through the {len(pipeline.stages)} exported stages "
        f"(float, ONNX Runtime CPU) to calibrate each stage on what the stages before it produce ...")
    sessions = []
    try:
        for stage in pipeline.stages:
            session = open_stage(folder, stage, "onnxruntime", 0)
            if any(spec.dtype == "bfloat16" for spec in session.inputs):
                raise DSAUserError("the exported stages are bf16, which ONNX Runtime's CPU provider cannot run to "
                                   "calibrate; export (or build) the stages with --dtype fp32.")
            sessions.append(session)
        for f in folders:
            f.mkdir(parents=True, exist_ok=True)
        for number, (label, ids, mask) in enumerate(samples):
            # A decode graph is calibrated on a call with a past: the first half of the sample fills
            # the caches, the second half is the call recorded (empty caches are no calibration input).
            if pipeline.graph == "decode":
                if ids.shape[1] < 2:
                    raise DSAUserError(f"calibration sample '{label}' has one token; give at least two per row.")
                half = ids.shape[1] // 2
                calls = [ids[:, :half], ids[:, half:]]
            else:
                calls = [ids]
            pasts: dict[int, dict[str, np.ndarray]] = {stage.index: {} for stage in pipeline.stages}
            for call, part in enumerate(calls):
                last = call == len(calls) - 1
                outputs: dict[int, dict[str, np.ndarray]] = {}
                for stage, session, target in zip(pipeline.stages, sessions, folders):
                    feeds = _call_feeds(stage.inputs, pipeline.graph, part, mask, page, pasts[stage.index])
                    for link in pipeline.links:
                        if link.target == stage.index:
                            feeds[link.input] = outputs[link.source][link.output]
                    names = {spec.name for spec in stage.inputs}
                    feeds = {name: value for name, value in feeds.items() if name in names}
                    missing = sorted(names - set(feeds))
                    if missing:
                        raise DSAUserError(f"cannot make calibration inputs {missing} of stage {stage.index}; export "
                                           "the stages again.")
                    result = session.run(feeds)
                    outputs[stage.index] = {k: v for k, v in result.items() if not k.startswith("present_")}
                    pasts[stage.index] = {"past_" + k[len("present_"):]: v for k, v in result.items()
                                          if k.startswith("present_")}
                    if last:
                        with atomic_output(target / f"sample_{number:05d}.npz") as tmp, open(tmp, "wb") as f:
                            np.savez(f, **feeds)
            say(f"  sample {number + 1}/{len(samples)} ({label}, {ids.shape[0]} x {ids.shape[1]} tokens)")
    finally:
        for session in sessions:
            session.close()
    return folders


__all__ = ["CALIBRATION_DIR", "data_digest", "stage_calibration_data"]
