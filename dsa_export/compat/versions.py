"""Version numbers and the small range language the compatibility matrix is written in.

Versions are compared as integer tuples. A range spec is one of

- ``"12.4"`` or ``"==12.4"``: the version starts with 12.4 (12.4, 12.4.1, ...);
- ``"12.0-12.9"``: inclusive, each bound compared at its own precision (12.9.1 is inside);
- ``">=8.0.5"``, ``"<8.2.0"``: compared after padding with zeros;
- ``"<=12.9"``, ``">12"``: compared at the bound's precision (12.9.1 <= 12.9 holds);
- several clauses joined by ``","`` must all hold.

A JSON list of specs matches when any of them does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

Version = tuple[int, ...]

_NUMBER = re.compile(r"\d+(?:\.\d+)*")


def parse_version(text: str | None) -> Version | None:
    """Leading dotted number of ``text`` as a tuple (``"12.4.1+cu124"`` -> ``(12, 4, 1)``), or None."""
    if text is None:
        return None
    match = _NUMBER.search(str(text))
    if match is None:
        return None
    return tuple(int(part) for part in match.group(0).split("."))


def format_version(version: Version | None) -> str | None:
    """Inverse of :func:`parse_version`."""
    return None if version is None else ".".join(str(part) for part in version)


def _pad(version: Version, length: int) -> Version:
    return version + (0,) * max(0, length - len(version))


def _clause_matches(version: Version, clause: str) -> bool:
    clause = clause.strip()
    for operator in (">=", "<=", "==", ">", "<"):
        if clause.startswith(operator):
            bound = parse_version(clause[len(operator) :])
            if bound is None:
                raise ValueError(f"bad version clause {clause!r}")
            if operator == ">=":
                length = max(len(version), len(bound))
                return _pad(version, length) >= _pad(bound, length)
            if operator == "<":
                length = max(len(version), len(bound))
                return _pad(version, length) < _pad(bound, length)
            head = _pad(version, len(bound))[: len(bound)]
            if operator == "<=":
                return head <= bound
            if operator == ">":
                return head > bound
            return head == bound
    if "-" in clause:
        low_text, high_text = clause.split("-", 1)
        low, high = parse_version(low_text), parse_version(high_text)
        if low is None or high is None:
            raise ValueError(f"bad version range {clause!r}")
        padded = _pad(version, max(len(low), len(high)))
        return padded[: len(low)] >= low and padded[: len(high)] <= high
    bound = parse_version(clause)
    if bound is None:
        raise ValueError(f"bad version clause {clause!r}")
    return _pad(version, len(bound))[: len(bound)] == bound


def version_matches(version: Version | str | None, spec: str | Iterable[str]) -> bool:
    """Whether ``version`` satisfies ``spec`` (a spec string or a list of alternatives)."""
    parsed = parse_version(version) if isinstance(version, str) else version
    if parsed is None:
        return False
    specs = [spec] if isinstance(spec, str) else list(spec)
    return any(all(_clause_matches(parsed, clause) for clause in one.split(",")) for one in specs)


def decode_cudnn_version(raw: int) -> Version:
    """Decode ``cudnnGetVersion()``: 9.x is major*10000+minor*100+patch, 8.x and older major*1000+minor*100+patch."""
    if raw >= 10000:
        return (raw // 10000, raw % 10000 // 100, raw % 100)
    return (raw // 1000, raw % 1000 // 100, raw % 100)


def decode_cuda_version(raw: int) -> Version:
    """Decode ``cudaRuntimeGetVersion``/``cuDriverGetVersion``: major*1000+minor*10 (12040 -> 12.4)."""
    return (raw // 1000, raw % 1000 // 10)


def decode_tensorrt_version(raw: int) -> Version:
    """Decode ``getInferLibVersion()``: 10.x+ is major*10000+minor*100+patch, 8.x major*1000+minor*100+patch."""
    if raw >= 10000:
        return (raw // 10000, raw % 10000 // 100, raw % 100)
    return (raw // 1000, raw % 1000 // 100, raw % 100)
