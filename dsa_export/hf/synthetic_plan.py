"""What a synthetic DeepSeek-V3.2 / GLM-5 checkpoint holds, and its values: the plan half.

:func:`plan_checkpoint` decides the config.json and every tensor (name, shape, stored dtype, how its
values are drawn) before a byte is written; :class:`CheckpointPlan` regenerates any tensor on its
own. :mod:`dsa_export.hf.synthetic` writes a plan to disk (its docstring gives the published-format
facts both halves follow and their sources). Importing this module loads neither torch nor
transformers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

from dsa_export.errors import DSAUserError, require

KINDS = ("deepseek_v32", "glm_moe_dsa")
PRECISIONS = ("bf16", "fp8")
FP8_BLOCK = 128
FP8_MAX = 448.0
#: Shard size limit; the published shards average 4.2 GB (DeepSeek) and 5.4 GB (GLM-5.2-FP8).
DEFAULT_SHARD_BYTES = 5 * 10**9
#: Values drawn per block of rows (64 MB of float32).
CHUNK_VALUES = 1 << 24
HF_INSTALL = 'pip install "dsa-export[hf]"'

DTYPE_BYTES = {"F32": 4, "BF16": 2, "F8_E4M3": 1}
ARCHITECTURES = {"deepseek_v32": "DeepseekV32ForCausalLM", "glm_moe_dsa": "GlmMoeDsaForCausalLM"}
_GLM_EOS = [154820, 154827, 154829]
_DEEPSEEK_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                  "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
                  "mscale": 1.0, "mscale_all_dim": 1.0}
_GLM_ROPE = {"rope_theta": 1000000.0, "rope_type": "default"}
# Set through write_checkpoint's own arguments, or fixed by the published architecture.
_RESERVED = {"num_hidden_layers": "layers", "first_k_dense_replace": "dense_layers",
             "n_routed_experts": "experts", "vocab_size": "vocab_size", "index_topk": "index_topk",
             "mlp_layer_types": "dense_layers", "layer_types": None, "head_dim": None,
             "tie_word_embeddings": None, "attention_bias": None, "mlp_bias": None}
_GLM_SCHEDULE_KEYS = ("index_topk_freq", "index_skip_topk_offset", "index_topk_pattern")

#: Narrow widths for fast tests: every projection dimension a multiple of 128, because
#: transformers' FP8 dequantization derives the block size from the scale grid (see docs).
NARROW: dict[str, dict] = {
    "deepseek_v32": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
                         num_attention_heads=2, num_key_value_heads=2, q_lora_rank=256,
                         kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=128, v_head_dim=64,
                         index_n_heads=16, index_head_dim=256),
    "glm_moe_dsa": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
                        num_attention_heads=2, num_key_value_heads=2, q_lora_rank=256,
                        kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=128, v_head_dim=128,
                        index_n_heads=16, index_head_dim=256),
}


@dataclass(frozen=True)
class StoredTensor:
    """One stored tensor: its name, shape, safetensors dtype and how its values are made."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    init: str  # "normal", "ones" or "zeros"
    layer: int | None = None  # model.layers index; None for embeddings and head
    std: float = 0.0
    fp8: bool = False  # stored as F8_E4M3 with a "<name>_scale_inv" companion
    scale_of: str | None = None  # for a weight_scale_inv: the weight it belongs to

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class CheckpointPlan:
    """Everything a checkpoint will hold, known before any byte is written."""

    kind: str
    precision: str
    seed: int
    config: dict  # the config.json content
    generation_config: dict
    tensors: tuple[StoredTensor, ...]
    shard_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def layer_bytes(self) -> tuple[int, ...]:
        """Bytes of each ``model.layers.N`` (the MTP layer last when planned)."""
        count = 1 + max((t.layer for t in self.tensors if t.layer is not None), default=-1)
        sizes = [0] * count
        for t in self.tensors:
            if t.layer is not None:
                sizes[t.layer] += t.nbytes
        return tuple(sizes)

    @property
    def embedding_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors if t.name == "model.embed_tokens.weight")

    @property
    def head_bytes(self) -> int:
        """``lm_head`` and the final norm."""
        return sum(t.nbytes for t in self.tensors if t.name in ("lm_head.weight", "model.norm.weight"))

    def shards(self) -> list[list[StoredTensor]]:
        """Tensors per shard in module order, filled greedily; a weight stays with its scale."""
        units: list[list[StoredTensor]] = []
        for t in self.tensors:
            if t.scale_of is not None:
                units[-1].append(t)
            else:
                units.append([t])
        shards: list[list[StoredTensor]] = [[]]
        size = 0
        for unit in units:
            unit_bytes = sum(t.nbytes for t in unit)
            if shards[-1] and size + unit_bytes > self.shard_bytes:
                shards.append([])
                size = 0
            shards[-1].extend(unit)
            size += unit_bytes
        return shards

    def shard_names(self) -> list[str]:
        n = len(self.shards())
        width = 6 if self.kind == "deepseek_v32" else 5
        return [f"model-{i:05d}-of-{n:0{width}d}.safetensors" for i in range(1, n + 1)]

    def spec(self, name: str) -> StoredTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def tensor(self, name: str):
        """Regenerate one stored tensor (its stored dtype) exactly as :func:`write_checkpoint` wrote it."""
        import torch

        spec = self.spec(name)
        if spec.scale_of is not None:
            _, scales = _join(_quantized_blocks(self.spec(spec.scale_of), self))
            return scales
        if spec.fp8:
            quant, _ = _join(_quantized_blocks(spec, self))
            return quant
        return torch.cat([block.reshape(-1) for block in _stored_blocks(spec, self)]).reshape(spec.shape)


