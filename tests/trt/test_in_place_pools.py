"""A full-TensorRT build with the plugin library writes the paged graph's float cache pools in place:
each ScatterND of a ``past_*pool*`` input into its ``present_*pool*`` output becomes a
DSAPagedCacheWrite plugin layer, and ``PreviewFeature.ALIASED_PLUGIN_IO_10_03`` lets TensorRT honour
the plugin's aliased output. Over the honest test double of tests/trt/fakes.py; the rewrite's rules
themselves are tested in tests/ops/test_paged_write.py."""

from __future__ import annotations

import onnx
import pytest

from dsa_export.trt.profiles import ShapeRange
from dsa_export.trt.tensorrt import TensorRTBuildSettings, build_engine
from tests.trt.fakes import fake_tensorrt, tiny_paged_model

RANGES = ShapeRange({"batch": (1, 1, 2), "sequence": (1, 8, 32), "pages": (1, 4, 16)})


@pytest.fixture
def lib(tmp_path):
    path = tmp_path / "libdsa_plugins.so"
    path.write_bytes(b"\x7fELF")
    return path


def _settings(**kw):
    return TensorRTBuildSettings(ranges=RANGES, precision="fp32", **kw)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("version", ["10.3.0", "10.16.0", "11.1.0"])
def test_float_pools_become_aliased_plugin_layers_and_fp8_pools_stay_scatters(tmp_path, lib, version):
    model = tiny_paged_model(tmp_path / "paged.onnx", fp8_pool=True)
    trt = fake_tensorrt(version)
    result = build_engine(model, _settings(plugin_library=lib), trt_module=trt)
    assert result.in_place_pools == ["present_latent_pool_0"]
    assert trt.calls["preview_features"] == [("ALIASED_PLUGIN_IO_10_03", True)]
    parsed = trt.calls["parsed_model"]
    assert _ops(parsed) == ["DSAPagedCacheWrite", "Shape", "ReduceSum", "ScatterND"]  # the uint8 pool keeps ScatterND
    write = parsed.graph.node[0]
    assert (list(write.input), list(write.output)) == (["past_latent_pool_0", "indices", "new"],
                                                       ["present_latent_pool_0"])
    assert not list(parsed.functions)  # only the plugin can build the node
    assert result.dsa_nodes == result.plugin_layers == 1
    assert _ops(onnx.load(str(model))) == ["ScatterND", "Shape", "ReduceSum", "ScatterND"]  # the file is untouched


def test_before_10_3_the_pools_keep_their_scatter_with_a_warning(tmp_path, lib):
    model = tiny_paged_model(tmp_path / "paged.onnx")
    trt = fake_tensorrt("10.2.0")
    result = build_engine(model, _settings(plugin_library=lib), trt_module=trt)
    assert result.in_place_pools == [] and trt.calls["preview_features"] == []
    assert _ops(trt.calls["parsed_model"])[0] == "ScatterND" and result.dsa_nodes == 0
    assert any("PreviewFeature.ALIASED_PLUGIN_IO_10_03" in w and "copies each pool" in w for w in result.warnings)


def test_without_the_plugin_library_nothing_is_rewritten(tmp_path):
    model = tiny_paged_model(tmp_path / "paged.onnx")
    trt = fake_tensorrt("11.1.0")
    result = build_engine(model, _settings(), trt_module=trt)
    assert result.in_place_pools == [] and trt.calls["preview_features"] == []
    assert _ops(trt.calls["parsed_model"])[0] == "ScatterND"


def test_a_pool_another_node_reads_is_not_aliased(tmp_path, lib):
    model = tiny_paged_model(tmp_path / "paged.onnx", extra_reader=True)
    trt = fake_tensorrt("11.1.0")
    result = build_engine(model, _settings(plugin_library=lib), trt_module=trt)
    assert result.in_place_pools == [] and trt.calls["preview_features"] == []
    assert "DSAPagedCacheWrite" not in _ops(trt.calls["parsed_model"])
