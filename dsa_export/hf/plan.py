"""Stage planning: split a DSA model into contiguous pipeline stages that each fit one GPU.

A 671B DeepSeek-V3.2 fits no single GPU, so it is deployed as stages, one engine per GPU. The
planner answers from ``config.json`` (and, when the weights are present, only the headers of the
safetensors shards) with plain arithmetic: no torch, transformers or onnx import, so ``dsa-export
plan`` answers in about a second and the export pipeline can call :func:`plan_stages` before it
loads anything. Every formula is written out in ``docs/plan.md``.

A stage's memory is its weights + its decode caches at the profile maximum + the activations of a
prefill of ``max_seq`` tokens at ``max_batch`` + a fixed reserve for the CUDA/TensorRT context.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.hf.checkpoint import INDEX_NAME, read_header
from dsa_export.hf.loader import SUPPORTED_TYPES

GIB = 1 << 30
#: CUDA context, cuBLAS/cuDNN handles, TensorRT execution-context scratch and allocator slack per
#: GPU. A CUDA context alone takes 0.3-0.6 GiB on Hopper; 2 GiB leaves room for the rest.
DEFAULT_RESERVE_BYTES = 2 * GIB
DEFAULT_MAX_BATCH = 1
#: A common serving context; pass the maximum of the optimization profile you will build.
DEFAULT_MAX_SEQ = 8192
#: Bytes per element of the precisions an export can write (``dsa-export export --dtype``).
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
_CONFIG_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
#: The indexer plugin's workspace cap (plugins/dsaIndexerTopKPlugin/DSAIndexerTopK_PluginConfig.yaml).
INDEXER_WORKSPACE_CAP = 256 << 20
_INT64 = 8
_INT32 = 4
_FP32 = 4


# -- sizes -----------------------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int, what: str = "size", *, allow_zero: bool = False) -> int:
    """Bytes from ``141GiB``, ``80GB``, ``141 GiB`` or a plain byte count.

    Bare ``G``/``M`` are refused: GPU memory is quoted in both GiB (nvidia-smi) and GB (spec
    sheets), and the 7% between them decides whether a stage fits.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise DSAUsageError(
            f"{what} '{text}' is not a size; write it like 141GiB, 80GB, 512MiB or a number of bytes."
        )
    value = float(match.group(1)) * _UNITS[unit]
    if value < 1 and not (allow_zero and value == 0):
        raise DSAUsageError(f"{what} '{text}' is below one byte; give a positive size such as 141GiB.")
    return int(value)


def format_gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB"


# -- the model's geometry --------------------------------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    """The widths of config.json that decide memory, with per-layer types derived as transformers does."""

    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v_dim: int
    intermediate: int
    moe_intermediate: int
    routed_experts: int
    shared_experts: int
    experts_per_token: int
    index_heads: int
    index_dim: int
    index_topk: int
    attention_bias: bool
    mtp_layers: int
    mlp_types: tuple[str, ...]
    indexer_types: tuple[str, ...]
    storage_dtype: str  # fp32 / fp16 / bf16: the checkpoint's dtype for tensors that are not FP8
    fp8: bool
    fp8_block: tuple[int, int]

    @classmethod
    def from_config(cls, config: dict, where: str = "config.json") -> Geometry:
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_TYPES:
            raise DSAUserError(
                f"{where} describes a '{model_type}' model; the planner reads {' and '.join(SUPPORTED_TYPES)} configs."
            )

        def need(key: str) -> int:
            if config.get(key) is None:
                raise DSAUserError(f"{where} has no '{key}'; use the config.json published with the checkpoint.")
            return int(config[key])

        n = need("num_hidden_layers")
        dense = min(int(config.get("first_k_dense_replace", 3)), n)
        mlp_types = tuple(config.get("mlp_layer_types") or ["dense"] * dense + ["sparse"] * (n - dense))
        indexer_types = tuple(config.get("indexer_types") or _derive_indexer_types(config, model_type, n))
        if len(mlp_types) != n or len(indexer_types) != n:
            raise DSAUserError(f"{where} lists mlp_layer_types/indexer_types for other than its {n} layers; fix them.")
        quant = config.get("quantization_config") or {}
        fp8 = quant.get("quant_method") == "fp8"
        block = tuple(int(b) for b in quant.get("weight_block_size") or (128, 128))
        dtype_name = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
        return cls(
            model_type=model_type, vocab=need("vocab_size"), hidden=need("hidden_size"), layers=n,
            heads=need("num_attention_heads"), q_lora=need("q_lora_rank"), kv_lora=need("kv_lora_rank"),
            nope=need("qk_nope_head_dim"), rope=need("qk_rope_head_dim"), v_dim=need("v_head_dim"),
            intermediate=need("intermediate_size"), moe_intermediate=need("moe_intermediate_size"),
            routed_experts=need("n_routed_experts"), shared_experts=int(config.get("n_shared_experts") or 0),
            experts_per_token=need("num_experts_per_tok"), index_heads=need("index_n_heads"),
            index_dim=need("index_head_dim"), index_topk=need("index_topk"),
            attention_bias=bool(config.get("attention_bias", False)),
            mtp_layers=int(config.get("num_nextn_predict_layers") or 0),
            mlp_types=mlp_types, indexer_types=indexer_types,
            storage_dtype=_CONFIG_DTYPES.get(str(dtype_name), "bf16"), fp8=fp8, fp8_block=(block[0], block[1]),
        )


