"""The safetensors of a Hugging Face directory, read one tensor (or one row block) at a time.

A DeepSeek-V3.2 checkpoint is ~690 GB in 163 shards; nothing here ever holds more than the row
block being read. Reads are plain ``pread`` calls at the offsets the shard headers give, not memory
maps: a mapped shard's pages count toward the process's resident memory for as long as the map
lives, so mapping a 5 GB shard to stream it would grow the RSS by what was read. The shard index (``model.safetensors.index.json``) maps every key to its shard; a
directory with a single ``model.safetensors`` (or several shards and no index) is read by scanning
the shard headers. Shapes and dtypes come from the headers, so the planner and the exporter know
every tensor before any data is read.

The fingerprint of a checkpoint (:meth:`SafetensorsCheckpoint.fingerprint`) hashes every shard's
name, size and header (key, dtype, shape, offsets): it identifies the weights without reading
690 GB.

Every field of these files is untrusted input. The index is read by :func:`read_index`, which
accepts only a JSON object whose ``weight_map`` maps tensor names to ``.safetensors`` files inside
the checkpoint folder (no absolute paths, no ``..`` out of it, no links resolving outside it), and
every shard header is checked by the safetensors library's rules (:func:`read_header`) before an
offset or shape from it is used. The exporter checks each tensor's shape against the module built
from config.json (:func:`dsa_export.hf.weights.weight_recipes`) before reading its data.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUserError
from dsa_export.hf.safetensors_header import (  # noqa: F401  (DTYPE_BYTES re-exported)
    DTYPE_BYTES,
    MAX_HEADER,
    METADATA_KEY,
    parse_header,
)

INDEX_NAME = "model.safetensors.index.json"
#: An index larger than this is not a shard index (DeepSeek-V3.2's, ~92k keys, is ~9 MB).
MAX_INDEX_BYTES = 256 << 20
_REDOWNLOAD_INDEX = "re-download the checkpoint's model.safetensors.index.json"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives and what it is, from its shard's header."""

    key: str
    shard: str
    dtype: str  # safetensors code: BF16, F32, F8_E4M3, ...
    shape: tuple[int, ...]
    nbytes: int
    offset: int = 0  # of the first byte in the shard file


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of one safetensors file and the offset where its data starts (no tensor
    data is read).

    The header is checked as the safetensors library checks it (:mod:`dsa_export.hf.safetensors_header`):
    known dtypes, non-negative shapes, every tensor's byte range the size its shape needs, the
    ranges tiling the data section exactly. A shard shorter than its header promises (an
    interrupted download), one with overlapping or unowned bytes, or one that is not a regular
    file is refused.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError("not a regular file")
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(8)
            if len(head) != 8:
                raise ValueError("shorter than its header length")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER:
                raise ValueError(f"header length {length} is implausible")
            raw = handle.read(length)
        if len(raw) != length:
            raise ValueError(f"its header of {length} bytes is longer than the file: an interrupted download")
        header = parse_header(raw, size - 8 - length)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise DSAUserError(f"'{path}' is not a readable safetensors file ({reason}); re-download that shard.") from exc
    return header, 8 + length


