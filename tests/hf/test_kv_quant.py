"""FP8 cache encodings (dsa_export/hf/kv_quant.py): FlashMLA's 656-byte latent token and
DeepGEMM's FP8 index keys with a per-token scale, checked against their definition."""

from __future__ import annotations

import pytest
import torch

from dsa_export.hf import kv_quant


def test_latent_token_is_656_bytes_and_keeps_rope_in_bf16():
    latent = torch.randn(3, 5, 576) * torch.logspace(-2, 2, 576)  # channels of very different scales
    values, scale, rope = kv_quant.encode_latent(latent)
    assert values.dtype == torch.float8_e4m3fn and values.shape == (3, 5, 512)
    assert scale.dtype == torch.float32 and scale.shape == (3, 5, 4)
    assert rope.dtype == torch.bfloat16 and torch.equal(rope, latent[..., 512:].to(torch.bfloat16))
    stored = values.element_size() * 512 + scale.element_size() * 4 + rope.element_size() * 64
    assert stored == kv_quant.latent_bytes_per_token() == 656
    # One scale per 128 channels, amax / 448: each block's largest value is stored as +-448.
    blocks = latent[..., :512].reshape(3, 5, 4, 128)
    assert torch.allclose(scale, blocks.abs().amax(-1) / 448)
    assert torch.equal(values.float().reshape(3, 5, 4, 128).abs().amax(-1), torch.full((3, 5, 4), 448.0))


def test_roundtrips_lose_what_e4m3_loses_and_no_more():
    torch.manual_seed(0)
    latent = torch.randn(64, 576)
    back = kv_quant.latent_roundtrip(latent)
    nope_error = (back[:, :512] - latent[:, :512]).abs() / latent[:, :512].abs().reshape(64, 4, 128).amax(-1).repeat_interleave(128, 1)
    assert nope_error.max() <= 2 ** -4 + 1e-6  # half an e4m3 step at the block maximum: 3 mantissa bits
    assert torch.equal(back[:, 512:], latent[:, 512:].to(torch.bfloat16).float())
    keys = torch.randn(64, 128) * 3
    back = kv_quant.index_keys_roundtrip(keys)
    relative = ((back - keys).norm(dim=-1) / keys.norm(dim=-1))
    assert relative.max() < 0.05 and relative.mean() > 0.005  # rounded, and rounded only that much
    assert kv_quant.index_key_bytes_per_token() == 132


def test_zero_tokens_and_bad_widths():
    assert torch.equal(kv_quant.latent_roundtrip(torch.zeros(2, 576)), torch.zeros(2, 576))
    assert torch.equal(kv_quant.index_keys_roundtrip(torch.zeros(2, 128)), torch.zeros(2, 128))
    with pytest.raises(ValueError, match="not a multiple of 128"):
        kv_quant.encode_latent(torch.zeros(2, 40), rope_dim=8)
