"""Settings of the export step. ``None`` means "the default", and every default is written here
(or, for dtype and opset, decided from the model source in :meth:`ExportSettings.resolved`)."""

from __future__ import annotations

from dataclasses import dataclass

#: The default standard-domain opset. 18 is the opset the torch exporter's op library is written
#: in (no version conversion step, which can fail on custom domains), has LayerNormalization and
#: ReduceSum/ReduceMax with axes as inputs, and is parsed by TensorRT 8.6+, 10.x, TensorRT-RTX and
#: ONNX Runtime >= 1.14.
DEFAULT_OPSET = 18
SUPPORTED_OPSETS = range(18, 24)
OPS_MODES = ("plugin", "native")
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class ExportSettings:
    """Everything that shapes an exported file.

    Attributes:
        ops: ``plugin`` keeps ``dsa`` custom nodes (with function bodies); ``native`` inlines the
            bodies so the file uses standard ONNX ops only.
        batch: batch size of the example inputs traced (the exported axis stays dynamic).
        seq_len: sequence length of the example inputs traced (dynamic in the file).
        dtype: ``fp32``, ``fp16`` or ``bf16`` weights and activations; None: the source's own
            precision (a Hugging Face checkpoint's ``torch_dtype``), else fp32. FP8 weights of a
            checkpoint stay FP8 whatever the dtype (see ``--dequantize-fp8``).
        opset: standard-domain opset of the file; None: 18, or the lowest opset the source needs
            (21 for FP8 weights: blocked DequantizeLinear).
        seed: seed of the generated example inputs.
    """

    ops: str = "plugin"
    batch: int = 2
    seq_len: int = 64
    dtype: str | None = None
    opset: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.ops not in OPS_MODES:
            raise ValueError(f"ops must be one of {OPS_MODES}.")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}.")
        if self.opset is not None and self.opset not in SUPPORTED_OPSETS:
            raise ValueError(f"opset {self.opset} is not supported; use {SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1}.")
        # Batch and sequence of 1 would be specialized away by torch.export's 0/1 rule.
        if self.batch < 2 or self.seq_len < 2:
            raise ValueError("batch and seq_len of the traced example must be at least 2 (the axes stay dynamic).")

    def resolved(self, source_dtype: str | None = None, min_opset: int | None = None) -> ExportSettings:
        """These settings with dtype and opset decided for a source built in ``source_dtype`` that
        needs at least ``min_opset``; an explicit opset below that is a user error."""
        from dataclasses import replace

        from dsa_export.errors import DSAUserError

        opset = self.opset if self.opset is not None else max(DEFAULT_OPSET, min_opset or 0)
        if min_opset is not None and opset < min_opset:
            raise DSAUserError(f"this model needs ONNX opset {min_opset} or later (blocked DequantizeLinear for its FP8 "
                               f"weights); pass --opset {min_opset} or drop --opset.")
        return replace(self, dtype=self.dtype or source_dtype or "fp32", opset=opset)
