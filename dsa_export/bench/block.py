"""The layer that is timed: one attention block with DSA (indexer + top-k + sparse attention), with
dense causal attention, with block-sparse attention or with LSH bucketed attention, sharing every
weight (see :class:`~dsa_export.bench.settings.BlockConfig`). The block and LSH selections are
those of the built-in ``block`` and ``lsh`` models (:mod:`dsa_export.nn.patterns`)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dsa_export.bench.settings import VARIANTS, BlockConfig
from dsa_export.nn.patterns import block_index_from_logits, block_mean, bucket_selections, lsh_buckets
from dsa_export.ops import dsa_block_sparse_attention, dsa_indexer_topk, dsa_sparse_attention

IndexerFn = Callable[..., torch.Tensor]
AttentionFn = Callable[..., torch.Tensor]
SelectionFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
    """Dense causal attention of ``[B,S,H,D]`` tensors (k/v already repeated to every query head)."""
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale
    ).transpose(1, 2)


class AttentionBlock(nn.Module):
    """``x [B,L,hidden] -> [B,L,hidden]``; ``variant`` is one of :data:`VARIANTS`.

    The DSA variant calls :func:`dsa_export.ops.dsa_indexer_topk` and
    :func:`dsa_export.ops.dsa_sparse_attention` (so it exports to ``dsa`` nodes); another backend
    may swap those two functions for its own kernels with the same contract. The dense variant's
    attention is ``dense_attention_fn`` (SDPA), swappable the same way (the torch backend times it).
    The block variant computes its ``block_index`` with ``selection_fn`` and attends through
    ``block_attention_fn`` (:func:`dsa_export.ops.dsa_block_sparse_attention`); the LSH variant
    computes its per-head ``indices`` with ``selection_fn`` and attends through ``attention_fn``.
    """

    def __init__(self, cfg: BlockConfig, variant: str):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, not {variant!r}.")
        self.cfg, self.variant = cfg, variant
        width, kv_width = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        generator = torch.Generator().manual_seed(cfg.seed)

        def linear(n_in: int, n_out: int) -> nn.Linear:
            layer = nn.Linear(n_in, n_out, bias=False)
            with torch.no_grad():
                layer.weight.copy_(torch.randn(n_out, n_in, generator=generator) * n_in**-0.5)
            return layer

        # Created in the same order for every variant, so all hold the same q/k/v/o weights.
        self.qkv_proj = linear(cfg.hidden, width + 2 * kv_width)
        self.o_proj = linear(width, cfg.hidden)
        if variant == "dsa":
            self.index_q = linear(cfg.hidden, cfg.index_heads * cfg.index_head_dim)
            self.index_k = linear(cfg.hidden, cfg.index_head_dim)
            self.index_k_norm = nn.LayerNorm(cfg.index_head_dim)
            self.index_w = linear(cfg.hidden, cfg.index_heads)
        if variant == "lsh":
            # Fixed random rotations, one set per head (a buffer: exported as a constant).
            rotations = torch.Generator().manual_seed(cfg.seed + 1)
            self.register_buffer("rotations", torch.randn(cfg.heads, cfg.head_dim, cfg.lsh_buckets // 2,
                                                          generator=rotations))
        self.indexer_fn: IndexerFn = dsa_indexer_topk
        self.attention_fn: AttentionFn = dsa_sparse_attention
        self.dense_attention_fn: AttentionFn = causal_sdpa
        self.block_attention_fn: AttentionFn = dsa_block_sparse_attention
        self.selection_fn: SelectionFn = self.select_lsh if variant == "lsh" else self.select_blocks

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """int32 ``[B,L,topk]``: the keys each query attends to (-1 padded)."""
        cfg, (b, s, _) = self.cfg, x.shape
        q = self.index_q(x).view(b, s, cfg.index_heads, cfg.index_head_dim)
        k = self.index_k_norm(self.index_k(x))
        w = self.index_w(x) * cfg.index_heads**-0.5
        return self.indexer_fn(q, k, w, topk=cfg.topk, scale=cfg.index_head_dim**-0.5, causal=True)

    def select_blocks(self, q: torch.Tensor, k: torch.Tensor, block_size: int | None = None,
                      blocks: int | None = None) -> torch.Tensor:
        """int32 ``block_index [B,H,ceil(L/bs),Kb]`` of the block variant (-1 padded): per query head,
        the ``blocks`` key blocks whose mean-pooled keys score highest against the query block's
        mean-pooled queries, the diagonal block first (the built-in ``block`` model's selection).
        ``block_size`` / ``blocks`` default to the config's."""
        cfg = self.cfg
        bs = cfg.block_size if block_size is None else block_size
        kb = cfg.blocks_per_query_block if blocks is None else blocks
        pooled_q, pooled_k = block_mean(q, bs).float(), block_mean(k, bs).float()  # [B,nb,H,D], [B,nb,Hkv,D]
        group = cfg.heads // cfg.kv_heads
        if group > 1:
            pooled_k = pooled_k.repeat_interleave(group, dim=2)
        logits = torch.einsum("bihd,bjhd->bhij", pooled_q, pooled_k) * cfg.head_dim**-0.5
        return block_index_from_logits(logits, kb, gate=False)

    def select_lsh(self, q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """int32 ``[B*H,L,topk]`` of the LSH variant: per head, the ``topk`` latest keys of the
        query's bucket up to it (-1 padded); ``keys`` are the unit-norm queries (shared-QK)."""
        b, s, h, _ = keys.shape
        buckets = lsh_buckets(keys, self.rotations).reshape(b * h, s)
        return bucket_selections(buckets, self.cfg.topk, self.cfg.lsh_buckets)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[B,L,H,D]``, k and v ``[B,L,Hkv,D]`` of ``x``."""
        cfg, (b, s, _) = self.cfg, x.shape
        q, k, v = self.qkv_proj(x).split(
            [cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim], dim=-1
        )
        return (q.reshape(b, s, cfg.heads, cfg.head_dim), k.reshape(b, s, cfg.kv_heads, cfg.head_dim),
                v.reshape(b, s, cfg.kv_heads, cfg.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg, (b, s, _) = self.cfg, x.shape
        q, k, v = self.qkv(x)
        scale = cfg.head_dim**-0.5
        if self.variant == "dsa":
            out = self.attention_fn(q, k, v, self.select(x), scale=scale)
        elif self.variant == "block":
            out = self.block_attention_fn(q, k, v, self.selection_fn(q, k), block_size=cfg.block_size,
                                          scale=scale, causal=True)
        elif self.variant == "lsh":
            # Reformer's shared QK: the keys are the unit-norm queries; the heads are folded into
            # the batch, so that each head has its own selection (as the built-in lsh layer does).
            keys = F.normalize(q, dim=-1)
            indices = self.selection_fn(q, keys)
            v = v.repeat_interleave(cfg.heads // cfg.kv_heads, dim=2) if cfg.kv_heads != cfg.heads else v

            def fold(t: torch.Tensor) -> torch.Tensor:  # [B,S,H,D] -> [B*H,S,1,D]
                return t.transpose(1, 2).reshape(b * cfg.heads, s, 1, t.shape[-1])

            out = self.attention_fn(fold(q), fold(keys), fold(v), indices, scale=scale)
            out = out.view(b, cfg.heads, s, cfg.head_dim).transpose(1, 2)
        else:
            # Every query head of a group reads its kv head (O(L) copies, small next to attention).
            group = cfg.heads // cfg.kv_heads
            k = k.repeat_interleave(group, dim=2) if group > 1 else k
            v = v.repeat_interleave(group, dim=2) if group > 1 else v
            out = self.dense_attention_fn(q, k, v, scale=scale)
        return self.o_proj(out.reshape(b, s, cfg.heads * cfg.head_dim))


def make_blocks(cfg: BlockConfig, variants: tuple[str, ...] = VARIANTS) -> dict[str, AttentionBlock]:
    """The given variants, in eval mode, with shared q/k/v/o weights."""
    return {variant: AttentionBlock(cfg, variant).eval() for variant in variants}


def make_input(cfg: BlockConfig, seq_len: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(cfg.seed + seq_len)
    return torch.randn(cfg.batch, seq_len, cfg.hidden, generator=generator).to(device=device, dtype=dtype)
