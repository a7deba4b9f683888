"""The routed-experts ops: torch op, NumPy reference, ONNX bodies (ONNX Runtime, onnx.reference,
TensorRT-RTX) against each other, with skipped slots, idle experts, repeated experts and FP8."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx.inliner
import onnxruntime as ort
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from dsa_export.errors import DSAUserError
from dsa_export.ops import dsa_moe_experts, dsa_moe_experts_fp8
from dsa_export.ops.contract import MOE_EXPERTS, MOE_EXPERTS_FP8, PLUGIN_ATTRIBUTES
from dsa_export.ops.moe_onnx import (
    moe_experts_fp8_function,
    moe_experts_function,
    use_fp8_body,
    use_moe_body,
)
from dsa_export.ops.onnx_ops import function_protos, register_schemas
from dsa_export.ops.reference import (
    BODY_OPS,
    REFERENCE_OPS,
    moe_experts_fp8_reference,
    moe_experts_reference,
)
from tests.build_fixtures import rtx_build

FLOAT, FP8 = TensorProto.FLOAT, TensorProto.FLOAT8E4M3FN
_ONNX_TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def routing(n, k, e, gen, skipped=0.2, repeated=True):
    """Random int32 ids with -1 and >= E slots, a row repeating an expert, and float32 weights."""
    ids = torch.randint(0, e, (n, k), generator=gen)
    drop = torch.rand(n, k, generator=gen) < skipped
    ids = torch.where(drop, torch.where(torch.rand(n, k, generator=gen) < 0.5, -1, e), ids)
    if repeated and k > 1 and n > 1:
        ids[1, :2] = ids[1, 0].clamp(min=0)
    return ids.to(torch.int32), torch.rand(n, k, generator=gen)


def experts(e, inter, h, gen, dtype=torch.float32):
    return ((torch.randn(e, 2 * inter, h, generator=gen) * h**-0.5).to(dtype),
            (torch.randn(e, h, inter, generator=gen) * inter**-0.5).to(dtype))


def fp8_experts(e, inter, h, block, gen):
    gate_up = (torch.randn(e, 2 * inter, h, generator=gen) * 8).to(torch.float8_e4m3fn)
    down = (torch.randn(e, h, inter, generator=gen) * 8).to(torch.float8_e4m3fn)

    def blocks(n):
        return -(-n // block)

    gate_up_scale = torch.rand(e, blocks(2 * inter), blocks(h), generator=gen) * h**-0.5 / 8
    down_scale = torch.rand(e, blocks(h), blocks(inter), generator=gen) * inter**-0.5 / 8
    return gate_up, down, gate_up_scale, down_scale


def as_numpy_fp8(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)


def _np(*tensors):
    return [t.numpy() for t in tensors]


MOE_CASES = [
    # N, K, E, I, H
    (13, 3, 7, 8, 16),  # K > 1, a few idle experts
    (5, 2, 32, 8, 16),  # many idle experts
    (1, 4, 6, 4, 8),  # a decode step
    (40, 1, 4, 16, 8),  # top-1, every expert busy
]


@pytest.mark.parametrize("case", MOE_CASES)
def test_torch_op_matches_reference(case):
    n, k, e, inter, h = case
    gen = torch.Generator().manual_seed(sum(case))
    x = torch.randn(n, h, generator=gen)
    ids, weights = routing(n, k, e, gen)
    gate_up, down = experts(e, inter, h, gen)
    got = dsa_moe_experts(x, ids, weights, gate_up, down)
    want = moe_experts_reference(*_np(x, ids, weights, gate_up, down))
    assert got.shape == (n, h) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_skipped_slots_and_repeated_experts_follow_the_contract():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, generator=gen)
    gate_up, down = experts(4, 4, 8, gen)
    weights = torch.tensor([[0.5, 0.25], [1.0, 2.0], [0.3, 0.7]])
    ids = torch.tensor([[-1, 9], [2, 2], [1, -5]], dtype=torch.int32)
    out = dsa_moe_experts(x, ids, weights, gate_up, down)
    assert torch.count_nonzero(out[0]) == 0  # every slot skipped
    single = dsa_moe_experts(x[1:2], torch.tensor([[2]], dtype=torch.int32), torch.tensor([[1.0]]), gate_up, down)
    torch.testing.assert_close(out[1], 3.0 * single[0])  # expert 2 twice: weights 1 + 2
    torch.testing.assert_close(out[2], dsa_moe_experts(x[2:], ids[2:, :1], weights[2:, :1], gate_up, down)[0])


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_torch_op_low_precision_accumulates_in_float32(dtype, tol):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(17, 32, generator=gen).to(dtype)
    ids, weights = routing(17, 4, 8, gen)
    gate_up, down = experts(8, 16, 32, gen, dtype)
    got = dsa_moe_experts(x, ids, weights, gate_up, down)  # float32 routing weights, as the routers give
    assert got.dtype == dtype
    want = moe_experts_reference(x.float().numpy(), ids.numpy(), weights.numpy(), gate_up.float().numpy(),
                                 down.float().numpy())
    np.testing.assert_allclose(got.float().numpy(), want, rtol=tol, atol=tol)
    same = dsa_moe_experts(x, ids, weights.to(dtype), gate_up, down)  # or weights in x's dtype
    np.testing.assert_allclose(same.float().numpy(), want, rtol=3 * tol, atol=3 * tol)


def test_chunked_rows_give_the_same_result(monkeypatch):
    from dsa_export.ops import torch_ops

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(30, 16, generator=gen)
    ids, weights = routing(30, 3, 5, gen)
    gate_up, down = experts(5, 8, 16, gen)
    whole = dsa_moe_experts(x, ids, weights, gate_up, down)
    monkeypatch.setattr(torch_ops, "_CHUNK_BYTES", 1)  # one token row per GEMM
    torch.testing.assert_close(dsa_moe_experts(x, ids, weights, gate_up, down), whole)


@pytest.mark.parametrize("inter,h,block", [(16, 32, 8), (12, 20, 8)])  # whole and partial blocks
def test_fp8_op_matches_reference_and_dequantizes_one_active_expert_at_a_time(monkeypatch, inter, h, block):
    from dsa_export.ops import torch_ops

    gen = torch.Generator().manual_seed(inter)
    e = 6
    x = torch.randn(9, h, generator=gen)
    ids, weights = routing(9, 2, e, gen)
    ids[ids == 3] = 0  # expert 3 stays idle
    gate_up, down, gus, dns = fp8_experts(e, inter, h, block, gen)
    calls = []
    original = torch_ops.dequantize_fp8_blocks

    def spy(weight, scale, block_size):
        calls.append(tuple(weight.shape))
        return original(weight, scale, block_size)

    monkeypatch.setattr(torch_ops, "dequantize_fp8_blocks", spy)
    got = dsa_moe_experts_fp8(x, ids, weights, gate_up, down, gus, dns, block_size=block)
    want = moe_experts_fp8_reference(x.numpy(), ids.numpy(), weights.numpy(), as_numpy_fp8(gate_up),
                                     as_numpy_fp8(down), gus.numpy(), dns.numpy(), block_size=block)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    active = {int(i) for i in ids.reshape(-1) if 0 <= i < e}
    assert 3 not in active
    assert sorted(calls) == sorted([(2 * inter, h), (h, inter)] * len(active))


def test_fake_kernels_pass_opcheck():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 8, generator=gen)
    ids, weights = routing(6, 2, 4, gen)
    gate_up, down = experts(4, 4, 8, gen)
    torch.library.opcheck(torch.ops.dsa.moe_experts.default, (x, ids, weights, gate_up, down, "silu"),
                          test_utils=("test_schema", "test_faketensor"))
    args = (x, ids, weights, *fp8_experts(4, 4, 8, 4, gen), 4, "silu")
    # (opcheck's schema test perturbs the inputs arithmetically, which float8 tensors do not support.)
    torch.library.opcheck(torch.ops.dsa.moe_experts_fp8.default, args, test_utils=("test_faketensor",))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"activation": "gelu"}, "activation 'gelu' is not supported"),
        ({"gate_up": torch.zeros(4, 8, 9)}, "do not match"),
        ({"topk_weights": torch.zeros(6, 3)}, "shape of topk_ids"),
        ({"gate_up": torch.zeros(4, 8, 8, dtype=torch.float16)}, "must have x's dtype"),
    ],
)
def test_bad_arguments_are_user_errors(kwargs, message):
    gen = torch.Generator().manual_seed(4)
    ids, weights = routing(6, 2, 4, gen)
    gate_up, down = experts(4, 4, 8, gen)
    args = {"x": torch.zeros(6, 8), "topk_ids": ids, "topk_weights": weights, "gate_up": gate_up, "down": down}
    args.update(kwargs)
    with pytest.raises(DSAUserError, match=message):
        dsa_moe_experts(**args)


def test_fp8_scale_shape_is_checked():
    gen = torch.Generator().manual_seed(5)
    ids, weights = routing(3, 2, 4, gen)
    gate_up, down, gus, dns = fp8_experts(4, 8, 16, 8, gen)
    with pytest.raises(DSAUserError, match=r"gate_up_scale .* must be \[E, ceil\(2I/bs\), ceil\(H/bs\)\]"):
        dsa_moe_experts_fp8(torch.zeros(3, 16), ids, weights, gate_up, down, gus, dns, block_size=4)


# ONNX: the function bodies.


def moe_model(e, inter, h, k, dtype=np.float32, weights=None, opset=18):
    """A one-node DSAMoEExperts model; expert weights are graph inputs unless given as initializers."""
    register_schemas()
    elem = _ONNX_TYPES[dtype]
    node = helper.make_node(MOE_EXPERTS.name, [t.name for t in MOE_EXPERTS.inputs], ["out"], domain="dsa",
                            activation="silu", **PLUGIN_ATTRIBUTES)
    inputs = [helper.make_tensor_value_info("x", elem, ["N", h]),
              helper.make_tensor_value_info("topk_ids", TensorProto.INT32, ["N", k]),
              helper.make_tensor_value_info("topk_weights", FLOAT, ["N", k])]
    inits = []
    if weights is None:
        inputs += [helper.make_tensor_value_info("gate_up", elem, [e, 2 * inter, h]),
                   helper.make_tensor_value_info("down", elem, [e, h, inter])]
    else:
        inits = [numpy_helper.from_array(weights[0], "gate_up"), numpy_helper.from_array(weights[1], "down")]
    return _model(node, inputs, elem, h, inits, opset, "expert")


def fp8_model(gate_up, down, gus, dns, k, block, body="expert", opset=21):
    register_schemas()
    h = gate_up.shape[2]
    node = helper.make_node(MOE_EXPERTS_FP8.name, [t.name for t in MOE_EXPERTS_FP8.inputs], ["out"], domain="dsa",
                            activation="silu", block_size=block, **PLUGIN_ATTRIBUTES)
    inputs = [helper.make_tensor_value_info("x", FLOAT, ["N", h]),
              helper.make_tensor_value_info("topk_ids", TensorProto.INT32, ["N", k]),
              helper.make_tensor_value_info("topk_weights", FLOAT, ["N", k])]
    inits = [helper.make_tensor(name, FP8, t.shape, t.view(torch.uint8).numpy().tobytes(), raw=True)
             for name, t in (("gate_up", gate_up), ("down", down))]
    inits += [numpy_helper.from_array(gus.numpy(), "gate_up_scale"), numpy_helper.from_array(dns.numpy(), "down_scale")]
    return _model(node, inputs, FLOAT, h, inits, opset, body)


def _model(node, inputs, elem, h, inits, opset, fp8_body):
    graph = helper.make_graph([node], "moe", inputs, [helper.make_tensor_value_info("out", elem, ["N", h])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("dsa", 1)],
                              functions=function_protos(opset, fp8_body=fp8_body))
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def _ort(model, feed):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), k=st.integers(1, 4), e=st.integers(1, 12), inter=st.sampled_from([2, 8]),
       h=st.sampled_from([4, 16]), skipped=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 2**16))
def test_body_matches_reference(n, k, e, inter, h, skipped, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=gen)
    ids, weights = routing(n, k, e, gen, skipped)
    gate_up, down = experts(e, inter, h, gen)
    feed = dict(zip(("x", "topk_ids", "topk_weights", "gate_up", "down"), _np(x, ids, weights, gate_up, down)))
    want = moe_experts_reference(*feed.values())
    model = moe_model(e, inter, h, k)
    np.testing.assert_allclose(_ort(model, feed), want, rtol=1e-5, atol=1e-5)  # the file's loop body
    assert use_moe_body(model, "dense")  # ONNX Runtime sessions' body: dense at decode sizes, else the loop
    np.testing.assert_allclose(_ort(model, feed), want, rtol=1e-5, atol=1e-5)


def test_body_fp16_and_native_inlining():
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(21, 16, generator=gen).half()
    ids, weights = routing(21, 3, 6, gen)
    gate_up, down = experts(6, 8, 16, gen, torch.float16)
    feed = dict(zip(("x", "topk_ids", "topk_weights", "gate_up", "down"), _np(x, ids, weights, gate_up, down)))
    model = moe_model(6, 8, 16, 3, np.float16)
    got = _ort(model, feed)
    assert got.dtype == np.float16
    want = moe_experts_reference(*feed.values()).astype(np.float32)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)
    native = onnx.inliner.inline_local_functions(model)
    assert not any(n.domain == "dsa" for n in native.graph.node)
    np.testing.assert_array_equal(_ort(native, feed), got)


def test_reference_evaluator_runs_node_and_body():
    from onnx.reference import ReferenceEvaluator

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(9, 8, generator=gen)
    ids, weights = routing(9, 2, 5, gen)
    gate_up, down = experts(5, 4, 8, gen)
    feed = dict(zip(("x", "topk_ids", "topk_weights", "gate_up", "down"), _np(x, ids, weights, gate_up, down)))
    model = moe_model(5, 4, 8, 2)
    (as_op,) = ReferenceEvaluator(model, new_ops=REFERENCE_OPS).run(None, feed)
    (as_body,) = ReferenceEvaluator(onnx.inliner.inline_local_functions(model), new_ops=BODY_OPS).run(None, feed)
    np.testing.assert_allclose(as_op, moe_experts_reference(*feed.values()), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(as_body, as_op, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_ort(model, feed), as_op, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("body", ["expert", "stack"])
@pytest.mark.parametrize("inter,h,block", [(16, 32, 8), (12, 20, 8)])
def test_fp8_bodies_match_reference(body, inter, h, block):
    from onnx.reference import ReferenceEvaluator

    gen = torch.Generator().manual_seed(inter + h)
    e = 5
    x = torch.randn(11, h, generator=gen)
    ids, weights = routing(11, 2, e, gen)
    ids[ids == 4] = 1  # an idle expert: the expert body skips it
    gate_up, down, gus, dns = fp8_experts(e, inter, h, block, gen)
    feed = {"x": x.numpy(), "topk_ids": ids.numpy(), "topk_weights": weights.numpy()}
    want = moe_experts_fp8_reference(x.numpy(), ids.numpy(), weights.numpy(), as_numpy_fp8(gate_up),
                                     as_numpy_fp8(down), gus.numpy(), dns.numpy(), block_size=block)
    model = fp8_model(gate_up, down, gus, dns, 2, block, body)
    np.testing.assert_allclose(_ort(model, feed), want, rtol=1e-5, atol=1e-5)
    native = onnx.inliner.inline_local_functions(model)
    np.testing.assert_allclose(_ort(native, feed), want, rtol=1e-5, atol=1e-5)
    (got,) = ReferenceEvaluator(native, new_ops=BODY_OPS).run(None, feed)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    (got,) = ReferenceEvaluator(model, new_ops=REFERENCE_OPS).run(None, feed)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    torch_out = dsa_moe_experts_fp8(x, ids, weights, gate_up, down, gus, dns, block_size=block)
    np.testing.assert_allclose(torch_out.numpy(), want, rtol=1e-5, atol=1e-5)


def _graph_ops(graph: onnx.GraphProto) -> set[str]:
    ops = set()
    for node in graph.node:
        ops.add(node.op_type)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                ops |= _graph_ops(attr.g)
    return ops


def _readers(graph: onnx.GraphProto, names=("gate_up", "down")) -> list[str]:
    """Op types of the nodes that read the weight stacks, subgraphs included (outer-scope reads)."""
    found = []
    for node in graph.node:
        found += [node.op_type] * sum(name in node.input for name in names)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found += _readers(attr.g, names)
    return found


def test_bodies_read_expert_weights_only_one_expert_at_a_time():
    fns = {f.name: f for f in function_protos(21)}
    for name, stack_ops in (("DSAMoEExperts", {"Loop"}), ("DSAMoEExpertsFP8", {"Scan"})):
        fn = fns[name]
        # At the top level the weight stacks only feed Shape and the expert loop (or the Scan
        # that hands it one FP8 expert): nothing expands them per token or per expert.
        readers = {n.op_type for n in fn.node if "gate_up" in n.input or "down" in n.input}
        assert readers <= {"Shape"} | stack_ops, readers
        ops = _graph_ops(onnx.helper.make_graph(fn.node, "f", [], []))
        # What TensorRT(-RTX) cannot run: NonZero (plugin only), reducing scatters, Einsum.
        assert not ops & {"NonZero", "Compress", "Einsum", "ScatterElements"}
        assert all(a.s in (b"", b"none") for n in fn.node for a in n.attribute if a.name == "reduction")
    # Inside, the stacks are gathered one expert at a time, or (the float body's dense path for a
    # few rows) multiplied where they lie: never transposed, cast or expanded whole.
    graph = onnx.helper.make_graph(fns["DSAMoEExperts"].node, "f", [], [])
    assert sorted(_readers(graph)) == ["Gather", "Gather", "Shape"]  # files carry the loop body
    dense = onnx.helper.make_graph(moe_experts_function(21, "dense").node, "f", [], [])
    assert sorted(_readers(dense)) == ["Gather", "Gather", "MatMul", "MatMul", "Shape"]
    assert _graph_ops(dense) - _graph_ops(graph) <= {"If", "MatMul", "Transpose", "CastLike", "Equal",
                                                     "LessOrEqual", "Identity", "Expand"}
    with pytest.raises(ValueError, match="loop"):
        moe_experts_function(21, "fused")
    assert "DSAMoEExpertsFP8" not in {f.name for f in function_protos(18)}
    with pytest.raises(ValueError, match="opset >= 21"):
        moe_experts_fp8_function(18)


def _node_runs(model, feed, folder: Path) -> dict[str, int]:
    """How many times each op type ran in one ONNX Runtime call (its profiler, writing into ``folder``)."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / "moe")
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    first = sess.run(None, feed)[0]
    events = json.loads(Path(sess.end_profiling()).read_text())
    runs: dict[str, int] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            runs[event["args"]["op_name"]] = runs.get(event["args"]["op_name"], 0) + 1
    np.testing.assert_array_equal(first, _ort(model, feed))  # the profiler changes nothing
    return runs


