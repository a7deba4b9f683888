"""ONNX function bodies of ``DSAIndexerTopKPaged`` and ``DSASparseAttentionPaged``, in bounded memory.

The paged ops read their keys (and values) from a pool of pages through a per-row block table:
logical key ``t`` of row ``b`` is ``pool[block_table[b, t // page], t % page]``. The bodies follow
the contiguous ones of :mod:`dsa_export.ops.attention_onnx` (same chunking over queries in a
``Loop``, same numerics, every shape a function of the input shapes, no termination condition):

* indexer: each chunk of queries reads the rows' keys a span of pages at a time in a nested
  ``Loop`` (``Gather`` of the block table's pages: ``[B, span, page, D]``, at most
  :data:`~dsa_export.ops.sizes.KEY_CHUNK_ELEMENTS` values), so no step copies a row's whole key
  cache; each span's ``[B, rows, span*page]`` scores are stacked into the chunk's ``[B, rows,
  M*page]`` and its ``TopK`` taken as the contiguous body does. Keys of pages whose table entry
  lies outside ``[0, P)``, past ``lengths[b]`` or (causal) after the query's position
  ``query_start[b] + s`` score ``-inf``;
* attention: each chunk turns its ``[B, rows, K]`` logical indices into pool rows
  (``page_id * page + t % page``) and gathers only those rows, per kv head, from the pools viewed
  as ``[P*page*Hkv, D]`` tables, straight into the ``[B, rows, Hkv, K, Dk]`` order the products
  need (no transpose of the selection): nothing of the pool is copied or cast whole, and no
  ``[B, S, T]`` tensor exists. Values from keys (``v_pool`` without pages, DeepSeek's absorbed
  MLA) need neither ``If`` nor a copy of the selected rows' first ``Dv`` channels: the
  probabilities multiply the whole key rows and the small ``[.., heads, Dk]`` result is cut to
  ``Dv``; the value-page path gathers ``K * has_v`` rows (``has_v = min(Pv, 1)``), so exactly one
  of the two paths contributes.

The pools must hold at least one page (``P >= 1``): invalid table entries gather page 0 (masked).

The FP8-cache forms (``DSAIndexerTopKPagedFP8``, ``DSASparseAttentionPagedFP8``) are these bodies
with the uint8 e4m3fn codes decoded as they are read: a 256-entry float32 table gathered by the
codes cast to int32 (exact), times the scales gathered alongside; see :data:`FP8_CACHE_BODIES` for
the construction TensorRT builds.
"""

from __future__ import annotations

import math

from onnx import AttributeProto, FunctionProto, TensorProto, helper

from dsa_export.ops.attention_onnx import (
    _chunk_rows,
    _chunk_topk,
    _chunking,
    _function,
    _loop,
    _one_d,
    _scalar,
    _unchunk,
)
from dsa_export.ops.contract import (
    DOMAIN,
    INDEXER_TOPK_PAGED,
    INDEXER_TOPK_PAGED_FP8,
    SPARSE_ATTENTION_PAGED,
    SPARSE_ATTENTION_PAGED_FP8,
)
from dsa_export.ops.onnx_graph import Body, replace_function
from dsa_export.ops.sizes import KEY_CHUNK_ELEMENTS

F32, F16, I32, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64


def _dims(b: Body, *scalars: str) -> str:
    return b("Concat", *(_one_d(b, x) for x in scalars), axis=0)


def indexer_paged_function(opset: int, spans: bool = True) -> FunctionProto:
    """Body of DSAIndexerTopKPaged; ``spans=False``: the form TensorRT(-RTX) builds (see
    :func:`use_whole_row_indexer`)."""
    return _indexer_paged(INDEXER_TOPK_PAGED, Body("idxp"), opset, "k_pool",
                          lambda u, page_ids: u("Cast", u("Gather", "k_pool", page_ids, axis=0), to=F32), spans)


