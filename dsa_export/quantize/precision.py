"""What a quantized number format needs to be written as ONNX Q/DQ: its range, types and opset."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Precision:
    """A symmetric quantized format.

    Attributes:
        name: ``int8`` or ``fp8``.
        qmax: the largest representable magnitude; scale = amax / qmax.
        onnx_type: the ``TensorProto`` type of the quantized tensors and zero points.
        numpy_type: the matching NumPy dtype (``ml_dtypes`` for float8).
        min_opset: the first standard opset whose QuantizeLinear accepts this type.
        quantize_array: ``(values, scale) -> quantized`` for weights stored quantized.
    """

    name: str
    qmax: float
    onnx_type: int
    numpy_type: np.dtype
    min_opset: int
    quantize_array: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def scale(self, amax: float | np.ndarray) -> np.ndarray:
        """float32 scale(s) for ``amax``; an all-zero tensor gets scale 1 (any scale represents it)."""
        amax = np.asarray(amax, dtype=np.float64)
        return np.where(amax > 0, amax / self.qmax, 1.0).astype(np.float32)
