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
"""

from __future__ import annotations

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
from dsa_export.ops.contract import INDEXER_TOPK_PAGED, SPARSE_ATTENTION_PAGED
from dsa_export.ops.onnx_graph import Body
from dsa_export.ops.sizes import KEY_CHUNK_ELEMENTS

F32, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64


def _dims(b: Body, *scalars: str) -> str:
    return b("Concat", *(_one_d(b, x) for x in scalars), axis=0)


def indexer_paged_function(opset: int) -> FunctionProto:
    """Body of DSAIndexerTopKPaged."""
    b = Body("idxp")
    qf, wf = b("Cast", "q", to=F32), b("Cast", "w", to=F32)
    q_shape, pool_shape = b("Shape", "q"), b("Shape", "k_pool")
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
    pad = b("Expand", neg_inf, b("Concat", _one_d(b, batch), _one_d(b, rows), topk_1d, axis=0))  # [B,rows,topk]

    t = b.child("chunk")
    iteration, cond = f"{t.prefix}_i", f"{t.prefix}_cond"
    row = _chunk_rows(t, iteration, rows, offsets, last_row)  # [rows]
    q_c = t("Gather", q_scaled, row, axis=1)  # [B,rows,H,D]
    w_c = t("Unsqueeze", t("Gather", wf, row, axis=1), t.const([3]))  # [B,rows,H,1]
    u = t.child("keys")
    j, key_cond = f"{u.prefix}_j", f"{u.prefix}_cond"
    # Transposed in the span's own graph, where ONNX Runtime fuses it into the product.
    q_t = u("Transpose", q_c, perm=[0, 1, 3, 2])  # [B,rows,D,H]
    blocks_j = u("Min", u("Add", u("Mul", j, span), span_pages), last_block)  # [span] block-table columns
    keys = u("Reshape", u("Cast", u("Gather", "k_pool", u("Gather", pages, blocks_j, axis=1), axis=0), to=F32),
             span_keys, allowzero=1)  # [B,1,span*page,D]: this chunk's keys only
    part = u("Squeeze", u("MatMul", u("Relu", u("MatMul", keys, q_t)), w_c), u.const([3]))  # [B,rows,span*page]
    per_span = _loop(t, u, j, key_cond, part, F32, 3, key_trips)  # [trips',B,rows,span*page]
    moved = t("Transpose", per_span, perm=[1, 2, 0, 3])
    scores = t("Slice", t("Reshape", moved, _dims(t, batch, rows, t.const(-1)), allowzero=0), t.const([0]),
               _one_d(t, t_len), t.const([2]))  # [B,rows,T]
    position = t("Unsqueeze", t("Add", first, t("Unsqueeze", row, t.const([0]))), t.const([2]))  # [B,rows,1]
    causal_ok = t("LessOrEqual", key_pos3, position)  # [B,rows,T]
    allowed = t("And", t("Or", causal_ok, not_causal), selectable)
    chosen = _chunk_topk(t, allowed, scores, neg_inf, pad, topk_1d)
    stacked = _loop(b, t, iteration, cond, chosen, I32, 3, trips)
    _unchunk(b, stacked, 3, s_len)
    b.rename_last("indices")
    return _function(INDEXER_TOPK_PAGED, b, opset)


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
    idx = t("Cast", t("Gather", "indices", row, axis=1), to=I64)  # [B,rows,K] logical positions
    in_range = t("And", t("GreaterOrEqual", idx, t.const(0)), t("Less", idx, capacity))
    logical = t("Where", in_range, idx, t.const(0))
    block = t("Div", logical, page)  # block of the row's table
    page_id = t("Gather", block_ids, t("Add", block, batch_offset), axis=0)  # [B,rows,K]
    valid = t("And", in_range, t("And", t("GreaterOrEqual", page_id, t.const(0)), t("Less", page_id, n_pages)))
    pool_row = t("Add", t("Mul", page_id, page), t("Sub", logical, t("Mul", block, page)))
    pool_row = t("Unsqueeze", t("Where", valid, pool_row, t.const(0)), t.const([2]))  # [B,rows,1,K]
    table_rows = t("Add", t("Mul", pool_row, hkv), kv_heads)  # [B,rows,Hkv,K] rows of the tables
    # Gathered straight in [B,rows,Hkv,K,Dk] order. Skipped slots read pool row 0, a page that may
    # belong to no sequence: zero them, so that whatever it holds (NaN included) meets a
    # probability of 0 as a 0.
    valid5 = t("Unsqueeze", valid, t.const([2, 4]))  # [B,rows,1,K,1]
    k_sel = t("Where", valid5, t("Cast", t("Gather", k_table, table_rows, axis=0), to=F32), t.const(0.0, F32))
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
    v_sel = t("Gather", v_table, v_rows, axis=0)  # [B,rows,Hkv,K or 0,Dv]
    v_sel = t("Where", t("Slice", valid5, t.const([0]), v_slots, t.const([3])), t("Cast", v_sel, to=F32),
              t.const(0.0, F32))
    from_v = t("MatMul", t("Slice", probs, t.const([0]), v_slots, t.const([4])), v_sel)  # [..,G,Dv], 0 if K=0
    any_valid = t("ReduceMax", t("Cast", valid_c, to=F32), t.const([-1]), keepdims=1)  # [B,rows,1,1,1]
    chunk_out = t("Reshape", t("Mul", t("Add", from_k, from_v), any_valid), out_shape)  # [B,rows,H,Dv]
    stacked = _loop(b, t, iteration, cond, chunk_out, F32, 4, trips)
    b("CastLike", _unchunk(b, stacked, 4, s_len), "q")
    b.rename_last("out")
    return _function(SPARSE_ATTENTION_PAGED, b, opset)