def use_whole_row_indexer(model) -> bool:
    """Replace, in place, ``model``'s DSAIndexerTopKPaged body with the one that gathers each
    row's pages once per chunk of queries, without the nested Loop over key spans: TensorRT-RTX
    1.7's Myelin compiler fails on the nested Loop in Q/DQ stage graphs ("gvn.cpp:325:
    CHECK(graph().ssa_validation()) failed", a paged fp8 stage build); TensorRT's own buffers
    are its business, so the whole-row gather costs nothing there that ONNX Runtime pays for."""
    return replace_function(model, DOMAIN, INDEXER_TOPK_PAGED.name,
                            lambda opset: indexer_paged_function(opset, spans=False))


def _indexer_paged(spec, b: Body, opset: int, pool: str, read_pages, spans: bool = True) -> FunctionProto:
    """The paged indexer body; ``read_pages(u, page_ids [B,span]) -> [B,span,page,D]`` float32 keys
    of those pages, built in the key span's graph ``u``; ``pool`` is the [P,page,D] tensor whose
    shape gives the pages' size."""
    qf, wf = b("Cast", "q", to=F32), b("Cast", "w", to=F32)
    q_shape, pool_shape = b("Shape", "q"), b("Shape", pool)
    batch, s_len, heads = _scalar(b, q_shape, 0), _scalar(b, q_shape, 1), _scalar(b, q_shape, 2)
    n_pages, page, dim = _scalar(b, pool_shape, 0), _scalar(b, pool_shape, 1), _scalar(b, pool_shape, 2)
    blocks = _scalar(b, b("Shape", "block_table"), 1)
    t_len = b("Mul", blocks, page)  # logical key positions of a row: M * page
    topk = b.ref("topk", AttributeProto.INT)
    q_scaled = b("Mul", qf, b.ref("scale", AttributeProto.FLOAT))

    # Which pages a row reads: its table entries, invalid ones read page 0 (masked below).
    table = b("Cast", "block_table", to=I64)  # [B,M]
    page_ok = b("And", b("GreaterOrEqual", table, b.const(0)), b("Less", table, n_pages))
    pages = b("Where", page_ok, table, b.const(0))
    # Keys are read in chunks of ``span`` pages (at most KEY_CHUNK_ELEMENTS float32 values for
    # all rows), so no copy of a row's whole key cache is made; the last chunk re-reads the last
    # page for its padding pages, whose scores are cut off.
    span = b("Max", b("Min", blocks, b("Div", b.const(KEY_CHUNK_ELEMENTS), b("Max", b("Mul", b("Mul", batch, page), dim),
                                                                             b.const(1)))), b.const(1))
    key_trips = b("Div", b("Sub", b("Add", blocks, span), b.const(1)), span)
    span_pages = b("Range", b.const(0), span, b.const(1))
    last_block = b("Sub", blocks, b.const(1))
    span_keys = _dims(b, batch, b.const(1), b("Mul", span, page), dim)  # [B,1,span*page,D]
    per_row = b("Mul", b("Mul", batch, heads), b("Add", t_len, topk))
    rows, trips, offsets = _chunking(b, s_len, per_row)
    last_row = b("Sub", s_len, b.const(1))

    # What every chunk shares: key positions, which keys a row may select at all, the -inf padding.
    key_pos = b("Unsqueeze", b("Range", b.const(0), t_len, b.const(1)), b.const([0]))  # [1,T]
    key_ok = b("Reshape", b("Expand", b("Unsqueeze", page_ok, b.const([2])), _dims(b, batch, blocks, page)),
               _dims(b, batch, t_len), allowzero=1)  # [B,T]: the key's page entry is valid
    in_length = b("Less", key_pos, b("Unsqueeze", b("Cast", "lengths", to=I64), b.const([1])))  # [B,T]
    selectable = b("Unsqueeze", b("And", key_ok, in_length), b.const([1]))  # [B,1,T]
    first = b("Unsqueeze", b("Cast", "query_start", to=I64), b.const([1]))  # [B,1]
    key_pos3 = b("Unsqueeze", key_pos, b.const([0]))  # [1,1,T]
    not_causal = b("Equal", b.ref("causal", AttributeProto.INT), b.const(0))
    neg_inf = b("Constant", value=helper.make_tensor("v", F32, [], [float("-inf")]))
    topk_1d = _one_d(b, topk)
    # -inf columns only where a row has fewer than topk key positions (TopK needs topk values):
    # none at decode past topk, where appending topk of them cost TopK a third more work.
    short = _one_d(b, b("Max", b("Sub", topk, t_len), b.const(0)))
    pad = b("Expand", neg_inf, b("Concat", _one_d(b, batch), _one_d(b, rows), short, axis=0))  # [B,rows,<=topk]

    t = b.child("chunk")
    iteration, cond = f"{t.prefix}_i", f"{t.prefix}_cond"
    row = _chunk_rows(t, iteration, rows, offsets, last_row)  # [rows]
    q_c = t("Gather", q_scaled, row, axis=1)  # [B,rows,H,D]
    w_c = t("Unsqueeze", t("Gather", wf, row, axis=1), t.const([3]))  # [B,rows,H,1]
    if spans:
        scores = _span_scores(t, read_pages, pages, q_c, w_c, span, span_pages, last_block, span_keys, key_trips,
                              batch, rows, t_len)
    else:  # every page of the rows at once (the TensorRT form)
        keys = t("Reshape", read_pages(t, pages), _dims(t, batch, t.const(1), t_len, dim), allowzero=1)
        product = t("MatMul", keys, t("Transpose", q_c, perm=[0, 1, 3, 2]))  # [B,rows,T,H]
        scores = t("Squeeze", t("MatMul", t("Relu", product), w_c), t.const([3]))  # [B,rows,T]
    position = t("Unsqueeze", t("Add", first, t("Unsqueeze", row, t.const([0]))), t.const([2]))  # [B,rows,1]
    causal_ok = t("LessOrEqual", key_pos3, position)  # [B,rows,T]
    allowed = t("And", t("Or", causal_ok, not_causal), selectable)
    chosen = _chunk_topk(t, allowed, scores, neg_inf, pad, topk_1d)
    stacked = _loop(b, t, iteration, cond, chosen, I32, 3, trips)
    _unchunk(b, stacked, 3, s_len)
    b.rename_last("indices")
    return _function(spec, b, opset)


