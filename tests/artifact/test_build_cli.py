"""`dsa-export build` and `run` as a user runs them (subprocesses): output streams and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "dsa_export", *args], capture_output=True, text=True, env=env, timeout=300)


def test_build_a_supplied_onnx_then_run_it(exported, tmp_path):
    out = tmp_path / "b"
    result = run("build", str(exported["plugin"]), "-o", str(out), "--no-validate", "--max-shapes", "sequence=256")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["step", "status", "time", "result"]
    assert "export     skipped" in result.stdout and "validate   skipped" in result.stdout
    assert "[5/5] engine: done" in result.stderr and result.stderr.startswith("Probing the environment")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["profiles"]["dims"]["sequence"] == [1, 128, 256]
    assert manifest["validation"] == {"skipped": True, "reason": "--no-validate"}
    result = run("run", str(out), "--dims", "batch=3,sequence=20", "--outputs", str(tmp_path / "o.npz"))
    assert result.returncode == 0, result.stderr
    assert "output logits           [3, 20, 256]" in result.stdout
    assert (tmp_path / "o.npz").is_file()


def test_errors_are_one_line_with_exit_codes(tmp_path):
    bad_usage = run("build", "-o", str(tmp_path / "x"), "--max-shapes", "sequence")
    assert bad_usage.returncode == 2 and bad_usage.stderr.startswith("Error: --max-shapes takes name=size")
    assert "Traceback" not in bad_usage.stderr
    missing = run("run", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and missing.stderr.strip().count("\n") == 0
    assert "does not exist" in missing.stderr
    not_onnx = tmp_path / "m.onnx"
    not_onnx.write_text("hello")
    failed = run("build", str(not_onnx), "-o", str(tmp_path / "y"), "--backend", "onnxruntime")
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "is not a readable ONNX file" in failed.stderr
    assert not (tmp_path / "y").exists()
