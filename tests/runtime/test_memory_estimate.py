"""The memory estimate of the block-sparse op's ONNX body (runtime.memory.dsa_node_bytes)."""

from __future__ import annotations

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
