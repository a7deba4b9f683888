"""The safetensors of a Hugging Face directory, read one tensor (or one row block) at a time.

A DeepSeek-V3.2 checkpoint is ~690 GB in 163 shards; nothing here ever holds more than the tensor
being read. The shard index (``model.safetensors.index.json``) maps every key to its shard; a
directory with a single ``model.safetensors`` (or several shards and no index) is read by scanning
the shard headers. Shapes and dtypes come from the headers, so the planner and the exporter know
every tensor before any data is read.

The fingerprint of a checkpoint (:meth:`SafetensorsCheckpoint.fingerprint`) hashes every shard's
name, size and header (key, dtype, shape, offsets): it identifies the weights without reading
690 GB.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUserError

INDEX_NAME = "model.safetensors.index.json"
#: Largest header a safetensors file may have (the format's own limit is 100 MB).
_MAX_HEADER = 100 << 20

#: safetensors dtype code -> bytes per element.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
               "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives and what it is, from its shard's header."""

    key: str
    shard: str
    dtype: str  # safetensors code: BF16, F32, F8_E4M3, ...
    shape: tuple[int, ...]
    nbytes: int


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (no tensor data is read)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) != 8:
                raise ValueError("file shorter than its header length")
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER:
                raise ValueError(f"header length {length} is implausible")
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as exc:
        raise DSAUserError(f"'{path}' is not a readable safetensors file ({exc}); re-download that shard.") from exc
    if not isinstance(header, dict):
        raise DSAUserError(f"'{path}' has a malformed safetensors header; re-download that shard.")
    return header


class SafetensorsCheckpoint:
    """Every tensor of a checkpoint directory, by key, with lazy reads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index_file = self.path / INDEX_NAME
        if index_file.is_file():
            try:
                weight_map = json.loads(index_file.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as exc:
                raise DSAUserError(f"'{index_file}' is not a valid shard index ({exc}); re-download it.") from exc
            shards = sorted(set(weight_map.values()))
        else:
            shards = sorted(p.name for p in self.path.glob("*.safetensors"))
            weight_map = None
        if not shards:
            raise DSAUserError(f"'{self.path}' has no .safetensors weight files.")
        self.shards = shards
        self.tensors: dict[str, TensorInfo] = {}
        self._headers: dict[str, bytes] = {}
        for shard in shards:
            file = self.path / shard
            if not file.is_file():
                raise DSAUserError(f"shard '{shard}' named by '{INDEX_NAME}' is missing from '{self.path}'.")
            header = read_header(file)
            self._headers[shard] = json.dumps(header, sort_keys=True).encode()
            for key, entry in header.items():
                if key == "__metadata__":
                    continue
                shape = tuple(int(d) for d in entry["shape"])
                begin, end = entry["data_offsets"]
                self.tensors[key] = TensorInfo(key, shard, entry["dtype"], shape, int(end) - int(begin))
        if weight_map is not None:
            missing = sorted(k for k, shard in weight_map.items() if self.tensors.get(k, None) is None
                             or self.tensors[k].shard != shard)
            if missing:
                raise DSAUserError(
                    f"'{index_file}' names {len(missing)} tensors its shards do not hold (first: '{missing[0]}'); "
                    "the checkpoint is incomplete."
                )
        self._open: dict[str, Any] = {}

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
    def _handle(self, shard: str):
        handle = self._open.get(shard)
        if handle is None:
            from safetensors import safe_open

            # One open handle per shard; safe_open maps the file and reads only the slices asked for.
            handle = self._open[shard] = safe_open(str(self.path / shard), framework="pt")
        return handle

    def read(self, key: str):
        """The whole tensor ``key`` as a CPU torch tensor in its stored dtype."""
        info = self.info(key)
        return self._handle(info.shard).get_slice(key)[:]

    def read_rows(self, key: str, start: int, stop: int):
        """Rows ``start:stop`` of tensor ``key`` (first axis), for writing large tensors in pieces."""
        info = self.info(key)
        return self._handle(info.shard).get_slice(key)[start:stop]

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
        self._open.clear()
