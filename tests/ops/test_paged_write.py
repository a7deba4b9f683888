"""DSAPagedCacheWrite in the ONNX graph (dsa_export.ops.paged_write_onnx): which ScatterNDs the
full-TensorRT build turns into the in-place plugin node, and that ONNX Runtime runs the rewritten
graph, through the node's function body, with the same bits as the original (a hand-made graph and a
real paged export of a tiny DeepSeek-V3.2 checkpoint)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dsa_export.ops.contract import OPS, PAGED_CACHE_WRITE
from dsa_export.ops.onnx_ops import function_protos, register_schemas
from dsa_export.ops.paged_write_onnx import paged_cache_writes, rewritable, use_paged_cache_write
from tests.trt.fakes import tiny_paged_model

ort = pytest.importorskip("onnxruntime")


def _write(elem=TensorProto.FLOAT, past="past_latent_pool_0", present="present_latent_pool_0", idx_last=2,
           reduction=None, reader=None):
    """One ScatterND pool write as a model: pool [pages,4,8] of ``elem``, indices [b,s,idx_last] int64."""
    attrs = {"reduction": reduction} if reduction else {}
    nodes = [helper.make_node("ScatterND", [past, "indices", "new"], [present], name="w", **attrs)]
    outputs = [helper.make_tensor_value_info(present, elem, ["pages", 4, 8])]
    if reader:
        nodes.append(helper.make_node(reader, [past], ["r"], name="reader"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.INT64 if reader == "Shape" else elem, None))
    graph = helper.make_graph(nodes, "w", [helper.make_tensor_value_info(past, elem, ["pages", 4, 8]),
                                           helper.make_tensor_value_info("indices", TensorProto.INT64,
                                                                         ["b", "s", idx_last]),
                                           helper.make_tensor_value_info("new", elem, ["b", "s", 8])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("case,why", [
    (dict(), ""),
    (dict(elem=TensorProto.FLOAT16), ""),
    (dict(elem=TensorProto.BFLOAT16), ""),
    (dict(reader="Shape"), ""),  # a shape read does not see the pool's values
    (dict(elem=TensorProto.UINT8), "not a float32/float16/bfloat16 pool"),  # FP8 caches' code pools
    (dict(reader="Identity"), "also read by Identity"),
    (dict(reduction="add"), "reduction"),
    (dict(present="present_latent_pool_1"), "not past_*pool* into its present_*pool*"),
    (dict(past="past_k", present="present_k"), "not past_*pool* into its present_*pool*"),
    (dict(idx_last=1), "int64 indices [B,S,2]"),
])
def test_only_a_float_pool_written_into_its_own_present_output_is_rewritten(case, why):
    model = _write(**case)
    reason = rewritable(model, model.graph.node[0])
    assert (why in reason) if why else reason == "", reason
    written = use_paged_cache_write(model)
    assert written == ([] if why else [model.graph.output[0].name])
    ops = [(n.domain, n.op_type) for n in model.graph.node][:1]
    assert ops == ([("", "ScatterND")] if why else [("dsa", "DSAPagedCacheWrite")])
    assert bool(model.functions) != bool(why)


def test_the_op_is_in_the_contract_with_a_scatter_body_and_a_schema():
    assert OPS["DSAPagedCacheWrite"] is PAGED_CACHE_WRITE and PAGED_CACHE_WRITE.has_plugin
    assert PAGED_CACHE_WRITE.output_type_input == 0
    assert PAGED_CACHE_WRITE.output_dims([["pages", 64, 576], ["B", "S", 2], ["B", "S", 576]], {}) == ["pages", 64, 576]
    body = next(f for f in function_protos(18) if f.name == "DSAPagedCacheWrite")
    assert [(n.op_type, list(n.input), list(n.output)) for n in body.node] == [
        ("ScatterND", ["pool", "indices", "updates"], ["present"])]
    register_schemas()
    schema = onnx.defs.get_schema("DSAPagedCacheWrite", 1, "dsa")
    assert [i.name for i in schema.inputs] == ["pool", "indices", "updates"]


def _run(model_or_bytes, feeds):
    data = model_or_bytes if isinstance(model_or_bytes, bytes) else model_or_bytes.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def test_onnxruntime_runs_the_rewritten_hand_made_graph_with_the_same_bits(tmp_path):
    model = onnx.load(str(tiny_paged_model(tmp_path / "paged.onnx")))
    rng = np.random.default_rng(0)
    feeds = {"past_latent_pool_0": rng.standard_normal((5, 4, 8)).astype(np.float32),
             "indices": np.array([[[1, 2], [3, 0], [0, 0]], [[4, 3], [0, 0], [0, 0]]], dtype=np.int64),
             "new": rng.standard_normal((2, 3, 8)).astype(np.float32)}
    want = _run(model, feeds)
    assert use_paged_cache_write(model) == ["present_latent_pool_0"]
    onnx.checker.check_model(model)
    got = _run(model, feeds)
    assert want.keys() == got.keys()
    for name in want:
        assert np.array_equal(want[name].view(np.uint32), got[name].view(np.uint32)), name


@pytest.fixture(scope="module")
def paged_fp32(checkpoints, tmp_path_factory):
    from dsa_export.export import ExportSettings, export_model, save_model
    from dsa_export.hf.source import hf_reference
    from dsa_export.sources import resolve

    source = resolve(hf_reference(checkpoints["deepseek_v32"], graph="paged"))
    return save_model(export_model(source, ExportSettings(dtype="fp32")),
                      tmp_path_factory.mktemp("paged-write") / "paged-fp32.onnx")


def _paged_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """A ragged call: row 0 a 6-token prefill from position 0, row 1 four tokens from position 70
    (two padding tokens, both written to the scratch slot), pools of 6 pages of random values."""
    rng = np.random.default_rng(seed)
    types = {i.name: i.type.tensor_type for i in model.graph.input}
    ints = {TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}
    feeds = {"input_ids": rng.integers(0, 128, (2, 6)), "query_start": np.array([0, 70]),
             "query_lengths": np.array([6, 4]), "block_table": np.array([[1, 2, -1], [3, 4, 5]])}
    feeds = {name: value.astype(ints[types[name].elem_type]) for name, value in feeds.items()}
    for name, t in types.items():
        if name.startswith("past_"):
            assert t.elem_type == TensorProto.FLOAT, name
            feeds[name] = rng.standard_normal((6, *(d.dim_value for d in t.shape.dim[1:]))).astype(np.float32)
    return feeds


def test_onnxruntime_runs_a_rewritten_paged_export_with_the_same_bits(paged_fp32):
    from dsa_export.runtime.onnxrt import session

    original = onnx.load(str(paged_fp32), load_external_data=False)
    rewritten = onnx.load(str(paged_fp32), load_external_data=False)
    pools = [o.name for o in original.graph.output if o.name.startswith("present_")]
    assert len(pools) == 6  # three layers: a latent and an index-key pool each
    assert paged_cache_writes(original) == pools
    assert use_paged_cache_write(rewritten) == pools
    assert not any(n.op_type == "ScatterND" for n in rewritten.graph.node)
    assert sum(n.op_type == "DSAPagedCacheWrite" for n in rewritten.graph.node) == 6
    feeds = _paged_feeds(original)
    names = [o.name for o in original.graph.output]
    want = dict(zip(names, session(paged_fp32).run(None, feeds)))
    got = dict(zip(names, session(paged_fp32, model_bytes=rewritten.SerializeToString()).run(None, feeds)))
    for name in names:
        assert np.array_equal(want[name].view(np.uint32), got[name].view(np.uint32)), name
    for name in pools:  # the call's tokens were written (the rewrite is not a no-op on an unwritten pool)
        assert not np.array_equal(got[name], feeds["past_" + name[len("present_"):]])
