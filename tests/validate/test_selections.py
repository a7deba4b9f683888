"""Selections vs the reference's: equal rows, near-tie flips, propagated divergence, real faults."""

from __future__ import annotations

import numpy as np

from dsa_export.validate.selections import compare_layer, compare_selections


def _case(seed=0, s=12, t=12, k=4):
    """Scores with distinct values, the reference's top-k of each causal row, and a copy as ours."""
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.1, 1.0, size=(1, s, t))
    reference = np.full((1, s, k), -1, dtype=np.int32)
    for q in range(s):
        allowed = q + 1
        top = np.argsort(-scores[0, q, :allowed], kind="stable")[: min(k, allowed)]
        reference[0, q, : top.size] = top
    return scores, reference, reference.copy()


def test_identical_selections_are_equal_rows():
    scores, reference, ours = _case()
    result = compare_layer(0, ours, reference, scores, np.array([12]), np.zeros((1, 12), bool), tie_rtol=1e-4)
    assert result.rows == 12 and result.overlap == 1.0
    assert result.near_tie_rows == result.unexplained_rows == result.propagated_rows == 0


def test_a_swap_at_the_kth_place_within_tolerance_is_a_near_tie_flip():
    scores, reference, ours = _case()
    q = 9
    kth_key = int(reference[0, q, -1])
    outside = next(t for t in range(q + 1) if t not in set(reference[0, q].tolist()))
    scores[0, q, outside] = scores[0, q, kth_key] - 2e-6  # just below the k-th score
    ours[0, q, -1] = outside
    diverged = np.zeros((1, 12), bool)
    result = compare_layer(0, ours, reference, scores, np.array([12]), diverged, tie_rtol=1e-4)
    assert result.near_tie_rows == 1 and result.unexplained_rows == 0
    assert 0 < result.max_near_tie_gap < 1e-4
    assert diverged[0, q] and diverged.sum() == 1  # that query's outputs are expected to differ
    assert result.overlap == (11 + 3 / 4) / 12


def test_the_same_swap_beyond_tolerance_is_unexplained():
    scores, reference, ours = _case()
    q = 9
    outside = next(t for t in range(q + 1) if t not in set(reference[0, q].tolist()))
    ours[0, q, -1] = outside  # a key far below the k-th score
    result = compare_layer(0, ours, reference, scores, np.array([12]), np.zeros((1, 12), bool), tie_rtol=1e-4)
    assert result.unexplained_rows == 1 and result.near_tie_rows == 0
    b, query, only_ours, only_theirs = result.examples[0]
    assert (b, query, only_ours) == (0, q, [outside])


def test_later_layers_inherit_divergence():
    """A query flipped in layer 0 may differ in layer 1 for any reason, and a later query that
    swaps in that query's key (its indexer key moved) is explained by the same flip."""
    scores, reference, ours0 = _case(seed=1)
    q = 10
    kth_key = int(reference[0, q, -1])
    outside = next(t for t in range(q + 1) if t not in set(reference[0, q].tolist()))
    scores[0, q, outside] = scores[0, q, kth_key]  # an exact tie
    ours0[0, q, -1] = outside
    scores1, reference1, ours1 = _case(seed=2)
    scores1[0, 11, q] = 0.01  # key q is the worst key of query 11 in layer 1...
    reference1[0, 11] = np.argsort(-scores1[0, 11, :12], kind="stable")[:4]
    ours1 = reference1.copy()
    ours1[0, q] = [0, 1, 2, 3]  # anything: query q already diverged
    ours1[0, 11, -1] = q  # ...yet we pick it: its key moved with the flip in layer 0
    results, diverged = compare_selections({0: ours0, 1: ours1}, {0: (reference, scores), 1: (reference1, scores1)},
                                           np.array([12]), tie_rtol=1e-4)
    assert results[0].near_tie_rows == 1
    assert results[1].unexplained_rows == 0 and results[1].propagated_rows == 2
    assert diverged[0, q] and diverged[0, 11]
    # Without the flip in layer 0 the same layer-1 selection is a real fault (query q; query 11
    # then follows from it).
    results, _ = compare_selections({1: ours1}, {1: (reference1, scores1)}, np.array([12]), tie_rtol=1e-4)
    assert results[0].unexplained_rows == 1 and results[0].examples[0][1] == q


def test_padding_and_masked_keys_do_not_count():
    scores, reference, ours = _case()
    ours[0, 11] = [-1, 50, 7, 7]  # out-of-range / duplicate entries are not keys
    reference[0, 11] = [7, -1, -1, -1]
    result = compare_layer(0, ours, reference, scores, np.array([8]), np.zeros((1, 12), bool), tie_rtol=1e-4)
    assert result.rows == 8  # rows past the length are not judged


