"""The compatibility matrix: data in ``matrix.json``, loaded and validated here, looked up by release.

Every row names the releases it applies to with a ``versions`` spec (the range language of
:mod:`dsa_export.compat.versions`), and one rule finds a row for every table: the row whose spec
matches the installed version. Specs of one table never overlap, so at most one row matches; a
release that no row matches is not in the matrix, and the rules say so instead of guessing.

Each fact a rule checks (a field such as ``cuda`` or ``sm``) is backed by ``evidence``: a document
from the ``documents`` table and the sentence or table cell quoted from it. A fact that no
published text supports is named in ``unverified`` with the reason; findings that rest on it are
only ever information. ``python -m dsa_export.compat.matrix_doc`` prints every row with its
sources and verdict (:mod:`dsa_export.compat.matrix_doc`; docs/compat.md embeds that listing).
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export.compat.versions import Version, format_version, parse_version, version_matches
from dsa_export.errors import DSAUserError

MATRIX_PATH = Path(__file__).with_name("matrix.json")
MATRIX_SCHEMA_VERSION = 2
PACKAGED = "packaged"


@dataclass(frozen=True)
class TableSpec:
    """What a table's rows hold: required keys, the facts rules check, and the keys that are version specs."""

    required: tuple[str, ...]
    facts: tuple[str, ...]
    versioned: bool = True  # rows are found by their ``versions`` spec


TABLES: dict[str, TableSpec] = {
    "cuda_major": TableSpec(("id", "versions", "minor_compat_floor"), ("minor_compat_floor",)),
    "cuda": TableSpec(("id", "versions", "driver_min"), ("driver_min", "sm")),
    "tensorrt": TableSpec(("id", "versions", "cuda", "sm"), ("cuda", "sm", "driver_min")),
    "tensorrt_rtx": TableSpec(("id", "versions", "cuda", "sm", "plugins"), ("cuda", "sm", "plugins")),
    "cudnn": TableSpec(("id", "versions", "builds"), ("builds",)),
    "onnxruntime_gpu": TableSpec(("id", "versions", "builds"), ("builds", "tensorrt")),
    "precision": TableSpec(("id", "backend", "precision", "sm"), ("sm",), versioned=False),
    "known_bad": TableSpec(("id", "severity", "when", "message", "fix"), ("when",), versioned=False),
}
SEVERITIES = ("error", "warning", "info")
ROW_KINDS = ("fact", "anecdote")
# Keys of a known_bad ``when`` that are not component version specs.
WHEN_LISTS = ("precision", "backend")
_COMPONENT_KEYS = (
    "driver", "cuda_driver", "cuda_runtime", "cudnn", "nvcc", "tensorrt", "tensorrt_rtx",
    "onnxruntime", "torch", "polygraphy",
)  # fmt: skip


class MatrixError(DSAUserError):
    """A matrix file that cannot be used; the message is one sentence naming the file and the first problem."""


@dataclass(frozen=True)
class Evidence:
    """One quoted passage and the document it comes from."""

    doc: str
    title: str
    url: str
    release: str
    quote: str
    fields: tuple[str, ...]

    def text(self) -> str:
        return f"{self.title} ({self.release}), {self.url}: \u201c{self.quote}\u201d"


