"""``pipeline.json``: a model cut into contiguous stages of layers, one ONNX file per stage, and
what flows from one stage to the next (:class:`Pipeline`), written by ``dsa-export export
--stages`` and ``build --stages``; and which record (a build's ``manifest.json`` or a pipeline's
``pipeline.json``) lists a given .onnx, to verify it before it is read. Reading imports neither
torch, onnxruntime nor TensorRT.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUserError
from dsa_export.integrity import confined, verify_files
from dsa_export.manifest import MANIFEST_NAME, TensorSpec, read_manifest

PIPELINE_NAME = "pipeline.json"
PIPELINE_FORMAT = "dsa-export-pipeline"
PIPELINE_VERSION = 1


@dataclass(frozen=True)
class StageFiles:
    """One stage of a pipeline: its layers, files, I/O and hashes.

    Attributes:
        index: position in the pipeline (0 = first).
        layers: decoder layers ``[start, stop)``.
        embed, head: whether the stage embeds token ids (first) / applies norm + lm_head (last).
        onnx: the stage's .onnx file, relative to the pipeline folder (POSIX).
        data: its external data file, relative, or None when the weights are inside ``onnx``.
        sha256: ``{relative file: sha256}`` of ``onnx`` and ``data``.
        sizes: ``{relative file: bytes}``.
        inputs, outputs: the graph's I/O.
        weight_bytes: bytes of the stage's initializers.
        checkpoint_bytes: bytes of the same tensors in the checkpoint's safetensors.
        key: digest of everything the stage was exported from (reference, settings, tool version);
            a stage with the same key and matching files is not exported again.
        plan: the planner's figures for this stage (weights, cache, activations, total).
        build: in the ``pipeline.json`` of a stage build, the stage's build folder (relative), whose
            ``manifest.json`` describes its engine and ONNX Runtime artifact; None in an export.
        device: the GPU index the stage runs on (a stage build assigns one per stage).
        build_key: digest of the stage's files and the build settings; an unchanged stage whose
            build folder still verifies is not built again.
    """

    index: int
    layers: tuple[int, int]
    embed: bool
    head: bool
    onnx: str
    data: str | None
    sha256: dict[str, str]
    sizes: dict[str, int]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weight_bytes: int
    checkpoint_bytes: int
    key: str
    plan: dict[str, Any]
    build: str | None = None
    device: int | None = None
    build_key: str | None = None

    @property
    def caches(self) -> list[str]:
        """The decode caches the stage keeps: inputs ``past_X`` whose ``present_X`` it returns."""
        produced = {t.name for t in self.outputs}
        return [t.name for t in self.inputs if t.name.startswith("past_") and
                "present_" + t.name[len("past_"):] in produced]

    def to_dict(self) -> dict[str, Any]:
        extra = {name: value for name, value in (("build", self.build), ("device", self.device),
                                                 ("build_key", self.build_key)) if value is not None}
        return {
            **extra, "caches": self.caches, "index": self.index, "layers": list(self.layers), "embed": self.embed,
            "head": self.head, "onnx": self.onnx, "data": self.data, "sha256": dict(self.sha256), "sizes": dict(self.sizes),
            "inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs],
            "weight_bytes": self.weight_bytes, "checkpoint_bytes": self.checkpoint_bytes, "key": self.key,
            "plan": dict(self.plan),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageFiles:
        return cls(
            index=int(data["index"]), layers=(int(data["layers"][0]), int(data["layers"][1])),
            embed=bool(data["embed"]), head=bool(data["head"]), onnx=str(data["onnx"]), data=data.get("data"),
            sha256=dict(data.get("sha256", {})), sizes={k: int(v) for k, v in data.get("sizes", {}).items()},
            inputs=[TensorSpec.from_dict(t) for t in data.get("inputs", [])],
            outputs=[TensorSpec.from_dict(t) for t in data.get("outputs", [])],
            weight_bytes=int(data.get("weight_bytes", 0)), checkpoint_bytes=int(data.get("checkpoint_bytes", 0)),
            key=str(data.get("key", "")), plan=dict(data.get("plan", {})),
            build=str(data["build"]) if data.get("build") is not None else None,
            device=int(data["device"]) if data.get("device") is not None else None,
            build_key=str(data["build_key"]) if data.get("build_key") is not None else None,
        )


    def verify(self, folder: str | os.PathLike[str], *, enabled: bool = True) -> None:
        """Check this stage's files against their recorded sizes and sha256 (see :func:`verify_files`)."""
        records = {name: {"sha256": digest, **({"size": self.sizes[name]} if name in self.sizes else {})}
                   for name, digest in self.sha256.items()}
        names = [self.onnx] + ([self.data] if self.data else [])
        source = f"{Path(folder) / PIPELINE_NAME} (stage {self.index})"
        unrecorded = verify_files(folder, records, names, source=source, enabled=enabled)
        if unrecorded:
            raise DSAUserError(f"'{Path(folder) / unrecorded[0]}' has no hash in {source}; export the stages again.")