def read_index(folder: str | Path) -> dict[str, str] | None:
    """The ``weight_map`` of ``folder``'s ``model.safetensors.index.json`` (tensor key -> shard
    file name, normalized), or None when the folder has no index.

    Every field is checked before it is used: the file is a JSON object whose ``weight_map`` is a
    non-empty object of string -> string, and each shard name is a relative path to a
    ``.safetensors`` file inside ``folder`` (:func:`shard_name`).
    """
    folder = Path(folder)
    index = folder / INDEX_NAME
    if not index.is_file():
        return None
    try:
        size = index.stat().st_size
        if size > MAX_INDEX_BYTES:
            raise DSAUserError(f"'{index}' is {size} bytes, far more than a shard index; {_REDOWNLOAD_INDEX}.")
        data = json.loads(index.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise DSAUserError(f"'{index}' cannot be read ({exc.strerror or exc}); {_REDOWNLOAD_INDEX}.") from exc
    except UnicodeDecodeError as exc:
        raise DSAUserError(f"'{index}' is not UTF-8 text; {_REDOWNLOAD_INDEX}.") from exc
    except json.JSONDecodeError as exc:
        raise DSAUserError(f"'{index}' is not valid JSON ({exc.msg} at line {exc.lineno}); {_REDOWNLOAD_INDEX}.") from exc
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise DSAUserError(f"'{index}' is not JSON that dsa-export reads ({_short(exc)}); {_REDOWNLOAD_INDEX}.") from exc
    except RecursionError as exc:
        raise DSAUserError(f"'{index}' nests too deeply to be a shard index; {_REDOWNLOAD_INDEX}.") from exc
    if not isinstance(data, dict):
        raise DSAUserError(f"'{index}' holds a JSON {_json_type(data)}, not an object with a weight_map; "
                           f"{_REDOWNLOAD_INDEX}.")
    if "weight_map" not in data:
        raise DSAUserError(f"'{index}' has no field weight_map; {_REDOWNLOAD_INDEX}.")
    weight_map = data["weight_map"]
    if not isinstance(weight_map, dict):
        raise DSAUserError(f"field weight_map of '{index}' is a JSON {_json_type(weight_map)}, not an object of "
                           f"tensor name -> shard file; {_REDOWNLOAD_INDEX}.")
    if not weight_map:
        raise DSAUserError(f"field weight_map of '{index}' is empty; {_REDOWNLOAD_INDEX}.")
    names: dict[str, str] = {}
    out: dict[str, str] = {}
    for key, shard in weight_map.items():
        if shard not in names:
            where = f"field weight_map['{_short(key)}'] of '{index}'"
            if not isinstance(shard, str):
                raise DSAUserError(f"{where} is a JSON {_json_type(shard)}, not a shard file name; "
                                   f"{_REDOWNLOAD_INDEX}.")
            names[shard] = shard_name(folder, shard, where)
        out[key] = names[shard]
    return out


def shard_name(folder: Path, name: str, what: str) -> str:
    """``name`` normalized, refusing anything but a relative path to a ``.safetensors`` file inside ``folder``.

    ``what`` names where the name was read. Absolute paths, paths that leave ``folder`` through
    ``..`` and symbolic links that resolve outside it are refused (by
    :func:`dsa_export.integrity.confined`), except the links of a Hugging Face hub cache snapshot
    (``models--ORG--NAME/snapshots/REV/FILE -> ../../blobs/HASH``), which stay inside that
    model's own cache.
    """
    from dsa_export.integrity import confined

    fix = _REDOWNLOAD_INDEX if what.startswith("field ") else "remove it or re-download the checkpoint"
    try:
        root = folder.resolve()
    except (OSError, RuntimeError) as exc:
        raise DSAUserError(f"the checkpoint folder '{folder}' cannot be resolved ({exc}); {fix}.") from exc
    path = confined(folder, name, what, remedy=fix, place=f"the checkpoint folder '{folder}'", suffix=".safetensors",
                    also_inside=_allowed_roots(root)[1:], link_remedy="put the file itself in the folder")
    return path.relative_to(folder).as_posix()


def _allowed_roots(root: Path) -> list[Path]:
    """Where the shards of the resolved checkpoint folder ``root`` may live."""
    roots = [root]
    repo = root.parent.parent
    if root.parent.name == "snapshots" and repo.name.startswith("models--") and (repo / "blobs").is_dir():
        roots.append((repo / "blobs").resolve())
    return roots


def shard_names(folder: str | Path) -> tuple[list[str], dict[str, str] | None]:
    """The shard file names of a checkpoint folder (sorted, checked by :func:`shard_name`) and its
    index's weight_map, or None when the folder has no index and every ``*.safetensors`` is a shard."""
    folder = Path(folder)
    weight_map = read_index(folder)
    if weight_map is not None:
        return sorted(set(weight_map.values())), weight_map
    names = sorted(p.name for p in folder.glob("*.safetensors"))
    return [shard_name(folder, n, "a shard of the folder") for n in names], None


def _json_type(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _short(text: Any, limit: int = 80) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


class SafetensorsCheckpoint:
    """Every tensor of a checkpoint directory, by key, with lazy reads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        shards, weight_map = shard_names(self.path)
        if not shards:
            raise DSAUserError(f"'{self.path}' has no .safetensors weight files.")
        self.shards = shards
        self.tensors: dict[str, TensorInfo] = {}
        self._headers: dict[str, bytes] = {}
        #: every shard's parsed (and checked) header, in shard order: read once, here.
        self.headers: dict[str, dict] = {}
        for shard in shards:
            file = self.path / shard
            if not file.is_file():
                raise DSAUserError(f"shard '{shard}' named by '{INDEX_NAME}' is missing from '{self.path}'.")
            header, data_start = read_header(file)
            self.headers[shard] = header
            self._headers[shard] = json.dumps(header, sort_keys=True).encode()
            for key, entry in header.items():
                if key == METADATA_KEY:
                    continue
                if key in self.tensors:
                    raise DSAUserError(f"tensor '{_short(key)}' is in both '{self.tensors[key].shard}' and '{shard}' of "
                                       f"'{self.path}'; remove the stray shard or re-download the checkpoint.")
                begin, end = entry["data_offsets"]
                self.tensors[key] = TensorInfo(key, shard, entry["dtype"], tuple(entry["shape"]), end - begin,
                                               data_start + begin)
        if weight_map is not None:
            index_file = self.path / INDEX_NAME
            missing = sorted(k for k, shard in weight_map.items() if self.tensors.get(k, None) is None
                             or self.tensors[k].shard != shard)
            if missing:
                raise DSAUserError(
                    f"'{index_file}' names {len(missing)} tensors its shards do not hold (first: '{_short(missing[0])}'); "
                    "the checkpoint is incomplete."
                )

    # -- metadata ------------------------------------------------------------------------------
    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def info(self, key: str) -> TensorInfo:
        try:
            return self.tensors[key]
        except KeyError:
            raise DSAUserError(f"the checkpoint in '{self.path}' has no tensor '{key}'; it is incomplete or of "
                               "another model.") from None

    def keys(self) -> list[str]:
        return list(self.tensors)

    def fingerprint(self) -> str:
        """sha256 over every shard's name, size and header: identifies the weights cheaply."""
        digest = hashlib.sha256()
        for shard in self.shards:
            digest.update(shard.encode())
            digest.update(str((self.path / shard).stat().st_size).encode())
            digest.update(self._headers[shard])
        return digest.hexdigest()

    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    # -- data ------------------------------------------------------------------------------------
    def _read(self, info: TensorInfo, start_byte: int, nbytes: int, shape: tuple[int, ...]):
        import torch

        buffer = bytearray(nbytes)
        with open(self.path / info.shard, "rb", buffering=0) as handle:
            view, done = memoryview(buffer), 0
            while done < nbytes:
                got = os.preadv(handle.fileno(), [view[done:]], info.offset + start_byte + done)
                if got <= 0:
                    raise DSAUserError(f"'{self.path / info.shard}' ended inside tensor '{info.key}'; re-download it.")
                done += got
        flat = torch.frombuffer(buffer, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
        return flat.view(_TORCH_DTYPES[info.dtype]).reshape(shape)

    def read(self, key: str):
        """The whole tensor ``key`` as a CPU torch tensor in its stored dtype."""
        info = self.info(key)
        return self._read(info, 0, info.nbytes, info.shape)

    def read_rows(self, key: str, start: int, stop: int):
        """Rows ``start:stop`` of tensor ``key`` (first axis), for writing large tensors in pieces."""
        info = self.info(key)
        if not info.shape:
            return self.read(key)
        rows = info.shape[0]
        start, stop = max(0, min(start, rows)), max(0, min(stop, rows))
        row_bytes = info.nbytes // rows if rows else 0
        return self._read(info, start * row_bytes, (stop - start) * row_bytes, (stop - start, *info.shape[1:]))

    def iter_row_blocks(self, key: str, max_bytes: int = 256 << 20) -> Iterator[Any]:
        """Tensor ``key`` in blocks of whole rows of at most ``max_bytes`` (one row at least)."""
        info = self.info(key)
        rows = info.shape[0] if info.shape else 1
        if not info.shape or info.nbytes <= max_bytes:
            yield self.read(key)
            return
        step = max(1, max_bytes // max(1, info.nbytes // rows))
        for start in range(0, rows, step):
            yield self.read_rows(key, start, min(rows, start + step))

    def close(self) -> None:
        """Nothing stays open between reads; kept for callers that scope the checkpoint."""


def _torch_dtypes() -> dict[str, Any]:
    import torch

    return {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
            "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


class _LazyDtypes(dict):
    def __missing__(self, key):
        self.update(_torch_dtypes())
        return dict.__getitem__(self, key)


_TORCH_DTYPES = _LazyDtypes()
