"""What calibration says about files without DSAIndexerTopK nodes: pattern models select their keys
another way (block lists, LSH buckets, static patterns); a file without dsa nodes may be native."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dsa_export.errors import DSAUserError
from dsa_export.ops.contract import PLUGIN_ATTRIBUTES
from dsa_export.quantize.quantizer import QuantizeSettings, no_indexer_message, quantize


def _graph(attention_ops):
    """x -> MatMul (a weight to quantize) -> q; q, q, q + the dsa attention nodes named."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q4"])]
    outputs = []
    for i, op in enumerate(attention_ops):
        index = "block_index" if op == "DSABlockSparseAttention" else "indices"
        attrs = {"block_size": 4, "scale": 0.5, "causal": 1} if op == "DSABlockSparseAttention" else {"scale": 0.5}
        nodes.append(helper.make_node(op, ["q", "q", "q", index], [f"out{i}"], domain="dsa", **attrs,
                                      **PLUGIN_ATTRIBUTES))
        outputs.append(helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, [1, 8, 1, 4]))
    nodes.insert(1, helper.make_node("Reshape", ["q4", "shape"], ["q"]))
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4]),
         helper.make_tensor_value_info("block_index", TensorProto.INT32, [1, 1, 2, 2]),
         helper.make_tensor_value_info("indices", TensorProto.INT32, [1, 8, 2])],
        outputs or [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 8, 1, 4])],
        initializer=[numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
                     numpy_helper.from_array(np.array([1, 8, 1, 4], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dsa", 1)])


def test_pattern_graphs_are_told_their_selection_is_made_another_way():
    block = no_indexer_message(_graph(["DSABlockSparseAttention", "DSABlockSparseAttention", "DSASparseAttention"]),
                               "block.onnx")
    assert "without a lightning indexer" in block and "2 DSABlockSparseAttention, 1 DSASparseAttention" in block
    assert "plugin-mode" not in block and "compares outputs only" in block
    lsh = no_indexer_message(_graph(["DSASparseAttention"]), "lsh.onnx")
    assert "1 DSASparseAttention" in lsh and "DSABlockSparseAttention" not in lsh
    native = no_indexer_message(_graph([]), "native.onnx")
    assert "has no dsa::DSAIndexerTopK nodes" in native and "calibrate the plugin-mode export" in native


def test_calibrating_a_block_sparse_graph_logs_the_pattern_message(tmp_path, caplog):
    path = tmp_path / "block.onnx"
    onnx.save(_graph(["DSABlockSparseAttention"]), path)
    with caplog.at_level(logging.WARNING, logger="dsa_export.quantize.quantizer"), pytest.raises(DSAUserError, match="calibration needs data"):
        quantize(path, QuantizeSettings())  # no data: stops after the placement
    messages = [r.getMessage() for r in caplog.records]
    assert any("without a lightning indexer" in m for m in messages)
    assert not any("calibrate the plugin-mode export" in m for m in messages)
