"""The ONNX function bodies against the references, through ONNX Runtime and onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from dsa_export.ops.attention_onnx import use_attention_body
from dsa_export.ops.contract import INDEXER_TOPK, PLUGIN_ATTRIBUTES, SPARSE_ATTENTION
from dsa_export.ops.onnx_ops import function_protos, register_schemas, use_onnxruntime_bodies
from dsa_export.ops.reference import REFERENCE_OPS, indexer_topk_reference, sparse_attention_reference
from tests.build_fixtures import rtx_build

FLOAT = TensorProto.FLOAT


def _model(nodes, inputs, outputs, with_functions=True):
    register_schemas()
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dsa", 1)],
                              functions=function_protos(18) if with_functions else None)
    model.ir_version = 10
    return model


def indexer_model(h, d, topk, causal=1, dtype=FLOAT):
    node = helper.make_node("DSAIndexerTopK", ["q", "k", "w", "lengths"], ["indices"], domain="dsa",
                            topk=topk, scale=d**-0.5, causal=causal, **PLUGIN_ATTRIBUTES)
    return _model([node], [helper.make_tensor_value_info("q", dtype, ["B", "S", h, d]),
                           helper.make_tensor_value_info("k", dtype, ["B", "T", d]),
                           helper.make_tensor_value_info("w", dtype, ["B", "S", h]),
                           helper.make_tensor_value_info("lengths", TensorProto.INT32, ["B"])],
                  [helper.make_tensor_value_info("indices", TensorProto.INT32, ["B", "S", topk])])


def attention_model(h, hkv, dk, dv, k_sel, scale, dtype=FLOAT, v_rows="T", body="static"):
    """One DSASparseAttention node; ``v_rows="Tv"`` gives v its own row dim (0 rows: values from keys);
    ``body``: the function body's construction (``static``, the one files carry, or ``trimmed``)."""
    node = helper.make_node("DSASparseAttention", ["q", "k", "v", "indices"], ["out"], domain="dsa",
                            scale=scale, **PLUGIN_ATTRIBUTES)
    model = _model([node], [helper.make_tensor_value_info("q", dtype, ["B", "S", h, dk]),
                            helper.make_tensor_value_info("k", dtype, ["B", "T", hkv, dk]),
                            helper.make_tensor_value_info("v", dtype, ["B", v_rows, hkv, dv]),
                            helper.make_tensor_value_info("indices", TensorProto.INT32, ["B", "S", k_sel])],
                   [helper.make_tensor_value_info("out", dtype, ["B", "S", h, dv])])
    assert use_attention_body(model, body)
    return model


def _run(model, feed):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def _sets(x):
    return [set(int(i) for i in row if i >= 0) for row in x.reshape(-1, x.shape[-1])]


def test_schemas_and_full_checker():
    for model in (indexer_model(16, 8, 4), attention_model(4, 1, 8, 6, 3, 0.3),
                  attention_model(4, 1, 8, 6, 3, 0.3, body="trimmed")):
        onnx.checker.check_model(model, full_check=True)  # Loops without a cond input included
    for spec in (INDEXER_TOPK, SPARSE_ATTENTION):
        schema = onnx.defs.get_schema(spec.name, 1, "dsa")
        assert {a for a in schema.attributes} >= {"plugin_namespace", "plugin_version"}


def test_function_bodies_use_standard_ops_only():
    for fn in function_protos(18):
        assert {n.domain for n in fn.node} <= {""}
        # The body never gathers [B,S,K,D]: there is no Gather/GatherND on the key/value tensors.
        assert not any(n.op_type in ("GatherND",) for n in fn.node)


def _loops(nodes):
    for node in nodes:
        if node.op_type == "Loop":
            yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _loops(attr.g.node)


def test_every_loop_has_a_trip_count_and_no_condition():
    # TensorRT's parser warns about Loops with both, and, with no cond input, does not bind the
    # body's cond input: the body's cond output must not read it.
    from dsa_export.ops.attention_onnx import sparse_attention_function
    from dsa_export.ops.moe_onnx import moe_experts_fp8_function

    functions = [*function_protos(21), sparse_attention_function(21, "trimmed"), moe_experts_fp8_function(21, "stack")]
    seen = 0
    for fn in functions:
        for loop in _loops(fn.node):
            seen += 1
            assert loop.input[0] and loop.input[1] == "", (fn.name, list(loop.input))
            body = next(a.g for a in loop.attribute if a.name == "body")
            assert not any(body.input[1].name in n.input for n in _walk(body.node)), fn.name
    assert seen >= 7


