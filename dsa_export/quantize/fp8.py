"""FP8 E4M3 (``FLOAT8E4M3FN``): scale = amax / 448, the largest finite e4m3 value.

ONNX has float8 QuantizeLinear/DequantizeLinear from opset 19, so FP8 files import opset 19 at
least. The zero point is a float8 zero; TensorRT requires it to be zero, as for INT8.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto

from dsa_export.quantize.precision import Precision

E4M3_MAX = 448.0


def _to_e4m3(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    # Saturating conversion, as QuantizeLinear(saturate=1) does for float8.
    scaled = np.clip(values / scale, -E4M3_MAX, E4M3_MAX).astype(np.float32)
    return scaled.astype(ml_dtypes.float8_e4m3fn)


FP8 = Precision(
    name="fp8",
    qmax=E4M3_MAX,
    onnx_type=TensorProto.FLOAT8E4M3FN,
    numpy_type=np.dtype(ml_dtypes.float8_e4m3fn),
    min_opset=19,
    quantize_array=_to_e4m3,
)
