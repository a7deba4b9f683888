"""ONNX function bodies of ``DSAIndexerTopK`` and ``DSASparseAttention``, in bounded memory.

Both bodies process the queries in chunks inside a ``Loop``, so their memory grows with one
chunk, never with ``S x T``:

* indexer: one chunk's ``[B, rows, H_I, T]`` logits and its ``[B, rows, T + topk]`` scores
  (``O(rows * T)``); the chunk's top-k comes out of an ONNX ``TopK`` over its rows;
* attention: one chunk's gathered ``[B, rows, K, Hkv * (Dk + Dv)]`` key/value rows and its
  ``[B, rows, H, K]`` probabilities (``O(rows * K * D)``), the same gather-once-per-kv-head form as
  the torch op; no ``[B, S, T]`` mask and no ``[B, S, K, D]`` gather of the whole sequence.

TensorRT-RTX parses neither ``NonZero``, nor reducing scatters, nor shapes computed from data
inside a loop (measured, see docs/ops.md). So every shape here is a function of the input shapes:
``rows`` is chosen from ``B, H, T, K, D`` so that one chunk's largest intermediate stays near
:data:`CHUNK_ELEMENTS` float32 values, the trip count is ``ceil(S / rows)``, and the last chunk
re-reads the last query row for its padding rows (row index clamped to ``S - 1``) instead of having
a shorter shape; those rows are sliced off after the loop. Each chunk's result is a ``Loop`` scan
output (concatenated by the runtime), and no value is carried from one chunk to the next. The
Loops have a trip count and no termination condition, the form every parser takes
(:meth:`dsa_export.ops.onnx_graph.Body.true`). The one exception to input-shape-only shapes, the
``trimmed`` attention body, is not written into files (see :data:`ATTENTION_BODIES`).

Numerics are those of the contract: float32 scores and attention, the indexer's ties at the k-th
place to the lower key index (ONNX ``TopK``), masked keys at ``-inf`` in the indexer and rows
without a valid index at zero in the attention.
"""

from __future__ import annotations

from onnx import AttributeProto, FunctionProto, TensorProto, helper

from dsa_export.ops.contract import DOMAIN, INDEXER_TOPK, SPARSE_ATTENTION, OpSpec
from dsa_export.ops.onnx_graph import Body, replace_function, value
from dsa_export.ops.sizes import CHUNK_ELEMENTS

F32, I32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL

#: float32 values one chunk's largest intermediate may hold (32 MiB); a chunk has at least one row.
#: The memory formulas of :mod:`dsa_export.ops.sizes` use the same constant.


def _scalar(b: Body, shape: str, axis: int) -> str:
    return b("Gather", shape, b.const(axis), axis=0)


def _one_d(b: Body, scalar: str) -> str:
    return b("Unsqueeze", scalar, b.const([0]))


def _chunking(b: Body, s_len: str, per_row: str) -> tuple[str, str, str]:
    """(rows, trip count, [rows] offsets 0..rows-1) for chunks of ``per_row`` float32 values a row."""
    rows = b("Max", b("Min", s_len, b("Div", b.const(CHUNK_ELEMENTS), b("Max", per_row, b.const(1)))), b.const(1))
    trips = b("Div", b("Sub", b("Add", s_len, rows), b.const(1)), rows)
    return rows, trips, b("Range", b.const(0), rows, b.const(1))


def _chunk_rows(t: Body, iteration: str, rows: str, offsets: str, last_row: str) -> str:
    """[rows] query rows of chunk ``iteration``; rows past the end repeat the last row."""
    return t("Min", t("Add", t("Mul", iteration, rows), offsets), last_row)


def _loop(b: Body, t: Body, iteration: str, cond: str, chunk_out: str, elem_type: int, rank: int, trips: str) -> str:
    """Close the chunk body ``t`` (one scan output) and append the Loop; returns [trips, ...].

    The Loop runs ``trips`` times with no termination condition (see :meth:`Body.true`)."""
    body = t.graph([value(iteration, I64, 0), value(cond, BOOL, 0)],
                   [value(t.true(), BOOL, 0), value(chunk_out, elem_type, rank)])
    return b("Loop", trips, "", body=body)


