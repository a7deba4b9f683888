"""INT8: symmetric, zero point 0, scale = amax / 127 (the range TensorRT uses, -128 is never produced)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from dsa_export.quantize.precision import Precision


def _to_int8(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    # QuantizeLinear semantics: round half to even, then saturate.
    return np.clip(np.rint(values / scale), -127, 127).astype(np.int8)


INT8 = Precision(
    name="int8",
    qmax=127.0,
    onnx_type=TensorProto.INT8,
    numpy_type=np.dtype(np.int8),
    min_opset=13,
    quantize_array=_to_int8,
)
