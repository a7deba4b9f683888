"""Inspect a local Hugging Face DeepSeek-V3.2 (``deepseek_v32``) or GLM-5 (``glm_moe_dsa``) directory.

Weights are read from safetensors only; pickled checkpoints (.bin/.pt) are refused because
unpickling executes code. Exports and references never load a whole model (they stream, see
:mod:`dsa_export.hf.weights`); :func:`load_model` is transformers' own ``from_pretrained`` of the
whole checkpoint, kept as an independent oracle for tests of small checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dsa_export.errors import DSAUserError, require
from dsa_export.hf.config_schema import (  # noqa: F401  (SUPPORTED_TYPES, read_config re-exported)
    SUPPORTED_TYPES,
    read_config,
    read_config_and_digest,
)

HF_INSTALL = 'pip install "dsa-export[hf]"'


@dataclass(frozen=True)
class HFCheckpoint:
    """A checkpoint directory opened once: its validated config.json (read once, hashed from the same
    bytes) and, on first use, its shard headers (:attr:`weights`). One command passes this handle
    along instead of re-reading the files: planner, references, export and checks share it."""

    path: Path
    model_type: str
    config: dict
    fp8: bool
    config_sha256: str = ""
    _weights: list = field(default_factory=list, repr=False, compare=False)

    @property
    def weights(self):
        """:class:`~dsa_export.hf.checkpoint.SafetensorsCheckpoint` of the directory: the index and
        every shard header read on the first access, kept for the handle's life."""
        if not self._weights:
            from dsa_export.hf.checkpoint import SafetensorsCheckpoint

            self._weights.append(SafetensorsCheckpoint(self.path))
        return self._weights[0]

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])


def is_hf_dir(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def inspect_checkpoint(path: str | Path) -> HFCheckpoint:
    """Read config.json and the weight files' kind; refuse what we cannot load safely.

    config.json is checked field by field (:func:`dsa_export.hf.config_schema.validate_config`) and
    the token ids of generation_config.json with it, before anything else is read.
    """
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise DSAUserError(f"'{path}' has no config.json; pass a Hugging Face model directory.")
    config, digest = read_config_and_digest(path)
    model_type = config["model_type"]
    if not list(path.glob("*.safetensors")):
        pickled = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        if pickled:
            raise DSAUserError(
                f"'{path}' stores its weights as pickle ({pickled[0]}), which dsa-export never loads because "
                "unpickling runs code; convert them to safetensors first."
            )
        raise DSAUserError(f"'{path}' has no .safetensors weight files.")
    fp8 = (config.get("quantization_config") or {}).get("quant_method") == "fp8"
    return HFCheckpoint(path=path, model_type=model_type, config=config, fp8=fp8, config_sha256=digest)


def load_model(path: str | Path, *, dequantize_fp8: bool = False, dtype: str = "float32"):
    """The transformers ``*ForCausalLM`` of ``path`` in eval mode, with eager attention, loaded whole by
    ``from_pretrained`` (small checkpoints only; FP8 ones need ``dequantize_fp8``)."""
    transformers = require("transformers", "Exporting Hugging Face checkpoints", HF_INSTALL)
    import torch

    ckpt = inspect_checkpoint(path)
    kwargs = {"dtype": getattr(torch, dtype), "attn_implementation": "eager"}
    if ckpt.fp8:
        if not dequantize_fp8:
            raise DSAUserError(
                f"'{path}' stores FP8 weights with block scales; load_model needs dequantize_fp8=True for them."
            )
        quant = ckpt.config["quantization_config"]
        kwargs["quantization_config"] = transformers.FineGrainedFP8Config(
            dequantize=True, weight_block_size=tuple(quant.get("weight_block_size") or (128, 128))
        )
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, use_safetensors=True,
                                                                  **kwargs)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DSAUserError(f"transformers could not load '{path}': {first}") from exc
    if ckpt.fp8:
        model = model.to(getattr(torch, dtype))
    return model.eval(), ckpt
