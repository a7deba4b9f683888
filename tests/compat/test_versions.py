"""The version range language and the vendor version encodings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsa_export.compat.versions import (
    decode_cuda_version,
    decode_cudnn_version,
    decode_tensorrt_version,
    format_version,
    parse_version,
    version_matches,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12.4.1+cu124", (12, 4, 1)),
        ("2.13.0+cpu", (2, 13, 0)),
        ("580.65.06", (580, 65, 6)),
        ("v8", (8,)),
        ("", None),
        (None, None),
    ],
)
def test_parse_version(text: str | None, expected: tuple[int, ...] | None) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize(
    ("version", "spec", "expected"),
    [
        ("12.4.1", "12.4", True),
        ("12.40", "12.4", False),
        ("12.5", "12.0-12.5", True),
        ("12.5.1", "12.0-12.5", True),
        ("12.6", "12.0-12.5", False),
        ("11.8", ["11.0-11.8", "12.0-12.5"], True),
        ("13.0", ["11.0-11.8", "12.0-12.5"], False),
        ("8.0.5", ">=8.0.5,<8.2.0", True),
        ("8.1.1", ">=8.0.5,<8.2.0", True),
        ("8.2.0", ">=8.0.5,<8.2.0", False),
        ("8.0.4", ">=8.0.5,<8.2.0", False),
        ("12.9.1", "<=12.9", True),
        ("11.0.0.15", ">=11", True),
        ("10.13.3", ">=11", False),
        ("7.0", "7.5-9.0", False),
        ("9.0", "7.5-9.0", True),
        ("12.1", ["7.5", "8.6", "8.9", "12.0"], False),
        ("535.183.01", ">=580", False),
        ("580.95.05", ">=580.65.06", True),
        ("13.0", ">12", True),
    ],
)
def test_version_matches(version: str, spec: str | list[str], expected: bool) -> None:
    assert version_matches(version, spec) is expected


def test_unknown_version_matches_nothing() -> None:
    assert not version_matches(None, ">=0")


def test_bad_spec_is_rejected() -> None:
    with pytest.raises(ValueError):
        version_matches("1.0", ">=abc")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (8005, (8, 0, 5)),
        (8200, (8, 2, 0)),
        (8907, (8, 9, 7)),
        (90100, (9, 1, 0)),
        (91300, (9, 13, 0)),
        (7605, (7, 6, 5)),
    ],
)
def test_decode_cudnn_version(raw: int, expected: tuple[int, ...]) -> None:
    assert decode_cudnn_version(raw) == expected


def test_decode_cuda_and_tensorrt_versions() -> None:
    assert decode_cuda_version(12040) == (12, 4)
    assert decode_cuda_version(13000) == (13, 0)
    assert decode_tensorrt_version(8601) == (8, 6, 1)
    assert decode_tensorrt_version(100300) == (10, 3, 0)
    assert decode_tensorrt_version(10701) == (1, 7, 1)  # TensorRT-RTX 1.7.1


@given(st.lists(st.integers(min_value=0, max_value=999), min_size=1, max_size=4))
def test_parse_format_round_trip(parts: list[int]) -> None:
    version = tuple(parts)
    assert parse_version(format_version(version)) == version
    assert version_matches(version, format_version(version) or "")
    assert version_matches(version, f">={format_version(version)}")
    assert not version_matches(version, f"<{format_version(version)}")
