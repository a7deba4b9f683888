"""Hugging Face directories as MODEL sources, streamed: no weights are loaded to export.

:func:`hf_reference` turns a checkpoint directory plus graph options into a
:class:`~dsa_export.model_ref.ModelReference` (config and weights hashes included);
:func:`hf_source` builds the export module for it on the meta device, in the export's precision,
and hands the exporter one streaming source per weight (:mod:`dsa_export.hf.weights`). References
for validation are loaded the same way, for the graph's layers only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dsa_export.errors import DSAUserError
from dsa_export.hf.model import PAGE_SIZE, check_kv_cache
from dsa_export.model_ref import ModelReference
from dsa_export.model_source import ModelSource

GRAPHS = ("prefill", "decode", "paged")
#: Past length of the traced decode example (any length >= 0 works at run time).
EXAMPLE_PAST = 3
_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_layers(text: str, num_layers: int) -> tuple[int, int]:
    try:
        a_text, b_text = text.split(":")
        a = int(a_text) if a_text else 0
        b = int(b_text) if b_text else num_layers
    except ValueError:
        raise DSAUserError(f"--layers '{text}' is not A:B (e.g. 0:2).") from None
    if not 0 <= a < b <= num_layers:
        raise DSAUserError(f"--layers {a}:{b} is outside the model's {num_layers} layers; use 0 <= A < B <= {num_layers}.")
    return a, b


def checkpoint_dtype(config: dict) -> str:
    """The export dtype matching the checkpoint's own (``dtype`` / ``torch_dtype`` of a config.json
    checked by :func:`dsa_export.hf.config_schema.validate_config`; float32 when it names none, as
    transformers assumes)."""
    from dsa_export.hf.config_schema import config_dtype

    return config_dtype(config, "fp32")


def open_checkpoint(path):
    """``path`` as an opened :class:`~dsa_export.hf.loader.HFCheckpoint` (config.json read and
    checked); an opened one is returned as it is."""
    from dsa_export.hf.loader import HFCheckpoint, inspect_checkpoint

    return path if isinstance(path, HFCheckpoint) else inspect_checkpoint(path)


def example_pool(shape: tuple[int, ...], dtype: torch.dtype | None, gen: torch.Generator) -> torch.Tensor:
    """Random contents of a cache pool: floats (float32 where the graph's dtype applies), valid FP8
    codes for uint8 pools, positive scales for float32 scale pools."""
    from dsa_export.hf.kv_quant import fp8_codes

    values = torch.randn(*shape, generator=gen)
    if dtype == torch.uint8:
        return fp8_codes(values * 100)
    if dtype == torch.float32:
        return values.abs() * 0.01 + 1e-3
    return values if dtype is None else values.to(dtype)


def hf_reference(path, *, graph: str = "prefill", layers: tuple[int, int] | None = None,
                 embed: bool | None = None, head: bool | None = None, dequantize_fp8: bool = False,
                 kv_cache: str = "") -> ModelReference:
    """The typed record of a checkpoint directory (or of an opened
    :class:`~dsa_export.hf.loader.HFCheckpoint`, whose files are not read again) and the graph to
    cut from it."""
    if graph not in GRAPHS:
        raise DSAUserError(f"graph '{graph}' is unknown; use one of {', '.join(GRAPHS)}.")
    ckpt = open_checkpoint(path)
    path = ckpt.path
    if layers is not None:
        layers = parse_layers(f"{layers[0]}:{layers[1]}", ckpt.num_layers)
        if layers == (0, ckpt.num_layers) and embed is None and head is None:
            embed = head = False  # an explicit 0:N slice still takes and returns hidden states
    fp8 = ("dequantize" if dequantize_fp8 else "keep") if ckpt.fp8 else ""
    if dequantize_fp8 and not ckpt.fp8:
        raise DSAUserError(f"'{path}' stores no FP8 weights; drop --dequantize-fp8.")
    kv_cache = check_kv_cache(kv_cache, graph)
    return ModelReference(
        "hf", path=str(Path(path).resolve()), sha256=ckpt.config_sha256, weights_sha256=ckpt.weights.fingerprint(),
        graph=graph, layers=layers, embed=embed, head=head, fp8=fp8, kv_cache=kv_cache,
    )


def check_reference(reference: ModelReference, checkpoint=None) -> None:
    """Refuse a checkpoint whose config or weights differ from the ones a file was exported from.

    ``checkpoint``: the reference's directory opened already (an
    :class:`~dsa_export.hf.loader.HFCheckpoint`): its config digest and shard headers are compared,
    no file is read again; None: the directory's files are read here."""
    from dsa_export.fileio import sha256_file
    from dsa_export.hf.checkpoint import SafetensorsCheckpoint

    path = Path(reference.path)
    if checkpoint is None and not (path / "config.json").is_file():
        raise DSAUserError(f"the checkpoint '{path}' recorded in the file is not there; pass its directory with "
                           "--reference DIR.")
    config_sha = checkpoint.config_sha256 if checkpoint is not None else sha256_file(path / "config.json")
    if reference.sha256 and config_sha != reference.sha256:
        raise DSAUserError(f"'{path / 'config.json'}' changed since the export; re-export, or pass the original "
                           "checkpoint with --reference DIR.")
    weights = checkpoint.weights if checkpoint is not None else SafetensorsCheckpoint(path)
    if reference.weights_sha256 and weights.fingerprint() != reference.weights_sha256:
        raise DSAUserError(f"the safetensors in '{path}' changed since the export; re-export, or pass the original "
                           "checkpoint with --reference DIR.")


