"""The memory estimate of the block-sparse op's ONNX body (runtime.memory.dsa_node_bytes)."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from dsa_export.ops.block_onnx import CHUNK_ELEMENTS
from dsa_export.ops.contract import BLOCK_SPARSE_ATTENTION, PLUGIN_ATTRIBUTES
from dsa_export.runtime.memory import dsa_node_bytes, estimate

F32 = 4


def _block_bytes(b, s, t, h, hkv, dk, dv, bs, kb):
    shapes = [(b, s, h, dk), (b, t, hkv, dk), (b, t, hkv, dv), (b, h, -(-s // bs), kb)]
    return dsa_node_bytes("DSABlockSparseAttention", {"block_size": bs}, shapes)


def test_block_sparse_estimate_follows_the_bodys_tensors():
    # S = T = 8192, 16 heads on one kv head, blocks of 64, 13 per list (measured by ONNX Runtime with its arena
    # off: 160 MiB; at 4096 with 8 per list 87-96 MiB against 92, at 16384 304 MiB against 296).
    b, s, h, d, bs, kb = 1, 8192, 16, 64, 64, 13
    n_qb = s // bs
    per_block = b * h * kb * (bs * (d + d + 4 * bs) + kb)
    rows = max(1, min(n_qb, CHUNK_ELEMENTS // per_block))
    want = (2 * b * s * h * d * F32 + 2 * b * 1 * (n_qb + 1) * bs * 2 * d * F32 + rows * per_block * F32
            + 2 * b * s * h * d * F32)
    got = _block_bytes(b, s, s, h, 1, d, d, bs, kb)
    assert got == want and 150 * 2**20 < got < 160 * 2**20


def test_block_sparse_estimate_grows_with_the_selection_not_with_s_times_t():
    small, long = _block_bytes(1, 4096, 4096, 16, 1, 64, 64, 64, 8), _block_bytes(1, 32768, 32768, 16, 1, 64, 64, 64, 8)
    assert 5 < long / small < 8  # 8x the tokens: at most 8x the bytes (one chunk stays), a [B,H,S,T] tensor 64x
    assert long < 16 * 32768 * 32768 * F32 / 50
    wider = _block_bytes(1, 4096, 4096, 16, 1, 64, 64, 64, 32)
    assert wider > small  # more blocks per list: a larger chunk
    assert dsa_node_bytes("DSABlockSparseAttention", {"block_size": 64}, [None, None, None, None]) == 0


def test_estimate_names_the_block_sparse_node_of_a_graph():
    node = helper.make_node(BLOCK_SPARSE_ATTENTION.name, ["q", "k", "v", "block_index"], ["out"], domain="dsa",
                            name="attn", block_size=64, scale=0.125, causal=1, **PLUGIN_ATTRIBUTES)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["B", "S", 16, 64]),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, ["B", "S", 1, 64]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, ["B", "S", 1, 64]),
         helper.make_tensor_value_info("block_index", TensorProto.INT32, ["B", 16, "N", 13])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", "S", 16, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dsa", 1)])
    need = estimate(model, {"B": 1, "S": 8192, "N": 128})
    assert need.worst_node == "DSABlockSparseAttention 'attn'"
    assert need.activations == _block_bytes(1, 8192, 8192, 16, 1, 64, 64, 64, 13)


def _peak_probe(path: str, batch: int, seq: int) -> dict:
    """One prefill call of a decode graph in a fresh process: the estimate and the measured peak
    growth of the resident set during the call (/proc high-water mark)."""
    import json
    import subprocess
    import sys

    script = f"""
import json, numpy as np, onnx
from dsa_export.bench.memory import measure_peak_rss
from dsa_export.runtime import load
from dsa_export.runtime.memory import GraphMemory
sess = load({path!r}, "onnxruntime")
b, s = {batch}, {seq}
feeds = {{"input_ids": np.random.default_rng(0).integers(2, 100, (b, s)), "attention_mask": np.ones((b, s), np.int64)}}
for spec in sess.inputs:
    if spec.name.startswith("past_"):
        feeds[spec.name] = np.zeros((b, 0, spec.shape[2]), np.float32)
sess.run({{k: (v[:, :8] if k in ("input_ids", "attention_mask") else v) for k, v in feeds.items()}})  # warm-up
graph = GraphMemory.of(onnx.load({path!r}, load_external_data=False))
need = graph.estimate(graph.sizes({{k: v.shape for k, v in feeds.items()}}))
_, peak = measure_peak_rss(lambda: sess.run(feeds))
print(json.dumps({{"estimate": need.total - need.weights, "measured": peak}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_estimate_matches_the_measured_peak_of_a_decode_graph(tmp_path):
    """The estimate (dsa node + inputs/outputs + the largest intermediates, weights excluded: they
    are resident before the call) is held against ONNX Runtime's measured peak at three sizes of a
    model with DeepSeek-V3.2's cache width (576), so `run` and `generate` refuse only what cannot
    fit and never accept what clearly cannot."""
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    from dsa_export.bench.memory import peak_rss_supported
    from tests.hf.conftest import make_checkpoint

    if not peak_rss_supported():
        pytest.skip("the peak resident set cannot be reset and read here")
    checkpoint = make_checkpoint(tmp_path, "deepseek_v32", layers=2, index_topk=64, num_attention_heads=8,
                                 num_key_value_heads=8, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=64,
                                 index_head_dim=128, hidden_size=128, vocab_size=256)
    from dsa_export.cli.main import main

    onnx_path = tmp_path / "decode.onnx"
    with pytest.raises(SystemExit) as done:
        main(["export", str(checkpoint), "--graph", "decode", "--dtype", "fp32", "-o", str(onnx_path)])
    assert done.value.code in (0, None)
    ratios = []
    for batch, seq in ((1, 1024), (2, 2048), (2, 4096)):
        probe = _peak_probe(str(onnx_path), batch, seq)
        assert probe["measured"] > 20 * 2**20, probe  # large enough to read above the allocator's noise
        ratios.append(probe["estimate"] / probe["measured"])
    assert all(0.6 <= r <= 1.8 for r in ratios), ratios


def test_a_session_estimates_each_set_of_sizes_once_and_never_remembers_a_refusal(tmp_path, monkeypatch):
    """Decode steps repeat their sizes (a paged graph's change once a page): the estimate runs for
    the first call of each set of sizes; a call refused runs it again."""
    import onnx

    from dsa_export.errors import DSAUserError
    from dsa_export.runtime.memory import GraphMemory
    from dsa_export.runtime.onnxrt import OnnxFileSession

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S"])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    session = OnnxFileSession.open(path)
    calls = []
    real = GraphMemory.estimate
    monkeypatch.setattr(GraphMemory, "estimate", lambda self, sizes: calls.append(dict(sizes)) or real(self, sizes))
    for shape in [(2, 3), (2, 3), (2, 4), (2, 3), (2, 4)]:
        session.check_memory({"x": shape})
    assert calls == [{"B": 2, "S": 3}, {"B": 2, "S": 4}]
    monkeypatch.setattr("dsa_export.runtime.memory.available_memory", lambda: (1 << 10, "the test"))
    for _ in range(2):
        with pytest.raises(DSAUserError, match="B=2, S=10000"):
            session.check_memory({"x": (2, 10000)})
    assert len(calls) == 4
    session.check_memory({"x": (2, 3)})  # found to fit before: not estimated again
    assert len(calls) == 4
