"""transformers modules without weights, and the checkpoint tensors each of their parameters needs.

Nothing here loads a whole model. :func:`build_meta_model` builds the transformers
``*ForCausalLM`` on the meta device (no memory, any size) in the export's precision: the export
dtype for most weights, float32 where transformers keeps float32 (``_keep_in_fp32_modules``: the
indexer's ``weights_proj``, the router), and FP8 e4m3 plus block scales where the checkpoint stores
FP8 and the user did not ask to dequantize. :func:`weight_recipes` says, per parameter, which
checkpoint tensors make it (transformers stacks the per-expert tensors of the checkpoint into
``gate_up_proj [E, 2I, H]`` / ``down_proj [E, H, I]``; in byte order that is the per-expert
tensors one after the other). A :class:`RecipeSource` streams one parameter in row blocks, so the
exporter writes weights straight from safetensors into ONNX external data, and
:func:`materialize` fills the few modules a reference needs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from dsa_export.errors import DSAUserError
from dsa_export.hf.checkpoint import SafetensorsCheckpoint

#: Precision of FP8 weights in an export: ``keep`` (FP8 + scales, dequantized in the graph) or
#: ``dequantize`` (plain weights in the export dtype).
FP8_MODES = ("keep", "dequantize")
_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<proj>gate_up_proj|down_proj)(?P<scale>_scale_inv)?$")
#: Row blocks of at most this many bytes are read, converted and written at a time.
BLOCK_BYTES = 256 << 20


class FP8Linear(nn.Module):
    """A Linear whose weight stays FP8 e4m3 with one float32 scale per ``block_size`` block.

    Parameter names match the checkpoint (``weight``, ``weight_scale_inv``) so weights stream in by
    key; the graph dequantizes through ``dsa::dequantize_fp8`` (blocked DequantizeLinear in ONNX).
    """

    def __init__(self, in_features: int, out_features: int, block_size: int = 128, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features, self.block_size = in_features, out_features, block_size
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn),
                                   requires_grad=False)
        self.weight_scale_inv = nn.Parameter(
            torch.empty(math.ceil(out_features / block_size), math.ceil(in_features / block_size)),
            requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight (one op in the graph)."""
        from dsa_export.ops.quant import dequantize_fp8

        return dequantize_fp8(self.weight, self.weight_scale_inv, self.block_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.dequantized_weight().to(x.dtype),
                                    None if self.bias is None else self.bias.to(x.dtype))


def linear_weight(module: nn.Module) -> torch.Tensor:
    """The (dequantized) weight matrix of a Linear or :class:`FP8Linear`."""
    return module.dequantized_weight() if isinstance(module, FP8Linear) else module.weight


@dataclass(frozen=True)
class WeightRecipe:
    """One module tensor made from checkpoint tensors.

    Attributes:
        keys: checkpoint tensors whose bytes, one after the other, form the tensor (one key, or
            every expert's tensors for the stacked expert weights).
        shape: the module tensor's shape.
        dtype: the module tensor's dtype (the stored dtype is converted on reading).
        scale_keys: for FP8 tensors written dequantized, the ``weight_scale_inv`` of each key.
        block_size: FP8 scale block.
    """

    keys: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    scale_keys: tuple[str, ...] | None = None
    block_size: int = 128

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


