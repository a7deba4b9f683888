"""NumPy references of the ``dsa`` ops, written for clarity rather than speed.

They follow the op contract literally (dense float64 scores, a mask, a stable sort) so they can
check every other implementation: the torch ops, the ONNX function bodies and the CUDA kernels.
Each op is also an :class:`onnx.reference.op_run.OpRun` subclass, so ``onnx.reference``'s
``ReferenceEvaluator`` runs a plugin-mode graph with ``new_ops=REFERENCE_OPS``, and the function
bodies (inlined) with ``new_ops=BODY_OPS`` (a Loop without ``cond``, see :class:`Loop`).
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_loop import Loop as _OnnxLoop

from dsa_export.ops.contract import DOMAIN, check_activation


def _as_float64(x: np.ndarray) -> np.ndarray:
    # ml_dtypes.bfloat16 / float8 arrays convert through float32.
    return np.asarray(x).astype(np.float32).astype(np.float64)


def indexer_topk_reference(
    q: np.ndarray,
    k: np.ndarray,
    w: np.ndarray,
    lengths: np.ndarray | None = None,
    *,
    topk: int,
    scale: float,
    causal: bool = True,
) -> np.ndarray:
    """int32 ``[B,S,topk]`` selected key positions, ties toward the lower index, -1 padded."""
    q64, k64, w64 = _as_float64(q), _as_float64(k), _as_float64(w)
    b, s, _, _ = q64.shape
    t = k64.shape[1]
    logits = np.einsum("bshd,btd->bsht", q64, k64) * scale
    scores = (np.maximum(logits, 0.0) * w64[..., None]).sum(axis=2)  # [B,S,T]
    out = np.full((b, s, topk), -1, dtype=np.int32)
    for bi in range(b):
        n_valid = t if lengths is None else int(np.clip(lengths[bi], 0, t))
        for si in range(s):
            limit = min(n_valid, t - s + si + 1) if causal else n_valid
            if limit <= 0:
                continue
            row = scores[bi, si, :limit]
            order = np.argsort(-row, kind="stable")[:topk]  # stable: ties keep the lower index first
            out[bi, si, : len(order)] = np.sort(order)
    return out


def sparse_attention_reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, indices: np.ndarray, *, scale: float
) -> np.ndarray:
    """``[B,S,H,Dv]`` attention over the selected keys, in q's dtype; rows with no valid key are 0.

    A ``v`` without rows (``[B,0,Hkv,Dv]``) means the values are the first Dv channels of the keys.
    """
    q64, k64, v64 = _as_float64(q), _as_float64(k), _as_float64(v)
    b, s, h, _ = q64.shape
    t, hkv, dv = k64.shape[1], k64.shape[2], v64.shape[3]
    if v64.shape[1] == 0 and t > 0:
        if dv > k64.shape[3]:
            raise ValueError(f"values from keys need Dv <= Dk, got Dv {dv} and Dk {k64.shape[3]}.")
        v64 = k64[..., :dv]
    group = h // hkv
    out = np.zeros((b, s, h, dv), dtype=np.float64)
    for bi in range(b):
        for si in range(s):
            sel = [int(i) for i in indices[bi, si] if 0 <= int(i) < t]
            if not sel:
                continue
            for hi in range(h):
                g = hi // group
                logits = k64[bi, sel, g] @ q64[bi, si, hi] * scale
                p = np.exp(logits - logits.max())
                out[bi, si, hi] = (p / p.sum()) @ v64[bi, sel, g]
    return out.astype(np.asarray(q).dtype)


def block_sparse_attention_reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, block_index: np.ndarray, *, block_size: int, scale: float,
    causal: bool = True,
) -> np.ndarray:
    """``[B,S,H,Dv]`` attention over the keys of the listed key blocks, in q's dtype.

    The allowed keys of query s and head h are the union of the blocks listed for its query block
    ``s // block_size`` (ids outside ``[0, ceil(T/bs))`` ignored, a repeated id counted once), cut to
    ``t <= T - S + s`` when causal. A row with no allowed key is 0.
    """
    q64, k64, v64 = _as_float64(q), _as_float64(k), _as_float64(v)
    b, s, h, _ = q64.shape
    t, hkv, dv = k64.shape[1], k64.shape[2], v64.shape[3]
    bs = int(block_size)
    n_key_blocks = -(-t // bs)
    group = h // hkv
    out = np.zeros((b, s, h, dv), dtype=np.float64)
    for bi in range(b):
        for hi in range(h):
            g = hi // group
            for si in range(s):
                blocks = {int(j) for j in block_index[bi, hi, si // bs] if 0 <= int(j) < n_key_blocks}
                keys = sorted(key for j in blocks for key in range(j * bs, min(t, j * bs + bs))
                              if not causal or key <= t - s + si)
                if not keys:
                    continue
                logits = k64[bi, keys, g] @ q64[bi, si, hi] * scale
                p = np.exp(logits - logits.max())
                out[bi, si, hi] = (p / p.sum()) @ v64[bi, keys, g]
    return out.astype(np.asarray(q).dtype)


def paged_keys_reference(pool: np.ndarray, block_table: np.ndarray, row: int) -> tuple[np.ndarray, np.ndarray]:
    """The logical keys ``[M*page, ...]`` of batch row ``row`` read through its block table, and
    their bool validity (False where the page entry lies outside ``[0, P)``; those keys are zeros)."""
    n_pages, page = pool.shape[0], pool.shape[1]
    entries = [int(p) for p in block_table[row]]
    keys = np.zeros((len(entries) * page, *pool.shape[2:]), dtype=pool.dtype)
    ok = np.zeros(len(entries) * page, dtype=bool)
    for j, p in enumerate(entries):
        if 0 <= p < n_pages:
            keys[j * page:(j + 1) * page] = pool[p]
            ok[j * page:(j + 1) * page] = True
    return keys, ok


def indexer_topk_paged_reference(
    q: np.ndarray,
    k_pool: np.ndarray,
    w: np.ndarray,
    block_table: np.ndarray,
    query_start: np.ndarray,
    lengths: np.ndarray,
    *,
    topk: int,
    scale: float,
    causal: bool = True,
) -> np.ndarray:
    """int32 ``[B,S,topk]`` selected logical key positions of the paged indexer, ties toward the
    lower position, -1 padded."""
    q64, k64, w64 = _as_float64(q), _as_float64(k_pool), _as_float64(w)
    b, s, _, _ = q64.shape
    out = np.full((b, s, topk), -1, dtype=np.int32)
    for bi in range(b):
        keys, ok = paged_keys_reference(k64, block_table, bi)
        logits = np.einsum("shd,td->sht", q64[bi], keys) * scale
        scores = (np.maximum(logits, 0.0) * w64[bi][..., None]).sum(axis=1)  # [S, M*page]
        for si in range(s):
            position = int(query_start[bi]) + si
            allowed = [t for t in range(keys.shape[0])
                       if ok[t] and t < int(lengths[bi]) and (not causal or t <= position)]
            if not allowed:
                continue
            row = scores[si, allowed]
            order = np.argsort(-row, kind="stable")[:topk]  # stable: ties keep the lower position first
            out[bi, si, : len(order)] = np.sort(np.asarray(allowed)[order])
    return out


def sparse_attention_paged_reference(
    q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, indices: np.ndarray, block_table: np.ndarray, *,
    scale: float,
) -> np.ndarray:
    """``[B,S,H,Dv]`` attention over the selected logical keys of the paged caches, in q's dtype.

    A ``v_pool`` without pages (``[0,page,Hkv,Dv]``) means the values are the first Dv channels of the keys."""
    q64, k64, v64 = _as_float64(q), _as_float64(k_pool), _as_float64(v_pool)
    b, s, h, _ = q64.shape
    hkv, dv = k64.shape[2], v64.shape[3]
    if v64.shape[0] == 0:
        if dv > k64.shape[3]:
            raise ValueError(f"values from keys need Dv <= Dk, got Dv {dv} and Dk {k64.shape[3]}.")
        v64 = k64[..., :dv]
    group = h // hkv
    out = np.zeros((b, s, h, dv), dtype=np.float64)
    for bi in range(b):
        keys, ok = paged_keys_reference(k64, block_table, bi)
        values, _ = paged_keys_reference(v64, block_table, bi)
        for si in range(s):
            sel = [int(i) for i in indices[bi, si] if 0 <= int(i) < keys.shape[0] and ok[int(i)]]
            if not sel:
                continue
            for hi in range(h):
                g = hi // group
                logits = keys[sel, g] @ q64[bi, si, hi] * scale
                p = np.exp(logits - logits.max())
                out[bi, si, hi] = (p / p.sum()) @ values[sel, g]
    return out.astype(np.asarray(q).dtype)


def decode_fp8_reference(codes: np.ndarray) -> np.ndarray:
    """float32 values of uint8 float8 e4m3fn bit patterns (0x7F and 0xFF are NaN), via ml_dtypes."""
    import ml_dtypes

    return np.asarray(codes, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def indexer_topk_paged_fp8_reference(
    q: np.ndarray,
    k_pool: np.ndarray,
    k_scale_pool: np.ndarray,
    w: np.ndarray,
    block_table: np.ndarray,
    query_start: np.ndarray,
    lengths: np.ndarray,
    *,
    topk: int,
    scale: float,
    causal: bool = True,
) -> np.ndarray:
    """:func:`indexer_topk_paged_reference` of the decoded keys, float32(decode(code) * scale)."""
    keys = decode_fp8_reference(k_pool) * np.asarray(k_scale_pool, np.float32)
    return indexer_topk_paged_reference(q, keys, w, block_table, query_start, lengths, topk=topk, scale=scale,
                                        causal=causal)


def fp8_latent_pool_reference(k_pool: np.ndarray, k_scale_pool: np.ndarray, k_rope_pool: np.ndarray,
                              block_size: int) -> np.ndarray:
    """float32 ``[P,page,Hkv,C+R]`` key rows of an FP8 latent cache: the decoded codes, each times
    the scale of its ``block_size`` channels, then the RoPE channels."""
    codes = decode_fp8_reference(k_pool)
    c = codes.shape[-1]
    if c % int(block_size):
        raise ValueError(f"C={c} is not a multiple of block_size={block_size}.")
    scales = np.repeat(np.asarray(k_scale_pool, np.float32), int(block_size), axis=-1)
    return np.concatenate([codes * scales, np.asarray(k_rope_pool).astype(np.float32)], axis=-1)


def sparse_attention_paged_fp8_reference(
    q: np.ndarray, k_pool: np.ndarray, k_scale_pool: np.ndarray, k_rope_pool: np.ndarray, indices: np.ndarray,
    block_table: np.ndarray, *, scale: float, block_size: int = 128,
) -> np.ndarray:
    """:func:`sparse_attention_paged_reference` of the decoded latent rows (``C+R`` wide), values
    their first C channels: ``[B,S,H,C]`` in q's dtype."""
    keys = fp8_latent_pool_reference(k_pool, k_scale_pool, k_rope_pool, block_size)
    no_values = np.zeros((0, *k_pool.shape[1:]), np.float32)
    return sparse_attention_paged_reference(q, keys, no_values, indices, block_table, scale=scale)


