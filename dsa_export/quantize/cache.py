"""TensorRT 10 INT8 calibration cache: read and write TensorRT's text format.

TensorRT 11 dropped implicit INT8 calibration; TensorRT 10 still accepts a calibration cache
through ``IInt8Calibrator::readCalibrationCache`` (``trtexec --int8 --calib=FILE``). The format,
as TensorRT's calibrators write it::

    TRT-<version>-EntropyCalibration2
    <tensor name>: <8 hex digits>

where ``<version>`` is ``major * 10000 + minor * 100 + patch`` (``100300`` for 10.3.0) and the hex
digits are the IEEE-754 float32 bit pattern of the tensor's scale, most significant byte first
(amax / 127 for INT8). TensorRT ignores a cache whose header names another version or calibrator.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsa_export.errors import DSAUserError
from dsa_export.fileio import atomic_output

#: TensorRT version written into new caches unless the caller names another (the last 10.x line
#: that still reads caches is what users of this path run).
DEFAULT_TRT_VERSION = "10.3.0"
CALIBRATOR = "EntropyCalibration2"
_HEADER = re.compile(r"^TRT-(\d+)-(\w+)$")


@dataclass
class CalibrationCache:
    """Per-tensor INT8 scales with the TensorRT version and calibrator named in the header."""

    scales: dict[str, np.float32] = field(default_factory=dict)
    version: int = 100300
    calibrator: str = CALIBRATOR

    @property
    def header(self) -> str:
        return f"TRT-{self.version}-{self.calibrator}"


def version_number(version: str) -> int:
    """``"10.3.0"`` -> ``100300``, TensorRT's ``NV_TENSORRT_VERSION`` encoding since 10.0."""
    parts = version.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise DSAUserError(f"'{version}' is not a TensorRT version; write it as MAJOR.MINOR.PATCH, e.g. 10.3.0.")
    major, minor, patch = (int(p) for p in (parts + ["0", "0"])[:3])
    if major != 10:
        raise DSAUserError(
            f"calibration caches are for TensorRT 10 (TensorRT {major} "
            f"{'reads Q/DQ only' if major > 10 else 'uses another numbering'}); pass a 10.x version."
        )
    return major * 10000 + minor * 100 + patch


def scale_to_hex(scale: float) -> str:
    """The big-endian hex of a float32's bits: 1.0 -> ``3f800000``."""
    return struct.pack(">f", np.float32(scale)).hex()


def hex_to_scale(text: str) -> np.float32:
    bits = int(text, 16)
    if bits >= 1 << 32:
        raise ValueError(text)
    return np.float32(struct.unpack(">f", bits.to_bytes(4, "big"))[0])


def format_cache(cache: CalibrationCache) -> str:
    lines = [cache.header]
    for name in sorted(cache.scales):
        lines.append(f"{name}: {scale_to_hex(cache.scales[name])}")
    return "\n".join(lines) + "\n"


def write_cache(cache: CalibrationCache, path: str | Path) -> Path:
    """Write ``cache`` atomically; tensor names may not contain ':' followed by a space or newlines."""
    for name in cache.scales:
        if "\n" in name or not name.strip():
            raise DSAUserError(f"tensor name {name!r} cannot be written into a TensorRT calibration cache.")
    with atomic_output(path) as tmp:
        tmp.write_text(format_cache(cache), encoding="utf-8")
    return Path(path)


def parse_cache(text: str, source: str = "the cache") -> CalibrationCache:
    lines = [line.rstrip("\r") for line in text.splitlines() if line.strip()]
    if not lines:
        raise DSAUserError(f"{source} is empty; pass a TensorRT calibration cache.")
    match = _HEADER.match(lines[0].strip())
    if not match:
        raise DSAUserError(
            f"{source} does not start with a 'TRT-<version>-<calibrator>' line; pass a TensorRT calibration cache."
        )
    cache = CalibrationCache(version=int(match.group(1)), calibrator=match.group(2))
    for number, line in enumerate(lines[1:], start=2):
        # Names may contain ': ' themselves (TensorRT's "(Unnamed Layer* 3) [Shuffle]_output"), so split last.
        name, sep, value = line.rpartition(":")
        try:
            if not sep or not name.strip():
                raise ValueError(line)
            scale = hex_to_scale(value.strip())
        except ValueError:
            raise DSAUserError(f"line {number} of {source} is not 'tensor: <hex scale>': {line!r}.") from None
        if not np.isfinite(scale) or scale < 0:
            raise DSAUserError(f"line {number} of {source} holds scale {scale} for '{name.strip()}'; scales must be finite and >= 0.")
        cache.scales[name.strip()] = scale
    return cache


def read_cache(path: str | Path) -> CalibrationCache:
    path = Path(path)
    if not path.is_file():
        raise DSAUserError(f"calibration cache '{path}' does not exist.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DSAUserError(f"'{path}' is not a text calibration cache.") from None
    return parse_cache(text, f"'{path}'")
