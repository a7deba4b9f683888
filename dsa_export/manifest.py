"""The build manifest: what a build folder holds (``manifest.json``, :class:`Manifest`), as a shared
schema, and the checks every reader makes before it uses a file of such a folder.

``dsa-export build`` writes ``manifest.json``; the runtimes, ``check --engine`` (through
:mod:`dsa_export.compat.engine_gate`, which reads the ``engine`` section) and the C++ example read it.
The pipeline of stages (``pipeline.json``) is :mod:`dsa_export.stages.record`; the trust rules
both share (paths confined to the folder, files checked against their recorded size and sha256,
external data confined) are :mod:`dsa_export.integrity`. This module sits at the bottom of the
package so that readers never import the build pipeline. Reading imports neither torch,
onnxruntime nor TensorRT.

Fields are checked when the file is read, so a damaged or edited manifest is refused in one
sentence instead of failing later (:func:`read_manifest`), and sizes taken from it are checked by
arithmetic before anything is allocated (:func:`make_inputs`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUserError
from dsa_export.integrity import REBUILD, confined, external_data_files, verify_files
from dsa_export.onnx_files import META_CONFIG

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
#: ``{relative path: {"size", "sha256"}}`` of every file of a build (manifest.json excepted).
FILES_KEY = "files"
#: Provider options a build's session.json may hold, per execution provider (what
#: :func:`dsa_export.artifact.onnxrt.tensorrt_ep_options` writes). Anything else is refused: options
#: such as ``trt_engine_decryption_lib_path`` load code.
ORT_PROVIDER_OPTIONS: dict[str, frozenset[str]] = {
    "TensorrtExecutionProvider": frozenset({
        "trt_fp16_enable", "trt_bf16_enable", "trt_int8_enable", "trt_profile_min_shapes", "trt_profile_opt_shapes",
        "trt_profile_max_shapes", "trt_engine_cache_enable", "trt_engine_cache_path", "trt_timing_cache_enable",
        "trt_builder_optimization_level", "trt_extra_plugin_lib_paths",
    }),
    "CUDAExecutionProvider": frozenset(),
    "CPUExecutionProvider": frozenset(),
}
#: Metadata key of the exported model's config (the vocabulary size bounds token ids).


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
    """A parsed ``manifest.json`` and the folder it describes (fields checked: :func:`check_fields`)."""

    def __init__(self, data: dict[str, Any], path: Path):
        check_fields(data, path)
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

    def artifact(self, relative: str, field: str = "a path") -> Path:
        """``relative`` inside the build folder (see :func:`confined`)."""
        return confined(self.folder, relative, f"{self.path} field {field}")

    def relative(self, path: Path) -> str:
        """``path`` (inside the folder) as the POSIX path the manifest records."""
        return Path(os.path.relpath(path, self.folder)).as_posix()

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        """``{relative path: {"size", "sha256"}}``; builds of dsa-export 0.1 recorded only the
        sha256 of the ONNX file, the Q/DQ file and the engine, which are returned then."""
        files = self.data.get(FILES_KEY)
        if isinstance(files, dict):
            return files
        legacy: dict[str, dict[str, Any]] = {}
        model, engine = self.data.get("model") or {}, self.engine or {}
        calibration = self.data.get("calibration") or {}
        for name, digest in ((model.get("onnx"), model.get("sha256")), (engine.get("file"), engine.get("sha256")),
                             (calibration.get("model"), calibration.get("model_sha256"))):
            if isinstance(name, str) and isinstance(digest, str):
                legacy[name] = {"sha256": digest}
        return legacy

    def verify(self, paths: Iterable[Path], *, enabled: bool = True) -> list[str]:
        """Check files of this build, and the external data of the ONNX files among them, against
        the manifest before they are loaded; returns notes naming files it has no record of."""
        if not enabled:
            return []
        paths = list(paths)
        unrecorded = self._verify([self.relative(p) for p in paths])
        data = []
        for path in paths:
            if path.suffix == ".onnx":
                for location in external_data_files(path):
                    where = f"the external data location '{location}' in '{path}'"
                    data.append(self.relative(confined(self.folder, self.relative(path.parent / location), where)))
        unrecorded += self._verify(data)
        return [f"{name} was not verified: the manifest of this build records no hash for it (built by an older "
                "dsa-export)" for name in unrecorded]

    def _verify(self, names: list[str]) -> list[str]:
        unrecorded = verify_files(self.folder, self.files, names, source=str(self.path))
        if unrecorded and isinstance(self.data.get(FILES_KEY), dict):
            raise DSAUserError(f"'{self.folder / unrecorded[0]}' is not listed in {self.path}, so it cannot be "
                               f"verified; {REBUILD}.")
        return unrecorded

    def opt_dims(self) -> dict[str, int]:
        return {name: opt for name, (_lo, opt, _hi) in self.profile_dims.items()}

    @property
    def profile_sets(self) -> list[dict[str, tuple[int, int, int]]]:
        """Every optimization profile's dims (``profiles.all``; builds of one profile: ``dims``)."""
        every = (self.data.get("profiles") or {}).get("all")
        if isinstance(every, list) and every:
            return [{name: tuple(values) for name, values in dims.items()} for dims in every]  # type: ignore[misc]
        return [self.profile_dims]

    def check_shapes(self, shapes: dict[str, tuple[int, ...]], what: str = "the engine") -> None:
        """DSAUserError naming the first input whose shape falls outside the optimization profile
        (with several profiles: the shapes must fit one of them)."""
        profiles = self.profile_sets
        errors = []
        for dims in profiles:
            try:
                check_shapes(self.inputs, dims, shapes, what)
                return
            except DSAUserError as exc:
                errors.append(str(exc))
        if len(profiles) == 1:
            raise DSAUserError(errors[0])
        ranges = "; ".join(f"profile {i}: " + ", ".join(f"{name} {lo}..{hi}" for name, (lo, _opt, hi) in dims.items())
                           for i, dims in enumerate(profiles))
        raise DSAUserError(f"the input shapes fit none of the {len(profiles)} optimization profiles of {what} "
                           f"({ranges}); for profile 0: {errors[0]}")


