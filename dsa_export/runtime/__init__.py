"""Runtimes: Polygraphy-compatible runners for torch and ONNX Runtime."""
