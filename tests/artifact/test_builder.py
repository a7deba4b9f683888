"""The build pipeline on this CPU-only machine: the demo end to end, atomicity, stage skipping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dsa_export.errors import DSAUserError
from dsa_export.fileio import sha256_file
from tests.build_fixtures import HAS_RTX


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def test_demo_build_has_every_artifact(demo_build):
    result, lines = demo_build
    out = result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest == result.manifest
    assert manifest["schema_version"] == 1 and manifest["tool"]["name"] == "dsa-export"
    assert manifest["model"]["sha256"] == sha256_file(out / "model.onnx")
    assert manifest["model"]["op_versions"] == {"DSAIndexerTopK": 1, "DSASparseAttention": 1}
    assert manifest["model"]["ops_mode"] == "plugin"
    assert manifest["precision"] == "fp32"
    assert manifest["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"], "value_range": [0, 256]}]
    assert manifest["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", "sequence", 256]}]
    assert manifest["profiles"]["inputs"]["input_ids"] == {"min": [1, 1], "opt": [1, 128], "max": [4, 512]}
    # validation report: passing, and the same numbers as the file
    report = json.loads((out / "validation.json").read_text())
    assert report["passed"] and manifest["validation"]["passed"] and manifest["validation"]["max_abs"] <= 1e-4
    assert {e["seq_len"] for e in report["errors"]} == {16, 64, 256}
    # checks ran and nothing blocked the backends built
    for backend in manifest["backends"]:
        assert manifest["checks"][backend]["skipped"] is False and manifest["checks"][backend]["blocking"] == []
    # the ONNX Runtime artifact
    assert (out / "onnxruntime" / "session.json").is_file()
    assert manifest["onnxruntime"]["optimized_model"] == "onnxruntime/model.optimized.onnx"
    assert manifest["plugin_library"]["sha256"] is None or len(manifest["plugin_library"]["sha256"]) == 64
    if HAS_RTX:
        assert manifest["backends"] == ["tensorrt-rtx", "onnxruntime"]
        engine = manifest["engine"]
        plan = out / "model.plan"
        assert plan.read_bytes()[:4] == b"vtrt" and engine["sha256"] == sha256_file(plan)
        assert engine["backend"] == "tensorrt-rtx" and engine["compute_capability"] == ["8.9"]
        assert engine["uses_plugins"] is False and engine["plugin_library_sha256"] is None
        assert "TensorRT-RTX" in manifest["backend_choice"]["reason"]
    else:
        assert manifest["backends"] == ["onnxruntime"] and manifest["engine"] is None
    assert [s["name"] for s in manifest["steps"]] == ["export", "validate", "calibrate", "check", "engine"]
    assert any(line.startswith("[5/5] engine: done") for line in lines)
    table = result.summary_table()
    assert "calibrate  skipped" in table and "Built " in table
    assert _leftovers(out.parent, out.name) == []
    assert oct(out.stat().st_mode & 0o777) != "0o700"


@pytest.mark.skipif(not HAS_RTX, reason="TensorRT-RTX is not installed (pip install dsa-export[rtx])")
def test_the_engine_gate_reads_the_manifest(demo_build):
    from dsa_export.compat.engine_gate import read_requirements

    requirements = read_requirements(demo_build[0].output / "model.plan")
    assert requirements.backend == "tensorrt-rtx"
    assert requirements.compute_capability == ("8.9",)
    assert requirements.trt_version == demo_build[0].manifest["engine"]["trt_version"]


def _quick(out: Path, source: Path, **kw):
    from dsa_export.artifact import BuildSettings

    return BuildSettings(model=str(source), output=out, validate=False, backend="onnxruntime", **kw)


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_failing_stage_leaves_no_output(tmp_path, exported, monkeypatch, error):
    from dsa_export.artifact import build, builder

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr("dsa_export.artifact.onnxrt.write_artifact", fail)
    out = tmp_path / "out"
    with pytest.raises(type(error)):
        build(_quick(out, exported["plugin"]), log=lambda line: None)
    assert not out.exists()
    assert _leftovers(tmp_path, "out") == []
    assert builder.STEPS[-1] == "engine"


def test_a_failed_rebuild_keeps_the_previous_build(tmp_path, exported, monkeypatch):
    from dsa_export.artifact import build

    out = tmp_path / "out"
    build(_quick(out, exported["plugin"]), log=lambda line: None)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def fail(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("dsa_export.artifact.onnxrt.write_artifact", fail)
    with pytest.raises(RuntimeError):
        build(_quick(out, exported["plugin"]), log=lambda line: None)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert _leftovers(tmp_path, "out") == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_export_leaves_nothing(tmp_path, signum):
    out = tmp_path / "demo"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsa_export", "build", "-o", str(out), "--no-validate", "--backend", "onnxruntime"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    deadline = time.time() + 120
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("[1/5] export ..."):
            break
        assert time.time() < deadline, "the build never reached the export stage"
    time.sleep(1.0)  # inside torch.export by now
    proc.send_signal(signum)
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, rest
    assert "Aborted" in rest or "Interrupted" in rest
    assert not out.exists()
    assert _leftovers(tmp_path, "demo") == []


def test_a_foreign_non_empty_folder_is_not_replaced(tmp_path, exported):
    from dsa_export.artifact import build

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(DSAUserError, match="--force"):
        build(_quick(out, exported["plugin"]), log=lambda line: None)
    assert (out / "notes.txt").read_text() == "keep me"


def test_int8_without_the_quantize_package_says_so(tmp_path, exported, monkeypatch):
    from dsa_export.artifact import build

    monkeypatch.setitem(sys.modules, "dsa_export.quantize", None)  # as in an install without it
    out = tmp_path / "q"
    with pytest.raises(DSAUserError, match="Calibration .* is not available in this install"):
        build(_quick(out, exported["plugin"], precision="int8"), log=lambda line: None)
    assert not out.exists()


def test_int8_build_with_the_quantize_package(tmp_path, exported):
    import importlib.util

    if importlib.util.find_spec("dsa_export.quantize") is None:
        pytest.skip("the calibration package dsa_export.quantize is not installed")
    from dsa_export.artifact import build
    from dsa_export.runtime import load

    out = tmp_path / "int8"
    result = build(_quick(out, exported["plugin"], precision="int8"), log=lambda line: None)
    calibration = result.manifest["calibration"]
    assert calibration["precision"] == "int8" and calibration["model"] == "model.qdq.onnx"
    assert calibration["model_sha256"] == sha256_file(out / "model.qdq.onnx")
    assert (out / "calibration.cache").read_text().startswith("TRT-")
    session_json = json.loads((out / "onnxruntime" / "session.json").read_text())
    assert session_json["chains"][0]["model"] == "../model.qdq.onnx"
    assert session_json["chains"][0]["providers"][0][1]["trt_int8_enable"] == "True"
    logits = load(out).run({"input_ids": np.arange(32, dtype=np.int64).reshape(1, 32)})["logits"]
    assert logits.shape == (1, 32, 256) and np.isfinite(logits).all()


def test_ort_artifact_falls_back_to_the_plain_file(tmp_path, exported, monkeypatch):
    """When ONNX Runtime cannot serialize its optimized graph the artifact uses model.onnx and says so."""
    import onnxruntime

    from dsa_export.artifact import build
    from dsa_export.runtime import load

    real = onnxruntime.InferenceSession

    def refuse_to_save(path, sess_options=None, providers=None, **kw):
        if sess_options is not None and sess_options.optimized_model_filepath:
            raise RuntimeError("Unable to serialize model as it contains compiled nodes")
        return real(path, sess_options=sess_options, providers=providers, **kw)

    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse_to_save)
    out = tmp_path / "plain"
    result = build(_quick(out, exported["plugin"]), log=lambda line: None)
    section = result.manifest["onnxruntime"]
    assert section["optimized_model"] is None
    assert any("could not save the optimized graph" in note for note in section["notes"])
    assert not (out / "onnxruntime" / "model.optimized.onnx").exists()
    session = load(out)
    assert "model.onnx" in session.kind
    assert session.run(session.example_inputs(dims={"sequence": 8}))["logits"].shape == (1, 8, 256)


def test_calibrate_stage_through_the_adapter(tmp_path, exported, monkeypatch):
    """With a stand-in quantize package (a test double: the real one ships separately), the stage
    calls quantize()/save() and records provenance; the engine stage then uses the Q/DQ file."""
    import types

    import onnx

    from dsa_export.artifact import build

    calls = {}
    fake = types.ModuleType("dsa_export.quantize")

    class QuantizeSettings:
        def __init__(self, **kw):
            calls["settings"] = kw

    def quantize(path, settings):
        model = onnx.load(str(path))
        node = onnx.helper.make_node("QuantizeLinear", ["x"], ["y"])
        model.graph.node.append(node)  # marks the file as Q/DQ for the test only
        return types.SimpleNamespace(model=model, calibration_samples=4, report=None,
                                     recipe=types.SimpleNamespace(name="tiny-int8", method="entropy"))

    def save(result, output, cache=None, report=None, **kw):
        calls["save"] = {"cache": cache, "report": report}
        onnx.save(result.model, str(output))
        if cache is not None:
            Path(cache).write_text("TRT-10000-EntropyCalibration2\n")

    fake.QuantizeSettings, fake.quantize, fake.save = QuantizeSettings, quantize, save
    monkeypatch.setitem(sys.modules, "dsa_export.quantize", fake)
    seen = {}

    def record(folder, onnx_path, **kw):
        seen["engine_input"] = onnx_path.name
        return {"optimized_model": None, "notes": []}

    monkeypatch.setattr("dsa_export.artifact.onnxrt.write_artifact", record)
    result = build(_quick(tmp_path / "q", exported["plugin"], precision="int8"), log=lambda line: None)
    assert calls["settings"] == {"precision": "int8", "data": "builtin"}
    assert seen["engine_input"] == "model.qdq.onnx"
    calibration = result.manifest["calibration"]
    assert calibration["precision"] == "int8" and calibration["samples"] == 4 and calibration["recipe"] == "tiny-int8"
    assert calibration["cache"] == "calibration.cache" and calibration["model"] == "model.qdq.onnx"
    assert (tmp_path / "q" / "calibration.cache").is_file()


def test_a_supplied_file_keeps_its_precision(tmp_path, exported):
    from dsa_export.artifact import build

    with pytest.raises(DSAUserError, match="is fp32 but --precision fp16 was asked"):
        build(_quick(tmp_path / "a", exported["plugin"], precision="fp16"), log=lambda line: None)
    assert not (tmp_path / "a").exists()


def test_a_blocked_backend_fails_before_exporting(tmp_path, monkeypatch):
    from dsa_export.artifact import BuildSettings, build
    from tests.compat.helpers import fixture_probe

    def no_export(*args, **kwargs):
        raise AssertionError("export ran although the checks block the build")

    monkeypatch.setattr("dsa_export.export.export_model", no_export)
    lines: list[str] = []
    with pytest.raises(DSAUserError, match="--skip-checks"):
        build(BuildSettings(output=tmp_path / "t", backend="tensorrt"), log=lines.append, probe=fixture_probe("cpu_only"))
    assert not any(line.startswith("[1/5]") for line in lines)
    assert not (tmp_path / "t").exists()
