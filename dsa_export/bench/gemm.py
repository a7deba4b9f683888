"""The machine's GEMM rate, measured in the same run as the layers, so that each part's achieved
GFLOP/s can be read against what this CPU (with its current load) does on a plain matmul.

One float32 ``[M, K] @ [K, N]`` product of the layer's projection shape (``M = 2048`` tokens,
``K = N = hidden``) is timed on each CPU runtime: ``torch.matmul`` (oneDNN/MKL) and an ONNX Runtime
session holding one ``MatMul`` node (MLAS), with the thread counts of the benchmark. The best of
``repeats`` calls is kept (a rate, not a latency: the best call is the least disturbed one).
"""

from __future__ import annotations

import time
from typing import Callable

#: Rows of the timed product (tokens of a projection).
GEMM_ROWS = 2048


def _best_rate(fn: Callable[[], object], flops: float, repeats: int) -> float:
    fn()  # warm-up: first-call allocation and packing
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


def torch_gemm_gflops(hidden: int, repeats: int = 5) -> float:
    """GFLOP/s of one float32 ``[GEMM_ROWS, hidden] @ [hidden, hidden]`` torch.matmul."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(GEMM_ROWS, hidden, generator=generator)
    b = torch.randn(hidden, hidden, generator=generator)
    out = torch.empty(GEMM_ROWS, hidden)
    with torch.inference_mode():
        return _best_rate(lambda: torch.matmul(a, b, out=out), 2.0 * GEMM_ROWS * hidden * hidden, repeats)


def onnxruntime_gemm_gflops(hidden: int, threads: int, repeats: int = 5) -> float:
    """GFLOP/s of the same product as one ONNX ``MatMul`` node on the CPU provider."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((hidden, hidden), dtype=np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [GEMM_ROWS, hidden])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [GEMM_ROWS, hidden])], initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"a": rng.standard_normal((GEMM_ROWS, hidden), dtype=np.float32)}
    return _best_rate(lambda: session.run(None, feed), 2.0 * GEMM_ROWS * hidden * hidden, repeats)
