"""What a DSA model's parts weigh, from config.json or the safetensors headers: the planner's sizes.

Plain arithmetic and JSON (no torch, transformers or onnx), so ``dsa-export plan`` answers in about
a second: the model's geometry from config.json, the inventory of tensors per layer (in the
checkpoint's precision, FP8 block scales included, or as an export with ``--dtype`` writes them),
exact bytes from the shard headers when the shards are present, and per layer the decode caches
and the transient activations of a prefill. :mod:`dsa_export.stages.plan` splits the layers into
stages with these figures; every formula is written out in ``docs/plan.md``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.hf.checkpoint import METADATA_KEY, read_header, shard_names
from dsa_export.hf.config_schema import config_dtype, validate_config

GIB = 1 << 30
#: CUDA context, cuBLAS/cuDNN handles, TensorRT execution-context scratch and allocator slack per
#: GPU. A CUDA context alone takes 0.3-0.6 GiB on Hopper; 2 GiB leaves room for the rest.
DEFAULT_RESERVE_BYTES = 2 * GIB
DEFAULT_MAX_BATCH = 1
#: A common serving context; pass the maximum of the optimization profile you will build.
DEFAULT_MAX_SEQ = 8192
#: Bytes per element of the precisions an export can write (``dsa-export export --dtype``).
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
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


def check_prefill_chunk(chunk: int | None, graph: str | None, *, fix: str = "add --graph paged") -> int | None:
    """``chunk`` (``None``: the whole prompt in one call), refused below 1 or outside paged graphs (a
    decode graph's prefill takes the whole prompt); ``fix`` says what to add. The planner, stage
    builds and generate share this rule."""
    if chunk is None:
        return None
    if chunk < 1:
        raise DSAUsageError(f"--prefill-chunk must be at least 1; got {chunk}.")
    if graph != "paged":
        raise DSAUsageError(f"--prefill-chunk needs a paged graph (a decode graph's prefill takes the whole prompt); "
                            f"{fix}.")
    return chunk


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
        """The geometry of ``config``, checked field by field first (:mod:`dsa_export.hf.config_schema`)."""
        validate_config(config, where)
        model_type = config["model_type"]
        n = config["num_hidden_layers"]
        dense = min(config.get("first_k_dense_replace", 3), n)
        mlp_types = tuple(config.get("mlp_layer_types") or ["dense"] * dense + ["sparse"] * (n - dense))
        indexer_types = tuple(_derive_indexer_types(config, model_type, n))
        quant = config.get("quantization_config") or {}
        fp8 = quant.get("quant_method") == "fp8"
        block = tuple(quant.get("weight_block_size") or (128, 128))
        return cls(
            model_type=model_type, vocab=config["vocab_size"], hidden=config["hidden_size"], layers=n,
            heads=config["num_attention_heads"], q_lora=config["q_lora_rank"], kv_lora=config["kv_lora_rank"],
            nope=config["qk_nope_head_dim"], rope=config["qk_rope_head_dim"], v_dim=config["v_head_dim"],
            intermediate=config["intermediate_size"], moe_intermediate=config["moe_intermediate_size"],
            routed_experts=config["n_routed_experts"], shared_experts=config.get("n_shared_experts") or 0,
            experts_per_token=config["num_experts_per_tok"], index_heads=config["index_n_heads"],
            index_dim=config["index_head_dim"], index_topk=config["index_topk"],
            attention_bias=bool(config.get("attention_bias", False)),
            mtp_layers=config.get("num_nextn_predict_layers") or 0,
            mlp_types=mlp_types, indexer_types=indexer_types,
            storage_dtype=config_dtype(config, "bf16"), fp8=fp8, fp8_block=(block[0], block[1]),
        )


def _derive_indexer_types(config: dict, model_type: str, n: int) -> list[str]:
    """The per-layer indexer schedule as transformers derives it: every layer runs its own indexer in
    DeepSeek-V3.2; GLM-5 takes ``indexer_types``, else ``index_topk_pattern``, else its schedule of
    full and shared layers (``index_topk_freq``, ``index_skip_topk_offset``)."""
    if model_type != "glm_moe_dsa":
        return ["full"] * n
    if config.get("indexer_types") is not None:
        return list(config["indexer_types"])
    pattern = config.get("index_topk_pattern")
    if pattern is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    freq = max(config.get("index_topk_freq") or 1, 1)
    offset = config.get("index_skip_topk_offset", 2)
    offset = 2 if offset is None else offset
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]


# -- the tensor inventory from config.json -----------------------------------------------------------

@dataclass(frozen=True)
class CheckpointTensor:
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


def layer_tensors(g: Geometry, i: int) -> list[CheckpointTensor]:
    """The tensors of decoder layer ``i``, keyed as transformers' save_pretrained and the releases write them."""
    p = f"model.layers.{i}"
    h, nh = g.hidden, g.heads
    out = [CheckpointTensor(f"{p}.input_layernorm.weight", (h,), "plain"),
           CheckpointTensor(f"{p}.post_attention_layernorm.weight", (h,), "plain")]
    a = f"{p}.self_attn"
    out += [CheckpointTensor(f"{a}.q_a_proj.weight", (g.q_lora, h)),
            CheckpointTensor(f"{a}.q_a_layernorm.weight", (g.q_lora,), "plain"),
            CheckpointTensor(f"{a}.q_b_proj.weight", (nh * (g.nope + g.rope), g.q_lora)),
            CheckpointTensor(f"{a}.kv_a_proj_with_mqa.weight", (g.kv_lora + g.rope, h)),
            CheckpointTensor(f"{a}.kv_a_layernorm.weight", (g.kv_lora,), "plain"),
            CheckpointTensor(f"{a}.kv_b_proj.weight", (nh * (g.nope + g.v_dim), g.kv_lora)),
            CheckpointTensor(f"{a}.o_proj.weight", (h, nh * g.v_dim))]
    if g.attention_bias:
        out += [CheckpointTensor(f"{a}.q_a_proj.bias", (g.q_lora,), "plain"),
                CheckpointTensor(f"{a}.kv_a_proj_with_mqa.bias", (g.kv_lora + g.rope,), "plain"),
                CheckpointTensor(f"{a}.o_proj.bias", (h,), "plain")]
    if i >= g.layers or g.indexer_types[i] == "full":  # the MTP layer always runs its own indexer
        x = f"{a}.indexer"
        out += [CheckpointTensor(f"{x}.wq_b.weight", (g.index_heads * g.index_dim, g.q_lora)),
                CheckpointTensor(f"{x}.wk.weight", (g.index_dim, h)),
                CheckpointTensor(f"{x}.k_norm.weight", (g.index_dim,), "plain"),
                CheckpointTensor(f"{x}.k_norm.bias", (g.index_dim,), "plain"),
                CheckpointTensor(f"{x}.weights_proj.weight", (g.index_heads, h), "plain")]
    m = f"{p}.mlp"
    if i < g.layers and g.mlp_types[i] == "dense":
        return out + _mlp(m, h, g.intermediate)
    out += [CheckpointTensor(f"{m}.gate.weight", (g.routed_experts, h), "plain"),
            CheckpointTensor(f"{m}.gate.e_score_correction_bias", (g.routed_experts,), "fp32")]
    for e in range(g.routed_experts):
        out += _mlp(f"{m}.experts.{e}", h, g.moe_intermediate)
    if g.shared_experts:
        out += _mlp(f"{m}.shared_experts", h, g.moe_intermediate * g.shared_experts)
    return out


def _mlp(prefix: str, hidden: int, inter: int) -> list[CheckpointTensor]:
    return [CheckpointTensor(f"{prefix}.gate_proj.weight", (inter, hidden)),
            CheckpointTensor(f"{prefix}.up_proj.weight", (inter, hidden)),
            CheckpointTensor(f"{prefix}.down_proj.weight", (hidden, inter))]


def embedding_tensors(g: Geometry) -> list[CheckpointTensor]:
    return [CheckpointTensor("model.embed_tokens.weight", (g.vocab, g.hidden), "plain")]


def head_tensors(g: Geometry) -> list[CheckpointTensor]:
    """Final norm and lm_head; a tied head is still a copy on the last stage's GPU."""
    return [CheckpointTensor("model.norm.weight", (g.hidden,), "plain"),
            CheckpointTensor("lm_head.weight", (g.vocab, g.hidden), "plain")]


def mtp_tensors(g: Geometry) -> list[CheckpointTensor]:
    """The unique weights of each multi-token-prediction layer, which transformers (and so we) ignore.

    DeepSeek's release also stores copies of the embedding and head under the MTP layer's prefix;
    those are counted only when the headers are read.
    """
    out: list[CheckpointTensor] = []
    for k in range(g.mtp_layers):
        i = g.layers + k
        p = f"model.layers.{i}"
        out += layer_tensors(g, i)
        out += [CheckpointTensor(f"{p}.enorm.weight", (g.hidden,), "plain"),
                CheckpointTensor(f"{p}.hnorm.weight", (g.hidden,), "plain"),
                CheckpointTensor(f"{p}.eh_proj.weight", (g.hidden, 2 * g.hidden), "plain"),
                CheckpointTensor(f"{p}.shared_head.norm.weight", (g.hidden,), "plain")]
    return out


def tensor_bytes(t: CheckpointTensor, g: Geometry, dtype: str | None) -> int:
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
    """The shards of a checkpoint directory and the names the index lists but the directory lacks.

    The index and the shard names are checked by :func:`dsa_export.hf.checkpoint.shard_names`
    (the exporter's reader): names outside the folder are refused, never opened.
    """
    names, _ = shard_names(path)
    return [path / n for n in names if (path / n).is_file()], [n for n in names if not (path / n).is_file()]


_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")
_SCALE = "_scale_inv"


class ImpliedShapes:
    """The shape config.json implies for a checkpoint key an export reads: the embedding, the
    decoder layers and the head, and the FP8 block scale ``KEY_scale_inv`` of each 2-D Linear
    weight (``[ceil(out/block), ceil(in/block)]``); None for any other key (the MTP layer, which
    exports ignore, extra keys). Each kind of layer's table is built once."""

    _LAYERS = "model.layers."

    def __init__(self, g: Geometry):
        self._ends = self._table(g, embedding_tensors(g) + head_tensors(g), 0)
        by_kind: dict[tuple[str, str], dict[str, tuple[int, ...]]] = {}
        self._layers: dict[str, dict[str, tuple[int, ...]]] = {}  # "7" -> {"mlp.gate.weight": shape, ...}
        for i in range(g.layers):
            kind = (g.mlp_types[i], g.indexer_types[i])
            if kind not in by_kind:
                by_kind[kind] = self._table(g, layer_tensors(g, i), len(f"{self._LAYERS}{i}."))
            self._layers[str(i)] = by_kind[kind]

    @staticmethod
    def _table(g: Geometry, specs: list[CheckpointTensor], prefix: int) -> dict[str, tuple[int, ...]]:
        rows, cols = g.fp8_block
        table = {t.key[prefix:]: t.shape for t in specs}
        table.update({f"{t.key[prefix:]}{_SCALE}": (math.ceil(t.shape[0] / rows), math.ceil(t.shape[1] / cols))
                      for t in specs if t.kind == "linear" and len(t.shape) == 2})
        return table

    def get(self, key: str) -> tuple[int, ...] | None:
        if key.startswith(self._LAYERS):
            number, _, rest = key[len(self._LAYERS):].partition(".")
            table = self._layers.get(number)
            return None if table is None else table.get(rest)
        return self._ends.get(key)


def weights_from_headers(g: Geometry, shards: list[Path] | dict[Path, dict], dtype: str | None) -> Weights:
    """Exact per-part bytes from the shard headers (data_offsets), or as exported in ``dtype``.

    ``shards``: the shard files (their headers are read here), or ``{shard: parsed header}`` of
    headers a :class:`~dsa_export.hf.checkpoint.SafetensorsCheckpoint` has read already.

    Keys of layers >= num_hidden_layers (the MTP layer) and any key outside the model are ignored,
    as transformers ignores them on load, and reported.
    """
    w = Weights(embedding=0, layers=[0] * g.layers, head=0, parameters=[0] * g.layers,
                embedding_parameters=0, head_parameters=0, source=f"safetensors headers ({len(shards)} shards)")
    has_lm_head = False
    seen: dict[str, Path] = {}
    implied = ImpliedShapes(g)
    headers = shards.items() if isinstance(shards, dict) else ((shard, read_header(shard)[0]) for shard in shards)
    for shard, header in headers:
        for key, info in header.items():  # checked: dtype known, shape and offsets consistent
            if key == METADATA_KEY:
                continue
            if key in seen:
                raise DSAUserError(f"tensor '{key[:80]}' is in both '{seen[key]}' and '{shard}'; remove the stray "
                                   "shard or re-download the checkpoint.")
            seen[key] = shard
            want = implied.get(key)
            if want is not None and tuple(info["shape"]) != want:
                raise DSAUserError(
                    f"tensor '{key}' of '{shard}' has shape {str(info['shape'])[:80]}, but config.json implies {list(want)}; "
                    "config.json and the weights do not belong together, or that shard's header is wrong (re-download it)."
                )
            numel = math.prod(info["shape"])
            start, end = info["data_offsets"]
            stored = end - start
            scale = key.endswith(_SCALE)
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

#: ``cache_bytes`` of FP8 caches (``--kv-cache-dtype fp8``): not one size per value, see layer_cache_bytes.
FP8_CACHE = 0


def layer_cache_bytes(g: Geometry, i: int, batch: int, seq: int, cache_bytes: int) -> int:
    """Decode cache of one layer: the MLA latent plus, on layers with their own indexer, the indexer keys.

    ``cache_bytes`` per value, or :data:`FP8_CACHE`: the FP8 encodings of
    :mod:`dsa_export.hf.kv_quant` (latent: a byte per value, a float32 scale per 128 values, bf16
    RoPE; index keys: a byte per value and a float32 scale)."""
    full = g.indexer_types[i] == "full"
    if cache_bytes == FP8_CACHE:
        block = 128 if g.kv_lora % 128 == 0 else g.kv_lora
        per_token = g.kv_lora + 4 * (g.kv_lora // block) + 2 * g.rope + ((g.index_dim + 4) if full else 0)
        return batch * seq * per_token
    per_token = g.kv_lora + g.rope + (g.index_dim if full else 0)
    return batch * seq * per_token * cache_bytes


def indexer_workspace(batch: int, seq: int, keys: int | None = None) -> int:
    """The DSAIndexerTopK plugins' workspace, ``max(min(4*B*S*T, 256 MiB), 4*T)`` for ``S = seq``
    queries per row over ``T = keys`` key positions (default ``seq``: a whole-prompt prefill)."""
    t = seq if keys is None else keys
    return max(min(4 * batch * seq * t, INDEXER_WORKSPACE_CAP), 4 * t)


def layer_transient_bytes(g: Geometry, i: int, batch: int, seq: int, act: int, keys: int | None = None) -> int:
    """The largest set of tensors alive at once inside one layer during a prefill call of ``seq``
    tokens per row over ``keys`` cached positions (default ``seq``: the whole prompt in one call; a
    paged graph fed in chunks has ``seq`` = the chunk and ``keys`` = the sequences' length).

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
                      + indexer_workspace(batch, seq, keys) + indices)
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
                reserve_bytes: int, prefill_tokens: int | None = None, logits_rows: int | None = None,
                cache_buffers: int = 1) -> LayerCosts:
    """What every layer and stage end costs at ``batch`` rows of ``seq`` cached tokens. A prefill
    call holds ``prefill_tokens`` tokens per row (default ``seq``; a paged graph fed in chunks:
    the chunk) and returns ``logits_rows`` rows of logits (default every token of the call; a
    paged graph: one per row). ``cache_buffers``: copies of each cache the runtime holds (2 for
    paged pools that the engine writes into a new buffer every call)."""
    calls = min(prefill_tokens or seq, seq)
    n = batch * calls
    rows = n if logits_rows is None else logits_rows
    return LayerCosts(
        weights=weights,
        cache=[cache_buffers * layer_cache_bytes(g, i, batch, seq, cache_bytes) for i in range(g.layers)],
        transient=[layer_transient_bytes(g, i, batch, calls, act_bytes, keys=seq) for i in range(g.layers)],
        io_bytes=2 * n * g.hidden * act_bytes + n * _INT64,
        embedding_io_bytes=n * _INT64,
        head_io_bytes=rows * g.hidden * act_bytes + rows * g.vocab * act_bytes,
        indices_io_bytes=n * g.index_topk * _INT32,
        shared=[t == "shared" for t in g.indexer_types],
        reserve_bytes=reserve_bytes,
    )


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
