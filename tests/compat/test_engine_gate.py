"""The engine gate rejects non-engines in one sentence and names why an engine cannot load here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsa_export.compat.engine_gate import (
    EngineRequirements,
    check_engine,
    gate_engine,
    read_requirements,
    sniff_engine,
)
from dsa_export.compat.records import EnvironmentProbe
from dsa_export.compat.rules import CheckSettings, run_checks
from dsa_export.errors import DSAUserError

H200_PLUGIN_SHA = "5f2b0c4d9e8a7f61c3b2a1908d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e"


def _engine(folder: Path, manifest: dict | None, magic: bytes = b"ftrt") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    engine = folder / "model.engine"
    engine.write_bytes(magic + b"\x00\x00\x00\x00" + bytes(range(256)))
    if manifest is not None:
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return engine


H200_ENGINE = {
    "trt_version": "11.0.0.15",
    "backend": "tensorrt",
    "compute_capability": "9.0",
    "hardware_compatibility": "none",
    "version_compatible": False,
    "plugin_library_sha256": H200_PLUGIN_SHA,
}


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        (b"", ".engine", "is empty"),
        (b"\x08\x09\x12\x07pytorch\x1a\x03onnx", ".onnx", "is an ONNX model"),
        (b"\x08\x08\x12\x07pytorch:\x05onnx", ".engine", "is an ONNX model"),
        (b"hello, I am text\n", ".engine", "is a text file"),
        (
            b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 64,
            ".engine",
            "does not start with a TensorRT plan tag",
        ),
    ],
)
def test_files_that_are_not_engines(
    tmp_path: Path, content: bytes, suffix: str, message: str
) -> None:
    path = tmp_path / f"model{suffix}"
    path.write_bytes(content)
    with pytest.raises(DSAUserError, match=message) as info:
        sniff_engine(path)
    assert str(info.value).count(". ") == 0  # one sentence


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(DSAUserError, match="does not exist"):
        sniff_engine(tmp_path / "nope.engine")
    with pytest.raises(DSAUserError, match="is a folder"):
        sniff_engine(tmp_path)


def test_plan_tags_are_recognized(tmp_path: Path) -> None:
    assert sniff_engine(_engine(tmp_path / "a", None, b"ftrt")) == "TensorRT"
    assert sniff_engine(_engine(tmp_path / "b", None, b"vtrt")) == "TensorRT-RTX"


def test_engine_without_manifest(tmp_path: Path) -> None:
    with pytest.raises(DSAUserError, match="has no manifest.json next to it"):
        read_requirements(_engine(tmp_path, None))


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"backend": "tensorrt"}, 'no valid "trt_version"'),
        ({"trt_version": "10.3", "backend": "tvm"}, "names backend 'tvm'"),
        (
            {"trt_version": "10.3", "hardware_compatibility": "turbo"},
            "hardware_compatibility 'turbo'",
        ),
    ],
)
def test_malformed_manifests(tmp_path: Path, manifest: dict, message: str) -> None:
    with pytest.raises(DSAUserError, match=message):
        read_requirements(_engine(tmp_path, manifest))


def test_manifest_that_is_not_json(tmp_path: Path) -> None:
    engine = _engine(tmp_path, None)
    (tmp_path / "manifest.json").write_text("{oops")
    with pytest.raises(DSAUserError, match="is not valid JSON"):
        read_requirements(engine)


def test_manifest_keys_may_sit_under_engine(tmp_path: Path) -> None:
    requirements = read_requirements(
        _engine(tmp_path, {"engine": H200_ENGINE, "model": {"name": "x"}})
    )
    assert requirements == EngineRequirements(
        trt_version="11.0.0.15",
        backend="tensorrt",
        compute_capability=("9.0",),
        hardware_compatibility="none",
        version_compatible=False,
        plugin_library_sha256=H200_PLUGIN_SHA,
    )


def test_matching_engine_passes_the_gate(tmp_path: Path, h200: EnvironmentProbe) -> None:
    engine = _engine(tmp_path, H200_ENGINE)
    assert check_engine(engine, h200)[1] == []
    assert gate_engine(engine, h200).trt_version == "11.0.0.15"


def test_engines_of_one_session_share_one_probe_and_read_no_manifest_again(
    tmp_path: Path, h200: EnvironmentProbe, monkeypatch
) -> None:
    """A pipeline's stages pass one GateProbe: the environment is probed on the first engine only;
    a manifest the loader has parsed is handed over, not read again."""
    import dsa_export.compat.engine_gate as gate

    engines = [_engine(tmp_path / f"stage_{i}", H200_ENGINE) for i in range(3)]
    probes = []
    monkeypatch.setattr(gate, "probe_environment", lambda settings: probes.append(settings) or h200)
    shared = gate.GateProbe()
    for engine in engines:
        (engine.parent / "manifest.json").unlink()  # the gate must not need the file
        assert gate_engine(engine, shared, manifest_data=H200_ENGINE).trt_version == "11.0.0.15"
    assert len(probes) == 1
    gate_engine(engines[0], manifest_data=H200_ENGINE)  # no shared probe: this engine probes alone
    assert len(probes) == 2


@pytest.mark.parametrize(
    ("changes", "finding"),
    [
        ({"trt_version": "11.0.0.14"}, "engine_tensorrt_version_mismatch"),
        ({"trt_version": "10.13.3.9"}, "engine_tensorrt_version_mismatch"),
        (
            {"trt_version": "11.2.0.1", "version_compatible": True},
            "engine_tensorrt_version_mismatch",
        ),
        ({"trt_version": "8.6.1", "version_compatible": True}, "engine_tensorrt_version_mismatch"),
        ({"compute_capability": "8.0"}, "engine_compute_capability_mismatch"),
        (
            {"compute_capability": "8.0", "hardware_compatibility": "same_compute_capability"},
            "engine_compute_capability_mismatch",
        ),
        ({"plugin_library_sha256": "ab" * 32}, "engine_plugin_library_mismatch"),
        (
            {"backend": "tensorrt-rtx", "trt_version": "1.7.1.116", "plugin_library_sha256": None},
            None,
        ),
        (
            {"backend": "tensorrt-rtx", "trt_version": "1.5.0.1", "plugin_library_sha256": None},
            "engine_tensorrt_version_mismatch",
        ),
        ({"trt_version": "10.13.3.9", "version_compatible": True}, None),  # 10 -> 11 is allowed
        ({"trt_version": "11.0.0.2", "version_compatible": True}, None),
        ({"compute_capability": "8.0", "hardware_compatibility": "ampere_plus"}, None),
        ({"compute_capability": ["8.6", "8.9", "9.0"]}, None),
        ({"plugin_library_sha256": None}, None),
    ],
)
def test_engine_mismatches_are_named(
    tmp_path: Path, h200: EnvironmentProbe, changes: dict, finding: str | None
) -> None:
    engine = _engine(tmp_path, {**H200_ENGINE, **changes})
    found = [f.id for f in check_engine(engine, h200)[1]]
    assert found == ([finding] if finding else [])
    if finding:
        with pytest.raises(DSAUserError, match=r"^Refusing to load"):
            gate_engine(engine, h200)


def test_engine_on_a_cpu_only_machine(tmp_path: Path, cpu_only: EnvironmentProbe) -> None:
    found = [f.id for f in check_engine(_engine(tmp_path, H200_ENGINE), cpu_only)[1]]
    assert found == ["engine_runtime_missing", "engine_no_gpu", "engine_plugin_library_missing"]


def test_run_checks_with_engine_blocks_on_engine_findings(
    tmp_path: Path, h200: EnvironmentProbe
) -> None:
    ok = run_checks(CheckSettings(engine=_engine(tmp_path / "ok", H200_ENGINE)), h200)
    assert ok.exit_code == 0 and ok.engine["requirements"]["trt_version"] == "11.0.0.15"
    bad = run_checks(
        CheckSettings(
            engine=_engine(tmp_path / "bad", {**H200_ENGINE, "compute_capability": "10.0"})
        ),
        h200,
    )
    assert [f.id for f in bad.blocking] == ["engine_compute_capability_mismatch"]


def test_real_tensorrt_rtx_engine_has_a_known_plan_tag(tmp_path: Path) -> None:
    trt = pytest.importorskip(
        "tensorrt_rtx_bindings", reason="TensorRT-RTX Python bindings are not installed"
    )
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    tensor = network.add_input("x", trt.float32, (1, 8))
    network.mark_output(network.add_activation(tensor, trt.ActivationType.RELU).get_output(0))
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(trt.ComputeCapability.SM89, 0)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        pytest.skip("TensorRT-RTX could not build an engine on this machine")
    engine = tmp_path / "relu.engine"
    engine.write_bytes(bytes(serialized))
    assert sniff_engine(engine) == "TensorRT-RTX"


@pytest.mark.parametrize(
    ("engine_version", "accepted"),
    [
        ("8.5.3.1", False),  # version compatibility starts at 8.6
        ("8.6.1.6", True),
        ("9.3.0.1", True),
        ("10.0.1.6", True),
        ("10.4.0.26", False),  # a newer engine never runs on an older runtime
    ],
)
def test_version_compatible_engines_from_older_majors_under_tensorrt_10(
    tmp_path: Path, a100: EnvironmentProbe, engine_version: str, accepted: bool
) -> None:
    manifest = {
        "trt_version": engine_version,
        "compute_capability": "8.0",
        "version_compatible": True,
    }
    found = [f.id for f in check_engine(_engine(tmp_path, manifest), a100)[1]]
    assert found == ([] if accepted else ["engine_tensorrt_version_mismatch"])
