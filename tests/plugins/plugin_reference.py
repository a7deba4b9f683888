"""Self-contained float64 torch references of the two DSA ops, written for readability.

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
    """out [B,S,H,Dv] float64: softmax over the valid selected keys of each (b, s), shared by all heads."""
    q64, k64, v64 = q.double().cpu(), k.double().cpu(), v.double().cpu()
    idx = indices.to(torch.int64).cpu()
    B, S, H, Dk = q64.shape
    T, Hkv = k64.shape[1], k64.shape[2]
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
