"""Building blocks of the reference DSA model: norms, RoPE, the lightning indexer, MLA attention
(MQA and expanded forms), sliding-window attention and the sparse/dense hybrid."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dsa_export.nn.config import DSAModelConfig
from dsa_export.ops import dsa_indexer_topk, dsa_sparse_attention


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(seq_len: int, dim: int, theta: float, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[S, dim/2]`` for positions 0..S-1."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate ``x [B,S,...,d]`` with tables ``[S, d/2]``; ``interleave`` pairs (0,1),(2,3)... else halves."""
    shape = (1, cos.shape[0]) + (1,) * (x.dim() - 3) + (cos.shape[1],)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class LightningIndexer(nn.Module):
    """DSA's indexer: scores every earlier token for each query and keeps the top ``index_topk``."""

    def __init__(self, cfg: DSAModelConfig):
        super().__init__()
        self.n_heads, self.head_dim, self.rope_dim = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        self.topk, self.interleave = cfg.index_topk, cfg.indexer_rope_interleave
        self.wq_b = nn.Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim)
        self.weights_proj = nn.Linear(cfg.hidden_size, self.n_heads, bias=False)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # RoPE on the leading qk_rope_head_dim dims, as DeepSeek-V3.2's indexer does.
        return torch.cat((apply_rope(x[..., : self.rope_dim], cos, sin, self.interleave), x[..., self.rope_dim :]), -1)

    def forward(self, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self._rope(self.wq_b(q_resid).view(b, s, self.n_heads, self.head_dim), cos, sin)
        k = self._rope(self.k_norm(self.wk(x)), cos, sin)
        w = self.weights_proj(x) * self.n_heads**-0.5
        return dsa_indexer_topk(q, k, w, topk=self.topk, scale=self.head_dim**-0.5, causal=True)


class MLAttention(nn.Module):
    """DeepSeek-V3 multi-head latent attention over DSA-selected keys.

    ``mqa`` absorbs the key up-projection into the queries and the value up-projection into the
    output, so attention runs over one shared latent head (Dk = kv_lora_rank + rope, Dv =
    kv_lora_rank); ``expanded`` materializes per-head keys and values. Both compute the same
    function of the same weights.
    """

    def __init__(self, cfg: DSAModelConfig, *, sparse: bool, dense: bool):
        super().__init__()
        self.cfg = cfg
        h = cfg.num_heads
        self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
        self.q_a_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_norm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * cfg.v_head_dim, cfg.hidden_size, bias=False)
        self.indexer = LightningIndexer(cfg) if sparse else None
        self.dense = dense
        # Hybrid layers mix sparse and dense attention with a learned per-head sigmoid gate.
        self.gate = nn.Linear(cfg.hidden_size, h, bias=True) if sparse and dense else None

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        cfg, (b, s, _) = self.cfg, x.shape
        q_resid = self.q_a_norm(self.q_a_proj(x))
        q = self.q_b_proj(q_resid).view(b, s, cfg.num_heads, cfg.qk_head_dim)
        q_nope, q_pe = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        q_pe = apply_rope(q_pe, cos, sin, cfg.mla_rope_interleave)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        c_kv = self.kv_a_norm(c_kv)
        k_pe = apply_rope(k_pe[:, :, None], cos, sin, cfg.mla_rope_interleave)  # [B,T,1,rope]
        w_kv = self.kv_b_proj.weight.view(cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
        w_uk, w_uv = w_kv.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=1)
        if cfg.mla_form == "mqa":
            # Absorb W_UK into the queries: [B,H,S,n] @ [H,n,c] (MatMul, which has bf16 in ONNX).
            q_lat = torch.matmul(q_nope.transpose(1, 2), w_uk).transpose(1, 2)
            q_full = torch.cat((q_lat, q_pe), -1)  # [B,S,H,kv_lora+rope]
            k_full = torch.cat((c_kv[:, :, None], k_pe), -1)  # [B,T,1,kv_lora+rope]
            v_full = None  # the values are the first kv_lora_rank channels of k_full
        else:
            kv = self.kv_b_proj(c_kv).view(b, s, cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim)
            k_nope, v_full = kv.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
            q_full = torch.cat((q_nope, q_pe), -1)
            k_full = torch.cat((k_nope, k_pe.expand(-1, -1, cfg.num_heads, -1)), -1)
        return q_resid, q_full, k_full, v_full, w_uv

    def _dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        h = q.shape[2]
        k = k.expand(-1, -1, h, -1) if k.shape[2] != h else k
        v = v.expand(-1, -1, h, -1) if v.shape[2] != h else v
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
            is_causal=True, scale=self.cfg.attention_scale,
        )
        return out.transpose(1, 2).to(q.dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg, (b, s, _) = self.cfg, x.shape
        q_resid, q, k, v, w_uv = self._qkv(x, cos, sin)
        out = None
        if self.indexer is not None:
            indices = self.indexer(x, q_resid, cos, sin)
            out = dsa_sparse_attention(q, k, v, indices, scale=cfg.attention_scale,
                                       v_head_dim=cfg.kv_lora_rank if v is None else None)
        if self.dense:
            dense = self._dense(q, k, k[..., : cfg.kv_lora_rank] if v is None else v)
            if out is None:
                out = dense
            else:
                gate = torch.sigmoid(self.gate(x))[..., None]  # [B,S,H,1]
                out = gate * out + (1.0 - gate) * dense
        if cfg.mla_form == "mqa":
            out = torch.matmul(out.transpose(1, 2), w_uv.transpose(1, 2)).transpose(1, 2)  # latent -> v
        return self.o_proj(out.reshape(b, s, cfg.num_heads * cfg.v_head_dim))


def window_indices(seq_len: int, window: int, device) -> torch.Tensor:
    """int32 ``[S, window]``: positions s-window+1..s of each query, -1 before the sequence start."""
    pos = torch.arange(seq_len, device=device)[:, None] + torch.arange(1 - window, 1, device=device)[None, :]
    return torch.where(pos >= 0, pos, -1).to(torch.int32)


class SlidingWindowAttention(nn.Module):
    """Local causal attention over the last ``sliding_window`` tokens, through DSASparseAttention.

    The window is a fixed selection, so the same sparse-attention op (and plugin) serves it at
    O(L * window) cost.
    """

    def __init__(self, cfg: DSAModelConfig):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.num_heads, cfg.local_head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * h * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.cfg.qk_rope_head_dim
        return torch.cat((apply_rope(x[..., :r], cos, sin, False), x[..., r:]), -1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg, (b, s, _) = self.cfg, x.shape
        q, k, v = self.qkv_proj(x).view(b, s, 3, cfg.num_heads, cfg.local_head_dim).unbind(2)
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        indices = window_indices(s, cfg.sliding_window, x.device)[None].expand(b, -1, -1)
        out = dsa_sparse_attention(q, k, v, indices, scale=cfg.local_head_dim**-0.5)
        return self.o_proj(out.reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def make_attention(cfg: DSAModelConfig, layer_type: str) -> nn.Module:
    if layer_type == "local":
        return SlidingWindowAttention(cfg)
    return MLAttention(cfg, sparse=layer_type in ("dsa", "hybrid"), dense=layer_type in ("hybrid", "dense"))
