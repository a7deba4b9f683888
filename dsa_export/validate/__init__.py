"""Validation: every artifact against its PyTorch reference, through Polygraphy's Comparator."""

from dsa_export.validate.compare import ValidationReport, ValidationSettings, validate_onnx

__all__ = ["ValidationReport", "ValidationSettings", "validate_onnx"]
