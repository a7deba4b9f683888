"""DSAIndexerTopKPaged and DSASparseAttentionPaged: torch op, NumPy reference and ONNX function body
against each other, against the contiguous ops, in bounded memory, and without a plugin."""

from __future__ import annotations

import json
import re
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
    dsa_indexer_topk,
    dsa_indexer_topk_paged,
    dsa_sparse_attention,
    dsa_sparse_attention_paged,
)
from dsa_export.ops.contract import (
    INDEXER_TOPK_PAGED,
    OPS,
    PLUGIN_ATTRIBUTES,
    PLUGIN_OPS,
    SPARSE_ATTENTION_PAGED,
)
from dsa_export.ops.onnx_ops import function_protos, register_schemas, translation_table
from dsa_export.ops.reference import (
    REFERENCE_OPS,
    indexer_topk_paged_reference,
    sparse_attention_paged_reference,
)
from tests.build_fixtures import rtx_build

FLOAT, INT32 = TensorProto.FLOAT, TensorProto.INT32
REPO = Path(__file__).resolve().parents[2]
PAGED = (INDEXER_TOPK_PAGED.name, SPARSE_ATTENTION_PAGED.name)


# ---------------------------------------------------------------------------------------------
# Cases: shuffled pages, unused pages full of garbage, invalid table entries, ragged rows.

def _table(rng, b, m, extra, invalid=0.0):
    """[B,M] int32 block table over a pool of ``b*m + extra`` pages, each row its own pages in a
    random order; with ``invalid`` that fraction of entries is -1 or past the pool."""
    n_pages = b * m + extra
    table = rng.permutation(n_pages)[: b * m].reshape(b, m)
    if invalid:
        bad = rng.choice([-1, -7, n_pages, n_pages + 3], size=table.shape)
        table = np.where(rng.random(table.shape) < invalid, bad, table)
    return table.astype(np.int32), n_pages


def _used(table, n_pages):
    return {int(p) for p in table.ravel() if 0 <= p < n_pages}


def _pool(rng, n_pages, page, rest, table, dtype=np.float32):
    """A pool whose pages no table entry names hold garbage (NaN and huge values)."""
    pool = rng.standard_normal((n_pages, page, *rest)).astype(np.float32)
    for p in sorted(set(range(n_pages)) - _used(table, n_pages)):
        pool[p] = np.nan if p % 2 else 3e38
    return pool.astype(dtype)


def _sets(x):
    return [{int(i) for i in row if i >= 0} for row in np.asarray(x).reshape(-1, x.shape[-1])]


def _indexer_case(rng, b, s, h, d, page, m, extra, invalid):
    table, n_pages = _table(rng, b, m, extra, invalid)
    pool = _pool(rng, n_pages, page, (d,), table)
    capacity = m * page
    lengths = rng.integers(0, capacity + 3, size=b).astype(np.int32)
    # The tail of each row past its length is garbage too (a page being filled).
    for bi in range(b):
        for t in range(max(0, int(lengths[bi])), capacity):
            p = table[bi, t // page]
            if 0 <= p < n_pages:
                pool[p, t % page] = np.nan
    query_start = rng.integers(-2, capacity + 1, size=b).astype(np.int32)
    q = rng.standard_normal((b, s, h, d), dtype=np.float32)
    w = rng.standard_normal((b, s, h), dtype=np.float32)
    return q, pool, w, table, query_start, lengths


def _indices(rng, b, s, k_sel, capacity, invalid=0.2):
    """[B,S,K] distinct logical positions per row, some past the capacity, some -1."""
    rows = []
    for _ in range(b * s):
        row = rng.permutation(capacity + 3)[:k_sel]
        row = np.concatenate([row, np.full(max(0, k_sel - row.size), -1)])
        rows.append(np.where(rng.random(k_sel) < invalid, -1, row))
    return np.stack(rows).reshape(b, s, k_sel).astype(np.int32)


def _attention_case(rng, b, s, h, hkv, dk, dv, page, m, extra, k_sel, invalid, from_keys):
    table, n_pages = _table(rng, b, m, extra, invalid)
    k_pool = _pool(rng, n_pages, page, (hkv, dk), table)
    v_pool = np.zeros((0, page, hkv, dv), np.float32) if from_keys else _pool(rng, n_pages, page, (hkv, dv), table)
    q = rng.standard_normal((b, s, h, dk), dtype=np.float32)
    return q, k_pool, v_pool, _indices(rng, b, s, k_sel, m * page), table


# ---------------------------------------------------------------------------------------------
# Single-node models.

def _model(node, inputs, outputs):
    register_schemas()
    graph = helper.make_graph([node], "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dsa", 1)],
                              functions=function_protos(18))
    model.ir_version = 10
    return model


