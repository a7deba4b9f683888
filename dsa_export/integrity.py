"""Trust rules every reader of a build or pipeline folder shares: recorded paths stay inside the
folder, files match their recorded size and sha256 before they are loaded, and the external data
an .onnx names stays inside its folder and its data files.

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
  data files before ONNX Runtime, onnx, Polygraphy or TensorRT reads it (:func:`check_external_data`).

It imports neither torch, onnxruntime nor TensorRT (``onnx`` only when an .onnx is checked).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import posixpath
import stat as stat_module
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUserError

#: The hashes already checked, by size and modification/change time, so each is computed once.
VERIFY_CACHE_NAME = ".verified.json"
REBUILD = "rebuild the folder with `dsa-export build`"


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


__all__ = ["CACHE_SECRET_NAME", "REBUILD", "VERIFY_CACHE_NAME", "cache_secret", "check_external_data", "confined",
           "external_data_files", "known_digest", "remember_hashes", "user_cache_file", "verify_files"]
