"""tools/polygraphy: the data-loader script, the documented CLI command, and the Comparator script."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "polygraphy"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"dsa_tools_{name}", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_data_loader_reads_a_build_or_an_onnx_file(demo_build, exported, monkeypatch):
    loader = _module("data_loader")
    for artifact in (demo_build[0].output, exported["plugin"]):
        monkeypatch.setenv("DSA_EXPORT_ARTIFACT", str(artifact))
        monkeypatch.setenv("DSA_EXPORT_SEQ_LENS", "8,300")
        feeds = list(loader.load_data())
        assert [f["input_ids"].shape for f in feeds] == [(2, 8), (2, 300)]
        assert all(f["input_ids"].dtype == np.int64 and f["input_ids"].max() < 256 for f in feeds)
    monkeypatch.setenv("DSA_EXPORT_ARTIFACT", str(demo_build[0].output / "missing"))
    with pytest.raises(FileNotFoundError, match="DSA_EXPORT_ARTIFACT"):
        list(loader.load_data())


def test_polygraphy_cli_runs_the_plugin_model_on_onnxruntime(demo_build, tmp_path):
    polygraphy = shutil.which("polygraphy") or str(Path(sys.executable).with_name("polygraphy"))
    if not Path(polygraphy).exists():
        pytest.skip("the polygraphy CLI is not on PATH")
    env = dict(os.environ, DSA_EXPORT_ARTIFACT=str(demo_build[0].output), DSA_EXPORT_SEQ_LENS="16,64")
    out = tmp_path / "ort.json"
    result = subprocess.run(
        [polygraphy, "run", str(demo_build[0].output / "model.onnx"), "--onnxrt",
         "--data-loader-script", str(TOOLS / "data_loader.py"), "--save-outputs", str(out)],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "PASSED" in result.stdout + result.stderr and out.is_file()


def test_compare_script_matches_torch(demo_build, monkeypatch):
    monkeypatch.setenv("DSA_EXPORT_SEQ_LENS", "16,200")
    compare = _module("compare")
    assert compare.main([str(demo_build[0].output)]) == 0
    assert compare.main([str(demo_build[0].output), "--runtime", "onnxruntime", "--atol", "0", "--rtol", "0"]) == 1
