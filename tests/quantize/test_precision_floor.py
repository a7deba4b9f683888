"""tools/precision_floor.py (the bf16-against-float32 floor of docs/quantize.md) on a tiny
checkpoint: it runs transformers twice, the second run really in bfloat16, and reports the
pipeline report's measures."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "precision_floor.py"


def _tool():
    spec = importlib.util.spec_from_file_location("precision_floor", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("precision_floor", module)
    spec.loader.exec_module(module)
    return module


def test_the_floor_compares_a_bf16_run_with_the_float32_run(checkpoints, tmp_path, capsys):
    ckpt = checkpoints["deepseek_v32"]
    config = json.loads((ckpt / "config.json").read_text())
    out = tmp_path / "floor.json"
    length = config["index_topk"] + 24  # some rows choose among more keys than the top-k
    assert _tool().main([str(ckpt), "--prompts", "2", "--length", str(length), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["index_topk"] == config["index_topk"] and result["length"] == length
    # bf16 moves the logits (an accidental float32 second run would give exactly 1) but not far.
    assert 0.9 < result["logits_cosine"] < 1.0 and 0 < result["greedy_agreement"] <= 1
    layers = result["topk_overlap"]
    assert sorted(map(int, layers)) == list(range(config["num_hidden_layers"]))
    for row in layers.values():
        assert row["rows"] == 2 * length and row["rows_choosing"] == 2 * 24
        assert 0 < row["worst_row"] <= row["overlap"] <= 1 and row["worst_row_choosing"] <= row["overlap_rows_choosing"]
    assert "bf16 against float32" in capsys.readouterr().out
