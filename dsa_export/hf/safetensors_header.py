"""The header of a safetensors file, checked by the rules of the safetensors library before we trust it.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of UTF-8 JSON and
the data section. The safetensors library (``safetensors/src/tensor.rs``: ``read_metadata`` and
``Metadata::validate``) accepts a header only if

* ``N`` is at most 100,000,000 and the file holds at least ``8 + N`` bytes;
* the JSON is an object; ``__metadata__``, when present, is an object of string -> string;
* every other entry is an object with ``dtype`` (a known code; here one of :data:`DTYPE_BYTES`,
  the library's codes that dsa-export reads), ``shape`` (a list of non-negative
  integers whose product does not overflow) and ``data_offsets`` ``[begin, end]`` (integers,
  ``begin <= end``);
* ``end - begin`` is the shape's element count times the dtype's size;
* the entries sorted by offset tile the data section from 0 without a hole or an overlap and end
  exactly where the file ends.

:func:`parse_header` applies those rules (duplicate JSON keys, non-finite numbers and dimensions
above :data:`MAX_DIM` are refused too), by arithmetic only: a shape is never allocated, so a header
that claims a petabyte costs nothing to refuse. It raises ``ValueError`` with the reason; callers
word the error (see :func:`dsa_export.hf.checkpoint.read_header`).
"""

from __future__ import annotations

import json
from typing import Any

#: The safetensors library's limit on the header length (``MAX_HEADER_SIZE``).
MAX_HEADER = 100_000_000
#: The largest dimension taken seriously: no real tensor has an axis of 2**40 elements.
MAX_DIM = 1 << 40
#: Element counts past this overflow the library's 64-bit arithmetic.
_MAX_ELEMENTS = (1 << 64) - 1

#: safetensors dtype code -> bytes per element: the dtypes dsa-export reads.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
               "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}

METADATA_KEY = "__metadata__"


class _Refused(ValueError):
    """A rule of ours broken while the JSON is parsed."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"the header names '{_short(key)}' twice")
            seen.add(key)
    return out


def _no_constant(name: str) -> Any:
    raise _Refused(f"the header holds {name}, which is not JSON")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _shape_text(shape: list[int]) -> str:
    return str(shape) if len(shape) <= 8 else str(shape[:8])[:-1] + f", ... ({len(shape)} dims)]"


def parse_header(raw: bytes, data_bytes: int) -> dict[str, Any]:
    """The header object of a safetensors file from its ``raw`` JSON bytes, given that the data
    section after it holds ``data_bytes`` bytes; ``ValueError`` (the reason) when a rule is broken."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the header is not UTF-8 text") from None
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the header is not JSON: {exc.msg} at character {exc.pos}") from None
    except _Refused:
        raise
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ValueError(f"the header is not JSON a safetensors reader accepts: {_short(str(exc))}") from None
    except RecursionError:
        raise ValueError("the header nests too deeply") from None
    if not isinstance(header, dict):
        kind = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(header), "null")
        raise ValueError(f"the header is a JSON {kind}, not an object")
    metadata = header.get(METADATA_KEY)
    if metadata is not None and not (type(metadata) is dict and all(type(v) is str for v in metadata.values())):
        raise ValueError(f"its {METADATA_KEY} is not an object of strings")
    spans = sorted((*_tensor_span(key, entry), key) for key, entry in header.items() if key != METADATA_KEY)
    position = 0
    for begin, end, key in spans:
        if begin < position:
            raise ValueError(f"tensor '{_short(key)}' at bytes {begin}:{end} overlaps the tensor before it")
        if begin > position:
            raise ValueError(f"bytes {position}:{begin} before tensor '{_short(key)}' belong to no tensor")
        position = end
    if position > data_bytes:
        raise ValueError(f"its tensors need {position} data bytes but it holds {data_bytes}: an interrupted download")
    if position < data_bytes:
        raise ValueError(f"{data_bytes - position} bytes after its last tensor belong to no tensor")
    return header


def _tensor_span(key: str, entry: Any) -> tuple[int, int]:
    """``(begin, end)`` of one header entry, after checking its dtype, shape and size (``type(x) is
    int`` leaves out booleans; the element count is checked for overflow at every step, so a shape
    of a million huge dimensions costs a comparison each, never a giant multiplication)."""
    if type(entry) is not dict:
        raise ValueError(f"the entry of tensor '{_short(key)}' is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    width = DTYPE_BYTES.get(dtype) if type(dtype) is str else None
    if width is None:
        shown = _short(dtype) if isinstance(dtype, str) else repr(dtype)[:40]
        raise ValueError(f"tensor '{_short(key)}' has dtype '{shown}', which is not one of {', '.join(DTYPE_BYTES)}")
    if type(shape) is not list:
        raise ValueError(f"the shape of tensor '{_short(key)}' is not a list of integers")
    numel = 1
    for d in shape:
        if type(d) is not int:
            raise ValueError(f"the shape of tensor '{_short(key)}' is not a list of integers")
        if d < 0:
            raise ValueError(f"tensor '{_short(key)}' has the negative dimension {_short(str(d))}")
        if d > MAX_DIM:
            raise ValueError(f"tensor '{_short(key)}' has the implausible dimension {_short(str(d))}")
        numel *= d
        if numel > _MAX_ELEMENTS:
            raise ValueError(f"the shape of tensor '{_short(key)}' overflows")
    if type(offsets) is not list or len(offsets) != 2 or type(offsets[0]) is not int or type(offsets[1]) is not int:
        raise ValueError(f"the data_offsets of tensor '{_short(key)}' are not two integers [begin, end]")
    begin, end = offsets
    if begin < 0 or end < begin:
        raise ValueError(f"tensor '{_short(key)}' has the data_offsets [{_short(str(begin))}, {_short(str(end))}], "
                         "not 0 <= begin <= end")
    if end - begin != numel * width:
        raise ValueError(f"tensor '{_short(key)}' spans {_short(str(end - begin))} bytes but {dtype} "
                         f"{_shape_text(shape)} needs {numel * width}")
    return begin, end