def _field_error(path: Path, field: str, value: object, wanted: str) -> DSAUserError:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return DSAUserError(f"{path} has an invalid field {field} ({shown}, not {wanted}); {REBUILD}.")


def _check_tensor_specs(path: Path, field: str, specs: object) -> None:
    import numpy as np

    if not isinstance(specs, list):
        raise _field_error(path, field, specs, "a list of tensors")
    for i, spec in enumerate(specs):
        where = f"{field}[{i}]"
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise _field_error(path, where, spec, "a tensor with a name")
        try:
            np.dtype(spec.get("dtype"))
        except TypeError:
            if spec.get("dtype") != "bfloat16":
                raise _field_error(path, f"{where}.dtype", spec.get("dtype"), "a numpy dtype name") from None
        shape = spec.get("shape", [])
        if not isinstance(shape, list) or not all(
                (isinstance(d, int) and not isinstance(d, bool) and d >= 0) or (isinstance(d, str) and d)
                for d in shape):
            raise _field_error(path, f"{where}.shape", shape, "a list of sizes and dim names")
        value_range = spec.get("value_range")
        if value_range is not None and not (
                isinstance(value_range, list) and len(value_range) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value_range)
                and value_range[0] < value_range[1]):
            raise _field_error(path, f"{where}.value_range", value_range, "[low, high) integers")


