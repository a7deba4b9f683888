"""Issue acceptance on the default model: accuracy, ONNX Runtime, TensorRT-RTX, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest


def test_default_model_meets_the_accuracy_bar(default_int8):
    report = default_int8.report
    assert report is not None and report.passed
    # held out: the 4 bundled files after the 16 used for calibration
    assert [label.rsplit("/", 1)[-1] for label in report.eval_inputs] == [f"sample_{i:03d}.npz" for i in range(16, 20)]
    (logits,) = report.outputs
    assert logits.output == "logits" and logits.cosine >= 0.99
    assert [k.node for k in report.topk] == ["node_indexer_topk", "node_indexer_topk_1", "node_indexer_topk_2"]
    assert all(k.overlap >= 0.95 and k.rows > 0 for k in report.topk)
    # quantization did change something: a report that cannot fail would show exactly 1.0
    assert logits.cosine < 1.0 and min(k.overlap for k in report.topk) < 1.0


def test_report_json_and_table(saved_int8, default_int8):
    data = json.loads(saved_int8["report"].read_text())
    assert data["passed"] is True and data["precision"] == "int8"
    assert data["thresholds"] == {"cosine": 0.99, "sqnr_db": 15.0, "topk_overlap": 0.95, "router_agreement": 0.85}
    assert data["router"] == []  # the default model has no MoE layers
    assert data["outputs"][0]["cosine"] == pytest.approx(default_int8.report.outputs[0].cosine)
    table = default_int8.report.table()
    assert "top-k overlap" in table and table.splitlines()[-1].startswith("PASSED")


def test_qdq_model_runs_in_onnxruntime(saved_int8, exported):
    from dsa_export.runtime.onnxrt import session

    rng = np.random.default_rng(7)
    feed = {"input_ids": rng.integers(0, 256, size=(3, 80), dtype=np.int64)}
    quantized = session(saved_int8["model"]).run(["logits"], feed)[0]
    reference = session(exported["plugin"]).run(["logits"], feed)[0]
    assert quantized.shape == reference.shape == (3, 80, 256)
    cos = float(np.dot(quantized.ravel(), reference.ravel()) / np.linalg.norm(quantized) / np.linalg.norm(reference))
    assert 0.99 <= cos < 1.0


def test_same_data_gives_identical_outputs_twice(exported, tmp_path):
    from dsa_export.quantize import QuantizeSettings, quantize, save
    from dsa_export.runtime.onnxrt import session

    settings = QuantizeSettings(data="builtin", samples=6, report=False)
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"run{i}.onnx")
        save(quantize(exported["plugin"], settings), paths[-1], cache=tmp_path / f"run{i}.cache")
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert (tmp_path / "run0.cache").read_bytes() == (tmp_path / "run1.cache").read_bytes()
    feed = {"input_ids": np.arange(2 * 70, dtype=np.int64).reshape(2, 70) % 256}
    a, b = (session(p).run(["logits"], feed)[0] for p in paths)
    assert np.array_equal(a, b)


@pytest.mark.slow
def test_tensorrt_rtx_parses_and_builds_the_qdq_model(saved_int8):
    pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT-RTX is not installed (pip install dsa-export[rtx])")
    from dsa_export.trt.profiles import ShapeRange
    from dsa_export.trt.rtx import build_engine, parse_onnx, rtx

    trt = rtx()
    parsed = parse_onnx(saved_int8["model"])
    kinds = [parsed.network.get_layer(i).type for i in range(parsed.network.num_layers)]
    assert kinds.count(trt.LayerType.QUANTIZE) >= 20 and kinds.count(trt.LayerType.DEQUANTIZE) >= 40
    result = build_engine(saved_int8["model"], ShapeRange({"batch": (1, 2, 4), "sequence": (1, 64, 512)}))
    assert len(result.engine) > 100_000
