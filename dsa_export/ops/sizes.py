"""What each ``dsa`` op's outputs measure and how much memory its ONNX function body works in.

The contract (:mod:`dsa_export.ops.contract`) hands these functions to its op specs
(``OpSpec.output_dims``, ``OpSpec.workspace_bytes``), so that the exporter (output shapes of the
custom nodes), the memory estimates of the runtimes and of validation, and anyone else ask the spec
instead of keeping a copy of the rules. Imports nothing: the contract imports this module.

``output_dims(dims, attrs)``: the output's dims from the input dims (ints, or symbolic names as in a
graph's value_info: they are passed through, never computed on).

``workspace_bytes(shapes, attrs)``: peak working memory (bytes) of the node's function body on
ONNX Runtime for concrete input shapes (None where a shape is unknown: the estimate is then 0).
The bodies bound it by working on chunks of query rows of at most :data:`CHUNK_ELEMENTS` score
elements; when a body changes, change its formula here (tests/runtime/test_memory_estimate.py
measures the formulas against ONNX Runtime's peak resident set). The formulas follow the bodies
(:mod:`dsa_export.ops.attention_onnx`, :mod:`dsa_export.ops.paged_onnx`,
:mod:`dsa_export.ops.block_onnx`, :mod:`dsa_export.ops.moe_onnx`), all intermediates in float32:

- ``DSAIndexerTopK(q [B,S,H,D], k [B,T,D], w [B,S,H])``: the body works on chunks of ``rows``
  queries, ``rows = clamp(CHUNK_ELEMENTS // (B*H*(T+topk)), 1, S)`` as the body picks it. Alive
  at once: the float32 queries (cast and scaled, ``2*B*S*H*D``), the transposed keys
  (``B*T*D``), one chunk's ``[B,rows,H,T]`` products (twice: MatMul, ReLU) and its
  ``[B,rows,T+topk]`` score, mask and padded tensors (about four), and the selection three
  times (the loop's stacked chunks, their reordered copy, the sliced result, ``B*S*topk``):
  ``4 * (2*B*S*H*D + B*T*D + 2*rows*B*H*T + 4*rows*B*(T+topk) + 3*B*S*topk)``.
- ``DSASparseAttention(q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,Tv,Hkv,Dv], indices [B,S,K])``: the
  body copies the keys (and values, when v has rows) into one row table (``B*T*Hkv*(Dk+Cv)``,
  Cv = Dv or 0), casts the queries (``B*S*H*Dk``), holds the indices as int64 with their mask
  (``17*B*S*K`` bytes), and per chunk of ``rows = clamp(CHUNK_ELEMENTS // (B*K*(Hkv*(Dk+Dv)+3H)),
  1, S)`` queries the gathered rows and their key/value slices (three copies of
  ``B*rows*K*Hkv*(Dk+Dv)``) and the logits/probabilities (three of ``B*rows*H*K``); the output
  three times (``B*S*H*Dv``). No term grows with S x T.
- ``DSAIndexerTopKPaged`` / ``DSASparseAttentionPaged``: the same with T = M*page keys read
  through the block table; the indexer gathers the rows' keys a span of pages at a time (at
  most :data:`KEY_CHUNK_ELEMENTS` values: no copy of a row's key cache), the attention only the
  pool rows a chunk selected. No term grows with the pool.
- ``DSAIndexerTopKPagedFP8`` / ``DSASparseAttentionPagedFP8``: the paged bodies over uint8 FP8
  codes; each span (indexer) or chunk (attention) also holds its gathered codes (1 byte), their
  int32 table indices and the decoded and scaled float32 values; the attention's selected rows
  are ``C`` codes, ``C / block_size`` scales and ``R`` RoPE channels, concatenated into ``C+R``-wide
  key rows. The ``cast`` bodies TensorRT(-RTX) builds (:mod:`dsa_export.ops.paged_onnx`) add a
  float16 copy of the code pool (``2*P*page*...`` bytes), which ONNX Runtime never runs.
- ``DSABlockSparseAttention(q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,T,Hkv,Dv], block_index
  [B,H,nqb,Kb])`` (attribute ``block_size`` bs): the body holds the scaled queries padded to
  ``nqb*bs`` rows and laid out in blocks (two copies), the keys and values as rows of one block
  (``B*Hkv*(nkb+1)`` blocks, two copies), one chunk of ``rows`` query blocks (gathered blocks,
  scores, masks and probabilities: ``B*H*Kb*(bs*(Dk+Dv+4bs)+Kb)`` values a query block, ``rows``
  as the body picks it from its ``CHUNK_ELEMENTS``) and the output twice (the loop's stacked
  chunks and their reordered copy): ``2*B*nqb*bs*H*Dk*4 + 2*B*Hkv*(nkb+1)*bs*(Dk+Dv)*4 +
  rows*per_block*4 + 2*B*nqb*bs*H*Dv*4``. It grows with the selected blocks, never with S x T.
- ``DSAMoEExperts`` / ``DSAMoEExpertsFP8(x [N,H], ..., gate_up [E,2I,H], down [E,H,I])``: the
  bodies loop over experts and tiles of at most 128 rows: ``x`` and the accumulator in float32,
  one expert's weights in float32 (the FP8 ``stack`` body: all of them) and one tile:
  ``2*N*H*4 + 3*I*H*4 + 128*(H+2I)*4``.

Other ops return 0 (the standard ops around them are small next to these).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

F32 = 4
#: Score elements one chunk of query rows may hold in the attention, indexer and block bodies.
CHUNK_ELEMENTS = 1 << 23
#: float32 key values (all rows together) one chunk of the paged indexer gathers from its pool (1 MiB).
KEY_CHUNK_ELEMENTS = 1 << 18

Dims = Sequence[Any]
Shapes = Sequence[tuple[int, ...] | None]


def _dims(shapes: Shapes, i: int, rank: int) -> tuple[int, ...] | None:
    shape = shapes[i] if i < len(shapes) else None
    return shape if shape is not None and len(shape) == rank else None


def _rows(s: int, per_row: int) -> int:
    """Query rows per chunk."""
    return max(1, min(s, CHUNK_ELEMENTS // max(1, per_row)))


# -- output dims ------------------------------------------------------------------------------------

def selection_dims(dims: list[Dims], attrs: dict[str, Any]) -> list[Any]:
    """``indices [B, S, topk]`` of an indexer (q is ``[B, S, H, D]``)."""
    q = dims[0]
    return [q[0], q[1], int(attrs["topk"])]


def attention_dims(dims: list[Dims], attrs: dict[str, Any]) -> list[Any]:
    """``out [B, S, H, Dv]``: q's first three dims and the value width (v / v_pool's last dim)."""
    q, v = dims[0], dims[2]
    return [q[0], q[1], q[2], v[3]]


def experts_dims(dims: list[Dims], attrs: dict[str, Any]) -> list[Any]:
    """``out [N, H]``: x's shape."""
    return list(dims[0])


