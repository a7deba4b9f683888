"""FP8 cache pools in validation: which queries' cache entries two runtimes stored a rounding step
apart.

A paged graph with ``--kv-cache-dtype fp8`` writes uint8 e4m3 codes (``present_*`` pools). A value
the reference and ONNX Runtime compute a last bit apart may sit on an FP8 rounding midpoint and take
the neighbouring code in one of them, which moves every output that reads it by up to one e4m3 step
of that value. Validation stays elementwise: :func:`code_flips` finds the writers of such codes, and
:func:`dsa_export.validate.selections.compare_selections` treats them as diverged from that layer on,
so the queries that read them are left out like near-tie flips (and counted).
"""

from __future__ import annotations

import numpy as np


def code_flips(expected, actual, pools: list[str], layers: list[int], feed: dict, past: int,
                queries: tuple[int, int]) -> dict[int, np.ndarray]:
    """``{indexer layer: [B,S] queries}`` whose entry of an FP8 cache pool (``present_*`` uint8
    e4m3 codes) holds a neighbouring code in the two runtimes: a value one of them computed a last
    bit apart sat on an FP8 rounding midpoint. The queries that read such an entry are expected to
    move by up to one e4m3 step of that value; compare_selections treats the writer as diverged
    from that layer on, so its readers are left out of the strict comparison. A pool of layer ``l``
    is counted at the last full indexer layer ``<= l`` (the selection layer ``l`` reads). Codes
    further apart are not flips: they stay in the comparison and fail it."""
    if "block_table" not in feed:
        return {}
    table = np.asarray(feed["block_table"])
    full = sorted({int(name.rsplit("_", 1)[1]) for name in expected
                   if name.startswith("present_index_key_pool_")})
    if len(full) != len(layers):
        return {}
    at = dict(zip(full, layers))
    flips: dict[int, np.ndarray] = {}
    for name in pools:
        if name not in expected or name not in actual:
            continue
        ref, ours = (np.asarray(x).astype(np.int16) for x in (expected[name], actual[name]))
        if ref.shape != ours.shape or ref.ndim < 2:
            continue
        differ = ref != ours
        neighbours = differ & (np.abs(ref - ours) <= 1) & ((ref >> 7) == (ours >> 7))
        rows = neighbours.reshape(*ref.shape[:2], -1).any(-1)  # [pages, page]
        if not rows.any():
            continue
        layer = int(name.rsplit("_", 1)[1])
        owner = max((f for f in full if f <= layer), default=None)
        key = at[owner] if owner is not None else layers[0]
        mask = flips.setdefault(key, np.zeros(queries, dtype=bool))
        for b in range(queries[0]):
            for s in range(queries[1]):
                position = past + s
                block = position // ref.shape[1]
                if block < table.shape[1] and 0 <= table[b, block] < ref.shape[0]:
                    mask[b, s] |= rows[table[b, block], position % ref.shape[1]]
    return flips