def indexer_model(h, d, page, topk, causal=1, dtype=FLOAT):
    node = helper.make_node(INDEXER_TOPK_PAGED.name, ["q", "k_pool", "w", "block_table", "query_start", "lengths"],
                            ["indices"], domain="dsa", topk=topk, scale=d**-0.5, causal=causal, **PLUGIN_ATTRIBUTES)
    return _model(node, [helper.make_tensor_value_info("q", dtype, ["B", "S", h, d]),
                         helper.make_tensor_value_info("k_pool", dtype, ["P", page, d]),
                         helper.make_tensor_value_info("w", dtype, ["B", "S", h]),
                         helper.make_tensor_value_info("block_table", INT32, ["B", "M"]),
                         helper.make_tensor_value_info("query_start", INT32, ["B"]),
                         helper.make_tensor_value_info("lengths", INT32, ["B"])],
                  [helper.make_tensor_value_info("indices", INT32, ["B", "S", topk])])


def attention_model(h, hkv, dk, dv, page, k_sel, scale, dtype=FLOAT):
    node = helper.make_node(SPARSE_ATTENTION_PAGED.name, ["q", "k_pool", "v_pool", "indices", "block_table"], ["out"],
                            domain="dsa", scale=scale, **PLUGIN_ATTRIBUTES)
    return _model(node, [helper.make_tensor_value_info("q", dtype, ["B", "S", h, dk]),
                         helper.make_tensor_value_info("k_pool", dtype, ["P", page, hkv, dk]),
                         helper.make_tensor_value_info("v_pool", dtype, ["Pv", page, hkv, dv]),
                         helper.make_tensor_value_info("indices", INT32, ["B", "S", k_sel]),
                         helper.make_tensor_value_info("block_table", INT32, ["B", "M"])],
                  [helper.make_tensor_value_info("out", dtype, ["B", "S", h, dv])])


def _ort(model, feed):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def _indexer_feed(q, pool, w, table, query_start, lengths):
    return {"q": q, "k_pool": pool, "w": w, "block_table": table, "query_start": query_start, "lengths": lengths}


def _attention_feed(q, k_pool, v_pool, indices, table):
    return {"q": q, "k_pool": k_pool, "v_pool": v_pool, "indices": indices, "block_table": table}


def _torch(*arrays):
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)


# ---------------------------------------------------------------------------------------------
# (a) torch op == reference == ONNX Runtime running the function body.

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), s=st.integers(1, 6), page=st.integers(1, 5), m=st.integers(1, 5),
       extra=st.integers(0, 3), topk=st.integers(1, 12), causal=st.sampled_from([0, 1]),
       invalid=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**16))
def test_indexer_torch_reference_and_body_agree(b, s, page, m, extra, topk, causal, invalid, seed):
    h, d = 16, 8
    rng = np.random.default_rng(seed)
    case = _indexer_case(rng, b, s, h, d, page, m, extra, invalid)
    want = indexer_topk_paged_reference(*case, topk=topk, scale=d**-0.5, causal=bool(causal))
    got = dsa_indexer_topk_paged(*_torch(*case), topk=topk, scale=d**-0.5, causal=bool(causal)).numpy()
    assert got.shape == want.shape == (b, s, topk) and got.dtype == np.int32
    assert _sets(got) == _sets(want)
    body = _ort(indexer_model(h, d, page, topk, causal), _indexer_feed(*case))
    assert _sets(body) == _sets(want)
    # -1 exactly in the slots beyond the allowed keys
    assert ((got >= 0).sum(-1) == (want >= 0).sum(-1)).all() and ((body >= 0).sum(-1) == (want >= 0).sum(-1)).all()


def test_indexer_rows_follow_their_own_start_and_length():
    # Ragged decode batch: three rows with past lengths 0, 5 and 13 (one query each) and a
    # prefill chunk row; every selection stays inside its row's allowed logical prefix.
    rng = np.random.default_rng(1)
    b, s, h, d, page, m, topk = 3, 4, 16, 8, 4, 5, 3
    table, n_pages = _table(rng, b, m, 2)
    pool = _pool(rng, n_pages, page, (d,), table)
    q, w = rng.standard_normal((b, s, h, d), dtype=np.float32), rng.standard_normal((b, s, h), dtype=np.float32)
    query_start = np.array([0, 5, 13], np.int32)
    lengths = query_start + s
    case = (q, pool, w, table, query_start, lengths)
    got = dsa_indexer_topk_paged(*_torch(*case), topk=topk, scale=0.3).numpy()
    for bi in range(b):
        for si in range(s):
            chosen = {int(i) for i in got[bi, si] if i >= 0}
            allowed = int(query_start[bi]) + si + 1
            assert len(chosen) == min(topk, allowed) and max(chosen) < allowed
    assert _sets(got) == _sets(indexer_topk_paged_reference(*case, topk=topk, scale=0.3))
    assert _sets(_ort(indexer_model(h, d, page, topk), _indexer_feed(*case))) == _sets(got)


