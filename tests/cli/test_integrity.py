"""Every field of every file is untrusted: a build folder cannot vouch for its own files through a
forged hash cache, an ONNX file's external data cannot be read from outside its folder or past the
end of a data file, and a profile of a billion tokens is refused by arithmetic before anything is
allocated."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from dsa_export.errors import DSAUserError


def _main(args: list, capsys) -> tuple[int, str]:
    from dsa_export.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    _out, err = capsys.readouterr()
    return exit_info.value.code, err


def _one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "Traceback" not in err and "Internal error" not in err
    return lines[0]


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def fast_probe():
    from dsa_export.compat import probe_environment

    return probe_environment()


# ---------------------------------------------------------------------------------------------
# The hash cache inside a build folder


def _tamper_keeping_size_and_mtime(path: Path, offset: int) -> None:
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01  # a value changes, the protobuf still parses
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns


def _forge_cache(build: Path, relative: str, digest: str, **extra) -> None:
    from dsa_export.integrity import VERIFY_CACHE_NAME, _cache_key

    cache_file = build / VERIFY_CACHE_NAME
    cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    cache[relative] = {"key": _cache_key(os.stat(build / relative)), "sha256": digest, **extra}
    cache_file.write_text(json.dumps(cache))


@pytest.mark.parametrize("signature", [None, "0" * 64, "copied"])
def test_a_forged_hash_cache_does_not_pass_a_tampered_file(demo_build, tmp_path, cache_home, capsys, signature):
    """The attacker edits a file of the build (same size, mtime put back) and writes
    ``.verified.json`` with the new stat key and the recorded sha256: unsigned, wrongly signed, or
    with a signature lifted from a genuine entry of the same user."""
    from dsa_export.integrity import VERIFY_CACHE_NAME, remember_hashes
    from dsa_export.manifest import read_manifest

    build = tmp_path / "b"
    shutil.copytree(demo_build[0].output, build)
    records = read_manifest(build).files
    for relative, offset in (("model.onnx", 300), ("onnxruntime/model.optimized.onnx", 200)):
        digest = records[relative]["sha256"]
        extra = {}
        if signature == "copied":
            remember_hashes(build, {relative: digest})  # genuine, for the file before the edit
            extra["hmac"] = json.loads((build / VERIFY_CACHE_NAME).read_text())[relative]["hmac"]
        elif signature is not None:
            extra["hmac"] = signature
        _tamper_keeping_size_and_mtime(build / relative, offset)
        _forge_cache(build, relative, digest, **extra)
    code, err = _main(["run", build, "--runtime", "onnxruntime"], capsys)
    assert code == 1 and "model.optimized.onnx' does not match the sha256" in _one_error(err)
    code, err = _main(["validate", build / "model.onnx"], capsys)
    assert code == 1 and "model.onnx' does not match the sha256" in _one_error(err)


def test_the_builds_signed_cache_saves_the_hash_and_nothing_else_does(tmp_path, cache_home, monkeypatch):
    import dsa_export.fileio as fileio
    from dsa_export.fileio import file_record
    from dsa_export.integrity import CACHE_SECRET_NAME, known_digest, remember_hashes, user_cache_file, verify_files

    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"weights" * 100)
    records = {"w.bin": file_record(folder / "w.bin")}
    hashed: list[str] = []
    real = fileio.sha256_file
    monkeypatch.setattr(fileio, "sha256_file", lambda path, *a: hashed.append(Path(path).name) or real(path, *a))
    remember_hashes(folder, {"w.bin": records["w.bin"]["sha256"]})  # what the build does
    secret = user_cache_file().with_name(CACHE_SECRET_NAME)
    assert secret.stat().st_mode & 0o777 == 0o600
    assert known_digest(folder, "w.bin") == records["w.bin"]["sha256"]
    verify_files(folder, records, ["w.bin"], source="test")
    assert hashed == []  # the first read is a stat
    # Another user's key (another cache folder): the folder's entries are no longer this user's.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
    assert known_digest(folder, "w.bin") is None
    verify_files(folder, records, ["w.bin"], source="test")
    assert hashed == ["w.bin"]
    # A key others may read signs nothing and vouches for nothing.
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    secret.chmod(0o644)
    assert known_digest(folder, "w.bin") is None
    secret.chmod(0o600)
    assert known_digest(folder, "w.bin") == records["w.bin"]["sha256"]
    # A cache folder where no key can be made: nothing is recorded, every file is hashed.
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    other = tmp_path / "g"
    other.mkdir()
    (other / "w.bin").write_bytes(b"x")
    remember_hashes(other, {"w.bin": "0" * 64})
    assert not (other / ".verified.json").exists() and known_digest(other, "w.bin") is None


# ---------------------------------------------------------------------------------------------
# External data of ONNX files


def _external_model(folder: Path, location: str, offset: int | None = None, length: int | None = None) -> Path:
    """``folder/model.onnx``: y = x + w, with w's four floats kept as external data at ``location``."""
    import onnx
    from onnx import TensorProto, helper

    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = weight.external_data.add()
            entry.key, entry.value = key, str(value)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")], "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save_model(model, str(path))
    return path


