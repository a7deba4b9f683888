"""Reading ONNX files the user points at: one place for the checks and their error sentences."""

from __future__ import annotations

import os
from pathlib import Path

from dsa_export.errors import DSAUserError


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