def dequantize_fp8_reference(weight: np.ndarray, scale: np.ndarray, block_size: int) -> np.ndarray:
    """float64 ``[..., R, C]``: each FP8 value times the scale of its ``block_size`` block."""
    w64 = _as_float64(weight)
    rows, cols = w64.shape[-2:]
    full = np.repeat(np.repeat(np.asarray(scale, np.float64), block_size, axis=-2)[..., :rows, :], block_size, axis=-1)
    return w64 * full[..., :cols]


def moe_experts_reference(
    x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray, gate_up: np.ndarray, down: np.ndarray,
    *, activation: str = "silu",
) -> np.ndarray:
    """``[N,H]`` in x's dtype: the contract's sum over routing slots, slot by slot, in float64."""
    check_activation(activation)
    x64, w64, gu, dn = _as_float64(x), _as_float64(topk_weights), _as_float64(gate_up), _as_float64(down)
    n_experts, inter = gu.shape[0], dn.shape[2]
    out = np.zeros(x64.shape, dtype=np.float64)
    for token in range(x64.shape[0]):
        for slot in range(topk_ids.shape[1]):
            e = int(topk_ids[token, slot])
            if not 0 <= e < n_experts:
                continue
            proj = gu[e] @ x64[token]
            gate, up = proj[:inter], proj[inter:]
            out[token] += w64[token, slot] * (dn[e] @ (gate / (1.0 + np.exp(-gate)) * up))
    return out.astype(np.asarray(x).dtype)