def _unchunk(b: Body, stacked: str, rank: int, s_len: str) -> str:
    """[trips, B, rows, ...] -> [B, S, ...]: chunks back in sequence order, padding rows dropped."""
    moved = b("Transpose", stacked, perm=[1, 0, *range(2, rank + 1)])
    tail = b("Slice", b("Shape", moved), b.const([3]), b.const([rank + 1]))
    merged = b("Reshape", moved, b("Concat", b("Slice", b("Shape", moved), b.const([0]), b.const([1])),
                                   b.const([-1]), tail, axis=0))
    return b("Slice", merged, b.const([0]), _one_d(b, s_len), b.const([1]))


def _chunk_scores(t: Body, q_scaled: str, wf: str, keys: str, row: str) -> str:
    """[B,rows,T] indexer scores of one chunk of queries: sum_h w * ReLU(q.k), q already scaled.

    ``keys`` is ``[B,1,T,D]``: the chunk's queries are transposed (``[B,rows,D,H]``, small), never
    the keys, so no ``[B,D,T]`` copy of the key cache is made; the products are ``[B,rows,T,H]``."""
    q_c = t("Transpose", t("Gather", q_scaled, row, axis=1), perm=[0, 1, 3, 2])  # [B,rows,D,H]
    w_c = t("Unsqueeze", t("Gather", wf, row, axis=1), t.const([3]))  # [B,rows,H,1]
    relu = t("Relu", t("MatMul", keys, q_c))  # [B,rows,T,H]
    return t("Squeeze", t("MatMul", relu, w_c), t.const([3]))


def _chunk_topk(t: Body, allowed: str, scores: str, neg_inf: str, pad: str, topk_1d: str) -> str:
    """[B,rows,topk] int32 positions of the best allowed keys, -1 where fewer are allowed (ties to
    the lower key: ONNX TopK)."""
    padded = t("Concat", t("Where", allowed, scores, neg_inf), pad, axis=2)
    top_val, top_idx = t("TopK", padded, topk_1d, axis=-1, largest=1, sorted=1, outputs=2)
    return t("Cast", t("Where", t("Greater", top_val, neg_inf), top_idx, t.const(-1)), to=I32)


def indexer_function(opset: int) -> FunctionProto:
    """Body of DSAIndexerTopK. It reads ``lengths``, which the exporter therefore always supplies."""
    b = Body("idx")
    qf, kf, wf = b("Cast", "q", to=F32), b("Cast", "k", to=F32), b("Cast", "w", to=F32)
    q_shape = b("Shape", "q")
    batch, s_len, heads = _scalar(b, q_shape, 0), _scalar(b, q_shape, 1), _scalar(b, q_shape, 2)
    t_len = _scalar(b, b("Shape", "k"), 1)
    topk = b.ref("topk", AttributeProto.INT)
    # Scale the queries first (as the torch op does), then one [B,1,T,D] x [B,rows,D,H] product a chunk.
    q_scaled = b("Mul", qf, b.ref("scale", AttributeProto.FLOAT))
    k_t = b("Unsqueeze", kf, b.const([1]))  # [B,1,T,D]
    per_row = b("Mul", b("Mul", batch, heads), b("Add", t_len, topk))
    rows, trips, offsets = _chunking(b, s_len, per_row)
    last_row = b("Sub", s_len, b.const(1))

    # What every chunk shares: key positions, the length limit per batch row, the -inf padding.
    key_pos = b("Unsqueeze", b("Range", b.const(0), t_len, b.const(1)), b.const([0]))  # [1,T]
    lengths = b("Cast", "lengths", to=I64)
    in_length = b("Unsqueeze", b("Less", key_pos, b("Unsqueeze", lengths, b.const([1]))), b.const([1]))  # [B,1,T]
    not_causal = b("Equal", b.ref("causal", AttributeProto.INT), b.const(0))
    query_offset = b("Sub", t_len, s_len)  # query s sits at T - S + s
    neg_inf = b("Constant", value=helper.make_tensor("v", F32, [], [float("-inf")]))
    topk_1d = _one_d(b, topk)
    # topk extra -inf columns give TopK the constant K = topk for every T (TensorRT wants a
    # build-time K); a slot is valid only when its score is finite, i.e. an allowed key.
    pad = b("Expand", neg_inf, b("Concat", _one_d(b, batch), _one_d(b, rows), topk_1d, axis=0))  # [B,rows,topk]

    t = b.child("chunk")
    iteration, cond = f"{t.prefix}_i", f"{t.prefix}_cond"
    row = _chunk_rows(t, iteration, rows, offsets, last_row)  # [rows]
    scores = _chunk_scores(t, q_scaled, wf, k_t, row)  # [B,rows,T]
    causal_ok = t("LessOrEqual", key_pos, t("Unsqueeze", t("Add", row, query_offset), t.const([1])))  # [rows,T]
    allowed = t("And", t("Unsqueeze", t("Or", causal_ok, not_causal), t.const([0])), in_length)  # [B,rows,T]
    chosen = _chunk_topk(t, allowed, scores, neg_inf, pad, topk_1d)
    stacked = _loop(b, t, iteration, cond, chosen, I32, 3, trips)
    _unchunk(b, stacked, 3, s_len)
    b.rename_last("indices")
    return _function(INDEXER_TOPK, b, opset)


