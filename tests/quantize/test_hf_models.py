"""Calibrating Hugging Face DSA exports (tiny random DeepSeek-V3.2): recipe, placement, report.

The checkpoint has two MoE layers (4 routed experts of 32, top-2, one group, one shared expert),
exported with the routed experts as ``dsa`` nodes. Runs where the Hugging Face export
(``dsa_export.hf``) and transformers are installed.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from tests.quantize.conftest import shared_expert_matmuls

pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("dsa_export.hf.source", reason="this dsa-export has no Hugging Face export")
pytest.importorskip("tests.hf.conftest", reason="the Hugging Face test checkpoints are not in this tree")


@pytest.fixture(scope="module")
def deepseek_export(tmp_path_factory):
    from dsa_export.export import ExportSettings, export_model, save_model
    from dsa_export.sources import resolve
    from tests.hf.conftest import make_checkpoint  # the tiny checkpoints the HF export tests use

    root = tmp_path_factory.mktemp("hf-quantize")
    checkpoint = make_checkpoint(root, "deepseek_v32", layers=3, index_topk=8)
    path = save_model(export_model(resolve(str(checkpoint)), ExportSettings()), root / "deepseek.onnx")
    data = root / "data"
    data.mkdir()
    rng = np.random.default_rng(5)
    for i in range(12):
        seq = (32, 48, 64)[i % 3]
        np.savez(data / f"s{i:02d}.npz", input_ids=rng.integers(0, 128, (2, seq), dtype=np.int64),
                 attention_mask=np.ones((2, seq), np.int64))
    return path, data


def test_deepseek_recipe_placement_and_report(deepseek_export):
    from dsa_export.quantize import QuantizeSettings, quantize

    path, data = deepseek_export
    result = quantize(path, QuantizeSettings(data=str(data), samples=8))
    assert result.recipe.name == "deepseek-v3.2" and result.recipe.precision == "int8"
    reasons = list(result.placement.skipped.values())
    assert reasons.count("indexer head-weight path (kept in high precision)") == 3
    assert reasons.count("indexer q/k projection (kept in high precision by the recipe)") == 6
    assert any(r.startswith("MoE router") for r in reasons)
    # The LM head (a Gemm on the stored [vocab, hidden] weight in streamed exports) is excluded.
    assert {"excluded by pattern 'logits'", "excluded by pattern '*lm_head*'"} & set(reasons)
    report = result.report
    assert len(report.eval_inputs) == 4 and len(report.topk) == 3
    assert report.outputs[0].cosine >= 0.99
    assert all(k.overlap >= 0.9 for k in report.topk)
    # MoE: the recipe keeps DeepSeek's expert format (FP8, 128 blocks -> 32 here, power-of-two
    # scales) under INT8 elsewhere; one-group routers (sigmoid, bias, TopK) stay in high precision.
    experts = [n for n in result.model.graph.node if n.domain == "dsa" and n.op_type.startswith("DSAMoE")]
    assert [n.op_type for n in experts] == ["DSAMoEExpertsFP8"] * 2
    inits = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    for node in experts:
        assert next(a.i for a in node.attribute if a.name == "block_size") == 32
        for scale in (inits[node.input[5]], inits[node.input[6]]):
            assert np.array_equal(scale, np.exp2(np.round(np.log2(scale))))
        (router_name,) = next(t.routers for t in result.placement.experts if t.node == node.name)
        router = next(n for n in result.model.graph.node if n.name == router_name)
        assert router.input[1].endswith("mlp.gate.weight") and not router.input[0].endswith("_dequantized")
    assert reasons.count("MoE router of node_moe_experts (picks the experts; kept in high precision)") == 1
    quantized = {t.node for t in result.placement.targets}
    for node in experts:  # the shared expert's three MatMuls are quantized per channel
        assert {m.name for m in shared_expert_matmuls(result.model, node)} <= quantized
    assert [r.node for r in report.router] == ["node_moe_experts", "node_moe_experts_1"]
    assert all(0.8 < r.agreement <= 1.0 for r in report.router)


@pytest.mark.parametrize(("precision", "experts", "op_type"), [("int8", "int8", "DSAMoEExperts"),
                                                               ("fp8", None, "DSAMoEExpertsFP8")])
def test_deepseek_experts_in_int8_and_fp8(deepseek_export, precision, experts, op_type, tmp_path):
    from dsa_export.quantize import QuantizeSettings, quantize, save
    from dsa_export.runtime.onnxrt import session

    path, data = deepseek_export
    result = quantize(path, QuantizeSettings(data=str(data), samples=8, precision=precision, experts=experts))
    model = result.model
    nodes = [n for n in model.graph.node if n.domain == "dsa" and n.op_type.startswith("DSAMoE")]
    assert [n.op_type for n in nodes] == [op_type] * 2
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in nodes:
        if op_type == "DSAMoEExperts":  # int8 rows of [E*2I, H], one scale per expert and row
            dq = producers[producers[node.input[3]].input[0]]
            assert inits[dq.input[0]].dtype == np.int8 and inits[dq.input[1]].shape == (4 * 2 * 32,)
        else:
            assert inits[node.input[3]].shape == (4, 64, 64) and inits[node.input[5]].shape == (4, 2, 2)
    assert result.report is not None and len(result.report.router) == 2
    out = tmp_path / "q.onnx"
    save(result, out)
    feed = {"input_ids": np.arange(80, dtype=np.int64).reshape(2, 40) % 128,
            "attention_mask": np.ones((2, 40), np.int64)}
    logits = session(out).run(["logits"], feed)[0]
    assert logits.shape == (2, 40, 128) and np.isfinite(logits).all()
