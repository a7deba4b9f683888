"""Reading ONNX files the user points at: one place for the checks and their error sentences."""

from __future__ import annotations

import os
from pathlib import Path

from dsa_export.errors import DSAUserError

# The metadata_props keys our files carry, written by the exporter and the quantizer and read by
# validation, generation, the manifest and inspect: defined once, here.
META_TOOL = "dsa_export.version"  #: dsa-export version that wrote the file
META_OPS = "dsa_export.op_versions"  #: {op: version} of the dsa ops the file uses
META_MODE = "dsa_export.ops_mode"  #: plugin | native
META_SPEC = "dsa_export.reference"  #: the ModelReference the file was exported from (JSON)
META_CONFIG = "dsa_export.model_config"  #: the model's config (JSON), for references and tokenizers
META_SETTINGS = "dsa_export.export_settings"  #: the ExportSettings (JSON)
META_QUANT = "dsa_export.quantization"  #: the calibration record of a quantized file (JSON)
META_INDEXER_SCALES = "dsa_export.indexer_scales"  #: the indexers' q/k scales (JSON)
META_MOE = "dsa_export.moe_experts"  #: how the routed experts were quantized (JSON)


def load_graph(path: str | os.PathLike[str], what: str = "an exported .onnx file"):
    """The ModelProto of ``path`` without its external data, or a one-sentence user error; a file
    whose external data lies outside its folder, or past the end of a data file, is refused here
    (:func:`dsa_export.integrity.check_external_data`)."""
    import onnx

    path = Path(path)
    if path.is_dir():
        raise DSAUserError(f"'{path}' is a folder; pass {what}.")
    if not path.is_file():
        raise DSAUserError(f"'{path}' does not exist; pass {what}.")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise DSAUserError(f"'{path}' is not a readable ONNX file ({type(exc).__name__}); pass {what}.") from exc
    if not model.graph.node and not model.graph.input:
        raise DSAUserError(f"'{path}' holds no ONNX graph; pass {what}.")
    from dsa_export.integrity import check_external_data

    # inspect reads no weights: a missing data file is left to whoever reads them.
    check_external_data(path, model, missing_ok=True)
    return model


def metadata(model) -> dict[str, str]:
    """``metadata_props`` of a ModelProto as a dict."""
    return {p.key: p.value for p in model.metadata_props}
