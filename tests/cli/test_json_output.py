"""``--json`` on every command that has it: stdout is one JSON document and nothing else, when the
command succeeds and when it fails. A failure's document carries ``"error"`` (the sentence that is
also on stderr) and ``"exit_code"``; the exit code is the command's usual one. Logs, progress and
library output (Polygraphy's ``[E]`` lines on a mismatch) go to stderr.

Each command runs as a user runs it, in a subprocess with stdout and stderr apart, on a one-layer
model exported from a factory (seconds, not minutes). ``generate`` has its own tests.
"""

from __future__ import annotations

import _ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.stages.test_plan import V32

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "compat" / "fixtures" / "cpu_only.json"

FACTORY = '''
import torch


class Linear(torch.nn.Module):
    def __init__(self, shift=0.0):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.shift = shift

    def forward(self, x):
        return self.proj(x) + self.shift


def make(batch=2, seq_len=8):
    torch.manual_seed(0)
    return Linear().eval(), (torch.randn(batch, seq_len, 16),), ["y"]


def shifted(batch=2, seq_len=8):
    """The same weights, outputs one higher: a reference the export cannot match."""
    torch.manual_seed(0)
    return Linear(1.0).eval(), (torch.randn(batch, seq_len, 16),), ["y"]
'''

# The geometry of DeepSeek-V3.2's config.json (`plan` needs no weights): the planner tests' copy.
V32_CONFIG = V32


def run(*args, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "dsa_export", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=environment, cwd=cwd)


def document(result: subprocess.CompletedProcess[str]) -> dict:
    try:
        data = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"stdout is not one JSON document:\n{result.stdout}\n--- stderr:\n{result.stderr}")
    assert isinstance(data, dict), result.stdout
    return data


def succeeded(result: subprocess.CompletedProcess[str]) -> dict:
    data = document(result)
    assert result.returncode == 0, result.stderr
    assert "error" not in data and "Traceback" not in result.stderr
    return data


