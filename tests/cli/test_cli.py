"""The CLI end to end, in subprocesses, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dsa_export", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_export_then_validate_then_inspect(tmp_path):
    out = tmp_path / "m.onnx"
    result = run("export", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "7 dsa nodes" in result.stdout
    result = run("validate", str(out), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] and len(report["errors"]) == 3
    assert max(e["max_abs"] for e in report["errors"]) <= 1e-4
    result = run("inspect", str(out))
    assert result.returncode == 0
    assert "dsa::DSAIndexerTopK" in result.stdout and "plugin_namespace=dsa" in result.stdout
    info = json.loads(run("inspect", str(out), "--json").stdout)
    assert info["opsets"] == {"ai.onnx": 18, "dsa": 1} and len(info["custom_nodes"]) == 7


def test_help_lists_the_commands():
    result = run("--help")
    assert result.returncode == 0
    for name in ("export", "validate", "inspect"):
        assert name in result.stdout


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["export", "no-such-model", "-o", "{tmp}/x.onnx"], 1, "neither a built-in model"),
        (["export", "{tmp}/missing.py:make", "-o", "{tmp}/x.onnx"], 1, "does not exist"),
        (["export", "-o", "{tmp}/x.onnx", "--ops", "weird"], 2, "Invalid value"),
        (["export", "-o", "{tmp}/x.onnx", "--batch", "1"], 2, "Invalid value"),
        (["export"], 2, "Missing option"),
        (["validate", "{tmp}/missing.onnx"], 1, "does not exist"),
        (["validate", "{tmp}/garbage.onnx"], 1, "not a readable ONNX file"),
        (["validate", "{tmp}/garbage.onnx", "--seq-lens", "8,x"], 2, "comma-separated"),
        (["inspect", "{tmp}/garbage.onnx"], 1, "not a readable ONNX file"),
        (["frobnicate"], 2, "No such command"),
    ],
)
def test_bad_input_gets_one_sentence_and_the_right_exit_code(tmp_path, args, code, message):
    (tmp_path / "garbage.onnx").write_bytes(b"\x00\xffnot onnx at all" * 10)
    result = run(*[a.format(tmp=tmp_path) for a in args])
    assert result.returncode == code, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "x.onnx").exists()


def test_failed_export_leaves_no_partial_file(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ndef make():\n    raise RuntimeError('boom')\n")
    out = tmp_path / "out.onnx"
    result = run("export", f"{bad}:make", "-o", str(out))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == [bad]


def test_debug_shows_the_traceback(tmp_path):
    result = run("--debug", "validate", str(tmp_path / "missing.onnx"))
    assert result.returncode == 1 and "Traceback" in result.stderr
