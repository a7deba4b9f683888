"""The build manifest: what an artifact folder holds and what it needs, as one shared schema.

``dsa-export build`` writes ``manifest.json``; the runtimes, ``check --engine`` (through
:mod:`dsa_export.compat.engine_gate`, which reads the ``engine`` section) and the C++ example read it.
It sits at the bottom of the package so that readers never import the build pipeline. Reading it
imports neither torch, onnxruntime nor TensorRT.
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


__all__ = [
    "ENGINE_NAME",
    "MANIFEST_NAME",
    "ONNX_NAME",
    "ORT_DIR",
    "ORT_MODEL_NAME",
    "ORT_SESSION_NAME",
    "SCHEMA_VERSION",
    "VALIDATION_NAME",
    "Manifest",
    "TensorSpec",
    "check_shapes",
    "make_inputs",
    "read_manifest",
    "write_manifest",
]
