"""Polygraphy data loader for dsa-export models: ``--data-loader-script tools/polygraphy/data_loader.py``.

Polygraphy calls ``load_data()`` and feeds every dict it yields to each runner. The inputs are
described by the model itself, so the same script serves every model dsa-export builds:

- ``DSA_EXPORT_ARTIFACT``: a build folder (its ``manifest.json``) or an exported ``.onnx``
  (default: ``out/demo``, the README's demo build);
- ``DSA_EXPORT_SEQ_LENS``: comma-separated sequence lengths, one feed each (default ``16,64,256``);
- ``DSA_EXPORT_BATCH``: batch size (default ``2``); ``DSA_EXPORT_SEED``: seed (default ``1``).

Token ids are drawn below the model's vocabulary size (from the manifest's ``value_range`` or the
ONNX metadata); float inputs are standard normal. Keep the lengths inside the engine's profile
when a TensorRT runner is in the comparison (``dsa-export build`` defaults: batch 1..4, sequence 1..512).
This file imports only numpy, onnx and the standard library, so Polygraphy can load it anywhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

DEFAULT_ARTIFACT = "out/demo"


def _specs_from_manifest(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["inputs"]


def _specs_from_onnx(path: Path) -> list[dict]:
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    vocab = json.loads(meta.get("dsa_export.model_config", "{}")).get("vocab_size")
    initializers = {i.name for i in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        spec = {"name": value.name, "dtype": str(dtype),
                "shape": [d.dim_param or d.dim_value for d in tensor_type.shape.dim]}
        if dtype.kind in "iu":
            spec["value_range"] = [0, int(vocab) if vocab and "id" in value.name else 2]
        specs.append(spec)
    return specs


def input_specs(artifact: str | os.PathLike[str] | None = None) -> list[dict]:
    """Input descriptions (name, dtype, shape with dim names, value_range) of a build or an ONNX file."""
    path = Path(artifact or os.environ.get("DSA_EXPORT_ARTIFACT", DEFAULT_ARTIFACT))
    if path.is_dir():
        path = path / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist; set DSA_EXPORT_ARTIFACT to a build folder or an exported .onnx file."
        )
    return _specs_from_onnx(path) if path.suffix == ".onnx" else _specs_from_manifest(path)


def feeds(specs: list[dict], batch: int, seq_lens: list[int], seed: int):
    rng = np.random.default_rng(seed)
    for seq_len in seq_lens:
        sizes = {"batch": batch, "sequence": seq_len}
        feed = {}
        for spec in specs:
            shape = [d if isinstance(d, int) else sizes.get(d, seq_len) for d in spec["shape"]]
            dtype = np.dtype(spec["dtype"])
            if dtype.kind in "iu":
                low, high = spec.get("value_range") or (0, 2)
                feed[spec["name"]] = rng.integers(low, high, size=shape).astype(dtype)
            else:
                feed[spec["name"]] = rng.standard_normal(shape).astype(dtype)
        yield feed


def load_data():
    """Polygraphy's entry point: one feed per sequence length."""
    seq_lens = [int(s) for s in os.environ.get("DSA_EXPORT_SEQ_LENS", "16,64,256").split(",") if s.strip()]
    batch = int(os.environ.get("DSA_EXPORT_BATCH", "2"))
    seed = int(os.environ.get("DSA_EXPORT_SEED", "1"))
    yield from feeds(input_specs(), batch, seq_lens, seed)
