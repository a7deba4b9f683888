"""Calibrating Hugging Face DSA exports (tiny random DeepSeek-V3.2): recipe, placement, report.

Runs where the Hugging Face export (``dsa_export.hf``) and transformers are installed.
"""

from __future__ import annotations

import numpy as np
import pytest

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
    assert "excluded by pattern 'logits'" in reasons
    report = result.report
    assert len(report.eval_inputs) == 4 and len(report.topk) == 3
    assert report.outputs[0].cosine >= 0.99
    assert all(k.overlap >= 0.9 for k in report.topk)
