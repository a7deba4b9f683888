"""TensorRT builds that prove they used the plugins, several in one process, over the honest test double.

Each failure mode TensorRT reports through a return value (a null plugin library handle, a
rejected timing cache, a -1 profile index) must give one clear sentence or a warning and a
fallback, never a silently different engine. Small hand-made ONNX files keep these tests fast.
"""

from __future__ import annotations

import logging

import pytest

from dsa_export.errors import DSAUserError
from dsa_export.trt.profiles import ShapeRange
from dsa_export.trt.tensorrt import TensorRTBuildSettings, build_engine
from tests.trt.fakes import OTHER_GPU_CACHE, UNREADABLE_CACHE, fake_tensorrt, tiny_dsa_model

RANGES = ShapeRange({"batch": (1, 1, 2), "sequence": (1, 8, 32)})


@pytest.fixture
def model(tmp_path):
    return tiny_dsa_model(tmp_path / "tiny.onnx", nodes=3)


@pytest.fixture
def lib(tmp_path):
    path = tmp_path / "libdsa_plugins.so"
    path.write_bytes(b"\x7fELF")
    return path


def _settings(**kw):
    return TensorRTBuildSettings(ranges=RANGES, precision="fp32", **kw)


@pytest.mark.parametrize("version", ["10.3.0", "10.8.0", "11.1.0"])
def test_every_dsa_node_becomes_a_plugin_layer_whichever_the_parser_prefers(model, lib, version):
    # Before 10.7 the parser builds a node's local function even with the plugin registered; the
    # bodies are therefore removed from what the parser gets.
    trt = fake_tensorrt(version)
    result = build_engine(model, _settings(plugin_library=lib), trt_module=trt)
    assert result.dsa_nodes == 3 and result.plugin_layers == 3
    parsed = trt.calls["parsed_model"]
    assert not list(parsed.functions) and [n.op_type for n in parsed.graph.node].count("DSAIndexerTopK") == 3
    assert trt.calls["parsed"] == str(model)  # external data resolves against the original file
    assert trt.calls["config"].profiling_verbosity == "DETAILED"  # the inspector's layer types need it
    assert trt.calls["deserialized"] == 1


def test_the_file_on_disk_keeps_its_bodies(model, lib):
    import onnx

    build_engine(model, _settings(plugin_library=lib), trt_module=fake_tensorrt("10.8.0"))
    assert [f.name for f in onnx.load(str(model)).functions] == ["DSAIndexerTopK"]


def test_an_engine_with_fewer_plugin_layers_than_dsa_nodes_is_refused(model, lib):
    with pytest.raises(DSAUserError, match=r"has 2 plugin layer\(s\) for 3 dsa node\(s\)"):
        build_engine(model, _settings(plugin_library=lib), trt_module=fake_tensorrt("10.8.0", engine_plugin_layers=2))


def test_a_dsa_op_the_library_does_not_register_fails_the_parse_loudly(model, lib):
    trt = fake_tensorrt("11.1.0", library_creators=("DSASparseAttention",))
    with pytest.raises(DSAUserError, match=r"No importer registered for op: DSAIndexerTopK.*bodies were removed"):
        build_engine(model, _settings(plugin_library=lib), trt_module=trt)


def test_without_a_plugin_library_nothing_is_stripped_or_inspected(model):
    trt = fake_tensorrt("10.8.0")
    result = build_engine(model, _settings(), trt_module=trt)
    assert result.plugin_layers == 0 and result.dsa_nodes == 3 and trt.calls["deserialized"] == 0
    assert trt.calls["config"].profiling_verbosity == "LAYER_NAMES_ONLY"


def test_a_plugin_free_graph_with_the_library_given_is_built_as_before(tmp_path, lib):
    model = tiny_dsa_model(tmp_path / "native.onnx", nodes=0)
    trt = fake_tensorrt("10.8.0")
    result = build_engine(model, _settings(plugin_library=lib, version_compatible=True), trt_module=trt)
    assert result.plugin_layers == result.dsa_nodes == 0 and not result.plugins_serialized
    assert trt.calls["config"].plugins_to_serialize is None and trt.calls["deserialized"] == 0


def test_version_compatible_engines_serialize_the_library_and_are_inspected_with_host_code(model, lib):
    trt = fake_tensorrt("10.15.1")
    result = build_engine(model, _settings(plugin_library=lib, version_compatible=True), trt_module=trt)
    # the double refuses to deserialize a version-compatible plan unless engine host code is allowed
    assert result.plugins_serialized and result.plugin_layers == 3
    assert trt.calls["config"].plugins_to_serialize == [str(lib.resolve())]


def test_several_builds_in_one_process_load_the_library_once(model, lib):
    trt = fake_tensorrt("11.1.0")
    for _ in range(3):
        assert build_engine(model, _settings(plugin_library=lib), trt_module=trt).plugin_layers == 3
    assert trt.calls["plugins"] == [str(lib.resolve())]  # a second load_library would return None


