"""TensorRT 10 calibration cache: format, round trip, and scales read back into Q/DQ."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from dsa_export.errors import DSAUserError
from dsa_export.quantize.cache import (
    CalibrationCache,
    format_cache,
    hex_to_scale,
    parse_cache,
    read_cache,
    scale_to_hex,
    version_number,
    write_cache,
)


def test_scale_hex_is_the_big_endian_float32_bit_pattern():
    assert scale_to_hex(1.0) == "3f800000"
    assert scale_to_hex(1 / 128) == "3c000000"
    assert scale_to_hex(-2.0) == "c0000000"
    assert hex_to_scale("3c008912") == np.frombuffer(bytes.fromhex("3c008912")[::-1], dtype=np.float32)[0]
    assert hex_to_scale("0") == 0.0  # TensorRT writes unused tensors as a bare 0


def test_version_numbers_follow_tensorrt_10():
    assert version_number("10.3.0") == 100300
    assert version_number("10.14.1") == 101401
    for bad in ("11.0.0", "8.6.1", "ten"):
        with pytest.raises(DSAUserError):
            version_number(bad)


def test_round_trip_keeps_every_scale_bit_exact(tmp_path):
    rng = np.random.default_rng(0)
    scales = {f"t{i}": np.float32(s) for i, s in enumerate(rng.lognormal(-4, 2, size=200))}
    scales["(Unnamed Layer* 3) [Shuffle]_output"] = np.float32(0.0123)  # names may contain ": "-free spaces
    scales["a:b"] = np.float32(3.5)  # and colons
    path = write_cache(CalibrationCache(scales, version=100300), tmp_path / "x.cache")
    text = path.read_text()
    assert text.splitlines()[0] == "TRT-100300-EntropyCalibration2"
    back = read_cache(path)
    assert back.version == 100300 and back.calibrator == "EntropyCalibration2"
    assert set(back.scales) == set(scales)
    for name, scale in scales.items():
        assert back.scales[name].view(np.uint32) == scale.view(np.uint32), name
    assert format_cache(back) == text


@pytest.mark.parametrize(
    ("text", "match"),
    [("", "empty"), ("hello\n", "TRT-<version>"), ("TRT-100300-EntropyCalibration2\nx 3f800000\n", "line 2"),
     ("TRT-100300-EntropyCalibration2\nx: zz\n", "line 2"), ("TRT-100300-EntropyCalibration2\nx: 7fc00000\n", "finite")],
)
def test_malformed_caches_are_refused(text, match):
    with pytest.raises(DSAUserError, match=match):
        parse_cache(text)


def test_written_cache_covers_the_quantized_activations(default_int8, saved_int8):
    cache = read_cache(saved_int8["cache"])
    assert set(cache.scales) == set(default_int8.placement.activations)
    for name, scale in cache.scales.items():
        assert scale == default_int8.activation_scales[name]
        assert np.isclose(scale, default_int8.amax[name] / 127, rtol=1e-6)


def _activation_scales(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {i.name: i for i in model.graph.initializer}
    return {
        n.input[0]: numpy_helper.to_array(inits[n.input[1]])
        for n in model.graph.node if n.op_type == "QuantizeLinear"
    }


def test_cache_reads_back_into_the_same_qdq_model(exported, default_int8, saved_int8):
    from dsa_export.quantize import QuantizeSettings, quantize

    again = quantize(exported["plugin"], QuantizeSettings(from_cache=str(saved_int8["cache"]), report=False))
    want, got = _activation_scales(default_int8.model), _activation_scales(again.model)
    assert set(got) == set(want) and len(got) == len(default_int8.placement.activations)
    for name in want:
        # within one ulp is the acceptance bar; the text format is exact, so we get zero ulps
        assert abs(int(got[name].view(np.int32)) - int(want[name].view(np.int32))) <= 1, name
    assert [n.op_type for n in again.model.graph.node] == [n.op_type for n in default_int8.model.graph.node]


def test_a_cache_for_another_model_is_refused(exported, tmp_path):
    from dsa_export.quantize import QuantizeSettings, quantize

    path = write_cache(CalibrationCache({"some_other_tensor": np.float32(0.1)}), tmp_path / "other.cache")
    with pytest.raises(DSAUserError, match="no scale for"):
        quantize(exported["plugin"], QuantizeSettings(from_cache=str(path), report=False))
