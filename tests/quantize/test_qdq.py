"""Q/DQ placement: MatMul/Gemm inputs only; dsa nodes, softmax, norms, head weights untouched."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dsa_export.quantize.qdq import plan

HIGH_PRECISION_OPS = {"Softmax", "LayerNormalization", "DSAIndexerTopK", "DSASparseAttention", "ReduceMean", "Sigmoid"}


def _consumers(model):
    out = {}
    for node in model.graph.node:
        for value in node.input:
            out.setdefault(value, []).append(node)
    return out


def test_qdq_sits_only_on_matmul_inputs(default_int8):
    model = default_int8.model
    consumers = _consumers(model)
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    q = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert len(q) == len(default_int8.placement.activations) > 0
    assert len(dq) == len(q) + len({t.weight for t in default_int8.placement.targets})
    for node in dq:
        users = consumers[node.output[0]]
        assert users and all(u.op_type in ("MatMul", "Gemm") for u in users), node.name
    for node in q:  # a quantized tensor feeds its DequantizeLinear only
        assert [u.op_type for u in consumers[node.output[0]]] == ["DequantizeLinear"]
    for node in model.graph.node:
        if node.op_type in HIGH_PRECISION_OPS:
            assert not any(v.endswith("_dequantized") for v in node.input), node.name
    # the dsa nodes are still custom nodes with their function bodies
    assert sum(n.domain == "dsa" for n in model.graph.node) == 7
    assert {f.name for f in model.functions} == {"DSAIndexerTopK", "DSASparseAttention"}


def test_weights_per_channel_activations_per_tensor_symmetric(default_int8):
    model = default_int8.model
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        values, scale, zero = (inits.get(v) for v in node.input)
        assert not zero.any()
        if values is not None:  # weight: int8 initializer, one scale per output column
            axis = next(a.i for a in node.attribute if a.name == "axis")
            assert axis == 1 and values.dtype == np.int8 and scale.shape == (values.shape[1],)
            assert np.abs(values).max(axis=0).max() == 127 and values.min() >= -127
        else:  # activation: the output of its QuantizeLinear, one scale
            assert node.input[0].endswith("_quantized") and scale.shape == () and scale > 0


def test_indexer_head_weight_path_stays_high_precision(default_int8):
    model = default_int8.model
    producer = {o: n for n in model.graph.node for o in n.output}
    indexers = [n for n in model.graph.node if n.op_type == "DSAIndexerTopK"]
    assert len(indexers) == 3
    for node in indexers:
        upstream = producer[node.input[2]]
        while upstream.op_type != "MatMul":
            upstream = producer[upstream.input[0]]
        assert not any(v.endswith("_dequantized") for v in upstream.input), upstream.name
        assert "head-weight" in default_int8.placement.skipped[upstream.name]


def test_indexer_scales_are_recorded_as_metadata(default_int8):
    meta = {p.key: p.value for p in default_int8.model.metadata_props}
    table = json.loads(meta["dsa_export.indexer_scales"])
    assert set(table) == {"node_indexer_topk", "node_indexer_topk_1", "node_indexer_topk_2"}
    for entry in table.values():
        for role in ("q", "k"):
            a = entry[role]["amax"]
            assert a > 0
            assert entry[role]["int8_scale"] == pytest.approx(a / 127, rel=1e-6)
            assert entry[role]["fp8_e4m3_scale"] == pytest.approx(a / 448, rel=1e-6)
            pow2 = entry[role]["fp8_e4m3_scale_pow2"]
            assert pow2 >= a / 448 > pow2 / 2
    quant = json.loads(meta["dsa_export.quantization"])
    assert quant["precision"] == "int8" and quant["method"] == "percentile" and quant["calibration_samples"] == 16


def test_exclude_patterns_and_indexer_option(exported):
    from dsa_export.quantize import QuantizeSettings, quantize

    result = quantize(exported["plugin"], QuantizeSettings(
        data="builtin", method="minmax", samples=4, exclude=("logits",), quantize_indexer=True, report=False))
    lm_head = next(n for n in result.model.graph.node if "logits" in n.output)
    assert not any(v.endswith("_dequantized") for v in lm_head.input)
    assert result.placement.skipped[lm_head.name] == "excluded by pattern 'logits'"
    for node in result.model.graph.node:
        if node.op_type == "DSAIndexerTopK":
            assert node.input[0].endswith("_dequantized") and node.input[1].endswith("_dequantized")
            assert not node.input[2].endswith("_dequantized")  # head weights stay fp32


def _router_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])
    w_router = numpy_helper.from_array(np.ones((8, 4), np.float32), "w_router")
    w_up = numpy_helper.from_array(np.ones((8, 8), np.float32), "w_up")
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    nodes = [
        helper.make_node("MatMul", ["x", "w_router"], ["logits"], name="router"),
        helper.make_node("Sigmoid", ["logits"], ["probs"], name="sig"),
        helper.make_node("TopK", ["probs", "k"], ["vals", "idx"], name="topk"),
        helper.make_node("MatMul", ["x", "w_up"], ["up"], name="up"),
    ]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("vals", "up")]
    graph = helper.make_graph(nodes, "g", [x], outs, [w_router, w_up, k])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_moe_router_feeding_topk_is_left_alone():
    placement = plan(_router_model())
    assert [t.node for t in placement.targets] == ["up"]
    assert "router" in placement.skipped["router"].lower()


def test_fp8_model_runs_and_uses_e4m3(exported, tmp_path):
    from dsa_export.quantize import QuantizeSettings, quantize, save
    from dsa_export.runtime.onnxrt import session

    result = quantize(exported["plugin"], QuantizeSettings(data="builtin", precision="fp8", samples=4, report=False))
    model = result.model
    assert next(o.version for o in model.opset_import if o.domain == "") >= 19
    q_types = {i.data_type for i in model.graph.initializer if i.name.endswith("_zero_point")}
    assert q_types == {TensorProto.FLOAT8E4M3FN}
    path = tmp_path / "fp8.onnx"
    save(result, path)
    logits = session(path).run(["logits"], {"input_ids": np.arange(64, dtype=np.int64).reshape(1, 64) % 256})[0]
    assert logits.shape == (1, 64, 256) and np.isfinite(logits).all()
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def test_indexer_projections_can_stay_high_precision(exported):
    import onnx

    model = onnx.load(str(exported["plugin"]))
    default = plan(model)
    kept = plan(model, keep_indexer_projections=True)
    reasons = [r for r in kept.skipped.values() if r.startswith("indexer q/k projection")]
    assert len(reasons) == 6  # wq_b and wk of each of the 3 DSA layers
    assert len(kept.targets) == len(default.targets) - 6
