"""torch.library custom ops ``dsa::indexer_topk``, ``dsa::sparse_attention``, ``dsa::moe_experts``
and ``dsa::moe_experts_fp8``.

The implementations are plain torch (they run on any device) and are both the reference of the
contract and the CPU deployment path, so they are written for speed as well as clarity: queries
are processed in chunks that bound memory, and the selected key/value rows are gathered once per
kv head and reused by every query head of that group. The routed experts sort the routing slots
by expert and run one GEMM pair per active expert over exactly its tokens (FP8 weights are
dequantized one expert at a time). The fake (meta) kernels give the exporter output shapes with
symbolic batch and sequence dims.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dsa_export.ops.contract import DOMAIN, MOE_ACTIVATIONS

# Bytes of float32 scratch one chunk of queries may use; keeps long sequences within cache-friendly
# working sets on CPU and bounded on GPU.
_CHUNK_BYTES = 64 << 20


def _chunk_rows(total: int, bytes_per_row: int) -> int:
    return max(1, min(total, _CHUNK_BYTES // max(1, bytes_per_row)))


def allowed_keys(
    batch: int, s: int, t: int, *, causal: bool, lengths: torch.Tensor | None, device, row_start: int = 0,
    rows: int | None = None,
) -> torch.Tensor:
    """Boolean ``[B or 1, rows, T]`` mask of the keys that queries ``row_start..`` may select."""
    rows = s - row_start if rows is None else rows
    key_pos = torch.arange(t, device=device)
    mask = torch.ones(1, rows, t, dtype=torch.bool, device=device)
    if causal:
        query_pos = torch.arange(row_start, row_start + rows, device=device) + (t - s)
        mask = mask & (key_pos[None, None, :] <= query_pos[None, :, None])
    if lengths is not None:
        valid = key_pos[None, :] < lengths.to(device=device, dtype=torch.int64)[:, None]  # [B,T]
        mask = mask & valid[:, None, :]
    return mask


def _select_topk(scores: torch.Tensor, allowed: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-``topk`` allowed positions per row of ``scores`` ``[..., T]``, ties to the lower index.

    Returns int32 ``[..., topk]`` in ascending key order, -1 padded. torch.topk does not order
    ties, so when a row holds more keys equal to its k-th value than fit, the tied keys are taken
    in index order (what ONNX TopK and the op contract specify). Rows without such a tie take
    torch.topk's answer directly, which is the common case and costs only a few passes.
    """
    t = scores.shape[-1]
    kk = min(topk, t)
    out_shape = (*scores.shape[:-1], topk)
    if kk == 0:
        return torch.full(out_shape, -1, dtype=torch.int32, device=scores.device)
    neg_inf = torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device)
    masked = torch.where(allowed, scores, neg_inf)
    values, positions = masked.topk(kk, dim=-1, sorted=True)
    threshold = values[..., -1:]
    # A row is ambiguous when keys equal to its (finite) k-th value were left out of the top-k.
    # With an infinite k-th value the row has fewer allowed keys than k, and all of them are in.
    ambiguous = ((masked == threshold).sum(-1, keepdim=True) != (values == threshold).sum(-1, keepdim=True)) & (
        threshold > neg_inf
    )
    positions = torch.where(values > neg_inf, positions, t)  # disallowed picks become t for now
    rows = ambiguous.reshape(-1).nonzero().squeeze(1)
    if rows.numel():
        # Redo only the ambiguous rows, taking tied keys in index order.
        flat_masked = masked.reshape(-1, t)[rows]
        row_threshold = threshold.reshape(-1, 1)[rows]
        above = flat_masked > row_threshold
        tied = flat_masked == row_threshold
        room = kk - above.sum(-1, keepdim=True)
        chosen = above | (tied & (tied.cumsum(-1) <= room))
        slot = torch.where(chosen, chosen.cumsum(-1) - 1, torch.full_like(flat_masked, kk, dtype=torch.int64))
        fixed = torch.full((rows.numel(), kk + 1), t, dtype=torch.int64, device=scores.device)
        fixed.scatter_(-1, slot, torch.arange(t, device=scores.device).expand_as(slot))
        positions = positions.reshape(-1, kk).index_copy(0, rows, fixed[:, :kk]).reshape(positions.shape)
    positions = positions.sort(dim=-1).values
    positions = torch.where(positions < t, positions, -1)
    if kk < topk:
        positions = torch.cat((positions, positions.new_full((*scores.shape[:-1], topk - kk), -1)), -1)
    return positions.to(torch.int32)