#: Constructions of the DSASparseAttention body. ``static`` (the default, the one exported files
#: carry) keeps all K slots of every chunk: every shape is a function of the input shapes, so
#: TensorRT(-RTX) builds it. ``trimmed`` cuts each chunk's selection after its last valid slot, a
#: shape that depends on the indices inside a Loop: TensorRT-RTX 1.7 parses it and then fails to
#: build ("Assertion newNodeOrder.size() == g.nodes.size() failed", graphScope.cpp), while ONNX
#: Runtime runs it faster on prompts shorter than K; our ONNX Runtime sessions swap it in where
#: they run a file (:func:`dsa_export.ops.onnx_ops.use_onnxruntime_bodies`). Both give the same
#: values (a cut slot is masked in every row of its chunk).
ATTENTION_BODIES = ("static", "trimmed")


def sparse_attention_function(opset: int, body: str = "static") -> FunctionProto:
    """Body of DSASparseAttention: per chunk of queries, gather the selected rows once per kv head
    (``body``: see :data:`ATTENTION_BODIES`)."""
    if body not in ATTENTION_BODIES:
        raise ValueError(f"unknown DSASparseAttention body {body!r}; choose from {ATTENTION_BODIES}")
    b = Body("sa")
    q_shape, k_shape, v_shape = b("Shape", "q"), b("Shape", "k"), b("Shape", "v")
    batch, s_len, heads, dk = (_scalar(b, q_shape, i) for i in range(4))
    t_len, hkv = _scalar(b, k_shape, 1), _scalar(b, k_shape, 2)
    t_v, dv = _scalar(b, v_shape, 1), _scalar(b, v_shape, 3)
    k_sel_count = _scalar(b, b("Shape", "indices"), 2)
    group = b("Div", heads, hkv)
    qf, kf, vf = b("Cast", "q", to=F32), b("Cast", "k", to=F32), b("Cast", "v", to=F32)

    # One table of rows [B*T, Hkv*(Dk+Cv)]: each token's keys (all kv heads) and, in the 4-input
    # form, its values (Cv = Dv). With values from keys (v has no rows: MLA's absorbed form, Dv <=
    # Dk) Cv = 0 and the values are the first Dv channels of the keys. One Gather per chunk then
    # reads each selected row once, and nothing is copied to build the values.
    cv = b("Div", b("Mul", dv, t_v), b("Max", t_len, b.const(1)))  # Dv or 0
    v_cols = b("Reshape", vf, b("Concat", *(_one_d(b, x) for x in (batch, t_len, hkv, cv)), axis=0), allowzero=1)
    width = b("Add", dk, cv)
    table = b("Reshape", b("Concat", kf, v_cols, axis=3),
              b("Concat", _one_d(b, b("Mul", batch, t_len)), _one_d(b, b("Mul", hkv, width)), axis=0), allowzero=1)
    v_start = b("Mul", dk, b("Min", t_v, b.const(1)))  # values after the keys, or at channel 0
    v_end = b("Add", v_start, dv)
    idx = b("Cast", "indices", to=I64)
    valid = b("And", b("GreaterOrEqual", idx, b.const(0)), b("Less", idx, t_len))  # [B,S,K]
    batch_offset = b("Reshape", b("Mul", b("Range", b.const(0), batch, b.const(1)), t_len), b.const([-1, 1, 1]))
    flat = b("Add", b("Where", valid, idx, b.const(0)), batch_offset)  # [B,S,K] rows of the table
    per_row = b("Mul", b("Mul", batch, k_sel_count),
                b("Add", b("Mul", hkv, b("Add", dk, dv)), b("Mul", heads, b.const(3))))
    rows, trips, offsets = _chunking(b, s_len, per_row)
    last_row = b("Sub", s_len, b.const(1))
    q_group_shape = b("Concat", *(_one_d(b, x) for x in (batch, rows, hkv, group, dk)), axis=0)
    out_shape = b("Concat", *(_one_d(b, x) for x in (batch, rows, heads, dv)), axis=0)
    if body == "trimmed":
        slot_number = b("Cast", b("Range", b.const(1), b("Add", k_sel_count, b.const(1)), b.const(1)), to=F32)  # [K]

    t = b.child("chunk")
    iteration, cond = f"{t.prefix}_i", f"{t.prefix}_cond"
    row = _chunk_rows(t, iteration, rows, offsets, last_row)
    # Slots past the last valid one of every row of the chunk hold no key (the early queries of a
    # prefill have fewer than K allowed keys, and the indexer pads them with -1 at the end): they
    # are cut off, at least one slot kept. Exact: a cut slot is masked in every row of the chunk.
    valid_rows = t("Gather", valid, row, axis=1)  # [B,rows,K]
    if body == "trimmed":
        used_slots = t("ReduceMax", t("Mul", t("ReduceMax", t("Cast", valid_rows, to=F32), t.const([0, 1]),
                                               keepdims=0), slot_number), keepdims=0)
        used = t("Unsqueeze", t("Cast", t("Max", used_slots, t.const(1.0, F32)), to=I64), t.const([0]))  # [1]
    else:
        used = _one_d(t, k_sel_count)
    sel_shape = t("Concat", *(_one_d(t, x) for x in (batch, rows)), used, _one_d(t, hkv), _one_d(t, width),
                  axis=0)  # [B,rows,used,Hkv,Dk+Cv]
    flat_c = t("Slice", t("Gather", flat, row, axis=1), t.const([0]), used, t.const([2]))  # [B,rows,used]
    valid_c = t("Unsqueeze", t("Slice", valid_rows, t.const([0]), used, t.const([2])), t.const([2, 3]))
    # [B,rows,Hkv,K,D]: one Gather of the selected tokens serves every query head of every group
    # (with one kv head the Transpose only relabels axes).
    sel = t("Reshape", t("Gather", table, flat_c, axis=0), sel_shape)
    k_sel = t("Transpose", t("Slice", sel, t.const([0]), _one_d(t, dk), t.const([4])), perm=[0, 1, 3, 2, 4])
    v_sel = t("Transpose", t("Slice", sel, _one_d(t, v_start), _one_d(t, v_end), t.const([4])), perm=[0, 1, 3, 2, 4])
    q_c = t("Transpose", t("Reshape", t("Gather", qf, row, axis=1), q_group_shape), perm=[0, 1, 2, 4, 3])  # [.,Dk,G]
    # k_sel @ q^T, the torch op's product, then back to [B,rows,Hkv,G,K].
    logits = t("Mul", t("Transpose", t("MatMul", k_sel, q_c), perm=[0, 1, 2, 4, 3]),
               t.ref("scale", AttributeProto.FLOAT))
    # A finite fill keeps rows without a valid index NaN-free; they are zeroed below.
    probs = t("Softmax", t("Where", valid_c, logits, t.const(-1e30, F32)), axis=-1)
    any_valid = t("ReduceMax", t("Cast", valid_c, to=F32), t.const([-1]), keepdims=1)  # [B,rows,1,1,1]
    chunk_out = t("Reshape", t("Mul", t("MatMul", probs, v_sel), any_valid), out_shape)  # [B,rows,H,Dv]
    stacked = _loop(b, t, iteration, cond, chunk_out, F32, 4, trips)
    b("CastLike", _unchunk(b, stacked, 4, s_len), "q")
    b.rename_last("out")
    return _function(SPARSE_ATTENTION, b, opset)


def _function(spec: OpSpec, body: Body, opset: int) -> FunctionProto:
    return helper.make_function(
        DOMAIN,
        spec.name,
        inputs=[t.name for t in spec.inputs],
        outputs=[t.name for t in spec.outputs],
        nodes=body.nodes,
        opset_imports=[helper.make_opsetid("", opset)],
        # Defaults travel with the function, so a node that omits an attribute still runs.
        attributes=[a.name for a in spec.attributes if a.default is None],
        attribute_protos=[helper.make_attribute(a.name, a.default) for a in spec.attributes if a.default is not None],
        doc_string=spec.doc,
    )


def use_attention_body(model, body: str) -> bool:
    """Replace ``model``'s DSASparseAttention function with the ``body`` construction, in place
    (TensorRT(-RTX) builds ``static``, ONNX Runtime runs ``trimmed`` faster); returns whether the
    model had the function."""
    return replace_function(model, DOMAIN, SPARSE_ATTENTION.name, lambda opset: sparse_attention_function(opset, body))
