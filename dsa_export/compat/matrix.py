"""The compatibility matrix: data in ``matrix.json``, loaded and validated here, looked up by release."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export.compat.versions import Version, parse_version, version_matches

MATRIX_PATH = Path(__file__).with_name("matrix.json")
MATRIX_SCHEMA_VERSION = 1

# Table -> keys every row of it must have (besides "source").
_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "cuda": ("release", "driver_min", "minor_compat_floor", "sm"),
    "tensorrt": ("release", "cuda", "sm", "implicit_int8", "precision_flags"),
    "tensorrt_rtx": ("release", "cuda", "sm", "plugins"),
    "cudnn": ("release", "cuda", "sm"),
    "onnxruntime_gpu": ("release", "cuda", "cudnn"),
    "precision": ("backend", "precision", "sm"),
    "known_bad": ("id", "severity", "when", "message", "fix"),
}
_SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class CompatibilityMatrix:
    """The parsed matrix. Tables are lists of dict rows exactly as written in the JSON."""

    matrix_version: str
    tables: dict[str, list[dict[str, Any]]]

    def table(self, name: str) -> list[dict[str, Any]]:
        return self.tables.get(name, [])

    def release_row(self, table: str, version: Version | str | None) -> dict[str, Any] | None:
        """The row whose ``release`` is the longest prefix of ``version`` (10.3.0.26 -> "10.3", else "10")."""
        parsed = parse_version(version) if isinstance(version, str) else version
        if parsed is None:
            return None
        best: dict[str, Any] | None = None
        best_length = -1
        for row in self.table(table):
            release = parse_version(row["release"])
            if release is None or parsed[: len(release)] != release:
                continue
            if len(release) > best_length:
                best, best_length = row, len(release)
        return best

    def precision_row(self, backend: str, precision: str) -> dict[str, Any] | None:
        for row in self.table("precision"):
            if row["backend"] == backend and row["precision"] == precision:
                return row
        return None


def validate_matrix(data: dict[str, Any]) -> list[str]:
    """Problems with a matrix document; empty when it is well formed."""
    problems = []
    if data.get("schema_version") != MATRIX_SCHEMA_VERSION:
        problems.append(
            f"schema_version is {data.get('schema_version')!r}, expected {MATRIX_SCHEMA_VERSION}"
        )
    if not data.get("matrix_version"):
        problems.append("matrix_version is missing")
    for table, keys in _REQUIRED_KEYS.items():
        rows = data.get(table)
        if not isinstance(rows, list) or not rows:
            problems.append(f"table {table!r} is missing or empty")
            continue
        for index, row in enumerate(rows):
            where = f"{table}[{index}]"
            for key in (*keys, "source"):
                if key not in row:
                    problems.append(f"{where} lacks {key!r}")
            if not str(row.get("source", "")).strip():
                problems.append(f"{where} has an empty source")
            for key in ("cuda", "sm", "cudnn", "driver_min", "minor_compat_floor", "tensorrt"):
                value = row.get(key)
                if isinstance(value, (str, list)):
                    try:
                        version_matches("1.0", value)
                    except ValueError as exc:
                        problems.append(f"{where}.{key}: {exc}")
            if table == "known_bad" and row.get("severity") not in _SEVERITIES:
                problems.append(f"{where} has severity {row.get('severity')!r}")
    return problems


def load_matrix(path: str | Path | None = None) -> CompatibilityMatrix:
    """Load and validate the matrix (the packaged one by default). Raises ValueError when malformed."""
    return _load(str(path or MATRIX_PATH))


@functools.lru_cache(maxsize=4)
def _load(path: str) -> CompatibilityMatrix:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    problems = validate_matrix(data)
    if problems:
        raise ValueError(f"compatibility matrix {path} is malformed: " + "; ".join(problems[:5]))
    tables = {name: data[name] for name in _REQUIRED_KEYS}
    return CompatibilityMatrix(str(data["matrix_version"]), tables)