class RecipeSource:
    """Streams one :class:`WeightRecipe` from the checkpoint in row blocks."""

    def __init__(self, checkpoint: SafetensorsCheckpoint, recipe: WeightRecipe, name: str = ""):
        self.checkpoint, self.recipe, self.name = checkpoint, recipe, name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.recipe.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.recipe.dtype

    def chunks(self, max_bytes: int = BLOCK_BYTES) -> Iterator[torch.Tensor]:
        """Contiguous pieces in the target dtype whose bytes, concatenated, are the tensor."""
        recipe, ckpt = self.recipe, self.checkpoint
        for index, key in enumerate(recipe.keys):
            if recipe.scale_keys is None:
                for block in ckpt.iter_row_blocks(key, max_bytes):
                    yield block.to(recipe.dtype).contiguous()
                continue
            from dsa_export.ops.quant import dequantize_fp8_blocks

            # Dequantize in whole scale blocks of rows.
            info, b = ckpt.info(key), recipe.block_size
            rows = info.shape[0]
            step = max(b, (max_bytes // max(1, 4 * info.shape[1])) // b * b)
            scale_key = recipe.scale_keys[index]
            for start in range(0, rows, step):
                stop = min(rows, start + step)
                weight = ckpt.read_rows(key, start, stop)
                scale = ckpt.read_rows(scale_key, start // b, math.ceil(stop / b))
                yield dequantize_fp8_blocks(weight, scale, b, recipe.dtype).contiguous()

    def materialize(self) -> torch.Tensor:
        """The whole tensor (for small tensors and for references)."""
        parts = [chunk.reshape(-1) for chunk in self.chunks()]
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        return flat.reshape(self.recipe.shape)


# ---------------------------------------------------------------------------------------------
# Building the model without weights


def _config(path, checkpoint_config: dict):
    """transformers' config of a checkpoint config already checked by
    :func:`dsa_export.hf.config_schema.validate_config`; whatever transformers still refuses in it
    (a field the schema does not know) is the checkpoint's fault, reported as such."""
    import transformers

    config = dict(checkpoint_config)
    config.pop("quantization_config", None)  # handled here, not by transformers' quantizers
    try:
        cls = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    except Exception as exc:  # noqa: BLE001 - transformers' strict dataclass checks raise several kinds
        raise _config_refused(path, exc) from exc
    cls._attn_implementation = "eager"
    return cls


def _config_refused(path, exc: BaseException) -> DSAUserError:
    first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return DSAUserError(f"transformers refuses the config.json of '{path}' ({first}); fix that field or use the "
                        "config.json published with the checkpoint.")


def _keep_fp32_patterns(model) -> tuple[str, ...]:
    return tuple(getattr(model, "_keep_in_fp32_modules", None) or ()) + tuple(
        getattr(model, "_keep_in_fp32_modules_strict", None) or ())


def _keeps_fp32(name: str, patterns: tuple[str, ...]) -> bool:
    # transformers matches these names as dotted sub-paths of the parameter's module name.
    return any(re.search(rf"(^|\.){re.escape(p)}($|\.)", name) for p in patterns)


def build_meta_model(checkpoint_config: dict, checkpoint: SafetensorsCheckpoint, *, dtype: torch.dtype,
                     fp8: str = "keep"):
    """The transformers ``*ForCausalLM`` of the checkpoint on the meta device, in the export's
    precision, with FP8 modules where the checkpoint stores FP8 weights and ``fp8 == "keep"``.

    The rotary embedding is built for real on the CPU: its ``inv_freq`` buffer is computed from the
    config, not stored in the checkpoint.
    """
    import transformers

    config = _config(checkpoint.path, checkpoint_config)
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise _config_refused(checkpoint.path, exc) from exc
    model.eval()
    patterns = _keep_fp32_patterns(model)
    for name, param in model.named_parameters():
        param.data = param.data.to(torch.float32 if _keeps_fp32(name, patterns) else dtype)
    if fp8 == "keep":
        _use_fp8_modules(model, checkpoint, checkpoint_block_size(checkpoint_config))
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    # Every tensor's shape against the module, from the headers alone: a lying header is refused
    # before anything is traced or read (a missing tensor is reported where a graph needs it).
    weight_recipes(model, checkpoint, block_size=checkpoint_block_size(checkpoint_config), missing_ok=True)
    return model


def _is_fp8(checkpoint: SafetensorsCheckpoint, key: str) -> bool:
    return (key in checkpoint and checkpoint.info(key).dtype == "F8_E4M3"
            and key.replace(".weight", ".weight_scale_inv") in checkpoint)


def _use_fp8_modules(model, checkpoint: SafetensorsCheckpoint, block: int) -> None:
    """Swap every Linear and expert stack whose checkpoint weights are FP8 for its FP8 form."""
    meta = torch.device("meta")
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and _is_fp8(checkpoint, f"{name}.weight"):
            parent_name, _, attr = name.rpartition(".")
            with meta:
                fp8 = FP8Linear(module.in_features, module.out_features, block, bias=module.bias is not None)
            setattr(model.get_submodule(parent_name), attr, fp8)
        elif hasattr(module, "gate_up_proj") and hasattr(module, "down_proj") and isinstance(
                getattr(module, "gate_up_proj"), nn.Parameter) and _is_fp8(
                checkpoint, f"{name}.0.gate_proj.weight"):
            e, two_i, h = module.gate_up_proj.shape
            i = module.down_proj.shape[2]
            with meta:
                module.gate_up_proj = nn.Parameter(torch.empty(e, two_i, h, dtype=torch.float8_e4m3fn),
                                                   requires_grad=False)
                module.down_proj = nn.Parameter(torch.empty(e, h, i, dtype=torch.float8_e4m3fn), requires_grad=False)
                # gate and up are each I rows: their block scales stack to ceil(2I/b) rows when b divides I.
                module.gate_up_proj_scale_inv = nn.Parameter(
                    torch.empty(e, 2 * math.ceil(two_i // 2 / block), math.ceil(h / block)), requires_grad=False)
                module.down_proj_scale_inv = nn.Parameter(
                    torch.empty(e, math.ceil(h / block), math.ceil(i / block)), requires_grad=False)
            module.block_size = block


# ---------------------------------------------------------------------------------------------
# Which checkpoint tensors make each parameter


def _expert_keys(prefix: str, proj: str, experts: int, suffix: str) -> tuple[str, ...]:
    parts = ("gate_proj", "up_proj") if proj == "gate_up_proj" else ("down_proj",)
    return tuple(f"{prefix}.{e}.{part}.weight{suffix}" for e in range(experts) for part in parts)


def weight_recipes(model, checkpoint: SafetensorsCheckpoint, names: list[str] | None = None,
                   block_size: int = 128, *, missing_ok: bool = False) -> dict[str, WeightRecipe]:
    """``{parameter name: recipe}`` for ``names`` (default: every parameter and persistent buffer).

    Every checkpoint tensor's shape (from its header) is checked against the module tensor it
    makes before anything is read. ``missing_ok`` leaves out the names whose tensors the
    checkpoint lacks instead of refusing them.
    """
    tensors = dict(model.named_parameters())
    tensors.update({n: b for n, b in model.named_buffers() if not n.endswith("inv_freq")})
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    recipes = {}
    for name in (names if names is not None else list(tensors)):
        tensor = tensors[name]
        shape, dtype = tuple(tensor.shape), tensor.dtype
        match = _EXPERT.match(name)
        if match:
            experts = shape[0]
            keys = _expert_keys(match["prefix"], match["proj"], experts, "_scale_inv" if match["scale"] else "")
        elif name == "lm_head.weight" and name not in checkpoint and tied:
            keys = ("model.embed_tokens.weight",)
        else:
            keys = (name,)
        if missing_ok and not all(key in checkpoint for key in keys):
            continue
        for key in keys:
            checkpoint.info(key)  # a clear error for a missing tensor
        scale_keys = None
        if dtype != torch.float8_e4m3fn and all(_is_fp8(checkpoint, k) for k in keys) and not name.endswith("_scale_inv"):
            scale_keys = tuple(k.replace(".weight", ".weight_scale_inv") for k in keys)
        # Each key's exact shape, before any data is read: a tensor with the right element count in
        # another layout (transposed) would otherwise stream in as scrambled weights.
        if match:  # every expert's tensors stacked: gate and up one after the other along the rows
            parts = 2 if match["proj"] == "gate_up_proj" else 1
            per_key, what = (shape[1] // parts, *shape[2:]), f"each expert's part of '{name}' {list(shape)}"
        else:
            per_key, what = shape, f"'{name}'"
        for key in keys:
            _check_shape(checkpoint, key, per_key, what)
        for key, scale_key in zip(keys, scale_keys or ()):
            rows, cols = checkpoint.info(key).shape  # 2-D: checked against the Linear above
            _check_shape(checkpoint, scale_key, (math.ceil(rows / block_size), math.ceil(cols / block_size)),
                         f"the FP8 block scales of '{key}'")
        recipes[name] = WeightRecipe(keys, shape, dtype, scale_keys, block_size)
    return recipes


def _check_shape(checkpoint: SafetensorsCheckpoint, key: str, want: tuple[int, ...], what: str) -> None:
    """Refuse checkpoint tensor ``key`` unless its header's shape is ``want``, what ``what`` needs."""
    got = tuple(checkpoint.info(key).shape)
    if got == tuple(want):
        return
    if len(got) > 1 and sorted(got) == sorted(want):
        how = " (the right dimensions in another order: stored transposed)"
    elif math.prod(got) == math.prod(want):
        how = " (as many values in another layout)"
    else:
        how = ""
    raise DSAUserError(
        f"checkpoint tensor '{key}' has shape {list(got)}{how}, but {what} of the model built from config.json "
        f"needs {list(want)}; config.json and the weights do not belong together, or that shard's header is wrong "
        "(re-download it)."
    )


def checkpoint_block_size(checkpoint_config: dict) -> int:
    """The FP8 scale block of a checked config (``weight_block_size`` is two equal numbers there)."""
    return ((checkpoint_config.get("quantization_config") or {}).get("weight_block_size") or [128])[0]


def materialize(model, modules: list[str], checkpoint: SafetensorsCheckpoint, block_size: int = 128) -> None:
    """Replace the meta tensors of the named submodules (and their children) by checkpoint data."""
    prefixes = tuple(m + "." for m in modules)
    names = [n for n, _ in model.named_parameters() if n.startswith(prefixes)]
    names += [n for n, _ in model.named_buffers() if n.startswith(prefixes) and not n.endswith("inv_freq")]
    for name, recipe in weight_recipes(model, checkpoint, names, block_size).items():
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        value = RecipeSource(checkpoint, recipe, name).materialize()
        if attr in owner._parameters:
            owner._parameters[attr] = nn.Parameter(value, requires_grad=False)
        else:
            owner._buffers[attr] = value

