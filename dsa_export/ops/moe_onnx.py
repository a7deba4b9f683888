"""ONNX function bodies of the routed-experts ops ``DSAMoEExperts`` and ``DSAMoEExpertsFP8``.

Every body runs in ONNX Runtime and parses and AOT-builds in TensorRT-RTX, which rules out the
obvious ``NonZero`` per expert: TensorRT-RTX has ``NonZero`` only as a plugin, no ``ScatterND`` /
``ScatterElements`` reduction, and no data-dependent shape inside a loop (measured, see
docs/ops.md). The construction therefore keeps every shape a function of the input shapes and
lets only trip counts depend on the routing:

1. Prelude: an expert that appears twice in a token's row is merged into its first slot (weights
   summed, the same sum), so a token occurs at most once per expert. A counting sort (one-hot,
   ``CumSum``, a ``ScatterND`` of a permutation) orders the ``N*K`` slots by expert, skipped slots
   last, and the active experts are listed first.
2. A ``Loop`` over the active experts (trip count: how many have tokens) fetches one expert's
   weights in float32 (``Gather`` + ``Cast``, or ``DequantizeLinear`` of that expert for FP8).
3. A nested ``Loop`` over tiles of ``T`` of that expert's slots gathers the tokens' rows, runs the
   two ``Gemm``s and the SiLU gate, scales by the routing weight and adds into ``acc [N+1, H]``
   with ``Gather`` + ``Add`` + ``ScatterND``: rows of a tile are distinct tokens, and a tile's
   padding rows write 0 + acc into the spare row ``N``, which is dropped.

Memory: ``acc`` and ``x`` in float32 (``O(N*H)``), one expert's weights in float32, one tile's
``[T, 2I]`` activations, and ``O(N*K*E)`` int32 for the sort; never ``tokens x weights`` and no
expert computes tokens that were not routed to it. ``T = min(N, 128, ceil(N*K/E))`` keeps tiles
near an expert's mean load (a decode step, N = 1, pads nothing).

Dense path (``DSAMoEExperts``'s ``dense`` body, which dsa-export's ONNX Runtime sessions swap in;
files carry ``loop``, which TensorRT-RTX builds in every float type): for a few rows over float32
weights that name most experts anyway (a decode step), one ``If`` runs every expert over every
row with the stacks read where they lie (``MatMul(gate_up, x^T)``, ``MatMul(down, h)``: no
per-expert copy) instead of the sort, and the loop's trip count is 0; see :func:`_dense_or_sort`
and docs/ops.md.

FP8: ONNX has no ``Gather`` of float8 tensors and TensorRT accepts float8 tensors only into
dequantize/shuffle/concat layers, so selecting one FP8 expert needs ``Scan`` (which iterates the
FP8 stack) in ONNX Runtime and is impossible in TensorRT. Two bodies compute the same function:
``expert`` (the default, attached to exported files) dequantizes one expert at a time inside a
``Scan`` over the experts, skipping inactive ones with ``If``; ``stack`` dequantizes the whole
stack once and then runs the plain body, which TensorRT(-RTX) builds (its memory is the float32
stack, so it is for small models or for builders that fold it into the engine).
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import AttributeProto, FunctionProto, TensorProto, helper

from dsa_export.ops.contract import DOMAIN, MOE_EXPERTS, MOE_EXPERTS_FP8, OpSpec
from dsa_export.ops.onnx_graph import Body, replace_function, value

F32, I32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL

#: Most token rows one tile (one Gemm) of the body processes.
TILE_ROWS = 128

#: The dense path (every expert over every row, stacks read in place) runs for at most this many
#: rows, and only when E <= DENSE_EXPERT_FACTOR * N * K: the rows hit most experts anyway, and
#: its extra FLOPs (E/K times the routed ones) stay under the cost of the loop's per-expert
#: weight copies on a CPU (2 FLOPs per weight and row against 12 bytes moved per weight).
DENSE_MAX_ROWS = 16
DENSE_EXPERT_FACTOR = 3

#: DSAMoEExperts body constructions: ``loop`` (files) and ``dense`` (ONNX Runtime), see
#: :func:`moe_experts_function`.
MOE_BODIES = ("loop", "dense")

#: FP8 body constructions, see the module docstring.
FP8_BODIES = ("expert", "stack")


@dataclass(frozen=True)
class _Schedule:
    """Names of the prelude's values that the loops read."""

    n: str  # scalar N
    hidden: str  # [1] H
    last_slot: str  # scalar N*K - 1
    tile: str  # scalar T
    tile_rows: str  # [T] 0..T-1
    x_rows: str  # [N+1, H] float32 x with a zero row N
    acc0: str  # [N+1, H] float32 zeros
    sorted_token: str  # [N*K] token of each slot, slots sorted by expert
    sorted_weight: str  # [N*K] float32 weight of each sorted slot
    counts: str  # [E+1] int64 slots per expert (E: skipped)
    starts: str  # [E+1] int64 first sorted position of each expert
    experts: str  # scalar E
    expert_range: str  # [E] 0..E-1
    active: str  # scalar: experts with at least one slot
    order: str  # [E] active experts first, ascending
    dense_rows: str = ""  # [N, H] float32 from the dense path (zeros when the loop runs); float body only


