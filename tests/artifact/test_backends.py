"""Backend choice on recorded environments, shape options, and the TensorRT 10/11 builder calls.

TensorRT itself is not installable here, so :func:`tests.trt.fakes.fake_tensorrt` is a test double
that records what :func:`dsa_export.trt.tensorrt.build_engine` asks of the TensorRT Python API
(network flags, builder flags, profiles, timing cache, plugin loading) and answers as the release
it pretends to be. It checks our calls, not TensorRT.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsa_export.artifact import BuildSettings, parse_shape_ranges, plan_backends
from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.trt.profiles import DEFAULT_RANGE, ShapeRange
from tests.compat.helpers import fixture_probe
from tests.trt.fakes import fake_tensorrt


def test_auto_prefers_tensorrt_with_a_gpu():
    plan = plan_backends(BuildSettings(), fixture_probe("h200_driver580_cuda13_trt11"))
    assert plan.engine == "tensorrt" and plan.onnxruntime
    assert "TensorRT 11" in plan.reason and "H200" in plan.reason


def test_auto_uses_tensorrt_rtx_for_a_gpu_it_supports():
    plan = plan_backends(BuildSettings(), fixture_probe("t4_tensorrt_rtx"))
    assert plan.engine == "tensorrt-rtx" and plan.rtx_targets == ("SM75",)
    assert "loads no plugins" in plan.reason


def test_auto_on_a_cpu_only_machine():
    probe = fixture_probe("cpu_only")
    plan = plan_backends(BuildSettings(), probe)
    if probe.component("tensorrt_rtx").found:
        assert plan.engine == "tensorrt-rtx" and plan.rtx_targets == ("SM89",)
        assert "no GPU is visible" in plan.reason
    else:
        assert plan.engine is None
    assert plan.onnxruntime


def test_explicit_backends_build_one_artifact():
    probe = fixture_probe("cpu_only")
    assert plan_backends(BuildSettings(backend="onnxruntime"), probe).backends == ["onnxruntime"]
    assert plan_backends(BuildSettings(backend="tensorrt"), probe).backends == ["tensorrt"]
    plan = plan_backends(BuildSettings(backend="tensorrt-rtx", rtx_targets=("SM120",)), probe)
    assert plan.backends == ["tensorrt-rtx"] and plan.rtx_targets == ("SM120",)


def test_tensorrt_rtx_refuses_a_hopper_gpu():
    probe = fixture_probe("h200_driver580_cuda13_trt11")
    with pytest.raises(DSAUserError, match="not supported by TensorRT-RTX"):
        plan_backends(BuildSettings(backend="tensorrt-rtx"), probe)


def test_shape_options():
    ranges = parse_shape_ranges("batch=1,sequence=1", "batch=2,sequence=64", "batch=8,sequence=1024")
    assert ranges.dims == {"batch": (1, 2, 8), "sequence": (1, 64, 1024)}
    assert parse_shape_ranges(None, None, "sequence=2048").dims["sequence"] == (1, 128, 2048)
    with pytest.raises(DSAUsageError, match="name=size"):
        parse_shape_ranges("batch", None, None)
    with pytest.raises(DSAUsageError, match="min <= opt <= max"):
        parse_shape_ranges(None, None, "sequence=64")
    with pytest.raises(DSAUsageError):
        BuildSettings(hardware_compatibility="volta+")
    # profiles replace ranges for the engine; ranges stays for what takes one range
    prefill = ShapeRange({"batch": (1, 1, 1), "sequence": (1, 64, 512), "past_sequence": (0, 0, 0)})
    decode = ShapeRange({"batch": (1, 1, 1), "sequence": (1, 1, 1), "past_sequence": (0, 256, 512)})
    settings = BuildSettings(profiles=[prefill, decode])
    assert settings.profiles == (prefill, decode) and settings.ranges == DEFAULT_RANGE
    assert BuildSettings().profiles == ()
    with pytest.raises(DSAUsageError, match=r"same dims.*profile 1: batch, sequence\.$"):
        BuildSettings(profiles=(prefill, ShapeRange({"batch": (1, 1, 1), "sequence": (1, 1, 1)})))
    with pytest.raises(DSAUsageError, match="not a ShapeRange"):
        BuildSettings(profiles=({"sequence": (1, 1, 1)},))
    assert BuildSettings(hardware_compatibility="ampere+").hardware_compatibility == "ampere_plus"


# ---------------------------------------------------------------------------------------------
# The TensorRT builder calls, over the test double of tests/trt/fakes.py


def test_tensorrt_11_is_strongly_typed_and_loads_plugins(exported, tmp_path):
    from dsa_export.trt.tensorrt import TensorRTBuildSettings, build_engine

    lib = tmp_path / "libdsa_plugins.so"
    lib.write_bytes(b"\x7fELF")
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"previous")
    trt = fake_tensorrt("11.1.0.4")
    settings = TensorRTBuildSettings(ranges=ShapeRange({"batch": (1, 2, 4), "sequence": (1, 64, 256)}), precision="fp32",
                                     plugin_library=lib, timing_cache=cache, optimization_level=5)
    result = build_engine(exported["plugin"], settings, trt_module=trt)
    calls = trt.calls
    assert calls["network_flags"] == 0  # TensorRT 11: the strongly typed flag is deprecated and ignored
    assert result.strongly_typed and calls["flags"] == []
    assert calls["plugins"] == [str(lib.resolve())]
    assert calls["profiles"] == [("input_ids", [1, 1], [2, 64], [4, 256])]
    assert calls["cache_in"] == b"previous" and result.timing_cache == b"previous+tuned" and result.timing_cache_reused
    assert calls["config"].builder_optimization_level == 5
    # the parser got the file without the dsa bodies; the engine has one plugin layer per dsa node
    assert not [f for f in calls["parsed_model"].functions if f.domain == "dsa"]
    assert result.dsa_nodes == 7 and result.plugin_layers == 7 and result.engine == b"ftrt-fake-plan"
    assert calls["parsed"] == str(exported["plugin"])  # external data is found beside the original file


def test_without_the_plugin_library_the_parser_gets_the_bodies_tensorrt_builds(exported):
    from dsa_export.trt.tensorrt import TensorRTBuildSettings, build_engine

    trt = fake_tensorrt("10.8.0.43")
    result = build_engine(exported["plugin"], TensorRTBuildSettings(precision="fp32"), trt_module=trt)
    assert trt.calls["static_attention"]  # the static sparse-attention chunks, swapped in memory
    assert result.plugin_layers == 0 and result.dsa_nodes == 7 and trt.calls["deserialized"] == 0


def test_tensorrt_11_refuses_weak_typing(exported):
    from dsa_export.trt.tensorrt import TensorRTBuildSettings, build_engine

    with pytest.raises(DSAUserError, match="strongly typed networks only"):
        build_engine(exported["plugin"], TensorRTBuildSettings(precision="fp16"), trt_module=fake_tensorrt("11.1.0"))


def test_tensorrt_10_flags(exported, tmp_path):
    from dsa_export.trt.tensorrt import TensorRTBuildSettings, build_engine

    trt = fake_tensorrt("10.8.0.43")
    lib = tmp_path / "libdsa_plugins.so"
    lib.write_bytes(b"\x7fELF")
    result = build_engine(exported["plugin"], TensorRTBuildSettings(
        precision="fp16", plugin_library=lib, version_compatible=True, hardware_compatibility="ampere_plus",
        workspace_bytes=1 << 30), trt_module=trt)
    assert trt.calls["network_flags"] == 0 and not result.strongly_typed  # fp32 file + fp16: weak typing
    assert trt.calls["flags"] == ["FP16", "VERSION_COMPATIBLE"]
    assert trt.calls["config"].plugins_to_serialize == [str(lib.resolve())] and result.plugins_serialized
    assert trt.calls["config"].hardware_compatibility_level == "AMPERE_PLUS"
    assert trt.calls["workspace"] == 1 << 30
    assert trt.calls["cache_in"] == b""
    trt = fake_tensorrt("10.8.0.43")
    result = build_engine(exported["plugin"], TensorRTBuildSettings(precision="fp32"), trt_module=trt)
    assert trt.calls["network_flags"] == 1 << 1 and result.strongly_typed  # kSTRONGLY_TYPED = 1 in 10.x


def test_tensorrt_errors_are_one_sentence(exported, tmp_path):
    from dsa_export.trt.tensorrt import TensorRTBuildSettings, build_engine

    lib = tmp_path / "libdsa_plugins.so"
    lib.write_bytes(b"\x7fELF")
    with pytest.raises(DSAUserError, match="could not load the plugin library"):
        build_engine(exported["plugin"], TensorRTBuildSettings(plugin_library=lib, precision="fp32"),
                     trt_module=fake_tensorrt("10.8.0", plugin_ok=False))
    with pytest.raises(DSAUserError, match="failed to build an engine"):
        build_engine(exported["plugin"], TensorRTBuildSettings(precision="fp32"), trt_module=fake_tensorrt("10.8.0", plan=None))
    with pytest.raises(DSAUserError, match="explicit Q/DQ"):
        build_engine(exported["plugin"], TensorRTBuildSettings(precision="int8"), trt_module=fake_tensorrt("10.8.0"))
    with pytest.raises(DSAUserError, match="too old"):
        build_engine(exported["plugin"], TensorRTBuildSettings(), trt_module=fake_tensorrt("8.6.1"))


def test_pipeline_tensorrt_backend_writes_what_the_gate_reads(exported, tmp_path, monkeypatch):
    """The whole pipeline with --backend tensorrt over the test double: engine, timing cache, manifest keys."""
    import sys

    from dsa_export.artifact import build
    from dsa_export.compat.engine_gate import read_requirements
    from dsa_export.fileio import sha256_file

    trt = fake_tensorrt("10.15.1.29")
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    lib = tmp_path / "libdsa_plugins.so"
    lib.write_bytes(b"\x7fELF-not-really")
    out = tmp_path / "trt"
    settings = BuildSettings(model=str(exported["plugin"]), output=out, backend="tensorrt", precision="fp32",
                             plugin_library=lib, skip_checks=True, validate=False, version_compatible=True,
                             hardware_compatibility="ampere+")
    result = build(settings, log=lambda line: None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backends"] == ["tensorrt"] and manifest["onnxruntime"] is None
    assert (out / "model.plan").read_bytes() == b"ftrt-fake-plan"
    assert (out / "timing.cache").read_bytes() == b"+tuned"
    assert manifest["checks"]["tensorrt"]["skipped"] is True
    engine = manifest["engine"]
    assert engine["plugin_library_sha256"] == sha256_file(lib) == manifest["plugin_library"]["sha256"]
    assert engine["dsa_nodes"] == engine["plugin_layers"] == 7 and engine["plugins_serialized"] is True
    assert manifest["profiles"]["all"] == [manifest["profiles"]["dims"]]  # one profile: the --shapes ranges
    requirements = read_requirements(out / "model.plan")
    assert requirements.trt_version == "10.15.1.29" and requirements.version_compatible
    assert requirements.plugins_serialized  # the loader leaves the library to the plan
    assert requirements.hardware_compatibility == "ampere_plus"
    assert requirements.plugin_library_sha256 == sha256_file(lib)
    # a second build, with a prefill and a decode profile, reuses the timing cache of the first
    import dataclasses

    prefill = ShapeRange({"batch": (1, 1, 2), "sequence": (1, 64, 256)})
    decode = ShapeRange({"batch": (1, 2, 4), "sequence": (1, 1, 1)})
    trt2 = fake_tensorrt("10.15.1.29")
    monkeypatch.setitem(sys.modules, "tensorrt", trt2)
    build(dataclasses.replace(settings, profiles=(prefill, decode)), log=lambda line: None)
    assert trt2.calls["cache_in"] == b"+tuned"
    assert trt2.calls["added_profiles"] == [{"input_ids": ([1, 1], [1, 64], [2, 256])},
                                            {"input_ids": ([1, 1], [2, 1], [4, 1])}]
    profiles = json.loads((out / "manifest.json").read_text())["profiles"]
    assert profiles["dims"] == {"batch": [1, 1, 2], "sequence": [1, 64, 256]}  # what existing readers use: the first
    assert profiles["all"] == [profiles["dims"], {"batch": [1, 2, 4], "sequence": [1, 1, 1]}]
    assert profiles["inputs"]["input_ids"] == {"min": [1, 1], "opt": [1, 64], "max": [2, 256]}
    assert result.steps[2].status == "skipped"
    assert Path(out / "manifest.json").is_file()


def test_onnxruntime_gets_the_static_registration_library(tmp_path):
    from dsa_export.artifact.builder import _plugin_library

    lib = tmp_path / "libdsa_plugins.so"
    lib.write_bytes(b"\x7fELF-getCreators")
    settings = BuildSettings(plugin_library=lib)
    assert _plugin_library(settings, "plugin")[0] == lib.resolve()
    path, sha, reason = _plugin_library(settings, "static")
    assert path is None and sha is None and "libdsa_plugins_static.so" in reason
    static = tmp_path / "libdsa_plugins_static.so"
    static.write_bytes(b"\x7fELF-registers-on-load")
    path, sha, reason = _plugin_library(settings, "static")
    assert path == static.resolve() and len(sha) == 64 and reason is None
    with pytest.raises(DSAUserError, match="does not exist"):
        _plugin_library(BuildSettings(plugin_library=tmp_path / "nope.so"), "plugin")