# -- planning ---------------------------------------------------------------------------------------

def plan_checkpoint(kind: str, *, layers: int, dense_layers: int, experts: int, precision: str = "bf16",
                    vocab_size: int | None = None, shard_bytes: int = DEFAULT_SHARD_BYTES, seed: int = 0,
                    index_topk: int | None = None, mtp: bool = False, **config_overrides) -> CheckpointPlan:
    """The config and tensor inventory :func:`write_checkpoint` would write (nothing is written)."""
    if kind not in KINDS:
        raise DSAUserError(f"kind '{kind}' is unknown; use one of {', '.join(KINDS)}.")
    if precision not in PRECISIONS:
        raise DSAUserError(f"precision '{precision}' is unknown; use one of {', '.join(PRECISIONS)}.")
    if layers < 1:
        raise DSAUserError(f"layers={layers}: a checkpoint needs at least one layer.")
    if not 0 <= dense_layers <= layers:
        raise DSAUserError(f"dense_layers={dense_layers} must lie between 0 and layers={layers}.")
    if shard_bytes < 1:
        raise DSAUserError(f"shard_bytes={shard_bytes} must be positive.")
    has_moe = dense_layers < layers or mtp
    if has_moe and experts < 2:
        raise DSAUserError(f"experts={experts}: MoE layers need at least 2 routed experts (the router "
                           "scores groups by their two best experts).")
    config = _config(kind, layers=layers, dense_layers=dense_layers, experts=max(experts, 2),
                     precision=precision, vocab_size=vocab_size, index_topk=index_topk, mtp=mtp,
                     overrides=config_overrides)
    generation = {"_from_model_config": True, "bos_token_id": config["bos_token_id"],
                  "eos_token_id": config["eos_token_id"]}
    if config.get("pad_token_id") is not None:
        generation["pad_token_id"] = config["pad_token_id"]
    return CheckpointPlan(kind=kind, precision=precision, seed=seed, config=config,
                          generation_config=generation, tensors=tuple(_inventory(kind, config, precision, mtp)),
                          shard_bytes=shard_bytes)


