"""Synthetic DeepSeek-V3.2 and GLM-5 checkpoints at the published per-layer widths, in the published format.

Nobody here can download the real checkpoints (~690 GB for DeepSeek-V3.2, ~1.5 TB bf16 for GLM-5),
so tests and benchmarks run on checkpoints with the real widths, fewer layers and routed experts,
random weights, written the way the published ones are:

* sharded safetensors ``model-00001-of-0000N.safetensors`` (DeepSeek's six-digit total,
  ``model-00001-of-000163.safetensors``, is kept for ``deepseek_v32``) plus
  ``model.safetensors.index.json`` (``{"metadata": {"total_size"}, "weight_map"}``);
  ``config.json`` and ``generation_config.json``;
* per-expert tensors ``model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight`` (transformers
  stacks them into ``experts.gate_up_proj`` / ``down_proj`` on load, its ``qwen2_moe`` conversion),
  ``mlp.gate.weight``, ``mlp.gate.e_score_correction_bias``, ``mlp.shared_experts.*``, the MLA
  projections and norms, and ``self_attn.indexer.{wq_b,wk,k_norm,weights_proj}`` (GLM-5 layers
  whose ``indexer_types`` entry is ``"shared"`` carry no indexer tensors);
* ``precision="fp8"``: every Linear weight of attention, indexer (``wq_b``, ``wk``), dense MLP,
  shared and routed experts is FP8 e4m3 with a float32 ``weight_scale_inv`` of shape
  ``[ceil(out/128), ceil(in/128)]`` (amax/448 per block, partial edge blocks as if zero-padded;
  for ``deepseek_v32`` rounded up to a power of two, its config's ``scale_fmt: "ue8m0"``);
  embeddings, ``lm_head``, norms, the router ``mlp.gate.weight`` and ``indexer.weights_proj`` stay
  bf16, ``e_score_correction_bias`` float32, DeepSeek's ``indexer.k_norm`` float32 (GLM's bf16).
  ``precision="bf16"`` stores the same random bf16 draws unquantized with the other dtypes
  unchanged (what DeepSeek's ``fp8_cast_bf16.py`` makes of its FP8 release), so with one seed the
  FP8 checkpoint dequantizes to the bf16 one within e4m3 rounding.

Where these facts come from (public sources, read, not copied):

* FP8 layout, ``quantization_config`` and the MTP layer numbering: DeepSeek-V3's
  ``README_WEIGHTS.md`` (github.com/deepseek-ai/DeepSeek-V3), whose format DeepSeek-V3.2 keeps;
  ``scale_fmt: "ue8m0"`` from DeepSeek-V3.2-Exp's ``inference/config_671B_v3.2.json``; tensor
  names from its ``inference/convert.py`` (the HF-name mapping, incl. ``indexer.k_norm`` weight
  and bias) and ``inference/model.py`` ("weights_proj in the checkpoint is stored in bf16",
  LayerNorm parameters in float32, router weight bf16 with a float32 bias); shard names from
  huggingface.js' test of ``model-00001-of-000163.safetensors`` (deepseek-ai/DeepSeek-V3.2-Exp).
* per-tensor dtypes of a published DSA checkpoint: safetensors headers of GLM-5.2-FP8 (same
  ``glm_moe_dsa`` architecture) as transcribed in public notes: F8 + F32 ``[ceil, ceil]`` scales for
  every projection incl. ``indexer.wq_b`` / ``wk``, BF16 ``weights_proj``, ``k_norm``, norms and
  ``mlp.gate.weight``, F32 ``e_score_correction_bias``, ``quantization_config`` with
  ``modules_to_not_convert``; and a DeepSeek-V3.2 serving engine's list of HF tensor dtypes
  (``k_norm`` F32, ``weights_proj`` BF16).
* GLM-5 (zai-org/GLM-5, GLM-5.1) configs: no ``index_topk_freq`` (every layer runs its indexer),
  ``rope_theta`` 1e6, eos ``[154820, 154827, 154829]``; GLM-5.2 adds IndexShare
  (``index_topk_freq`` 4, ``index_skip_topk_offset`` 3), pass those to reproduce it.
* not published anywhere we could read: the exact order of tensors inside shards (we use module
  order, shards filled greedily, each file laid out like ``safetensors.save_file`` does: sorted
  by dtype size then name). The MTP layer (``model.layers.<num_hidden_layers>``, written with
  ``mtp=True``) follows the published layouts (``enorm``, ``hnorm``, ``eh_proj``,
  ``shared_head.norm``; DeepSeek also ``embed_tokens`` and ``shared_head.head``), all bf16;
  transformers ignores only ``model.layers.61`` / ``78``, so at other depths it reports those keys
  as unexpected.

Random values follow transformers' ``_init_weights``: normal(0, initializer_range) for
projections, embeddings and the router, ones for RMSNorm and ``k_norm.weight``, zeros for
``k_norm.bias``; ``e_score_correction_bias`` is normal(0, initializer_range) instead of zeros so
the bias path of routing is exercised. Each block of rows is drawn from its own generator seeded
by (seed, tensor name, block), so a checkpoint is reproducible and any tensor can be regenerated
alone (:meth:`CheckpointPlan.tensor`).

Files are written one tensor at a time in blocks of rows (peak memory: one block of ~64 MB plus
the interpreter), into a hidden staging folder renamed into place at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsa_export.errors import DSAUserError
from dsa_export.hf.synthetic_plan import (  # noqa: F401  (the plan half, re-exported)
    ARCHITECTURES,
    CHUNK_VALUES,
    DEFAULT_SHARD_BYTES,
    DTYPE_BYTES,
    FP8_BLOCK,
    FP8_MAX,
    HF_INSTALL,
    KINDS,
    NARROW,
    PRECISIONS,
    CheckpointPlan,
    StoredTensor,
    _expert_groups,
    _quantized_blocks,
    _stored_blocks,
    dequantize_fp8,
    plan_checkpoint,
    quantize_fp8,
)


@dataclass(frozen=True)
class CheckpointInfo:
    """What :func:`write_checkpoint` wrote, with its sizes and the time it took."""

    path: Path
    plan: CheckpointPlan
    shard_files: tuple[str, ...]
    disk_bytes: int  # every file written, safetensors headers and JSON included
    seconds: float

    @property
    def total_bytes(self) -> int:
        """Tensor bytes (the index's ``total_size``)."""
        return self.plan.total_bytes

    @property
    def tensor_count(self) -> int:
        return len(self.plan.tensors)

    @property
    def layer_bytes(self) -> tuple[int, ...]:
        return self.plan.layer_bytes

    @property
    def embedding_bytes(self) -> int:
        return self.plan.embedding_bytes

    @property
    def head_bytes(self) -> int:
        return self.plan.head_bytes

    @property
    def config(self) -> dict:
        return self.plan.config

    def summary(self) -> str:
        return describe(self.plan, path=self.path, seconds=self.seconds, disk_bytes=self.disk_bytes)


def describe(plan: CheckpointPlan, *, path: Path | None = None, seconds: float | None = None,
             disk_bytes: int | None = None) -> str:
    """A few lines for people: sizes per layer, totals and, once written, where and how fast."""
    cfg = plan.config
    mlp_types = ["dense" if i < cfg["first_k_dense_replace"] else "moe" for i in range(cfg["num_hidden_layers"])]
    lines = [f"{plan.kind} {plan.precision}: {cfg['num_hidden_layers']} layers "
             f"({cfg['first_k_dense_replace']} dense), {cfg['n_routed_experts']} routed experts "
             f"(top-{cfg['num_experts_per_tok']}), hidden {cfg['hidden_size']}, vocab {cfg['vocab_size']}"]
    for i, size in enumerate(plan.layer_bytes):
        kind = mlp_types[i] if i < len(mlp_types) else "mtp"
        lines.append(f"  layer {i:>3} ({kind:>5}): {_human(size)}")
    lines.append(f"  embedding: {_human(plan.embedding_bytes)}, head + norm: {_human(plan.head_bytes)}")
    lines.append(f"  total: {_human(plan.total_bytes)} in {len(plan.tensors)} tensors, "
                 f"{len(plan.shards())} shard(s) of <= {_human(plan.shard_bytes)}")
    if path is not None:
        lines.append(f"  written to {path} ({_human(disk_bytes or 0)} on disk) in {seconds:.1f} s")
    return "\n".join(lines)


def _human(n: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


# -- writing ----------------------------------------------------------------------------------------

def write_checkpoint(path: str | os.PathLike, kind: str, *, layers: int, dense_layers: int, experts: int,
                     precision: str = "bf16", vocab_size: int | None = None,
                     shard_bytes: int = DEFAULT_SHARD_BYTES, seed: int = 0, index_topk: int | None = None,
                     mtp: bool = False, overwrite: bool = False,
                     progress: Callable[[str], None] | None = None, **config_overrides) -> CheckpointInfo:
    """Write a synthetic ``kind`` checkpoint (``"deepseek_v32"`` or ``"glm_moe_dsa"``) into ``path``.

    Args:
        path: the checkpoint directory; it must not exist (or be empty) unless ``overwrite``
            replaces an earlier checkpoint there.
        layers: ``num_hidden_layers``; ``dense_layers`` of them (``first_k_dense_replace``) have a
            dense MLP, the others routed experts.
        experts: routed experts per MoE layer (>= 2); ``num_experts_per_tok`` defaults to
            ``min(8, experts // 2)`` and DeepSeek's ``n_group`` / ``topk_group`` are adapted to
            keep its 4-of-8 group routing (:func:`_expert_groups`); config overrides win.
        precision: ``"bf16"``, or ``"fp8"`` (e4m3 weights + float32 ``weight_scale_inv`` per
            128x128 block, ``quantization_config`` in config.json).
        vocab_size: ``None`` keeps the published vocabulary (129280 / 154880).
        shard_bytes: limit of tensor bytes per shard; one tensor larger than it gets its own shard.
        seed: the same arguments and seed always give the same bytes.
        index_topk: ``None`` keeps the published 2048.
        mtp: also write the multi-token-prediction layer ``model.layers.<layers>``.
        progress: called with one line per shard written.
        **config_overrides: fields of transformers' config class (e.g. the widths of :data:`NARROW`,
            ``num_experts_per_tok``, ``rope_parameters``) and, for GLM-5, ``index_topk_freq`` /
            ``index_skip_topk_offset`` / ``index_topk_pattern`` / ``indexer_types``.
    """
    if sys.byteorder != "little":
        raise DSAUserError("safetensors files are little-endian; write synthetic checkpoints on a little-endian host.")
    start = time.perf_counter()
    plan = plan_checkpoint(kind, layers=layers, dense_layers=dense_layers, experts=experts, precision=precision,
                           vocab_size=vocab_size, shard_bytes=shard_bytes, seed=seed, index_topk=index_topk,
                           mtp=mtp, **config_overrides)
    final = Path(path)
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        if not overwrite:
            raise DSAUserError(f"'{final}' already exists and is not empty; choose a new directory or pass overwrite.")
        if not (final / "config.json").is_file():
            raise DSAUserError(f"'{final}' holds no checkpoint (no config.json); refusing to replace it.")
    staging = final.parent / f".{final.name}.partial-{os.getpid()}"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        names = plan.shard_names()
        weight_map = {}
        for name, tensors in zip(names, plan.shards(), strict=True):
            _write_shard(staging / name, tensors, plan)
            weight_map.update({t.name: name for t in tensors})
            if progress is not None:
                progress(f"wrote {name}: {len(tensors)} tensors, {_human(sum(t.nbytes for t in tensors))}")
        index = {"metadata": {"total_size": plan.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        (staging / "config.json").write_text(json.dumps(plan.config, indent=2) + "\n")
        (staging / "generation_config.json").write_text(json.dumps(plan.generation_config, indent=2) + "\n")
        if final.exists():  # empty, or the earlier checkpoint overwrite replaces
            shutil.rmtree(final)
        os.replace(staging, final)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise DSAUserError(f"writing the checkpoint into '{final}' failed ({exc.strerror or exc}); check the free "
                           "space and permissions there or choose another directory.") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    disk = sum(f.stat().st_size for f in final.iterdir())
    return CheckpointInfo(path=final, plan=plan, shard_files=tuple(names), disk_bytes=disk,
                          seconds=time.perf_counter() - start)


def _write_shard(file: Path, tensors: list[StoredTensor], plan: CheckpointPlan) -> None:
    """One safetensors file, laid out like ``save_file`` (by dtype size, then name), filled tensor by tensor.

    A second thread writes while the next block is drawn (the two take about as long).
    """
    layout = sorted(tensors, key=lambda t: (-DTYPE_BYTES[t.dtype], t.name))
    header: dict = {"__metadata__": {"format": "pt"}}
    offsets, offset = {}, 0
    for t in layout:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offsets[t.name] = offset
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as safetensors pads it
    base = 8 + len(raw)
    with open(file, "wb") as f, _BackgroundWriter(f) as writer:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for t in tensors:  # module order; a weight writes its scale too
            if t.scale_of is not None:
                continue
            position = base + offsets[t.name]
            if not t.fp8:
                for block in _stored_blocks(t, plan):
                    position += writer.put(position, block)
                continue
            scales = []
            for quant, scale in _quantized_blocks(t, plan):
                position += writer.put(position, quant)
                scales.append(scale)
            writer.put(base + offsets[t.name + "_scale_inv"], _cat(scales))
    size = file.stat().st_size
    if size != base + offset:
        raise RuntimeError(f"internal error: {file.name} has {size} bytes, its header says {base + offset}")


class _BackgroundWriter:
    """Writes (position, tensor) items on a thread; a failure there is raised in the caller."""

    def __init__(self, f):
        import queue
        import threading

        self.f, self.error = f, None
        self.items: queue.Queue = queue.Queue(maxsize=2)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def put(self, position: int, tensor) -> int:
        if self.error is not None:
            raise self.error
        data = _bytes(tensor)
        self.items.put((position, data))
        return len(data)

    def _run(self):
        while (item := self.items.get()) is not None:
            if self.error is None:
                try:
                    self.f.seek(item[0])
                    self.f.write(item[1])
                except BaseException as exc:  # handed to the caller by put() / __exit__
                    self.error = exc

    def __exit__(self, *exc_info):
        self.items.put(None)
        self.thread.join()
        if self.error is not None and exc_info[0] is None:
            raise self.error
        return False


def _cat(blocks):
    import torch

    return torch.cat(blocks)


def _bytes(tensor) -> memoryview:
    import torch

    return memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy()).cast("B")