@dataclass(frozen=True)
class _Sort:
    """The prelude's routing-dependent values (the counting sort), see :func:`_sort`."""

    sorted_token: str
    sorted_weight: str
    counts: str
    starts: str
    active: str
    order: str

    TYPES = (I64, F32, I64, I64, I64, I64)
    RANKS = (1, 1, 1, 1, 0, 1)

    def names(self) -> list[str]:
        return [self.sorted_token, self.sorted_weight, self.counts, self.starts, self.active, self.order]


def _sort(b: Body, n: str, k: str, e: str, m: str, expert_range: str) -> _Sort:
    """Merge repeated experts and sort the ``N*K`` slots by expert (prelude steps, module doc)."""
    wf = b("Cast", "topk_weights", to=F32)
    ids = b("Cast", "topk_ids", to=I64)
    # A repeated expert in a row: its first slot takes the summed weight, the others are skipped.
    same = b("Equal", b("Unsqueeze", ids, b.const([2])), b("Unsqueeze", ids, b.const([1])))  # [N,K,K]
    merged = b("ReduceSum", b("Mul", b("Cast", same, to=F32), b("Unsqueeze", wf, b.const([1]))),
               b.const([2]), keepdims=0)  # [N,K]
    kpos = b("Range", b.const(0), k, b.const(1))
    earlier = b("Less", b("Unsqueeze", kpos, b.const([0])), b("Unsqueeze", kpos, b.const([1])))  # [k,k']: k' < k
    repeated = b("Greater", b("ReduceMax", b("Cast", b("And", same, earlier), to=F32), b.const([2]), keepdims=0),
                 b.const(0.0, F32))
    in_range = b("And", b("GreaterOrEqual", ids, b.const(0)), b("Less", ids, e))
    keep = b("And", in_range, b("Not", repeated))
    slot_expert = b("Reshape", b("Where", keep, ids, e), b.const([-1]))  # [M]; E marks a skipped slot
    slot_weight = b("Reshape", merged, b.const([-1]))

    # Counting sort of the slots by expert: position = first slot of the expert + rank within it.
    buckets = b("Range", b.const(0), b("Add", e, b.const(1)), b.const(1))  # [E+1]
    onehot = b("Cast", b("Equal", b("Unsqueeze", slot_expert, b.const([1])), b("Unsqueeze", buckets, b.const([0]))),
               to=I32)  # [M,E+1]
    rank = b("Squeeze", b("GatherElements", b("CumSum", onehot, b.const(0)),
                          b("Unsqueeze", slot_expert, b.const([1])), axis=1), b.const([1]))  # 1-based
    counts = b("Cast", b("ReduceSum", onehot, b.const([0]), keepdims=0), to=I64)  # [E+1]
    starts = b("CumSum", counts, b.const(0), exclusive=1)
    pos = b("Sub", b("Add", b("Gather", starts, slot_expert, axis=0), b("Cast", rank, to=I64)), b.const(1))
    slots = b("Range", b.const(0), m, b.const(1))
    perm = b("ScatterND", slots, b("Unsqueeze", pos, b.const([1])), slots)  # sorted position -> slot
    sorted_token = b("Div", perm, k)
    sorted_weight = b("Gather", slot_weight, perm, axis=0)

    # Active experts first (a permutation again, so ScatterND writes each position once).
    used = b("Cast", b("Greater", b("Slice", counts, b.const([0]), b("Unsqueeze", e, b.const([0]))), b.const(0)),
             to=I64)  # [E]
    active = b("ReduceSum", used, b.const([0]), keepdims=0)
    unused = b("Sub", b.const(1), used)
    epos = b("Where", b("Cast", used, to=BOOL), b("CumSum", used, b.const(0), exclusive=1),
             b("Add", active, b("CumSum", unused, b.const(0), exclusive=1)))
    order = b("ScatterND", expert_range, b("Unsqueeze", epos, b.const([1])), expert_range)
    return _Sort(sorted_token, sorted_weight, counts, starts, active, order)