def failed(result: subprocess.CompletedProcess[str], code: int, words: str) -> dict:
    data = document(result)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert words in data["error"] and data["exit_code"] == code, data
    assert f"Error: {data['error']}" in result.stderr  # the same sentence, on stderr
    assert "Traceback" not in result.stderr
    return data


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A factory file, its export (``export --json``), a build of it (``build --json``), calibration
    data and a checkpoint folder holding only config.json."""
    root = tmp_path_factory.mktemp("json")
    (root / "f.py").write_text(FACTORY)
    exported = run("export", f"{root / 'f.py'}:make", "-o", root / "m.onnx", "--json")
    built = run("build", root / "m.onnx", "-o", root / "b", "--backend", "onnxruntime", "--json")
    (root / "calib").mkdir()
    for i in range(3):
        np.savez(root / "calib" / f"{i}.npz", x=np.random.default_rng(i).standard_normal((2, 8, 16)).astype(np.float32))
    (root / "v32").mkdir()
    (root / "v32" / "config.json").write_text(json.dumps(V32_CONFIG))
    (root / "garbage.onnx").write_bytes(b"\x00\xffnot onnx" * 10)
    return root, exported, built


def test_export(world, tmp_path):
    root, exported, _ = world
    report = succeeded(exported)
    assert report["output"] == str(root / "m.onnx") and report["dsa_nodes"] == 0
    assert "Exported" in exported.stderr  # the human line moved to stderr
    failed(run("export", "no-such-model", "-o", tmp_path / "x.onnx", "--json"), 1, "neither a built-in model")


def test_validate_passes(world):
    root, _, _ = world
    report = succeeded(run("validate", root / "m.onnx", "--reference", f"{root / 'f.py'}:make", "--seq-lens", "8",
                           "--json"))
    assert report["passed"] is True


def test_validate_mismatch_keeps_polygraphy_off_stdout(world):
    root, _, _ = world
    result = run("validate", root / "m.onnx", "--reference", f"{root / 'f.py'}:shifted", "--seq-lens", "8", "--json")
    report = failed(result, 1, "differs from torch")
    assert report["passed"] is False and report["errors"]  # the report itself, with the error added
    assert "FAILED" in result.stderr and "[E]" not in result.stdout  # Polygraphy's lines are logs


def test_inspect(world):
    root, _, _ = world
    assert succeeded(run("inspect", root / "m.onnx", "--json"))["inputs"][0]["name"] == "x"
    failed(run("inspect", root / "garbage.onnx", "--json"), 1, "not a readable ONNX file")


def test_build(world, tmp_path):
    root, _, built = world
    report = succeeded(built)
    assert report["output"] == str(root / "b") and (root / "b" / "manifest.json").is_file()
    assert "[5/5] engine" in built.stderr  # progress lines stay on stderr
    failed(run("build", tmp_path / "missing.onnx", "-o", tmp_path / "b", "--json"), 1, "does not exist")


def test_run(world):
    root, _, _ = world
    result = run("run", root / "b", "--json")
    assert succeeded(result)["outputs"][0]["name"] == "y" and "Runtime:" in result.stderr
    failed(run("run", root / "m.onnx", "--json"), 2, "--dims")


def test_calibrate(world, tmp_path):
    root, _, _ = world
    result = run("calibrate", root / "m.onnx", "-o", tmp_path / "q.onnx", "--data", root / "calib", "--samples", "10",
                 "--json")
    report = succeeded(result)
    assert report["calibration_samples"] == 3 and report["samples_requested"] == 10
    assert any("holds only 3" in w for w in report["warnings"]) and "Warning: --samples 10" in result.stderr
    failed(run("calibrate", root / "m.onnx", "-o", tmp_path / "q2.onnx", "--json"), 2, "calibration data")


def test_check():
    report = succeeded(run("check", "--snapshot", SNAPSHOT, "--json"))
    assert report["ok"] is True
    report = failed(run("check", "--snapshot", SNAPSHOT, "--backend", "tensorrt", "--json"), 1, "blocked by")
    assert report["ok"] is False and report["blocking"]  # the check report, with the error added


def test_plugins_path(tmp_path):
    report = succeeded(run("plugins", "path", "--json", env={"DSA_EXPORT_PLUGIN_LIB": _ctypes.__file__}))
    assert report["path"] == str(Path(_ctypes.__file__).resolve())
    failed(run("plugins", "path", "--kind", "banana", "--json"), 2, "banana")


def test_bench(tmp_path):
    result = run("bench", "--seq", "64", "--repeats", "1", "--warmup", "0", "--backends", "torch", "--no-memory",
                 "--variants", "dsa,dense", "--json")
    assert [c["seq_len"] for c in succeeded(result)["cases"]] == [64, 64]
    failed(run("bench", "--seq", "1", "--json"), 2, "at least 2")


def test_plan(world):
    root, _, _ = world
    assert succeeded(run("plan", root / "v32", "--gpu-memory", "141GiB", "--json"))["stages"]
    # A stage count that does not fit: the plan it would take, and the error.
    report = failed(run("plan", root / "v32", "--gpu-memory", "141GiB", "--stages", "3", "--json"), 1, "--stages")
    assert report["stages"]


def test_a_wrong_command_line_is_json_too():
    failed(run("validate", "--json"), 2, "Missing argument")
    failed(run("inspect", "--json", "--frobnicate"), 2, "No such option")


def test_split_document_and_requested():
    from dsa_export.cli.json_stdout import requested, split_document

    assert split_document('[W] a log line\n{"a": 1}\n') == ({"a": 1}, '{"a": 1}', "[W] a log line\n")
    assert split_document("no json here\n") == (None, None, "no json here\n")
    assert split_document('{\n  "a": [1, 2]\n}\n')[0] == {"a": [1, 2]}
    assert requested(["validate", "m.onnx", "--json"]) and requested(["-v", "inspect", "--json", "m.onnx"])
    assert requested(["bench", "--json"]) and requested(["bench", "--json", "-"])
    assert requested(["bench", "--json", "--seq", "64"])
    assert not requested(["bench", "--json", "b.json"])  # the older spelling of --json-out
    assert not requested(["validate", "m.onnx", "--json-out", "r.json"]) and not requested(["run", "--", "--json"])
