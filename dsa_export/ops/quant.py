"""FP8 block-scaled weights: the dequantization op and its ONNX form.

DeepSeek publishes its Linear weights as FP8 e4m3 with one float32 ``weight_scale_inv`` per
128x128 block: ``w = fp8 * scale[i // 128, j // 128]``. Exports keep those bytes: the weight stays a
float8e4m3fn initializer and the graph dequantizes it with a blocked ``DequantizeLinear`` (opset 21),
whose scale must have the weight's rank with the blocked axis divided by the block size. The 2-D
block scale ``[ceil(O/b), ceil(I/b)]`` is therefore repeated along the output axis in the graph
(``[O, ceil(I/b)]``, a few percent of the weight's bytes, computed at run time or folded by the
engine builder) rather than stored expanded. See docs/hf.md for what each runtime accepts.

``dsa::dequantize_fp8`` is a torch.library op so that the exporter sees one call, not the chain of
casts and broadcasts its CPU implementation uses.
"""

from __future__ import annotations

import torch

from dsa_export.ops.contract import DOMAIN

#: The opset whose DequantizeLinear has ``block_size`` (blocked quantization).
FP8_MIN_OPSET = 21


def dequantize_fp8_blocks(weight: torch.Tensor, scale: torch.Tensor, block_size: int = 128,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``weight`` (float8, ``[..., O, I]``) times the scale of its ``block_size`` block, in ``dtype``.

    ``scale`` is ``[..., ceil(O/b), ceil(I/b)]``; the last block of a dimension that is not a
    multiple of ``b`` is partial, as in DeepSeek's own ``weight_dequant``.
    """
    *lead, rows, cols = weight.shape
    if rows % block_size == 0 and cols % block_size == 0:
        # Whole blocks (every DeepSeek/GLM shape): one broadcast multiply, no expanded scale, in
        # place on a float32 copy (never on the caller's tensor, whatever its dtype).
        blocks = weight.to(torch.float32, copy=True).view(*lead, rows // block_size, block_size, cols // block_size, block_size)
        return blocks.mul_(scale.float()[..., :, None, :, None]).view(*lead, rows, cols).to(dtype)
    full = scale.float().repeat_interleave(block_size, dim=-2)[..., :rows, :]
    full = full.repeat_interleave(block_size, dim=-1)[..., :cols]
    return (weight.float() * full).to(dtype)


@torch.library.custom_op(f"{DOMAIN}::dequantize_fp8", mutates_args=())
def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block_size: int) -> torch.Tensor:
    """float32 ``[O, I]`` from an FP8 ``[O, I]`` weight and its ``[ceil(O/b), ceil(I/b)]`` scales."""
    return dequantize_fp8_blocks(weight, scale, block_size)


@dequantize_fp8.register_fake
def _dequantize_fp8_fake(weight, scale, block_size):
    return weight.new_empty(weight.shape, dtype=torch.float32)


def translations() -> dict:
    """Exporter translations: ``dsa::dequantize_fp8`` -> scale repeat + blocked DequantizeLinear."""
    import onnxscript

    op = onnxscript.opset21

    def dequantize(weight, scale, block_size: int):
        # [Ob, Ib] -> [Ob, 1, Ib] -> [Ob, b, Ib] -> [Ob*b, Ib] -> first O rows: one scale row per weight row.
        rows = op.Shape(weight, start=0, end=1)
        expanded_shape = op.Concat(op.Shape(scale, start=0, end=1), op.Constant(value_ints=[block_size]),
                                   op.Shape(scale, start=1, end=2), axis=0)
        expanded = op.Expand(op.Unsqueeze(scale, op.Constant(value_ints=[1])), expanded_shape)
        flat_shape = op.Concat(op.Mul(op.Shape(scale, start=0, end=1), op.Constant(value_ints=[block_size])),
                               op.Shape(scale, start=1, end=2), axis=0)
        per_row = op.Slice(op.Reshape(expanded, flat_shape), op.Constant(value_ints=[0]), rows,
                           op.Constant(value_ints=[0]))
        return op.DequantizeLinear(weight, per_row, axis=1, block_size=block_size)

    return {torch.ops.dsa.dequantize_fp8.default: dequantize}