def _prelude(b: Body, dense: bool = False) -> _Schedule:
    """The loops' schedule. With ``dense`` (the float body), the sort runs only when the dense path
    does not: it and the dense path are the two branches of one ``If`` (see :func:`_dense_or_sort`)."""
    xf = b("Cast", "x", to=F32)
    x_shape = b("Shape", "x")
    n = b("Gather", x_shape, b.const(0), axis=0)
    hidden = b("Slice", x_shape, b.const([1]), b.const([2]))
    k = b("Gather", b("Shape", "topk_ids"), b.const(1), axis=0)
    e = b("Gather", b("Shape", "gate_up"), b.const(0), axis=0)
    m = b("Mul", n, k)
    expert_range = b("Range", b.const(0), e, b.const(1))
    if dense:
        dense_rows, sort = _dense_or_sort(b, n, k, e, m, hidden, expert_range)
    else:
        dense_rows, sort = "", _sort(b, n, k, e, m, expert_range)

    # T = min(N, TILE_ROWS, ceil(M / E)), at least 1.
    mean_load = b("Max", b("Div", b("Sub", b("Add", m, e), b.const(1)), e), b.const(1))
    tile = b("Min", n, b.const(TILE_ROWS), mean_load)
    rows_shape = b("Concat", b("Unsqueeze", b("Add", n, b.const(1)), b.const([0])), hidden, axis=0)
    zero = helper.make_tensor("v", F32, [1], [0.0])
    x_rows = b("Concat", xf, b("ConstantOfShape", b("Concat", b.const([1]), hidden, axis=0), value=zero), axis=0)
    return _Schedule(
        n=n, hidden=hidden, last_slot=b("Sub", m, b.const(1)), tile=tile,
        tile_rows=b("Range", b.const(0), tile, b.const(1)), x_rows=x_rows,
        acc0=b("ConstantOfShape", rows_shape, value=zero), sorted_token=sort.sorted_token,
        sorted_weight=sort.sorted_weight, counts=sort.counts, starts=sort.starts, experts=e,
        expert_range=expert_range, active=sort.active, order=sort.order, dense_rows=dense_rows,
    )


def _loop_inputs(iteration: str, cond: str, acc: str) -> list:
    return [value(iteration, I64, 0), value(cond, BOOL, 0), value(acc, F32, 2)]


def _loop_outputs(cond: str, acc: str) -> list:
    return [value(cond, BOOL, 0), value(acc, F32, 2)]


def _tile_loop(b: Body, s: _Schedule, expert: str, gate_up: str, down: str, acc: str) -> str:
    """Append the Loop over the tiles of ``expert`` (float32 weights given); returns the new acc."""
    count = b("Gather", s.counts, expert, axis=0)
    first = b("Gather", s.starts, expert, axis=0)
    tiles = b("Div", b("Sub", b("Add", count, s.tile), b.const(1)), s.tile)
    t = b.child("tile")
    it, cond, acc_in = f"{t.prefix}_i", f"{t.prefix}_cond", f"{t.prefix}_acc"
    row = t("Add", t("Mul", it, s.tile), s.tile_rows)  # [T] rank of each row within the expert
    real = t("Less", row, count)
    pos = t("Min", t("Add", first, row), s.last_slot)
    token = t("Where", real, t("Gather", s.sorted_token, pos, axis=0), s.n)  # padding -> spare row N
    weight = t("Where", real, t("Gather", s.sorted_weight, pos, axis=0), t.const(0.0, F32))
    gate, up = t("Split", t("Gemm", t("Gather", s.x_rows, token, axis=0), gate_up, transB=1), axis=1,
                 num_outputs=2, outputs=2)
    hidden = t("Mul", t("Mul", gate, t("Sigmoid", gate)), up)  # SiLU(gate) * up
    out = t("Mul", t("Gemm", hidden, down, transB=1), t("Unsqueeze", weight, t.const([1])))
    summed = t("Add", t("Gather", acc_in, token, axis=0), out)
    acc_out = t("ScatterND", acc_in, t("Unsqueeze", token, t.const([1])), summed)
    body = t.graph(_loop_inputs(it, cond, acc_in), _loop_outputs(t.true(), acc_out))
    return b("Loop", tiles, "", acc, body=body)  # a trip count only (see Body.true)


