"""Calibrated files of the default model, made once per session from the bundled demo data."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_int8(exported):
    """The default recipe (INT8, entropy, bundled data) applied to the plugin-mode export."""
    from dsa_export.quantize import QuantizeSettings, quantize

    return quantize(exported["plugin"], QuantizeSettings(data="builtin"))


@pytest.fixture(scope="session")
def saved_int8(default_int8, tmp_path_factory):
    from dsa_export.quantize import save

    out = tmp_path_factory.mktemp("int8")
    paths = {"model": out / "tiny.qdq.onnx", "cache": out / "tiny.cache", "report": out / "tiny.report.json"}
    save(default_int8, paths["model"], cache=paths["cache"], report=paths["report"])
    return paths
