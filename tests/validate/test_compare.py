"""validate: Polygraphy's Comparator over torch and ONNX Runtime."""

from __future__ import annotations

import json

import pytest

from dsa_export.errors import DSAUserError
from dsa_export.validate import ValidationSettings, validate_onnx


def test_default_model_passes_at_three_lengths(exported):
    report = validate_onnx(exported["plugin"])
    assert report.passed
    assert [e.seq_len for e in report.errors] == [16, 64, 256]
    assert max(e.max_abs for e in report.errors) <= 1e-4
    assert json.loads(report.to_json())["reference"] == "builtin:tiny"


def test_wrong_reference_fails(exported, tmp_path):
    file = tmp_path / "other.py"
    file.write_text(
        "from dsa_export.nn import DSACausalLM, builtin_config, example_inputs\n"
        "def make(batch=2, seq_len=16):\n"
        "    cfg = builtin_config('tiny')\n"
        "    return DSACausalLM(cfg).init_weights(123).eval(), example_inputs(cfg, batch, seq_len)\n"
    )
    report = validate_onnx(exported["native"], ValidationSettings(reference=f"{file}:make", seq_lens=(16,)))
    assert not report.passed
    assert report.errors[0].max_abs > 1e-2


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(DSAUserError, match="does not exist"):
        validate_onnx(tmp_path / "nope.onnx")