def _expert_loop(b: Body, s: _Schedule, gate_up: str, down: str) -> str:
    """Loop over the active experts, weights taken from the stacks ``gate_up``/``down``."""
    x = b.child("expert")
    j, cond, acc_in = f"{x.prefix}_j", f"{x.prefix}_cond", f"{x.prefix}_acc"
    expert = x("Gather", s.order, j, axis=0)
    w_gate_up = x("Cast", x("Gather", gate_up, expert, axis=0), to=F32)
    w_down = x("Cast", x("Gather", down, expert, axis=0), to=F32)
    acc_out = _tile_loop(x, s, expert, w_gate_up, w_down, acc_in)
    body = x.graph(_loop_inputs(j, cond, acc_in), _loop_outputs(x.true(), acc_out))
    return b("Loop", s.active, "", s.acc0, body=body)  # a trip count only (see Body.true)


def _block_rows(b: Body, length: str, block: str) -> str:
    """[length] index of each row's scale block: 0..length-1 // block."""
    return b("Div", b("Range", b.const(0), length, b.const(1)), block)


def _block_size_attr() -> AttributeProto:
    return AttributeProto(name="block_size", ref_attr_name="block_size", type=AttributeProto.INT)


def _fp8_scan(b: Body, s: _Schedule, gate_up_rows: str, down_rows: str) -> str:
    """Scan over all experts; an active one is dequantized (alone) and its tiles run."""
    x = b.child("expert")
    acc_in, gu8, dn8, gus, dns, expert = (f"{x.prefix}_{n}" for n in ("acc", "gu", "dn", "gus", "dns", "e"))
    has_tokens = x("Greater", x("Gather", s.counts, expert, axis=0), x.const(0))
    then = x.child("then")
    # The scales are repeated along the rows, leaving one blocked axis for DequantizeLinear.
    w_gate_up = then("DequantizeLinear", gu8, then("Gather", gus, gate_up_rows, axis=0), axis=1,
                     block_size=_block_size_attr())
    w_down = then("DequantizeLinear", dn8, then("Gather", dns, down_rows, axis=0), axis=1,
                  block_size=_block_size_attr())
    acc_then = _tile_loop(then, s, expert, w_gate_up, w_down, acc_in)
    other = x.child("else")
    acc_else = other("Identity", acc_in)
    acc_out = x("If", has_tokens, then_branch=then.graph([], [value(acc_then, F32, 2)]),
               else_branch=other.graph([], [value(acc_else, F32, 2)]))
    body = x.graph([value(acc_in, F32, 2), value(gu8, TensorProto.FLOAT8E4M3FN, 2),
                    value(dn8, TensorProto.FLOAT8E4M3FN, 2), value(gus, F32, 2), value(dns, F32, 2),
                    value(expert, I64, 0)], [value(acc_out, F32, 2)])
    return b("Scan", s.acc0, "gate_up", "down", "gate_up_scale", "down_scale", s.expert_range, body=body,
             num_scan_inputs=5)


def _finish(b: Body, s: _Schedule, acc: str, spec: OpSpec, opset: int, sliced: bool = False) -> FunctionProto:
    """Cast ``acc``'s first N rows (all of it when ``sliced``) to x's type as ``out``; the FunctionProto."""
    rows = acc if sliced else b("Slice", acc, b.const([0]), b("Unsqueeze", s.n, b.const([0])), b.const([0]))
    b("CastLike", rows, "x")
    b.rename_last("out")
    return helper.make_function(
        DOMAIN, spec.name, inputs=[t.name for t in spec.inputs], outputs=[t.name for t in spec.outputs],
        nodes=b.nodes, opset_imports=[helper.make_opsetid("", opset)],
        # Defaults travel with the function, so a node that omits an attribute still runs.
        attributes=[a.name for a in spec.attributes if a.default is None],
        attribute_protos=[helper.make_attribute(a.name, a.default) for a in spec.attributes if a.default is not None],
        doc_string=spec.doc,
    )


