"""No command runs code that a file names: a planted payload stays unrun through validate, build,
calibrate and run; session.json and manifest.json cannot make dsa-export load a library or write
outside the build folder; and the same payload does run when the user names it on the command line
(the rule is about who chose the code, not about factories)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dsa_export.errors import DSAUserError
from tests.cli.conftest import MARKER


def _main(args: list[str]) -> int:
    from dsa_export.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code


@pytest.fixture(scope="module")
def probe():
    from dsa_export.compat import probe_environment

    return probe_environment()


def test_validate_refuses_a_recorded_factory_and_runs_one_the_user_names(bad_world, capsys):
    assert _main(["validate", bad_world / "planted.onnx"]) == 1
    err = capsys.readouterr().err
    assert "--reference" in err and "payload.py:make" in err
    assert not (bad_world / MARKER).exists()
    # The same file, named by the user: imported and called (it raises, which is a user error).
    target = bad_world / "trusted"
    target.mkdir(exist_ok=True)
    shutil.copy(bad_world / "payload.py", target / "payload.py")
    try:
        assert _main(["validate", bad_world / "planted.onnx", "--reference", f"{target / 'payload.py'}:make"]) == 1
        assert (target / MARKER).read_text() == "called"
    finally:
        shutil.rmtree(target)


def test_build_of_a_planted_file_skips_its_validation_and_run_never_reads_references(
        bad_world, tmp_path, probe, monkeypatch, capsys):
    monkeypatch.setattr("dsa_export.compat.probe_environment", lambda *a, **k: probe)
    out = tmp_path / "b"
    assert _main(["build", bad_world / "planted.onnx", "-o", out, "--backend", "onnxruntime"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["validation"]["skipped"] and "does not run from a file" in manifest["validation"]["reason"]
    assert not (bad_world / MARKER).exists()
    # A manifest naming the payload as its model source: run reads files, never references.
    manifest["model"]["source"] = f"{bad_world / 'payload.py'}:make"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert _main(["run", out]) == 0
    assert _main(["inspect", bad_world / "planted.onnx"]) == 0
    assert not (bad_world / MARKER).exists()
    capsys.readouterr()


def test_calibration_does_not_run_a_recorded_factory(bad_world):
    import onnx

    from dsa_export.quantize.quantizer import _generated_eval_inputs
    from dsa_export.quantize.recipe import DEFAULTS

    model = onnx.load(str(bad_world / "planted.onnx"), load_external_data=False)
    assert _generated_eval_inputs(model, DEFAULTS, bad_world) == ([], [])
    assert not (bad_world / MARKER).exists()


def test_a_recorded_factory_is_refused_before_import(bad_world):
    from dsa_export.model_ref import ModelReference
    from dsa_export.sources import UntrustedFactoryError, resolve

    reference = ModelReference("factory", name="make", path=str(bad_world / "payload.py"))
    with pytest.raises(UntrustedFactoryError, match="--reference .*payload.py:make"):
        resolve(reference)
    with pytest.raises(DSAUserError, match="cannot be rebuilt"):
        resolve(ModelReference("module", name="some module"))
    assert not (bad_world / MARKER).exists()


def test_session_json_cannot_load_code_or_write_outside(demo_build, tmp_path):
    from dsa_export.manifest import read_manifest
    from dsa_export.runtime.onnxrt import _with_plugin_library, read_session_config

    build = tmp_path / "b"
    shutil.copytree(demo_build[0].output, build)
    session_file = build / "onnxruntime" / "session.json"
    good = json.loads(session_file.read_text())
    for edit, field in (
        (lambda d: d["session_options"].update(optimized_model_filepath="/tmp/x.onnx"), "optimized_model_filepath"),
        (lambda d: d["chains"][0]["providers"][0][1].update(trt_engine_decryption_lib_path="/x.so"), "decryption"),
        (lambda d: d["chains"][0]["providers"].insert(0, ["DnnlExecutionProvider", {}]), "Dnnl"),
        (lambda d: d["session_options"].update(log_severity_level="loud"), "log_severity_level"),
    ):
        data = json.loads(json.dumps(good))
        edit(data)
        session_file.write_text(json.dumps(data))
        with pytest.raises(DSAUserError, match=field):
            read_session_config(session_file)
    # The TensorRT EP gets the library found here, never the recorded path, and its cache stays inside.
    chain = {"name": "tensorrt", "model": "../model.onnx", "providers": [["TensorrtExecutionProvider", {
        "trt_extra_plugin_lib_paths": "/tmp/planted.so", "trt_engine_cache_path": "trt_engine_cache"}]]}
    fixed = _with_plugin_library(chain, None, build / "onnxruntime")
    options = fixed["providers"][0][1]
    assert "trt_extra_plugin_lib_paths" not in options
    assert Path(options["trt_engine_cache_path"]) == build / "onnxruntime" / "trt_engine_cache"
    chain["providers"][0][1]["trt_engine_cache_path"] = "../../elsewhere"
    with pytest.raises(DSAUserError, match="leads out of the folder"):
        _with_plugin_library(chain, None, build / "onnxruntime")
    assert read_manifest(build).data["onnxruntime"]["plugin_library_sha256"] is None


def test_the_tensorrt_ep_library_must_match_the_manifest(demo_build, tmp_path, monkeypatch):
    from dsa_export.manifest import read_manifest
    from dsa_export.runtime import onnxrt

    build = tmp_path / "b"
    shutil.copytree(demo_build[0].output, build)
    library = tmp_path / "libdsa_plugins_static.so"
    library.write_bytes(b"\x7fELF pretend library")
    manifest_file = build / "manifest.json"
    data = json.loads(manifest_file.read_text())
    data["onnxruntime"]["plugin_library_sha256"] = "0" * 64
    manifest_file.write_text(json.dumps(data))
    monkeypatch.setattr("dsa_export.plugins.find_library", lambda kind="plugin": library)
    monkeypatch.setattr("dsa_export.plugins.library_info", lambda path: type("Info", (), {"sha256": "f" * 64})())
    path, why = onnxrt._plugin_library_for_ep(read_manifest(build))
    assert path is None and "is not the one the build used" in why
    data["onnxruntime"]["plugin_library_sha256"] = "f" * 64
    manifest_file.write_text(json.dumps(data))
    path, why = onnxrt._plugin_library_for_ep(read_manifest(build))
    assert path == str(library) and "matches" in why


def test_paths_recorded_in_a_folder_stay_inside_it(tmp_path):
    from dsa_export.integrity import confined

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f").write_text("x")
    (tmp_path / "link").symlink_to("/etc")
    assert confined(tmp_path, "sub/f", "f") == tmp_path / "sub" / "f"
    assert confined(tmp_path, "sub/../sub/f", "f") == tmp_path / "sub" / "f"
    for bad, message in (("../x", "leads out"), ("/etc/hostname", "absolute"), ("sub/../../x", "leads out"),
                         ("link/hostname", "link out"), ("", "not a file name"), (3, "not a file name"),
                         ("C:/Windows", "absolute")):
        with pytest.raises(DSAUserError, match=message):
            confined(tmp_path, bad, "the field")


def test_verification_hashes_once_and_refuses_changes(demo_build, tmp_path, monkeypatch):
    import dsa_export.fileio as fileio
    from dsa_export.manifest import read_manifest

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    build = tmp_path / "b"
    shutil.copytree(demo_build[0].output, build)
    (build / ".verified.json").unlink(missing_ok=True)
    hashed: list[str] = []
    real = fileio.sha256_file
    monkeypatch.setattr(fileio, "sha256_file", lambda path, *a: hashed.append(Path(path).name) or real(path, *a))
    manifest = read_manifest(build)
    target = build / "onnxruntime" / "model.optimized.onnx"
    manifest.verify([target])
    manifest.verify([target])
    assert hashed == ["model.optimized.onnx"]  # the second check costs a stat
    assert not (build / ".verified.json").exists()  # readers never write into the folder they read
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))  # same size, new content
    with pytest.raises(DSAUserError, match="model.optimized.onnx' does not match the sha256"):
        manifest.verify([target])
    assert manifest.verify([target], enabled=False) == []


def test_a_stage_of_a_pipeline_is_verified_like_a_build(tmp_path):
    from dsa_export.fileio import file_record, sha256_file
    from dsa_export.stages.record import StageFiles, verify_recorded_onnx

    folder = tmp_path / "stages"
    (folder / "stage_00").mkdir(parents=True)
    onnx_file = folder / "stage_00" / "model.onnx"
    onnx_file.write_bytes(b"graph")
    record = file_record(onnx_file)
    stage = StageFiles(0, (0, 1), True, True, "stage_00/model.onnx", None, {"stage_00/model.onnx": record["sha256"]},
                       {"stage_00/model.onnx": record["size"]}, [], [], 0, 0, "k", {})
    pipeline = {"format": "dsa-export-pipeline", "version": 1, "stages": [stage.to_dict()], "links": []}
    (folder / "pipeline.json").write_text(json.dumps(pipeline))
    assert verify_recorded_onnx(onnx_file) == str(folder / "pipeline.json")
    onnx_file.write_bytes(b"grapH")
    with pytest.raises(DSAUserError, match="does not match the sha256 .*stage 0"):
        verify_recorded_onnx(onnx_file)
    onnx_file.write_bytes(b"gra")
    with pytest.raises(DSAUserError, match="is 3 bytes but"):
        stage.verify(folder)
    assert sha256_file(onnx_file) != record["sha256"]


def test_inputs_are_checked_against_the_manifest():
    from dsa_export.manifest import TensorSpec, check_feeds

    specs = [TensorSpec("input_ids", "int64", ("batch", "sequence"), (0, 10))]
    converted = check_feeds(specs, {"input_ids": np.ones((1, 2), np.int32)})
    assert converted["input_ids"].dtype == np.int64  # integers of another width are converted
    for value, message in ((np.ones((1, 2), np.float32), "is float32"), (np.full((1, 2), 10), "holds 10"),
                           (np.full((1, 2), -1), "holds -1")):
        with pytest.raises(DSAUserError, match=message):
            check_feeds(specs, {"input_ids": value})
