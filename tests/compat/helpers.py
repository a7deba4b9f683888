"""Recorded environment snapshots under fixtures/ and how to load them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsa_export.compat.records import EnvironmentProbe

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_NAMES = sorted(path.stem for path in FIXTURES.glob("*.json"))


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def fixture_probe(name: str) -> EnvironmentProbe:
    return EnvironmentProbe.from_dict(load_fixture(name)["probe"])