def _span_scores(t: Body, read_pages, pages, q_c, w_c, span, span_pages, last_block, span_keys, key_trips, batch,
                 rows, t_len) -> str:
    """[B,rows,T] scores of one chunk of queries, the keys read a span of pages at a time."""
    u = t.child("keys")
    j, key_cond = f"{u.prefix}_j", f"{u.prefix}_cond"
    # Transposed in the span's own graph, where ONNX Runtime fuses it into the product.
    q_t = u("Transpose", q_c, perm=[0, 1, 3, 2])  # [B,rows,D,H]
    blocks_j = u("Min", u("Add", u("Mul", j, span), span_pages), last_block)  # [span] block-table columns
    keys = u("Reshape", read_pages(u, u("Gather", pages, blocks_j, axis=1)),
             span_keys, allowzero=1)  # [B,1,span*page,D]: this chunk's keys only
    part = u("Squeeze", u("MatMul", u("Relu", u("MatMul", keys, q_t)), w_c), u.const([3]))  # [B,rows,span*page]
    per_span = _loop(t, u, j, key_cond, part, F32, 3, key_trips)  # [trips',B,rows,span*page]
    moved = t("Transpose", per_span, perm=[1, 2, 0, 3])
    return t("Slice", t("Reshape", moved, _dims(t, batch, rows, t.const(-1)), allowzero=0), t.const([0]),
             _one_d(t, t_len), t.const([2]))  # [B,rows,T]