def test_indexer_ties_go_to_the_lower_logical_position():
    # Every score ties at 0 (ReLU of negative logits): the lowest allowed logical positions win,
    # whatever pages hold them; an invalid page's positions are skipped.
    b, s, h, d, page, m = 1, 2, 16, 4, 2, 4
    table = np.array([[3, 0, -1, 1]], np.int32)
    pool = np.ones((4, page, d), np.float32)
    q, w = -np.ones((b, s, h, d), np.float32), np.ones((b, s, h), np.float32)
    case = (q, pool, w, table, np.array([6], np.int32), np.array([8], np.int32))
    for got in (dsa_indexer_topk_paged(*_torch(*case), topk=5, scale=1.0).numpy(),
                indexer_topk_paged_reference(*case, topk=5, scale=1.0),
                _ort(indexer_model(h, d, page, 5), _indexer_feed(*case))):
        assert _sets(got) == [{0, 1, 2, 3, 6}, {0, 1, 2, 3, 6}]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), s=st.integers(1, 5), page=st.integers(1, 4), m=st.integers(1, 4),
       extra=st.integers(0, 3), group=st.sampled_from([1, 2, 4]), hkv=st.sampled_from([1, 2]),
       k_sel=st.integers(1, 8), invalid=st.sampled_from([0.0, 0.3]), from_keys=st.booleans(),
       dv=st.integers(1, 10), seed=st.integers(0, 2**16))
def test_attention_torch_reference_and_body_agree(b, s, page, m, extra, group, hkv, k_sel, invalid, from_keys, dv,
                                                  seed):
    dk = 8
    dv = min(dv, dk) if from_keys else dv  # values from keys: Dv <= Dk; a v_pool may be wider
    rng = np.random.default_rng(seed)
    case = _attention_case(rng, b, s, hkv * group, hkv, dk, dv, page, m, extra, k_sel, invalid, from_keys)
    want = sparse_attention_paged_reference(*case, scale=0.35)
    got = dsa_sparse_attention_paged(*_torch(*case), scale=0.35).numpy()
    assert got.shape == (b, s, hkv * group, dv) and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    body = _ort(attention_model(hkv * group, hkv, dk, dv, page, k_sel, 0.35), _attention_feed(*case))
    np.testing.assert_allclose(body, want, rtol=1e-5, atol=1e-5)


def test_attention_skips_every_kind_of_invalid_index():
    rng = np.random.default_rng(2)
    page, m, h, d = 2, 3, 4, 8
    table = np.array([[4, -1, 9]], np.int32)  # logical 0-1 on page 4, 2-3 on no page, 4-5 past the pool
    k_pool = _pool(rng, 5, page, (1, d), table)
    v_pool = _pool(rng, 5, page, (1, d), table)
    q = rng.standard_normal((1, 3, h, d), dtype=np.float32)
    indices = np.array([[[1, 2, 3], [4, 6, -1], [5, -3, 7]]], np.int32)  # only logical 1 is valid
    case = (q, k_pool, v_pool, indices, table)
    for got in (dsa_sparse_attention_paged(*_torch(*case), scale=0.5).numpy(),
                sparse_attention_paged_reference(*case, scale=0.5),
                _ort(attention_model(h, 1, d, d, page, 3, 0.5), _attention_feed(*case))):
        np.testing.assert_allclose(got[0, 0], np.broadcast_to(v_pool[4, 1, 0], (h, d)), rtol=1e-6)  # one key: weight 1
        assert not got[0, 1:].any()


@pytest.mark.parametrize("chunk_elements, key_elements", [(1, 1), (700, 100), (1 << 23, 700)])
def test_bodies_in_several_chunks(monkeypatch, chunk_elements, key_elements):
    # Chunks of queries, and within each the keys in spans of pages (one page a span at 1).
    from dsa_export.ops import attention_onnx, paged_onnx

    monkeypatch.setattr(attention_onnx, "CHUNK_ELEMENTS", chunk_elements)
    monkeypatch.setattr(paged_onnx, "KEY_CHUNK_ELEMENTS", key_elements)
    rng = np.random.default_rng(chunk_elements)
    h, d, page, topk = 16, 8, 3, 5
    case = _indexer_case(rng, 2, 11, h, d, page, 5, 2, 0.2)
    for causal in (0, 1):
        want = indexer_topk_paged_reference(*case, topk=topk, scale=d**-0.5, causal=bool(causal))
        assert _sets(_ort(indexer_model(h, d, page, topk, causal), _indexer_feed(*case))) == _sets(want)
    for from_keys in (False, True):
        case = _attention_case(rng, 2, 11, 4, 2, 12, 6, page, 5, 2, 7, 0.2, from_keys)
        np.testing.assert_allclose(_ort(attention_model(4, 2, 12, 6, page, 7, 0.3), _attention_feed(*case)),
                                   sparse_attention_paged_reference(*case, scale=0.3), rtol=1e-5, atol=1e-5)


