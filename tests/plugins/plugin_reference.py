"""Self-contained float64 torch references of the DSA ops, written for readability.

They mirror the op contract (docs/ops.md) in float64, which the fp32 kernel tolerance (1e-5) needs;
tests/plugins/test_reference_cpu.py checks them against plain loops and against
``dsa_export.ops``, so the kernels are held to the same contract as every other implementation.
"""

from __future__ import annotations

import torch


def allowed_keys(B: int, S: int, T: int, lengths: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """n[b, s]: number of keys query s may select (a prefix [0, n) of the keys)."""
    s = torch.arange(S, dtype=torch.int64)
    n = (T - S + s + 1) if causal else torch.full((S,), T, dtype=torch.int64)
    n = n.unsqueeze(0).expand(B, S)
    if lengths is not None:
        n = torch.minimum(n, lengths.to(torch.int64).cpu().unsqueeze(1))
    return n.clamp(min=0, max=T)


def indexer_scores(q, k, w, lengths=None, *, scale: float, causal: bool = True):
    """(scores [B,S,T] float64 with disallowed keys at -inf, n [B,S])."""
    q64, k64, w64 = q.double().cpu(), k.double().cpu(), w.double().cpu()
    B, S, H, D = q64.shape
    T = k64.shape[1]
    logits = torch.einsum("bshd,btd->bsht", q64, k64) * scale
    scores = (torch.relu(logits) * w64.unsqueeze(-1)).sum(dim=2)
    n = allowed_keys(B, S, T, lengths, causal)
    mask = torch.arange(T).view(1, 1, T) < n.unsqueeze(-1)
    return scores.masked_fill(~mask, float("-inf")), n


def indexer_topk(q, k, w, lengths=None, *, topk: int, scale: float, causal: bool = True) -> torch.Tensor:
    """Indices [B,S,topk] int32, ties toward the lower key index, -1 past the allowed keys."""
    scores, n = indexer_scores(q, k, w, lengths, scale=scale, causal=causal)
    B, S, T = scores.shape
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # stable: lower index first on ties
    out = torch.full((B, S, topk), -1, dtype=torch.int32)
    width = min(topk, T)
    out[..., :width] = order[..., :width].to(torch.int32)
    slot = torch.arange(topk).view(1, 1, topk)
    return out.masked_fill(slot >= n.unsqueeze(-1), -1)


def sparse_attention(q, k, v, indices, *, scale: float) -> torch.Tensor:
    """out [B,S,H,Dv] float64: softmax over the valid selected keys of each (b, s), shared by all heads.

    An empty v ``[B,0,Hkv,Dv]`` takes the values from the first Dv channels of the keys (Dv <= Dk).
    """
    q64, k64, v64 = q.double().cpu(), k.double().cpu(), v.double().cpu()
    idx = indices.to(torch.int64).cpu()
    B, S, H, Dk = q64.shape
    T, Hkv = k64.shape[1], k64.shape[2]
    if v64.shape[1] == 0 and T > 0:
        assert v64.shape[3] <= Dk, f"values from keys need Dv <= Dk, got {v64.shape[3]} > {Dk}"
        v64 = k64[..., : v64.shape[3]]
    group = H // Hkv
    valid = (idx >= 0) & (idx < T)                       # [B,S,K]
    safe = idx.clamp(0, max(T - 1, 0))
    batch = torch.arange(B).view(B, 1, 1)
    if T == 0:
        return torch.zeros(B, S, H, v64.shape[-1], dtype=torch.float64)
    kg = k64[batch, safe]                                # [B,S,K,Hkv,Dk]
    vg = v64[batch, safe]                                # [B,S,K,Hkv,Dv]
    qg = q64.view(B, S, Hkv, group, Dk)                  # head h uses kv head h // group
    logits = torch.einsum("bsgmd,bskgd->bsgmk", qg, kg) * scale
    logits = logits.masked_fill(~valid.view(B, S, 1, 1, -1), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)             # rows without a valid index -> 0
    out = torch.einsum("bsgmk,bskgd->bsgmd", probs, vg)
    return out.reshape(B, S, H, v64.shape[-1])


def dequantize_blocks(weight: torch.Tensor, scale: torch.Tensor, block_size: int) -> torch.Tensor:
    """float64 ``[..., R, C]``: each FP8 value times the float32 scale of its ``block_size`` square block."""
    rows, cols = weight.shape[-2], weight.shape[-1]
    full = scale.double().repeat_interleave(block_size, dim=-2)[..., :rows, :]
    full = full.repeat_interleave(block_size, dim=-1)[..., :cols]
    return weight.double() * full


def moe_experts(x, topk_ids, topk_weights, gate_up, down, gate_up_scale=None, down_scale=None, *,
                block_size: int = 128) -> torch.Tensor:
    """out [N,H] float64 on x's device, from the contract formula.

    out[n] = sum_k w[n,k] * down[e] @ (silu(gate[e] @ x[n]) * (up[e] @ x[n])), e = topk_ids[n,k],
    gate/up = rows [0, I) / [I, 2I) of gate_up[e]; slots with e outside [0, E) are skipped and a
    repeated expert counts once per slot. FP8 experts are dequantized with their block scales.
    Computed one expert at a time over the slots routed to it (no per-token weight gather, and
    only one expert's weights in float64 at once).
    """
    x64, w64 = x.double(), topk_weights.double()
    ids = topk_ids.long()
    E, I = down.shape[0], down.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    valid = (ids >= 0) & (ids < E)
    for e in torch.unique(ids[valid]).tolist():
        if gate_up_scale is not None:
            gu = dequantize_blocks(gate_up[e], gate_up_scale[e], block_size)
            dn = dequantize_blocks(down[e], down_scale[e], block_size)
        else:
            gu, dn = gate_up[e].double(), down[e].double()
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        h = x64[tok] @ gu.t()                                   # [n_e, 2I]
        act = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
        out.index_add_(0, tok, w64[tok, slot].unsqueeze(1) * (act @ dn.t()))
    return out


def _quantize_matrix(weight: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = weight.shape
    rb, cb = -(-rows // block_size), -(-cols // block_size)
    padded = torch.zeros(rb * block_size, cb * block_size, dtype=torch.float32, device=weight.device)
    padded[:rows, :cols] = weight.float()
    amax = padded.view(rb, block_size, cb, block_size).abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = (amax / 448.0).float()
    full = scale.repeat_interleave(block_size, dim=0)[:rows].repeat_interleave(block_size, dim=1)[:, :cols]
    return (weight.float() / full).to(torch.float8_e4m3fn), scale


def quantize_blocks(weight: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn weight, float32 scales [..., ceil(R/bs), ceil(C/bs)]) with scale = amax(block) / 448,
    as DeepSeek's checkpoints store them; one matrix at a time to bound memory."""
    if weight.dim() == 2:
        return _quantize_matrix(weight, block_size)
    pairs = [quantize_blocks(w, block_size) for w in weight]
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])


def sparse_attention_paged(q, k_pool, v_pool, indices, block_table, *, scale: float) -> torch.Tensor:
    """out [B,S,H,Dv] float64 of DSASparseAttentionPaged: dsa_export.ops.reference's NumPy reference
    fed float64 queries (so it answers in float64). ``v_pool`` None or without pages: values from keys
    (pass one without pages, ``[0,page,Hkv,Dv]``, to give Dv)."""
    from dsa_export.ops.reference import sparse_attention_paged_reference

    out = sparse_attention_paged_reference(q.double().cpu().numpy(), k_pool.double().cpu().numpy(),
                                           v_pool.double().cpu().numpy(), indices.cpu().numpy(),
                                           block_table.cpu().numpy(), scale=scale)
    return torch.from_numpy(out)


def sparse_attention_paged_fp8(q, k_pool, k_scale_pool, k_rope_pool, indices, block_table, *, scale: float,
                               block_size: int = 128) -> torch.Tensor:
    """out [B,S,H,C] float64 of DSASparseAttentionPagedFP8 (the decoded rows are float32, as in the contract)."""
    from dsa_export.ops.reference import sparse_attention_paged_fp8_reference

    out = sparse_attention_paged_fp8_reference(
        q.double().cpu().numpy(), k_pool.cpu().numpy(), k_scale_pool.float().cpu().numpy(),
        k_rope_pool.float().cpu().numpy(), indices.cpu().numpy(), block_table.cpu().numpy(), scale=scale,
        block_size=block_size)
    return torch.from_numpy(out)
