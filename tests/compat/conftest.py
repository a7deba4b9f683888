"""Snapshots of recorded environments as pytest fixtures."""

from __future__ import annotations

import pytest

from dsa_export.compat.records import EnvironmentProbe

from .helpers import fixture_probe


@pytest.fixture
def h200() -> EnvironmentProbe:
    return fixture_probe("h200_driver580_cuda13_trt11")


@pytest.fixture
def a100() -> EnvironmentProbe:
    return fixture_probe("a100_cuda124_trt103")


@pytest.fixture
def cpu_only() -> EnvironmentProbe:
    return fixture_probe("cpu_only")
