"""The exported files: custom nodes, function bodies, value_info, metadata, determinism, parity."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import onnx
import pytest
import torch

from dsa_export.export import ExportSettings, export_model, save_model
from dsa_export.runtime.onnxrt import session
from dsa_export.sources import resolve


def _load(path):
    return onnx.load(str(path))


def test_plugin_file_has_custom_nodes_with_plugin_attributes_and_bodies(exported):
    model = _load(exported["plugin"])
    custom = [n for n in model.graph.node if n.domain == "dsa"]
    assert {n.op_type for n in custom} == {"DSAIndexerTopK", "DSASparseAttention"}
    assert sum(n.op_type == "DSAIndexerTopK" for n in custom) == 3  # dsa, dsa, hybrid layers
    assert sum(n.op_type == "DSASparseAttention" for n in custom) == 4  # + the local window layer
    for node in custom:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["plugin_namespace"] == b"dsa" and attrs["plugin_version"] == b"1"
        assert all(a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT, onnx.AttributeProto.STRING)
                   for a in node.attribute)
        if node.op_type == "DSAIndexerTopK":
            assert attrs["topk"] == 32 and attrs["causal"] == 1 and len(node.input) == 4
    # One body per op the graph uses.
    assert {(f.domain, f.name) for f in model.functions} == {("dsa", "DSAIndexerTopK"), ("dsa", "DSASparseAttention")}
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 18), ("dsa", 1)}
    onnx.checker.check_model(model, full_check=True)


def test_custom_outputs_carry_dtype_and_symbolic_shape(exported):
    model = _load(exported["plugin"])
    infos = {v.name: v for v in model.graph.value_info}
    for node in (n for n in model.graph.node if n.domain == "dsa"):
        info = infos[node.output[0]]
        dims = [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]
        assert dims[:2] == ["batch", "sequence"]
        expected = onnx.TensorProto.INT32 if node.op_type == "DSAIndexerTopK" else onnx.TensorProto.FLOAT
        assert info.type.tensor_type.elem_type == expected


def test_native_file_has_no_custom_domain(exported):
    model = _load(exported["native"])
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    assert not model.functions and all(o.domain != "dsa" for o in model.opset_import)
    onnx.checker.check_model(model, full_check=True)


def test_io_axes_are_dynamic_and_metadata_is_written(exported):
    model = _load(exported["plugin"])
    (inp,), (out,) = model.graph.input, model.graph.output
    assert [d.dim_param for d in inp.type.tensor_type.shape.dim] == ["batch", "sequence"]
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == ["batch", "sequence", 256]
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["dsa_export.reference"]) == {"version": 1, "kind": "builtin", "name": "tiny"}
    assert json.loads(meta["dsa_export.op_versions"]) == {"DSAIndexerTopK": 1, "DSASparseAttention": 1}
    assert json.loads(meta["dsa_export.model_config"])["index_topk"] == 32
    assert meta["dsa_export.ops_mode"] == "plugin" and "dsa_export.version" in meta


@pytest.mark.parametrize("mode", ["plugin", "native"])
@pytest.mark.parametrize("batch,seq_len", [(1, 1), (3, 17), (2, 300)])
def test_onnxruntime_matches_torch_at_unseen_shapes(exported, tiny_source, mode, batch, seq_len):
    sess = session(exported[mode])
    inputs = tiny_source.inputs_for(batch, seq_len, seed=11)
    with torch.no_grad():
        want = tiny_source.module(**inputs).numpy()
    (got,) = sess.run(None, {"input_ids": inputs["input_ids"].numpy()})
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_files_carry_the_bodies_tensorrt_builds_and_our_sessions_run_the_trimmed_one(exported, tiny_source):
    """A plugin file's sparse attention is the static body, and every Loop has a trip count and no
    condition (TensorRT-RTX builds the file as it is: tests/trt/test_plain_rtx_build.py); our ONNX
    Runtime sessions run the trimmed body, in memory, with the values of the static one."""
    import onnxruntime as ort

    from dsa_export.ops.attention_onnx import sparse_attention_function
    from dsa_export.runtime.onnxrt import onnxruntime_model_bytes

    model = _load(exported["plugin"])
    bodies = {f.name: f for f in model.functions}
    assert bodies["DSASparseAttention"] == sparse_attention_function(18, "static")
    loops = [n for f in model.functions for n in f.node if n.op_type == "Loop"]
    assert len(loops) == 2 and all(n.input[1] == "" for n in loops)
    swapped = onnx.load_from_string(onnxruntime_model_bytes(exported["plugin"]))
    assert {f.name: f for f in swapped.functions}["DSASparseAttention"] == sparse_attention_function(18, "trimmed")
    assert swapped.graph == model.graph
    assert onnxruntime_model_bytes(exported["native"]) is None  # inlined: nothing to swap
    ids = tiny_source.inputs_for(2, 20, seed=5)["input_ids"].numpy()  # 20 < index_topk: trimmed chunks
    (ours,) = session(exported["plugin"]).run(None, {"input_ids": ids})
    (plain,) = ort.InferenceSession(str(exported["plugin"]), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids})
    np.testing.assert_allclose(ours, plain, rtol=1e-5, atol=1e-5)


def test_export_is_byte_identical(tmp_path, exported, tiny_source):
    again = save_model(export_model(tiny_source, ExportSettings(ops="plugin")), tmp_path / "again.onnx")
    assert again.read_bytes() == exported["plugin"].read_bytes()


def test_fp16_export_runs_in_onnxruntime(tmp_path):
    source = resolve("tiny")
    path = save_model(export_model(source, ExportSettings(dtype="fp16")), tmp_path / "fp16.onnx")
    model = _load(path)
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    inputs = source.inputs_for(2, 40)
    (got,) = session(path).run(None, {"input_ids": inputs["input_ids"].numpy()})
    with torch.no_grad():
        want = resolve("tiny").module(**inputs).numpy()
    # fp16 end to end through 4 layers: compare loosely against the fp32 model
    assert np.abs(got.astype(np.float32) - want).max() < 0.1


USER_MODEL = textwrap.dedent(
    """
    import torch
    from dsa_export.ops import dsa_indexer_topk, dsa_sparse_attention

    class OneLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.qkv = torch.nn.Linear(32, 3 * 64)
            self.idx_q = torch.nn.Linear(32, 16 * 16)
            self.idx_k = torch.nn.Linear(32, 16)
            self.idx_w = torch.nn.Linear(32, 16)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 16).unbind(2)
            sel = dsa_indexer_topk(self.idx_q(x).view(b, s, 16, 16), self.idx_k(x), self.idx_w(x), topk=8, scale=0.25)
            return dsa_sparse_attention(q, k, v, sel, scale=0.25).flatten(2)

    def make(batch=2, seq_len=24):
        return OneLayer(), (torch.randn(batch, seq_len, 32),), ["y"]
    """
)


def test_user_factory_model_exports_and_matches(tmp_path):
    file = tmp_path / "user_model.py"
    file.write_text(USER_MODEL)
    source = resolve(f"{file}:make")
    path = save_model(export_model(source, ExportSettings()), tmp_path / "user.onnx")
    model = _load(path)
    assert [o.name for o in model.graph.output] == ["y"]
    inputs = source.inputs_for(3, 40)
    (got,) = session(path).run(None, {"x": inputs["x"].numpy()})
    with torch.no_grad():
        want = source.module(**inputs).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def test_large_models_are_saved_with_external_data(tmp_path, exported):
    from dsa_export.export.exporter import save_model as save

    model = _load(exported["plugin"])
    path = save(model, tmp_path / "ext.onnx", external_data_bytes=1024)
    data = tmp_path / "ext.onnx.data"
    assert data.is_file() and data.stat().st_size > 900_000
    assert path.stat().st_size < 200_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext.onnx", "ext.onnx.data"]
    inputs = resolve("tiny").inputs_for(1, 20)
    (got,) = session(path).run(None, {"input_ids": inputs["input_ids"].numpy()})
    (want,) = session(exported["plugin"]).run(None, {"input_ids": inputs["input_ids"].numpy()})
    np.testing.assert_array_equal(got, want)


def test_written_files_get_the_users_default_mode(tmp_path):
    import os

    from dsa_export.fileio import atomic_output

    mask = os.umask(0o022)
    try:
        with atomic_output(tmp_path / "artifact.bin") as tmp:
            tmp.write_bytes(b"x")
    finally:
        os.umask(mask)
    assert (tmp_path / "artifact.bin").stat().st_mode & 0o777 == 0o644
