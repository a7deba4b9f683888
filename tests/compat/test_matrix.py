"""The packaged compatibility matrix is well formed, sourced, and looked up by the longest release prefix."""

from __future__ import annotations

import json

import pytest

from dsa_export.compat.matrix import MATRIX_PATH, load_matrix, validate_matrix


def test_packaged_matrix_is_valid_and_every_row_has_a_source() -> None:
    data = json.loads(MATRIX_PATH.read_text())
    assert validate_matrix(data) == []
    for table, rows in data.items():
        if isinstance(rows, list):
            for row in rows:
                assert row["source"].strip(), (table, row)


def test_validation_reports_a_row_without_source_and_a_bad_range() -> None:
    data = json.loads(MATRIX_PATH.read_text())
    del data["tensorrt"][0]["source"]
    data["cuda"][0]["sm"] = ">=x"
    problems = validate_matrix(data)
    assert any("tensorrt[0] lacks 'source'" in p for p in problems)
    assert any("cuda[0].sm" in p for p in problems)


def test_malformed_matrix_file_is_refused(tmp_path) -> None:
    bad = tmp_path / "matrix.json"
    bad.write_text(json.dumps({"schema_version": 1, "matrix_version": "x"}))
    with pytest.raises(ValueError, match="malformed"):
        load_matrix(bad)


@pytest.mark.parametrize(
    ("table", "version", "release"),
    [
        ("tensorrt", "10.3.0.26", "10.3"),
        ("tensorrt", "10.14.1", "10"),
        ("tensorrt", "11.1.0.10", "11"),
        ("tensorrt", "8.6.1", "8.6"),
        ("cuda", "12.4", "12.4"),
        ("cuda", "12.7", "12"),
        ("cudnn", "8.0.5", "8.0"),
        ("cudnn", "9.13.0", "9"),
        ("tensorrt_rtx", "1.7.1.116", "1"),
        ("onnxruntime_gpu", "1.18.0", "1.18.0"),
        ("onnxruntime_gpu", "1.18.1", "1.18"),
    ],
)
def test_release_row_uses_longest_prefix(table: str, version: str, release: str) -> None:
    row = load_matrix().release_row(table, version)
    assert row is not None and row["release"] == release


def test_unknown_release_has_no_row() -> None:
    matrix = load_matrix()
    assert matrix.release_row("tensorrt", "7.2.3") is None
    assert matrix.release_row("onnxruntime_gpu", "1.32.0") is None


def test_facts_the_issue_names() -> None:
    matrix = load_matrix()
    rtx = matrix.release_row("tensorrt_rtx", "1.7")
    assert "9.0" not in rtx["sm"] and rtx["plugins"] is False  # no Hopper, no plugins
    trt11 = matrix.release_row("tensorrt", "11.0")
    assert (
        trt11["implicit_int8"] is False
        and trt11["precision_flags"] is False
        and trt11["cudnn"] is None
    )
    assert matrix.release_row("tensorrt", "10.5")["sm"].startswith("7.5")  # Volta removed in 10.5
    assert matrix.release_row("tensorrt", "10.4")["sm"].startswith("7.0")
    assert matrix.precision_row("tensorrt", "fp8")["sm"] == ">=8.9"
    assert matrix.precision_row("tensorrt", "bf16")["sm"] == ">=8.0"
    ids = {row["id"] for row in matrix.table("known_bad")}
    assert {
        "cudnn_8_0_5_dsa_slowdown",
        "tensorrt11_no_implicit_int8",
        "tensorrt11_no_precision_flags",
    } <= ids