def _selected_pool_rows(t: Body, row: str, capacity: str, page: str, block_ids: str, batch_offset: str,
                        n_pages: str, hkv: str, kv_heads: str) -> tuple[str, str]:
    """A chunk's selected logical positions (``indices`` at query rows ``row``) as rows of the pools
    viewed as ``[P*page*Hkv, ...]`` tables: ``valid [B,rows,K]`` (the index is in range and its page
    entry names a pool page) and ``table_rows [B,rows,Hkv,K]``.

    A skipped slot reads the pool row of its query row's first valid slot: a key the query attends
    anyway, so the gathered rows hold nothing a probability of 0 could turn into NaN (0 x NaN)
    and need no masking copy (the masking ``Where`` over ``[B,rows,Hkv,K,D]`` cost as much as the
    gather itself at decode). A query row with no valid slot reads pool row 0, whatever it holds:
    its output is set to zeros by a ``Where`` at the end."""
    idx = t("Cast", t("Gather", "indices", row, axis=1), to=I64)  # [B,rows,K] logical positions
    in_range = t("And", t("GreaterOrEqual", idx, t.const(0)), t("Less", idx, capacity))
    logical = t("Where", in_range, idx, t.const(0))
    block = t("Div", logical, page)  # block of the row's table
    page_id = t("Gather", block_ids, t("Add", block, batch_offset), axis=0)  # [B,rows,K]
    valid = t("And", in_range, t("And", t("GreaterOrEqual", page_id, t.const(0)), t("Less", page_id, n_pages)))
    pool_row = t("Add", t("Mul", page_id, page), t("Sub", logical, t("Mul", block, page)))
    safe = t("Where", valid, pool_row, t.const(0))  # [B,rows,K]
    first = t("ArgMax", t("Cast", valid, to=I32), axis=-1, keepdims=1, select_last_index=0)  # [B,rows,1]
    pool_row = t("Where", valid, pool_row, t("GatherElements", safe, first, axis=2))
    pool_row = t("Unsqueeze", pool_row, t.const([2]))  # [B,rows,1,K]
    return valid, t("Add", t("Mul", pool_row, hkv), kv_heads)


def sparse_attention_paged_function(opset: int) -> FunctionProto:
    """Body of DSASparseAttentionPaged: per chunk of queries, the selected pool rows gathered once
    per kv head."""
    b = Body("sap")
    q_shape, k_shape, v_shape = b("Shape", "q"), b("Shape", "k_pool"), b("Shape", "v_pool")
    batch, s_len, heads, dk = (_scalar(b, q_shape, i) for i in range(4))
    n_pages, page, hkv = (_scalar(b, k_shape, i) for i in range(3))
    v_pages, dv = _scalar(b, v_shape, 0), _scalar(b, v_shape, 3)
    blocks = _scalar(b, b("Shape", "block_table"), 1)
    capacity = b("Mul", blocks, page)
    k_sel_count = _scalar(b, b("Shape", "indices"), 2)
    group = b("Div", heads, hkv)
    qf = b("Cast", "q", to=F32)

    # The pools as tables of (token, kv head) rows, views for the runtime (nothing copied): keys
    # [P*page*Hkv, Dk], values [Pv*page*Hkv, Dv] (no rows when the values come from the keys).
    k_table = b("Reshape", "k_pool", _dims(b, b("Mul", b("Mul", n_pages, page), hkv), dk), allowzero=1)
    v_table = b("Reshape", "v_pool", _dims(b, b("Mul", b("Mul", v_pages, page), hkv), dv), allowzero=1)
    has_v = b("Min", v_pages, b.const(1))
    from_keys = b("Cast", b("Sub", b.const(1), has_v), to=F32)  # 1.0: values are the first Dv key channels
    v_slots = _one_d(b, b("Mul", k_sel_count, has_v))  # K or 0 value rows per query
    k_wider = _one_d(b, b("Max", b("Sub", dv, dk), b.const(0)))  # pad of the key path's output to Dv
    kv_heads = b("Reshape", b("Range", b.const(0), hkv, b.const(1)), b.const([1, 1, -1, 1]))  # [1,1,Hkv,1]
    block_ids = b("Reshape", b("Cast", "block_table", to=I64), b.const([-1]))  # [B*M]
    batch_offset = b("Reshape", b("Mul", b("Range", b.const(0), batch, b.const(1)), blocks), b.const([-1, 1, 1]))
    per_row = b("Mul", b("Mul", batch, k_sel_count),
                b("Add", b("Mul", hkv, b("Add", b("Mul", dk, b.const(2)), dv)), b("Mul", heads, b.const(3))))
    rows, trips, offsets = _chunking(b, s_len, per_row)
    last_row = b("Sub", s_len, b.const(1))
    q_group_shape = _dims(b, batch, rows, hkv, group, dk)
    out_shape = _dims(b, batch, rows, heads, dv)
    pad_to_dv = b("Concat", b.const([0, 0, 0, 0, 0, 0, 0, 0, 0]), k_wider, axis=0)

    t = b.child("chunk")
    iteration, cond = f"{t.prefix}_i", f"{t.prefix}_cond"
    row = _chunk_rows(t, iteration, rows, offsets, last_row)
    valid, table_rows = _selected_pool_rows(t, row, capacity, page, block_ids, batch_offset, n_pages, hkv, kv_heads)
    # Gathered straight in [B,rows,Hkv,K,Dk] order (skipped slots read a row the query attends,
    # see _selected_pool_rows).
    k_sel = t("Cast", t("Gather", k_table, table_rows, axis=0), to=F32)
    q_c = t("Transpose", t("Reshape", t("Gather", qf, row, axis=1), q_group_shape), perm=[0, 1, 2, 4, 3])
    logits = t("Mul", t("Transpose", t("MatMul", k_sel, q_c), perm=[0, 1, 2, 4, 3]),
               t.ref("scale", AttributeProto.FLOAT))  # [B,rows,Hkv,G,K]
    valid_c = t("Unsqueeze", valid, t.const([2, 3]))  # [B,rows,1,1,K]
    probs = t("Softmax", t("Where", valid_c, logits, t.const(-1e30, F32)), axis=-1)
    # Values from keys: probabilities times the whole key rows, then the first Dv channels of the
    # small [.., G, Dk] result (no copy of the selected rows); zero when there are value pages.
    from_k = t("Slice", t("MatMul", t("Mul", probs, from_keys), k_sel), t.const([0]), _one_d(t, dv), t.const([4]))
    from_k = t("Pad", from_k, pad_to_dv)  # [.., G, Dv] (wider only when value pages carry Dv > Dk)
    # Value pages: K gathered value rows per query (0 when the values come from the keys).
    v_rows = t("Slice", table_rows, t.const([0]), v_slots, t.const([3]))  # [B,rows,Hkv,K or 0]
    v_sel = t("Cast", t("Gather", v_table, v_rows, axis=0), to=F32)  # [B,rows,Hkv,K or 0,Dv]
    from_v = t("MatMul", t("Slice", probs, t.const([0]), v_slots, t.const([4])), v_sel)  # [..,G,Dv], 0 if K=0
    any_valid = t("Cast", t("ReduceMax", t("Cast", valid_c, to=F32), t.const([-1]), keepdims=1),
                  to=TensorProto.BOOL)  # [B,rows,1,1,1]
    chunk_out = t("Reshape", t("Where", any_valid, t("Add", from_k, from_v), t.const(0.0, F32)),
                  out_shape)  # [B,rows,H,Dv]
    stacked = _loop(b, t, iteration, cond, chunk_out, F32, 4, trips)
    b("CastLike", _unchunk(b, stacked, 4, s_len), "q")
    b.rename_last("out")
    return _function(SPARSE_ATTENTION_PAGED, b, opset)