def pool_dims(dims: list[Dims], attrs: dict[str, Any]) -> list[Any]:
    """``present [P, page, W]``: the pool's shape (a cache write returns the pool it writes)."""
    return list(dims[0])


# -- working memory ---------------------------------------------------------------------------------

def indexer_bytes(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """``DSAIndexerTopK(q [B,S,H,D], k [B,T,D], w [B,S,H])``: chunks of ``rows`` queries hold
    ``[rows,B,H,T]`` logits (+ ReLU), ``[rows,B,T]`` scores and masks, and TopK's values/indices."""
    q, k = _dims(shapes, 0, 4), _dims(shapes, 1, 3)
    if q is None or k is None:
        return 0
    b, s, h, d = q
    t = k[1]
    topk = int(attrs.get("topk", 0))
    rows = _rows(s, b * h * (t + topk))
    return F32 * (2 * b * s * h * d + b * t * d + 2 * rows * b * h * t + 4 * rows * b * (t + topk) + 3 * b * s * topk)


def indexer_paged_bytes(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """``DSAIndexerTopKPaged(q, k_pool [P,page,D], w, block_table [B,M])``: per chunk of queries, the
    keys are read in spans of pages (at most :data:`KEY_CHUNK_ELEMENTS` values), each scored into
    ``[B,rows,span*page]``; the chunk's ``[B,rows,T]`` scores are stacked, reordered and masked as
    the contiguous indexer's."""
    q, pool, table = _dims(shapes, 0, 4), _dims(shapes, 1, 3), _dims(shapes, 3, 2)
    if q is None or pool is None or table is None:
        return 0
    b, s, h, d = q
    page, blocks = pool[1], table[1]
    t = blocks * page
    topk = int(attrs.get("topk", 0))
    rows = _rows(s, b * h * (t + topk))
    span = max(1, min(blocks, KEY_CHUNK_ELEMENTS // max(1, b * page * d))) * page
    return F32 * (2 * b * s * h * d + 2 * b * span * d + 2 * rows * b * h * span + 9 * rows * b * (t + topk)
                  + 4 * b * s * topk)


def indexer_paged_fp8_bytes(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """``DSAIndexerTopKPagedFP8(q, k_pool [P,page,D] uint8, k_scale_pool, w, block_table [B,M], ...)``:
    :func:`indexer_paged_bytes` with each span's codes decoded (uint8 codes, int32 table indices,
    decoded and scaled float32 keys: 13 bytes a key value instead of 8)."""
    q, pool, table = _dims(shapes, 0, 4), _dims(shapes, 1, 3), _dims(shapes, 4, 2)
    if q is None or pool is None or table is None:
        return 0
    b, _, _, d = q
    page, blocks = pool[1], table[1]
    span = max(1, min(blocks, KEY_CHUNK_ELEMENTS // max(1, b * page * d))) * page
    return (indexer_paged_bytes([q, (pool[0], page, d), None, table], attrs)
            + (F32 + 1) * b * span * d + b * span * F32)


def attention_fp8_dims(dims: list[Dims], attrs: dict[str, Any]) -> list[Any]:
    """``out [B, S, H, C]``: q's first three dims and the width of the codes (k_pool's last dim)."""
    q, k_pool = dims[0], dims[1]
    return [q[0], q[1], q[2], k_pool[3]]


def attention_fp8_row_values(hkv: int, c: int, r: int, h: int) -> int:
    """float32 values one selected slot of one query row costs the FP8 attention body (what its
    chunking divides :data:`CHUNK_ELEMENTS` by, times ``B*K``): codes as table indices, decoded,
    scaled (``3C``), the RoPE channels cast (``R``), the concatenated and masked key rows
    (``2(C+R)``) and the product with the probabilities (``C+R``) per kv head, and ``3H``
    logits/probabilities."""
    return hkv * (6 * c + 4 * r) + 3 * h


def attention_paged_fp8_bytes(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """``DSASparseAttentionPagedFP8(q [B,S,H,C+R], k_pool [P,page,Hkv,C] uint8, k_scale_pool,
    k_rope_pool [P,page,Hkv,R], indices [B,S,K], block_table [B,M])``: per chunk only the selected
    rows' codes, scales and RoPE channels, decoded into ``C+R``-wide float32 key rows (the pools
    are viewed, never copied or cast)."""
    q, k_pool, rope = _dims(shapes, 0, 4), _dims(shapes, 1, 4), _dims(shapes, 3, 4)
    index, table = _dims(shapes, 4, 3), _dims(shapes, 5, 2)
    if q is None or k_pool is None:
        return 0
    b, s, h, dk = q
    hkv, c = k_pool[2], k_pool[3]
    r = rope[3] if rope is not None else max(0, dk - c)
    k_sel = index[2] if index is not None else (table[1] * k_pool[1] if table is not None else 1)
    per_slot = attention_fp8_row_values(hkv, c, r, h)
    rows = _rows(s, b * k_sel * per_slot)
    return (F32 * (b * s * h * dk + rows * b * k_sel * per_slot + 3 * b * s * h * c)
            + rows * b * k_sel * hkv * c + 56 * rows * b * k_sel)


def attention_bytes(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """``DSASparseAttention(q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,Tv,Hkv,Dv], indices [B,S,K])``: the
    keys with a padding row, then per chunk the gathered keys/values of ``K`` selected rows and the
    ``[rows,B,H,K]`` probabilities."""
    q, k, v, index = _dims(shapes, 0, 4), _dims(shapes, 1, 4), _dims(shapes, 2, 4), _dims(shapes, 3, 3)
    if q is None or k is None:
        return 0
    b, s, h, dk = q
    t, hkv = k[1], k[2]
    dv = v[3] if v is not None else dk
    cv = dv if v is not None and v[1] > 0 else 0
    k_sel = index[2] if index is not None else t
    rows = _rows(s, b * k_sel * (hkv * (dk + dv) + 3 * h))
    return (F32 * (b * t * hkv * (dk + cv) + b * s * h * dk + 3 * rows * b * k_sel * hkv * (dk + dv)
                   + 3 * rows * b * h * k_sel + 3 * b * s * h * dv) + 17 * b * s * k_sel)


def attention_paged_bytes(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """``DSASparseAttentionPaged``: per chunk the selected pool rows only (the pools are viewed,
    never copied)."""
    q, k_pool, v_pool = _dims(shapes, 0, 4), _dims(shapes, 1, 4), _dims(shapes, 2, 4)
    index, table = _dims(shapes, 3, 3), _dims(shapes, 4, 2)
    if q is None or k_pool is None:
        return 0
    b, s, h, dk = q
    hkv = k_pool[2]
    dv = v_pool[3] if v_pool is not None else dk
    k_sel = index[2] if index is not None else (table[1] * k_pool[1] if table is not None else 1)
    rows = _rows(s, b * k_sel * (hkv * (dk + dv) + 3 * h))
    return (F32 * (b * s * h * dk + 4 * rows * b * k_sel * hkv * (dk + dv) + 3 * rows * b * h * k_sel
                   + 3 * b * s * h * dv) + 56 * rows * b * k_sel)


def block_attention_bytes(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """``DSABlockSparseAttention(q, k, v, block_index [B,H,nqb,Kb])``: padded q/k/v blocks, then per
    chunk of query blocks the gathered key blocks and their ``bs x bs`` scores."""
    q, k, v, index = _dims(shapes, 0, 4), _dims(shapes, 1, 4), _dims(shapes, 2, 4), _dims(shapes, 3, 4)
    if q is None or k is None or v is None:
        return 0
    b, s, h, dk = q
    t, hkv, dv = k[1], k[2], v[3]
    bs = max(1, int(attrs.get("block_size", 1)))
    n_qb, n_kb = -(-s // bs), -(-t // bs)
    kb = max(1, index[3]) if index is not None else n_kb  # unknown list width: every key block
    per_block = b * h * kb * (bs * (dk + dv + 4 * bs) + kb)
    rows = _rows(n_qb, per_block)
    return (2 * b * n_qb * bs * h * dk * F32 + 2 * b * hkv * (n_kb + 1) * bs * (dk + dv) * F32
            + rows * per_block * F32 + 2 * b * n_qb * bs * h * dv * F32)


def experts_bytes(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """``DSAMoEExperts`` / ``DSAMoEExpertsFP8(x [N,H], ..., gate_up [E,2I,H], down [E,H,I])``: the
    output accumulator, one expert's weights at a time (dequantized for FP8) and its rows."""
    x, gate_up = _dims(shapes, 0, 2), _dims(shapes, 3, 3)
    if x is None or gate_up is None:
        return 0
    n, hidden = x
    _experts, two_i, _ = gate_up
    intermediate = two_i // 2
    return 2 * n * hidden * F32 + 3 * intermediate * hidden * F32 + 128 * (hidden + two_i) * F32