@pytest.mark.parametrize("n,k,e,dtype,dense", [(4, 4, 8, np.float32, True), (1, 8, 24, np.float32, True),
                                               (17, 2, 8, np.float32, False), (2, 2, 16, np.float32, False),
                                               (4, 4, 8, np.float16, False)])
def test_decode_sized_calls_multiply_the_stacks_in_place(n, k, e, dtype, dense, tmp_path):
    """A few float32 rows that hit most experts take the dense path (no Gemm of the loop runs);
    more rows, fewer experts hit, or fp16/bf16 weights keep the loop. Both give the reference."""
    gen = torch.Generator().manual_seed(n * 100 + e)
    x = torch.randn(n, 16, generator=gen)
    ids, weights = routing(n, k, e, gen)
    gate_up, down = experts(e, 8, 16, gen)
    feed = dict(zip(("x", "topk_ids", "topk_weights", "gate_up", "down"), _np(x, ids, weights, gate_up, down)))
    for name in ("x", "gate_up", "down"):
        feed[name] = feed[name].astype(dtype)
    model = moe_model(e, 8, 16, k, dtype)
    use_moe_body(model, "dense")
    runs = _node_runs(model, feed, tmp_path)
    assert ("Gemm" not in runs) == dense, runs
    assert bool({"MatMul", "FusedMatMul"} & set(runs)) == dense, runs
    want = moe_experts_reference(*feed.values())
    tol = 1e-5 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(_ort(model, feed).astype(np.float32), want, rtol=tol, atol=tol)