FLOATS = np.arange(4, dtype=np.float32).tobytes()


def _bad_models(root: Path) -> dict[str, tuple[Path, str]]:
    """``{case: (model, part of the refusal)}``."""
    (root / "secret.bin").write_bytes(FLOATS)
    cases = {
        "dotdot": (_external_model(root / "dotdot", "../secret.bin"), "which leads out of the folder"),
        "absolute": (_external_model(root / "absolute", "/etc/passwd"), "is the absolute path '/etc/passwd'"),
        "inner-dotdot": (_external_model(root / "inner", "sub/../../secret.bin"), "which leads out of the folder"),
        "past-the-end": (_external_model(root / "past", "weights.bin", offset=8, length=16), "holds only 16 bytes"),
        "short-file": (_external_model(root / "short", "weights.bin"), "holds only 8 bytes"),
        "bad-offset": (_external_model(root / "offset", "weights.bin", offset="-4"), "not a byte count"),
    }
    (root / "past" / "weights.bin").write_bytes(FLOATS)
    (root / "short" / "weights.bin").write_bytes(FLOATS[:8])
    (root / "offset" / "weights.bin").write_bytes(FLOATS)
    link = _external_model(root / "link", "weights.bin")
    (root / "link" / "weights.bin").symlink_to(root / "secret.bin")
    cases["symlink"] = (link, "which is a link out of the folder")
    return cases


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    return _bad_models(tmp_path_factory.mktemp("external"))