@dataclass(frozen=True)
class CompatibilityMatrix:
    """The parsed matrix. Tables are lists of dict rows exactly as written in the JSON."""

    matrix_version: str
    matrix_date: str
    tables: dict[str, list[dict[str, Any]]]
    documents: dict[str, dict[str, str]]
    path: str = PACKAGED  # "packaged" or the file given with --matrix
    schema_version: int = MATRIX_SCHEMA_VERSION

    def table(self, name: str) -> list[dict[str, Any]]:
        return self.tables.get(name, [])

    def release_row(self, table: str, version: Version | str | None) -> dict[str, Any] | None:
        """The row of ``table`` whose ``versions`` spec matches ``version`` (None: not in the matrix)."""
        parsed = parse_version(version) if isinstance(version, str) else version
        if parsed is None:
            return None
        return next(
            (row for row in self.table(table) if version_matches(parsed, row["versions"])), None
        )

    def precision_row(self, backend: str, precision: str) -> dict[str, Any] | None:
        for row in self.table("precision"):
            if row["backend"] == backend and row["precision"] == precision:
                return row
        return None

    def rows(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for name in TABLES:
            for row in self.table(name):
                yield name, row

    def evidence(self, row: dict[str, Any], fields: tuple[str, ...] = ()) -> list[Evidence]:
        """The evidence of ``row`` that backs any of ``fields`` (all of it when none are named)."""
        found = []
        for item in row.get("evidence", []):
            if fields and not set(fields) & set(item["fields"]):
                continue
            document = self.documents[item["doc"]]
            found.append(
                Evidence(
                    item["doc"],
                    document["title"],
                    document["url"],
                    document["release"],
                    item["quote"],
                    tuple(item["fields"]),
                )
            )
        return found

    def unverified(self, row: dict[str, Any], fields: tuple[str, ...] = ()) -> dict[str, str]:
        """Reasons for the facts of ``row`` among ``fields`` (all when none are named) that no text supports."""
        reasons = row.get("unverified", {})
        return {k: v for k, v in reasons.items() if not fields or k in fields}

    def is_verified(self, row: dict[str, Any], fields: tuple[str, ...]) -> bool:
        return row.get("kind", "fact") != "anecdote" and not self.unverified(row, fields)

    def source_text(self, row: dict[str, Any], fields: tuple[str, ...]) -> str:
        """What a finding resting on ``fields`` of ``row`` cites: the quotes, or why there are none."""
        reasons = self.unverified(row, fields)
        if reasons:
            return f"{row['id']} (unverified: " + " ".join(reasons.values()) + ")"
        quotes = "; ".join(item.text() for item in self.evidence(row, fields))
        return f"{row['id']}: {quotes}"

    def verdict(self, row: dict[str, Any]) -> str:
        """verified, partly verified, unverified or anecdote: how much of the row published text supports."""
        if row.get("kind", "fact") == "anecdote":
            return "anecdote"
        reasons = self.unverified(row)
        if not reasons:
            return "verified"
        return "unverified" if not row.get("evidence") else "partly verified"

    def summary(self) -> dict[str, Any]:
        """What a report says about the matrix it used."""
        verdicts = [self.verdict(row) for _, row in self.rows()]
        return {
            "version": self.matrix_version,
            "date": self.matrix_date,
            "schema_version": self.schema_version,
            "path": self.path,
            "rows": len(verdicts),
            "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
        }


# ---------------------------------------------------------------------------------------------
# Validation


def _spec_problems(where: str, value: Any) -> list[str]:
    specs = value if isinstance(value, list) else [value]
    if not specs or not all(isinstance(spec, str) and spec.strip() for spec in specs):
        return [f"{where} is not a version spec or a list of them"]
    try:
        version_matches("1.0", specs)
    except ValueError as exc:
        return [f"{where}: {exc}"]
    return []


def _row_spec_problems(table: str, where: str, row: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    for key in ("versions", "minor_compat_floor", "sm", "cuda", "tensorrt"):
        if key in row:
            problems += _spec_problems(f"{where}.{key}", row[key])
    driver = row.get("driver_min")
    if isinstance(driver, dict):
        for major, floor in driver.items():
            if parse_version(major) is None:
                problems.append(f"{where}.driver_min has a key {major!r} that is not a CUDA major")
            problems += _spec_problems(f"{where}.driver_min[{major}]", floor)
    elif driver is not None:
        problems += _spec_problems(f"{where}.driver_min", driver)
    for index, build in enumerate(row.get("builds", [])):
        at = f"{where}.builds[{index}]"
        if not isinstance(build, dict) or "cuda" not in build:
            problems.append(f"{at} lacks 'cuda'")
            continue
        for key in ("cuda", "sm", "cudnn"):
            if key in build:
                problems += _spec_problems(f"{at}.{key}", build[key])
        if table == "onnxruntime_gpu" and ("cudnn" not in build or "pypi" not in build):
            problems.append(f"{at} lacks 'cudnn' or 'pypi'")
        if table == "cudnn" and "sm" not in build:
            problems.append(f"{at} lacks 'sm'")
    if table == "onnxruntime_gpu" and row.get("builds") and not any(
        b.get("pypi") for b in row["builds"] if isinstance(b, dict)
    ):
        problems.append(f"{where} has no build marked pypi")
    if table == "known_bad":
        when = row.get("when")
        if not isinstance(when, dict) or not when:
            problems.append(f"{where}.when is not a non-empty object")
        else:
            for key, spec in when.items():
                if key in WHEN_LISTS:
                    if not isinstance(spec, list) or not spec:
                        problems.append(f"{where}.when.{key} is not a non-empty list")
                elif key == "sm" or key in _COMPONENT_KEYS:
                    problems += _spec_problems(f"{where}.when.{key}", spec)
                else:
                    problems.append(f"{where}.when has an unknown key {key!r}")
    return problems


def _evidence_problems(
    where: str, row: dict[str, Any], facts: tuple[str, ...], documents: dict[str, Any]
) -> list[str]:
    problems: list[str] = []
    covered: set[str] = set()
    for index, item in enumerate(row.get("evidence", [])):
        at = f"{where}.evidence[{index}]"
        if not isinstance(item, dict):
            problems.append(f"{at} is not an object")
            continue
        if item.get("doc") not in documents:
            problems.append(f"{at} cites {item.get('doc')!r}, which is not in documents")
        if not str(item.get("quote", "")).strip():
            problems.append(f"{at} has no quote")
        fields = item.get("fields")
        if not isinstance(fields, list) or not fields:
            problems.append(f"{at} names no fields")
            continue
        for name in fields:
            if name not in facts or name not in row:
                problems.append(f"{at} backs {name!r}, which is not a fact of this row")
        covered.update(fields)
    unverified = row.get("unverified", {})
    if not isinstance(unverified, dict):
        problems.append(f"{where}.unverified is not an object")
        unverified = {}
    for name, reason in unverified.items():
        if not str(reason).strip():
            problems.append(f"{where}.unverified.{name} gives no reason")
        if name in covered:
            problems.append(f"{where}.{name} is both backed by evidence and marked unverified")
    for name in facts:
        if name in row and name not in covered and name not in unverified:
            problems.append(f"{where}.{name} has neither evidence nor an unverified reason")
    return problems


def _probe_points(specs: list[str]) -> list[Version]:
    """Versions at and around every bound named in ``specs``: where two overlapping rows would show."""
    points: set[Version] = set()
    for spec in specs:
        for bound in filter(None, (parse_version(part) for part in spec.replace("-", ",").split(","))):
            points.update({bound, bound + (0,), bound + (99,), bound[:-1] or bound})
            points.add(bound[:-1] + (bound[-1] + 1,))
            if bound[-1] > 0:
                points.add(bound[:-1] + (bound[-1] - 1,))
    return sorted(points)


def _overlap_problems(table: str, rows: list[dict[str, Any]]) -> list[str]:
    specs = [spec for row in rows if isinstance(row.get("versions"), str) for spec in [row["versions"]]]
    problems = []
    for point in _probe_points(specs):
        try:
            matching = [row["id"] for row in rows if version_matches(point, row["versions"])]
        except (KeyError, ValueError, TypeError):
            return []  # reported as a bad spec already
        if len(matching) > 1:
            problems.append(
                f"{table} rows {' and '.join(matching)} both match {format_version(point)}"
            )
            break
    return problems


def validate_matrix(data: Any) -> list[str]:
    """Problems with a matrix document, most important first; empty when it is well formed."""
    if not isinstance(data, dict):
        return ["the document is not a JSON object"]
    if data.get("schema_version") != MATRIX_SCHEMA_VERSION:
        return [
            f"schema_version is {data.get('schema_version')!r}, expected {MATRIX_SCHEMA_VERSION}"
        ]
    problems = []
    if not str(data.get("matrix_version", "")).strip():
        problems.append("matrix_version is missing")
    try:
        datetime.date.fromisoformat(str(data.get("matrix_date")))
    except ValueError:
        problems.append(f"matrix_date {data.get('matrix_date')!r} is not a YYYY-MM-DD date")
    documents = data.get("documents")
    if not isinstance(documents, dict) or not documents:
        return problems + ["documents is missing or empty"]
    for doc_id, document in documents.items():
        for key in ("title", "url", "release"):
            if not isinstance(document, dict) or not str(document.get(key, "")).strip():
                problems.append(f"documents.{doc_id} lacks {key!r}")
        if isinstance(document, dict) and not str(document.get("url", "")).startswith("https://"):
            problems.append(f"documents.{doc_id}.url is not an https address")
    ids: set[str] = set()
    for table, spec in TABLES.items():
        rows = data.get(table)
        if not isinstance(rows, list) or not rows:
            problems.append(f"table {table!r} is missing or empty")
            continue
        for index, row in enumerate(rows):
            where = f"{table}[{index}]"
            if not isinstance(row, dict):
                problems.append(f"{where} is not an object")
                continue
            where = f"{table}[{row.get('id', index)}]"
            missing = [key for key in spec.required if key not in row]
            if missing:
                problems.append(f"{where} lacks {', '.join(repr(k) for k in missing)}")
                continue
            if row["id"] in ids:
                problems.append(f"row id {row['id']!r} is used twice")
            ids.add(row["id"])
            kind = row.get("kind", "fact")
            if kind not in ROW_KINDS:
                problems.append(f"{where} has kind {kind!r}")
            if table == "known_bad" and row["severity"] not in SEVERITIES:
                problems.append(f"{where} has severity {row['severity']!r}")
            if kind == "anecdote" and (row.get("severity") != "info" or not row.get("unverified")):
                problems.append(f"{where} is an anecdote, so it must be severity info and unverified")
            problems += _row_spec_problems(table, where, row)
            problems += _evidence_problems(where, row, spec.facts, documents)
        if spec.versioned and all(isinstance(r, dict) and "versions" in r for r in rows):
            problems += _overlap_problems(table, rows)
    return problems


def unused_documents(data: dict[str, Any]) -> list[str]:
    """Documents no row cites (allowed in a matrix file; the packaged one has none)."""
    cited = {
        item.get("doc")
        for table in TABLES
        for row in data.get(table, [])
        for item in row.get("evidence", [])
    }
    return sorted(set(data.get("documents", {})) - cited)


# ---------------------------------------------------------------------------------------------
# Loading


def load_matrix(path: str | Path | None = None) -> CompatibilityMatrix:
    """Load and validate the matrix: the packaged one, or ``path`` (``check --matrix``).

    Raises MatrixError (a DSAUserError) with one sentence when the file cannot be used.
    """
    file = Path(path) if path is not None else MATRIX_PATH
    try:
        stat = file.stat()
    except FileNotFoundError:
        raise MatrixError(f"Compatibility matrix {file} does not exist.") from None
    except OSError as exc:
        raise MatrixError(f"Cannot read compatibility matrix {file}: {exc.strerror or exc}.") from exc
    return _load(str(file), PACKAGED if path is None else str(file), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _load(file: str, label: str, mtime_ns: int, size: int) -> CompatibilityMatrix:
    try:
        data = json.loads(Path(file).read_text(encoding="utf-8"))
    except OSError as exc:
        raise MatrixError(f"Cannot read compatibility matrix {file}: {exc.strerror or exc}.") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MatrixError(f"Compatibility matrix {file} is not valid JSON ({exc}).") from exc
    problems = validate_matrix(data)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise MatrixError(
            f"Compatibility matrix {file} cannot be used: {problems[0]}{more}; fix it or drop --matrix."
        )
    return CompatibilityMatrix(
        matrix_version=str(data["matrix_version"]),
        matrix_date=str(data["matrix_date"]),
        tables={name: data[name] for name in TABLES},
        documents=data["documents"],
        path=label,
    )


__all__ = [
    "MATRIX_PATH",
    "MATRIX_SCHEMA_VERSION",
    "TABLES",
    "CompatibilityMatrix",
    "Evidence",
    "MatrixError",
    "load_matrix",
    "unused_documents",
    "validate_matrix",
]

