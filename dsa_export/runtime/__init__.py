"""Runtimes: one :class:`Session` interface over ONNX Runtime and TensorRT / TensorRT-RTX engines,
plus the Polygraphy runners validation uses (torch and ONNX Runtime).

``load(artifact)`` opens a build folder, an engine file, a build's ``onnxruntime/`` folder or a
plain .onnx. Importing this package imports neither torch, onnxruntime nor TensorRT.
"""

from dsa_export.runtime.loader import load
from dsa_export.runtime.session import RUNTIME_CHOICES, Session

__all__ = ["RUNTIME_CHOICES", "Session", "load"]
