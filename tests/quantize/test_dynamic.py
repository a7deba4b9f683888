"""Dynamic FP8 activations (one scale per token and block of channels at run time) and FP8
weights in square blocks: the ONNX form, its numbers in ONNX Runtime, and calibrate's use of it."""

from __future__ import annotations

import collections
import json

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.quantize import dynamic
from dsa_export.quantize.fp8 import FP8
from dsa_export.quantize.qdq import _hadamard, weight_blocks


def _qdq_model(shape: list[int], block: int, dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    rank = len(shape)
    nodes, inits = dynamic.dynamic_qdq_nodes("x", rank, shape[-1], block, dtype)
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", dtype, [None] * (rank - 1) + [shape[-1]])],
        [helper.make_tensor_value_info("x_dequantized", dtype, [None] * rank),
         helper.make_tensor_value_info("x_block_scale", TensorProto.FLOAT, [None] * rank)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    dynamic.add_functions(model, 21, block)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize(("shape", "block"), [([5, 256], 128), ([2, 3, 384], 128), ([2, 3, 4, 64], 32)])
def test_function_bodies_equal_the_numpy_reference_bit_for_bit(shape, block):
    rng = np.random.default_rng(0)
    # Channel magnitudes over four decades, an all-zero block and a huge outlier in one block.
    x = (rng.standard_normal(shape) * np.geomspace(1e-2, 1e2, shape[-1])).astype(np.float32)
    x[..., 0, :block] = 0
    x.reshape(-1)[7] = 3e4
    session = ort.InferenceSession(_qdq_model(shape, block).SerializeToString(), providers=["CPUExecutionProvider"])
    y, scale = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, dynamic.reference(x, block))
    assert scale.shape == (*shape[:-1], shape[-1] // block)
    blocks = np.abs(x).reshape(*shape[:-1], -1, block).max(-1)
    np.testing.assert_allclose(scale, np.maximum(blocks, np.finfo(np.float32).tiny) / 448, rtol=1e-7)
    # Each block's error is bounded by e4m3's relative step (2^-4 around its largest value).
    err = np.abs(y - x).reshape(*shape[:-1], -1, block).max(-1)
    assert np.all(err <= blocks * 2.0 ** -4 + 1e-30)
    assert not np.array_equal(y, x)


def test_fp16_activations_keep_their_type():
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float16)
    session = ort.InferenceSession(_qdq_model([3, 256], 128, TensorProto.FLOAT16).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    y, _ = session.run(None, {"x": x})
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, dynamic.reference(x.astype(np.float32), 128).astype(np.float16))


def test_block_is_the_largest_power_of_two_dividing_the_channels():
    assert dynamic.block_for(7168) == 128 and dynamic.block_for(64) == 64 and dynamic.block_for(96) == 32
    assert dynamic.block_for(24) is None  # below TensorRT's smallest block of 16


@pytest.mark.parametrize("out_axis", [0, 1])
def test_block_weights_give_a_dequantized_fp8_checkpoint_its_bytes_back(out_axis):
    """A weight that was FP8 in 128x128 blocks with power-of-two scales (DeepSeek's ue8m0), once
    dequantized, requantizes to the same codes and scales, for [N, K] (Gemm transB) and [K, N]
    (MatMul) layouts; the blocked DequantizeLinear gives the dequantized weight back in ONNX Runtime."""
    import torch

    from dsa_export.hf.synthetic_plan import dequantize_fp8, quantize_fp8

    n, k, b = 256, 384, 128
    original = torch.randn(n, k, generator=torch.Generator().manual_seed(2)) * torch.logspace(-3, 0, k)
    fp8, scale_inv = quantize_fp8(original, block=b, ue8m0=True)  # as the checkpoint maker writes them
    codes = fp8.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    dequantized = dequantize_fp8(fp8, scale_inv, block=b).numpy()
    weight = dequantized if out_axis == 0 else dequantized.T
    quantized, per_row, axis = weight_blocks(weight, out_axis, b, FP8, pow2=True)
    canonical = quantized if out_axis == 0 else quantized.T
    # Zero weight error, and the same bytes in every block whose largest code is above 224 (a block
    # whose largest code rounded to exactly 224 = 448/2 gets half the scale and doubled codes:
    # the same values in other bytes).
    np.testing.assert_array_equal(canonical.astype(np.float32) * np.repeat(per_row if out_axis == 0 else per_row.T,
                                                                           b, axis=1), dequantized)
    top = np.abs(codes.astype(np.float32)).reshape(n // b, b, k // b, b).max(axis=(1, 3))
    same = np.repeat(np.repeat(top > 224, b, 0), b, 1)
    assert same.mean() > 0.5
    np.testing.assert_array_equal(canonical.view(np.uint8)[same], codes.view(np.uint8)[same])
    assert axis == 1 - out_axis
    node = helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=axis, block_size=b)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(quantized, "q"), numpy_helper.from_array(per_row, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    w = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]
    np.testing.assert_array_equal(w, weight)


def test_hadamard_is_orthogonal():
    h = _hadamard(128)
    np.testing.assert_allclose(h @ h.T, np.eye(128), atol=1e-6)


@pytest.fixture(scope="module")
def dynamic_fp8(exported):
    from dsa_export.quantize import QuantizeSettings, quantize

    return quantize(exported["plugin"], QuantizeSettings(data="builtin", precision="fp8", fp8_activations="dynamic",
                                                         fp8_weights="block"))


def test_calibrate_writes_dynamic_activations_and_block_weights(dynamic_fp8, exported):
    from dsa_export.trt.tensorrt import is_calibrated

    model = dynamic_fp8.model
    ops = collections.Counter((n.domain, n.op_type) for n in model.graph.node)
    targets = dynamic_fp8.placement.targets
    activations = {t.activation for t in targets}
    assert ops[("trt", "TRT_DynamicQuantize")] == ops[("trt", "TRT_BlockDequantize")] == len(activations) > 0
    assert ops[("", "QuantizeLinear")] == 0 and is_calibrated(model)
    assert dynamic_fp8.activation_scales == {}  # nothing calibrated for them
    weights = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.name.endswith("_DequantizeLinear")]
    assert weights and all(helper.get_attribute_value(a) > 1 for n in weights for a in n.attribute
                           if a.name == "block_size")
    meta = json.loads({p.key: p.value for p in model.metadata_props}["dsa_export.quantization"])
    assert meta["fp8_activations"] == "dynamic" and meta["fp8_weights"] == "block" and meta["method"] == "dynamic"
    assert meta["activation_block"] == 32  # the largest power of two dividing every quantized width of the default model
    # Every reader of a quantized activation now reads it through the dynamic pair.
    readers = {n.input[0] for n in model.graph.node if n.op_type == "MatMul" and n.name in {t.node for t in targets}}
    assert all(r.endswith("_dequantized") for r in readers)
    report = dynamic_fp8.report
    assert report.passed and 0.99 <= report.outputs[0].cosine < 1.0