@pytest.mark.parametrize("stale", [UNREADABLE_CACHE, OTHER_GPU_CACHE + b"-cache"])
def test_a_rejected_timing_cache_warns_and_falls_back_to_a_fresh_one(model, tmp_path, caplog, stale):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(stale)
    trt = fake_tensorrt("10.8.0")
    with caplog.at_level(logging.WARNING, logger="dsa_export.trt.tensorrt"):
        result = build_engine(model, _settings(timing_cache=cache), trt_module=trt)
    assert not result.timing_cache_reused
    assert trt.calls["cache_in"] == b"" and result.timing_cache == b"+tuned"  # a fresh cache was used
    assert any(f"timing cache {cache} was not reused" in r.getMessage() for r in caplog.records)
    assert any("was not reused" in w for w in result.warnings)


def test_a_timing_cache_that_raises_also_falls_back(model, tmp_path):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"old")
    trt = fake_tensorrt("11.1.0")
    original = trt.Builder.create_builder_config

    def config(self):
        made = original(self)
        fresh = made.create_timing_cache

        def create(data):
            if data:
                raise RuntimeError("Failed to deserialize the timing cache")
            return fresh(data)

        made.create_timing_cache = create
        return made

    trt.Builder.create_builder_config = config
    result = build_engine(model, _settings(timing_cache=cache), trt_module=trt)
    assert not result.timing_cache_reused
    assert any("Failed to deserialize the timing cache" in w for w in result.warnings)


def test_a_cache_of_this_gpu_is_reused(model, tmp_path):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"tuned-here")
    trt = fake_tensorrt("10.8.0")
    result = build_engine(model, _settings(timing_cache=cache), trt_module=trt)
    assert result.timing_cache_reused and trt.calls["cache_set"] == [b"tuned-here"] and not result.warnings


def test_a_refused_optimization_profile_is_a_clear_error(model):
    with pytest.raises(DSAUserError, match=r"refused optimization profile 0 \(batch 1\.\.2, sequence 1\.\.32\)"):
        build_engine(model, _settings(), trt_module=fake_tensorrt("10.8.0", profile_ok=False))


def test_several_profiles_become_tensorrt_profiles_in_order(tmp_path):
    model = tiny_dsa_model(tmp_path / "past.onnx", past=True)
    prefill = ShapeRange({"batch": (1, 1, 2), "sequence": (1, 16, 64), "past_sequence": (0, 0, 0)})
    decode = ShapeRange({"batch": (1, 1, 2), "sequence": (1, 1, 1), "past_sequence": (0, 32, 64)})
    trt = fake_tensorrt("11.1.0")
    result = build_engine(model, _settings(profiles=(prefill, decode)), trt_module=trt)
    assert trt.calls["added_profiles"] == [
        {"x": ([1, 1], [1, 16], [2, 64]), "past": ([1, 0], [1, 0], [2, 0])},
        {"x": ([1, 1], [1, 1], [2, 1]), "past": ([1, 0], [1, 32], [2, 64])},
    ]
    assert result.profiles == result.all_profiles[0] and len(result.all_profiles) == 2


def test_the_double_is_the_release_it_claims(model):
    trt10, trt11 = fake_tensorrt("10.8.0"), fake_tensorrt("11.1.0")
    assert trt10.NetworkDefinitionCreationFlag.STRONGLY_TYPED == 1  # 0 is the deprecated EXPLICIT_BATCH
    assert trt11.NetworkDefinitionCreationFlag.STRONGLY_TYPED == 0  # deprecated and ignored
    assert hasattr(trt10.BuilderFlag, "FP16") and not hasattr(trt11.BuilderFlag, "FP16")
    assert not hasattr(trt11.BuilderFlag, "BF16")
    assert not hasattr(trt10.HardwareCompatibilityLevel, "SAME_COMPUTE_CAPABILITY")
    assert hasattr(fake_tensorrt("10.9.0").HardwareCompatibilityLevel, "SAME_COMPUTE_CAPABILITY")
    registry = trt10.get_plugin_registry()
    assert registry.load_library("a.so") is not None and registry.load_library("a.so") is None


def test_same_compute_capability_needs_tensorrt_10_9(model):
    same_cc = _settings(hardware_compatibility="same_compute_capability")
    with pytest.raises(DSAUserError, match="has no hardware compatibility level SAME_COMPUTE_CAPABILITY"):
        build_engine(model, same_cc, trt_module=fake_tensorrt("10.8.0"))
    trt = fake_tensorrt("10.9.0")
    build_engine(model, same_cc, trt_module=trt)
    assert trt.calls["config"].hardware_compatibility_level == "SAME_COMPUTE_CAPABILITY"
