"""dsa_export.runtime.load and `dsa-export run` on the demo build (CPU: the ONNX Runtime artifact)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsa_export.errors import DSAUserError
from tests.build_fixtures import HAS_RTX

ROOT = Path(__file__).resolve().parents[2]


def _torch_logits(tiny_source, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return tiny_source.module(input_ids=torch.from_numpy(ids)).detach().numpy()


def test_the_ort_artifact_reproduces_torch(demo_build, tiny_source):
    from dsa_export.runtime import load

    session = load(demo_build[0].output)
    assert session.kind.startswith("onnxruntime") and "model.optimized.onnx" in session.kind
    if HAS_RTX:  # the engine was refused by the gate on this GPU-less machine, and the note says why
        assert "Refusing to load" in session.notes[0] and "GPU" in session.notes[0]
    for dims in ({}, {"batch": 2, "sequence": 300}):
        feeds = session.example_inputs(seed=3, dims=dims)
        ids = feeds["input_ids"]
        assert ids.dtype == np.int64 and ids.max() < 256
        assert ids.shape == ((1, 128) if not dims else (2, 300))
        logits = session.run(feeds)["logits"]
        np.testing.assert_allclose(logits, _torch_logits(tiny_source, ids), atol=1e-4, rtol=1e-4)


def test_run_cli_reproduces_torch(demo_build, tiny_source, tmp_path):
    ids = np.random.default_rng(7).integers(0, 256, size=(2, 40)).astype(np.int64)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, input_ids=ids)
    outputs = tmp_path / "out.npz"
    result = subprocess.run(
        [sys.executable, "-m", "dsa_export", "run", str(demo_build[0].output), "--inputs", str(inputs),
         "--outputs", str(outputs)],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "output logits           [2, 40, 256]" in result.stdout
    with np.load(outputs) as data:
        np.testing.assert_allclose(data["logits"], _torch_logits(tiny_source, ids), atol=1e-4, rtol=1e-4)


def _copy_build(demo_build, tmp_path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(demo_build[0].output, copy)
    return copy


@pytest.mark.skipif(not HAS_RTX, reason="TensorRT-RTX is not installed (pip install dsa-export[rtx])")
def test_a_manifest_mismatch_is_refused(demo_build, tmp_path):
    from dsa_export.runtime import load

    copy = _copy_build(demo_build, tmp_path)
    manifest_path = copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["engine"]["trt_version"] = "1.2.0.1"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DSAUserError, match=r"Refusing to load .*built with TensorRT-RTX 1\.2\.0\.1"):
        load(copy, runtime="engine")
    with pytest.raises(DSAUserError, match="Refusing to load"):
        load(copy / "model.plan")
    # auto falls back to the ONNX Runtime artifact and keeps the reason
    session = load(copy)
    assert "1.2.0.1" in session.notes[0]


def test_a_missing_or_broken_manifest_is_refused(demo_build, tmp_path):
    from dsa_export.runtime import load

    copy = _copy_build(demo_build, tmp_path)
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(DSAUserError, match="not valid JSON"):
        load(copy)
    (copy / "manifest.json").unlink()
    with pytest.raises(DSAUserError, match="manifest.json does not exist"):
        load(copy)


def test_shapes_outside_the_profile_are_rejected(demo_build):
    from dsa_export.manifest import read_manifest
    from dsa_export.runtime import load
    from dsa_export.runtime.onnxrt import OrtSession

    manifest = read_manifest(demo_build[0].output)
    with pytest.raises(DSAUserError, match=r"sequence 600 .*outside the optimization profile of the engine \(sequence 1\.\.512\)"):
        manifest.check_shapes({"input_ids": (1, 600)})
    with pytest.raises(DSAUserError, match=r"batch 5 .*\(batch 1\.\.4\)"):
        manifest.check_shapes({"input_ids": (5, 16)})
    with pytest.raises(DSAUserError, match="has 3 dims"):
        manifest.check_shapes({"input_ids": (1, 16, 1)})
    manifest.check_shapes({"input_ids": (4, 512)})
    # Every chain of the ONNX Runtime artifact honours the build's profile (the one it was validated
    # and, for the TensorRT EP, built for), so CPU rejects before running too.
    session = load(demo_build[0].output, runtime="onnxruntime")
    with pytest.raises(DSAUserError, match=r"sequence 600 .*outside the optimization profile of the build"):
        session.run({"input_ids": np.zeros((1, 600), dtype=np.int64)})
    # Without the profile (a session opened on the file alone) the same input runs.
    loose = OrtSession(session.ort_session, "loose", None, enforce_profile=False)
    assert loose.run({"input_ids": np.zeros((1, 600), dtype=np.int64)})["logits"].shape == (1, 600, 256)
    with pytest.raises(DSAUserError, match="unknown input"):
        session.run({"ids": np.zeros((1, 4), dtype=np.int64)})


def test_plain_onnx_and_wrong_kinds(exported, demo_build):
    from dsa_export.errors import DSAUsageError
    from dsa_export.runtime import load

    session = load(exported["plugin"])
    assert [s.name for s in session.inputs] == ["input_ids"]
    assert session.run({"input_ids": np.zeros((1, 5), dtype=np.int64)})["logits"].shape == (1, 5, 256)
    with pytest.raises(DSAUsageError, match="not an engine"):
        load(exported["plugin"], runtime="engine")
    with pytest.raises(DSAUserError, match="does not exist"):
        load(demo_build[0].output / "nothing.plan")


def test_importing_the_runtime_and_build_stays_light():
    code = (
        "import sys, dsa_export.runtime, dsa_export.manifest, dsa_export.artifact, dsa_export.trt.tensorrt;"
        "heavy = [m for m in ('torch', 'onnxruntime', 'tensorrt', 'tensorrt_rtx_bindings') if m in sys.modules];"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