@dataclass(frozen=True)
class StageLink:
    """A tensor one stage hands to the next: ``output`` of stage ``source`` feeds ``input`` of ``target``."""

    source: int
    target: int
    output: str
    input: str

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.source, "to": self.target, "output": self.output, "input": self.input}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageLink:
        return cls(int(data["from"]), int(data["to"]), str(data["output"]), str(data["input"]))


@dataclass(frozen=True)
class Pipeline:
    """``pipeline.json``: a model as contiguous stages run one after the other.

    Inputs that are not produced by an earlier stage (``attention_mask``, the decode caches) are
    fed to every stage that has them by the caller; ``links`` lists the rest.
    """

    model: dict[str, Any]  # the ModelReference record (path relative to the pipeline folder)
    model_type: str
    num_layers: int
    graph: str
    settings: dict[str, Any]
    plan: dict[str, Any]
    stages: list[StageFiles]
    links: list[StageLink]
    tool_version: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PIPELINE_FORMAT, "version": PIPELINE_VERSION, "tool_version": self.tool_version,
            "model": dict(self.model), "model_type": self.model_type, "num_layers": self.num_layers,
            "graph": self.graph, "settings": dict(self.settings), "plan": dict(self.plan),
            "stages": [s.to_dict() for s in self.stages], "links": [link.to_dict() for link in self.links],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Pipeline:
        return cls(
            model=dict(data.get("model", {})), model_type=str(data.get("model_type", "")),
            num_layers=int(data.get("num_layers", 0)), graph=str(data.get("graph", "prefill")),
            settings=dict(data.get("settings", {})), plan=dict(data.get("plan", {})),
            stages=[StageFiles.from_dict(s) for s in data.get("stages", [])],
            links=[StageLink.from_dict(link) for link in data.get("links", [])],
            tool_version=str(data.get("tool_version", "")),
        )