def check_fields(data: dict[str, Any], path: Path) -> None:
    """Refuse a manifest whose fields that readers use have the wrong types (damaged or edited)."""
    for key in ("inputs", "outputs"):
        if key in data:
            _check_tensor_specs(path, key, data[key])
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        raise _field_error(path, "profiles", profiles, "an object")
    dims = profiles.get("dims", {})
    if not isinstance(dims, dict):
        raise _field_error(path, "profiles.dims", dims, "an object of [min, opt, max]")
    for name, values in dims.items():
        if not (isinstance(values, list) and len(values) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
                and values[0] <= values[1] <= values[2]):
            raise _field_error(path, f"profiles.dims.{name}", values, "[min, opt, max] with min <= opt <= max")
    for section, keys in (("engine", ("file",)), ("onnxruntime", ("session",)), ("model", ("onnx",))):
        value = data.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise _field_error(path, section, value, "an object")
        for key in keys:
            if key in value and not isinstance(value[key], str):
                raise _field_error(path, f"{section}.{key}", value[key], "a file name")
    files = data.get(FILES_KEY)
    if files is not None:
        if not isinstance(files, dict):
            raise _field_error(path, FILES_KEY, files, "an object of file records")
        for name, record in files.items():
            if not (isinstance(record, dict) and isinstance(record.get("sha256"), str)
                    and isinstance(record.get("size"), int)):
                raise _field_error(path, f"{FILES_KEY}.{name}", record, "{size, sha256}")


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


