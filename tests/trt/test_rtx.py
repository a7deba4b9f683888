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