def _dense_condition(b: Body, n: str, k: str, e: str) -> str:
    """Scalar bool: take the dense path (see :func:`_dense_or_sort`).

    ``N <= DENSE_MAX_ROWS`` and ``E <= DENSE_EXPERT_FACTOR * N * K``, and float32 weights: ``1 +
    2^-23`` survives a CastLike to x's type only in float32 (two scalar nodes per call), so
    fp16/bf16 graphs keep the loop and never run the branch's MatMuls in their own precision.
    """
    few_rows = b("LessOrEqual", n, b.const(DENSE_MAX_ROWS))
    most_hit = b("LessOrEqual", e, b("Mul", b.const(DENSE_EXPERT_FACTOR), b("Mul", n, k)))
    probe = b.const(1.0 + 2.0**-23, F32)
    is_f32 = b("Equal", b("Cast", b("CastLike", probe, "x"), to=F32), probe)
    return b("And", b("And", few_rows, most_hit), is_f32)


def _dense_or_sort(b: Body, n: str, k: str, e: str, m: str, hidden: str, expert_range: str) -> tuple[str, _Sort]:
    """One ``If``: the dense path, or the sort the expert loop needs.

    Dense (a few rows over float32 weights, most experts hit anyway): every expert over every row,
    weighted by its routing weight (0 if not routed), the stacks read where they lie:
    ``MatMul(gate_up [E,2I,H], x^T [1,H,N])`` and ``MatMul(down [E,H,I], h [E,I,N])`` put them on
    the left, so neither is transposed, gathered or cast; only ``[E, *, N]`` activations are
    written. That branch gives the loop nothing to do (no active expert); the other gives ``[N, H]``
    zeros and the sort. Both branches give every output the same shape (TensorRT's conditionals).
    Returns the ``[N, H]`` float32 dense rows and the sort's values.
    """
    zero = helper.make_tensor("v", F32, [1], [0.0])
    then = b.child("dense")
    xt = then("Unsqueeze", then("Transpose", "x", perm=[1, 0]), then.const([0]))  # [1,H,N]
    gate, up = then("Split", then("Cast", then("MatMul", "gate_up", xt), to=F32), axis=1, num_outputs=2,
                    outputs=2)  # [E,I,N] each
    hidden_act = then("Mul", then("Mul", gate, then("Sigmoid", gate)), up)  # SiLU(gate) * up, [E,I,N]
    # Routing weight of (row, expert): the sum over the row's slots naming it (a repeated expert's
    # weights summed, ids out of range nowhere), the prelude's merge rule.
    named = then("Equal", then("Unsqueeze", then("Cast", "topk_ids", to=I64), then.const([2])),
                 then("Unsqueeze", expert_range, then.const([0, 1])))  # [N,K,E]
    weight = then("ReduceSum", then("Mul", then("Cast", named, to=F32),
                                    then("Unsqueeze", then("Cast", "topk_weights", to=F32), then.const([2]))),
                  then.const([1]), keepdims=0)  # [N,E]
    routed = then("Transpose", then("Unsqueeze", then("ReduceMax", then("Cast", named, to=I32), then.const([1]),
                                                      keepdims=0), then.const([2])), perm=[1, 2, 0])  # [E,1,N]
    # The routing weight scales the activations before the down projection (the [E,I,N] tensor,
    # smaller than the [E,H,N] output: I < H in DeepSeek-V3.2 and GLM-5), and an unrouted expert's
    # activations become an exact 0, whatever they were, so it adds an exact 0.
    scaled = then("Where", then("Cast", routed, to=BOOL),
                  then("Mul", hidden_act, then("Unsqueeze", then("Transpose", weight, perm=[1, 0]), then.const([1]))),
                  then.const(0.0, F32))  # [E,I,N]
    out = then("Cast", then("MatMul", "down", then("CastLike", scaled, "x")), to=F32)  # [E,H,N]
    dense_rows = then("Transpose", then("ReduceSum", out, then.const([0]), keepdims=0), perm=[1, 0])  # [N,H]
    slots = then("Unsqueeze", m, then.const([0]))
    no_slots = then("Expand", then.const([0]), slots)
    bucket_range = then("Range", then.const(0), then("Add", e, then.const(1)), then.const(1))
    no_counts = then("Sub", bucket_range, bucket_range)  # (an Expand of 0 here fails TensorRT-RTX's Myelin)
    no_sort = _Sort(sorted_token=no_slots, sorted_weight=then("Cast", no_slots, to=F32), counts=no_counts,
                    starts=then("Identity", no_counts), active=then.const(0), order=then("Identity", expert_range))

    other = b.child("sort")
    nothing = other("ConstantOfShape", other("Concat", other("Unsqueeze", n, other.const([0])), hidden, axis=0),
                    value=zero)
    sort = _sort(other, n, k, e, m, expert_range)

    def outputs(rows: str, values: _Sort) -> list:
        return [value(rows, F32, 2)] + [value(name, t, r) for name, t, r in zip(values.names(), _Sort.TYPES,
                                                                                  _Sort.RANKS, strict=True)]

    results = b("If", _dense_condition(b, n, k, e), then_branch=then.graph([], outputs(dense_rows, no_sort)),
                else_branch=other.graph([], outputs(nothing, sort)), outputs=7)
    return results[0], _Sort(*results[1:])


