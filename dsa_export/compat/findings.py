"""The finding: what the rules and the engine gate report. Both import it from here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

SEVERITIES: tuple[str, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One problem or notice. ``id`` is stable across releases; scripts may match on it."""

    id: str
    severity: str  # error | warning | info
    component: str
    message: str  # one sentence: what is wrong
    fix: str  # one sentence: what to do
    source: str | None = None  # the matrix row and the quotes the finding rests on
    verified: bool | None = None  # False when it rests on an unverified fact (then it is info); None: no row

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


__all__ = ["SEVERITIES", "Finding"]