def test_an_unrouted_expert_adds_an_exact_zero_on_the_dense_path():
    """The dense path runs every expert over every row; one no row names, whose activations
    overflow to inf, must add exactly 0 (an inf times a routing weight of 0 would be NaN)."""
    gen = torch.Generator().manual_seed(5)
    n, k, e = 4, 2, 4
    x = torch.randn(n, 16, generator=gen)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 1]], dtype=torch.int32)  # expert 3: nobody's
    weights = torch.rand(n, k, generator=gen)
    gate_up, down = experts(e, 8, 16, gen)
    gate_up[3] = 1e30  # SiLU(gate) * up = inf for every row
    feed = dict(zip(("x", "topk_ids", "topk_weights", "gate_up", "down"), _np(x, ids, weights, gate_up, down)))
    model = moe_model(e, 8, 16, k)
    use_moe_body(model, "dense")
    got = _ort(model, feed)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, moe_experts_reference(*feed.values()), rtol=1e-5, atol=1e-5)


def test_schemas_check_the_weight_types():
    model = moe_model(3, 4, 8, 2)
    onnx.checker.check_model(model, full_check=True)
    # float weights on the FP8 op break its schema's type constraint.
    node = helper.make_node(MOE_EXPERTS_FP8.name, [t.name for t in MOE_EXPERTS_FP8.inputs], ["out"], domain="dsa",
                            **PLUGIN_ATTRIBUTES)
    inputs = [helper.make_tensor_value_info(t.name, FLOAT if t.name != "topk_ids" else TensorProto.INT32, None)
              for t in MOE_EXPERTS_FP8.inputs]
    bad = helper.make_model(helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("out", FLOAT, None)]),
                            opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("dsa", 1)])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(bad, full_check=True)


