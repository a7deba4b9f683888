"""The ONNX function bodies against the references, through ONNX Runtime and onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from dsa_export.ops.contract import INDEXER_TOPK, PLUGIN_ATTRIBUTES, SPARSE_ATTENTION
from dsa_export.ops.onnx_ops import function_protos, register_schemas
from dsa_export.ops.reference import REFERENCE_OPS, indexer_topk_reference, sparse_attention_reference

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


def attention_model(h, hkv, dk, dv, k_sel, scale, dtype=FLOAT):
    node = helper.make_node("DSASparseAttention", ["q", "k", "v", "indices"], ["out"], domain="dsa",
                            scale=scale, **PLUGIN_ATTRIBUTES)
    return _model([node], [helper.make_tensor_value_info("q", dtype, ["B", "S", h, dk]),
                           helper.make_tensor_value_info("k", dtype, ["B", "T", hkv, dk]),
                           helper.make_tensor_value_info("v", dtype, ["B", "T", hkv, dv]),
                           helper.make_tensor_value_info("indices", TensorProto.INT32, ["B", "S", k_sel])],
                  [helper.make_tensor_value_info("out", dtype, ["B", "S", h, dv])])


def _run(model, feed):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def _sets(x):
    return [set(int(i) for i in row if i >= 0) for row in x.reshape(-1, x.shape[-1])]


def test_schemas_and_full_checker():
    model = indexer_model(16, 8, 4)
    onnx.checker.check_model(model, full_check=True)
    for spec in (INDEXER_TOPK, SPARSE_ATTENTION):
        schema = onnx.defs.get_schema(spec.name, 1, "dsa")
        assert {a for a in schema.attributes} >= {"plugin_namespace", "plugin_version"}


def test_function_bodies_use_standard_ops_only():
    for fn in function_protos(18):
        assert {n.domain for n in fn.node} <= {""}
        # The body never gathers [B,S,K,D]: there is no Gather/GatherND on the key/value tensors.
        assert not any(n.op_type in ("GatherND",) for n in fn.node)


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
       hkv=st.sampled_from([1, 2]), k_sel=st.integers(1, 10), seed=st.integers(0, 2**16))
def test_attention_body_matches_reference(b, s, t, group, hkv, k_sel, seed):
    dk, dv = 8, 6
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, s, hkv * group, dk), dtype=np.float32)
    k = rng.standard_normal((b, t, hkv, dk), dtype=np.float32)
    v = rng.standard_normal((b, t, hkv, dv), dtype=np.float32)
    idx = np.stack([rng.permutation(t + 3)[:k_sel] if k_sel <= t + 3 else np.arange(k_sel) for _ in range(b * s)])
    idx = np.where(rng.random(idx.shape) < 0.2, -1, idx).reshape(b, s, k_sel).astype(np.int32)
    got = _run(attention_model(hkv * group, hkv, dk, dv, k_sel, 0.35), {"q": q, "k": k, "v": v, "indices": idx})
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
