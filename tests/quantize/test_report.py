"""Report metrics on hand-made inputs, where the right answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsa_export.quantize.report import cosine, selection_overlap, sqnr_db


def test_selection_overlap_compares_rows_as_sets_and_ignores_padding():
    ref = np.array([[[0, 1, 2, 3], [5, 4, -1, -1], [-1, -1, -1, -1]]], dtype=np.int32)
    got = np.array([[[3, 2, 1, 0], [4, 6, -1, -1], [2, -1, -1, -1]]], dtype=np.int32)
    # row 0: same set in another order; row 1: one of two kept; row 2: nothing selected -> dropped
    assert selection_overlap(ref, got, num_keys=8).tolist() == [1.0, 0.5]


def test_selection_overlap_counts_a_quantized_row_padding_as_a_miss():
    ref = np.array([[[0, 1, 2, 3]]])
    got = np.array([[[0, 1, -1, -1]]])
    assert selection_overlap(ref, got, num_keys=4).tolist() == [0.5]


def test_cosine_and_sqnr():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=10_000)
    noise = rng.normal(size=10_000) * 0.1
    assert cosine(ref, ref) == pytest.approx(1.0)
    assert cosine(ref, -ref) == pytest.approx(-1.0)
    assert sqnr_db(ref, ref + noise) == pytest.approx(20.0, abs=0.3)  # noise power is 1% of the signal
    assert sqnr_db(ref, ref) == math.inf