# TensorRT-RTX (CPU-only here): parse and AOT-build the bodies.

_PROFILE = {"x": ((1, 32), (16, 32), (64, 32)), "topk_ids": ((1, 2), (16, 2), (64, 2)),
            "topk_weights": ((1, 2), (16, 2), (64, 2))}


def _rtx_build(model) -> tuple[bool, str]:
    return rtx_build(model, _PROFILE)


def test_tensorrt_rtx_builds_the_bodies():
    gen = torch.Generator().manual_seed(8)
    gate_up, down = experts(8, 16, 32, gen)
    ok, log = _rtx_build(moe_model(8, 16, 32, 2, weights=(gate_up.numpy(), down.numpy())))
    assert ok, log
    fp8 = fp8_experts(8, 16, 32, 16, gen)
    ok, log = _rtx_build(fp8_model(*fp8, 2, 16, body="stack"))
    assert ok, log
    # The per-expert FP8 body needs a Scan over FP8 tensors, which TensorRT refuses (FP8 tensors
    # may only feed dequantize/shuffle/concat layers); if this starts to build, update docs/ops.md.
    default = fp8_model(*fp8, 2, 16, body="expert")
    ok, _ = _rtx_build(default)
    assert not ok
    assert use_fp8_body(default, "stack")  # what a TensorRT build of an exported file does first
    ok, log = _rtx_build(default)
    assert ok, log
    assert not use_fp8_body(moe_model(8, 16, 32, 2), "stack")