def _walk(nodes):
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g.node)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), s=st.integers(1, 9), extra=st.integers(0, 12), topk=st.integers(1, 24),
       causal=st.sampled_from([0, 1]), seed=st.integers(0, 2**16), short=st.booleans())
def test_indexer_body_matches_reference(b, s, extra, topk, causal, seed, short):
    h, d = 16, 8
    t = s + extra
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, s, h, d), dtype=np.float32)
    k = rng.standard_normal((b, t, d), dtype=np.float32)
    w = rng.standard_normal((b, s, h), dtype=np.float32)
    lengths = (rng.integers(0, t + 1, size=b) if short else np.full(b, t)).astype(np.int32)
    got = _run(indexer_model(h, d, topk, causal), {"q": q, "k": k, "w": w, "lengths": lengths})
    want = indexer_topk_reference(q, k, w, lengths, topk=topk, scale=d**-0.5, causal=bool(causal))
    assert got.shape == want.shape
    assert _sets(got) == _sets(want)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), s=st.integers(1, 6), t=st.integers(1, 16), group=st.sampled_from([1, 2, 4]),
       hkv=st.sampled_from([1, 2]), k_sel=st.integers(1, 10), seed=st.integers(0, 2**16),
       body=st.sampled_from(["static", "trimmed"]))
def test_attention_body_matches_reference(b, s, t, group, hkv, k_sel, seed, body):
    dk, dv = 8, 6
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, s, hkv * group, dk), dtype=np.float32)
    k = rng.standard_normal((b, t, hkv, dk), dtype=np.float32)
    v = rng.standard_normal((b, t, hkv, dv), dtype=np.float32)
    idx = np.stack([rng.permutation(t + 3)[:k_sel] if k_sel <= t + 3 else np.arange(k_sel) for _ in range(b * s)])
    idx = np.where(rng.random(idx.shape) < 0.2, -1, idx).reshape(b, s, k_sel).astype(np.int32)
    got = _run(attention_model(hkv * group, hkv, dk, dv, k_sel, 0.35, body=body),
               {"q": q, "k": k, "v": v, "indices": idx})
    want = sparse_attention_reference(q, k, v, idx, scale=0.35)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_body_fp16():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 4, 16)).astype(np.float16)
    k = rng.standard_normal((1, 12, 1, 16)).astype(np.float16)
    v = rng.standard_normal((1, 12, 1, 8)).astype(np.float16)
    idx = np.array([[[0, -1, -1], [0, 1, -1], [2, 0, 1], [3, 1, 2]]], dtype=np.int32)
    got = _run(attention_model(4, 1, 16, 8, 3, 0.25, TensorProto.FLOAT16), {"q": q, "k": k, "v": v, "indices": idx})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), sparse_attention_reference(q, k, v, idx, scale=0.25).astype(np.float32),
                               rtol=2e-3, atol=2e-3)


def test_reference_evaluator_runs_the_plugin_nodes():
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(4)
    q, k, w = (rng.standard_normal(s, dtype=np.float32) for s in ((2, 5, 16, 8), (2, 7, 8), (2, 5, 16)))
    model = indexer_model(16, 8, 3)
    evaluator = ReferenceEvaluator(model, new_ops=REFERENCE_OPS)
    lengths = np.array([7, 4], np.int32)
    (got,) = evaluator.run(None, {"q": q, "k": k, "w": w, "lengths": lengths})
    np.testing.assert_array_equal(got, indexer_topk_reference(q, k, w, lengths, topk=3, scale=8**-0.5))
    # and ONNX Runtime (function body) agrees with it
    assert _sets(_run(model, {"q": q, "k": k, "w": w, "lengths": lengths})) == _sets(got)


def _indices(rng, b, s, t, k_sel, invalid=0.2):
    idx = np.stack([rng.permutation(t + 3)[:k_sel] if k_sel <= t + 3 else np.arange(k_sel) for _ in range(b * s)])
    return np.where(rng.random(idx.shape) < invalid, -1, idx).reshape(b, s, k_sel).astype(np.int32)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), s=st.integers(1, 6), t=st.integers(1, 16), group=st.sampled_from([1, 2, 4]),
       hkv=st.sampled_from([1, 2]), k_sel=st.integers(1, 10), dv=st.integers(1, 8), seed=st.integers(0, 2**16),
       body=st.sampled_from(["static", "trimmed"]))