# -- FP8 caches ----------------------------------------------------------------------------------

#: Constructions of the FP8-cache bodies, by how they read the uint8 codes. ``gather`` (the
#: default, what files carry and ONNX Runtime runs) gathers the selected rows' uint8 codes and
#: decodes only those. TensorRT(-RTX) takes a uint8 tensor only as a network input consumed by a
#: Cast ("TensorRT does not support UINT8 types for intermediate tensors"; a Gather, Slice or
#: Reshape of it fails to parse, "Found unsupported input type of UINT8"), so ``cast`` casts the
#: code pool to float16 first (exact: every code 0..255 is a float16 integer) and gathers from that
#: copy (2 bytes a code: the one pool-sized copy of these bodies, TensorRT only; see
#: :func:`use_fp8_cache_bodies`).
FP8_CACHE_BODIES = ("gather", "cast")


def fp8_e4m3fn_table() -> list[float]:
    """The float value of each float8 e4m3fn bit pattern 0..255 (sign, 4 exponent bits with bias 7,
    3 mantissa bits; exponent 0 subnormal; 0x7F and 0xFF NaN, no infinities)."""
    values = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent, mantissa = (code >> 3) & 0xF, code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            values.append(math.copysign(float("nan"), sign))  # the sign bit kept, as torch's
        elif exponent == 0:
            values.append(sign * mantissa / 8.0 * 2.0**-6)
        else:
            values.append(sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7))
    return values