def _config(kind, *, layers, dense_layers, experts, precision, vocab_size, index_topk, mtp, overrides) -> dict:
    transformers = require("transformers", "Writing synthetic checkpoints", HF_INSTALL)
    cls = transformers.DeepseekV32Config if kind == "deepseek_v32" else transformers.GlmMoeDsaConfig
    fields = set(vars(cls).get("__annotations__", {}))
    allowed = fields | (set(_GLM_SCHEDULE_KEYS) if kind == "glm_moe_dsa" else set())
    for key in overrides:
        if key in _RESERVED:
            hint = f"pass {_RESERVED[key]}= instead" if _RESERVED[key] else "the published architecture fixes it"
            raise DSAUserError(f"config field '{key}' cannot be overridden here; {hint}.")
        if key not in allowed:
            raise DSAUserError(f"'{key}' is not a {cls.__name__} field; check its spelling.")
    default = cls()
    per_token = overrides.pop("num_experts_per_tok", min(default.num_experts_per_tok, max(1, experts // 2)))
    if kind == "deepseek_v32":
        groups, topk_groups = _expert_groups(experts, per_token)
    else:  # GLM-5 routes without group limits (n_group = topk_group = 1)
        groups, topk_groups = default.n_group, default.topk_group
    kwargs = dict(num_hidden_layers=layers, first_k_dense_replace=dense_layers, n_routed_experts=experts,
                  num_experts_per_tok=per_token, n_group=overrides.pop("n_group", groups),
                  topk_group=overrides.pop("topk_group", topk_groups),
                  vocab_size=vocab_size or default.vocab_size, index_topk=index_topk or default.index_topk,
                  rope_parameters=dict(_DEEPSEEK_YARN if kind == "deepseek_v32" else _GLM_ROPE))
    if kind == "glm_moe_dsa" and kwargs["vocab_size"] > max(_GLM_EOS):
        kwargs.update(eos_token_id=list(_GLM_EOS), pad_token_id=_GLM_EOS[0])
    kwargs.update(overrides)
    if "num_attention_heads" in overrides and "num_key_value_heads" not in overrides:
        # The published configs have one key/value head per attention head (MLA); keep that.
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    try:
        cfg = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DSAUserError(f"{cls.__name__} rejects these settings: {first}") from exc
    _check_routing(cfg)
    if cfg.qk_rope_head_dim > cfg.index_head_dim:
        raise DSAUserError(f"qk_rope_head_dim={cfg.qk_rope_head_dim} exceeds index_head_dim="
                           f"{cfg.index_head_dim}; the indexer rotates its leading rope dims.")
    return _config_json(kind, cfg, precision, mtp, overrides, transformers.__version__)


def _expert_groups(experts: int, per_token: int) -> tuple[int, int]:
    """DeepSeek-V3.2 routes within 4 of 8 groups of 32 experts; keep that shape for fewer experts.

    ``n_group`` is the largest divisor of ``experts`` up to 8 that leaves at least 2 experts per
    group (the router ranks groups by their two best scores); ``topk_group`` is half of the groups
    (as 4 of 8), raised if needed so the chosen groups hold ``num_experts_per_tok`` experts.
    """
    groups = max((g for g in range(1, 9) if experts % g == 0 and experts // g >= 2), default=1)
    topk_groups = max(1, groups // 2, math.ceil(per_token / (experts // groups)))
    return groups, min(groups, topk_groups)


def _check_routing(cfg) -> None:
    e, k, g, tg = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
    if not 1 <= k <= e:
        raise DSAUserError(f"num_experts_per_tok={k} must lie between 1 and the {e} routed experts.")
    if e % g or e // g < 2:
        raise DSAUserError(f"n_group={g} must divide the {e} routed experts into groups of at least 2.")
    if not 1 <= tg <= g or tg * (e // g) < k:
        raise DSAUserError(f"topk_group={tg} of {g} groups must hold num_experts_per_tok={k} experts.")


def _config_json(kind, cfg, precision, mtp, overrides, version) -> dict:
    """config.json as published: DeepSeek's transformers-4 style keys, GLM's transformers-5 ones."""
    common = ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "n_shared_experts", "n_routed_experts",
              "routed_scaling_factor", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim",
              "qk_nope_head_dim", "n_group", "topk_group", "num_experts_per_tok", "first_k_dense_replace",
              "norm_topk_prob", "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps",
              "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings",
              "attention_bias", "attention_dropout", "index_topk", "index_head_dim", "index_n_heads"]
    out = {"architectures": [ARCHITECTURES[kind]], "model_type": kind}
    out.update({key: getattr(cfg, key) for key in common})
    out.update(ep_size=1, moe_layer_freq=1, num_nextn_predict_layers=1 if mtp else 0,
               scoring_func="sigmoid", topk_method="noaux_tc")
    rope = dict(cfg.rope_parameters)
    if kind == "deepseek_v32":
        if rope.get("rope_type") == "yarn" and "rope_parameters" not in overrides:
            out["rope_theta"] = rope.pop("rope_theta")
            rope.pop("rope_type")
            out["rope_scaling"] = {**rope, "type": "yarn"}
        else:
            out["rope_parameters"] = rope
        out["torch_dtype"] = "bfloat16"
    else:
        out.update(rope_parameters=rope, dtype="bfloat16", rope_interleave=True, indexer_rope_interleave=True,
                   pretraining_tp=1, qk_head_dim=cfg.qk_nope_head_dim + cfg.qk_rope_head_dim,
                   mlp_layer_types=list(cfg.mlp_layer_types))
        if any(key in overrides for key in (*_GLM_SCHEDULE_KEYS, "indexer_types")):
            out["indexer_types"] = list(cfg.indexer_types)
            for key in _GLM_SCHEDULE_KEYS:
                if key in overrides:
                    out[key] = overrides[key]
    for key, value in overrides.items():
        out.setdefault(key, getattr(cfg, key, value))
    if precision == "fp8":
        quant = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                 "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
        if kind == "deepseek_v32":
            quant["scale_fmt"] = "ue8m0"
        else:
            quant["modules_to_not_convert"] = _glm_unquantized_modules(cfg, mtp)
        out["quantization_config"] = quant
    out["transformers_version"] = version
    return out


def _glm_unquantized_modules(cfg, mtp: bool) -> list[str]:
    """GLM-5.2-FP8 lists every module it keeps in bf16/fp32 (norms, router, indexer head weights)."""
    n = cfg.num_hidden_layers
    names = ["lm_head", "model.embed_tokens", "model.norm"]
    for i in range(n + (1 if mtp else 0)):
        p = f"model.layers.{i}"
        names += [f"{p}.input_layernorm", f"{p}.post_attention_layernorm", f"{p}.self_attn.q_a_layernorm",
                  f"{p}.self_attn.kv_a_layernorm"]
        if i >= n or cfg.mlp_layer_types[i] == "sparse":
            names += [f"{p}.mlp.gate", f"{p}.mlp.gate.e_score_correction_bias"]
        if i >= n or cfg.indexer_types[i] == "full":
            names += [f"{p}.self_attn.indexer.weights_proj", f"{p}.self_attn.indexer.k_norm",
                      f"{p}.self_attn.indexer.k_norm.bias"]
        if i >= n:
            names += [f"{p}.enorm", f"{p}.hnorm", f"{p}.eh_proj", f"{p}.shared_head.norm"]
    return names


def _inventory(kind: str, c: dict, precision: str, mtp: bool) -> Iterator[StoredTensor]:
    std = c["initializer_range"]
    h, vocab = c["hidden_size"], c["vocab_size"]
    k_norm_dtype = "F32" if kind == "deepseek_v32" else "BF16"
    n = c["num_hidden_layers"]
    indexer_types = c.get("indexer_types") or ["full"] * n

    def linear(name, out_dim, in_dim, layer, quantizable=True):
        fp8 = quantizable and precision == "fp8"
        yield StoredTensor(name, (out_dim, in_dim), "F8_E4M3" if fp8 else "BF16", "normal", layer, std, fp8)
        if fp8:
            scale = (math.ceil(out_dim / FP8_BLOCK), math.ceil(in_dim / FP8_BLOCK))
            yield StoredTensor(name + "_scale_inv", scale, "F32", "scale", layer, scale_of=name)

    def norm(name, dim, layer, dtype="BF16", init="ones"):
        yield StoredTensor(name, (dim,), dtype, init, layer)

    def mlp(p, inter, layer):
        yield from linear(f"{p}.gate_proj.weight", inter, h, layer)
        yield from linear(f"{p}.up_proj.weight", inter, h, layer)
        yield from linear(f"{p}.down_proj.weight", h, inter, layer)

    def decoder_layer(i, sparse, full_indexer):
        p = f"model.layers.{i}"
        heads, nope, rope, v = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                                c["v_head_dim"])
        q_lora, kv_lora = c["q_lora_rank"], c["kv_lora_rank"]
        yield from norm(f"{p}.input_layernorm.weight", h, i)
        yield from linear(f"{p}.self_attn.q_a_proj.weight", q_lora, h, i)
        yield from norm(f"{p}.self_attn.q_a_layernorm.weight", q_lora, i)
        yield from linear(f"{p}.self_attn.q_b_proj.weight", heads * (nope + rope), q_lora, i)
        yield from linear(f"{p}.self_attn.kv_a_proj_with_mqa.weight", kv_lora + rope, h, i)
        yield from norm(f"{p}.self_attn.kv_a_layernorm.weight", kv_lora, i)
        yield from linear(f"{p}.self_attn.kv_b_proj.weight", heads * (nope + v), kv_lora, i)
        yield from linear(f"{p}.self_attn.o_proj.weight", h, heads * v, i)
        if full_indexer:
            ih, idim = c["index_n_heads"], c["index_head_dim"]
            yield from linear(f"{p}.self_attn.indexer.wq_b.weight", ih * idim, q_lora, i)
            yield from linear(f"{p}.self_attn.indexer.wk.weight", idim, h, i)
            yield from norm(f"{p}.self_attn.indexer.k_norm.weight", idim, i, k_norm_dtype)
            yield from norm(f"{p}.self_attn.indexer.k_norm.bias", idim, i, k_norm_dtype, "zeros")
            yield from linear(f"{p}.self_attn.indexer.weights_proj.weight", ih, h, i, quantizable=False)
        yield from norm(f"{p}.post_attention_layernorm.weight", h, i)
        if not sparse:
            yield from mlp(f"{p}.mlp", c["intermediate_size"], i)
            return
        experts, moe_inter = c["n_routed_experts"], c["moe_intermediate_size"]
        for e in range(experts):
            yield from mlp(f"{p}.mlp.experts.{e}", moe_inter, i)
        yield from linear(f"{p}.mlp.gate.weight", experts, h, i, quantizable=False)
        yield StoredTensor(f"{p}.mlp.gate.e_score_correction_bias", (experts,), "F32", "normal", i, std)
        yield from mlp(f"{p}.mlp.shared_experts", moe_inter * c["n_shared_experts"], i)

    yield StoredTensor("model.embed_tokens.weight", (vocab, h), "BF16", "normal", None, std)
    for i in range(n):
        yield from decoder_layer(i, i >= c["first_k_dense_replace"], indexer_types[i] == "full")
    yield from norm("model.norm.weight", h, None)
    yield from linear("lm_head.weight", vocab, h, None, quantizable=False)
    if mtp:  # DeepSeek-V3's README_WEIGHTS.md: the MTP module is layer num_hidden_layers
        p = f"model.layers.{n}"
        if kind == "deepseek_v32":
            yield StoredTensor(f"{p}.embed_tokens.weight", (vocab, h), "BF16", "normal", n, std)
        yield from norm(f"{p}.enorm.weight", h, n)
        yield from norm(f"{p}.hnorm.weight", h, n)
        yield from linear(f"{p}.eh_proj.weight", h, 2 * h, n, quantizable=False)
        yield from decoder_layer(n, True, True)
        yield from norm(f"{p}.shared_head.norm.weight", h, n)
        if kind == "deepseek_v32":
            yield from linear(f"{p}.shared_head.head.weight", vocab, h, n, quantizable=False)


# -- values -----------------------------------------------------------------------------------------

def _block_rows(shape: tuple[int, ...]) -> int:
    """Rows per drawn block: a multiple of the FP8 block, about CHUNK_VALUES values."""
    cols = shape[1] if len(shape) == 2 else 1
    return max(FP8_BLOCK, CHUNK_VALUES // cols // FP8_BLOCK * FP8_BLOCK)


def _block_seed(seed: int, name: str, block: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{name}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _value_blocks(spec: StoredTensor, plan: CheckpointPlan):
    """float32 blocks of rows (the whole tensor for 1-D ones) holding the values before storage rounding."""
    import torch

    if len(spec.shape) == 1:
        rows, cols, step = 1, spec.shape[0], 1
    else:
        (rows, cols), step = spec.shape, _block_rows(spec.shape)
    for block, start in enumerate(range(0, rows, step)):
        shape = (min(step, rows - start), cols) if len(spec.shape) == 2 else spec.shape
        if spec.init == "ones":
            yield torch.ones(shape)
        elif spec.init == "zeros":
            yield torch.zeros(shape)
        else:
            gen = torch.Generator().manual_seed(_block_seed(plan.seed, spec.name, block))
            yield torch.empty(shape).normal_(0.0, spec.std, generator=gen)


def _stored_blocks(spec: StoredTensor, plan: CheckpointPlan):
    import torch

    dtype = {"F32": torch.float32, "BF16": torch.bfloat16}[spec.dtype]
    for block in _value_blocks(spec, plan):
        yield block.to(dtype)


def _quantized_blocks(spec: StoredTensor, plan: CheckpointPlan):
    """(fp8 block, its float32 scales) for a quantized weight, drawn as bf16 first."""
    import torch

    ue8m0 = plan.config.get("quantization_config", {}).get("scale_fmt") == "ue8m0"
    for block in _value_blocks(spec, plan):
        yield quantize_fp8(block.to(torch.bfloat16).float(), ue8m0=ue8m0)


def _join(blocks):
    import torch

    quants, scales = zip(*blocks)
    return torch.cat(quants), torch.cat(scales)


def quantize_fp8(x, *, block: int = FP8_BLOCK, ue8m0: bool = False):
    """``(weight e4m3, weight_scale_inv float32)`` of a 2-D float tensor, one scale per block x block.

    The scale is the block's amax / 448 (partial edge blocks count as zero-padded; an all-zero
    block gets scale 1); ``ue8m0`` rounds it up to a power of two, as DeepSeek's ``scale_fmt``.
    """
    import torch

    rows, cols = x.shape
    rb, cb = math.ceil(rows / block), math.ceil(cols / block)
    padded = x
    if (rb * block, cb * block) != (rows, cols):
        padded = x.new_zeros(rb * block, cb * block)
        padded[:rows, :cols] = x
    blocks = padded.reshape(rb, block, cb, block)
    amax = torch.maximum(blocks.amax(dim=(1, 3)), -blocks.amin(dim=(1, 3)))  # |x| max without a copy
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    quant = (blocks / scale[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX).reshape(rb * block, cb * block)
    return quant[:rows, :cols].to(torch.float8_e4m3fn), scale.to(torch.float32)


def dequantize_fp8(weight, scale_inv, *, block: int = FP8_BLOCK):
    """float32 ``weight * weight_scale_inv`` per block (the published dequantization formula)."""
    rows, cols = weight.shape
    expanded = scale_inv.float().repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
    return weight.float() * expanded
