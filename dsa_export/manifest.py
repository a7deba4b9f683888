"""The build manifest and the pipeline of stages: what artifact folders hold, as shared schemas,
and the checks every reader makes before it uses a file of such a folder.

``dsa-export build`` writes ``manifest.json``; the runtimes, ``check --engine`` (through
:mod:`dsa_export.compat.engine_gate`, which reads the ``engine`` section) and the C++ example read it.
``dsa-export export --stages`` writes ``pipeline.json`` (:class:`Pipeline`): a model cut into
contiguous stages of layers, one ONNX file per stage, and what flows from one stage to the next.
This module sits at the bottom of the package so that readers never import the build pipeline.
Reading either imports neither torch, onnxruntime nor TensorRT.

Trust rules, shared by every reader:

- paths recorded in a folder's files are confined to that folder (:func:`confined`): relative,
  and neither ``..`` nor a symbolic link leads out of it;
- every file is checked against its recorded size and sha256 before it is loaded
  (:func:`verify_files`, used for ``manifest.json``'s ``files`` and ``pipeline.json``'s stages
  alike); the hash is computed once per file version and remembered by size, modification and
  change time and inode (the build records its hashes in the folder, :data:`VERIFY_CACHE_NAME`,
  each signed with a key of the user's that never lies in a build folder, :func:`cache_secret`, so
  the folder cannot vouch for itself; readers record theirs in the user's cache, never in the
  folder they read), so a second run costs a ``stat``; ``--no-verify`` skips it;
- the external data an .onnx names is confined to the file's folder and its byte ranges to the
  data files before ONNX Runtime, onnx, Polygraphy or TensorRT reads it (:func:`check_external_data`);
- fields are checked when the file is read, so a damaged or edited manifest is refused in one
  sentence instead of failing later (:func:`read_manifest`), and sizes taken from it are checked
  by arithmetic before anything is allocated (:func:`make_inputs`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import posixpath
import stat as stat_module
from collections.abc import Callable, Iterable, Iterator
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
#: ``{relative path: {"size", "sha256"}}`` of every file of a build (manifest.json excepted).
FILES_KEY = "files"
#: The hashes already checked, by size and modification/change time, so each is computed once.
VERIFY_CACHE_NAME = ".verified.json"
REBUILD = "rebuild the folder with `dsa-export build`"
#: Provider options a build's session.json may hold, per execution provider (what
#: :func:`dsa_export.build.onnxrt.tensorrt_ep_options` writes). Anything else is refused: options
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
META_MODEL_CONFIG = "dsa_export.model_config"


def _shown(text: object, limit: int = 100) -> str:
    """``text`` for a message, cut after ``limit`` characters (a recorded name may be anything)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def confined(folder: str | os.PathLike[str], relative: object, what: str, *, remedy: str = REBUILD,
             place: str | None = None, suffix: str | None = None, also_inside: Iterable[Path] = (),
             link_remedy: str | None = None) -> Path:
    """``folder/relative``, refusing a path that is not a relative path inside ``folder``.

    ``what`` names where the path was read (e.g. "manifest.json field engine.file"). A path may
    use ``..`` only while it stays inside ``folder`` (``onnxruntime/../model.onnx``); absolute paths,
    ones that leave the folder and symbolic links pointing out of it are refused, each in one
    sentence that ends with ``remedy`` (``link_remedy`` for a link out, when given).

    ``place`` names the folder in those sentences (default "the folder FOLDER"); ``suffix`` is the
    ending the file name must have (".safetensors"); ``also_inside`` lists further resolved folders
    a symbolic link may lead into (the ``blobs`` of a Hugging Face hub cache snapshot).
    """
    root = Path(folder)
    place = place or f"the folder {root}"
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        raise DSAUserError(f"{what} is {_shown(relative)!r}, not a file name; {remedy}.")
    shown = _shown(relative)
    text = relative.replace("\\", "/")
    if posixpath.isabs(text) or (len(text) > 1 and text[1] == ":"):
        raise DSAUserError(f"{what} is the absolute path '{shown}', but it must lie inside {place}; {remedy}.")
    normal = posixpath.normpath(text)
    if normal in (".", "..") or normal.startswith("../"):
        raise DSAUserError(f"{what} is '{shown}', which leads out of {place}; {remedy}.")
    if suffix is not None and not normal.endswith(suffix):
        raise DSAUserError(f"{what} is '{shown}', not a {suffix} file; {remedy}.")
    path = root / normal
    try:
        real_root = root.resolve()
        real = path.resolve()
    except (OSError, RuntimeError) as exc:
        raise DSAUserError(f"{what} is '{shown}', which cannot be resolved ({exc}); {remedy}.") from exc
    if not any(real != allowed and real.is_relative_to(allowed) for allowed in (real_root, *also_inside)):
        raise DSAUserError(f"{what} is '{shown}', which is a link out of the folder: it resolves to "
                           f"'{_shown(real)}', outside {place}; {link_remedy or remedy}.")
    return path


