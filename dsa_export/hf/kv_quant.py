"""FP8 cache encodings of DeepSeek Sparse Attention, as the serving kernels store them.

* **Latent** (FlashMLA's FP8 KV cache, 656 bytes per token): the ``kv_lora_rank`` = 512 "nope"
  channels as FP8 e4m3 with one float32 scale per 128 channels (``amax / 448``), the 64 RoPE
  channels in bf16: 512 + 4 x 4 + 64 x 2 = 656 bytes, against 1152 in bf16.
* **Index keys** (DeepGEMM's paged MQA-logits layout): the ``index_head_dim`` = 128 channels as FP8
  e4m3 with one float32 scale per token: 132 bytes, against 256 in bf16.

:func:`encode_latent` / :func:`encode_index_keys` return the stored parts; :func:`decode_latent`
/ :func:`decode_index_keys` the float32 values a kernel computes with; the ``*_roundtrip``
functions do both (what a cache written then read gives back), which is how
``tools/fp8_cache_accuracy.py`` measures the encodings' effect on a model.

The paged graph stores them (``--kv-cache-dtype fp8``) as separate pools of the same bytes per
token: the FP8 values as uint8 bit patterns (ONNX's ScatterND and Gather take no float8 tensors),
the float32 scales, and the RoPE channels in the graph's dtype (bf16 for the real checkpoints). :func:`fp8_codes` computes the bit patterns with
arithmetic that exports to standard ONNX ops (no bit cast exists before opset 26), bit-equal to
torch's ``float8_e4m3fn`` conversion; :func:`latent_codes` / :func:`index_key_codes` are the
encodings in that form, as the graph writes them.
"""

from __future__ import annotations

import torch

#: Largest finite FP8 e4m3 value.
E4M3_MAX = 448.0
#: Channels per latent scale (FlashMLA's tile).
LATENT_BLOCK = 128


def _scaled_fp8(x: torch.Tensor, block: int, pow2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 values and float32 scales of ``x [..., C]``, one scale per ``block`` channels
    (``amax / 448``, or with ``pow2`` the power of two at or above it: DeepSeek's ue8m0 scales)."""
    shape = x.shape
    groups = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    scale = groups.abs().amax(-1, keepdim=True).clamp_min(1e-12) / E4M3_MAX
    if pow2:
        scale = torch.pow(2.0, torch.ceil(torch.log2(scale)))
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


def query_roundtrip(q: torch.Tensor, block: int = 128) -> torch.Tensor:
    """The indexer's queries ``[..., D]`` as DeepSeek's inference code quantizes them before its FP8
    index GEMM (``act_quant(q, 128, scale_fmt="ue8m0")``): e4m3 with one power-of-two scale per
    ``block`` channels (D = 128: one per token and head), given back in ``q``'s dtype."""
    values, scale = _scaled_fp8(q, min(block, q.shape[-1]), pow2=True)
    return _unscale(values, scale, min(block, q.shape[-1])).to(q.dtype)


def bf16_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a bf16 cache gives it back (the reference the FP8 encodings are judged against)."""
    return x.to(torch.bfloat16).to(x.dtype)


def fp8_codes(x: torch.Tensor) -> torch.Tensor:
    """uint8 FP8 e4m3fn bit patterns of ``x`` (float32, within +-448 after scaling; larger
    magnitudes saturate to 448): round to nearest even, as ``x.to(torch.float8_e4m3fn)``, but
    from exportable arithmetic. A magnitude ``a`` with exponent ``e = max(floor(log2 a), -6)`` has
    quantum ``2^(e-3)``; ``n = round(a / quantum)`` (exact division, ties to even) gives the
    magnitude bits ``(e + 6) * 8 + n`` (n = 16 carries into the next exponent, e = -6 covers the
    subnormals). Negative values set bit 7 (-0.0 gives 0, not 0x80: both decode to zero)."""
    x = x.float()
    a = x.abs().clamp(max=E4M3_MAX)
    floor = a.clamp(min=2.0**-6)
    e = torch.floor(torch.log2(floor))
    # log2 may land a hair off at exact powers of two: step e so that 2^e <= a < 2^(e+1).
    e = torch.where(torch.pow(2.0, e) > floor, e - 1, e)
    e = torch.where(torch.pow(2.0, e + 1) <= floor, e + 1, e)
    n = torch.round(a / torch.pow(2.0, e - 3))
    magnitude = (e + 6) * 8 + n
    return (magnitude + torch.where(x < 0, 128.0, 0.0)).to(torch.uint8)


def _block_scales(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x divided by its scales, float32 scales ``[..., C/block]``): ``amax / 448`` per block."""
    shape = x.shape
    groups = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    scale = groups.abs().amax(-1, keepdim=True).clamp_min(1e-12) / E4M3_MAX
    return (groups / scale).reshape(shape), scale.squeeze(-1)


def latent_codes(latent: torch.Tensor, rope_dim: int, block: int = LATENT_BLOCK
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(uint8 FP8 codes ``[..., C]``, float32 scales ``[..., C/block]``, rope ``[..., rope_dim]`` in
    ``latent``'s dtype) of ``latent [..., C + rope_dim]``: :func:`encode_latent` as the paged graph
    stores it (the RoPE channels stay in the graph's dtype: bf16 for the real checkpoints, as
    FlashMLA keeps them)."""
    nope, rope = latent[..., :-rope_dim], latent[..., -rope_dim:]
    scaled, scale = _block_scales(nope, block)
    return fp8_codes(scaled), scale, rope


def index_key_codes(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 FP8 codes ``[..., D]``, float32 scale ``[..., 1]``): one scale per token."""
    scaled, scale = _block_scales(keys, keys.shape[-1])
    return fp8_codes(scaled), scale


def latent_bytes_per_token(kv_lora_rank: int = 512, rope_dim: int = 64) -> int:
    return kv_lora_rank + 4 * (kv_lora_rank // LATENT_BLOCK) + 2 * rope_dim


def index_key_bytes_per_token(index_head_dim: int = 128) -> int:
    return index_head_dim + 4


__all__ = ["E4M3_MAX", "bf16_roundtrip", "decode_index_keys", "decode_latent", "encode_index_keys", "encode_latent",
           "fp8_codes", "index_key_bytes_per_token", "index_key_codes", "index_keys_roundtrip", "latent_bytes_per_token",
           "latent_codes", "latent_roundtrip"]