def _decoder(b: Body, codes: str) -> tuple[str, str]:
    """(the tensor the codes are gathered from, the 256-entry float32 decode table)."""
    if codes not in FP8_CACHE_BODIES:
        raise ValueError(f"unknown FP8-cache body {codes!r}; one of {', '.join(FP8_CACHE_BODIES)}")
    table = b("Constant", value=helper.make_tensor("v", F32, [256], fp8_e4m3fn_table()))
    pool = "k_pool" if codes == "gather" else b("Cast", "k_pool", to=F16)
    return pool, table


def _decode(u: Body, table: str, codes: str) -> str:
    """float32 values of gathered codes: a Gather of the table by the codes as int32 (exact)."""
    return u("Gather", table, u("Cast", codes, to=I32), axis=0)


def indexer_paged_fp8_function(opset: int, codes: str = "gather") -> FunctionProto:
    """Body of DSAIndexerTopKPagedFP8: the paged indexer's, each span's pages decoded as read
    (codes gathered, decoded by table, times their tokens' scales); ``codes``: see
    :data:`FP8_CACHE_BODIES`."""
    b = Body("idxp8")
    pool, table = _decoder(b, codes)

    def read_pages(u: Body, page_ids: str) -> str:
        values = _decode(u, table, u("Gather", pool, page_ids, axis=0))  # [B,span,page,D]
        return u("Mul", values, u("Gather", "k_scale_pool", page_ids, axis=0))  # scales [B,span,page,1]

    return _indexer_paged(INDEXER_TOPK_PAGED_FP8, b, opset, pool, read_pages)


