"""``dsa-export calibrate`` end to end in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np


def run(*args):
    return subprocess.run([sys.executable, "-m", "dsa_export", "calibrate", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_calibrate_writes_model_cache_and_report(exported, tmp_path):
    out, cache, report = tmp_path / "m.qdq.onnx", tmp_path / "m.cache", tmp_path / "m.json"
    # --progress: the bar is drawn on a terminal only unless asked for (stderr is a pipe here).
    result = run(exported["plugin"], "-o", out, "--data", "builtin", "--method", "minmax",
                 "--cache", cache, "--report", report, "--trt-version", "10.14.1", "--progress")
    assert result.returncode == 0, result.stderr
    assert "int8 Q/DQ on 34 MatMul/Gemm nodes" in result.stdout
    assert "logits" in result.stdout and "PASSED" in result.stdout
    assert "calibrating" in result.stderr and "percentile thresholds" not in result.stderr  # minmax: no search
    assert cache.read_text().startswith("TRT-101401-EntropyCalibration2\n")
    assert json.loads(report.read_text())["passed"] is True
    assert out.stat().st_size > 0


def test_bad_data_is_refused_and_nothing_is_written(exported, tmp_path):
    out, cache = tmp_path / "m.qdq.onnx", tmp_path / "m.cache"
    data = tmp_path / "data"
    data.mkdir()
    result = run(exported["plugin"], "-o", out, "--data", data, "--cache", cache)
    assert result.returncode == 1 and "holds no .npz or .npy files" in result.stderr
    np.savez(data / "a.npz", input_ids=np.zeros((2, 8), np.int32))
    result = run(exported["plugin"], "-o", out, "--data", data, "--cache", cache)
    assert result.returncode == 1 and "int32, but the model takes int64" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_usage_errors_exit_2(exported, tmp_path):
    result = run(exported["plugin"], "-o", tmp_path / "x.onnx", "--data", "builtin", "--precision", "fp8",
                 "--cache", tmp_path / "x.cache")
    assert result.returncode == 2 and "INT8" in result.stderr
    result = run(exported["plugin"], "-o", tmp_path / "x.onnx")
    assert result.returncode == 2 and "--data" in result.stderr
    assert not (tmp_path / "x.onnx").exists()