def test_torch_ops_in_several_chunks(monkeypatch):
    from dsa_export.ops import torch_ops

    rng = np.random.default_rng(5)
    icase = _torch(*_indexer_case(rng, 2, 33, 16, 8, 4, 10, 2, 0.2))
    acase = _torch(*_attention_case(rng, 2, 33, 4, 1, 8, 8, 4, 10, 2, 9, 0.2, False))
    whole_idx = dsa_indexer_topk_paged(*icase, topk=5, scale=0.3)
    whole_out = dsa_sparse_attention_paged(*acase, scale=0.3)
    monkeypatch.setattr(torch_ops, "_CHUNK_BYTES", 1)
    monkeypatch.setattr(torch_ops, "_INDEXER_TILE", 1)
    monkeypatch.setattr(torch_ops, "_KEY_BLOCK", 1)
    assert torch.equal(dsa_indexer_topk_paged(*icase, topk=5, scale=0.3), whole_idx)
    torch.testing.assert_close(dsa_sparse_attention_paged(*acase, scale=0.3), whole_out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    rng = np.random.default_rng(6)
    q, pool, w, table, start, lengths = _indexer_case(rng, 2, 6, 16, 16, 4, 4, 2, 0.2)
    qt, pt = torch.from_numpy(q).to(dtype), torch.from_numpy(pool).to(dtype)
    got = dsa_indexer_topk_paged(qt, pt, torch.from_numpy(w), *_torch(table, start, lengths), topk=4, scale=0.25)
    want = indexer_topk_paged_reference(qt.float().numpy(), pt.float().numpy(), w, table, start, lengths, topk=4,
                                        scale=0.25)
    assert _sets(got.numpy()) == _sets(want)
    q, k_pool, v_pool, indices, table = _attention_case(rng, 2, 6, 8, 1, 32, 16, 4, 4, 2, 6, 0.2, False)
    qt, kt, vt = (torch.from_numpy(x).to(dtype) for x in (q, k_pool, v_pool))
    out = dsa_sparse_attention_paged(qt, kt, vt, *_torch(indices, table), scale=32**-0.5)
    assert out.dtype == dtype
    want = sparse_attention_paged_reference(qt.float().numpy(), kt.float().numpy(), vt.float().numpy(), indices, table,
                                            scale=32**-0.5)
    tol = 2e-3 if dtype == torch.float16 else 2e-2
    np.testing.assert_allclose(out.float().numpy(), want, rtol=tol, atol=tol)
    if dtype == torch.float16:  # the body in fp16 (ONNX Runtime has no bf16 MatMul on CPU)
        model = attention_model(8, 1, 32, 16, 4, 6, 32**-0.5, dtype=TensorProto.FLOAT16)
        body = _ort(model, _attention_feed(*(x.numpy() for x in (qt, kt, vt)), indices, table))
        assert body.dtype == np.float16
        np.testing.assert_allclose(body.astype(np.float32), want, rtol=tol, atol=tol)


def test_reference_evaluator_runs_the_nodes_and_onnxruntime_the_inlined_bodies():
    # onnx.reference runs the plugin-mode nodes (REFERENCE_OPS); the inlined (native) bodies run in
    # ONNX Runtime. (onnx 1.23's reference Loop concatenates the scan outputs of these bodies
    # instead of stacking them, for the contiguous DSA bodies as well, so it cannot run them.)
    import onnx.inliner
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(7)
    case = _indexer_case(rng, 2, 5, 16, 8, 3, 4, 2, 0.2)
    model = indexer_model(16, 8, 3, 4)
    want = indexer_topk_paged_reference(*case, topk=4, scale=8**-0.5)
    (node,) = ReferenceEvaluator(model, new_ops=REFERENCE_OPS).run(None, _indexer_feed(*case))
    np.testing.assert_array_equal(node, want)
    inlined = onnx.inliner.inline_local_functions(model)
    assert not any(n.domain == "dsa" for n in inlined.graph.node)
    np.testing.assert_array_equal(_ort(inlined, _indexer_feed(*case)), _ort(model, _indexer_feed(*case)))
    for from_keys in (False, True):
        case = _attention_case(rng, 2, 5, 4, 2, 8, 6, 3, 4, 2, 5, 0.2, from_keys)
        model = attention_model(4, 2, 8, 6, 3, 5, 0.3)
        want = sparse_attention_paged_reference(*case, scale=0.3)
        (node,) = ReferenceEvaluator(model, new_ops=REFERENCE_OPS).run(None, _attention_feed(*case))
        np.testing.assert_allclose(node, want, rtol=1e-6, atol=1e-6)
        inlined = onnx.inliner.inline_local_functions(model)
        assert not any(n.domain == "dsa" for n in inlined.graph.node)
        np.testing.assert_array_equal(_ort(inlined, _attention_feed(*case)), _ort(model, _attention_feed(*case)))


# ---------------------------------------------------------------------------------------------
# (b) The contiguous ops are the special case of a contiguous (or any) page arrangement.

def _as_pages(rng, cache, page, shuffle):
    """(pool, block_table) holding ``cache [B,T,...]``: k_pool = cache.reshape(B*M, page, ...) with
    the tail of the last page garbage and block_table[b] = b*M + arange(M); ``shuffle`` permutes the
    pages (and adds garbage pages) instead."""
    b, t = cache.shape[:2]
    m = -(-t // page)
    padded = np.full((b, m * page, *cache.shape[2:]), np.nan, cache.dtype)
    padded[:, :t] = cache
    pool = padded.reshape(b * m, page, *cache.shape[2:])
    table = (np.arange(b)[:, None] * m + np.arange(m)[None, :]).astype(np.int32)
    if shuffle:
        order = rng.permutation(b * m + 3)  # new page of old page j: order[j]
        shuffled = np.full((b * m + 3, *pool.shape[1:]), np.nan, cache.dtype)
        shuffled[order[: b * m]] = pool
        pool, table = shuffled, order[table].astype(np.int32)
    return pool, table


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("b,s,t,page,topk", [(2, 7, 7, 4, 4), (1, 3, 40, 8, 8), (2, 1, 33, 16, 16), (2, 5, 6, 4, 20),
                                             (3, 12, 12, 3, 12)])
def test_indexer_equals_the_contiguous_op(b, s, t, page, topk, shuffle):
    h, d = 16, 8
    rng = np.random.default_rng(t * 7 + s)
    q, k = rng.standard_normal((b, s, h, d), dtype=np.float32), rng.standard_normal((b, t, d), dtype=np.float32)
    w = rng.standard_normal((b, s, h), dtype=np.float32)
    lengths = np.array([max(0, t - 3 * i) for i in range(b)], np.int32)
    pool, table = _as_pages(rng, k, page, shuffle)
    start = np.full(b, t - s, np.int32)  # the contiguous op's query s sits at T - S + s
    for causal in (True, False):
        want = dsa_indexer_topk(*_torch(q, k, w, lengths), topk=topk, scale=d**-0.5, causal=causal).numpy()
        got = dsa_indexer_topk_paged(*_torch(q, pool, w, table, start, lengths), topk=topk, scale=d**-0.5,
                                     causal=causal).numpy()
        assert _sets(got) == _sets(want)
        body = _ort(indexer_model(h, d, page, topk, int(causal)), _indexer_feed(q, pool, w, table, start, lengths))
        assert _sets(body) == _sets(want)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("from_keys", [False, True])
@pytest.mark.parametrize("b,s,t,h,hkv,dk,dv,k_sel,page", [
    (2, 5, 12, 8, 1, 24, 16, 6, 4),  # MQA (one latent head)
    (1, 4, 9, 4, 4, 16, 8, 5, 4),  # expanded, Hkv == H
    (2, 3, 20, 6, 2, 8, 8, 7, 8),  # grouped
    (1, 1, 30, 4, 1, 16, 16, 8, 64),  # decode, one page larger than the cache
])
def test_attention_equals_the_contiguous_op(b, s, t, h, hkv, dk, dv, k_sel, page, from_keys, shuffle):
    rng = np.random.default_rng(t * 5 + s)
    q = rng.standard_normal((b, s, h, dk), dtype=np.float32)
    k = rng.standard_normal((b, t, hkv, dk), dtype=np.float32)
    v = np.zeros((b, 0, hkv, dv), np.float32) if from_keys else rng.standard_normal((b, t, hkv, dv), dtype=np.float32)
    m = -(-t // page)
    # Distinct positions < T, -1 and positions past the last page (which both ops skip).
    idx = np.stack([np.concatenate([rng.permutation(t), [m * page, m * page + 5]])[rng.permutation(t + 2)[:k_sel]]
                    for _ in range(b * s)])
    idx = np.where(rng.random(idx.shape) < 0.2, -1, idx).reshape(b, s, k_sel).astype(np.int32)
    k_pool, table = _as_pages(rng, k, page, shuffle)
    v_pool = np.zeros((0, page, hkv, dv), np.float32) if from_keys else _as_pages(rng, v, page, False)[0]
    if shuffle and not from_keys:  # the values' pages follow the keys'
        v_pool = np.full((k_pool.shape[0], page, hkv, dv), np.nan, np.float32)
        for bi in range(b):
            for j in range(m):
                rows = v[bi, j * page:(j + 1) * page]
                v_pool[table[bi, j], : rows.shape[0]] = rows
    want = dsa_sparse_attention(*_torch(q, k), None if from_keys else torch.from_numpy(v), torch.from_numpy(idx),
                                scale=dk**-0.5, v_head_dim=dv).numpy()
    got = dsa_sparse_attention_paged(*_torch(q, k_pool, v_pool, idx, table), scale=dk**-0.5).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    body = _ort(attention_model(h, hkv, dk, dv, page, k_sel, dk**-0.5), _attention_feed(q, k_pool, v_pool, idx, table))
    np.testing.assert_allclose(body, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# (c) Bounded memory: one chunk, never the sequence, and never the pool.

def _session(model):
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = False
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_bodies_hold_one_chunk_not_the_sequence():
    # As the contiguous bodies' test: S = T = 8192 through pages of 64 in a shuffled pool; the
    # bound is half of the sequence's [B,S,H,T] logits, which a whole-sequence body would exceed.
    from dsa_export.bench.memory import measure_peak_rss, peak_rss_supported

    if not peak_rss_supported():
        pytest.skip("peak RSS needs Linux procfs")
    rng = np.random.default_rng(0)
    s, h, d, topk, page = 8192, 4, 16, 16, 64
    bound = (s * h * s * 4) // 2
    q, k, w = (rng.standard_normal(x, dtype=np.float32) for x in ((1, s, h, d), (1, s, d), (1, s, h)))
    pool, table = _as_pages(rng, k, page, shuffle=True)
    start, lengths = np.zeros(1, np.int32), np.array([s], np.int32)
    sess = _session(indexer_model(h, d, page, topk))
    feed = _indexer_feed(q, pool, w, table, start, lengths)
    (idx,), peak = measure_peak_rss(lambda: sess.run(None, feed))
    assert peak < bound, peak / 2**20
    assert (idx[0, -1] >= 0).all() and (idx[0, 0, 1:] == -1).all()
    rows = [0, 17, 4000, s - 1]
    want = dsa_indexer_topk(*_torch(q, k, w, lengths), topk=topk, scale=d**-0.5).numpy()
    assert _sets(idx[:, rows]) == _sets(want[:, rows])
    qa, ka = rng.standard_normal((1, s, h, d), dtype=np.float32), rng.standard_normal((1, s, 1, d), dtype=np.float32)
    k_pool, table = _as_pages(rng, ka, page, shuffle=True)
    empty = np.zeros((0, page, 1, d), np.float32)
    sess = _session(attention_model(h, 1, d, d, page, topk, 0.25))
    feed = _attention_feed(qa, k_pool, empty, idx, table)
    (out,), peak = measure_peak_rss(lambda: sess.run(None, feed))
    assert peak < bound, peak / 2**20
    want = sparse_attention_paged_reference(qa[:, rows], k_pool, empty, idx[:, rows], table, scale=0.25)
    np.testing.assert_allclose(out[:, rows], want, rtol=1e-5, atol=1e-5)


def test_decode_reads_its_pages_not_the_pool():
    # A 256 MiB pool, two decoding rows of 16 pages each: the torch ops and the bodies stay far
    # below the pool's size (a cast, concat or gather of the whole pool would not).
    from dsa_export.bench.memory import measure_peak_rss, peak_rss_supported

    if not peak_rss_supported():
        pytest.skip("peak RSS needs Linux procfs")
    rng = np.random.default_rng(3)
    b, h, d, page, m, n_pages, topk = 2, 16, 128, 64, 16, 8192, 64
    pool_bytes = n_pages * page * d * 4
    table = rng.permutation(n_pages)[: b * m].reshape(b, m).astype(np.int32)
    pool = np.empty((n_pages, page, d), np.float32)
    pool[table.ravel()] = rng.standard_normal((b * m, page, d), dtype=np.float32)
    q, w = rng.standard_normal((b, 1, h, d), dtype=np.float32), rng.standard_normal((b, 1, h), dtype=np.float32)
    lengths = np.array([m * page - 5, 300], np.int32)
    case = (q, pool, w, table, lengths - 1, lengths)
    sess = _session(indexer_model(h, d, page, topk))
    (idx,), peak = measure_peak_rss(lambda: sess.run(None, _indexer_feed(*case)))
    assert peak < pool_bytes // 8, peak / 2**20
    dsa_indexer_topk_paged(*_torch(*case), topk=topk, scale=d**-0.5)  # torch's first call sets up ~80 MiB
    got, peak = measure_peak_rss(lambda: dsa_indexer_topk_paged(*_torch(*case), topk=topk, scale=d**-0.5))
    assert peak < pool_bytes // 8, peak / 2**20
    assert _sets(idx) == _sets(got.numpy())
    # Attention with values from the keys (MLA): 512 + 64 channels a token, 2048 pages.
    dk, dv, n_pages = 576, 512, 2048
    table = rng.permutation(n_pages)[: b * m].reshape(b, m).astype(np.int32)
    k_pool = np.empty((n_pages, page, 1, dk), np.float32)
    k_pool[table.ravel()] = rng.standard_normal((b * m, page, 1, dk), dtype=np.float32)
    pool_bytes = k_pool.nbytes
    qa = rng.standard_normal((b, 1, 16, dk), dtype=np.float32)
    empty = np.zeros((0, page, 1, dv), np.float32)
    sess = _session(attention_model(16, 1, dk, dv, page, topk, dk**-0.5))
    feed = _attention_feed(qa, k_pool, empty, idx, table)
    (out,), peak = measure_peak_rss(lambda: sess.run(None, feed))
    assert peak < pool_bytes // 8, peak / 2**20
    dsa_sparse_attention_paged(*_torch(qa, k_pool), None, *_torch(idx, table), scale=dk**-0.5, v_head_dim=dv)
    got, peak = measure_peak_rss(lambda: dsa_sparse_attention_paged(*_torch(qa, k_pool), None, *_torch(idx, table),
                                                                     scale=dk**-0.5, v_head_dim=dv))
    assert peak < pool_bytes // 8, peak / 2**20
    np.testing.assert_allclose(out, got.numpy(), rtol=1e-5, atol=1e-5)


def test_a_long_decode_step_copies_no_row_key_cache(tmp_path):
    # One row decoding after 32K keys (16 MiB of float32 index keys): no node of the indexer's
    # body writes a tensor a quarter that size (the keys are read a span of pages at a time).
    rng = np.random.default_rng(5)
    h, d, page, topk, past = 16, 128, 64, 64, 32768
    m = past // page
    table = (1 + rng.permutation(m)).reshape(1, m).astype(np.int32)
    pool = rng.standard_normal((m + 1, page, d), dtype=np.float32)
    q, w = rng.standard_normal((1, 1, h, d), dtype=np.float32), rng.standard_normal((1, 1, h), dtype=np.float32)
    case = (q, pool, w, table, np.array([past - 1], np.int32), np.array([past], np.int32))
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "step")
    sess = ort.InferenceSession(indexer_model(h, d, page, topk).SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    (idx,) = sess.run(None, _indexer_feed(*case))
    events = json.loads(Path(sess.end_profiling()).read_text())
    written = [int(e["args"].get("output_size", 0) or 0) for e in events
               if e.get("cat") == "Node" and e["args"].get("op_name") not in ("Loop", "Reshape", "Unsqueeze")]
    assert written and max(written) <= past * d * 4 // 4, max(written)
    torch_idx = dsa_indexer_topk_paged(*_torch(*case), topk=topk, scale=d**-0.5).numpy()
    assert _sets(idx) == _sets(torch_idx)


def test_bodies_use_standard_ops_with_input_shaped_loops():
    for fn in function_protos(18):
        if fn.name not in PAGED:
            continue
        ops = {n.op_type for n in _walk(fn.node)}
        assert {n.domain for n in _walk(fn.node)} <= {""}, fn.name
        assert "Loop" in ops and not ops & {"NonZero", "GatherND", "ScatterND", "ScatterElements", "If"}, fn.name
        for loop in (n for n in _walk(fn.node) if n.op_type == "Loop"):
            assert loop.input[0] and loop.input[1] == ""
    for model in (indexer_model(16, 8, 4, 3), attention_model(4, 1, 8, 6, 4, 3, 0.3)):
        onnx.checker.check_model(model, full_check=True)


def _walk(nodes):
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g.node)


# ---------------------------------------------------------------------------------------------
# (d) Plugins: the float paged ops have TensorRT plugin creators over the paged kernels (C ABI 5);
# the FP8 ones have none (tests/ops/test_paged_fp8_ops.py) and run through their function bodies.

def test_the_float_paged_ops_have_plugin_creators_and_only_the_contracts_plugins_exist():
    assert INDEXER_TOPK_PAGED.has_plugin and SPARSE_ATTENTION_PAGED.has_plugin
    fp8 = ("DSAIndexerTopKPagedFP8", "DSASparseAttentionPagedFP8")  # tests/ops/test_paged_fp8_ops.py
    assert set(PLUGIN_OPS) == set(OPS) - set(fp8) and set(PAGED) <= set(PLUGIN_OPS)
    # The plugin names the C++ sources define are exactly the contract's plugin ops: no plugin can
    # take a node of an op without one (FP8 caches) and compute it as another.
    names = set()
    for path in (REPO / "plugins").rglob("*"):
        if path.suffix in (".cpp", ".h", ".cu", ".cuh"):
            # Each plugin's I/O table names it: static constexpr char const* kNAME = "DSA...".
            names |= set(re.findall(r'^\s*static constexpr char const\* kNAME\s*=\s*"(\w+)"', path.read_text(),
                                    flags=re.M))  # code lines only, not a comment's example
    assert names == set(PLUGIN_OPS)


def test_tensorrt_rtx_builds_the_bodies_without_the_plugin_library():
    # The nodes carry plugin_namespace/plugin_version like every dsa node; with no plugin
    # registered (TensorRT-RTX has no plugins) the parser inlines the function body and the
    # builder builds it.
    batch, seq, pages, blocks = (1, 1, 2), (1, 64, 256), (1, 64, 512), (1, 8, 16)
    h, d, page = 16, 32, 16
    ok, log = rtx_build(indexer_model(h, d, page, 8),
                        {"q": _ranges(batch, seq, h, d), "k_pool": _ranges(pages, page, d), "w": _ranges(batch, seq, h),
                         "block_table": _ranges(batch, blocks), "query_start": _ranges(batch),
                         "lengths": _ranges(batch)})
    assert ok, log
    for v_pages in (pages, 0):  # a value pool, and values from the keys
        ranges = {"q": _ranges(batch, seq, h, d), "k_pool": _ranges(pages, page, 1, d),
                  "v_pool": _ranges(v_pages, page, 1, 24), "indices": _ranges(batch, seq, 6),
                  "block_table": _ranges(batch, blocks)}
        ok, log = rtx_build(attention_model(h, 1, d, 24, page, 6, 0.3), ranges)
        assert ok, (v_pages, log)


def _ranges(*dims):
    """(min, opt, max) shapes from per-dim ints or (min, opt, max) triples."""
    return tuple(tuple(x[i] if isinstance(x, tuple) else x for x in dims) for i in range(3))


# ---------------------------------------------------------------------------------------------
# The torch side: fake kernels, argument checks, export to dsa nodes.

def test_fake_kernels_pass_opcheck():
    rng = np.random.default_rng(8)
    icase = _torch(*_indexer_case(rng, 2, 3, 16, 8, 4, 3, 1, 0.2))
    torch.library.opcheck(torch.ops.dsa.indexer_topk_paged.default, (*icase, 3, 0.3, True),
                          test_utils=("test_schema", "test_faketensor"))
    for from_keys in (False, True):
        acase = _torch(*_attention_case(rng, 2, 3, 4, 2, 8, 6, 4, 3, 1, 5, 0.2, from_keys))
        torch.library.opcheck(torch.ops.dsa.sparse_attention_paged.default, (*acase, 0.3),
                              test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("change,message", [
    (lambda c: {**c, "k_pool": c["k_pool"][..., :4]}, "does not match"),
    (lambda c: {**c, "k_pool": c["k_pool"][:0]}, "at least one page"),
    (lambda c: {**c, "block_table": c["block_table"][:1]}, "block_table"),
    (lambda c: {**c, "block_table": c["block_table"].float()}, "block_table"),
    (lambda c: {**c, "lengths": c["lengths"][:1]}, "lengths"),
    (lambda c: {**c, "k_pool": c["k_pool"].half()}, "share"),
])
def test_indexer_arguments_are_checked(change, message):
    keys = ("q", "k_pool", "w", "block_table", "query_start", "lengths")
    case = dict(zip(keys, _torch(*_indexer_case(np.random.default_rng(0), 2, 3, 16, 8, 4, 3, 1, 0.0))))
    with pytest.raises(ValueError, match=message):
        dsa_indexer_topk_paged(**change(case), topk=2, scale=0.3)


def test_attention_arguments_are_checked():
    q, k_pool, v_pool, indices, table = _torch(*_attention_case(np.random.default_rng(0), 2, 3, 4, 2, 8, 6, 4, 3, 1,
                                                                5, 0.0, False))
    with pytest.raises(ValueError, match="same pages"):
        dsa_sparse_attention_paged(q, k_pool, v_pool[:, :2], indices, table, scale=0.3)
    with pytest.raises(ValueError, match="v_head_dim"):
        dsa_sparse_attention_paged(q, k_pool, None, indices, table, scale=0.3, v_head_dim=9)
    with pytest.raises(ValueError, match="multiple"):
        dsa_sparse_attention_paged(q[:, :, :3], k_pool, v_pool, indices, table, scale=0.3)
    with pytest.raises(ValueError, match="block_table"):
        dsa_sparse_attention_paged(q, k_pool, v_pool, indices, table[:, None], scale=0.3)
    # values from the keys: the same result as a value pool holding the keys' first channels
    torch.testing.assert_close(dsa_sparse_attention_paged(q, k_pool, None, indices, table, scale=0.3, v_head_dim=6),
                               dsa_sparse_attention_paged(q, k_pool, k_pool[..., :6].contiguous(), indices, table,
                                                          scale=0.3))


class PagedDecode(torch.nn.Module):
    """One paged indexer feeding one paged attention (values from keys), as a decode step would."""

    def forward(self, q_index, index_pool, w, q, kv_pool, block_table, query_start, lengths):
        indices = dsa_indexer_topk_paged(q_index, index_pool, w, block_table, query_start, lengths, topk=6,
                                         scale=0.125)
        return dsa_sparse_attention_paged(q, kv_pool, None, indices, block_table, scale=0.25, v_head_dim=8)


def test_export_emits_the_paged_nodes_and_matches_torch():
    register_schemas()
    rng = np.random.default_rng(9)
    b, s, page, m = 2, 3, 4, 5

    def inputs(b, s, n_extra, seed):
        rng = np.random.default_rng(seed)
        table, n_pages = _table(rng, b, m, n_extra)
        return _torch(rng.standard_normal((b, s, 16, 8), dtype=np.float32),
                      _pool(rng, n_pages, page, (8,), table), rng.standard_normal((b, s, 16), dtype=np.float32),
                      rng.standard_normal((b, s, 4, 16), dtype=np.float32), _pool(rng, n_pages, page, (1, 16), table),
                      table, rng.integers(0, 12, size=b).astype(np.int32), np.full(b, m * page - 2, np.int32))

    batch, seq = torch.export.Dim("batch", min=2), torch.export.Dim("seq", min=2)
    pages = torch.export.Dim("pages", min=2)
    shapes = ({0: batch, 1: seq}, {0: pages}, {0: batch, 1: seq}, {0: batch, 1: seq}, {0: pages}, {0: batch},
              {0: batch}, {0: batch})
    program = torch.onnx.export(PagedDecode().eval(), inputs(b, s, 2, 0), dynamic_shapes=shapes,
                                custom_translation_table=translation_table(), opset_version=18, dynamo=True,
                                verbose=False)
    model = program.model_proto
    nodes = [n for n in model.graph.node if n.domain == "dsa"]
    assert [n.op_type for n in nodes] == list(PAGED)
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["plugin_namespace"] == b"dsa" and attrs["plugin_version"] == b"1"
    model.functions.extend(function_protos(18))
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s, extra in ((2, 3, 2), (3, 5, 6)):  # the traced shapes and others
        args = inputs(b, s, extra, rng.integers(1 << 30))
        with torch.no_grad():
            want = PagedDecode()(*args).numpy()
        (got,) = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