def moe_experts_fp8_reference(
    x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray, gate_up: np.ndarray, down: np.ndarray,
    gate_up_scale: np.ndarray, down_scale: np.ndarray, *, block_size: int = 128, activation: str = "silu",
) -> np.ndarray:
    """:func:`moe_experts_reference` of the block-dequantized FP8 weights."""
    return moe_experts_reference(x, topk_ids, topk_weights,
                                 dequantize_fp8_reference(gate_up, gate_up_scale, block_size),
                                 dequantize_fp8_reference(down, down_scale, block_size), activation=activation)


class DSAIndexerTopK(OpRun):
    op_domain = DOMAIN

    def _run(self, q, k, w, lengths=None, topk=None, scale=None, causal=1, plugin_namespace=None,
             plugin_version=None):
        return (indexer_topk_reference(q, k, w, lengths, topk=int(topk), scale=float(scale), causal=bool(causal)),)


class DSASparseAttention(OpRun):
    op_domain = DOMAIN

    def _run(self, q, k, v, indices, scale=None, plugin_namespace=None, plugin_version=None):
        return (sparse_attention_reference(q, k, v, indices, scale=float(scale)),)


class DSABlockSparseAttention(OpRun):
    op_domain = DOMAIN

    def _run(self, q, k, v, block_index, block_size=None, scale=None, causal=1, plugin_namespace=None,
             plugin_version=None):
        return (block_sparse_attention_reference(q, k, v, block_index, block_size=int(block_size),
                                                 scale=float(scale), causal=bool(causal)),)


