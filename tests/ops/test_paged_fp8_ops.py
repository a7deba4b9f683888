"""DSAIndexerTopKPagedFP8 and DSASparseAttentionPagedFP8: torch op, NumPy reference and ONNX function
body against each other, against the float paged ops fed the decoded pools, in bounded memory, and
built by TensorRT-RTX."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from dsa_export.ops import (
    dsa_indexer_topk_paged,
    dsa_indexer_topk_paged_fp8,
    dsa_sparse_attention_paged,
    dsa_sparse_attention_paged_fp8,
)
from dsa_export.ops.contract import (
    INDEXER_TOPK_PAGED_FP8,
    OPS,
    PLUGIN_ATTRIBUTES,
    PLUGIN_OPS,
    SELECTING_OPS,
    SELECTION_CONSUMERS,
    SPARSE_ATTENTION_PAGED_FP8,
)
from dsa_export.ops.onnx_ops import (
    function_protos,
    register_schemas,
    translation_table,
    use_tensorrt_bodies,
)
from dsa_export.ops.paged_onnx import FP8_CACHE_BODIES, fp8_e4m3fn_table, use_fp8_cache_bodies
from dsa_export.ops.reference import (
    REFERENCE_OPS,
    decode_fp8_reference,
    fp8_latent_pool_reference,
    indexer_topk_paged_fp8_reference,
    sparse_attention_paged_fp8_reference,
)
from dsa_export.ops.torch_ops import decode_fp8
from tests.build_fixtures import rtx_build
from tests.ops.test_paged_ops import (
    _indices,
    _ort,
    _ranges,
    _sets,
    _table,
    _torch,
    _used,
    _walk,
    attention_model,
    indexer_model,
)

FLOAT, INT32, UINT8 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.UINT8
FP8_OPS = (INDEXER_TOPK_PAGED_FP8.name, SPARSE_ATTENTION_PAGED_FP8.name)
NAN_CODES = (0x7F, 0xFF)


# ---------------------------------------------------------------------------------------------
# Cases: random codes (never the NaN patterns where a sequence lives), pages no table entry names
# full of NaN codes and NaN/inf scales, the tail past each row's length NaN codes.

def _codes(rng, shape):
    codes = rng.integers(0, 256, size=shape).astype(np.uint8)
    return np.where((codes & 0x7F) == 0x7F, codes ^ 0x01, codes).astype(np.uint8)


def _spoil_unused(table, n_pages, *pools):
    for p in sorted(set(range(n_pages)) - _used(table, n_pages)):
        for pool in pools:
            if pool.dtype == np.uint8:
                pool[p] = NAN_CODES[p % 2]
            else:
                pool[p] = np.nan if p % 2 else np.inf


def _indexer_case(rng, b, s, h, d, page, m, extra, invalid):
    table, n_pages = _table(rng, b, m, extra, invalid)
    codes = _codes(rng, (n_pages, page, d))
    scales = rng.uniform(0.002, 0.05, size=(n_pages, page, 1)).astype(np.float32)
    _spoil_unused(table, n_pages, codes, scales)
    capacity = m * page
    lengths = rng.integers(0, capacity + 3, size=b).astype(np.int32)
    for bi in range(b):  # the tail of each row past its length: a page being filled
        for t in range(max(0, int(lengths[bi])), capacity):
            p = table[bi, t // page]
            if 0 <= p < n_pages:
                codes[p, t % page] = 0x7F
    query_start = rng.integers(-2, capacity + 1, size=b).astype(np.int32)
    q = rng.standard_normal((b, s, h, d), dtype=np.float32)
    w = rng.standard_normal((b, s, h), dtype=np.float32)
    return q, codes, scales, w, table, query_start, lengths


def _attention_case(rng, b, s, h, hkv, c, r, block, page, m, extra, k_sel, invalid):
    table, n_pages = _table(rng, b, m, extra, invalid)
    codes = _codes(rng, (n_pages, page, hkv, c))
    scales = rng.uniform(0.002, 0.02, size=(n_pages, page, hkv, c // block)).astype(np.float32)
    rope = rng.standard_normal((n_pages, page, hkv, r), dtype=np.float32)
    _spoil_unused(table, n_pages, codes, scales, rope)
    q = rng.standard_normal((b, s, h, c + r), dtype=np.float32)
    return q, codes, scales, rope, _indices(rng, b, s, k_sel, m * page), table


def _decoded_keys(codes, scales):
    """The float index-key pool the FP8 one stands for: float32(decode(code) * scale)."""
    return decode_fp8_reference(codes) * scales


# ---------------------------------------------------------------------------------------------
# Single-node models.

def _model(node, inputs, outputs, codes="gather"):
    register_schemas()
    graph = helper.make_graph([node], "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dsa", 1)],
                              functions=function_protos(18))
    model.ir_version = 10
    if codes != "gather":
        assert use_fp8_cache_bodies(model, codes)
    return model


def indexer_fp8_model(h, d, page, topk, causal=1, dtype=FLOAT, codes="gather"):
    node = helper.make_node(INDEXER_TOPK_PAGED_FP8.name,
                            ["q", "k_pool", "k_scale_pool", "w", "block_table", "query_start", "lengths"], ["indices"],
                            domain="dsa", topk=topk, scale=d**-0.5, causal=causal, **PLUGIN_ATTRIBUTES)
    return _model(node, [helper.make_tensor_value_info("q", dtype, ["B", "S", h, d]),
                         helper.make_tensor_value_info("k_pool", UINT8, ["P", page, d]),
                         helper.make_tensor_value_info("k_scale_pool", FLOAT, ["P", page, 1]),
                         helper.make_tensor_value_info("w", dtype, ["B", "S", h]),
                         helper.make_tensor_value_info("block_table", INT32, ["B", "M"]),
                         helper.make_tensor_value_info("query_start", INT32, ["B"]),
                         helper.make_tensor_value_info("lengths", INT32, ["B"])],
                  [helper.make_tensor_value_info("indices", INT32, ["B", "S", topk])], codes)


def attention_fp8_model(h, hkv, c, r, block, page, k_sel, scale, dtype=FLOAT, rope_dtype=FLOAT, codes="gather"):
    node = helper.make_node(SPARSE_ATTENTION_PAGED_FP8.name,
                            ["q", "k_pool", "k_scale_pool", "k_rope_pool", "indices", "block_table"], ["out"],
                            domain="dsa", scale=scale, block_size=block, **PLUGIN_ATTRIBUTES)
    return _model(node, [helper.make_tensor_value_info("q", dtype, ["B", "S", h, c + r]),
                         helper.make_tensor_value_info("k_pool", UINT8, ["P", page, hkv, c]),
                         helper.make_tensor_value_info("k_scale_pool", FLOAT, ["P", page, hkv, c // block]),
                         helper.make_tensor_value_info("k_rope_pool", rope_dtype, ["P", page, hkv, r]),
                         helper.make_tensor_value_info("indices", INT32, ["B", "S", k_sel]),
                         helper.make_tensor_value_info("block_table", INT32, ["B", "M"])],
                  [helper.make_tensor_value_info("out", dtype, ["B", "S", h, c])], codes)


def _indexer_feed(q, codes, scales, w, table, query_start, lengths):
    return {"q": q, "k_pool": codes, "k_scale_pool": scales, "w": w, "block_table": table, "query_start": query_start,
            "lengths": lengths}


def _attention_feed(q, codes, scales, rope, indices, table):
    return {"q": q, "k_pool": codes, "k_scale_pool": scales, "k_rope_pool": rope, "indices": indices,
            "block_table": table}


# ---------------------------------------------------------------------------------------------
# Decoding.

def test_all_256_codes_decode_like_torch():
    codes = np.arange(256, dtype=np.uint8)
    want = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()
    assert np.isnan(want[list(NAN_CODES)]).all() and np.isfinite(np.delete(want, NAN_CODES)).all()
    for got in (np.array(fp8_e4m3fn_table(), np.float32), decode_fp8_reference(codes),
                decode_fp8(torch.from_numpy(codes)).numpy()):
        np.testing.assert_array_equal(got, want)  # NaN where NaN, every other value bit for bit
        assert (np.signbit(got) == np.signbit(want)).all()  # -0.0 (0x80) included
    # The bodies' table gather, in ONNX Runtime: one row of codes 0..255 (one page, one head, the
    # NaN patterns read as 0) selected as the one key of a one-head attention, whose output is that
    # key's decoded values.
    finite = np.isfinite(want)
    row = np.where(finite, codes, 0).astype(np.uint8).reshape(1, 1, 1, 256)
    q = np.zeros((1, 1, 1, 256), np.float32)
    for body in FP8_CACHE_BODIES:
        out = _ort(attention_fp8_model(1, 1, 256, 0, 256, 1, 1, 1.0, codes=body),
                   _attention_feed(q, row, np.ones((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 0), np.float32),
                                   np.zeros((1, 1, 1), np.int32), np.zeros((1, 1), np.int32)))
        np.testing.assert_array_equal(out[0, 0, 0], np.where(finite, want, 0.0))


# ---------------------------------------------------------------------------------------------
# (a) torch op == reference == ONNX Runtime running the body, and == the float paged op fed the
# decoded pool (bit for bit in the selection).

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), s=st.integers(1, 6), page=st.integers(1, 5), m=st.integers(1, 5),
       extra=st.integers(0, 3), topk=st.integers(1, 12), causal=st.sampled_from([0, 1]),
       invalid=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**16))
def test_indexer_torch_reference_body_and_float_op_agree(b, s, page, m, extra, topk, causal, invalid, seed):
    h, d = 16, 8
    rng = np.random.default_rng(seed)
    case = _indexer_case(rng, b, s, h, d, page, m, extra, invalid)
    q, codes, scales, w, table, start, lengths = case
    kwargs = dict(topk=topk, scale=d**-0.5, causal=bool(causal))
    want = indexer_topk_paged_fp8_reference(*case, **kwargs)
    got = dsa_indexer_topk_paged_fp8(*_torch(*case), **kwargs)
    assert got.shape == want.shape == (b, s, topk) and got.dtype == torch.int32
    assert _sets(got.numpy()) == _sets(want)
    body = _ort(indexer_fp8_model(h, d, page, topk, causal), _indexer_feed(*case))
    assert _sets(body) == _sets(want)
    assert ((body >= 0).sum(-1) == (want >= 0).sum(-1)).all()
    # The float paged op on the decoded keys: the same selection, bit for bit (torch and body).
    keys = _decoded_keys(codes, scales)
    assert torch.equal(got, dsa_indexer_topk_paged(*_torch(q, keys, w, table, start, lengths), **kwargs))
    float_body = _ort(indexer_model(h, d, page, topk, causal), {"q": q, "k_pool": keys, "w": w, "block_table": table,
                                                                "query_start": start, "lengths": lengths})
    np.testing.assert_array_equal(body, float_body)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), s=st.integers(1, 5), page=st.integers(1, 4), m=st.integers(1, 4),
       extra=st.integers(0, 3), group=st.sampled_from([1, 2, 4]), hkv=st.sampled_from([1, 2]),
       k_sel=st.integers(1, 8), invalid=st.sampled_from([0.0, 0.3]), n_blocks=st.integers(1, 3),
       block=st.sampled_from([1, 2, 4]), r=st.sampled_from([0, 1, 4]), seed=st.integers(0, 2**16))
def test_attention_torch_reference_body_and_float_op_agree(b, s, page, m, extra, group, hkv, k_sel, invalid,
                                                           n_blocks, block, r, seed):
    c, h = n_blocks * block, hkv * group
    rng = np.random.default_rng(seed)
    case = _attention_case(rng, b, s, h, hkv, c, r, block, page, m, extra, k_sel, invalid)
    q, codes, scales, rope, indices, table = case
    scale = (c + r) ** -0.5
    want = sparse_attention_paged_fp8_reference(*case, scale=scale, block_size=block)
    got = dsa_sparse_attention_paged_fp8(*_torch(*case), scale=scale, block_size=block).numpy()
    assert got.shape == (b, s, h, c) and got.dtype == np.float32 and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    body = _ort(attention_fp8_model(h, hkv, c, r, block, page, k_sel, scale), _attention_feed(*case))
    np.testing.assert_allclose(body, want, rtol=1e-5, atol=1e-5)
    # The float paged op on the decoded latent rows, values from the keys (their first C channels).
    latent = fp8_latent_pool_reference(codes, scales, rope, block)
    float_op = dsa_sparse_attention_paged(*_torch(q, latent), None, *_torch(indices, table), scale=scale,
                                          v_head_dim=c).numpy()
    np.testing.assert_allclose(got, float_op, rtol=1e-5, atol=1e-5)
    float_body = _ort(attention_model(h, hkv, c + r, c, page, k_sel, scale),
                      {"q": q, "k_pool": latent, "v_pool": np.zeros((0, page, hkv, c), np.float32),
                       "indices": indices, "block_table": table})
    np.testing.assert_allclose(body, float_body, rtol=1e-5, atol=1e-5)


def test_attention_skips_every_kind_of_invalid_index():
    rng = np.random.default_rng(2)
    page, h, c, r, block = 2, 4, 8, 4, 4
    table = np.array([[4, -1, 9]], np.int32)  # logical 0-1 on page 4, 2-3 on no page, 4-5 past the pool
    codes, scales = _codes(rng, (5, page, 1, c)), rng.uniform(0.01, 0.1, size=(5, page, 1, 2)).astype(np.float32)
    rope = rng.standard_normal((5, page, 1, r), dtype=np.float32)
    _spoil_unused(table, 5, codes, scales, rope)
    q = rng.standard_normal((1, 3, h, c + r), dtype=np.float32)
    indices = np.array([[[1, 2, 3], [4, 6, -1], [5, -3, 7]]], np.int32)  # only logical 1 is valid
    case = (q, codes, scales, rope, indices, table)
    value = decode_fp8_reference(codes[4, 1, 0]) * np.repeat(scales[4, 1, 0], block)
    for got in (dsa_sparse_attention_paged_fp8(*_torch(*case), scale=0.5, block_size=block).numpy(),
                sparse_attention_paged_fp8_reference(*case, scale=0.5, block_size=block),
                _ort(attention_fp8_model(h, 1, c, r, block, page, 3, 0.5), _attention_feed(*case))):
        np.testing.assert_allclose(got[0, 0], np.broadcast_to(value, (h, c)), rtol=1e-6)  # one key: weight 1
        assert not got[0, 1:].any()


@pytest.mark.parametrize("codes", FP8_CACHE_BODIES)
@pytest.mark.parametrize("chunk_elements, key_elements", [(1, 1), (700, 100), (1 << 23, 700)])
def test_bodies_in_several_chunks(monkeypatch, chunk_elements, key_elements, codes):
    # Chunks of queries, and within each the keys in spans of pages (one page a span at 1); both
    # constructions of the bodies (the TensorRT one runs in ONNX Runtime too).
    from dsa_export.ops import attention_onnx, paged_onnx

    monkeypatch.setattr(attention_onnx, "CHUNK_ELEMENTS", chunk_elements)
    monkeypatch.setattr(paged_onnx, "KEY_CHUNK_ELEMENTS", key_elements)
    rng = np.random.default_rng(chunk_elements)
    h, d, page, topk = 16, 8, 3, 5
    case = _indexer_case(rng, 2, 11, h, d, page, 5, 2, 0.2)
    for causal in (0, 1):
        want = indexer_topk_paged_fp8_reference(*case, topk=topk, scale=d**-0.5, causal=bool(causal))
        got = _ort(indexer_fp8_model(h, d, page, topk, causal, codes=codes), _indexer_feed(*case))
        assert _sets(got) == _sets(want)
    case = _attention_case(rng, 2, 11, 4, 2, 12, 4, 4, page, 5, 2, 7, 0.2)
    np.testing.assert_allclose(_ort(attention_fp8_model(4, 2, 12, 4, 4, page, 7, 0.3, codes=codes),
                                    _attention_feed(*case)),
                               sparse_attention_paged_fp8_reference(*case, scale=0.3, block_size=4),
                               rtol=1e-5, atol=1e-5)


def test_torch_ops_in_several_chunks(monkeypatch):
    from dsa_export.ops import torch_ops

    rng = np.random.default_rng(5)
    icase = _torch(*_indexer_case(rng, 2, 33, 16, 8, 4, 10, 2, 0.2))
    acase = _torch(*_attention_case(rng, 2, 33, 4, 1, 8, 4, 4, 4, 10, 2, 9, 0.2))
    whole_idx = dsa_indexer_topk_paged_fp8(*icase, topk=5, scale=0.3)
    whole_out = dsa_sparse_attention_paged_fp8(*acase, scale=0.3, block_size=4)
    monkeypatch.setattr(torch_ops, "_CHUNK_BYTES", 1)
    monkeypatch.setattr(torch_ops, "_INDEXER_TILE", 1)
    monkeypatch.setattr(torch_ops, "_KEY_BLOCK", 1)
    assert torch.equal(dsa_indexer_topk_paged_fp8(*icase, topk=5, scale=0.3), whole_idx)
    torch.testing.assert_close(dsa_sparse_attention_paged_fp8(*acase, scale=0.3, block_size=4), whole_out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_queries_and_rope(dtype):
    rng = np.random.default_rng(6)
    q, codes, scales, w, table, start, lengths = _indexer_case(rng, 2, 6, 16, 16, 4, 4, 2, 0.2)
    qt = torch.from_numpy(q).to(dtype)
    got = dsa_indexer_topk_paged_fp8(qt, *_torch(codes, scales, w, table, start, lengths), topk=4, scale=0.25)
    want = indexer_topk_paged_fp8_reference(qt.float().numpy(), codes, scales, w, table, start, lengths, topk=4,
                                            scale=0.25)
    assert _sets(got.numpy()) == _sets(want)
    q, codes, scales, rope, indices, table = _attention_case(rng, 2, 6, 8, 1, 32, 8, 16, 4, 4, 2, 6, 0.2)
    qt, rt = torch.from_numpy(q).to(dtype), torch.from_numpy(rope).to(dtype)
    out = dsa_sparse_attention_paged_fp8(qt, *_torch(codes, scales), rt, *_torch(indices, table), scale=40**-0.5,
                                         block_size=16)
    assert out.dtype == dtype
    want = sparse_attention_paged_fp8_reference(qt.float().numpy(), codes, scales, rt.float().numpy(), indices, table,
                                                scale=40**-0.5, block_size=16)
    tol = 2e-3 if dtype == torch.float16 else 2e-2
    np.testing.assert_allclose(out.float().numpy(), want, rtol=tol, atol=tol)
    # float32 queries over a bfloat16 RoPE pool (the serving layout): the rope has its own type.
    out32 = dsa_sparse_attention_paged_fp8(torch.from_numpy(q), *_torch(codes, scales), rt, *_torch(indices, table),
                                           scale=40**-0.5, block_size=16)
    want32 = sparse_attention_paged_fp8_reference(q, codes, scales, rt.float().numpy(), indices, table,
                                                  scale=40**-0.5, block_size=16)
    np.testing.assert_allclose(out32.numpy(), want32, rtol=1e-5, atol=1e-5)
    if dtype == torch.float16:  # the body in fp16 (ONNX Runtime has no bf16 MatMul on CPU)
        model = attention_fp8_model(8, 1, 32, 8, 16, 4, 6, 40**-0.5, dtype=TensorProto.FLOAT16,
                                    rope_dtype=TensorProto.FLOAT16)
        body = _ort(model, _attention_feed(qt.numpy(), codes, scales, rt.numpy(), indices, table))
        assert body.dtype == np.float16
        np.testing.assert_allclose(body.astype(np.float32), want, rtol=tol, atol=tol)


def test_reference_evaluator_runs_the_nodes():
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(7)
    case = _indexer_case(rng, 2, 5, 16, 8, 3, 4, 2, 0.2)
    (node,) = ReferenceEvaluator(indexer_fp8_model(16, 8, 3, 4), new_ops=REFERENCE_OPS).run(None, _indexer_feed(*case))
    np.testing.assert_array_equal(node, indexer_topk_paged_fp8_reference(*case, topk=4, scale=8**-0.5))
    case = _attention_case(rng, 2, 5, 4, 2, 8, 4, 4, 3, 4, 2, 5, 0.2)
    (node,) = ReferenceEvaluator(attention_fp8_model(4, 2, 8, 4, 4, 3, 5, 0.3),
                                 new_ops=REFERENCE_OPS).run(None, _attention_feed(*case))
    np.testing.assert_allclose(node, sparse_attention_paged_fp8_reference(*case, scale=0.3, block_size=4),
                               rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# (b) Standard ops, input-shaped loops, nothing of the pool decoded or cast whole.

def test_bodies_use_standard_ops_with_input_shaped_loops():
    for codes in FP8_CACHE_BODIES:
        for model in (indexer_fp8_model(16, 8, 4, 3, codes=codes), attention_fp8_model(4, 1, 8, 4, 4, 4, 3, 0.3,
                                                                                      codes=codes)):
            onnx.checker.check_model(model, full_check=True)
            (fn,) = [f for f in model.functions if f.name in FP8_OPS and f.name == model.graph.node[0].op_type]
            nodes = list(_walk(fn.node))
            ops = {n.op_type for n in nodes}
            assert {n.domain for n in nodes} <= {""}, fn.name
            assert "Loop" in ops and not ops & {"NonZero", "GatherND", "ScatterND", "ScatterElements", "If"}, fn.name
            for loop in (n for n in nodes if n.op_type == "Loop"):
                assert loop.input[0] and loop.input[1] == ""
            readers = {n.op_type for n in nodes if "k_pool" in n.input}
            # gather: the codes pool is only viewed (Shape, Reshape) or gathered from; cast: only cast.
            assert readers <= ({"Shape", "Reshape", "Gather"} if codes == "gather" else {"Cast"}), (codes, readers)
    assert {f.name for f in function_protos(18)} >= set(FP8_OPS)


def test_a_long_decode_step_decodes_its_rows_not_the_pool(tmp_path):
    # One row decoding after 32K keys in a pool of 64K tokens: no node of either body writes a
    # tensor near the size of the row's decoded index keys, let alone the pool's.
    rng = np.random.default_rng(5)
    h, d, page, topk, past = 16, 128, 64, 64, 32768
    m = past // page
    n_pages = 2 * m
    table = (1 + rng.permutation(m)).reshape(1, m).astype(np.int32)
    codes = _codes(rng, (n_pages, page, d))
    scales = rng.uniform(0.002, 0.05, size=(n_pages, page, 1)).astype(np.float32)
    q, w = rng.standard_normal((1, 1, h, d), dtype=np.float32), rng.standard_normal((1, 1, h), dtype=np.float32)
    case = (q, codes, scales, w, table, np.array([past - 1], np.int32), np.array([past], np.int32))

    def largest_write(model, feed, name):
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(tmp_path / name)
        sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        (out,) = sess.run(None, feed)
        events = json.loads(Path(sess.end_profiling()).read_text())
        written = [int(e["args"].get("output_size", 0) or 0) for e in events
                   if e.get("cat") == "Node" and e["args"].get("op_name") not in ("Loop", "Reshape", "Unsqueeze")]
        return out, max(written)

    idx, largest = largest_write(indexer_fp8_model(h, d, page, topk), _indexer_feed(*case), "index")
    assert largest <= past * d * 4 // 4, largest  # a quarter of the row's decoded float32 keys
    assert _sets(idx) == _sets(dsa_indexer_topk_paged_fp8(*_torch(*case), topk=topk, scale=d**-0.5).numpy())
    # FlashMLA's layout: 512 codes (4 scales of 128) and 64 bfloat16 RoPE channels a token.
    c, r, n_pages = 512, 64, 1024
    acodes = _codes(rng, (n_pages, page, 1, c))
    ascales = rng.uniform(0.002, 0.02, size=(n_pages, page, 1, 4)).astype(np.float32)
    rope = rng.standard_normal((n_pages, page, 1, r), dtype=np.float32)
    qa = rng.standard_normal((1, 1, 16, c + r), dtype=np.float32)
    table = rng.permutation(n_pages)[:m].reshape(1, m).astype(np.int32)
    feed = _attention_feed(qa, acodes, ascales, rope, idx, table)
    out, largest = largest_write(attention_fp8_model(16, 1, c, r, 128, page, topk, (c + r) ** -0.5), feed, "attn")
    assert largest <= acodes.nbytes // 64, largest  # the pool decoded would be 4x its codes
    want = dsa_sparse_attention_paged_fp8(*_torch(qa, acodes, ascales, rope, idx, table), scale=(c + r) ** -0.5)
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# (c) No plugin: TensorRT-RTX builds the bodies (the ``cast`` construction the parsers swap in).

def test_the_fp8_paged_ops_are_plugin_less_selection_ops():
    assert not INDEXER_TOPK_PAGED_FP8.has_plugin and not SPARSE_ATTENTION_PAGED_FP8.has_plugin
    assert not set(FP8_OPS) & set(PLUGIN_OPS) and set(FP8_OPS) <= set(OPS)
    assert INDEXER_TOPK_PAGED_FP8.name in SELECTING_OPS and SPARSE_ATTENTION_PAGED_FP8.name in SELECTION_CONSUMERS
    assert INDEXER_TOPK_PAGED_FP8.output_type_input is None and SPARSE_ATTENTION_PAGED_FP8.output_type_input == 0
    assert INDEXER_TOPK_PAGED_FP8.output_dims([["B", "S", 4, 8]], {"topk": 7}) == ["B", "S", 7]
    dims = [["B", "S", 16, 576], [10, 64, 1, 512], [10, 64, 1, 4], [10, 64, 1, 64], ["B", "S", 64], ["B", 8]]
    assert SPARSE_ATTENTION_PAGED_FP8.output_dims(dims, {"scale": 0.1}) == ["B", "S", 16, 512]
    # The working memory does not grow with the pool (P pages), only with what is read of it.
    sizes = {INDEXER_TOPK_PAGED_FP8.workspace_bytes(
        [(2, 1, 16, 128), (p, 64, 128), (p, 64, 1), (2, 1, 16), (2, 512), (2,), (2,)], {"topk": 64})
        for p in (1024, 65536)}
    assert len(sizes) == 1 and 0 < sizes.pop() < 1024 * 64 * 128
    sizes = {SPARSE_ATTENTION_PAGED_FP8.workspace_bytes(
        [(2, 1, 16, 576), (p, 64, 1, 512), (p, 64, 1, 4), (p, 64, 1, 64), (2, 1, 2048), (2, 512)], {"scale": 0.1})
        for p in (1024, 65536)}
    assert len(sizes) == 1 and 0 < sizes.pop() < 65536 * 64 * 512


def test_tensorrt_rtx_builds_the_fp8_bodies():
    # TensorRT(-RTX) takes a uint8 tensor only as a network input consumed by a Cast: the default
    # (gather) bodies fail to parse with the error below, and the parsers' use_tensorrt_bodies
    # swaps in the cast construction, which builds.
    batch, seq, pages, blocks = (1, 1, 2), (1, 64, 256), (1, 64, 512), (1, 8, 16)
    h, d, page = 16, 32, 16
    ranges = {"q": _ranges(batch, seq, h, d), "k_pool": _ranges(pages, page, d),
              "k_scale_pool": _ranges(pages, page, 1), "w": _ranges(batch, seq, h),
              "block_table": _ranges(batch, blocks), "query_start": _ranges(batch), "lengths": _ranges(batch)}
    ok, log = rtx_build(indexer_fp8_model(h, d, page, 8), ranges)
    assert ok or "uint8" in log.lower(), log  # "Found unsupported input type of UINT8"
    model = indexer_fp8_model(h, d, page, 8)
    assert use_tensorrt_bodies(model)
    ok, log = rtx_build(model, ranges)
    assert ok, log
    c, r, block = 64, 16, 32
    ranges = {"q": _ranges(batch, seq, h, c + r), "k_pool": _ranges(pages, page, 1, c),
              "k_scale_pool": _ranges(pages, page, 1, c // block), "k_rope_pool": _ranges(pages, page, 1, r),
              "indices": _ranges(batch, seq, 6), "block_table": _ranges(batch, blocks)}
    model = attention_fp8_model(h, 1, c, r, block, page, 6, 0.3)
    ok, log = rtx_build(model, ranges)
    assert ok or "uint8" in log.lower(), log  # "first input has type UInt8 but must have type ..."
    assert use_tensorrt_bodies(model)
    ok, log = rtx_build(model, ranges)
    assert ok, log


# ---------------------------------------------------------------------------------------------
# The torch side: fake kernels, argument checks, export to dsa nodes.

def test_fake_kernels_pass_opcheck():
    rng = np.random.default_rng(8)
    icase = _torch(*_indexer_case(rng, 2, 3, 16, 8, 4, 3, 1, 0.2))
    torch.library.opcheck(torch.ops.dsa.indexer_topk_paged_fp8.default, (*icase, 3, 0.3, True),
                          test_utils=("test_schema", "test_faketensor"))
    acase = _torch(*_attention_case(rng, 2, 3, 4, 2, 8, 4, 4, 4, 3, 1, 5, 0.2))
    torch.library.opcheck(torch.ops.dsa.sparse_attention_paged_fp8.default, (*acase, 0.3, 4),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("change,message", [
    (lambda c: {**c, "k_pool": c["k_pool"].float()}, "uint8"),
    (lambda c: {**c, "k_pool": c["k_pool"].view(torch.float8_e4m3fn)}, "uint8"),
    (lambda c: {**c, "k_scale_pool": c["k_scale_pool"][..., :0]}, "k_scale_pool"),
    (lambda c: {**c, "k_scale_pool": c["k_scale_pool"].half()}, "k_scale_pool"),
    (lambda c: {**c, "k_pool": c["k_pool"][..., :4]}, "does not match"),
    (lambda c: {**c, "block_table": c["block_table"].float()}, "block_table"),
    (lambda c: {**c, "lengths": c["lengths"][:1]}, "lengths"),
])
def test_indexer_arguments_are_checked(change, message):
    keys = ("q", "k_pool", "k_scale_pool", "w", "block_table", "query_start", "lengths")
    case = dict(zip(keys, _torch(*_indexer_case(np.random.default_rng(0), 2, 3, 16, 8, 4, 3, 1, 0.0))))
    with pytest.raises(ValueError, match=message):
        dsa_indexer_topk_paged_fp8(**change(case), topk=2, scale=0.3)


@pytest.mark.parametrize("change,block,message", [
    (lambda c: {**c, "k_pool": c["k_pool"].float()}, 4, "uint8"),
    (lambda c: c, 3, "not a multiple of block_size"),
    (lambda c: {**c, "k_scale_pool": c["k_scale_pool"][..., :1]}, 4, "k_scale_pool"),
    (lambda c: {**c, "k_scale_pool": c["k_scale_pool"][:1]}, 4, "k_scale_pool"),
    (lambda c: {**c, "k_rope_pool": c["k_rope_pool"][:1]}, 4, "k_rope_pool"),
    (lambda c: {**c, "q": c["q"][..., :-1]}, 4, "C \\+ R"),
    (lambda c: {**c, "q": c["q"][:, :, :3]}, 4, "multiple of Hkv"),
    (lambda c: {**c, "block_table": c["block_table"][:, None]}, 4, "block_table"),
])
def test_attention_arguments_are_checked(change, block, message):
    keys = ("q", "k_pool", "k_scale_pool", "k_rope_pool", "indices", "block_table")
    case = dict(zip(keys, _torch(*_attention_case(np.random.default_rng(0), 2, 3, 4, 2, 8, 4, 4, 4, 3, 1, 5, 0.0))))
    with pytest.raises(ValueError, match=message):
        dsa_sparse_attention_paged_fp8(**change(case), scale=0.3, block_size=block)


class PagedFP8Decode(torch.nn.Module):
    """One FP8 paged indexer feeding one FP8 paged attention, as a decode step over FP8 caches would."""

    def forward(self, q_index, index_codes, index_scales, w, q, codes, scales, rope, block_table, query_start,
                lengths):
        indices = dsa_indexer_topk_paged_fp8(q_index, index_codes, index_scales, w, block_table, query_start, lengths,
                                             topk=6, scale=0.125)
        return dsa_sparse_attention_paged_fp8(q, codes, scales, rope, indices, block_table, scale=0.25, block_size=8)


def test_export_emits_the_fp8_nodes_and_matches_torch():
    register_schemas()
    rng = np.random.default_rng(9)
    page, m, c, r = 4, 5, 16, 8

    def inputs(b, s, n_extra, seed):
        rng = np.random.default_rng(seed)
        table, n_pages = _table(rng, b, m, n_extra)
        codes, scales = _codes(rng, (n_pages, page, 8)), rng.uniform(0.01, 0.1, (n_pages, page, 1)).astype(np.float32)
        acodes = _codes(rng, (n_pages, page, 1, c))
        ascales = rng.uniform(0.01, 0.1, (n_pages, page, 1, c // 8)).astype(np.float32)
        return _torch(rng.standard_normal((b, s, 16, 8), dtype=np.float32), codes, scales,
                      rng.standard_normal((b, s, 16), dtype=np.float32),
                      rng.standard_normal((b, s, 4, c + r), dtype=np.float32), acodes, ascales,
                      rng.standard_normal((n_pages, page, 1, r), dtype=np.float32),
                      table, rng.integers(0, 12, size=b).astype(np.int32), np.full(b, m * page - 2, np.int32))

    batch, seq = torch.export.Dim("batch", min=2), torch.export.Dim("seq", min=2)
    pages = torch.export.Dim("pages", min=2)
    shapes = ({0: batch, 1: seq}, {0: pages}, {0: pages}, {0: batch, 1: seq}, {0: batch, 1: seq}, {0: pages},
              {0: pages}, {0: pages}, {0: batch}, {0: batch}, {0: batch})
    program = torch.onnx.export(PagedFP8Decode().eval(), inputs(2, 3, 2, 0), dynamic_shapes=shapes,
                                custom_translation_table=translation_table(), opset_version=18, dynamo=True,
                                verbose=False)
    model = program.model_proto
    nodes = [n for n in model.graph.node if n.domain == "dsa"]
    assert [n.op_type for n in nodes] == list(FP8_OPS)
    attrs = {a.name: helper.get_attribute_value(a) for a in nodes[1].attribute}
    assert attrs["block_size"] == 8 and attrs["plugin_namespace"] == b"dsa"
    assert [i.type.tensor_type.elem_type for i in model.graph.input][1] == UINT8
    model.functions.extend(function_protos(18))
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s, extra in ((2, 3, 2), (3, 5, 6)):  # the traced shapes and others
        args = inputs(b, s, extra, rng.integers(1 << 30))
        with torch.no_grad():
            want = PagedFP8Decode()(*args).numpy()
        (got,) = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# The contract's consumers: validation's recorded selections, quantization's indexer placement.

def test_validation_records_the_fp8_indexer_scores():
    from dsa_export.validate.compare import TorchOpSelections

    rng = np.random.default_rng(10)
    case = _indexer_case(rng, 2, 5, 16, 8, 3, 4, 2, 0.2)
    q, codes, scales, w, table, start, lengths = case

    class Both(torch.nn.Module):
        def forward(self, *args):
            return (dsa_indexer_topk_paged_fp8(*args, topk=4, scale=0.3),
                    dsa_indexer_topk_paged(args[0], torch.from_numpy(_decoded_keys(codes, scales)), *args[3:], topk=4,
                                           scale=0.3))

    (fp8, plain), captured = TorchOpSelections(Both()).run_with_selections(*_torch(*case))
    assert sorted(captured) == [0, 1] and torch.equal(captured[0][0], fp8) and torch.equal(fp8, plain)
    # The FP8 call's scores are those of the float op on the decoded keys (invalid keys -inf included).
    np.testing.assert_array_equal(captured[0][1].numpy(), captured[1][1].numpy())


def test_quantization_places_the_fp8_indexer():
    # The head weights are the FP8 indexer's input 3 (after the scales); its keys are codes already,
    # so only q is an indexer activation to calibrate.
    from dsa_export.quantize.qdq import plan

    register_schemas()
    w_proj = helper.make_tensor("w_proj", FLOAT, [32, 16], np.ones(32 * 16, np.float32).tolist())
    nodes = [helper.make_node("MatMul", ["x", "w_proj"], ["w"], name="weights_proj"),
             helper.make_node(INDEXER_TOPK_PAGED_FP8.name,
                              ["q", "k_pool", "k_scale_pool", "w", "block_table", "query_start", "lengths"],
                              ["indices"], domain="dsa", name="indexer", topk=4, scale=0.3, **PLUGIN_ATTRIBUTES)]
    inputs = [helper.make_tensor_value_info("x", FLOAT, ["B", "S", 32]),
              helper.make_tensor_value_info("q", FLOAT, ["B", "S", 16, 8]),
              helper.make_tensor_value_info("k_pool", UINT8, ["P", 4, 8]),
              helper.make_tensor_value_info("k_scale_pool", FLOAT, ["P", 4, 1]),
              helper.make_tensor_value_info("block_table", INT32, ["B", "M"]),
              helper.make_tensor_value_info("query_start", INT32, ["B"]),
              helper.make_tensor_value_info("lengths", INT32, ["B"])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("indices", INT32, ["B", "S", 4])],
                              initializer=[w_proj])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dsa", 1)])
    placement = plan(model)
    (ix,) = placement.indexers
    assert (ix.node, ix.q, ix.k, ix.w) == ("indexer", "q", "", "w")
    assert placement.indexer_activations == ["q"]
    assert "head-weight" in placement.skipped["weights_proj"]
