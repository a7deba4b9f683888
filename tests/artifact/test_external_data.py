"""A supplied .onnx that keeps its weights in external data (every stage of a large model) builds:
the data is hard-linked into the build, not copied, and not hashed twice."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from dsa_export.artifact import BuildSettings, build
from dsa_export.runtime import load


@pytest.fixture(scope="module")
def external(tmp_path_factory, exported):
    folder = tmp_path_factory.mktemp("external")
    model = onnx.load(str(exported["plugin"]))
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=4096)
    return path


def test_external_data_is_linked_into_the_build(external, tmp_path):
    out = tmp_path / "build"
    result = build(BuildSettings(model=str(external), output=out, backend="onnxruntime"), log=lambda line: None)
    data = out / "model.onnx.data"
    assert data.is_file() and os.stat(data).st_ino == os.stat(external.with_suffix(".onnx.data")).st_ino
    assert "model.onnx.data" in result.manifest["files"]
    assert result.manifest["validation"]["passed"]
    # No optimized copy: it would name the data relative to onnxruntime/ (or copy the weights).
    section = result.manifest["onnxruntime"]
    assert section["optimized_model"] is None and not (out / "onnxruntime" / "model.optimized.onnx").exists()
    assert any("No optimized model was saved (the weights stay in" in note for note in section["notes"])
    session = load(out)
    feeds = session.example_inputs()
    reference = load(external).run(feeds)
    for name, value in session.run(feeds).items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-5, atol=1e-5)


def test_missing_external_data_is_one_clear_error(external, tmp_path):
    from dsa_export.errors import DSAUserError

    lonely = tmp_path / "model.onnx"
    lonely.write_bytes(external.read_bytes())
    with pytest.raises(DSAUserError, match="the external data of .* is missing"):
        build(BuildSettings(model=str(lonely), output=tmp_path / "build", backend="onnxruntime"),
              log=lambda line: None)
    assert not (tmp_path / "build").exists()