def test_a_decode_step_judges_its_queries_after_the_past():
    """Queries of a decode step sit after ``past`` cached keys: query s may see keys 0..past+s, a
    flip at its k-th place is a near tie there, and a later query that picks that query's key is
    explained by it (the key of position past + s moved with it); cached keys never diverge."""
    past, s, k = 6, 4, 3
    rng = np.random.default_rng(3)
    scores = rng.uniform(0.1, 1.0, size=(1, s, past + s))
    reference = np.stack([np.argsort(-scores[0, q, :past + q + 1], kind="stable")[:k] for q in range(s)])[None]
    ours = reference.copy()
    q = 1
    kth_key = int(reference[0, q, -1])
    outside = next(t for t in range(past + q + 1) if t not in set(reference[0, q].tolist()))
    scores[0, q, outside] = scores[0, q, kth_key] - 1e-7
    ours[0, q, -1] = outside
    results, diverged = compare_selections({0: ours}, {0: (reference, scores)}, np.array([past + s]), tie_rtol=1e-4,
                                           past=past)
    assert results[0].rows == s and results[0].near_tie_rows == 1 and results[0].unexplained_rows == 0
    # Query 1 diverged; a later query whose selection holds its key (position past + 1) read a
    # moved key, so its output may differ too.
    reads_it = [r > q and past + q in reference[0, r] for r in range(s)]
    assert diverged.tolist() == [[r == q or reads_it[r] for r in range(s)]]
    # Without ``past`` the same rows are judged as if the queries started at key 0: keys past the
    # query's own position count as selected out of range, and the comparison is wrong.
    wrong, _ = compare_selections({0: ours}, {0: (reference, scores)}, np.array([past + s]), tie_rtol=1e-4)
    assert wrong[0].rows != s or wrong[0].overlap != results[0].overlap


def test_present_caches_exclude_the_positions_after_the_past():
    from dsa_export.validate.compare import _aligned

    mask = np.array([[False, True, False]])
    assert _aligned(mask, (1, 3, 8), past=5).tolist() == mask.tolist()
    cache = _aligned(mask, (1, 8, 40), past=5)
    assert cache.tolist() == [[False] * 5 + [False, True, False]]
    assert _aligned(mask, (1, 7, 40), past=5) is None and _aligned(mask, (2, 3), past=0) is None


def _pools(flip_at=None, far=False):
    """Two runtimes' FP8 pools (one layer's latent, full indexer layer 0): page 4, 2 rows of 6
    queries after a past of 2, rows' pages shuffled through the pool; optionally one code differs."""
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 0x7E, size=(5, 4, 8), dtype=np.int16)
    codes[codes & 0x7F == 0x7F] = 0x10  # never NaN
    ours = codes.copy()
    table = np.array([[3, 1, 4], [0, 2, -1]], dtype=np.int32)
    if flip_at is not None:
        b, s = flip_at
        position = 2 + s
        page, row = table[b, position // 4], position % 4
        ours[page, row, 5] += 9 if far else 1
    expected = {"present_latent_pool_0": codes.astype(np.uint8), "present_index_key_pool_0": codes.astype(np.uint8)}
    actual = {"present_latent_pool_0": ours.astype(np.uint8), "present_index_key_pool_0": codes.astype(np.uint8)}
    return expected, actual, {"block_table": table}


def test_an_fp8_code_rounded_to_its_neighbour_marks_its_writer_and_only_it():
    from dsa_export.validate.cache_codes import code_flips

    pools = ["present_latent_pool_0", "present_index_key_pool_0"]
    expected, actual, feed = _pools()
    assert code_flips(expected, actual, pools, [7], feed, 2, (2, 6)) == {}
    expected, actual, feed = _pools(flip_at=(1, 3))
    flips = code_flips(expected, actual, pools, [7], feed, 2, (2, 6))
    assert list(flips) == [7] and flips[7].sum() == 1 and flips[7][1, 3]  # keyed by the indexer layer
    # A code further away is a real difference: not a flip (the strict comparison fails on it).
    expected, actual, feed = _pools(flip_at=(1, 3), far=True)
    assert code_flips(expected, actual, pools, [7], feed, 2, (2, 6)) == {}


def test_the_readers_of_a_flipped_code_are_left_out_and_counted_as_propagated():
    scores, reference, ours = _case(s=12, t=12, k=4)
    writer = 2
    readers = {q for q in range(12) if writer in set(reference[0, q].tolist())} - {writer}
    assert readers
    _, mask = compare_selections({0: ours}, {0: (reference, scores)}, np.array([12]), tie_rtol=1e-4)
    assert not mask.any()
    flipped = {0: np.zeros((1, 12), bool)}
    flipped[0][0, writer] = True
    results, mask = compare_selections({0: ours}, {0: (reference, scores)}, np.array([12]), tie_rtol=1e-4,
                                       flipped=flipped)
    assert set(np.flatnonzero(mask[0])) == readers | {writer}
    assert results[0].unexplained_rows == 0