def test_external_data_inside_its_folder_runs(tmp_path):
    from dsa_export.integrity import check_external_data
    from dsa_export.runtime import load

    path = _external_model(tmp_path / "good", "data/weights.bin", offset=4, length=16)
    (tmp_path / "good" / "data").mkdir()
    (tmp_path / "good" / "data" / "weights.bin").write_bytes(b"\x00" * 4 + FLOATS)
    assert check_external_data(path) == ["data/weights.bin"]
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(load(path).run({"x": x})["y"], x + np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("case", ["dotdot", "absolute", "inner-dotdot", "symlink", "past-the-end", "short-file",
                                  "bad-offset"])
@pytest.mark.parametrize("command", ["run", "validate", "inspect", "build"])
def test_external_data_out_of_bounds_is_refused_by_every_command(bad_models, tmp_path, fast_probe, monkeypatch,
                                                                 capsys, command, case):
    monkeypatch.setattr("dsa_export.compat.probe_environment", lambda *a, **k: fast_probe)
    path, message = bad_models[case]
    argv = [command, path] + (["-o", tmp_path / "out", "--backend", "onnxruntime"] if command == "build" else [])
    code, err = _main(argv, capsys)
    line = _one_error(err)
    assert code == 1 and message in line, err
    assert line.count(". ") == 0 and line.endswith("."), line  # one sentence
    assert not (tmp_path / "out").exists()


def test_onnxruntime_never_gets_a_model_whose_data_leaves_its_folder(bad_models, monkeypatch):
    """The session factories themselves refuse, whoever calls them (validation's Polygraphy runner,
    pipeline stages), also for a modified copy of the graph held in memory."""
    import onnx

    from dsa_export.runtime import onnxrt

    for case in ("dotdot", "absolute", "symlink", "past-the-end"):
        path, message = bad_models[case]
        with pytest.raises(DSAUserError, match=message):
            onnxrt.session(path)
        with pytest.raises(DSAUserError, match=message):
            onnxrt.session(path, model_bytes=onnx.load(str(path), load_external_data=False).SerializeToString())


def test_a_build_whose_onnx_data_leaves_the_folder_is_refused_without_verification(demo_build, tmp_path, capsys):
    """``--no-verify`` skips the hashes, never the confinement: the build's optimized model is
    rewritten to read its weights from a file two folders up."""
    import onnx

    build = tmp_path / "b"
    shutil.copytree(demo_build[0].output, build)
    optimized = build / "onnxruntime" / "model.optimized.onnx"
    model = onnx.load(str(optimized))
    onnx.save(model, str(optimized), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.optimized.onnx.data", size_threshold=0)
    shutil.move(str(optimized) + ".data", tmp_path / "stolen.data")
    model = onnx.load(str(optimized), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../../stolen.data"
    onnx.save(model, str(optimized))
    code, err = _main(["run", build, "--runtime", "onnxruntime", "--no-verify"], capsys)
    assert code == 1 and "'../../stolen.data', which leads out of the folder" in _one_error(err)


# ---------------------------------------------------------------------------------------------
# Profile sizes


@pytest.mark.parametrize("sequence,available", [(10**9, 4 << 30), (10**12, None)])
def test_a_profile_of_a_billion_tokens_is_refused_before_allocating(demo_build, tmp_path, monkeypatch, capsys,
                                                                    sequence, available):
    from dsa_export.manifest import MANIFEST_NAME

    if available is not None:  # the same verdict on any machine
        monkeypatch.setattr("dsa_export.runtime.memory.available_memory", lambda: (available, "the test"))
    build = tmp_path / "b"
    shutil.copytree(demo_build[0].output, build)
    manifest = json.loads((build / MANIFEST_NAME).read_text())
    name = next(dim for spec in manifest["inputs"] for dim in spec["shape"] if isinstance(dim, str)
                and dim in manifest["profiles"]["dims"] and dim != "batch")
    for dims in [manifest["profiles"]["dims"], *manifest["profiles"].get("all", [])]:
        dims[name] = [1, sequence, sequence]  # a manifest that says so throughout
    (build / MANIFEST_NAME).write_text(json.dumps(manifest))
    start = time.perf_counter()
    code, err = _main(["run", build, "--runtime", "onnxruntime"], capsys)
    elapsed = time.perf_counter() - start
    line = _one_error(err)
    assert code == 1 and "generating the inputs needs" in line and "GiB" in line and "input '" in line, err
    assert elapsed < 5, elapsed


def test_make_inputs_checks_the_shapes_before_any_array_exists(monkeypatch):
    from dsa_export.manifest import TensorSpec, make_inputs

    specs = [TensorSpec("input_ids", "int64", ("batch", "sequence"), (0, 10)),
             TensorSpec("mask", "bool", ("batch", "sequence"))]
    seen = {}
    feeds = make_inputs(specs, {"batch": 2, "sequence": 3}, before=seen.update)
    assert seen == {"input_ids": (2, 3), "mask": (2, 3)} and feeds["input_ids"].shape == (2, 3)
    monkeypatch.setattr("dsa_export.runtime.memory.available_memory", lambda: (1 << 20, "the test"))
    with pytest.raises(DSAUserError, match=r"input 'input_ids' alone is 2x100000000, 1.5 GiB"):
        make_inputs(specs, {"batch": 2, "sequence": 10**8}, before=pytest.fail)