def test_dynamic_scales_follow_each_tokens_outliers():
    """Per-token scales follow one token's outlier channels; one calibrated per-tensor scale cannot.
    A MatMul whose input has a few huge channels in rare tokens (the pattern of trained LLMs):
    a percentile calibration (the recipes' method) clips them, so those tokens' outputs are
    wrong; dynamic FP8 scales each token by its own range."""
    from dsa_export.quantize.qdq import DynamicForm, insert_qdq, plan

    rng = np.random.default_rng(3)
    w = rng.standard_normal((256, 64)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["t", 64])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    x = rng.standard_normal((512, 256)).astype(np.float32)
    loud = [100, 300]
    x[np.ix_(loud, [0, 1])] = 300.0  # 4 of 131072 values: above the 99.99th percentile
    placement = plan(model)
    static = insert_qdq(model, placement, {"x": FP8.scale(np.percentile(np.abs(x), 99.99))[()]}, FP8)
    dyn = insert_qdq(model, placement, {}, FP8, dynamic=DynamicForm(weight_block_size=None))
    reference = (x @ w)[loud]

    def sqnr(m):
        y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        return 10 * np.log10((reference ** 2).sum() / ((reference - y[loud]) ** 2).sum())

    assert sqnr(dyn) > 25 and sqnr(static) < 10, (sqnr(dyn), sqnr(static))


def test_dynamic_indexer_with_hadamard_rotation(exported):
    from dsa_export.quantize import QuantizeSettings, quantize

    result = quantize(exported["plugin"], QuantizeSettings(
        data="builtin", precision="fp8", fp8_activations="dynamic", fp8_weights="block", quantize_indexer=True,
        indexer_hadamard=True))
    model = result.model
    rotations = [n for n in model.graph.node if n.name.endswith("_Hadamard")]
    assert len(rotations) == 2 * len(result.placement.indexers)
    for ix in result.placement.indexers:
        node = next(n for n in model.graph.node if n.name == ix.node)
        assert node.input[0] == f"{ix.q}_rotated_dequantized" and node.input[1] == f"{ix.k}_rotated_dequantized"
    assert all(0.5 < t.overlap for t in result.report.topk)


def test_refusals(exported):
    from dsa_export.quantize import QuantizeSettings, quantize

    with pytest.raises(DSAUsageError, match="apply to FP8"):
        quantize(exported["plugin"], QuantizeSettings(data="builtin", precision="int8", fp8_activations="dynamic"))
    with pytest.raises(DSAUserError, match="come with dynamic activations"):
        quantize(exported["plugin"], QuantizeSettings(data="builtin", precision="fp8", fp8_activations="static",
                                                      fp8_weights="block"))
    with pytest.raises(DSAUserError, match="Hadamard rotation applies"):
        quantize(exported["plugin"], QuantizeSettings(data="builtin", precision="fp8", fp8_activations="dynamic",
                                                      indexer_hadamard=True, quantize_indexer=False))


@pytest.mark.slow
def test_tensorrt_rtx_parses_and_builds_the_dynamic_file(dynamic_fp8, tmp_path):
    pytest.importorskip("tensorrt_rtx")
    from dsa_export.quantize import save
    from dsa_export.trt.rtx import build_engine

    path = tmp_path / "dyn.onnx"
    save(dynamic_fp8, path)
    result = build_engine(path)
    assert result.engine and result.layers > 0


@pytest.mark.parametrize("shape", [[4, 256], [2, 3, 128]])
def test_float_codes_form_computes_the_same_numbers(shape):
    """TensorRT-RTX gets the functions with the e4m3 values held in float32; in ONNX Runtime they
    give the FP8 bodies' results bit for bit (values across every binade, subnormals, ties)."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-30, 20, shape))).astype(np.float32)
    x.reshape(-1)[:3] = [0.0, -0.0, 1e-40]
    model = _qdq_model(shape, 128)
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
           for m in (model, dynamic.float_codes(model))]
    np.testing.assert_array_equal(run[0][0], run[1][0])
    np.testing.assert_array_equal(run[0][1], run[1][1])