def sparse_attention_paged_fp8_function(opset: int, codes: str = "gather") -> FunctionProto:
    """Body of DSASparseAttentionPagedFP8: the paged attention's with values from the keys; per
    chunk of queries the selected pool rows' codes, block scales and RoPE channels are gathered
    (per kv head, in [B,rows,Hkv,K,..] order), the codes decoded by table and scaled, and the key
    rows concatenated to C+R channels; the values are the first C channels of the small
    [.., G, C+R] product. ``codes``: see :data:`FP8_CACHE_BODIES`."""
    b = Body("sap8")
    pool, table = _decoder(b, codes)
    q_shape, k_shape = b("Shape", "q"), b("Shape", pool)
    batch, s_len, heads, dk = (_scalar(b, q_shape, i) for i in range(4))
    n_pages, page, hkv, width = (_scalar(b, k_shape, i) for i in range(4))  # width: C
    rope = b("Sub", dk, width)  # R
    n_scales = _scalar(b, b("Shape", "k_scale_pool"), 3)
    block = b.ref("block_size", AttributeProto.INT)
    blocks = _scalar(b, b("Shape", "block_table"), 1)
    capacity = b("Mul", blocks, page)
    k_sel_count = _scalar(b, b("Shape", "indices"), 2)
    group = b("Div", heads, hkv)
    qf = b("Cast", "q", to=F32)

    # The pools as tables of (token, kv head) rows, views for the runtime (nothing copied).
    slots = b("Mul", b("Mul", n_pages, page), hkv)
    code_table = b("Reshape", pool, _dims(b, slots, width), allowzero=1)  # [P*page*Hkv, C]
    scale_table = b("Reshape", "k_scale_pool", _dims(b, slots, n_scales), allowzero=1)  # [P*page*Hkv, C/bs]
    rope_table = b("Reshape", "k_rope_pool", _dims(b, slots, rope), allowzero=1)  # [P*page*Hkv, R]
    kv_heads = b("Reshape", b("Range", b.const(0), hkv, b.const(1)), b.const([1, 1, -1, 1]))  # [1,1,Hkv,1]
    block_ids = b("Reshape", b("Cast", "block_table", to=I64), b.const([-1]))  # [B*M]
    batch_offset = b("Reshape", b("Mul", b("Range", b.const(0), batch, b.const(1)), blocks), b.const([-1, 1, 1]))
    # B*K times the float32 values a query row costs per selected slot: Hkv*(6C+4R)+3H, the
    # formula of sizes.attention_fp8_row_values (which the memory estimate uses).
    per_row = b("Mul", b("Mul", batch, k_sel_count),
                b("Add", b("Mul", hkv, b("Add", b("Mul", width, b.const(6)), b("Mul", rope, b.const(4)))),
                  b("Mul", heads, b.const(3))))
    rows, trips, offsets = _chunking(b, s_len, per_row)
    last_row = b("Sub", s_len, b.const(1))
    q_group_shape = _dims(b, batch, rows, hkv, group, dk)
    scaled_shape = _dims(b, batch, rows, hkv, k_sel_count, n_scales, block)  # codes by scale block
    nope_shape = _dims(b, batch, rows, hkv, k_sel_count, width)
    out_shape = _dims(b, batch, rows, heads, width)
    width_1d = _one_d(b, width)

    t = b.child("chunk")
    iteration, cond = f"{t.prefix}_i", f"{t.prefix}_cond"
    row = _chunk_rows(t, iteration, rows, offsets, last_row)
    valid, table_rows = _selected_pool_rows(t, row, capacity, page, block_ids, batch_offset, n_pages, hkv, kv_heads)
    # Only the selected rows are gathered and decoded: codes [B,rows,Hkv,K,C], their block scales
    # [B,rows,Hkv,K,C/bs] and RoPE channels [B,rows,Hkv,K,R].
    values = _decode(t, table, t("Gather", code_table, table_rows, axis=0))
    scales = t("Unsqueeze", t("Gather", scale_table, table_rows, axis=0), t.const([5]))
    nope = t("Reshape", t("Mul", t("Reshape", values, scaled_shape, allowzero=1), scales), nope_shape, allowzero=1)
    rope_sel = t("Cast", t("Gather", rope_table, table_rows, axis=0), to=F32)
    # Skipped slots read a row the query attends (see _selected_pool_rows).
    k_sel = t("Concat", nope, rope_sel, axis=4)  # [B,rows,Hkv,K,C+R]
    q_c = t("Transpose", t("Reshape", t("Gather", qf, row, axis=1), q_group_shape), perm=[0, 1, 2, 4, 3])
    logits = t("Mul", t("Transpose", t("MatMul", k_sel, q_c), perm=[0, 1, 2, 4, 3]),
               t.ref("scale", AttributeProto.FLOAT))  # [B,rows,Hkv,G,K]
    valid_c = t("Unsqueeze", valid, t.const([2, 3]))  # [B,rows,1,1,K]
    probs = t("Softmax", t("Where", valid_c, logits, t.const(-1e30, F32)), axis=-1)
    # Values are the first C channels: probabilities times the whole key rows, then the first C
    # channels of the small [.., G, C+R] result (no copy of the selected rows).
    attended = t("Slice", t("MatMul", probs, k_sel), t.const([0]), width_1d, t.const([4]))  # [..,G,C]
    any_valid = t("Cast", t("ReduceMax", t("Cast", valid_c, to=F32), t.const([-1]), keepdims=1),
                  to=TensorProto.BOOL)  # [B,rows,1,1,1]
    chunk_out = t("Reshape", t("Where", any_valid, attended, t.const(0.0, F32)), out_shape)  # [B,rows,H,C]
    stacked = _loop(b, t, iteration, cond, chunk_out, F32, 4, trips)
    b("CastLike", _unchunk(b, stacked, 4, s_len), "q")
    b.rename_last("out")
    return _function(SPARSE_ATTENTION_PAGED_FP8, b, opset)


def use_fp8_cache_bodies(model, codes: str) -> bool:
    """Replace, in place, ``model``'s FP8-cache paged functions (DSAIndexerTopKPagedFP8,
    DSASparseAttentionPagedFP8) with the ``codes`` construction (see :data:`FP8_CACHE_BODIES`);
    TensorRT(-RTX) builds ``cast``. Returns whether the model had any of them."""
    builders = {INDEXER_TOPK_PAGED_FP8.name: indexer_paged_fp8_function,
                SPARSE_ATTENTION_PAGED_FP8.name: sparse_attention_paged_fp8_function}
    swapped = [replace_function(model, DOMAIN, name, lambda opset, build=build: build(opset, codes))
               for name, build in builders.items()]
    return any(swapped)
