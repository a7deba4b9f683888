"""Decode caches kept inside a stage between steps: ONNX Runtime values through IO binding."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dsa_export.errors import DSAUserError
from dsa_export.runtime.generate import SamplingSettings, generate
from dsa_export.runtime.onnxrt import OnnxFileSession
from dsa_export.stages.session import PipelineSession

ort = pytest.importorskip("onnxruntime")


def _decode_graph(path):
    """A decode graph in miniature: the cache grows by the step's tokens, and the next token is
    (sum of the cache + the last id) mod 7, so a cache that went missing or stale changes the ids."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["ids_f", "axis2"], ["new"]),
            helper.make_node("Concat", ["past_k", "new"], ["present_k"], axis=1),
            helper.make_node("ReduceSum", ["present_k", "axes12"], ["total"], keepdims=0),  # [B]
            helper.make_node("Gather", ["ids_f", "minus1"], ["last"], axis=1),  # [B]
            helper.make_node("Add", ["total", "last"], ["score"]),
            helper.make_node("Mod", ["score", "seven"], ["next"], fmod=1),
            helper.make_node("Cast", ["next"], ["next_i"], to=TensorProto.INT64),
            helper.make_node("OneHot", ["next_i", "depth", "onoff"], ["hot"], axis=-1),  # [B,7]
            helper.make_node("Unsqueeze", ["hot", "axis1"], ["logits"]),  # [B,1,7]
            helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        ],
        "decode",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_sequence"]),
         helper.make_tensor_value_info("past_k", TensorProto.FLOAT, ["batch", "past_sequence", 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1, 7]),
         helper.make_tensor_value_info("present_k", TensorProto.FLOAT, ["batch", "total_sequence", 1])],
        [helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
         helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
         helper.make_tensor("axes12", TensorProto.INT64, [2], [1, 2]),
         helper.make_tensor("minus1", TensorProto.INT64, [], [-1]),
         helper.make_tensor("seven", TensorProto.FLOAT, [], [7.0]),
         helper.make_tensor("depth", TensorProto.INT64, [], [7]),
         helper.make_tensor("onoff", TensorProto.FLOAT, [2], [0.0, 1.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, path)
    return path


def _expected(prompt: np.ndarray, steps: int) -> np.ndarray:
    out = []
    for row in prompt:
        seq = list(map(int, row))
        for _ in range(steps):
            seq.append((sum(seq) + seq[-1]) % 7)
        out.append(seq[len(row):])
    return np.array(out)


def test_caches_stay_onnxruntime_values_between_steps(tmp_path):
    session = OnnxFileSession.open(_decode_graph(tmp_path / "decode.onnx"))
    model = PipelineSession.of_session(session)
    prompt = np.array([[3, 1, 4, 1], [5, 9, 2, 6]])
    seen = []
    stage = model.handles[0].stage
    real = session.run_resident

    def spy(feeds, keep):
        seen.append({name: type(value) for name, value in feeds.items()})
        return real(feeds, keep)

    session.run_resident = spy  # type: ignore[method-assign]
    try:
        result = generate(model, prompt, SamplingSettings(max_new_tokens=5))
        assert result.tokens.tolist() == _expected(prompt, 5).tolist()
        assert len(seen) == 5 and seen[0]["past_k"] is np.ndarray  # the first step starts from empty caches
        assert all(step["past_k"] is ort.OrtValue for step in seen[1:])
        assert not stage.caches  # released at the end
    finally:
        model.close()


def test_resident_run_checks_what_the_caller_gives(tmp_path):
    session = OnnxFileSession.open(_decode_graph(tmp_path / "decode.onnx"))
    feeds = {"input_ids": np.array([[1]]), "attention_mask": np.ones((1, 1), np.int64),
             "past_k": np.zeros((1, 0, 1), np.float32)}
    out = session.run_resident(feeds, {"present_k"})
    assert isinstance(out["present_k"], ort.OrtValue) and isinstance(out["logits"], np.ndarray)
    with pytest.raises(DSAUserError, match="unknown input"):
        session.run_resident({**feeds, "extra": np.zeros(1)}, set())
    with pytest.raises(DSAUserError):
        session.run_resident({**feeds, "input_ids": np.array([[1.5]])}, set())
    session.close()
