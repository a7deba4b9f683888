"""The packaged matrix is well formed, every fact is quoted or marked unverified, and rows are found by their versions spec."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from dsa_export.compat.matrix import (
    MATRIX_PATH,
    TABLES,
    MatrixError,
    load_matrix,
    unused_documents,
    validate_matrix,
)
from dsa_export.compat.matrix_doc import DOC_BEGIN, DOC_END, main, render_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs" / "compat.md"


@pytest.fixture(scope="module")
def data() -> dict:
    return json.loads(MATRIX_PATH.read_text(encoding="utf-8"))


def _broken(data: dict, change) -> list[str]:
    copied = copy.deepcopy(data)
    change(copied)
    return validate_matrix(copied)


def test_packaged_matrix_is_valid_and_cites_every_document_it_lists(data: dict) -> None:
    assert validate_matrix(data) == []
    assert unused_documents(data) == []


def test_every_fact_is_quoted_or_marked_unverified(data: dict) -> None:
    for table, spec in TABLES.items():
        for row in data[table]:
            backed = {f for item in row.get("evidence", []) for f in item["fields"]}
            for fact in spec.facts:
                if fact in row:
                    assert fact in backed or row.get("unverified", {}).get(fact), (row["id"], fact)
            for item in row.get("evidence", []):
                assert item["quote"].strip() and item["doc"] in data["documents"], row["id"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d["tensorrt"][0].pop("evidence"), "has neither evidence nor an unverified reason"),
        (lambda d: d["cuda"][0].update(sm=">=x"), "cuda[cuda-11.0].sm"),
        (lambda d: d["cuda"][0]["evidence"][0].update(doc="nowhere"), "not in documents"),
        (lambda d: d["cuda"][0]["evidence"][0].update(quote=" "), "has no quote"),
        (lambda d: d["tensorrt"][1].update(versions=">=8.6,<10.1"), "both match"),
        (lambda d: d["cudnn"][0].update(kind="rumor"), "has kind 'rumor'"),
        (
            lambda d: d["known_bad"][0].update(severity="warning"),
            "is an anecdote, so it must be severity info",
        ),
        (lambda d: d["known_bad"][1]["when"].update(gpu="x"), "unknown key 'gpu'"),
        (lambda d: d.update(matrix_date="December"), "matrix_date"),
        (lambda d: d["documents"]["cuda-rn-13.2u2"].update(url="ftp://x"), "not an https address"),
        (
            lambda d: d["precision"][0].update(evidence=[{"doc": "modelopt-sm", "fields": ["sm"], "quote": "q"}]),
            "both backed",
        ),
    ],
)
def test_validation_names_the_problem(data: dict, change, words: str) -> None:
    problems = _broken(data, change)
    assert any(words in problem for problem in problems), problems


def test_another_schema_is_refused_first(data: dict) -> None:
    assert _broken(data, lambda d: d.update(schema_version=1)) == [
        "schema_version is 1, expected 2"
    ]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"schema_version": 2, "matrix_version": "x"}', "cannot be used: matrix_date"),
        ("[1, 2]", "the document is not a JSON object"),
        ("{oops", "is not valid JSON"),
    ],
)
def test_unusable_matrix_file_is_one_sentence(tmp_path: Path, content: str, words: str) -> None:
    bad = tmp_path / "matrix.json"
    bad.write_text(content)
    with pytest.raises(MatrixError, match=re.escape(words)) as info:
        load_matrix(bad)
    assert str(info.value).endswith(".") and str(info.value).count(". ") == 0
    with pytest.raises(MatrixError, match="does not exist"):
        load_matrix(tmp_path / "absent.json")


@pytest.mark.parametrize(
    ("table", "version", "row"),
    [
        ("tensorrt", "10.3.0.26", "tensorrt-10.3"),
        ("tensorrt", "10.13.0.35", "tensorrt-10.13.0"),
        ("tensorrt", "10.13.2.6", "tensorrt-10.13.2"),
        ("tensorrt", "10.13.3.9", "tensorrt-10.13.2"),
        ("tensorrt", "11.1.0.106", "tensorrt-11.1"),
        ("tensorrt", "8.6.1", "tensorrt-8.6"),
        ("cuda", "12.4", "cuda-12.4"),
        ("cuda_major", "12.7", "cuda-12.x"),
        ("cudnn", "9.17.0", "cudnn-9.17"),
        ("cudnn", "9.10.2", "cudnn-9.10.2"),
        ("tensorrt_rtx", "1.7.1.116", "tensorrt-rtx-1.7"),
        ("onnxruntime_gpu", "1.18.0", "onnxruntime-gpu-1.18.0"),
        ("onnxruntime_gpu", "1.18.1", "onnxruntime-gpu-1.18.1"),
        ("onnxruntime_gpu", "1.25.0", "onnxruntime-gpu-1.23"),
    ],
)
def test_release_row_is_the_row_whose_versions_match(table: str, version: str, row: str) -> None:
    found = load_matrix().release_row(table, version)
    assert found is not None and found["id"] == row


@pytest.mark.parametrize(
    ("table", "version"),
    [
        ("tensorrt", "7.2.3"),
        ("tensorrt", "10.17.0"),  # no family row stands in for releases the matrix does not know
        ("tensorrt", "11.5.0"),
        ("cuda", "12.7"),
        ("cudnn", "9.13.0"),
        ("onnxruntime_gpu", "1.32.0"),
    ],
)
def test_unknown_release_has_no_row(table: str, version: str) -> None:
    assert load_matrix().release_row(table, version) is None


@pytest.mark.parametrize(
    ("table", "first", "second"),
    [
        ("tensorrt", "10.13.0.35", "10.13.2.6"),  # CUDA 13 builds start at 10.13.2
        ("onnxruntime_gpu", "1.18.0", "1.18.1"),  # cuDNN 8 on CUDA 12 until 1.18.0, cuDNN 9 from 1.18.1
    ],
)
def test_releases_that_differ_within_a_minor_have_their_own_rows(
    table: str, first: str, second: str
) -> None:
    matrix = load_matrix()
    assert matrix.release_row(table, first) is not matrix.release_row(table, second)
    assert matrix.release_row(table, first) is not None


def test_facts_the_issue_names() -> None:
    matrix = load_matrix()
    row = matrix.release_row
    assert row("tensorrt", "11.0.0")["cuda"] == ["12", "13"]  # tensorrt-cu12 wheels exist
    assert row("tensorrt", "10.13.0")["cuda"] == ["11", "12"]
    assert row("tensorrt", "10.13.2")["cuda"] == ["12", "13"]
    assert row("tensorrt_rtx", "1.1")["cuda"] == [">=12.9,<13"]  # CUDA 13 arrived in 1.2
    assert "12.1" not in row("tensorrt_rtx", "1.3")["sm"] and "12.1" in row("tensorrt_rtx", "1.5")["sm"]
    assert "9.0" not in row("tensorrt_rtx", "1.7")["sm"]  # no Hopper
    assert [b["sm"] for b in row("cudnn", "9.17.0")["builds"]] == ["7.5-12.0", "7.5-12.0"]
    assert any(b["cuda"] == "11.8" for b in row("cudnn", "9.5.1")["builds"])
    assert row("cudnn", "8.9.6")["builds"][0]["cuda"] == "12.0-12.2"
    pypi = next(b for b in row("onnxruntime_gpu", "1.18.1")["builds"] if b["pypi"])
    assert (pypi["cuda"], pypi["cudnn"]) == ("11", "8")
    pypi = next(b for b in row("onnxruntime_gpu", "1.17.1")["builds"] if b["pypi"])
    assert (pypi["cuda"], pypi["cudnn"]) == ("11", ">=8.2.4,<9")
    assert row("cuda", "13.1")["driver_min"] == "590.44.01"
    assert row("cuda_major", "13.1")["minor_compat_floor"] == "580"
    assert row("tensorrt", "11.1")["driver_min"] == {"12": "535", "13": "580"}
    assert row("tensorrt", "10.5")["sm"].startswith("7.5") and row("tensorrt", "10.4")["sm"].startswith("7.0")
    bad = {r["id"]: r for r in matrix.table("known_bad")}
    assert bad["cudnn_8_0_5_dsa_slowdown"]["kind"] == "anecdote"
    assert bad["tensorrt_function_bodies_before_plugins"]["when"]["tensorrt"] == ">=9.0,<10.7"
    assert bad["tensorrt10_implicit_int8_deprecated"]["when"]["tensorrt"] == ">=10.1,<11"


def test_source_text_quotes_the_document_or_says_why_not() -> None:
    matrix = load_matrix()
    row = matrix.release_row("tensorrt", "10.13.2.6")
    text = matrix.source_text(row, ("cuda",))
    assert "Added support for CUDA 13.0, dropped support for CUDA 11.X" in text
    assert "https://github.com/NVIDIA/TensorRT" in text and "sm" not in matrix.unverified(row)
    rtx = matrix.release_row("tensorrt_rtx", "1.7.1")
    assert matrix.source_text(rtx, ("sm",)).startswith("tensorrt-rtx-1.7 (unverified: ")
    assert matrix.verdict(rtx) == "partly verified" and matrix.verdict(row) == "verified"


def test_docs_list_every_row_as_the_matrix_renders_it() -> None:
    """docs/compat.md embeds `python -m dsa_export.compat.matrix_doc`; regenerate it after editing the matrix."""
    text = DOCS.read_text(encoding="utf-8")
    listing = text[text.index(DOC_BEGIN) : text.index(DOC_END) + len(DOC_END)] + "\n"
    assert listing == render_markdown(load_matrix())


def test_the_markdown_command_prints_the_listing(capsys) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out == render_markdown(load_matrix())
    assert all(f"`{row['id']}`" in out for _, row in load_matrix().rows())
