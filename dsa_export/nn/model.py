"""A small causal language model with a configurable local / DSA / hybrid layer schedule."""

from __future__ import annotations

import zlib

import torch
from torch import nn

from dsa_export.nn.config import DSAModelConfig
from dsa_export.nn.layers import RMSNorm, SwiGLU, make_attention, rope_tables
from dsa_export.nn.moe import RoutedMoE
from dsa_export.nn.patterns import PATTERN_LAYER_TYPES, make_pattern_attention


def make_mlp(cfg: DSAModelConfig, index: int) -> nn.Module:
    """The dense SwiGLU MLP, or the MoE block on the config's MoE layers."""
    if not cfg.is_moe_layer(index):
        return SwiGLU(cfg.hidden_size, cfg.intermediate_size)
    return RoutedMoE.build(
        cfg.hidden_size, cfg.moe_intermediate_size, cfg.moe_experts, top_k=cfg.moe_top_k,
        n_shared=cfg.moe_shared_experts, n_group=cfg.moe_n_group, topk_group=cfg.moe_topk_group,
        norm_topk_prob=cfg.moe_norm_topk_prob, routed_scaling_factor=cfg.moe_routed_scaling_factor,
    )


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DSAModelConfig, layer_type: str, index: int = 0):
        super().__init__()
        self.layer_type = layer_type
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = (make_pattern_attention(cfg, layer_type, index) if layer_type in PATTERN_LAYER_TYPES
                     else make_attention(cfg, layer_type))
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = make_mlp(cfg, index)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_attn_norm(x))


class DSACausalLM(nn.Module):
    """``input_ids [B,S] -> logits [B,S,vocab]``; every sparse layer goes through the ``dsa`` ops."""

    def __init__(self, cfg: DSAModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t, i) for i, t in enumerate(cfg.layer_types))
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
        does not depend on which other layers the schedule contains. Stacked expert weights
        ``[E, out, in]`` are drawn like E matrices; the MoE routers' score correction bias is small
        and non-zero so that it takes part in the routing.
        """

        def generator(name: str) -> torch.Generator:
            return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)

        for name, param in self.named_parameters():
            gen = generator(name)
            if name.endswith("norm.weight") or name.endswith("k_norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            elif param.dim() >= 2:
                fan_in = param.shape[0] if "embed_tokens" in name else param.shape[-1]
                scale = 1.0 if "embed_tokens" in name else fan_in**-0.5
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
        for name, buffer in self.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator(name)) * 0.05)
        return self


def example_inputs(cfg: DSAModelConfig, batch: int = 1, seq_len: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded ``input_ids`` for export and validation."""
    gen = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen)}