def _derive_indexer_types(config: dict, model_type: str, n: int) -> list[str]:
    """GLM-5's schedule of full and shared indexer layers, derived as transformers' GlmMoeDsaConfig does."""
    if model_type != "glm_moe_dsa":
        return ["full"] * n
    pattern = config.get("index_topk_pattern")
    if pattern is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    freq = max(int(config.get("index_topk_freq", 1)), 1)
    offset = int(config.get("index_skip_topk_offset", 2))
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]


# -- the tensor inventory from config.json -----------------------------------------------------------

@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor as config.json implies it.

    ``kind``: ``linear`` (stored FP8 with block scales in FP8 checkpoints), ``plain`` (kept in the
    checkpoint dtype: norms, router, the indexer's head weights, embeddings) or ``fp32`` (always
    float32: the router's score-correction bias).
    """

    key: str
    shape: tuple[int, ...]
    kind: str = "linear"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def layer_tensors(g: Geometry, i: int) -> list[TensorSpec]:
    """The tensors of decoder layer ``i``, keyed as transformers' save_pretrained and the releases write them."""
    p = f"model.layers.{i}"
    h, nh = g.hidden, g.heads
    out = [TensorSpec(f"{p}.input_layernorm.weight", (h,), "plain"),
           TensorSpec(f"{p}.post_attention_layernorm.weight", (h,), "plain")]
    a = f"{p}.self_attn"
    out += [TensorSpec(f"{a}.q_a_proj.weight", (g.q_lora, h)),
            TensorSpec(f"{a}.q_a_layernorm.weight", (g.q_lora,), "plain"),
            TensorSpec(f"{a}.q_b_proj.weight", (nh * (g.nope + g.rope), g.q_lora)),
            TensorSpec(f"{a}.kv_a_proj_with_mqa.weight", (g.kv_lora + g.rope, h)),
            TensorSpec(f"{a}.kv_a_layernorm.weight", (g.kv_lora,), "plain"),
            TensorSpec(f"{a}.kv_b_proj.weight", (nh * (g.nope + g.v_dim), g.kv_lora)),
            TensorSpec(f"{a}.o_proj.weight", (h, nh * g.v_dim))]
    if g.attention_bias:
        out += [TensorSpec(f"{a}.q_a_proj.bias", (g.q_lora,), "plain"),
                TensorSpec(f"{a}.kv_a_proj_with_mqa.bias", (g.kv_lora + g.rope,), "plain"),
                TensorSpec(f"{a}.o_proj.bias", (h,), "plain")]
    if i >= g.layers or g.indexer_types[i] == "full":  # the MTP layer always runs its own indexer
        x = f"{a}.indexer"
        out += [TensorSpec(f"{x}.wq_b.weight", (g.index_heads * g.index_dim, g.q_lora)),
                TensorSpec(f"{x}.wk.weight", (g.index_dim, h)),
                TensorSpec(f"{x}.k_norm.weight", (g.index_dim,), "plain"),
                TensorSpec(f"{x}.k_norm.bias", (g.index_dim,), "plain"),
                TensorSpec(f"{x}.weights_proj.weight", (g.index_heads, h), "plain")]
    m = f"{p}.mlp"
    if i < g.layers and g.mlp_types[i] == "dense":
        return out + _mlp(m, h, g.intermediate)
    out += [TensorSpec(f"{m}.gate.weight", (g.routed_experts, h), "plain"),
            TensorSpec(f"{m}.gate.e_score_correction_bias", (g.routed_experts,), "fp32")]
    for e in range(g.routed_experts):
        out += _mlp(f"{m}.experts.{e}", h, g.moe_intermediate)
    if g.shared_experts:
        out += _mlp(f"{m}.shared_experts", h, g.moe_intermediate * g.shared_experts)
    return out


def _mlp(prefix: str, hidden: int, inter: int) -> list[TensorSpec]:
    return [TensorSpec(f"{prefix}.gate_proj.weight", (inter, hidden)),
            TensorSpec(f"{prefix}.up_proj.weight", (inter, hidden)),
            TensorSpec(f"{prefix}.down_proj.weight", (hidden, inter))]


def embedding_tensors(g: Geometry) -> list[TensorSpec]:
    return [TensorSpec("model.embed_tokens.weight", (g.vocab, g.hidden), "plain")]


def head_tensors(g: Geometry) -> list[TensorSpec]:
    """Final norm and lm_head; a tied head is still a copy on the last stage's GPU."""
    return [TensorSpec("model.norm.weight", (g.hidden,), "plain"),
            TensorSpec("lm_head.weight", (g.vocab, g.hidden), "plain")]


def mtp_tensors(g: Geometry) -> list[TensorSpec]:
    """The unique weights of each multi-token-prediction layer, which transformers (and so we) ignore.

    DeepSeek's release also stores copies of the embedding and head under the MTP layer's prefix;
    those are counted only when the headers are read.
    """
    out: list[TensorSpec] = []
    for k in range(g.mtp_layers):
        i = g.layers + k
        p = f"model.layers.{i}"
        out += layer_tensors(g, i)
        out += [TensorSpec(f"{p}.enorm.weight", (g.hidden,), "plain"),
                TensorSpec(f"{p}.hnorm.weight", (g.hidden,), "plain"),
                TensorSpec(f"{p}.eh_proj.weight", (g.hidden, 2 * g.hidden), "plain"),
                TensorSpec(f"{p}.shared_head.norm.weight", (g.hidden,), "plain")]
    return out


def tensor_bytes(t: TensorSpec, g: Geometry, dtype: str | None) -> int:
    """Bytes of ``t`` as stored (``dtype`` None: FP8 kept, block scales included) or as exported in ``dtype``."""
    if dtype is not None:
        return t.numel * DTYPE_BYTES[dtype]
    if t.kind == "fp32":
        return t.numel * _FP32
    if t.kind == "linear" and g.fp8:
        rows, cols = t.shape
        blocks = math.ceil(rows / g.fp8_block[0]) * math.ceil(cols / g.fp8_block[1])
        return t.numel + blocks * _FP32
    return t.numel * DTYPE_BYTES[g.storage_dtype]


# -- weights per part: from the headers, else from the inventory -----------------------------------

@dataclass
class Weights:
    """Bytes and parameter counts of the embedding, each decoder layer and the head."""

    embedding: int
    layers: list[int]
    head: int
    parameters: list[int]  # per decoder layer
    embedding_parameters: int
    head_parameters: int
    ignored_bytes: int = 0
    ignored_parameters: int = 0
    source: str = "config.json"


def weights_from_config(g: Geometry, dtype: str | None) -> Weights:
    """Per-part bytes from the inventory; inventories are built once per distinct layer kind."""
    by_kind: dict[tuple[str, str], tuple[int, int]] = {}
    layers, params = [], []
    for i in range(g.layers):
        kind = (g.mlp_types[i], g.indexer_types[i])
        if kind not in by_kind:
            specs = layer_tensors(g, i)
            by_kind[kind] = (sum(tensor_bytes(t, g, dtype) for t in specs), sum(t.numel for t in specs))
        layers.append(by_kind[kind][0])
        params.append(by_kind[kind][1])
    emb, head, mtp = embedding_tensors(g), head_tensors(g), mtp_tensors(g)
    return Weights(
        embedding=sum(tensor_bytes(t, g, dtype) for t in emb), layers=layers,
        head=sum(tensor_bytes(t, g, dtype) for t in head), parameters=params,
        embedding_parameters=sum(t.numel for t in emb), head_parameters=sum(t.numel for t in head),
        ignored_bytes=sum(tensor_bytes(t, g, dtype) for t in mtp), ignored_parameters=sum(t.numel for t in mtp),
        source="config.json",
    )


def shard_files(path: Path) -> tuple[list[Path], list[str]]:
    """The shards of a checkpoint directory and the names the index lists but the directory lacks."""
    index = path / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DSAUserError(f"'{index}' is not a safetensors index (no weight_map); re-download it.") from exc
        names = sorted(set(weight_map.values()))
        return [path / n for n in names if (path / n).is_file()], [n for n in names if not (path / n).is_file()]
    return sorted(path.glob("*.safetensors")), []


_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")


def weights_from_headers(g: Geometry, shards: list[Path], dtype: str | None) -> Weights:
    """Exact per-part bytes from the shard headers (data_offsets), or as exported in ``dtype``.

    Keys of layers >= num_hidden_layers (the MTP layer) and any key outside the model are ignored,
    as transformers ignores them on load, and reported.
    """
    w = Weights(embedding=0, layers=[0] * g.layers, head=0, parameters=[0] * g.layers,
                embedding_parameters=0, head_parameters=0, source=f"safetensors headers ({len(shards)} shards)")
    has_lm_head = False
    for shard in shards:
        for key, info in read_header(shard)[0].items():
            if key == "__metadata__":
                continue
            try:
                numel = math.prod(int(d) for d in info["shape"])
                start, end = info["data_offsets"]
                stored = int(end) - int(start)
            except (KeyError, TypeError, ValueError):
                raise DSAUserError(f"'{shard}' has a malformed header entry for '{key}'; re-download that shard.") from None
            scale = key.endswith("_scale_inv")
            nbytes = stored if dtype is None else (0 if scale else numel * DTYPE_BYTES[dtype])
            params = 0 if scale else numel
            match = _LAYER_KEY.match(key)
            if match and int(match.group(1)) < g.layers:
                i = int(match.group(1))
                w.layers[i] += nbytes
                w.parameters[i] += params
            elif key.startswith("model.embed_tokens."):
                w.embedding += nbytes
                w.embedding_parameters += params
            elif key.startswith(("model.norm.", "lm_head.")):
                has_lm_head |= key.startswith("lm_head.")
                w.head += nbytes
                w.head_parameters += params
            else:
                w.ignored_bytes += nbytes
                w.ignored_parameters += params
    empty = [i for i, b in enumerate(w.layers) if b == 0]
    if empty or w.embedding == 0:
        what = f"layer {empty[0]}" if empty else "the embedding (model.embed_tokens)"
        raise DSAUserError(f"the checkpoint's shards hold no weights for {what}; re-download the missing shards.")
    if not has_lm_head:  # tied: the last stage's GPU still needs its own copy of the matrix
        w.head += w.embedding
        w.head_parameters += w.embedding_parameters
    return w


# -- caches and activations ------------------------------------------------------------------------

def layer_cache_bytes(g: Geometry, i: int, batch: int, seq: int, cache_bytes: int) -> int:
    """Decode cache of one layer: the MLA latent plus, on layers with their own indexer, the indexer keys."""
    per_token = g.kv_lora + g.rope + (g.index_dim if g.indexer_types[i] == "full" else 0)
    return batch * seq * per_token * cache_bytes


def indexer_workspace(batch: int, seq: int) -> int:
    """The DSAIndexerTopK plugin's workspace, ``max(min(4*B*S*T, 256 MiB), 4*T)`` with S = T = seq."""
    return max(min(4 * batch * seq * seq, INDEXER_WORKSPACE_CAP), 4 * seq)


def layer_transient_bytes(g: Geometry, i: int, batch: int, seq: int, act: int) -> int:
    """The largest set of tensors alive at once inside one layer during a prefill of ``seq`` tokens.

    The normed input stays alive throughout; then the largest of the attention (absorbed MLA), the
    indexer and the MLP/MoE phases. Latent and indexer keys are the caches and are counted there.
    """
    n = batch * seq
    nh, c, r = g.heads, g.kv_lora, g.rope
    indices = n * g.index_topk * _INT32
    attention = max(
        n * g.q_lora * act + n * nh * (g.nope + r) * act,  # q_resid, q = q_b_proj(q_resid)
        n * nh * (g.nope + r) * act + n * nh * c * act,  # q, q_nope absorbed into the latent space
        n * nh * (c + r) * act + n * nh * c * act + indices,  # sparse attention: q in, latent out
        n * nh * c * act + n * nh * g.v_dim * act,  # latent out mapped back by W_UV
    )
    phases = [attention]
    if g.indexer_types[i] == "full":
        phases.append(n * g.q_lora * act + n * g.index_heads * g.index_dim * act + n * g.index_heads * _FP32
                      + indexer_workspace(batch, seq) + indices)
    if g.mlp_types[i] == "dense":
        phases.append(3 * n * g.intermediate * act)  # gate, up, act(gate) * up
    else:
        k = g.experts_per_token
        phases.append(2 * n * g.routed_experts * _FP32  # router scores, biased scores
                      + n * k * (_INT64 + _FP32)  # chosen experts, their weights
                      + 3 * n * k * g.moe_intermediate * act  # gate, up, product for every routed row
                      + n * g.hidden * _FP32)  # float32 combine of the routed outputs
        phases.append(3 * n * g.moe_intermediate * g.shared_experts * act)
    return n * g.hidden * act + max(phases)


@dataclass
class LayerCosts:
    """Per-layer weights, caches and transients plus the end extras: what any stage costs."""

    weights: Weights
    cache: list[int]
    transient: list[int]
    io_bytes: int  # hidden states in and out of a stage + attention_mask
    embedding_io_bytes: int  # input_ids of the first stage
    head_io_bytes: int  # final norm output + logits of the last stage
    indices_io_bytes: int  # top-k indices handed across a cut in front of a GLM-5 "shared" layer
    shared: list[bool]  # layers that reuse the previous layer's selection
    reserve_bytes: int

    @property
    def num_layers(self) -> int:
        return len(self.cache)

    def stage(self, index: int, start: int, stop: int, gpu_memory_bytes: int | None = None) -> StagePlan:
        """The memory of a stage that runs layers ``start:stop`` (the embedding if start == 0, the head if stop == n)."""
        first, last = start == 0, stop == self.num_layers
        w = self.weights
        weight = sum(w.layers[start:stop]) + (w.embedding if first else 0) + (w.head if last else 0)
        params = (sum(w.parameters[start:stop]) + (w.embedding_parameters if first else 0)
                  + (w.head_parameters if last else 0))
        handed = (not first and self.shared[start]) + (not last and self.shared[stop])
        activation = (self.io_bytes + max(self.transient[start:stop]) + (self.embedding_io_bytes if first else 0)
                      + (self.head_io_bytes if last else 0) + handed * self.indices_io_bytes)
        cache = sum(self.cache[start:stop])
        total = weight + cache + activation + self.reserve_bytes
        return StagePlan(index=index, start=start, stop=stop, includes_embedding=first, includes_head=last,
                         parameters=params, weight_bytes=weight, cache_bytes=cache, activation_bytes=activation,
                         reserve_bytes=self.reserve_bytes, total_bytes=total,
                         fits=gpu_memory_bytes is None or total <= gpu_memory_bytes)


def layer_costs(g: Geometry, weights: Weights, *, batch: int, seq: int, act_bytes: int, cache_bytes: int,
                reserve_bytes: int) -> LayerCosts:
    n = batch * seq
    return LayerCosts(
        weights=weights,
        cache=[layer_cache_bytes(g, i, batch, seq, cache_bytes) for i in range(g.layers)],
        transient=[layer_transient_bytes(g, i, batch, seq, act_bytes) for i in range(g.layers)],
        io_bytes=2 * n * g.hidden * act_bytes + n * _INT64,
        embedding_io_bytes=n * _INT64,
        head_io_bytes=n * g.hidden * act_bytes + n * g.vocab * act_bytes,
        indices_io_bytes=n * g.index_topk * _INT32,
        shared=[t == "shared" for t in g.indexer_types],
        reserve_bytes=reserve_bytes,
    )


# -- splitting -------------------------------------------------------------------------------------

def _cost_table(costs: LayerCosts) -> list[list[int]]:
    """``table[i][j]`` = total bytes of the stage running layers i:j (j > i)."""
    n = costs.num_layers
    return [[0] * (i + 1) + [costs.stage(0, i, j).total_bytes for j in range(i + 1, n + 1)] for i in range(n)]


def min_max_splits(table: list[list[int]], n: int) -> Iterator[tuple[int, int, list[int]]]:
    """Exact DP over the cut points: for count = 1, 2, ..., n, the ``count`` non-empty contiguous
    stages of ``n`` layers with the smallest largest total, as (count, largest total, stage starts).

    ``best[s][j] = min over i of max(best[s-1][i], table[i][j])``, one count at a time so ``auto``
    stops at the first count that fits. It assumes nothing of the costs (a stage that starts on a
    GLM-5 "shared" layer takes an extra input, so removing a layer can make a stage bigger). Among
    equally good splits it keeps the one whose earlier stages have the smaller maximum, which spreads
    the slack instead of piling it up front.
    """
    best: list[float] = [table[0][j] if j else 0 for j in range(n + 1)]
    back: list[list[int]] = []
    for s in range(1, n + 1):
        if s > 1:
            new, arg = [math.inf] * (n + 1), [0] * (n + 1)
            for j in range(s, n + 1):
                choice, key = 0, (math.inf, math.inf)
                for i in range(s - 1, j):
                    cand = (max(best[i], table[i][j]), best[i])
                    if cand < key:
                        choice, key = i, cand
                new[j], arg[j] = key[0], choice
            best = new
            back.append(arg)
        starts, j = [], n
        for k in range(s - 1, 0, -1):
            j = back[k - 1][j]
            starts.append(j)
        yield s, int(best[n]), [0, *starts[::-1]]


def split_min_max(table: list[list[int]], n: int, count: int) -> tuple[int, list[int]]:
    """(largest total, stage starts) of the best split into exactly ``count`` stages."""
    for k, largest, starts in min_max_splits(table, n):
        if k == count:
            return largest, starts
    raise ValueError(f"count {count} is outside 1..{n}")


def fewest_stages(table: list[list[int]], n: int, capacity: int) -> tuple[int, int, list[int]] | None:
    """(count, largest, starts) of the fewest stages that all fit ``capacity``, or None if no split does."""
    return next(((k, big, starts) for k, big, starts in min_max_splits(table, n) if big <= capacity), None)


# -- the plan --------------------------------------------------------------------------------------

@dataclass
class StagePlan:
    """One pipeline stage: layers ``start:stop`` (stop exclusive) on one GPU, and what it needs there."""

    index: int
    start: int
    stop: int
    includes_embedding: bool
    includes_head: bool
    parameters: int
    weight_bytes: int
    cache_bytes: int
    activation_bytes: int
    reserve_bytes: int
    total_bytes: int
    fits: bool

    @property
    def layers(self) -> str:
        return f"{self.start}:{self.stop}"


@dataclass
class Plan:
    """A split of a model into stages plus the settings it was computed for (all sizes in bytes)."""

    model_type: str
    num_layers: int
    weights_source: str
    weight_precision: str  # fp8 (checkpoint FP8 kept), bf16, fp16 or fp32
    activation_dtype: str
    cache_dtype: str
    max_batch: int
    max_seq: int
    gpu_memory_bytes: int
    gpus: int | None
    reserve_bytes: int
    requested_stages: str | int  # "auto" or the count asked for
    total_parameters: int
    ignored_bytes: int
    ignored_parameters: int
    stages: list[StagePlan] = field(default_factory=list)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)

    @property
    def largest_stage(self) -> StagePlan:
        return max(self.stages, key=lambda s: s.total_bytes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        try:
            stages = [StagePlan(**s) for s in data["stages"]]
            return cls(**{**data, "stages": stages})
        except (KeyError, TypeError) as exc:
            raise DSAUserError(f"the plan JSON is not one dsa-export wrote ({exc}); run 'dsa-export plan --json' again.") from exc

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DSAUserError(f"the plan is not valid JSON ({exc.msg} at line {exc.lineno}).") from exc
        if not isinstance(data, dict):
            raise DSAUserError("the plan JSON is not an object; run 'dsa-export plan --json' again.")
        return cls.from_dict(data)

    def render_table(self) -> str:
        """The stages as an aligned text table followed by a one-line summary."""
        head = ("stage", "layers", "weights", "cache", "activations", "total", "fits")
        rows = [head]
        for s in self.stages:
            extras = "+emb" * s.includes_embedding + "+head" * s.includes_head
            rows.append((str(s.index), s.layers + extras, format_gib(s.weight_bytes), format_gib(s.cache_bytes),
                         format_gib(s.activation_bytes), format_gib(s.total_bytes), "yes" if s.fits else "NO"))
        widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
        lines = ["  ".join(cell.ljust(widths[c]) if c < 2 else cell.rjust(widths[c]) for c, cell in enumerate(r))
                 for r in rows]
        return "\n".join(lines + [self.summary()])

    def summary(self) -> str:
        big = self.largest_stage
        gpus = f" (of {self.gpus} GPUs)" if self.gpus else ""
        ignored = (f"; {format_gib(self.ignored_bytes)} ({self.ignored_parameters / 1e9:.2f}B parameters, "
                   "MTP layer and other keys transformers ignores) left out") if self.ignored_bytes else ""
        return (f"{self.num_stages} stage{'s' * (self.num_stages != 1)}{gpus} of {format_gib(self.gpu_memory_bytes)}: "
                f"largest {format_gib(big.total_bytes)} (stage {big.index}), "
                f"{self.total_parameters / 1e9:.1f}B parameters, {self.weight_precision} weights from "
                f"{self.weights_source}, {self.cache_dtype} cache, activations {self.activation_dtype} at "
                f"batch {self.max_batch} x {self.max_seq} tokens, reserve {format_gib(self.reserve_bytes)}/GPU"
                f"{ignored}.")


def load_config(source: str | Path | dict) -> tuple[dict, Path | None]:
    """config.json of a checkpoint directory, a config.json path, or a config dict; plus the directory."""
    if isinstance(source, dict):
        return source, None
    path = Path(source)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise DSAUserError(f"'{path}' is neither a model directory with config.json nor a config.json file.")
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DSAUserError(f"'{file}' is not readable JSON ({exc}); pass the checkpoint's config.json.") from exc
    if not isinstance(config, dict):
        raise DSAUserError(f"'{file}' is not a JSON object; pass the checkpoint's config.json.")
    return config, file.parent


def plan_stages(
    checkpoint: str | Path | dict,
    *,
    gpu_memory_bytes: int | str,
    stages: str | int = "auto",
    gpus: int | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_seq: int = DEFAULT_MAX_SEQ,
    dtype: str | None = None,
    cache_dtype: str | None = None,
    reserve_bytes: int | str = DEFAULT_RESERVE_BYTES,
    strict: bool = True,
) -> Plan:
    """Split ``checkpoint`` into contiguous stages, one per GPU of ``gpu_memory_bytes``.

    Args:
        checkpoint: a Hugging Face directory (its safetensors headers are read when all shards are
            there), a config.json path, or the config as a dict.
        gpu_memory_bytes: memory of one GPU (bytes, or text such as ``"141GiB"``).
        stages: ``"auto"`` = the fewest stages that fit, balanced; an int = that many stages with
            the smallest possible largest stage.
        gpus: GPUs available; a plan needing more is refused.
        max_batch, max_seq: the optimization profile's maximum batch and sequence length; caches
            hold ``max_seq`` tokens per row and activations are those of a ``max_seq``-token prefill.
        dtype: ``fp32``/``fp16``/``bf16`` as an export with ``--dtype`` writes it; None keeps the
            checkpoint's precision (FP8 with block scales stays FP8).
        cache_dtype: dtype of the decode caches; None follows the activations (bf16 for FP8 and
            bf16 checkpoints).
        reserve_bytes: fixed per-GPU reserve for the CUDA/TensorRT context and workspaces.
        strict: raise when a requested stage count does not fit; False returns the plan with
            ``fits`` False on the stages that do not.

    Raises:
        DSAUserError: the model cannot be split as asked (one sentence naming the fix).
    """
    config, directory = load_config(checkpoint)
    where = f"'{directory / 'config.json'}'" if directory else "the config"
    g = Geometry.from_config(config, where)
    capacity = parse_size(gpu_memory_bytes, "GPU memory")
    reserve = parse_size(reserve_bytes, "reserve", allow_zero=True)
    if dtype is not None and dtype not in DTYPE_BYTES:
        raise DSAUsageError(f"dtype '{dtype}' is not one of {', '.join(DTYPE_BYTES)} (or None to keep the checkpoint's).")
    if cache_dtype is not None and cache_dtype not in DTYPE_BYTES:
        raise DSAUsageError(f"cache dtype '{cache_dtype}' is not one of {', '.join(DTYPE_BYTES)}.")
    if max_batch < 1 or max_seq < 1:
        raise DSAUsageError("max batch and max sequence length must be at least 1.")
    if gpus is not None and gpus < 1:
        raise DSAUsageError(f"--gpus {gpus} must be at least 1.")
    count = _stage_count(stages, g.layers, gpus)

    shards, missing = shard_files(directory) if directory else ([], [])
    if shards and not missing:
        weights = weights_from_headers(g, shards, dtype)
    else:
        weights = weights_from_config(g, dtype)
        if missing:
            weights.source = f"config.json ({len(missing)} of the index's shards missing)"
    act_dtype = dtype or ("bf16" if g.fp8 else g.storage_dtype)
    cache_dtype = cache_dtype or act_dtype
    costs = layer_costs(g, weights, batch=max_batch, seq=max_seq, act_bytes=DTYPE_BYTES[act_dtype],
                        cache_bytes=DTYPE_BYTES[cache_dtype], reserve_bytes=reserve)
    table = _cost_table(costs)
    n = g.layers

    if count is None:
        found = fewest_stages(table, n, capacity)
        if found is None:
            raise _no_split_fits(table, capacity, max_batch, max_seq, dtype)
        count, largest, starts = found
        if gpus is not None and count > gpus:
            raise DSAUserError(
                f"the model needs {count} stages of {format_gib(capacity)} at batch {max_batch} x {max_seq} tokens but "
                f"--gpus is {gpus}; add GPUs, lower --max-seq/--max-batch or use GPUs with more memory."
            )
    else:
        largest, starts = split_min_max(table, n, count)
        if largest > capacity and strict:
            found = fewest_stages(table, n, capacity)
            if found is None:
                raise _no_split_fits(table, capacity, max_batch, max_seq, dtype)
            raise DSAUserError(
                f"with {count} stages the largest needs {format_gib(largest)}, more than the {format_gib(capacity)} "
                f"GPU; use --stages {found[0]} (or --stages auto), or lower --max-seq/--max-batch."
            )
    bounds = starts + [n]
    stage_plans = [costs.stage(k, bounds[k], bounds[k + 1], capacity) for k in range(len(starts))]
    return Plan(
        model_type=g.model_type, num_layers=n, weights_source=weights.source,
        weight_precision=dtype or ("fp8" if g.fp8 else g.storage_dtype), activation_dtype=act_dtype,
        cache_dtype=cache_dtype, max_batch=max_batch, max_seq=max_seq, gpu_memory_bytes=capacity, gpus=gpus,
        reserve_bytes=reserve, requested_stages=stages if stages == "auto" else count,
        total_parameters=sum(weights.parameters) + weights.embedding_parameters + weights.head_parameters,
        ignored_bytes=weights.ignored_bytes, ignored_parameters=weights.ignored_parameters, stages=stage_plans,
    )


def _no_split_fits(table: list[list[int]], capacity: int, batch: int, seq: int, dtype: str | None) -> DSAUserError:
    """The error for a model no split fits, naming the stage that stays too big in the best split of all."""
    n = len(table)
    _, largest, starts = min(min_max_splits(table, n), key=lambda split: split[1])
    bounds = [*starts, n]
    worst = max(range(len(starts)), key=lambda k: table[bounds[k]][bounds[k + 1]])
    a, b = bounds[worst], bounds[worst + 1]
    what = f"layer {a}" if b == a + 1 else f"layers {a}:{b}"
    extra = (" with the embedding" if a == 0 else "") + (" with the final norm and lm_head" if b == n else "")
    return DSAUserError(
        f"no split fits the {format_gib(capacity)} GPU: {what}{extra} "
        f"{'alone needs' if b == a + 1 else 'need even in the best split'} {format_gib(largest)} (weights, cache, "
        f"activations at batch {batch} x {seq} tokens and reserve); lower --max-seq or --max-batch"
        f"{', keep the checkpoint precision (--dtype auto)' if dtype else ''}, or use GPUs with more memory."
    )


def _stage_count(stages: str | int, layers: int, gpus: int | None) -> int | None:
    """None for ``auto``, else the validated count."""
    if stages == "auto":
        return None
    try:
        count = int(stages)
    except (TypeError, ValueError):
        raise DSAUsageError(f"--stages '{stages}' is neither 'auto' nor a number of stages.") from None
    if count < 1:
        raise DSAUsageError(f"--stages {count} must be at least 1 (or 'auto').")
    if count > layers:
        raise DSAUserError(f"--stages {count} is more than the model's {layers} layers; use at most {layers} stages.")
    if gpus is not None and count > gpus:
        raise DSAUsageError(f"--stages {count} needs {count} GPUs but --gpus is {gpus}; raise --gpus or lower --stages.")
    return count


__all__ = ["DEFAULT_MAX_SEQ", "DEFAULT_RESERVE_BYTES", "Geometry", "LayerCosts", "Plan", "StagePlan",
           "fewest_stages", "min_max_splits", "parse_size", "plan_stages", "split_min_max"]