def test_attention_body_takes_values_from_keys(b, s, t, group, hkv, k_sel, dv, seed, body):
    # An empty v ([B,0,Hkv,Dv]) means the values are the first Dv channels of the keys (MLA).
    dk = 8
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, s, hkv * group, dk), dtype=np.float32)
    k = rng.standard_normal((b, t, hkv, dk), dtype=np.float32)
    idx = _indices(rng, b, s, t, k_sel)
    empty = np.zeros((b, 0, hkv, dv), np.float32)
    got = _run(attention_model(hkv * group, hkv, dk, dv, k_sel, 0.35, v_rows="Tv", body=body),
               {"q": q, "k": k, "v": empty, "indices": idx})
    np.testing.assert_allclose(got, sparse_attention_reference(q, k, empty, idx, scale=0.35), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, sparse_attention_reference(q, k, k[..., :dv].copy(), idx, scale=0.35),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_elements", [1, 700])
def test_bodies_in_several_chunks_match_the_references(monkeypatch, chunk_elements):
    # A budget of 1 value gives one query row per chunk; 700 gives chunks of a few rows with a
    # partial last chunk (its padding rows repeat the last query and are dropped).
    from dsa_export.ops import attention_onnx

    monkeypatch.setattr(attention_onnx, "CHUNK_ELEMENTS", chunk_elements)
    rng = np.random.default_rng(chunk_elements)
    b, s, t, h, d, topk = 2, 11, 14, 16, 8, 5
    q, k, w = (rng.standard_normal(x, dtype=np.float32) for x in ((b, s, h, d), (b, t, d), (b, s, h)))
    lengths = np.array([t, 9], np.int32)
    for causal in (0, 1):
        got = _run(indexer_model(h, d, topk, causal), {"q": q, "k": k, "w": w, "lengths": lengths})
        want = indexer_topk_reference(q, k, w, lengths, topk=topk, scale=d**-0.5, causal=bool(causal))
        assert _sets(got) == _sets(want)
    qa = rng.standard_normal((b, s, 4, 12), dtype=np.float32)
    ka = rng.standard_normal((b, t, 2, 12), dtype=np.float32)
    va = rng.standard_normal((b, t, 2, 6), dtype=np.float32)
    idx = _indices(rng, b, s, t, 7)
    for body in ("static", "trimmed"):
        got = _run(attention_model(4, 2, 12, 6, 7, 0.3, body=body), {"q": qa, "k": ka, "v": va, "indices": idx})
        np.testing.assert_allclose(got, sparse_attention_reference(qa, ka, va, idx, scale=0.3), rtol=1e-5, atol=1e-5)


def test_native_inlined_bodies_match():
    import onnx.inliner

    rng = np.random.default_rng(7)
    q, k, w = (rng.standard_normal(x, dtype=np.float32) for x in ((1, 9, 16, 8), (1, 9, 8), (1, 9, 16)))
    feed = {"q": q, "k": k, "w": w, "lengths": np.array([9], np.int32)}
    model = indexer_model(16, 8, 4)
    inlined = onnx.inliner.inline_local_functions(model)
    assert not any(n.domain == "dsa" for n in inlined.graph.node)
    np.testing.assert_array_equal(_run(inlined, feed), _run(model, feed))
    qa, ka = rng.standard_normal((1, 9, 4, 8), dtype=np.float32), rng.standard_normal((1, 9, 1, 8), dtype=np.float32)
    feed = {"q": qa, "k": ka, "v": np.zeros((1, 0, 1, 6), np.float32), "indices": _indices(rng, 1, 9, 9, 5)}
    model = attention_model(4, 1, 8, 6, 5, 0.3, v_rows="Tv")
    np.testing.assert_array_equal(_run(onnx.inliner.inline_local_functions(model), feed), _run(model, feed))


def test_bodies_hold_one_chunk_not_the_sequence():
    # S = T = 8192: the former mask-based bodies held [B,S,H,T] logits (1 GiB here) and a [B,S,T]
    # mask; the chunked ones hold about one chunk (CHUNK_ELEMENTS float32 values per tensor), a
    # few such tensors at once: 37-133 MiB on one machine, 367 MiB on another (the allocator keeps
    # freed chunks), so the bound is half the sequence's logits, which the former bodies exceed.
    from dsa_export.bench.memory import measure_peak_rss, peak_rss_supported

    if not peak_rss_supported():
        pytest.skip("peak RSS needs Linux procfs")
    rng = np.random.default_rng(0)
    s, h, d, topk = 8192, 4, 16, 16

    def session(model):
        options = ort.SessionOptions()
        options.enable_cpu_mem_arena = False
        options.intra_op_num_threads = 1
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    bound = (s * h * s * 4) // 2
    q, k, w = (rng.standard_normal(x, dtype=np.float32) for x in ((1, s, h, d), (1, s, d), (1, s, h)))
    sess = session(indexer_model(h, d, topk))
    feed = {"q": q, "k": k, "w": w, "lengths": np.array([s], np.int32)}
    (idx,), peak = measure_peak_rss(lambda: sess.run(None, feed))
    assert peak < bound, peak / 2**20
    assert (idx[0, -1] >= 0).all() and (idx[0, 0, 1:] == -1).all()
    qa, ka = rng.standard_normal((1, s, h, d), dtype=np.float32), rng.standard_normal((1, s, 1, d), dtype=np.float32)
    feed = {"q": qa, "k": ka, "v": np.zeros((1, 0, 1, d), np.float32), "indices": idx}
    rows = [0, 17, s - 1]
    want = sparse_attention_reference(qa[:, rows], ka, np.zeros((1, 0, 1, d)), idx[:, rows], scale=0.25)
    for body in ("static", "trimmed"):  # the file's body and the one our ONNX Runtime sessions run
        sess = session(attention_model(h, 1, d, d, topk, 0.25, v_rows="Tv", body=body))
        (out,), peak = measure_peak_rss(lambda: sess.run(None, feed))
        assert peak < bound, (body, peak / 2**20)
        np.testing.assert_allclose(out[:, rows], want, rtol=1e-5, atol=1e-5)


# TensorRT-RTX (CPU-only here): parse and AOT-build the chunked bodies.

_rtx_build = rtx_build


def _ranges(**dims):
    """name -> (min, opt, max) shapes, from per-input lists of (min, opt, max) per dim."""
    return {name: tuple(tuple(d[i] if isinstance(d, tuple) else d for d in shape) for i in range(3))
            for name, shape in dims.items()}


def test_tensorrt_rtx_builds_the_chunked_bodies():
    batch, seq = (1, 1, 2), (1, 64, 512)
    ok, log = _rtx_build(indexer_model(16, 8, 4), _ranges(q=[batch, seq, 16, 8], k=[batch, seq, 8],
                                                          w=[batch, seq, 16], lengths=[batch]))
    assert ok, log
    for v_rows, v_seq in (("T", seq), ("Tv", 0)):  # the 4-input form and values from keys
        ranges = _ranges(q=[batch, seq, 16, 24], k=[batch, seq, 1, 24], v=[batch, v_seq, 1, 16],
                         indices=[batch, seq, 6])
        model = attention_model(16, 1, 24, 16, 6, 0.3, v_rows=v_rows)
        ok, log = _rtx_build(model, ranges)  # the static body, the one files carry
        assert ok, (v_rows, log)
        # The trimmed body (ONNX Runtime sessions swap it in) has an index-dependent shape inside
        # its Loop: the parser takes it and the builder fails.
        assert use_onnxruntime_bodies(model)
        assert not _rtx_build(model, ranges)[0]


@pytest.mark.parametrize("body", ["trimmed", "static"])
def test_both_attention_bodies_match_the_reference_with_padded_rows(body):
    # Causal prefill rows: query s has min(s+1, K) keys, the rest -1 at the end (what the indexer
    # gives), plus a chunk whose rows have no valid index at all.
    rng = np.random.default_rng(3)
    b, s, h, dk, dv, k_sel = 2, 40, 4, 8, 6, 16
    q = rng.standard_normal((b, s, h, dk), dtype=np.float32)
    k = rng.standard_normal((b, s, 1, dk), dtype=np.float32)
    v = rng.standard_normal((b, s, 1, dv), dtype=np.float32)
    idx = np.full((b, s, k_sel), -1, np.int32)
    for bi in range(b):
        for si in range(s):
            keys = rng.permutation(si + 1)[:k_sel]
            idx[bi, si, :keys.size] = keys
    idx[1, :3] = -1
    model = attention_model(h, 1, dk, dv, k_sel, 0.35)
    assert use_attention_body(model, body)
    got = _run(model, {"q": q, "k": k, "v": v, "indices": idx})
    np.testing.assert_allclose(got, sparse_attention_reference(q, k, v, idx, scale=0.35), rtol=1e-5, atol=1e-5)
    assert not got[1, :3].any()
