"""The export step of a build (and `dsa-export export`): torch model -> ONNX with ``dsa`` custom nodes or standard ops only."""

from dsa_export.export.exporter import ExportResult, export_model, export_to_file, inline_custom_ops, save_model
from dsa_export.export.settings import DEFAULT_OPSET, ExportSettings

__all__ = ["DEFAULT_OPSET", "ExportResult", "ExportSettings", "export_model", "export_to_file", "inline_custom_ops",
           "save_model"]