class DSAIndexerTopKPaged(OpRun):
    op_domain = DOMAIN

    def _run(self, q, k_pool, w, block_table, query_start, lengths, topk=None, scale=None, causal=1,
             plugin_namespace=None, plugin_version=None):
        return (indexer_topk_paged_reference(q, k_pool, w, block_table, query_start, lengths, topk=int(topk),
                                             scale=float(scale), causal=bool(causal)),)


class DSASparseAttentionPaged(OpRun):
    op_domain = DOMAIN

    def _run(self, q, k_pool, v_pool, indices, block_table, scale=None, plugin_namespace=None, plugin_version=None):
        return (sparse_attention_paged_reference(q, k_pool, v_pool, indices, block_table, scale=float(scale)),)


class DSAIndexerTopKPagedFP8(OpRun):
    op_domain = DOMAIN

    def _run(self, q, k_pool, k_scale_pool, w, block_table, query_start, lengths, topk=None, scale=None, causal=1,
             plugin_namespace=None, plugin_version=None):
        return (indexer_topk_paged_fp8_reference(q, k_pool, k_scale_pool, w, block_table, query_start, lengths,
                                                 topk=int(topk), scale=float(scale), causal=bool(causal)),)


class DSASparseAttentionPagedFP8(OpRun):
    op_domain = DOMAIN

    def _run(self, q, k_pool, k_scale_pool, k_rope_pool, indices, block_table, scale=None, block_size=128,
             plugin_namespace=None, plugin_version=None):
        return (sparse_attention_paged_fp8_reference(q, k_pool, k_scale_pool, k_rope_pool, indices, block_table,
                                                     scale=float(scale), block_size=int(block_size)),)


class DSAMoEExperts(OpRun):
    op_domain = DOMAIN

    def _run(self, x, topk_ids, topk_weights, gate_up, down, activation="silu", plugin_namespace=None,
             plugin_version=None):
        return (moe_experts_reference(x, topk_ids, topk_weights, gate_up, down, activation=activation),)


class DSAMoEExpertsFP8(OpRun):
    op_domain = DOMAIN

    def _run(self, x, topk_ids, topk_weights, gate_up, down, gate_up_scale, down_scale, activation="silu",
             block_size=128, plugin_namespace=None, plugin_version=None):
        return (moe_experts_fp8_reference(x, topk_ids, topk_weights, gate_up, down, gate_up_scale, down_scale,
                                          block_size=int(block_size), activation=activation),)


class Loop(_OnnxLoop):
    """``onnx.reference``'s Loop, reading an omitted ``cond`` input as True.

    The function bodies' Loops have a trip count and no ``cond`` (the ONNX spec's "for loop" form,
    the one TensorRT's parser asks for; see :meth:`dsa_export.ops.onnx_graph.Body.true`). onnx
    1.23's reference Loop runs ``while cond and ...`` and so runs no iteration when ``cond`` is
    omitted; ONNX Runtime and TensorRT run the trip count.
    """

    op_domain = ""

    def _run(self, M, cond, *args, **kwargs):
        return super()._run(M, np.array(True) if cond is None else cond, *args, **kwargs)


#: What ``ReferenceEvaluator(model, new_ops=BODY_OPS)`` needs to run the dsa function bodies
#: (inlined: ``onnx.reference`` gives ``new_ops`` to subgraphs but not to local functions).
BODY_OPS = [Loop]
_DSA_REFERENCE_OPS = [DSAIndexerTopK, DSASparseAttention, DSABlockSparseAttention, DSAMoEExperts, DSAMoEExpertsFP8,
                      DSAIndexerTopKPaged, DSASparseAttentionPaged, DSAIndexerTopKPagedFP8,
                      DSASparseAttentionPagedFP8]
#: OpRun classes for ``ReferenceEvaluator(model, new_ops=REFERENCE_OPS)``: the dsa nodes run as
#: these references, and a graph's own Loops (a native file's inlined bodies) run too.
REFERENCE_OPS = [*_DSA_REFERENCE_OPS, *BODY_OPS]
#: The dsa references keyed by op name.
REFERENCE_BY_NAME = {cls.__name__: cls for cls in _DSA_REFERENCE_OPS}
