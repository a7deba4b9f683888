"""CPU sessions of models with large external data keep their weights in place."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model_with_external_data(tmp_path, rows=256):
    weight = numpy_helper.from_array(np.arange(rows * 64, dtype=np.float32).reshape(rows, 64) / 1e3, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", rows])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 64])], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="m.onnx.data",
              size_threshold=0)
    return path


def test_large_external_data_disables_prepacking_and_the_arena(tmp_path, monkeypatch):
    import onnxruntime as ort

    from dsa_export.runtime import onnxrt

    path = _model_with_external_data(tmp_path)
    assert onnxrt.external_data_bytes(path) == (tmp_path / "m.onnx.data").stat().st_size > 0
    options = ort.SessionOptions()
    assert not onnxrt.weights_in_place(options, path)  # 64 KiB: below the threshold
    assert options.enable_cpu_mem_arena
    monkeypatch.setattr(onnxrt, "LARGE_WEIGHTS_BYTES", 1024)
    options = ort.SessionOptions()
    assert onnxrt.weights_in_place(options, path)
    assert not options.enable_cpu_mem_arena
    assert options.get_session_config_entry("session.disable_prepacking") == "1"
    # and the session computes the same product
    x = np.ones((2, 256), np.float32)
    got = onnxrt.session(path).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ (np.arange(256 * 64, dtype=np.float32).reshape(256, 64) / 1e3), rtol=1e-6)


def test_inline_data_is_not_large(tmp_path):
    from dsa_export.runtime.onnxrt import external_data_bytes

    model = helper.make_model(helper.make_graph([], "g", [], []))
    path = tmp_path / "inline.onnx"
    onnx.save(model, str(path))
    assert external_data_bytes(path) == 0
    assert external_data_bytes(path, model.SerializeToString()) == 0