class CheckpointWeights:
    """``{initializer name: source}`` of an export module, computed on first lookup.

    Names are the exporter's (``hf.<parameter name>``); a name outside the transformers model is
    not here and the exporter reports it.
    """

    def __init__(self, model, checkpoint, block_size: int):
        self.model, self.checkpoint, self.block_size = model, checkpoint, block_size
        self._cache: dict[str, Any] = {}

    def _name(self, key: str) -> str | None:
        return key[3:] if key.startswith("hf.") else None

    def __contains__(self, key: str) -> bool:
        name = self._name(key)
        if name is None or name.endswith("inv_freq"):
            return False
        try:
            self.model.get_parameter(name)
            return True
        except AttributeError:
            try:
                self.model.get_buffer(name)
                return True
            except AttributeError:
                return False

    def __getitem__(self, key: str):
        from dsa_export.hf.weights import RecipeSource, weight_recipes

        if key not in self._cache:
            if key not in self:
                raise KeyError(key)
            name = self._name(key)
            recipe = weight_recipes(self.model, self.checkpoint, [name], self.block_size)[name]
            self._cache[key] = RecipeSource(self.checkpoint, recipe, name)
        return self._cache[key]


def hf_source(reference: ModelReference, *, batch: int = 2, seq_len: int = 16, seed: int = 0,
              dtype: str | None = None, checkpoint=None) -> ModelSource:
    """The export module of ``reference`` on the meta device, with streaming weight sources.

    ``checkpoint``: the reference's directory opened already
    (:class:`~dsa_export.hf.loader.HFCheckpoint`), so that neither config.json nor a shard header
    is read again; by default the directory is opened here."""
    from dsa_export.hf.model import DSAExportModel
    from dsa_export.hf.weights import build_meta_model, checkpoint_block_size

    path = Path(reference.path)
    if checkpoint is None or checkpoint.path.resolve() != path.resolve():
        # Opened once here: the reference check and the export read this one handle (a missing
        # config.json is check_reference's to report).
        checkpoint = open_checkpoint(path) if (path / "config.json").is_file() else None
    check_reference(reference, checkpoint)
    ckpt, weights = checkpoint, checkpoint.weights
    dtype = dtype or checkpoint_dtype(ckpt.config)
    if dtype not in _TORCH_DTYPES:
        raise DSAUserError(f"dtype '{dtype}' is unknown; use one of {', '.join(_TORCH_DTYPES)}.")
    fp8_mode = reference.fp8 or "dequantize"
    model = build_meta_model(ckpt.config, weights, dtype=_TORCH_DTYPES[dtype], fp8=fp8_mode)
    wrapper = DSAExportModel(model, graph=reference.graph, layers=reference.layers, embed=reference.embed,
                             head=reference.head, kv_cache=reference.kv_cache)
    cfg = model.config
    block = checkpoint_block_size(ckpt.config)
    graph = reference.graph

    def make_inputs(b: int, s: int, seed: int, past: int = EXAMPLE_PAST) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        feed: dict[str, torch.Tensor] = {}
        p = past if graph == "decode" else 0
        if wrapper.embed:
            feed["input_ids"] = torch.randint(0, cfg.vocab_size, (b, s), generator=gen)
        else:
            # Hidden states of the scale the embedding produces (transformers initializes it with
            # std initializer_range; real checkpoints are of that order too).
            feed["hidden_states"] = torch.randn(b, s, cfg.hidden_size, generator=gen)
        if graph == "paged":
            feed.update(paged_example(b, s, past, gen))
        else:
            feed["attention_mask"] = torch.ones(b, p + s, dtype=torch.int64)
        if wrapper.needs_prev_indices:
            # A valid causal selection: each query's most recent index_topk positions.
            pos = torch.arange(s)[:, None] - torch.arange(cfg.index_topk)[None, :]
            feed["prev_topk_indices"] = torch.where(pos >= 0, pos, -1).to(torch.int32).expand(b, -1, -1).contiguous()
        pages = int(feed["block_table"].max()) + 1 if graph == "paged" else 0
        pools = wrapper.pool_shapes(pages) if graph == "paged" else {}
        for name in wrapper.input_names():
            if name[len("past_"):] in pools:
                feed[name] = example_pool(*pools[name[len("past_"):]], gen)
            elif name.startswith("past_latent_"):
                feed[name] = torch.randn(b, p, cfg.kv_lora_rank + cfg.qk_rope_head_dim, generator=gen)
            elif name.startswith("past_index_keys_"):
                feed[name] = torch.randn(b, p, cfg.index_head_dim, generator=gen)
        return feed

    axes: dict[str, dict[int, str]] = {}
    for name in wrapper.input_names():
        if "_pool_" in name:
            axes[name] = {0: "pages"}
        elif name in ("query_start", "query_lengths"):
            axes[name] = {0: "batch"}
        elif name == "block_table":
            axes[name] = {0: "batch", 1: "max_pages"}
        elif name.startswith("past_"):
            axes[name] = {0: "batch", 1: "past_sequence"}
        elif name == "attention_mask" and graph == "decode":
            axes[name] = {0: "batch", 1: "total_sequence"}
        else:
            axes[name] = {0: "batch", 1: "sequence"}

    def load_transformers():
        from dsa_export.hf.reference import load_reference

        return load_reference(path, ckpt.config, wrapper.start, wrapper.stop, embed=wrapper.embed, head=wrapper.head,
                              emits_indices=wrapper.emits_indices)

    def load_module():
        """Our export module with real float32 weights (the reference of decode graphs)."""
        from dsa_export.hf.reference import module_names
        from dsa_export.hf.weights import materialize

        real = build_meta_model(ckpt.config, weights, dtype=torch.float32, fp8="dequantize")
        materialize(real, module_names(wrapper.start, wrapper.stop, embed=wrapper.embed, head=wrapper.head),
                    weights, block)
        return DSAExportModel(real, graph=graph, layers=reference.layers, embed=reference.embed,
                              head=reference.head, kv_cache=reference.kv_cache).eval()

    return ModelSource(
        reference=reference,
        module=wrapper,
        example_inputs=make_inputs(batch, seq_len, seed),
        output_names=wrapper.output_names(),
        config=cfg.to_dict(),
        input_names=wrapper.input_names(),
        dynamic_axes=axes,
        # transformers (only the graph's layers, loaded streamed) is the reference of prefill
        # graphs, whole or sliced; a decode or paged step is compared with our module (itself
        # tested against transformers' generate).
        reference_loader=load_transformers if graph == "prefill" else None,
        make_inputs=make_inputs,
        fixed_dtype_inputs=tuple("past_" + name for name, (_, pool_dtype) in wrapper.pool_shapes(1).items()
                                 if pool_dtype == torch.float32) if graph == "paged" else (),
        weights=CheckpointWeights(wrapper.hf, weights, block),
        cast=False,
        keep_weight_layout=True,
        dtype=dtype,
        min_opset=_fp8_opset(model),
        module_loader=load_module,
    )