def io_specs(model) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The graph inputs and outputs of an ONNX ModelProto as TensorSpecs; integer inputs get a
    ``value_range``: token ids (names with "id") ``[0, vocab)`` from the recorded model config,
    other integer inputs (masks) ``[0, 2)``."""
    from onnx import helper

    meta = {p.key: p.value for p in model.metadata_props}
    vocab = None
    if META_CONFIG in meta:
        try:
            vocab = json.loads(meta[META_CONFIG]).get("vocab_size")
        except (ValueError, AttributeError):
            vocab = None
    initializers = {i.name for i in model.graph.initializer}

    def spec(value, is_input: bool) -> TensorSpec:
        tensor_type = value.type.tensor_type
        if tensor_type.elem_type == 16:
            dtype_name, kind = "bfloat16", "f"
        else:
            dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
            dtype_name, kind = str(dtype), dtype.kind
        shape = tuple(d.dim_param if d.dim_param else int(d.dim_value) for d in tensor_type.shape.dim)
        value_range = None
        if is_input and kind in "iu":
            value_range = (0, int(vocab)) if isinstance(vocab, int) and vocab > 0 and "id" in value.name else (
                (0, 2) if "mask" in value.name else None)
        return TensorSpec(value.name, dtype_name, shape, value_range)

    inputs = [spec(v, True) for v in model.graph.input if v.name not in initializers]
    outputs = [spec(v, False) for v in model.graph.output]
    return inputs, outputs


def check_feeds(inputs: list[TensorSpec], feeds: dict[str, Any], what: str = "the model") -> dict[str, Any]:
    """The feeds in the dtypes ``inputs`` declare, or a one-sentence DSAUserError naming the input.

    Integers of another width are converted (token ids saved as int32 feed an int64 input);
    anything else of another dtype (floats for ids, ints for floats) is refused, and integer inputs
    (token ids) must lie in their recorded ``value_range``.
    """
    import numpy as np

    out = dict(feeds)
    for spec in inputs:
        if spec.name not in feeds:
            continue
        value = np.asarray(feeds[spec.name])
        expected = spec.dtype
        if str(value.dtype) != expected:
            try:
                target = np.dtype(expected)
            except TypeError:
                target = None
            if target is None or target.kind not in "iu" or value.dtype.kind not in "iu":
                raise DSAUserError(
                    f"input '{spec.name}' is {value.dtype} but {what} takes {expected}; convert it (e.g. "
                    f"array.astype('{expected}')) or regenerate the inputs."
                )
            info = np.iinfo(target)
            if value.size and (int(value.min()) < info.min or int(value.max()) > info.max):
                raise DSAUserError(f"input '{spec.name}' holds values that do not fit in {expected}, which {what} takes.")
            value = value.astype(target)
            out[spec.name] = value
        if spec.value_range is not None and value.size and value.dtype.kind in "iu":
            low, high = spec.value_range
            smallest, largest = int(value.min()), int(value.max())
            if smallest < low or largest >= high:
                bad = smallest if smallest < low else largest
                raise DSAUserError(
                    f"input '{spec.name}' holds {bad}, outside the range {low}..{high - 1} {what} accepts "
                    f"(token ids must be below the vocabulary size {high})."
                )
    return out


def make_inputs(
    inputs: list[TensorSpec], dims: dict[str, int], seed: int = 0,
    before: Callable[[dict[str, tuple[int, ...]]], None] | None = None,
) -> dict[str, Any]:
    """Random inputs matching ``inputs`` with dynamic dims set from ``dims`` (numpy arrays).

    The bytes they need (and the float64/int64 draw each is made from) are computed from the
    specs' dtypes and dims first, and sizes that cannot fit in the memory available are refused
    before anything is allocated: a manifest's profile is data, and may say a billion tokens.
    ``before`` is called with ``{input: shape}`` after that and before any array exists (a
    session passes its own checks of the shapes, e.g. the memory a run of them would take).
    """
    import numpy as np

    shapes = {}
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
        shapes[spec.name] = shape
    _require_input_memory(inputs, shapes)
    if before is not None:
        before({name: tuple(shape) for name, shape in shapes.items()})
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in inputs:
        shape = shapes[spec.name]
        dtype = np.dtype(spec.dtype)
        if dtype.kind in "iu":
            low, high = spec.value_range or (0, 2)
            feeds[spec.name] = rng.integers(low, high, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _require_input_memory(inputs: list[TensorSpec], shapes: dict[str, list[int]]) -> None:
    """Refuse, in one sentence naming the largest input and the GiB, inputs whose arrays (plus the
    8-byte draw of the largest, made before its conversion) exceed the memory available."""
    import numpy as np

    from dsa_export.runtime.memory import HEADROOM, GiB, available_memory

    sizes = {}
    for spec in inputs:
        count = 1
        for size in shapes[spec.name]:
            count *= max(int(size), 0)
        try:
            itemsize = np.dtype(spec.dtype).itemsize
        except TypeError:  # bfloat16, which numpy does not name
            itemsize = 2
        sizes[spec.name] = count * itemsize, count
    if not sizes:
        return
    largest = max(sizes, key=lambda name: sizes[name][0])
    need = sum(nbytes for nbytes, _count in sizes.values()) + 8 * max(count for _nbytes, count in sizes.values())
    available, source = available_memory()
    if need > available * HEADROOM:
        shape = "x".join(str(d) for d in shapes[largest])
        raise DSAUserError(
            f"generating the inputs needs {need / GiB:.1f} GiB (input '{largest}' alone is {shape}, "
            f"{sizes[largest][0] / GiB:.1f} GiB) but only {available / GiB:.1f} GiB of memory are available "
            f"({source}); pass smaller --dims or your own --inputs."
        )


def write_manifest(data: dict[str, Any], path: str | Path) -> Path:
    """Write ``data`` as ``path`` atomically (sorted keys, trailing newline)."""
    from dsa_export.fileio import atomic_output

    path = Path(path)
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return path


def verify_engine(engine: str | os.PathLike[str], *, enabled: bool = True) -> list[str]:
    """Check an engine file against the ``manifest.json`` beside it (size and sha256) before it is
    read; for ``check --engine`` and any other reader of a plan. Returns notes (no record)."""
    path = Path(engine)
    if not enabled or not path.is_file() or not (path.parent / MANIFEST_NAME).is_file():
        return []
    return read_manifest(path.parent).verify([path])


__all__ = [
    "ENGINE_NAME",
    "FILES_KEY",
    "MANIFEST_NAME",
    "ONNX_NAME",
    "ORT_DIR",
    "ORT_MODEL_NAME",
    "ORT_SESSION_NAME",
    "SCHEMA_VERSION",
    "VALIDATION_NAME",
    "Manifest",
    "TensorSpec",
    "check_feeds",
    "check_fields",
    "check_shapes",
    "io_specs",
    "make_inputs",
    "read_manifest",
    "verify_engine",
    "write_manifest",
]
