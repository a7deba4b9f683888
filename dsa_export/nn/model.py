"""A small causal language model with a configurable local / DSA / hybrid layer schedule."""

from __future__ import annotations

import zlib

import torch
from torch import nn

from dsa_export.nn.config import DSAModelConfig
from dsa_export.nn.layers import RMSNorm, SwiGLU, make_attention, rope_tables


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DSAModelConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = make_attention(cfg, layer_type)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_attn_norm(x))


class DSACausalLM(nn.Module):
    """``input_ids [B,S] -> logits [B,S,vocab]``; every sparse layer goes through the ``dsa`` ops."""

    def __init__(self, cfg: DSAModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t) for t in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        s = input_ids.shape[1]
        cos, sin = rope_tables(s, self.config.qk_rope_head_dim, self.config.rope_theta, x.device, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

    @torch.no_grad()
    def init_weights(self, seed: int) -> DSACausalLM:
        """Seeded LeCun-normal weights so every build of a named config is bit-identical.

        Each parameter draws from its own generator seeded by (seed, name), so a parameter's value
        does not depend on which other layers the schedule contains.
        """
        for name, param in self.named_parameters():
            gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
            if name.endswith("norm.weight") or name.endswith("k_norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            elif param.dim() == 2:
                fan_in = param.shape[0] if "embed_tokens" in name else param.shape[1]
                scale = 1.0 if "embed_tokens" in name else fan_in**-0.5
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
        return self


def example_inputs(cfg: DSAModelConfig, batch: int = 1, seq_len: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded ``input_ids`` for export and validation."""
    gen = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen)}