def read_pipeline(path: str | Path) -> Pipeline:
    """Read ``pipeline.json`` (or the one in folder ``path``)."""
    path = Path(path)
    candidate = path / PIPELINE_NAME if path.is_dir() else path
    if not candidate.is_file():
        raise DSAUserError(f"{candidate} does not exist; export the stages with `dsa-export export HF_DIR --stages N -o DIR`.")
    try:
        data = json.loads(candidate.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DSAUserError(f"{candidate} is not valid JSON ({exc}); export the stages again.") from exc
    if not isinstance(data, dict) or data.get("format") != PIPELINE_FORMAT:
        raise DSAUserError(f"{candidate} is not a dsa-export pipeline file; export the stages again.")
    if int(data.get("version", 0)) > PIPELINE_VERSION:
        raise DSAUserError(f"{candidate} has pipeline format {data['version']}, newer than this dsa-export reads "
                           f"({PIPELINE_VERSION}); upgrade dsa-export.")
    try:
        pipeline = Pipeline.from_dict(data)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise DSAUserError(f"{candidate} has a malformed field ({exc}); export the stages again.") from exc
    check_pipeline(pipeline, candidate)
    return pipeline


def check_pipeline(pipeline: Pipeline, path: Path) -> None:
    """Refuse a ``pipeline.json`` whose stages are not a clean cut of the model or whose paths leave
    its folder.

    Every path in the file is data, resolved inside the folder by :func:`confined` (no absolute
    path, no ``..`` out of it, no symbolic link out of it); a stage's ``onnx`` must be an ``.onnx``
    file name, so that it can never reach the MODEL resolver as ``file.py:factory``. Stages must be
    numbered 0..n-1 in order and their layer ranges contiguous, non-overlapping and within the model.
    """
    folder = path.parent
    again = "export (or build) the stages again"
    if not pipeline.stages:
        raise DSAUserError(f"{path} lists no stages; {again}.")
    previous_stop = None
    for position, stage in enumerate(pipeline.stages):
        where = f"{path} stage {position}"
        if stage.index != position:
            raise DSAUserError(f"{where} has index {stage.index}: stages must be listed in order 0..{len(pipeline.stages) - 1} "
                               f"without gaps; {again}.")
        start, stop = stage.layers
        if not 0 <= start <= stop or (pipeline.num_layers and stop > pipeline.num_layers):
            raise DSAUserError(f"{where} has layers {start}:{stop}, not a range inside the model's "
                               f"{pipeline.num_layers} layers; {again}.")
        if previous_stop is not None and start != previous_stop:
            kind = "overlap" if start < previous_stop else "leave a gap"
            raise DSAUserError(f"{where} starts at layer {start} but the stage before ends at {previous_stop}: the "
                               f"stages {kind}; {again}.")
        previous_stop = stop
        name = stage.onnx.replace("\\", "/")
        if ":" in name or not name.endswith(".onnx") or posixpath.isabs(name):
            raise DSAUserError(f"{where} names its model '{stage.onnx}', which is not a relative .onnx file name; "
                               f"{again}.")
        if stage.build is not None:
            # A stage build runs its build folder; the export files it was built from are a record
            # (a separate export folder may sit beside the build) that no command opens.
            confined(folder, stage.build, f"{where} field build")
            continue
        confined(folder, stage.onnx, f"{where} field onnx")
        if stage.data is not None:
            confined(folder, stage.data, f"{where} field data")
        for name in list(stage.sha256) + list(stage.sizes):
            confined(folder, name, f"{where} file record")


@dataclass(frozen=True)
class _Record:
    """The record that lists an .onnx: its file, how to verify the .onnx against it, and the
    digests it holds (``{absolute file: sha256}``)."""

    file: Path
    verify: Callable[[], None]
    digests: dict[Path, str]


def _record_of(path: Path) -> _Record | None:
    """The ``manifest.json`` beside ``path`` that lists it, else the ``pipeline.json`` one or two
    folders up with a stage whose .onnx it is; None when neither does."""
    path = path.resolve()
    manifest_path = path.parent / MANIFEST_NAME
    if manifest_path.is_file():
        manifest = None
        with contextlib.suppress(DSAUserError):
            manifest = read_manifest(manifest_path)
        if manifest is not None and manifest.relative(path) in manifest.files:
            digests = {(manifest.folder / name).resolve(): record["sha256"] for name, record in manifest.files.items()
                       if isinstance(record, dict) and isinstance(record.get("sha256"), str)}
            return _Record(manifest_path, lambda: manifest.verify([path]), digests)
    for folder in (path.parent, path.parent.parent):
        if not (folder / PIPELINE_NAME).is_file():
            continue
        try:
            pipeline = read_pipeline(folder)
        except DSAUserError:
            continue
        relative = Path(os.path.relpath(path, folder)).as_posix()
        for stage in pipeline.stages:
            if stage.onnx == relative:
                digests = {(folder / name).resolve(): digest for name, digest in stage.sha256.items()}
                return _Record(folder / PIPELINE_NAME, lambda stage=stage, folder=folder: stage.verify(folder), digests)
    return None


def recorded_digests(path: str | os.PathLike[str]) -> dict[Path, str]:
    """``{absolute file: sha256}`` of an .onnx and its external data from the record that lists it
    (see :func:`verify_recorded_onnx`; empty if none does)."""
    record = _record_of(Path(path))
    return record.digests if record is not None else {}


def verify_recorded_onnx(path: str | os.PathLike[str], *, enabled: bool = True) -> str | None:
    """Verify an .onnx the user names when it belongs to a build folder (listed in the
    ``manifest.json`` beside it) or to a pipeline (a stage of the ``pipeline.json`` one or two
    folders up); returns the record file it was checked against, or None when none lists it."""
    path = Path(path)
    if not enabled or not path.is_file():
        return None
    record = _record_of(path)
    if record is None:
        return None
    record.verify()
    return str(record.file)


__all__ = ["PIPELINE_NAME", "Pipeline", "StageFiles", "StageLink", "check_pipeline", "read_pipeline",
           "recorded_digests", "verify_recorded_onnx"]
