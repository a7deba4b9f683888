"""Shared fixtures: exported files of the default model are made once per test session."""

from __future__ import annotations

import os

import pytest

# Keep CPU tests predictable on small CI machines.
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def tiny_source():
    from dsa_export.sources import resolve

    return resolve("tiny")


@pytest.fixture(scope="session")
def exported(tmp_path_factory, tiny_source):
    """``{"plugin": path, "native": path}`` of the default model, exported once."""
    from dsa_export.export import ExportSettings, export_model, save_model

    out = tmp_path_factory.mktemp("exported")
    paths = {}
    for mode in ("plugin", "native"):
        model = export_model(tiny_source, ExportSettings(ops=mode))
        paths[mode] = save_model(model, out / f"tiny-{mode}.onnx")
    return paths


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """``{"deepseek_v32": dir, "glm_moe_dsa": dir}``: tiny random checkpoints (tests/hf/conftest.py),
    made once per session; skips without transformers."""
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    from tests.hf.conftest import make_checkpoint

    root = tmp_path_factory.mktemp("hf")
    return {
        "deepseek_v32": make_checkpoint(root, "deepseek_v32", layers=3, index_topk=8),
        "glm_moe_dsa": make_checkpoint(root, "glm_moe_dsa", layers=4, index_topk=8),
    }


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory):
    """``(BuildResult, progress lines)`` of ``dsa-export build`` with no MODEL (the README's demo)."""
    from tests.build_fixtures import build_demo

    return build_demo(tmp_path_factory.mktemp("demo") / "demo")
