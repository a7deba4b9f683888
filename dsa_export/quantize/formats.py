"""The quantized formats by name, above their modules (:mod:`.int8`, :mod:`.fp8`) so that neither
they nor :mod:`.precision` import each other."""

from __future__ import annotations

from dsa_export.quantize.fp8 import FP8
from dsa_export.quantize.int8 import INT8
from dsa_export.quantize.precision import Precision

FORMATS: dict[str, Precision] = {p.name: p for p in (INT8, FP8)}


def get_precision(name: str) -> Precision:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}") from None


__all__ = ["FORMATS", "get_precision"]
