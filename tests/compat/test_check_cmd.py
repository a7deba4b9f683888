"""`dsa-export check` end to end: exit codes, valid JSON, one-sentence errors, and its speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import FIXTURES

REPO = Path(__file__).resolve().parents[2]


def _check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), environment.get("PYTHONPATH")])
    )
    return subprocess.run(
        [sys.executable, "-m", "dsa_export", "check", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        check=False,
    )


def test_check_json_on_this_machine_is_valid_complete_and_fast() -> None:
    started = time.monotonic()
    result = _check("--json")
    elapsed = time.monotonic() - started
    report = json.loads(result.stdout)
    components = report["environment"]["components"]
    for name in (
        "driver",
        "cuda_runtime",
        "cudnn",
        "tensorrt",
        "tensorrt_rtx",
        "onnxruntime",
        "torch",
        "nvcc",
        "polygraphy",
        "plugin_library",
    ):
        assert (
            components[name]["version"] or components[name]["reason"] or name == "plugin_library"
        ), name
    assert (
        "providers" in components["onnxruntime"]["details"]
        or not components["onnxruntime"]["found"]
    )
    assert result.returncode == (1 if report["blocking"] else 0)
    # The probes of libraries and tools take at most 4 s; the Python imports are waited for (a slow
    # torch import is not a missing torch), so on a busy machine the check takes what they take.
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch, onnxruntime, polygraphy"], check=False, timeout=120)
    imports = time.monotonic() - started
    assert elapsed < max(5.0, imports + 3.0), f"check --json took {elapsed:.1f} s (the imports alone {imports:.1f} s)"


def test_plain_check_does_not_block_on_a_cpu_only_snapshot() -> None:
    result = _check("--snapshot", str(FIXTURES / "cpu_only.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "[no_nvidia_driver]" in result.stdout
        and "Result: nothing blocks what was asked." in result.stdout
    )
    assert "\nMatrix: 20" in result.stdout and "(packaged; " in result.stdout


def test_tensorrt_build_is_blocked_on_a_cpu_only_snapshot() -> None:
    result = _check(
        "--snapshot",
        str(FIXTURES / "cpu_only.json"),
        "--for-build",
        "--backend",
        "tensorrt",
        "--json",
    )
    assert result.returncode == 1
    assert json.loads(result.stdout)["blocking"] == ["no_nvidia_driver", "tensorrt_missing"]


@pytest.mark.parametrize(
    ("content", "words"), [(b"", "is empty"), (b"plain text\n", "is a text file")]
)
def test_engine_that_is_not_an_engine_fails_in_one_line(
    tmp_path: Path, content: bytes, words: str
) -> None:
    engine = tmp_path / "model.engine"
    engine.write_bytes(content)
    result = _check("--engine", str(engine))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ") and words in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_engine_mismatch_exits_1_with_the_reason(tmp_path: Path) -> None:
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"ftrt" + bytes(64))
    manifest = {"trt_version": "10.3.0.26", "backend": "tensorrt", "compute_capability": "9.0"}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    result = _check(
        "--snapshot", str(FIXTURES / "a100_cuda124_trt103.json"), "--engine", str(engine)
    )
    assert result.returncode == 1
    assert "[engine_compute_capability_mismatch]" in result.stdout


def test_bad_option_is_a_usage_error() -> None:
    result = _check("--precision", "int4")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_check_json_names_the_matrix_version_and_date() -> None:
    result = _check("--snapshot", str(FIXTURES / "cpu_only.json"), "--json")
    matrix = json.loads(result.stdout)["matrix"]
    assert matrix["version"] and matrix["date"] and matrix["path"] == "packaged"


def test_a_newer_matrix_file_is_loaded(tmp_path: Path) -> None:
    from dsa_export.compat.matrix import MATRIX_PATH

    data = json.loads(MATRIX_PATH.read_text())
    data["matrix_version"], data["matrix_date"] = "2099.01.1", "2099-01-15"
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(data))
    result = _check("--snapshot", str(FIXTURES / "cpu_only.json"), "--matrix", str(newer), "--json")
    assert result.returncode == 0, result.stderr
    matrix = json.loads(result.stdout)["matrix"]
    assert (matrix["version"], matrix["date"], matrix["path"]) == ("2099.01.1", "2099-01-15", str(newer))


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "does not exist"),
        ("{not json", "is not valid JSON"),
        ('{"schema_version": 1, "matrix_version": "old"}', "schema_version"),
    ],
)
def test_an_unusable_matrix_file_fails_in_one_sentence(
    tmp_path: Path, content: str | None, words: str
) -> None:
    path = tmp_path / "matrix.json"
    if content is not None:
        path.write_text(content)
    result = _check("--snapshot", str(FIXTURES / "cpu_only.json"), "--matrix", str(path))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: ") and words in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
