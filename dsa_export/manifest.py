"""The build manifest and the pipeline of stages: what artifact folders hold, as shared schemas.

``dsa-export build`` writes ``manifest.json``; the runtimes, ``check --engine`` (through
:mod:`dsa_export.compat.engine_gate`, which reads the ``engine`` section) and the C++ example read it.
``dsa-export export --stages`` writes ``pipeline.json`` (:class:`Pipeline`): a model cut into
contiguous stages of layers, one ONNX file per stage, and what flows from one stage to the next.
This module sits at the bottom of the package so that readers never import the build pipeline.
Reading either imports neither torch, onnxruntime nor TensorRT.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUserError

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"

# File names inside an artifact folder (one place, so writers and readers agree).
ONNX_NAME = "model.onnx"
QDQ_NAME = "model.qdq.onnx"
ENGINE_NAME = "model.plan"
VALIDATION_NAME = "validation.json"
CALIBRATION_REPORT_NAME = "calibration.json"
CALIBRATION_CACHE_NAME = "calibration.cache"
TIMING_CACHE_NAME = "timing.cache"
ORT_DIR = "onnxruntime"
ORT_MODEL_NAME = "model.optimized.onnx"
ORT_SESSION_NAME = "session.json"


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: ``shape`` holds ints for fixed dims and names for dynamic ones."""

    name: str
    dtype: str  # numpy dtype name, e.g. "int64", "float32"
    shape: tuple[int | str, ...]
    value_range: tuple[int, int] | None = None  # [low, high) of integer inputs such as token ids

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.value_range is not None:
            data["value_range"] = list(self.value_range)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        value_range = data.get("value_range")
        return cls(
            name=str(data["name"]),
            dtype=str(data["dtype"]),
            shape=tuple(data.get("shape", ())),
            value_range=tuple(value_range) if value_range else None,  # type: ignore[arg-type]
        )


class Manifest:
    """A parsed ``manifest.json`` and the folder it describes."""

    def __init__(self, data: dict[str, Any], path: Path):
        self.data = data
        self.path = path

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(d) for d in self.data.get("inputs", [])]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(d) for d in self.data.get("outputs", [])]

    @property
    def engine(self) -> dict[str, Any] | None:
        engine = self.data.get("engine")
        return engine if isinstance(engine, dict) else None

    @property
    def onnxruntime(self) -> dict[str, Any] | None:
        section = self.data.get("onnxruntime")
        return section if isinstance(section, dict) else None

    @property
    def profile_dims(self) -> dict[str, tuple[int, int, int]]:
        dims = (self.data.get("profiles") or {}).get("dims", {})
        return {name: tuple(values) for name, values in dims.items()}  # type: ignore[misc]

    def artifact(self, relative: str) -> Path:
        return self.folder / relative

    def opt_dims(self) -> dict[str, int]:
        return {name: opt for name, (_lo, opt, _hi) in self.profile_dims.items()}

    def check_shapes(self, shapes: dict[str, tuple[int, ...]], what: str = "the engine") -> None:
        """DSAUserError naming the first input whose shape falls outside the optimization profile."""
        check_shapes(self.inputs, self.profile_dims, shapes, what)