def paged_example(b: int, s: int, past: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Control inputs of a paged call: every row has ``past`` cached and ``s`` new tokens (one start
    position, which validation's near-tie verdict takes; ragged rows are tested against
    transformers' generate), its pages in shuffled order (page 0 stays scratch) and unused -1
    table entries."""
    starts = [past] * b
    counts = [s] * b
    need = [-(-(st + s) // PAGE_SIZE) for st in starts]  # pages of each row's positions < start + S
    blocks = max(need) + 2
    order = (torch.randperm(sum(need), generator=gen) + 1).tolist()
    table = torch.full((b, blocks), -1, dtype=torch.int32)
    for row, n in enumerate(need):
        table[row, :n] = torch.tensor(order[:n], dtype=torch.int32)
        order = order[n:]
    return {"query_start": torch.tensor(starts, dtype=torch.int32),
            "query_lengths": torch.tensor(counts, dtype=torch.int32), "block_table": table}


def _fp8_opset(model) -> int | None:
    """Opset 21 when any weight stays FP8 (blocked DequantizeLinear and the FP8 experts body)."""
    import torch

    from dsa_export.ops.quant import FP8_MIN_OPSET

    return FP8_MIN_OPSET if any(p.dtype == torch.float8_e4m3fn for p in model.parameters()) else None
