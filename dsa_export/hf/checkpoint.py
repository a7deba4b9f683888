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
"""

from __future__ import annotations

import hashlib
import json
import math
import os
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
    offset: int = 0  # of the first byte in the shard file


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of one safetensors file and the offset where its data starts (no tensor
    data is read).

    A shard shorter than its header promises (an interrupted download) is refused.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) != 8:
                raise ValueError("shorter than its header length")
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER:
                raise ValueError(f"header length {length} is implausible")
            header = json.loads(handle.read(length))
            if not isinstance(header, dict):
                raise ValueError("the header is not a JSON object")
            data = os.fstat(handle.fileno()).st_size - 8 - length
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        if max(ends, default=0) > data:
            raise ValueError(f"its tensors need {max(ends)} data bytes but it holds {data}: an interrupted download")
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise DSAUserError(f"'{path}' is not a readable safetensors file ({exc}); re-download that shard.") from exc
    return header, 8 + length


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
            header, data_start = read_header(file)
            self._headers[shard] = json.dumps(header, sort_keys=True).encode()
            size = file.stat().st_size
            for key, entry in header.items():
                if key == "__metadata__":
                    continue
                shape = tuple(int(d) for d in entry["shape"])
                begin, end = (int(v) for v in entry["data_offsets"])
                if entry.get("dtype") not in DTYPE_BYTES or data_start + end > size or end - begin != math.prod(
                        shape) * DTYPE_BYTES[entry["dtype"]]:
                    raise DSAUserError(f"tensor '{key}' of '{file}' does not fit the file (dtype {entry.get('dtype')}, "
                                       f"shape {list(shape)}); the shard is damaged or incomplete, re-download it.")
                self.tensors[key] = TensorInfo(key, shard, entry["dtype"], shape, end - begin, data_start + begin)
        if weight_map is not None:
            missing = sorted(k for k, shard in weight_map.items() if self.tensors.get(k, None) is None
                             or self.tensors[k].shard != shard)
            if missing:
                raise DSAUserError(
                    f"'{index_file}' names {len(missing)} tensors its shards do not hold (first: '{missing[0]}'); "
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