def read_manifest(path: str | Path) -> Manifest:
    """Read ``manifest.json`` (or the one in folder ``path``, or next to file ``path``)."""
    path = Path(path)
    candidate = path / MANIFEST_NAME if path.is_dir() else (path if path.name == MANIFEST_NAME else path.parent / MANIFEST_NAME)
    if not candidate.is_file():
        raise DSAUserError(
            f"{candidate} does not exist, so the inputs and profiles of {path} are unknown; build it with `dsa-export build`."
        )
    try:
        data = json.loads(candidate.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DSAUserError(f"{candidate} is not valid JSON ({exc}); rebuild with `dsa-export build`.") from exc
    if not isinstance(data, dict) or not isinstance(data.get("schema_version"), int):
        raise DSAUserError(f"{candidate} is not a dsa-export manifest (no schema_version); rebuild with `dsa-export build`.")
    if data["schema_version"] > SCHEMA_VERSION:
        raise DSAUserError(
            f"{candidate} has manifest schema {data['schema_version']}, newer than this dsa-export reads "
            f"({SCHEMA_VERSION}); upgrade dsa-export."
        )
    return Manifest(data, candidate)


def check_shapes(
    inputs: list[TensorSpec],
    dims: dict[str, tuple[int, int, int]],
    shapes: dict[str, tuple[int, ...]],
    what: str = "the engine",
) -> None:
    """Compare concrete input shapes with the named dims' [min, max] and with each other."""
    seen: dict[str, tuple[int, str]] = {}
    for spec in inputs:
        if spec.name not in shapes:
            raise DSAUserError(f"input '{spec.name}' is missing; {what} needs {', '.join(s.name for s in inputs)}.")
        shape = tuple(int(d) for d in shapes[spec.name])
        if len(shape) != len(spec.shape):
            raise DSAUserError(
                f"input '{spec.name}' has {len(shape)} dims {list(shape)} but {what} expects {len(spec.shape)} "
                f"({list(spec.shape)})."
            )
        for axis, (size, expected) in enumerate(zip(shape, spec.shape)):
            if isinstance(expected, int):
                if size != expected:
                    raise DSAUserError(
                        f"input '{spec.name}' has size {size} on axis {axis}, but {what} was built for {expected}."
                    )
                continue
            if expected in dims:
                lo, _opt, hi = dims[expected]
                if not lo <= size <= hi:
                    raise DSAUserError(
                        f"input '{spec.name}' has {expected} {size} (axis {axis}), outside the optimization profile of "
                        f"{what} ({expected} {lo}..{hi}); pass a shape within it or rebuild with "
                        f"--min-shapes/--max-shapes {expected}={size}."
                    )
            if expected in seen and seen[expected][0] != size:
                other_size, other = seen[expected]
                raise DSAUserError(
                    f"inputs '{other}' and '{spec.name}' disagree on {expected} ({other_size} vs {size}); "
                    "they must share it."
                )
            seen.setdefault(expected, (size, spec.name))


def make_inputs(
    inputs: list[TensorSpec], dims: dict[str, int], seed: int = 0
) -> dict[str, Any]:
    """Random inputs matching ``inputs`` with dynamic dims set from ``dims`` (numpy arrays)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in inputs:
        shape = []
        for dim in spec.shape:
            if isinstance(dim, int):
                shape.append(dim)
            elif dim in dims:
                shape.append(int(dims[dim]))
            else:
                raise DSAUserError(
                    f"input '{spec.name}' has a dynamic dim '{dim}' with no size; the manifest gives none, so pass --inputs."
                )
        dtype = np.dtype(spec.dtype)
        if dtype.kind in "iu":
            low, high = spec.value_range or (0, 2)
            feeds[spec.name] = rng.integers(low, high, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def write_manifest(data: dict[str, Any], path: str | Path) -> Path:
    """Write ``data`` as ``path`` atomically (sorted keys, trailing newline)."""
    from dsa_export.fileio import atomic_output

    path = Path(path)
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# pipeline.json

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "layers": list(self.layers), "embed": self.embed, "head": self.head,
            "onnx": self.onnx, "data": self.data, "sha256": dict(self.sha256), "sizes": dict(self.sizes),
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
        )


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
        return Pipeline.from_dict(data)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DSAUserError(f"{candidate} has a malformed field ({exc}); export the stages again.") from exc


__all__ = [
    "ENGINE_NAME",
    "MANIFEST_NAME",
    "ONNX_NAME",
    "ORT_DIR",
    "ORT_MODEL_NAME",
    "ORT_SESSION_NAME",
    "PIPELINE_NAME",
    "SCHEMA_VERSION",
    "VALIDATION_NAME",
    "Manifest",
    "Pipeline",
    "StageFiles",
    "StageLink",
    "TensorSpec",
    "check_shapes",
    "make_inputs",
    "read_manifest",
    "read_pipeline",
    "write_manifest",
]
