"""validate: Polygraphy's Comparator over torch and ONNX Runtime."""

from __future__ import annotations

import json

import pytest

from dsa_export.errors import DSAUserError
from dsa_export.validate import ValidationSettings, validate_onnx


def test_default_model_passes_at_three_lengths(exported):
    report = validate_onnx(exported["plugin"])
    assert report.passed
    assert [e.seq_len for e in report.errors] == [16, 64, 256]
    assert max(e.max_abs for e in report.errors) <= 1e-4
    assert json.loads(report.to_json())["reference"] == "builtin:tiny"


def test_wrong_reference_fails(exported, tmp_path):
    file = tmp_path / "other.py"
    file.write_text(
        "from dsa_export.nn import DSACausalLM, builtin_config, example_inputs\n"
        "def make(batch=2, seq_len=16):\n"
        "    cfg = builtin_config('tiny')\n"
        "    return DSACausalLM(cfg).init_weights(123).eval(), example_inputs(cfg, batch, seq_len)\n"
    )
    report = validate_onnx(exported["native"], ValidationSettings(reference=f"{file}:make", seq_lens=(16,)))
    assert not report.passed
    assert report.errors[0].max_abs > 1e-2


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(DSAUserError, match="does not exist"):
        validate_onnx(tmp_path / "nope.onnx")


def test_builtin_reference_selections_are_recorded_and_judged(exported):
    # The torch reference's dsa.indexer_topk calls are recorded, so a built-in model gets the same
    # per-layer selection verdict as a transformers reference.
    report = validate_onnx(exported["plugin"], ValidationSettings(seq_lens=(64,)))
    assert report.passed
    layers = report.selections[64]
    assert [layer.layer for layer in layers] == [0, 1, 2]
    assert all(layer.unexplained_rows == 0 and layer.rows == 2 * 64 for layer in layers)
    assert report.min_topk_overlap == 1.0
    assert "top-k vs torch" in report.table()


def test_recorded_scores_are_the_op_contract_scores():
    import numpy as np
    import torch

    from dsa_export.ops import dsa_indexer_topk
    from dsa_export.ops.reference import indexer_topk_reference
    from dsa_export.validate.compare import TorchOpSelections

    class Two(torch.nn.Module):
        def forward(self, q, k, w, lengths):
            first = dsa_indexer_topk(q, k, w, lengths, topk=3, scale=0.5)
            return first, dsa_indexer_topk(q * 2, k, w, topk=2, scale=0.5, causal=False)

    g = torch.Generator().manual_seed(0)
    q, k, w = torch.randn(2, 6, 4, 8, generator=g), torch.randn(2, 6, 8, generator=g), torch.randn(2, 6, 4, generator=g)
    lengths = torch.tensor([6, 4], dtype=torch.int32)
    (first, second), captured = TorchOpSelections(Two()).run_with_selections(q, k, w, lengths)
    assert sorted(captured) == [0, 1]
    assert torch.equal(captured[0][0], first) and torch.equal(captured[1][0], second)
    scores = captured[0][1].numpy()
    assert np.isneginf(scores[0, 2, 3:]).all() and np.isneginf(scores[1, 5, 4:]).all()  # causal, lengths
    assert np.isfinite(captured[1][1].numpy()).all()  # not causal, no lengths
    # The selection is the top set of the recorded scores.
    want = indexer_topk_reference(q.numpy(), k.numpy(), w.numpy(), lengths.numpy(), topk=3, scale=0.5)
    for b in range(2):
        for s in range(6):
            keys = want[b, s][want[b, s] >= 0]
            top = np.sort(np.argsort(-scores[b, s], kind="stable")[: keys.size])
            assert list(top) == list(keys)