def _cache_key(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


#: Largest cache file read; anything bigger is no cache of ours (a folder's file is not trusted).
_CACHE_MAX_BYTES = 64 << 20


def _read_json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > _CACHE_MAX_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Best effort: a read-only place simply keeps no cache. The temporary file is new (never a
    link someone left under a predictable name) and renamed onto ``path``."""
    import tempfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(data, sort_keys=True))
        os.chmod(name, 0o666 & ~_umask())
        os.replace(name, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(name)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def user_cache_file() -> Path:
    """Where readers remember the hashes they computed: never inside the folder they read."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsa-export" / "verified.json"


#: The per-user key that signs the hashes a build records in its folder, beside :func:`user_cache_file`.
CACHE_SECRET_NAME = "verify.key"
_KEY_BYTES = 32


def _read_cache_secret(path: Path) -> bytes | None:
    """The key in ``path`` if it is a regular file of this user that nobody else can read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat_module.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            return None
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            return None
        key = handle.read(_KEY_BYTES + 1)
    return key if len(key) == _KEY_BYTES else None


def cache_secret(create: bool = False) -> bytes | None:
    """This user's secret for signing the in-folder hash cache (:data:`VERIFY_CACHE_NAME`), kept
    in the user's cache folder with mode 0600; ``create``: make it on first use (the build does).
    None when there is none (or it cannot be made, or others may read it): the in-folder caches
    are then ignored, and every file is hashed."""
    path = user_cache_file().with_name(CACHE_SECRET_NAME)
    key = _read_cache_secret(path)
    if key is not None or not create:
        return key
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:  # made meanwhile by another process (read below), or no place for it
        return _read_cache_secret(path)
    with os.fdopen(fd, "wb") as handle:
        handle.write(os.urandom(_KEY_BYTES))
    return _read_cache_secret(path)


def _signature(key: bytes, relative: str, stat_key: list[int], digest: str) -> str:
    message = json.dumps(["dsa-export verified 1", relative, stat_key, digest]).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _signed_digest(key: bytes | None, relative: str, entry: object, stat_key: list[int]) -> str | None:
    """The sha256 of an in-folder cache entry when it is for this file version and this user's
    key signed it; None otherwise (a forged or foreign entry is no entry)."""
    if key is None or not isinstance(entry, dict) or entry.get("key") != stat_key:
        return None
    digest, signature = entry.get("sha256"), entry.get("hmac")
    if not isinstance(digest, str) or not isinstance(signature, str):
        return None
    if not hmac.compare_digest(signature, _signature(key, relative, stat_key, digest)):
        return None
    return digest


#: Entries kept in the user's cache (oldest dropped first).
USER_CACHE_ENTRIES = 2000


def known_digest(folder: str | os.PathLike[str], relative: str) -> str | None:
    """The sha256 the folder's own cache holds for ``relative``, if the file is unchanged since and
    the entry carries this user's signature."""
    folder = Path(folder)
    key = cache_secret()
    if key is None:
        return None
    try:
        current = _cache_key(os.stat(folder / relative))
    except OSError:
        return None
    return _signed_digest(key, relative, _read_json(folder / VERIFY_CACHE_NAME).get(relative), current)


def remember_hashes(folder: str | os.PathLike[str], hashes: dict[str, str]) -> None:
    """Record ``{relative: sha256}`` of files just written in the folder's own cache, signed with
    this user's key (:func:`cache_secret`), so the first run hashes nothing; without a key nothing is
    recorded."""
    folder = Path(folder)
    key = cache_secret(create=True)
    if key is None:
        return
    cache = _read_json(folder / VERIFY_CACHE_NAME)
    for relative, digest in hashes.items():
        with contextlib.suppress(OSError):
            stat_key = _cache_key(os.stat(folder / relative))
            cache[relative] = {"key": stat_key, "sha256": digest, "hmac": _signature(key, relative, stat_key, digest)}
    _write_json(folder / VERIFY_CACHE_NAME, cache)


def _remember_verified(paths: dict[Path, str]) -> None:
    cache_file = user_cache_file()
    cache = _read_json(cache_file)
    for path, digest in paths.items():
        with contextlib.suppress(OSError):
            key = str(path.resolve())
            cache.pop(key, None)
            cache[key] = {"key": _cache_key(path.stat()), "sha256": digest}
    while len(cache) > USER_CACHE_ENTRIES:
        cache.pop(next(iter(cache)))
    _write_json(cache_file, cache)


def verify_files(folder: str | os.PathLike[str], records: dict[str, dict[str, Any]], names: Iterable[str], *,
                 source: str, enabled: bool = True) -> list[str]:
    """Check each of ``names`` (relative to ``folder``) against ``records`` before it is loaded.

    ``records`` maps a relative path to ``{"size": bytes, "sha256": hex}`` (size may be absent in
    older files); ``source`` names the file that recorded them (for the message). Raises a
    one-sentence DSAUserError naming the first file that is missing, of another size or of another
    hash. Returns the names that have no record (nothing to check them against). ``enabled=False``
    (``--no-verify``) checks nothing.

    A hash is computed once per file version: the folder's own cache (written by the build) and
    the user's cache (:func:`user_cache_file`, written by readers, which never write into the folder
    they read) remember it by size, modification and change time and inode. An entry of the
    folder's cache counts only with this user's signature (:func:`cache_secret`): the folder cannot
    vouch for itself, so a forged or copied ``.verified.json`` only costs a hash.
    """
    folder = Path(folder)
    if not enabled:
        return []
    unrecorded = []
    secret = cache_secret()
    local = _read_json(folder / VERIFY_CACHE_NAME) if secret is not None else {}
    user = None
    fresh: dict[Path, str] = {}
    for name in dict.fromkeys(names):
        path = confined(folder, name, f"the file '{name}' named in {source}")
        record = records.get(name)
        if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
            unrecorded.append(name)
            continue
        if not path.is_file():
            raise DSAUserError(f"'{path}' is missing, though {source} lists it; {REBUILD}.")
        stat = path.stat()
        size = record.get("size")
        if isinstance(size, int) and stat.st_size != size:
            raise DSAUserError(
                f"'{path}' is {stat.st_size} bytes but {source} records {size}: it was truncated or replaced after "
                f"it was written; {REBUILD} (or pass --no-verify to use it anyway)."
            )
        key = _cache_key(stat)
        if user is None:
            user = _read_json(user_cache_file())
        cached = user.get(str(path.resolve()))
        if _signed_digest(secret, name, local.get(name), key) == record["sha256"] or (
                isinstance(cached, dict) and cached.get("key") == key and cached.get("sha256") == record["sha256"]):
            continue
        from dsa_export.fileio import sha256_file

        digest = sha256_file(path)
        if digest != record["sha256"]:
            raise DSAUserError(
                f"'{path}' does not match the sha256 that {source} records for it: it was changed or damaged after "
                f"it was written; {REBUILD} (or pass --no-verify to use it anyway)."
            )
        fresh[path] = digest
    if fresh:
        _remember_verified(fresh)
    return unrecorded


def external_data_files(onnx_path: str | os.PathLike[str]) -> list[str]:
    """Relative locations of the external data files an ONNX file reads (weights not loaded)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    found: dict[str, None] = {}

    def visit(tensors) -> None:
        for tensor in tensors:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                for entry in tensor.external_data:
                    if entry.key == "location":
                        found.setdefault(entry.value, None)

    visit(model.graph.initializer)
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                visit([attribute.t])
    return list(found)


def _external_tensors(model) -> Iterator[tuple[Any, str]]:
    """Every tensor of ``model`` that could hold external data, with where it sits: initializers,
    sparse initializers, tensor attributes, in subgraphs and functions too."""
    import onnx

    def tensors_of(graph, where: str) -> Iterator[tuple[Any, str]]:
        for tensor in graph.initializer:
            yield tensor, f"initializer '{tensor.name}'"
        for sparse in graph.sparse_initializer:
            yield sparse.values, f"sparse initializer '{sparse.values.name}'"
            yield sparse.indices, f"the indices of sparse initializer '{sparse.values.name}'"
        yield from nodes_of(graph.node)

    def nodes_of(nodes) -> Iterator[tuple[Any, str]]:
        for node in nodes:
            for attribute in node.attribute:
                where = f"attribute '{attribute.name}' of node '{node.name or node.op_type}'"
                if attribute.type == onnx.AttributeProto.TENSOR:
                    yield attribute.t, where
                elif attribute.type == onnx.AttributeProto.TENSORS:
                    yield from ((t, where) for t in attribute.tensors)
                elif attribute.type == onnx.AttributeProto.SPARSE_TENSOR:
                    yield attribute.sparse_tensor.values, where
                    yield attribute.sparse_tensor.indices, where
                elif attribute.type == onnx.AttributeProto.GRAPH:
                    yield from tensors_of(attribute.g, where)
                elif attribute.type == onnx.AttributeProto.GRAPHS:
                    for graph in attribute.graphs:
                        yield from tensors_of(graph, where)

    yield from tensors_of(model.graph, "")
    for function in model.functions:
        yield from nodes_of(function.node)


#: Bytes per element of the ONNX tensor types (``TensorProto.DataType``) whose raw data may be external.
_ELEMENT_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
                  17: 1, 18: 1, 19: 1, 20: 1, 24: 1}
#: Packed types: elements per byte (uint4, int4, float4e2m1; uint2, int2).
_PACKED_TYPES = {21: 2, 22: 2, 23: 2, 25: 4, 26: 4}


def _tensor_bytes(tensor) -> int | None:
    """Bytes of a tensor's raw data from its type and dims; None when they say nothing usable."""
    count = 1
    for dim in tensor.dims:
        if dim < 0:
            return None
        count *= dim
    if tensor.data_type in _PACKED_TYPES:
        per_byte = _PACKED_TYPES[tensor.data_type]
        return (count + per_byte - 1) // per_byte
    size = _ELEMENT_BYTES.get(tensor.data_type)
    return None if size is None else count * size


def check_external_data(onnx_path: str | os.PathLike[str], model=None, *,
                        remedy: str = "export the model again", missing_ok: bool = False) -> list[str]:
    """Refuse an ONNX file whose external data would be read from anywhere but its own folder, or
    from past the end of a data file; returns the data files' relative locations.

    Call it before an .onnx goes to ONNX Runtime, ``onnx.load(load_external_data=True)``,
    Polygraphy or TensorRT (``run``, ``validate``, ``inspect`` and ``build`` do, through
    :func:`dsa_export.onnx_files.load_graph` and :mod:`dsa_export.runtime.onnxrt`): each tensor's
    ``location`` must be a relative path inside the folder of ``onnx_path`` once symbolic links
    are resolved (:func:`confined`), name a regular file, and its ``offset`` and ``length`` (or the
    bytes its type and dims need) must lie within that file. ``model`` is the file's graph when it
    is already loaded (without its external data; it is read from ``onnx_path`` otherwise); the
    data is read relative to ``onnx_path``'s folder either way. ``missing_ok``: a data file that is not there is left to
    whoever reads it (``inspect`` reads no weights). One sentence per refusal, ending in ``remedy``.
    """
    import onnx

    path = Path(onnx_path)
    if model is None:
        model = onnx.load(str(path), load_external_data=False)
    folder = path.parent
    sizes: dict[str, int | None] = {}
    for tensor, where in _external_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        what = f"the external data location of {where} in '{path}'"
        if "location" not in entries:
            raise DSAUserError(f"{where} of '{path}' is stored as external data but names no location; {remedy}.")
        location = entries["location"]
        if location not in sizes:
            data = confined(folder, location, what, remedy=remedy)
            try:
                info = data.stat()
            except OSError:
                if not missing_ok:
                    raise DSAUserError(f"'{data}', the external data of '{path}', is missing; {remedy}.") from None
                sizes[location] = None
                continue
            if not stat_module.S_ISREG(info.st_mode):
                raise DSAUserError(f"{what} is '{_shown(location)}', which is not a regular file; {remedy}.")
            sizes[location] = info.st_size
        size = sizes[location]
        if size is None:
            continue
        bounds = []
        for field in ("offset", "length"):
            text = entries.get(field)
            if text is None:
                bounds.append(None)
                continue
            if not (text.isascii() and text.isdigit() and len(text) <= 20):
                raise DSAUserError(f"{where} of '{path}' has the external data {field} '{_shown(text)}', not a byte "
                                   f"count; {remedy}.")
            bounds.append(int(text))
        offset, length = bounds[0] or 0, bounds[1]
        if length is None:
            length = _tensor_bytes(tensor) or 0
        if offset + length > size:
            raise DSAUserError(f"{where} of '{path}' is bytes {offset}..{offset + length} of '{_shown(location)}', "
                               f"which holds only {size} bytes; {remedy}.")
    return list(sizes)


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
    if META_MODEL_CONFIG in meta:
        try:
            vocab = json.loads(meta[META_MODEL_CONFIG]).get("vocab_size")
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

    from dsa_export.runtime.memory import GiB, HEADROOM, available_memory

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


def verify_engine(engine: str | os.PathLike[str], *, enabled: bool = True) -> list[str]:
    """Check an engine file against the ``manifest.json`` beside it (size and sha256) before it is
    read; for ``check --engine`` and any other reader of a plan. Returns notes (no record)."""
    path = Path(engine)
    if not enabled or not path.is_file() or not (path.parent / MANIFEST_NAME).is_file():
        return []
    return read_manifest(path.parent).verify([path])


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


__all__ = [
    "ENGINE_NAME",
    "FILES_KEY",
    "VERIFY_CACHE_NAME",
    "MANIFEST_NAME",
    "ONNX_NAME",
    "ORT_DIR",
    "ORT_MODEL_NAME",
    "ORT_SESSION_NAME",
    "PIPELINE_NAME",
    "SCHEMA_VERSION",
    "VALIDATION_NAME",
    "Manifest",
    "known_digest",
    "recorded_digests",
    "Pipeline",
    "StageFiles",
    "StageLink",
    "TensorSpec",
    "cache_secret",
    "check_external_data",
    "check_feeds",
    "check_fields",
    "check_shapes",
    "confined",
    "external_data_files",
    "io_specs",
    "make_inputs",
    "read_manifest",
    "read_pipeline",
    "remember_hashes",
    "verify_engine",
    "verify_files",
    "verify_recorded_onnx",
    "write_manifest",
]
