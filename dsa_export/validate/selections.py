"""Top-k selections of our indexers against the reference's, with near-tie flips told apart.

At real widths two keys can score within float rounding of each other at the k-th place; which of
them an implementation keeps is then arbitrary, and that one swapped key moves the query's output
measurably (seen: float64 gap 2.5e-6 on scores of 0.064, logits moved 0.095 while the median
error was 3e-6). A pointwise bound cannot judge that, so each query row is classified:

* equal: the same set of keys (restricted to the keys the query may see);
* near-tie flip: our keys are still a top set of the reference's scores up to ``tol``: every key
  we kept scores at least every key we left out minus ``tol = tie_atol + tie_rtol * max|score|``
  of the row (for a swap at the k-th place: the two keys are within ``tol``); the row's outputs are
  then excluded from the strict comparison (they are expected to differ) and counted;
* propagated: the query's own state diverged through an earlier flip, or the same top-set test
  holds once the keys of diverged positions (whose indexer keys moved) are set aside;
* unexplained: anything else, a real fault.

Later layers inherit the diverged positions of earlier ones (a flipped query's hidden state differs
from there on), so a slice is judged layer by layer in order. A query that attended to a diverged
key is *tainted* from the next layer on: its state moved a little, so a later difference in its
own selection is propagated too, but its outputs stay under the strict bounds (at real width one
key of 2048 moves an output far less than the bounds; in tiny tie-prone models it may not, which is
why their tests use 16 indexer heads or a single layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class LayerSelections:
    """How one indexer layer's selections compare with the reference's."""

    layer: int
    rows: int = 0
    #: mean over rows of |ours & reference| / |reference|
    overlap: float = 1.0
    near_tie_rows: int = 0
    #: rows that differ only by keys of positions diverged in earlier layers or rows
    propagated_rows: int = 0
    unexplained_rows: int = 0
    #: largest |score - k-th score| / max|score| among the near-tie keys
    max_near_tie_gap: float = 0.0
    #: a few unexplained rows: (batch, query, keys only we chose, keys only the reference chose)
    examples: list[tuple[int, int, list[int], list[int]]] = field(default_factory=list)


def _allowed(indices: np.ndarray, limit: int) -> np.ndarray:
    row = indices[(indices >= 0) & (indices < limit)]
    return np.unique(row)


def compare_layer(layer: int, ours: np.ndarray, reference: np.ndarray, scores: np.ndarray, lengths: np.ndarray,
                  diverged: np.ndarray, *, tie_rtol: float, tie_atol: float = 0.0, past: int = 0,
                  max_examples: int = 3, tainted: np.ndarray | None = None) -> LayerSelections:
    """Classify every valid query row of one layer; ``diverged`` ``[B,S]`` (bool, updated in place)
    marks queries whose outputs are expected to differ from here on; ``tainted`` (read only) marks
    queries that attended to a diverged key in an earlier layer.

    Args:
        ours, reference: ``[B,S,k]`` selected key positions (order irrelevant, -1 padding).
        scores: the reference's index scores ``[B,S,T]`` (masked entries may be -inf).
        lengths: valid keys per batch row.
        past: keys before the first query (query s sits at position past + s).
    """
    result = LayerSelections(layer)
    b_size, s_size = ours.shape[:2]
    overlaps = []
    for b in range(b_size):
        length = int(lengths[b])
        for s in range(min(s_size, max(0, length - past))):
            limit = min(past + s + 1, length)
            mine, theirs = _allowed(ours[b, s], limit), _allowed(reference[b, s], limit)
            if not theirs.size:
                continue
            result.rows += 1
            same = np.intersect1d(mine, theirs, assume_unique=True).size
            overlaps.append(same / theirs.size)
            if same == theirs.size == mine.size:
                continue
            only_ours = np.setdiff1d(mine, theirs, assume_unique=True)
            only_theirs = np.setdiff1d(theirs, mine, assume_unique=True)
            row = scores[b, s, :limit].astype(np.float64)
            finite = row[np.isfinite(row)]
            scale = float(np.abs(finite).max()) if finite.size else 0.0
            tol = tie_atol + tie_rtol * scale
            # Keys whose own state diverged upstream may score anything now; among the others, our
            # choice must be a top set of the reference scores up to ``tol``: every kept key
            # scores at least every left-out key, minus tol.
            rel = np.arange(limit) - past
            key_diverged = (rel >= 0) & diverged[b, np.clip(rel, 0, s_size - 1)]
            chosen = np.zeros(limit, dtype=bool)
            chosen[mine] = True
            kept = row[chosen & ~key_diverged]
            left = row[~chosen & ~key_diverged & np.isfinite(row)]
            gap = float(left.max() - kept.min()) if kept.size and left.size else 0.0
            differing = np.concatenate([only_ours, only_theirs])
            own = bool(diverged[b, s]) or (tainted is not None and bool(tainted[b, s]))
            if own:
                result.propagated_rows += 1  # this query's own state already differs upstream
            elif gap <= tol:
                if key_diverged[differing].any():
                    result.propagated_rows += 1  # a diverged key moved in or out of the top set
                else:
                    result.near_tie_rows += 1
                    if scale:
                        result.max_near_tie_gap = max(result.max_near_tie_gap, max(gap, 0.0) / scale)
            else:
                result.unexplained_rows += 1
                if len(result.examples) < max_examples:
                    result.examples.append((b, s, only_ours.tolist()[:8], only_theirs.tolist()[:8]))
            diverged[b, s] = True
    result.overlap = float(np.mean(overlaps)) if overlaps else 1.0
    return result


def compare_selections(ours: dict[int, np.ndarray], reference: dict[int, tuple[np.ndarray, np.ndarray]],
                       lengths: np.ndarray, *, tie_rtol: float, tie_atol: float = 0.0,
                       diverged: np.ndarray | None = None, past: int = 0,
                       flipped: dict[int, np.ndarray] | None = None) -> tuple[list[LayerSelections], np.ndarray]:
    """Every layer in order; returns the per-layer results and the final mask ``[B,S]`` of queries
    whose outputs may differ: diverged selections, and queries that attended to a diverged key
    (``past``: cached keys before the first query, in a decode step). ``flipped`` ``{layer: [B,S]}``
    marks queries whose cache entries two runtimes stored a rounding step apart (FP8 caches): they
    count as diverged from that layer on."""
    layers = sorted(reference)
    if sorted(ours) != layers:
        raise RuntimeError(f"indexer layers differ: ours {sorted(ours)}, reference {layers}")
    first = ours[layers[0]] if layers else None
    if diverged is None:
        shape = first.shape[:2] if first is not None else (0, 0)
        diverged = np.zeros(shape, dtype=bool)
    tainted = np.zeros_like(diverged)
    results = []
    for layer in layers:
        if flipped and layer in flipped:
            diverged |= flipped[layer]
        results.append(compare_layer(layer, ours[layer], reference[layer][0], reference[layer][1], lengths, diverged,
                                     tie_rtol=tie_rtol, tie_atol=tie_atol, past=past, tainted=tainted))
        _taint(reference[layer][0], diverged, tainted, past)
    return results, diverged | tainted


def _taint(selected: np.ndarray, diverged: np.ndarray, tainted: np.ndarray, past: int = 0) -> None:
    """Mark queries whose selection includes a diverged position (their attention read it); query
    ``s`` sits at key position ``past + s``, and cached keys never diverge."""
    for b in range(selected.shape[0]):
        if not diverged[b].any():
            continue
        keys = selected[b] - past
        valid = (keys >= 0) & (keys < diverged.shape[1])
        hit = (diverged[b][np.where(valid, keys, 0)] & valid).any(-1)
        tainted[b] |= hit
