"""INT8/FP8 quantization of exported DSA models: calibration, explicit Q/DQ, TensorRT 10 caches,
and an accuracy report that includes the indexer's top-k selection. See docs/quantize.md."""

from dsa_export.quantize.quantizer import QuantizeResult, QuantizeSettings, quantize, save

__all__ = ["QuantizeResult", "QuantizeSettings", "quantize", "save"]
