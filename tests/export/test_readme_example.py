"""The README's user-model example exports and validates as the README says."""

from __future__ import annotations

from pathlib import Path

from dsa_export.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "my_model.py"


def test_readme_user_model_exports_and_validates(tmp_path, capsys):
    import pytest

    out = tmp_path / "my.onnx"
    with pytest.raises(SystemExit) as exit_info:
        main(["export", f"{EXAMPLE}:make", "-o", str(out)])
    assert exit_info.value.code in (0, None)
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(out), "--reference", f"{EXAMPLE}:make", "--seq-lens", "16,128"])
    assert exit_info.value.code in (0, None)
    assert "PASSED" in capsys.readouterr().out
