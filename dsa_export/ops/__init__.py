"""DSA ops: the contract, torch ops, NumPy references and the ONNX side (schemas, function bodies).

The Python entry points validate their arguments against the op contract and then call the
``torch.ops.dsa`` custom ops, which the ONNX exporter turns into ``dsa``-domain nodes: the two
sparse-attention ops and their paged-cache forms (over float or FP8 caches), the block-sparse
attention and the routed experts of a mixture-of-experts block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsa_export.errors import DSAUserError
from dsa_export.ops.contract import (
    BLOCK_SPARSE_ATTENTION,
    DOMAIN,
    INDEXER_TOPK,
    INDEXER_TOPK_PAGED,
    INDEXER_TOPK_PAGED_FP8,
    MOE_EXPERTS,
    MOE_EXPERTS_FP8,
    OPS,
    PLUGIN_OPS,
    SPARSE_ATTENTION,
    SPARSE_ATTENTION_PAGED,
    SPARSE_ATTENTION_PAGED_FP8,
    check_activation,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "BLOCK_SPARSE_ATTENTION",
    "DOMAIN",
    "INDEXER_TOPK",
    "INDEXER_TOPK_PAGED",
    "INDEXER_TOPK_PAGED_FP8",
    "MOE_EXPERTS",
    "MOE_EXPERTS_FP8",
    "OPS",
    "PLUGIN_OPS",
    "SPARSE_ATTENTION",
    "SPARSE_ATTENTION_PAGED",
    "SPARSE_ATTENTION_PAGED_FP8",
    "dsa_block_sparse_attention",
    "dsa_indexer_topk",
    "dsa_indexer_topk_paged",
    "dsa_indexer_topk_paged_fp8",
    "dsa_moe_experts",
    "dsa_moe_experts_fp8",
    "dsa_sparse_attention",
    "dsa_sparse_attention_paged",
    "dsa_sparse_attention_paged_fp8",
]

_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def dsa_indexer_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    topk: int,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """Select the ``topk`` keys of every query with the lightning indexer (see the op contract)."""
    import torch

    from dsa_export.ops import torch_ops

    _check(q.dim() == 4 and k.dim() == 3 and w.dim() == 3, "DSAIndexerTopK expects q [B,S,H,D], k [B,T,D], w [B,S,H].")
    _check(k.shape[0] == q.shape[0] and k.shape[2] == q.shape[3], f"k {tuple(k.shape)} does not match q {tuple(q.shape)}.")
    _check(tuple(w.shape) == tuple(q.shape[:3]), f"w {tuple(w.shape)} must be [B,S,H] of q {tuple(q.shape)}.")
    _check(str(q.dtype).split(".")[-1] in _FLOAT_DTYPES, f"unsupported dtype {q.dtype}.")
    _check(int(topk) >= 1, "topk must be at least 1.")
    if lengths is not None:
        _check(lengths.shape == (q.shape[0],), "lengths must be [B].")
        lengths = lengths.to(torch.int32)
    return torch_ops.indexer_topk(q, k, w, lengths, int(topk), float(scale), bool(causal))


def dsa_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    indices: torch.Tensor,
    *,
    scale: float,
    v_head_dim: int | None = None,
) -> torch.Tensor:
    """Attend every query head over its query's selected keys (see the op contract).

    ``v=None`` with ``v_head_dim=Dv`` takes the values from the keys: they are the first ``Dv``
    channels of k's rows (DeepSeek's absorbed MLA, whose values are the first ``kv_lora_rank``
    latent channels). The op then receives the contract's empty ``v`` (``[B,0,Hkv,Dv]``, a view of
    k) and gathers each selected row once instead of once for the keys and once for the values.
    """
    import torch

    from dsa_export.ops import torch_ops

    if v is None:
        _check(v_head_dim is not None and 0 < int(v_head_dim) <= k.shape[-1],
               "values from keys (v=None) need 0 < v_head_dim <= the key head dim.")
        v = k[:, :0, :, : int(v_head_dim)]
    elif v_head_dim is not None:
        _check(int(v_head_dim) == v.shape[-1], f"v_head_dim {v_head_dim} != v's head dim {v.shape[-1]}.")
    _check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and indices.dim() == 3,
           "DSASparseAttention expects q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,T,Hkv,Dv], indices [B,S,K].")
    _check(k.shape[3] == q.shape[3], f"k head dim {k.shape[3]} != q head dim {q.shape[3]}.")
    if v.shape[1] == 0 and k.shape[1] > 0:
        _check(v.shape[0] == k.shape[0] and v.shape[2] == k.shape[2] and v.shape[3] <= k.shape[3],
               f"an empty v {tuple(v.shape)} (values from keys) must be [B,0,Hkv,Dv] with Dv <= Dk of k "
               f"{tuple(k.shape)}.")
    else:
        _check(tuple(k.shape[:3]) == tuple(v.shape[:3]), f"k {tuple(k.shape)} and v {tuple(v.shape)} differ.")
    _check(q.shape[2] % k.shape[2] == 0, f"H={q.shape[2]} is not a multiple of Hkv={k.shape[2]}.")
    _check(tuple(indices.shape[:2]) == tuple(q.shape[:2]), "indices must be [B,S,K] of q.")
    return torch_ops.sparse_attention(q, k, v, indices.to(torch.int32), float(scale))


def _check_block_table(block_table: torch.Tensor, batch: int, op: str) -> None:
    _check(block_table.dim() == 2 and block_table.shape[0] == batch and not block_table.is_floating_point(),
           f"{op} expects an integer block_table [B,M] with B = {batch}, not {tuple(block_table.shape)} "
           f"{block_table.dtype}.")


def dsa_indexer_topk_paged(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    w: torch.Tensor,
    block_table: torch.Tensor,
    query_start: torch.Tensor,
    lengths: torch.Tensor,
    *,
    topk: int,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """The lightning indexer over a paged key cache (see the op contract, DSAIndexerTopKPaged).

    Logical key ``t`` of row ``b`` is ``k_pool[block_table[b, t // page], t % page]``; query ``s``
    of row ``b`` sits at logical position ``query_start[b] + s`` and selects among the keys
    ``t < lengths[b]`` (and ``t <= query_start[b] + s`` when causal) whose page entry lies in
    ``[0, P)``. Returns logical positions ``[B,S,topk]`` int32, -1 padded.
    """
    import torch

    from dsa_export.ops import torch_ops

    op = INDEXER_TOPK_PAGED.name
    _check(q.dim() == 4 and k_pool.dim() == 3 and w.dim() == 3,
           f"{op} expects q [B,S,H,D], k_pool [P,page,D], w [B,S,H].")
    _check(k_pool.shape[2] == q.shape[3], f"k_pool {tuple(k_pool.shape)} does not match q {tuple(q.shape)}.")
    _check(k_pool.shape[0] >= 1 and k_pool.shape[1] >= 1, f"k_pool {tuple(k_pool.shape)} needs at least one page.")
    _check(tuple(w.shape) == tuple(q.shape[:3]), f"w {tuple(w.shape)} must be [B,S,H] of q {tuple(q.shape)}.")
    _check(str(q.dtype).split(".")[-1] in _FLOAT_DTYPES and k_pool.dtype == q.dtype,
           f"q and k_pool must share one of {', '.join(_FLOAT_DTYPES)}, not {q.dtype} / {k_pool.dtype}.")
    _check(w.dtype in (torch.float32, q.dtype), f"w must be float32 or q's dtype ({q.dtype}), not {w.dtype}.")
    _check(int(topk) >= 1, "topk must be at least 1.")
    _check_block_table(block_table, q.shape[0], op)
    for name, tensor in (("query_start", query_start), ("lengths", lengths)):
        _check(tuple(tensor.shape) == (q.shape[0],) and not tensor.is_floating_point(),
               f"{name} must be an integer [B] tensor, not {tuple(tensor.shape)} {tensor.dtype}.")
    return torch_ops.indexer_topk_paged(q, k_pool, w, block_table.to(torch.int32), query_start.to(torch.int32),
                                        lengths.to(torch.int32), int(topk), float(scale), bool(causal))


def dsa_sparse_attention_paged(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor | None,
    indices: torch.Tensor,
    block_table: torch.Tensor,
    *,
    scale: float,
    v_head_dim: int | None = None,
) -> torch.Tensor:
    """Sparse attention over paged key/value caches (see the op contract, DSASparseAttentionPaged).

    ``indices [B,S,K]`` are logical positions, read through ``block_table [B,M]``. ``v_pool=None``
    with ``v_head_dim=Dv`` takes the values from the keys (their first ``Dv`` channels): the op
    receives the contract's pool without pages (``[0,page,Hkv,Dv]``, a view of k_pool).
    """
    import torch

    from dsa_export.ops import torch_ops

    op = SPARSE_ATTENTION_PAGED.name
    _check(k_pool.dim() == 4, f"{op} expects k_pool [P,page,Hkv,Dk], not {tuple(k_pool.shape)}.")
    if v_pool is None:
        _check(v_head_dim is not None and 0 < int(v_head_dim) <= k_pool.shape[-1],
               "values from keys (v_pool=None) need 0 < v_head_dim <= the key head dim.")
        v_pool = k_pool[:0, :, :, : int(v_head_dim)]
    elif v_head_dim is not None:
        _check(int(v_head_dim) == v_pool.shape[-1], f"v_head_dim {v_head_dim} != v_pool's head dim {v_pool.shape[-1]}.")
    _check(q.dim() == 4 and v_pool.dim() == 4 and indices.dim() == 3,
           f"{op} expects q [B,S,H,Dk], k_pool [P,page,Hkv,Dk], v_pool [P,page,Hkv,Dv], indices [B,S,K].")
    _check(k_pool.shape[3] == q.shape[3], f"k_pool head dim {k_pool.shape[3]} != q head dim {q.shape[3]}.")
    _check(k_pool.shape[0] >= 1 and k_pool.shape[1] >= 1, f"k_pool {tuple(k_pool.shape)} needs at least one page.")
    if v_pool.shape[0] == 0:
        _check(v_pool.shape[1:3] == k_pool.shape[1:3] and v_pool.shape[3] <= k_pool.shape[3],
               f"a v_pool without pages {tuple(v_pool.shape)} (values from keys) must be [0,page,Hkv,Dv] with "
               f"Dv <= Dk of k_pool {tuple(k_pool.shape)}.")
    else:
        _check(tuple(v_pool.shape[:3]) == tuple(k_pool.shape[:3]),
               f"k_pool {tuple(k_pool.shape)} and v_pool {tuple(v_pool.shape)} must have the same pages.")
    _check(q.shape[2] % k_pool.shape[2] == 0, f"H={q.shape[2]} is not a multiple of Hkv={k_pool.shape[2]}.")
    _check(str(q.dtype).split(".")[-1] in _FLOAT_DTYPES and k_pool.dtype == q.dtype and v_pool.dtype == q.dtype,
           f"q, k_pool and v_pool must share one of {', '.join(_FLOAT_DTYPES)}.")
    _check(tuple(indices.shape[:2]) == tuple(q.shape[:2]) and not indices.is_floating_point(),
           "indices must be an integer [B,S,K] tensor of q.")
    _check_block_table(block_table, q.shape[0], op)
    return torch_ops.sparse_attention_paged(q, k_pool, v_pool, indices.to(torch.int32), block_table.to(torch.int32),
                                            float(scale))


def _check_fp8_pool(k_pool: torch.Tensor, k_scale_pool: torch.Tensor, scale_shape: tuple, op: str) -> None:
    import torch

    _check(k_pool.dtype == torch.uint8,
           f"{op} expects k_pool as uint8 float8-e4m3fn bit patterns (codes.view(torch.uint8)), not {k_pool.dtype}.")
    _check(k_pool.shape[0] >= 1 and k_pool.shape[1] >= 1, f"k_pool {tuple(k_pool.shape)} needs at least one page.")
    _check(tuple(k_scale_pool.shape) == tuple(scale_shape) and k_scale_pool.dtype == torch.float32,
           f"{op} expects a float32 k_scale_pool {list(scale_shape)} for k_pool {tuple(k_pool.shape)}, not "
           f"{tuple(k_scale_pool.shape)} {k_scale_pool.dtype}.")


def dsa_indexer_topk_paged_fp8(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    k_scale_pool: torch.Tensor,
    w: torch.Tensor,
    block_table: torch.Tensor,
    query_start: torch.Tensor,
    lengths: torch.Tensor,
    *,
    topk: int,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """The lightning indexer over a paged FP8 key cache (see the op contract, DSAIndexerTopKPagedFP8).

    ``k_pool [P,page,D]`` uint8 holds float8 e4m3fn bit patterns and ``k_scale_pool [P,page,1]``
    float32 one scale per token: key = decode(code) * scale. Otherwise :func:`dsa_indexer_topk_paged`.
    """
    import torch

    from dsa_export.ops import torch_ops

    op = INDEXER_TOPK_PAGED_FP8.name
    _check(q.dim() == 4 and k_pool.dim() == 3 and w.dim() == 3,
           f"{op} expects q [B,S,H,D], k_pool [P,page,D], k_scale_pool [P,page,1], w [B,S,H].")
    _check(k_pool.shape[2] == q.shape[3], f"k_pool {tuple(k_pool.shape)} does not match q {tuple(q.shape)}.")
    _check_fp8_pool(k_pool, k_scale_pool, (k_pool.shape[0], k_pool.shape[1], 1), op)
    _check(tuple(w.shape) == tuple(q.shape[:3]), f"w {tuple(w.shape)} must be [B,S,H] of q {tuple(q.shape)}.")
    _check(str(q.dtype).split(".")[-1] in _FLOAT_DTYPES,
           f"q must be one of {', '.join(_FLOAT_DTYPES)}, not {q.dtype}.")
    _check(w.dtype in (torch.float32, q.dtype), f"w must be float32 or q's dtype ({q.dtype}), not {w.dtype}.")
    _check(int(topk) >= 1, "topk must be at least 1.")
    _check_block_table(block_table, q.shape[0], op)
    for name, tensor in (("query_start", query_start), ("lengths", lengths)):
        _check(tuple(tensor.shape) == (q.shape[0],) and not tensor.is_floating_point(),
               f"{name} must be an integer [B] tensor, not {tuple(tensor.shape)} {tensor.dtype}.")
    return torch_ops.indexer_topk_paged_fp8(q, k_pool, k_scale_pool, w, block_table.to(torch.int32),
                                            query_start.to(torch.int32), lengths.to(torch.int32), int(topk),
                                            float(scale), bool(causal))


def dsa_sparse_attention_paged_fp8(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    k_scale_pool: torch.Tensor,
    k_rope_pool: torch.Tensor,
    indices: torch.Tensor,
    block_table: torch.Tensor,
    *,
    scale: float,
    block_size: int = 128,
) -> torch.Tensor:
    """Sparse attention over a paged FP8 latent cache (see the op contract, DSASparseAttentionPagedFP8).

    ``k_pool [P,page,Hkv,C]`` uint8 holds the e4m3fn codes of the latent's first C channels,
    ``k_scale_pool [P,page,Hkv,C/block_size]`` float32 one scale per ``block_size`` channels and
    ``k_rope_pool [P,page,Hkv,R]`` the RoPE channels; key rows are ``C+R`` wide (q is
    ``[B,S,H,C+R]``) and the values are the decoded first C channels: returns ``[B,S,H,C]`` in q's dtype.
    """
    import torch

    from dsa_export.ops import torch_ops

    op = SPARSE_ATTENTION_PAGED_FP8.name
    _check(q.dim() == 4 and k_pool.dim() == 4 and k_rope_pool.dim() == 4 and indices.dim() == 3,
           f"{op} expects q [B,S,H,C+R], k_pool [P,page,Hkv,C], k_scale_pool [P,page,Hkv,C/block_size], "
           "k_rope_pool [P,page,Hkv,R], indices [B,S,K].")
    bs = int(block_size)
    p, page, hkv, c = k_pool.shape
    _check(bs >= 1 and c % bs == 0, f"C={c} (k_pool's last dim) is not a multiple of block_size={block_size}.")
    _check_fp8_pool(k_pool, k_scale_pool, (p, page, hkv, c // bs), op)
    _check(tuple(k_rope_pool.shape[:3]) == (p, page, hkv),
           f"k_rope_pool {tuple(k_rope_pool.shape)} must have k_pool's pages {tuple(k_pool.shape[:3])}.")
    _check(q.shape[3] == c + k_rope_pool.shape[3],
           f"q head dim {q.shape[3]} != C + R = {c} + {k_rope_pool.shape[3]} of k_pool / k_rope_pool.")
    _check(q.shape[2] % hkv == 0, f"H={q.shape[2]} is not a multiple of Hkv={hkv}.")
    _check(str(q.dtype).split(".")[-1] in _FLOAT_DTYPES and str(k_rope_pool.dtype).split(".")[-1] in _FLOAT_DTYPES,
           f"q and k_rope_pool must be one of {', '.join(_FLOAT_DTYPES)}, not {q.dtype} / {k_rope_pool.dtype}.")
    _check(tuple(indices.shape[:2]) == tuple(q.shape[:2]) and not indices.is_floating_point(),
           "indices must be an integer [B,S,K] tensor of q.")
    _check_block_table(block_table, q.shape[0], op)
    return torch_ops.sparse_attention_paged_fp8(q, k_pool, k_scale_pool, k_rope_pool, indices.to(torch.int32),
                                                block_table.to(torch.int32), float(scale), bs)


def dsa_block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_index: torch.Tensor,
    *,
    block_size: int,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """Attend every query head over the key blocks listed for its query block (see the op contract).

    ``block_index [B,H,ceil(S/block_size),Kb]`` lists, per head and query block, the key blocks
    (block j holds keys ``j*block_size .. j*block_size+block_size-1``) it attends to; -1 pads, ids
    outside the key blocks are ignored and a repeated id counts once.
    """
    import torch

    from dsa_export.ops import block_torch
    from dsa_export.ops.contract import block_count

    _check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and block_index.dim() == 4,
           "DSABlockSparseAttention expects q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,T,Hkv,Dv], "
           "block_index [B,H,ceil(S/bs),Kb].")
    _check(int(block_size) >= 1, f"block_size must be at least 1, not {block_size}.")
    _check(k.shape[3] == q.shape[3], f"k head dim {k.shape[3]} != q head dim {q.shape[3]}.")
    _check(tuple(k.shape[:3]) == tuple(v.shape[:3]), f"k {tuple(k.shape)} and v {tuple(v.shape)} differ.")
    _check(k.shape[0] == q.shape[0], f"k has batch {k.shape[0]}, q has {q.shape[0]}.")
    _check(q.shape[2] % k.shape[2] == 0, f"H={q.shape[2]} is not a multiple of Hkv={k.shape[2]}.")
    _check(str(q.dtype).split(".")[-1] in _FLOAT_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype,
           f"q, k and v must share one of {', '.join(_FLOAT_DTYPES)}, not {q.dtype} / {k.dtype} / {v.dtype}.")
    n_qb = block_count(q.shape[1], int(block_size))
    _check(tuple(block_index.shape[:3]) == (q.shape[0], q.shape[2], n_qb),
           f"block_index {tuple(block_index.shape)} must be [B,H,ceil(S/bs),Kb] = "
           f"[{q.shape[0]},{q.shape[2]},{n_qb},Kb] for q {tuple(q.shape)} and block_size {block_size}.")
    _check(not block_index.is_floating_point(), "block_index must be an integer tensor.")
    return block_torch.block_sparse_attention(q, k, v, block_index.to(torch.int32), int(block_size), float(scale),
                                              bool(causal))


def _user_check(condition: bool, message: str) -> None:
    if not condition:
        raise DSAUserError(message)


def _check_routing(x, topk_ids, topk_weights, gate_up, down, activation: str) -> None:
    import torch

    _user_check(x.dim() == 2 and topk_ids.dim() == 2 and gate_up.dim() == 3 and down.dim() == 3,
                "the routed-experts op expects x [N,H], topk_ids [N,K], gate_up [E,2I,H] and down [E,H,I].")
    _user_check(tuple(topk_weights.shape) == tuple(topk_ids.shape),
                f"topk_weights {tuple(topk_weights.shape)} must have the shape of topk_ids {tuple(topk_ids.shape)}.")
    _user_check(topk_ids.shape[0] == x.shape[0], f"topk_ids has {topk_ids.shape[0]} rows but x has {x.shape[0]}.")
    e, two_i, h = gate_up.shape
    _user_check(h == x.shape[1] and two_i % 2 == 0 and tuple(down.shape) == (e, h, two_i // 2),
                f"gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)} do not match [E,2I,H] / [E,H,I] "
                f"with H = {x.shape[1]}.")
    _user_check(str(x.dtype).split(".")[-1] in _FLOAT_DTYPES, f"x has unsupported dtype {x.dtype}.")
    _user_check(topk_weights.dtype in (torch.float32, x.dtype),
                f"topk_weights must be float32 or x's dtype ({x.dtype}), not {topk_weights.dtype}.")
    _user_check(not topk_ids.is_floating_point(), "topk_ids must be an integer tensor.")
    check_activation(activation, DSAUserError)


def dsa_moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    *,
    activation: str = "silu",
) -> torch.Tensor:
    """Routed experts of a MoE block over the tokens routed to each (see the op contract)."""
    import torch

    from dsa_export.ops import torch_ops

    _check_routing(x, topk_ids, topk_weights, gate_up, down, activation)
    _user_check(gate_up.dtype == x.dtype and down.dtype == x.dtype,
                f"expert weights ({gate_up.dtype}, {down.dtype}) must have x's dtype {x.dtype}; FP8 weights "
                "go through dsa_moe_experts_fp8.")
    return torch_ops.moe_experts(x, topk_ids.to(torch.int32), topk_weights, gate_up, down, activation)


def dsa_moe_experts_fp8(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down_scale: torch.Tensor,
    *,
    block_size: int = 128,
    activation: str = "silu",
) -> torch.Tensor:
    """Routed experts with FP8 e4m3 weights and one float32 scale per ``block_size`` square block."""
    import torch

    from dsa_export.ops import torch_ops

    _check_routing(x, topk_ids, topk_weights, gate_up, down, activation)
    _user_check(gate_up.dtype == torch.float8_e4m3fn and down.dtype == torch.float8_e4m3fn,
                f"FP8 expert weights must be float8_e4m3fn, not {gate_up.dtype} / {down.dtype}.")
    _user_check(int(block_size) >= 1, "block_size must be at least 1.")
    e, two_i, h = gate_up.shape

    def blocks(length: int) -> int:
        return -(-length // int(block_size))

    _user_check(tuple(gate_up_scale.shape) == (e, blocks(two_i), blocks(h)),
                f"gate_up_scale {tuple(gate_up_scale.shape)} must be [E, ceil(2I/bs), ceil(H/bs)] = "
                f"{(e, blocks(two_i), blocks(h))} for block_size {block_size}.")
    _user_check(tuple(down_scale.shape) == (e, blocks(h), blocks(two_i // 2)),
                f"down_scale {tuple(down_scale.shape)} must be [E, ceil(H/bs), ceil(I/bs)] = "
                f"{(e, blocks(h), blocks(two_i // 2))} for block_size {block_size}.")
    _user_check(gate_up_scale.dtype == torch.float32 and down_scale.dtype == torch.float32,
                "FP8 block scales must be float32.")
    return torch_ops.moe_experts_fp8(x, topk_ids.to(torch.int32), topk_weights, gate_up, down, gate_up_scale,
                                     down_scale, int(block_size), activation)
