"""ONNX function body of ``DSABlockSparseAttention``, in bounded memory, with standard ops only.

The queries are processed in chunks of query blocks inside a ``Loop`` (the construction of
:mod:`dsa_export.ops.attention_onnx`, whose helpers it reuses): a chunk of ``rows`` query blocks
gathers, for every head, the ``Kb`` key and value blocks its lists name (one ``Gather`` each from
the keys and values laid out as rows of ``bs * D`` values, a zero block appended for the pad
slots), computes ``[B, H, rows, bs, Kb*bs]`` scores with one ``MatMul`` and takes the values with
another. Its memory is ``O(B * H * rows * Kb * bs * (D + bs))``: it grows with the selected blocks,
never with ``S x T``.

Everything TensorRT-RTX cannot parse is avoided as in the other bodies: no ``NonZero``, no sort,
no reducing scatter and no shape computed from data. A block named twice in a list is found by
comparing each slot with the earlier ones of its list (``[.., Kb, Kb]`` per chunk) and only its
first slot counts; slots outside ``[0, ceil(T/bs))`` point at the zero block and are masked, as
are keys past ``T`` in the ragged last block and, when causal, keys after the query. Lists with no
slots (``Kb = 0``) get one pad slot, so no shape has a 0 that ``Reshape`` would read as "copy".

Numerics: float32 scores; masked keys get ``-1e30`` (finite, so a row without any allowed key
stays NaN-free) and such rows are zeroed by their "any allowed key" flag.
"""

from __future__ import annotations

from onnx import AttributeProto, FunctionProto, TensorProto, helper

from dsa_export.ops.attention_onnx import _chunk_rows, _function, _loop, _one_d, _scalar
from dsa_export.ops.contract import BLOCK_SPARSE_ATTENTION
from dsa_export.ops.onnx_graph import Body
from dsa_export.ops.sizes import CHUNK_ELEMENTS

F32, I64 = TensorProto.FLOAT, TensorProto.INT64



def _zeros_rows(b: Body, dims: list[str]) -> str:
    """A float32 zero tensor of the given 1-D dims (padding rows)."""
    return b("ConstantOfShape", b("Concat", *dims, axis=0), value=helper.make_tensor("v", F32, [1], [0.0]))


