"""FP8 cache encodings of DeepSeek Sparse Attention, as the serving kernels store them.

* **Latent** (FlashMLA's FP8 KV cache, 656 bytes per token): the ``kv_lora_rank`` = 512 "nope"
  channels as FP8 e4m3 with one float32 scale per 128 channels (``amax / 448``), the 64 RoPE
  channels in bf16: 512 + 4 x 4 + 64 x 2 = 656 bytes, against 1152 in bf16.
* **Index keys** (DeepGEMM's paged MQA-logits layout): the ``index_head_dim`` = 128 channels as FP8
  e4m3 with one float32 scale per token: 132 bytes, against 256 in bf16.

:func:`encode_latent` / :func:`encode_index_keys` return the stored parts; :func:`decode_latent`
/ :func:`decode_index_keys` the float32 values a kernel computes with; the ``*_roundtrip``
functions do both (what a cache written then read gives back), which is how
``tools/fp8_cache_accuracy.py`` measures the encodings' effect on a model. The paged graph does
not store these encodings yet: ONNX's ScatterND takes no FP8 tensors, so FP8 pools need the
plugin kernels (their own issue).
"""

from __future__ import annotations

import torch

#: Largest finite FP8 e4m3 value.
E4M3_MAX = 448.0
#: Channels per latent scale (FlashMLA's tile).
LATENT_BLOCK = 128


def _scaled_fp8(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 values and float32 scales of ``x [..., C]``, one scale per ``block`` channels."""
    shape = x.shape
    groups = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    scale = groups.abs().amax(-1, keepdim=True).clamp_min(1e-12) / E4M3_MAX
    values = (groups / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return values.reshape(shape), scale.squeeze(-1)


def _unscale(values: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    shape = values.shape
    groups = values.float().reshape(*shape[:-1], shape[-1] // block, block)
    return (groups * scale.unsqueeze(-1)).reshape(shape)


def encode_latent(latent: torch.Tensor, rope_dim: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(FP8 nope ``[..., C]``, float32 scales ``[..., C/128]``, bf16 rope ``[..., rope_dim]``) of
    ``latent [..., C + rope_dim]``."""
    nope, rope = latent[..., :-rope_dim], latent[..., -rope_dim:]
    if nope.shape[-1] % LATENT_BLOCK:
        raise ValueError(f"the latent's {nope.shape[-1]} nope channels are not a multiple of {LATENT_BLOCK}.")
    values, scale = _scaled_fp8(nope, LATENT_BLOCK)
    return values, scale, rope.to(torch.bfloat16)


def decode_latent(values: torch.Tensor, scale: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    return torch.cat([_unscale(values, scale, LATENT_BLOCK), rope.float()], dim=-1)


def encode_index_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 keys ``[..., D]``, float32 scale per token ``[...]``)."""
    values, scale = _scaled_fp8(keys, keys.shape[-1])
    return values, scale.squeeze(-1)


def decode_index_keys(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return _unscale(values, scale.unsqueeze(-1), values.shape[-1])


def latent_roundtrip(latent: torch.Tensor, rope_dim: int = 64) -> torch.Tensor:
    """``latent`` as an FP8 latent cache gives it back (in its own dtype)."""
    return decode_latent(*encode_latent(latent, rope_dim)).to(latent.dtype)


def index_keys_roundtrip(keys: torch.Tensor) -> torch.Tensor:
    return decode_index_keys(*encode_index_keys(keys)).to(keys.dtype)


def bf16_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a bf16 cache gives it back (the reference the FP8 encodings are judged against)."""
    return x.to(torch.bfloat16).to(x.dtype)


def latent_bytes_per_token(kv_lora_rank: int = 512, rope_dim: int = 64) -> int:
    return kv_lora_rank + 4 * (kv_lora_rank // LATENT_BLOCK) + 2 * rope_dim


def index_key_bytes_per_token(index_head_dim: int = 128) -> int:
    return index_head_dim + 4


__all__ = ["E4M3_MAX", "bf16_roundtrip", "decode_index_keys", "decode_latent", "encode_index_keys", "encode_latent",
           "index_key_bytes_per_token", "index_keys_roundtrip", "latent_bytes_per_token", "latent_roundtrip"]
