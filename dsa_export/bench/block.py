"""The layer that is timed: one attention block with DSA (indexer + top-k + sparse attention) or with
dense causal attention, sharing every weight (see :class:`~dsa_export.bench.settings.BlockConfig`)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dsa_export.bench.settings import BlockConfig
from dsa_export.ops import dsa_indexer_topk, dsa_sparse_attention

IndexerFn = Callable[..., torch.Tensor]
AttentionFn = Callable[..., torch.Tensor]


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
    """Dense causal attention of ``[B,S,H,D]`` tensors (k/v already repeated to every query head)."""
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale
    ).transpose(1, 2)


class AttentionBlock(nn.Module):
    """``x [B,L,hidden] -> [B,L,hidden]``; ``variant`` is ``dsa`` or ``dense``.

    The DSA variant calls :func:`dsa_export.ops.dsa_indexer_topk` and
    :func:`dsa_export.ops.dsa_sparse_attention` (so it exports to ``dsa`` nodes); another backend
    may swap those two functions for its own kernels with the same contract. The dense variant's
    attention is ``dense_attention_fn`` (SDPA), swappable the same way (the torch backend times it).
    """

    def __init__(self, cfg: BlockConfig, variant: str):
        super().__init__()
        if variant not in ("dsa", "dense"):
            raise ValueError(f"variant must be 'dsa' or 'dense', not {variant!r}.")
        self.cfg, self.variant = cfg, variant
        width, kv_width = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        generator = torch.Generator().manual_seed(cfg.seed)

        def linear(n_in: int, n_out: int) -> nn.Linear:
            layer = nn.Linear(n_in, n_out, bias=False)
            with torch.no_grad():
                layer.weight.copy_(torch.randn(n_out, n_in, generator=generator) * n_in**-0.5)
            return layer

        # Created in the same order for both variants, so both hold the same q/k/v/o weights.
        self.qkv_proj = linear(cfg.hidden, width + 2 * kv_width)
        self.o_proj = linear(width, cfg.hidden)
        if variant == "dsa":
            self.index_q = linear(cfg.hidden, cfg.index_heads * cfg.index_head_dim)
            self.index_k = linear(cfg.hidden, cfg.index_head_dim)
            self.index_k_norm = nn.LayerNorm(cfg.index_head_dim)
            self.index_w = linear(cfg.hidden, cfg.index_heads)
        self.indexer_fn: IndexerFn = dsa_indexer_topk
        self.attention_fn: AttentionFn = dsa_sparse_attention
        self.dense_attention_fn: AttentionFn = causal_sdpa

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """int32 ``[B,L,topk]``: the keys each query attends to (-1 padded)."""
        cfg, (b, s, _) = self.cfg, x.shape
        q = self.index_q(x).view(b, s, cfg.index_heads, cfg.index_head_dim)
        k = self.index_k_norm(self.index_k(x))
        w = self.index_w(x) * cfg.index_heads**-0.5
        return self.indexer_fn(q, k, w, topk=cfg.topk, scale=cfg.index_head_dim**-0.5, causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg, (b, s, _) = self.cfg, x.shape
        q, k, v = self.qkv_proj(x).split(
            [cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim], dim=-1
        )
        q = q.reshape(b, s, cfg.heads, cfg.head_dim)
        k = k.reshape(b, s, cfg.kv_heads, cfg.head_dim)
        v = v.reshape(b, s, cfg.kv_heads, cfg.head_dim)
        scale = cfg.head_dim**-0.5
        if self.variant == "dsa":
            out = self.attention_fn(q, k, v, self.select(x), scale=scale)
        else:
            # Every query head of a group reads its kv head (O(L) copies, small next to attention).
            group = cfg.heads // cfg.kv_heads
            k = k.repeat_interleave(group, dim=2) if group > 1 else k
            v = v.repeat_interleave(group, dim=2) if group > 1 else v
            out = self.dense_attention_fn(q, k, v, scale=scale)
        return self.o_proj(out.reshape(b, s, cfg.heads * cfg.head_dim))


def make_blocks(cfg: BlockConfig) -> dict[str, AttentionBlock]:
    """Both variants, in eval mode, with shared q/k/v/o weights."""
    return {variant: AttentionBlock(cfg, variant).eval() for variant in ("dsa", "dense")}


def make_input(cfg: BlockConfig, seq_len: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(cfg.seed + seq_len)
    return torch.randn(cfg.batch, seq_len, cfg.hidden, generator=generator).to(device=device, dtype=dtype)