def moe_experts_function(opset: int, body: str = "loop") -> FunctionProto:
    """Body of DSAMoEExperts (SiLU; other activations are refused before a node is written).

    ``body``: ``loop`` (what files carry; TensorRT(-RTX) builds it in every float type) is the
    sort and the expert loop; ``dense`` (what dsa-export's ONNX Runtime sessions swap in, see
    :func:`use_moe_body`) adds, for a few rows over float32 weights most of which the rows hit
    anyway (a decode step), every expert over every row with the stacks read in place, in one
    ``If`` with the sort it replaces: no per-expert Gather copies and a sixth of the node runs.
    The loop's trip count is 0 when the dense path runs (a Loop inside an If is what TensorRT-RTX
    refuses, so it stays outside), and both paths give the reference's result.
    """
    if body not in MOE_BODIES:
        raise ValueError(f"DSAMoEExperts body must be one of {MOE_BODIES}, not {body!r}.")
    b = Body("moe")
    s = _prelude(b, dense=body == "dense")
    acc = _expert_loop(b, s, "gate_up", "down")
    if body == "loop":
        return _finish(b, s, acc, MOE_EXPERTS, opset)
    rows = b("Slice", acc, b.const([0]), b("Unsqueeze", s.n, b.const([0])), b.const([0]))
    return _finish(b, s, b("Add", rows, s.dense_rows), MOE_EXPERTS, opset, sliced=True)


def use_moe_body(model, body: str) -> bool:
    """Replace ``model``'s DSAMoEExperts function with the ``body`` construction, in place
    (``loop``: what TensorRT(-RTX) builds; ``dense``: what ONNX Runtime runs faster at decode
    sizes). Returns whether the model had the function."""
    return replace_function(model, DOMAIN, MOE_EXPERTS.name, lambda opset: moe_experts_function(opset, body))


def moe_experts_fp8_function(opset: int, body: str = "expert") -> FunctionProto:
    """Body of DSAMoEExpertsFP8 (opset >= 21); ``body`` is ``expert`` or ``stack`` (see module doc)."""
    if body not in FP8_BODIES:
        raise ValueError(f"FP8 body must be one of {FP8_BODIES}, not {body!r}.")
    if opset < MOE_EXPERTS_FP8.min_opset:
        raise ValueError(f"the {MOE_EXPERTS_FP8.name} body needs opset >= {MOE_EXPERTS_FP8.min_opset}, not {opset}.")
    b = Body("moe8")
    s = _prelude(b)
    block = b.ref("block_size", AttributeProto.INT)
    shape = b("Shape", "gate_up")
    gate_up_rows = _block_rows(b, b("Gather", shape, b.const(1), axis=0), block)  # [2I]
    down_rows = _block_rows(b, b("Gather", shape, b.const(2), axis=0), block)  # [H]
    if body == "expert":
        acc = _fp8_scan(b, s, gate_up_rows, down_rows)
    else:
        w_gate_up = b("DequantizeLinear", "gate_up", b("Gather", "gate_up_scale", gate_up_rows, axis=1), axis=2,
                      block_size=_block_size_attr())
        w_down = b("DequantizeLinear", "down", b("Gather", "down_scale", down_rows, axis=1), axis=2,
                   block_size=_block_size_attr())
        acc = _expert_loop(b, s, w_gate_up, w_down)
    return _finish(b, s, acc, MOE_EXPERTS_FP8, opset)


def use_fp8_body(model, body: str) -> bool:
    """Replace ``model``'s DSAMoEExpertsFP8 function with the ``body`` construction, in place.

    For builders that cannot run the default ``expert`` body: TensorRT(-RTX) builds ``stack``.
    Returns whether the model had the function.
    """
    return replace_function(model, DOMAIN, MOE_EXPERTS_FP8.name, lambda opset: moe_experts_fp8_function(opset, body))


def has_fp8_experts(model) -> bool:
    """Whether ``model`` carries the DSAMoEExpertsFP8 function."""
    return any(fn.domain == DOMAIN and fn.name == MOE_EXPERTS_FP8.name for fn in model.functions)