def block_sparse_attention_function(opset: int) -> FunctionProto:
    """Body of DSABlockSparseAttention: per chunk of query blocks, gather each head's listed blocks."""
    b = Body("bsa")
    q_shape, k_shape, v_shape = b("Shape", "q"), b("Shape", "k"), b("Shape", "v")
    batch, s_len, heads, dk = (_scalar(b, q_shape, i) for i in range(4))
    t_len, hkv = _scalar(b, k_shape, 1), _scalar(b, k_shape, 2)
    dv = _scalar(b, v_shape, 3)
    index_shape = b("Shape", "block_index")
    bs = b.ref("block_size", AttributeProto.INT)
    one = b.const(1)
    # Lists of no slots get one pad slot: a dim of 0 in the Reshapes below would mean "copy".
    no_slots = b("Cast", b("Equal", _scalar(b, index_shape, 3), b.const(0)), to=I64)
    kb = b("Add", _scalar(b, index_shape, 3), no_slots)
    n_qb = b("Div", b("Sub", b("Add", s_len, bs), one), bs)
    n_kb = b("Div", b("Sub", b("Add", t_len, bs), one), bs)
    group = b("Div", heads, hkv)
    d1 = {name: _one_d(b, x) for name, x in
          (("B", batch), ("H", heads), ("Dk", dk), ("Dv", dv), ("Hkv", hkv), ("bs", bs), ("nqb", n_qb), ("Kb", kb))}

    # Queries, scaled (as the torch op does) and padded to nqb*bs rows: [B,H,nqb,bs,Dk].
    q_scaled = b("Mul", b("Cast", "q", to=F32), b.ref("scale", AttributeProto.FLOAT))
    q_missing = _one_d(b, b("Sub", b("Mul", n_qb, bs), s_len))
    q_pad = b("Concat", q_scaled, _zeros_rows(b, [d1["B"], q_missing, d1["H"], d1["Dk"]]), axis=1)
    q_blocks = b("Transpose", b("Reshape", q_pad, b("Concat", d1["B"], d1["nqb"], d1["bs"], d1["H"], d1["Dk"], axis=0)),
                 perm=[0, 3, 1, 2, 4])

    # Keys and values as rows of one block of one kv head, [B*Hkv*(nkb+1), bs*D]; the extra block
    # of each kv head is zeros and serves the slots that name no block.
    k_missing = _one_d(b, b("Sub", b("Mul", b("Add", n_kb, one), bs), t_len))
    n_rows = _one_d(b, b("Mul", b("Mul", batch, hkv), b("Add", n_kb, one)))

    def block_rows(name: str, d: str) -> str:
        padded = b("Concat", b("Cast", name, to=F32), _zeros_rows(b, [d1["B"], k_missing, d1["Hkv"], d1[d]]), axis=1)
        return b("Reshape", b("Transpose", padded, perm=[0, 2, 1, 3]),
                 b("Concat", n_rows, _one_d(b, b("Mul", bs, {"Dk": dk, "Dv": dv}[d])), axis=0))

    k_rows, v_rows = block_rows("k", "Dk"), block_rows("v", "Dv")
    # Row of block 0 of head h's kv head in batch row b: (b*Hkv + h // G) * (nkb+1), as [B,H,1,1].
    kv_head = b("Div", b("Range", b.const(0), heads, one), group)
    head_base = b("Mul", b("Add", b("Unsqueeze", b("Mul", b("Range", b.const(0), batch, one), hkv), b.const([1])),
                           b("Unsqueeze", kv_head, b.const([0]))), b("Add", n_kb, one))
    head_base = b("Unsqueeze", head_base, b.const([2, 3]))
    pad_shape = b("Concat", b("Slice", index_shape, b.const([0]), b.const([3])), _one_d(b, no_slots), axis=0)
    pad_slots = b("ConstantOfShape", pad_shape, value=helper.make_tensor("v", I64, [1], [-1]))
    ids = b("Concat", b("Cast", "block_index", to=I64), pad_slots, axis=3)
    slots = b("Range", b.const(0), kb, one)
    earlier = b("Less", b("Unsqueeze", slots, b.const([0])), b("Unsqueeze", slots, b.const([1])))  # [u, u'] u' < u
    key_in_block = b("Range", b.const(0), bs, one)  # [bs]
    query_offset = b("Sub", t_len, s_len)  # query s sits at T - S + s
    not_causal = b("Equal", b.ref("causal", AttributeProto.INT), b.const(0))
    fill = b.const(-1e30, F32)

    # Chunks of query blocks whose scores, masks, probabilities and gathered blocks fit the budget.
    per_block = b("Mul", b("Mul", b("Mul", batch, heads), kb),
                  b("Add", b("Mul", bs, b("Add", b("Add", dk, dv), b("Mul", bs, b.const(4)))), kb))
    rows = b("Max", b("Min", n_qb, b("Div", b.const(CHUNK_ELEMENTS), b("Max", per_block, one))), one)
    trips = b("Div", b("Sub", b("Add", n_qb, rows), one), rows)
    offsets = b("Range", b.const(0), rows, one)
    last_block = b("Sub", n_qb, one)
    gathered = [d1["B"], d1["H"], _one_d(b, rows), _one_d(b, b("Mul", kb, bs))]
    k_sel_shape = b("Concat", *gathered, d1["Dk"], axis=0)  # [B,H,rows,Kb*bs,Dk]
    v_sel_shape = b("Concat", *gathered, d1["Dv"], axis=0)
    keys_shape = b("Concat", d1["B"], d1["H"], _one_d(b, rows), b.const([1]), _one_d(b, b("Mul", kb, bs)), axis=0)

    t = b.child("chunk")
    iteration, cond = f"{t.prefix}_i", f"{t.prefix}_cond"
    blk = _chunk_rows(t, iteration, rows, offsets, last_block)  # [rows] query blocks of this chunk
    ids_c = t("Gather", ids, blk, axis=2)  # [B,H,rows,Kb]
    in_range = t("And", t("GreaterOrEqual", ids_c, t.const(0)), t("Less", ids_c, n_kb))
    same = t("And", t("Equal", t("Unsqueeze", ids_c, t.const([4])), t("Unsqueeze", ids_c, t.const([3]))), earlier)
    repeated = t("Greater", t("ReduceMax", t("Cast", same, to=F32), t.const([-1]), keepdims=0), t.const(0.5, F32))
    slot_ok = t("And", in_range, t("Not", repeated))  # first slot of each listed block
    block = t("Where", slot_ok, ids_c, n_kb)  # other slots read the zero block
    flat = t("Add", block, head_base)
    k_sel = t("Reshape", t("Gather", k_rows, flat, axis=0), k_sel_shape)  # [B,H,rows,Kb*bs,Dk]
    v_sel = t("Reshape", t("Gather", v_rows, flat, axis=0), v_sel_shape)  # [B,H,rows,Kb*bs,Dv]
    q_c = t("Gather", q_blocks, blk, axis=2)  # [B,H,rows,bs,Dk]
    scores = t("MatMul", q_c, t("Transpose", k_sel, perm=[0, 1, 2, 4, 3]))  # [B,H,rows,bs,Kb*bs]
    key_pos = t("Add", t("Mul", t("Unsqueeze", block, t.const([4])), bs), key_in_block)  # [B,H,rows,Kb,bs]
    key_ok = t("And", t("Less", key_pos, t_len), t("Unsqueeze", slot_ok, t.const([4])))
    key_ok = t("Reshape", key_ok, keys_shape)  # [B,H,rows,1,Kb*bs]
    query_pos = t("Add", t("Add", t("Unsqueeze", t("Mul", blk, bs), t.const([1])), key_in_block), query_offset)
    causal_ok = t("LessOrEqual", t("Reshape", key_pos, keys_shape), t("Unsqueeze", query_pos, t.const([0, 1, 4])))
    allowed = t("And", key_ok, t("Or", causal_ok, not_causal))  # [B,H,rows,bs,Kb*bs]
    probs = t("Softmax", t("Where", allowed, scores, fill), axis=-1)
    any_key = t("ReduceMax", t("Cast", allowed, to=F32), t.const([-1]), keepdims=1)  # [B,H,rows,bs,1]
    chunk_out = t("Mul", t("MatMul", probs, v_sel), any_key)  # [B,H,rows,bs,Dv]
    stacked = _loop(b, t, iteration, cond, chunk_out, F32, 5, trips)  # [trips,B,H,rows,bs,Dv]
    # onnx.reference concatenates a Loop's scan outputs along axis 0 where ONNX Runtime and
    # TensorRT stack them on a new axis; the same values in the same order either way, so one
    # Reshape with explicit dims makes the body run in all three.
    per_trip = b("Concat", _one_d(b, trips), d1["B"], d1["H"], _one_d(b, b("Mul", rows, bs)), d1["Dv"], axis=0)
    moved = b("Transpose", b("Reshape", stacked, per_trip), perm=[1, 0, 3, 2, 4])  # [B,trips,rows*bs,H,Dv]
    merged = b("Reshape", moved, b("Concat", d1["B"], b.const([-1]), d1["H"], d1["Dv"], axis=0))
    b("CastLike", b("Slice", merged, b.const([0]), _one_d(b, s_len), b.const([1])), "q")
    b.rename_last("out")
    return _function(BLOCK_SPARSE_ATTENTION, b, opset)
