"""TensorRT-RTX (from PyPI, CPU-only here) parses and AOT-builds both export modes."""

from __future__ import annotations

import pytest

from dsa_export.trt.profiles import ShapeRange

pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT-RTX is not installed (pip install dsa-export[rtx])")


@pytest.mark.parametrize("mode", ["plugin", "native"])
def test_rtx_parses_and_builds_with_a_dynamic_profile(exported, mode):
    from dsa_export.trt.rtx import build_engine

    result = build_engine(exported[mode], ShapeRange({"batch": (1, 2, 4), "sequence": (1, 64, 512)}))
    assert len(result.engine) > 100_000
    assert result.profiles["input_ids"] == ([1, 1], [2, 64], [4, 512])
    assert result.layers > 100


def test_rtx_rejects_a_target_it_does_not_know(exported):
    from dsa_export.errors import DSAUserError
    from dsa_export.trt.rtx import build_engine

    with pytest.raises(DSAUserError, match="cannot target SM90"):
        build_engine(exported["native"], targets=("SM90",))


def test_profile_needs_a_range_for_every_dynamic_dim(exported):
    import onnx

    from dsa_export.errors import DSAUserError
    from dsa_export.trt.profiles import input_profiles

    with pytest.raises(DSAUserError, match="'sequence'"):
        input_profiles(onnx.load(str(exported["native"]), load_external_data=False), ShapeRange({"batch": (1, 1, 2)}))
    with pytest.raises(DSAUserError, match="min <= opt <= max"):
        ShapeRange({"batch": (2, 1, 4)})
    with pytest.raises(DSAUserError, match="min <= opt <= max"):
        ShapeRange({"batch": (-1, 1, 4)})
    assert ShapeRange({"past_sequence": (0, 16, 128)}).dims["past_sequence"] == (0, 16, 128)
    assert ShapeRange({"past_sequence": (0, 0, 0)}).describe() == "past_sequence 0..0"  # a prefill profile's past


def test_rtx_builds_one_profile_per_shape_range_in_order(tmp_path):
    """Real TensorRT-RTX: a prefill (past_sequence fixed at 0) and a decode profile in one engine."""
    from dsa_export.trt.rtx import build_engine
    from tests.trt.fakes import tiny_dsa_model

    model = tiny_dsa_model(tmp_path / "past.onnx", past=True)  # the dsa nodes are inlined: no plugins in RTX
    prefill = ShapeRange({"batch": (1, 1, 2), "sequence": (1, 16, 64), "past_sequence": (0, 0, 0)})
    decode = ShapeRange({"batch": (1, 1, 2), "sequence": (1, 1, 1), "past_sequence": (0, 32, 64)})
    result = build_engine(model, targets=("SM89",), profiles=(prefill, decode))
    assert result.all_profiles == [
        {"x": ([1, 1], [1, 16], [2, 64]), "past": ([1, 0], [1, 0], [2, 0])},
        {"x": ([1, 1], [1, 1], [2, 1]), "past": ([1, 0], [1, 32], [2, 64])},
    ]
    assert result.profiles == result.all_profiles[0] and len(result.engine) > 1000