def indexer_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 ``[B,S,T]`` index scores ``sum_h w * ReLU(scale * q_h . k)``.

    One ``[S,D] @ [D,T]`` product per head accumulated into the output in place: the ``[S,T]``
    working set stays cache-sized, where a single ``[S*H,D] @ [D,T]`` product followed by the
    head reduction streams ``H`` times more memory (measured 2x slower on CPU at S = T = 2048).
    """
    b, s, h, _ = q.shape
    qs = (q.float() * scale).transpose(1, 2).contiguous()  # [B,H,S,D]: one contiguous block per head
    kt = k.float().transpose(1, 2).contiguous()  # [B,D,T], laid out once instead of per product
    wf = w.float()
    out = torch.zeros(b, s, k.shape[1], dtype=torch.float32, device=q.device)
    for head in range(h):
        out.addcmul_(torch.matmul(qs[:, head], kt).clamp_min_(0.0), wf[:, :, head, None])
    return out


@torch.library.custom_op(f"{DOMAIN}::indexer_topk", mutates_args=())
def indexer_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    lengths: torch.Tensor | None,
    topk: int,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    b, s, h, _ = q.shape
    t = k.shape[1]
    out = torch.empty(b, s, topk, dtype=torch.int32, device=q.device)
    rows = _chunk_rows(s, b * t * 6 * 4)  # scores, one head's logits, masks
    for start in range(0, s, rows):
        stop = min(s, start + rows)
        scores = indexer_scores(q[:, start:stop], k, w[:, start:stop], scale)
        allowed = allowed_keys(b, s, t, causal=causal, lengths=lengths, device=q.device, row_start=start,
                               rows=stop - start).expand(b, -1, -1)
        out[:, start:stop] = _select_topk(scores, allowed, topk)
    return out


@indexer_topk.register_fake
def _indexer_topk_fake(q, k, w, lengths, topk, scale, causal):
    return q.new_empty((q.shape[0], q.shape[1], topk), dtype=torch.int32)


@torch.library.custom_op(f"{DOMAIN}::sparse_attention", mutates_args=())
def sparse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, scale: float
) -> torch.Tensor:
    b, s, h, dk = q.shape
    t, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    n_sel = indices.shape[2]
    group = h // hkv
    out = torch.empty(b, s, h, dv, dtype=q.dtype, device=q.device)
    # Rows of all kv heads of a token, flattened so one index_select fetches a selected token.
    k_rows = k.float().reshape(b * t, hkv * dk)
    v_rows = v.float().reshape(b * t, hkv * dv)
    batch_offset = (torch.arange(b, device=q.device) * t).view(b, 1, 1)
    rows = _chunk_rows(s, b * n_sel * (hkv * (dk + dv) + 2 * h) * 4)
    for start in range(0, s, rows):
        stop = min(s, start + rows)
        c = stop - start
        idx = indices[:, start:stop].long()
        valid = (idx >= 0) & (idx < t)  # [B,c,K]
        flat = (torch.where(valid, idx, 0) + batch_offset).reshape(-1)
        # Each selected token is read once and serves every query head of every group.
        k_sel = k_rows.index_select(0, flat).view(b, c, n_sel, hkv, dk).transpose(2, 3)  # [B,c,Hkv,K,Dk]
        v_sel = v_rows.index_select(0, flat).view(b, c, n_sel, hkv, dv).transpose(2, 3)  # [B,c,Hkv,K,Dv]
        qg = q[:, start:stop].float().reshape(b, c, hkv, group, dk)
        logits = torch.matmul(k_sel, qg.transpose(-1, -2)).transpose(-1, -2) * scale  # [B,c,Hkv,G,K]
        logits = logits.masked_fill(~valid[:, :, None, None, :], float("-inf"))
        probs = torch.softmax(logits, dim=-1).nan_to_num_(0.0)  # rows without a valid key -> 0
        res = torch.matmul(probs, v_sel)  # [B,c,Hkv,G,Dv]
        out[:, start:stop] = res.reshape(b, c, h, dv).to(q.dtype)
    return out


@sparse_attention.register_fake
def _sparse_attention_fake(q, k, v, indices, scale):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


def _check_activation(activation: str) -> None:
    if activation not in MOE_ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not supported; use one of {MOE_ACTIVATIONS}.")


def routed_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    n_experts: int,
    expert_weights: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """The routed-experts sum with ``expert_weights(e) -> (gate_up [2I,H], down [H,I])`` in float32.

    The slots are sorted by expert once (a stable argsort; skipped slots sort last) so each active
    expert sees exactly its tokens, in one GEMM pair per chunk of rows: memory is the float32
    output plus one chunk's ``[rows, 2I]`` activations and one expert's weights.
    """
    n, hidden = x.shape
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    key = torch.where((flat >= 0) & (flat < n_experts), flat, n_experts)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=n_experts + 1).tolist()
    tokens = order // k
    slot_weight = topk_weights.reshape(-1).float().index_select(0, order)
    out = torch.zeros(n, hidden, dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts[:n_experts]):
        if count == 0:
            continue
        gate_up, down = expert_weights(expert)
        inter = down.shape[1]
        rows = _chunk_rows(count, (2 * inter + hidden) * 4)
        for lo in range(start, start + count, rows):
            hi = min(start + count, lo + rows)
            token = tokens[lo:hi]
            proj = torch.matmul(x.index_select(0, token).float(), gate_up.t())  # [rows, 2I]
            gate, up = proj[:, :inter], proj[:, inter:]
            hidden_states = torch.nn.functional.silu(gate, inplace=True).mul_(up)
            y = torch.matmul(hidden_states, down.t()).mul_(slot_weight[lo:hi, None])
            out.index_add_(0, token, y)
        start += count
    return out.to(x.dtype)


@torch.library.custom_op(f"{DOMAIN}::moe_experts", mutates_args=())
def moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    _check_activation(activation)
    return routed_experts(x, topk_ids, topk_weights, gate_up.shape[0],
                          lambda e: (gate_up[e].float(), down[e].float()))


@moe_experts.register_fake
def _moe_experts_fake(x, topk_ids, topk_weights, gate_up, down, activation="silu"):
    return x.new_empty(x.shape)


def dequantize_blocks(weight: torch.Tensor, scale: torch.Tensor, block_size: int) -> torch.Tensor:
    """float32 ``[R, C]``: FP8 ``weight`` times the scale of its ``block_size`` block (partial last blocks)."""
    rows, cols = weight.shape
    if rows % block_size == 0 and cols % block_size == 0:
        # Whole blocks (every DeepSeek/GLM shape): one broadcast multiply, no expanded scale.
        blocks = weight.float().view(rows // block_size, block_size, cols // block_size, block_size)
        return blocks.mul_(scale.float()[:, None, :, None]).view(rows, cols)
    full = scale.float().repeat_interleave(block_size, dim=0)[:rows].repeat_interleave(block_size, dim=1)[:, :cols]
    return weight.float().mul_(full)


@torch.library.custom_op(f"{DOMAIN}::moe_experts_fp8", mutates_args=())
def moe_experts_fp8(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down_scale: torch.Tensor,
    block_size: int = 128,
    activation: str = "silu",
) -> torch.Tensor:
    _check_activation(activation)
    return routed_experts(
        x, topk_ids, topk_weights, gate_up.shape[0],
        lambda e: (dequantize_blocks(gate_up[e], gate_up_scale[e], block_size),
                   dequantize_blocks(down[e], down_scale[e], block_size)),
    )


@moe_experts_fp8.register_fake
def _moe_experts_fp8_fake(x, topk_ids, topk_weights, gate_up, down, gate_up_scale, down_scale, block_size=128,
                          activation="silu"):
    return x.new_empty(x.shape)
