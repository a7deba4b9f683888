"""The one schema of a checkpoint's ``config.json`` (and of the token ids of its
``generation_config.json``): every field is checked before any work is done with it.

A checkpoint folder is untrusted input. :func:`validate_config` checks the fields of a
DeepSeek-V3.2 (``deepseek_v32``) or GLM-5 (``glm_moe_dsa``) config that dsa-export or transformers
reads: types (a bool is no number, ``61.0`` is no layer count), ranges, the lengths of the per-layer
lists, the divisibility the router and attention rely on, and the size of the whole model, which is
computed by arithmetic and refused when it is absurd (nothing is allocated to find out). Every
reader of a checkpoint config goes through it: :func:`dsa_export.hf.loader.inspect_checkpoint`
(export, build, validate, the references) and :meth:`dsa_export.hf.sizes.Geometry.from_config`
(plan). Each refusal is one :class:`~dsa_export.errors.DSAUserError` sentence naming the field,
what was found and what to do.

:func:`read_json_object` reads a config file with bounded size and depth; :func:`read_end_of_sequence`
is the checked reader of the end-of-sequence and padding ids a generation loop stops on.

Plain JSON and arithmetic: importing this module loads neither torch nor transformers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUserError

SUPPORTED_TYPES = ("deepseek_v32", "glm_moe_dsa")

#: A published config.json is a few kilobytes (GLM-5's FP8 one, listing every unquantized module,
#: about 100 KB); anything this large is not one, and parsing it could take gigabytes.
MAX_CONFIG_BYTES = 16 << 20
#: Bounds far above any published DSA model (DeepSeek-V3.2: 61 layers, 256 experts, hidden 7168,
#: vocab 129280; GLM-5: 78 layers) that keep every loop over layers or experts, and the planner's
#: search over cut points, short.
MAX_LAYERS = 1024
MAX_MTP_LAYERS = 16
MAX_EXPERTS = 4096
MAX_HEADS = 1 << 16
MAX_WIDTH = 1 << 20
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 24
#: 2**48 parameters (1 PiB in float32): 400 times DeepSeek-V3.2, far past anything a GPU
#: pipeline holds, yet every byte count derived from it stays an exact int64.
MAX_PARAMETERS = 1 << 48

#: ``dtype`` / ``torch_dtype`` values and the export dtype each means.
CONFIG_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
#: transformers' activation names (``transformers.activations.ACT2FN``).
ACTIVATIONS = ("gelu", "gelu_10", "gelu_accurate", "gelu_fast", "gelu_new", "gelu_python", "gelu_python_tanh",
               "gelu_pytorch_tanh", "hardswish", "laplace", "leaky_relu", "linear", "mish", "prelu", "quick_gelu",
               "relu", "relu2", "relu6", "sigmoid", "silu", "sqrtsoftplus", "swish", "tanh", "xielu")
#: transformers' RoPE types (``ROPE_INIT_FUNCTIONS`` plus ``default``).
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
#: What every layer of a DSA model is (the legacy name transformers still maps to it).
#: RoPE types that scale by a ``factor`` transformers requires.
_ROPE_SCALED = ("linear", "dynamic", "yarn", "llama3")
ATTENTION_LAYER_TYPES = ("indexed_attention", "deepseek_sparse_attention")
MLP_LAYER_TYPES = ("dense", "sparse")
INDEXER_TYPES = ("full", "shared")
#: transformers' defaults where a config leaves routing out.
_ROUTING_DEFAULTS = {"deepseek_v32": (8, 4), "glm_moe_dsa": (1, 1)}
_BOOLS = ("attention_bias", "mlp_bias", "tie_word_embeddings", "use_cache", "norm_topk_prob", "output_router_logits",
          "rope_interleave", "indexer_rope_interleave")
_STRINGS = ("scoring_func", "topk_method", "transformers_version")
_FIX = "fix that field or use the config.json published with the checkpoint"
_GEN_FIX = "fix that field or use the generation_config.json published with the checkpoint"
_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


# -- reading ---------------------------------------------------------------------------------------

def read_json_object(path: Path, what: str = "config.json", *, raw: list[bytes] | None = None) -> dict:
    """The JSON object in ``path``, refusing with one sentence a file that is too large, not UTF-8,
    not JSON, nested too deeply or not an object."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise DSAUserError(f"'{path}' is {size / 2**20:.0f} MiB, but a {what} is a few kilobytes; pass the "
                               f"{what} published with the checkpoint.")
        content = path.read_bytes()
        if raw is not None:
            raw.append(content)  # the bytes parsed, for a caller that also hashes them
        data = json.loads(content.decode("utf-8"))
    except DSAUserError:
        raise
    except OSError as exc:
        raise DSAUserError(f"'{path}' cannot be read ({exc.strerror or exc}); check its permissions.") from exc
    except UnicodeDecodeError as exc:
        raise DSAUserError(f"'{path}' is not UTF-8 text; pass the {what} published with the checkpoint.") from exc
    except json.JSONDecodeError as exc:
        raise DSAUserError(f"'{path}' is not valid JSON ({exc.msg} at line {exc.lineno}); pass the {what} "
                           "published with the checkpoint.") from exc
    except (ValueError, RecursionError) as exc:  # a number of thousands of digits, arrays nested thousands deep
        raise DSAUserError(f"'{path}' is not valid JSON ({_first_line(exc)}); pass the {what} published with "
                           "the checkpoint.") from exc
    if not isinstance(data, dict):
        raise DSAUserError(f"'{path}' holds {_kind(data)}, not a JSON object; pass the {what} published with the "
                           "checkpoint.")
    return data


def read_config(folder: Path) -> dict:
    """The validated config.json of a checkpoint folder, its generation_config.json checked too."""
    return read_config_and_digest(folder)[0]


def read_config_and_digest(folder: Path) -> tuple[dict, str]:
    """:func:`read_config` plus the sha256 of the config.json bytes it parsed (one read gives both)."""
    import hashlib

    folder = Path(folder)
    file = folder / "config.json"
    raw: list[bytes] = []
    config = validate_config(read_json_object(file, raw=raw), f"'{file}'")
    check_generation_config(folder, config)
    return config, hashlib.sha256(raw[0]).hexdigest()


# -- messages --------------------------------------------------------------------------------------

def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a true/false value"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return f"a list of {len(value)} entr{'y' if len(value) == 1 else 'ies'}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _show(value: Any) -> str:
    """``value`` as JSON, cut short, with its kind: ``"four" (text)``."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        text = f"a {len(str(abs(value)))}-digit number"
    else:
        try:
            text = json.dumps(value, allow_nan=True)
        except (TypeError, ValueError):
            text = repr(value)
    if len(text) > 60:
        text = text[:55] + "[...]"
    kind = _kind(value)
    return text if kind in ("a whole number", "null") else f"{text} ({kind})"


def _number_ok(value: Any, lo: float, hi: float, low_open: bool) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            and (lo < value if low_open else lo <= value) and value <= hi)


def _number_need(lo: float, hi: float, low_open: bool) -> str:
    return f"a number above {lo:g} and at most {hi:g}" if low_open else f"a number from {lo:g} to {hi:g}"


class _Fields:
    """Checks of one config object; ``where`` names its file in every message."""

    def __init__(self, data: dict, where: str, fix: str = _FIX):
        self.data, self.where, self.fix = data, where, fix

    def fail(self, key: str, need: str, value: Any = ...) -> DSAUserError:
        value = self.data.get(key) if value is ... else value
        return DSAUserError(f"{self.where}: field '{key}' is {_show(value)} but must be {need}; {self.fix}.")

    def missing(self, key: str, need: str) -> DSAUserError:
        return DSAUserError(f"{self.where} has no '{key}' ({need}); use the config.json published with the checkpoint.")

    def int(self, key: str, lo: int, hi: int, *, default: int | None = None, required: bool = False,
            nullable: bool = False) -> int | None:
        """A whole number in ``lo..hi``; ``default`` when absent (or null, if ``nullable``: transformers
        refuses null for the fields it declares as int)."""
        value = self.data.get(key)
        need = f"a whole number from {lo} to {hi}"
        if value is None:
            if required:
                raise self.missing(key, need)
            if key in self.data and not nullable:
                raise self.fail(key, need + " (or absent)")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(key, need)
        return value

    def number(self, key: str, lo: float, hi: float, *, low_open: bool = False) -> None:
        value = self.data.get(key)
        if key in self.data and not _number_ok(value, lo, hi, low_open):
            raise self.fail(key, _number_need(lo, hi, low_open) + (" (or absent)" if value is None else ""))

    def bool(self, key: str) -> None:
        value = self.data.get(key)
        if key in self.data and not isinstance(value, bool):
            raise self.fail(key, "true or false")

    def string(self, key: str, choices: tuple[str, ...] | None = None, *, nullable: bool = True) -> str | None:
        """Text (one of ``choices``), or None when absent (or null, if ``nullable``)."""
        value = self.data.get(key)
        if key not in self.data or (value is None and nullable):
            return None
        if not isinstance(value, str) or (choices is not None and value not in choices):
            need = "text" if choices is None else _one_of(choices)
            raise self.fail(key, need + (" (or absent)" if value is None or choices is None else ""))
        return value

    def names(self, key: str, choices: tuple[str, ...], length: int, what: str) -> list[str] | None:
        """A per-layer list of ``length`` names out of ``choices`` (or absent)."""
        value = self.data.get(key)
        if value is None:
            return None
        need = f"a list of {length} {what}, one per layer, each {_one_of(choices)}"
        if not isinstance(value, list) or len(value) != length:
            raise self.fail(key, need)
        for i, item in enumerate(value):
            if item not in choices or not isinstance(item, str):
                raise DSAUserError(f"{self.where}: entry {i} of field '{key}' is {_show(item)} but must be "
                                   f"{_one_of(choices)}; {self.fix}.")
        return value


def _one_of(choices: tuple[str, ...]) -> str:
    quoted = [f"'{c}'" for c in choices]
    return quoted[0] if len(quoted) == 1 else f"one of {', '.join(quoted)}"


# -- the schema ------------------------------------------------------------------------------------

def validate_config(config: Any, where: str = "config.json") -> dict:
    """``config`` (the parsed config.json of a DSA checkpoint) if every field dsa-export or
    transformers reads is well formed; else one :class:`DSAUserError` sentence naming the field.

    ``where`` names the file in messages (``"'/ckpt/config.json'"``). The config is returned
    unchanged.
    """
    if not isinstance(config, dict):
        raise DSAUserError(f"{where} holds {_kind(config)}, not a JSON object; pass the config.json published with "
                           "the checkpoint.")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        shown = model_type if isinstance(model_type, str) else _show(model_type)
        raise DSAUserError(f"{where} describes a '{shown[:60]}' model; dsa-export reads "
                           f"{' and '.join(SUPPORTED_TYPES)} checkpoints.")
    f = _Fields(config, where)

    # Layers first: every per-layer list is measured against them.
    n = f.int("num_hidden_layers", 1, MAX_LAYERS, required=True)
    mtp = f.int("num_nextn_predict_layers", 0, MAX_MTP_LAYERS, default=0, nullable=True)

    # Widths.
    hidden = f.int("hidden_size", 1, MAX_WIDTH, required=True)
    vocab = f.int("vocab_size", 1, MAX_VOCAB, required=True)
    heads = f.int("num_attention_heads", 1, MAX_HEADS, required=True)
    kv_heads = f.int("num_key_value_heads", 1, MAX_HEADS)
    if kv_heads is not None and heads % kv_heads:
        raise f.fail("num_key_value_heads", f"a divisor of num_attention_heads ({heads})")
    q_lora = f.int("q_lora_rank", 1, MAX_WIDTH, required=True)
    kv_lora = f.int("kv_lora_rank", 1, MAX_WIDTH, required=True)
    nope = f.int("qk_nope_head_dim", 1, MAX_WIDTH, required=True)
    rope = f.int("qk_rope_head_dim", 2, MAX_WIDTH, required=True)
    if rope % 2:
        raise f.fail("qk_rope_head_dim", "even (RoPE rotates pairs of dimensions)")
    v_dim = f.int("v_head_dim", 1, MAX_WIDTH, required=True)
    f.int("head_dim", 1, MAX_WIDTH)  # transformers sets both from the widths above
    f.int("qk_head_dim", 1, 2 * MAX_WIDTH, nullable=True)
    inter = f.int("intermediate_size", 1, MAX_WIDTH, required=True)
    moe_inter = f.int("moe_intermediate_size", 1, MAX_WIDTH, required=True)
    f.int("max_position_embeddings", 1, MAX_POSITIONS)

    # The indexer.
    index_heads = f.int("index_n_heads", 1, MAX_HEADS, required=True)
    index_dim = f.int("index_head_dim", 1, MAX_WIDTH, required=True)
    if rope > index_dim:
        raise f.fail("index_head_dim", f"at least qk_rope_head_dim ({rope}): the indexer rotates its leading "
                                       "qk_rope_head_dim dimensions")
    f.int("index_topk", 1, MAX_POSITIONS, required=True)

    # Experts and routing.
    experts = f.int("n_routed_experts", 1, MAX_EXPERTS, required=True)
    for alias in ("num_experts", "num_local_experts"):  # transformers reads them in place of n_routed_experts
        if config.get(alias) is not None and config.get(alias) != experts:
            raise f.fail(alias, f"absent or equal to n_routed_experts ({experts})")
    shared = f.int("n_shared_experts", 0, MAX_EXPERTS, default=0)
    per_token = f.int("num_experts_per_tok", 1, MAX_EXPERTS, required=True)
    if per_token > experts:
        raise f.fail("num_experts_per_tok", f"at most n_routed_experts ({experts})")
    default_groups, default_topk_groups = _ROUTING_DEFAULTS[model_type]
    groups = f.int("n_group", 1, MAX_EXPERTS, default=default_groups)
    topk_groups = f.int("topk_group", 1, MAX_EXPERTS, default=default_topk_groups)
    # More dense layers than layers is what a truncated test model keeps: all of them are dense.
    dense = min(f.int("first_k_dense_replace", 0, MAX_LAYERS, default=3), n)
    if config.get("moe_layer_freq") not in (None, 1) or isinstance(config.get("moe_layer_freq"), bool):
        raise f.fail("moe_layer_freq", "1 (or absent): transformers, and so dsa-export, makes every layer from "
                                       "first_k_dense_replace on a MoE layer")
    f.int("ep_size", 1, MAX_EXPERTS, nullable=True)
    f.number("routed_scaling_factor", 0, 1e6, low_open=True)

    # Per-layer lists.
    mlp_types = f.names("mlp_layer_types", MLP_LAYER_TYPES, n, "MLP types")
    if mlp_types is None:
        mlp_types = ["dense"] * dense + ["sparse"] * (n - dense)
    f.names("layer_types", ATTENTION_LAYER_TYPES, n, "attention types")
    indexer_types = _indexer_types(f, model_type, n)
    sparse = mlp_types.count("sparse") + mtp  # the MTP layers are MoE layers
    if sparse:
        if experts % groups:
            raise f.fail("n_group", f"a divisor of n_routed_experts ({experts})", groups)
        if groups > 1 and experts // groups < 2:
            raise f.fail("n_group", f"at most {experts // 2} so that each group holds 2 or more of the {experts} "
                                    "routed experts (the router ranks groups by their two best)", groups)
        if topk_groups > groups or topk_groups * (experts // groups) < per_token:
            raise f.fail("topk_group", f"at most n_group ({groups}) and large enough for its groups to hold "
                                       f"num_experts_per_tok ({per_token}) experts", topk_groups)

    # Everything else transformers reads from config.json.
    for key in _BOOLS:
        f.bool(key)
    for key in _STRINGS:
        f.string(key)
    f.string("hidden_act", ACTIVATIONS, nullable=False)
    architectures = config.get("architectures")
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(a, str) for a in architectures)):
        raise f.fail("architectures", "a list of class names")
    f.number("rms_norm_eps", 0, 1, low_open=True)
    f.number("initializer_range", 0, 1e3)
    f.number("attention_dropout", 0, 1)
    f.number("rope_theta", 0, 1e12, low_open=True)
    f.int("pretraining_tp", 1, MAX_HEADS, nullable=True)
    _check_dtype(f)
    _check_rope(f)
    _check_quantization(f)
    _check_token_ids(f, vocab)

    # The size of the whole model, by arithmetic.
    bias = bool(config.get("attention_bias", False))
    attention = (q_lora * hidden + q_lora + heads * (nope + rope) * q_lora + (kv_lora + rope) * hidden + kv_lora
                 + heads * (nope + v_dim) * kv_lora + hidden * heads * v_dim + 2 * hidden
                 + bias * (q_lora + kv_lora + rope + hidden))
    indexer = index_heads * index_dim * q_lora + index_dim * hidden + 2 * index_dim + index_heads * hidden
    moe = experts * hidden + experts + 3 * hidden * moe_inter * (experts + shared)
    layers = (n * attention + indexer_types.count("full") * indexer + mlp_types.count("dense") * 3 * hidden * inter
              + (n - mlp_types.count("dense")) * moe)
    mtp_layers = mtp * (attention + indexer + moe + 2 * hidden * hidden + 3 * hidden)
    total = layers + mtp_layers + 2 * vocab * hidden + hidden
    if total > MAX_PARAMETERS:
        raise DSAUserError(
            f"{where} describes a model of {total:.3g} parameters, more than the {MAX_PARAMETERS:.3g} dsa-export "
            f"plans or exports (DeepSeek-V3.2 has 6.7e+11): its num_hidden_layers ({n}), hidden_size ({hidden}), "
            f"intermediate sizes ({inter}, {moe_inter}), n_routed_experts ({experts}) or vocab_size ({vocab}) are "
            f"wrong; {_FIX}."
        )
    return config


def _indexer_types(f: _Fields, model_type: str, n: int) -> list[str]:
    """The validated per-layer indexer schedule, derived as transformers derives it."""
    config = f.data
    listed = f.names("indexer_types", INDEXER_TYPES, n, "indexer types")
    if model_type == "deepseek_v32":
        # transformers' DeepSeek-V3.2 runs its indexer on every layer; a stray list must agree.
        if listed is not None and "shared" in listed:
            raise f.fail("indexer_types", "absent or all 'full' for a deepseek_v32 model (every DeepSeek-V3.2 layer "
                                          "runs its own indexer)")
        return ["full"] * n
    # Each way to give the schedule is checked, whichever transformers takes: indexer_types, else
    # index_topk_pattern, else index_topk_freq / index_skip_topk_offset.
    pattern = config.get("index_topk_pattern")
    if isinstance(pattern, str):
        if len(pattern) != n or set(pattern) - {"F", "S"}:
            raise f.fail("index_topk_pattern", f"{n} letters F (full) or S (shared), one per layer")
        from_pattern = [{"F": "full", "S": "shared"}[c] for c in pattern]
    else:
        from_pattern = f.names("index_topk_pattern", INDEXER_TYPES, n, "indexer types")
    freq = f.int("index_topk_freq", 1, MAX_LAYERS, default=1)
    offset = f.int("index_skip_topk_offset", 0, MAX_LAYERS, default=2)
    if listed is not None:
        types = listed
    elif from_pattern is not None:
        types = from_pattern
    else:
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if types[0] != "full":
        source = ("indexer_types" if listed is not None else "index_topk_pattern" if pattern is not None
                  else "index_skip_topk_offset")
        raise DSAUserError(f"{f.where}: field '{source}' makes layer 0 'shared', but the first layer has no earlier "
                           f"selection to reuse and must run its own indexer ('full'); {f.fix}.")
    return types


def _check_dtype(f: _Fields) -> None:
    names = [f.string(key, tuple(CONFIG_DTYPES)) for key in ("dtype", "torch_dtype")]
    if None not in names and names[0] != names[1]:
        raise f.fail("torch_dtype", f"equal to dtype ('{names[0]}') when both are given")


def config_dtype(config: dict, default: str) -> str:
    """The export dtype (``fp32``/``fp16``/``bf16``) of a validated config's ``dtype``/``torch_dtype``."""
    name = config.get("dtype") or config.get("torch_dtype")
    return CONFIG_DTYPES[name] if name in CONFIG_DTYPES else default


def _check_rope(f: _Fields) -> None:
    for key in ("rope_scaling", "rope_parameters"):
        value = f.data.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise f.fail(key, "an object of RoPE settings (or null)")
        for name in ("type", "rope_type"):
            if value.get(name) is not None and value[name] not in ROPE_TYPES:
                raise DSAUserError(f"{f.where}: field '{key}.{name}' is {_show(value[name])} but must be "
                                   f"{_one_of(ROPE_TYPES)}; {f.fix}.")
        kind = value.get("rope_type", value.get("type")) or "default"
        if kind in _ROPE_SCALED and value.get("factor") is None:
            raise _nested(f, key, "factor", None, f"the scaling factor of '{kind}' RoPE, a number above 0")
        numbers = {"rope_theta": (0, 1e12, True), "factor": (0, 1e6, True), "attention_factor": (0, 1e3, False),
                   "beta_fast": (0, 1e6, False), "beta_slow": (0, 1e6, False), "mscale": (0, 1e3, False),
                   "mscale_all_dim": (0, 1e3, False), "low_freq_factor": (0, 1e6, False),
                   "high_freq_factor": (0, 1e6, False), "partial_rotary_factor": (0, 1, True)}
        for name, (lo, hi, low_open) in numbers.items():
            if value.get(name) is not None and not _number_ok(value[name], lo, hi, low_open):
                raise _nested(f, key, name, value[name], _number_need(lo, hi, low_open))
        original = value.get("original_max_position_embeddings")
        if original is not None and (isinstance(original, bool) or not isinstance(original, int)
                                     or not 1 <= original <= MAX_POSITIONS):
            raise _nested(f, key, "original_max_position_embeddings", original,
                          f"a whole number from 1 to {MAX_POSITIONS}")
        if value.get("truncate") is not None and not isinstance(value["truncate"], bool):
            raise _nested(f, key, "truncate", value["truncate"], "true or false")


def _nested(f: _Fields, key: str, name: str, value: Any, need: str) -> DSAUserError:
    return DSAUserError(f"{f.where}: field '{key}.{name}' is {_show(value)} but must be {need}; {f.fix}.")


def _check_quantization(f: _Fields) -> None:
    quant = f.data.get("quantization_config")
    if quant is None or quant == {}:
        return
    if not isinstance(quant, dict):
        raise f.fail("quantization_config", "an object (or null)")
    method = quant.get("quant_method")
    if method != "fp8":
        raise _nested(f, "quantization_config", "quant_method", method,
                      "'fp8' (dsa-export reads unquantized checkpoints and FP8 ones with block scales)")
    block = quant.get("weight_block_size")
    if block is not None:
        ok = (isinstance(block, list) and len(block) == 2
              and all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_WIDTH for b in block)
              and block[0] == block[1])
        if not ok:
            raise _nested(f, "quantization_config", "weight_block_size", block,
                          f"two equal whole numbers from 1 to {MAX_WIDTH} such as [128, 128]")
    for name in ("fmt", "activation_scheme", "scale_fmt"):
        if quant.get(name) is not None and not isinstance(quant[name], str):
            raise _nested(f, "quantization_config", name, quant[name], "text")
    skip = quant.get("modules_to_not_convert")
    if skip is not None and not (isinstance(skip, list) and all(isinstance(s, str) for s in skip)):
        raise _nested(f, "quantization_config", "modules_to_not_convert", skip, "a list of module names")


def _check_token_ids(f: _Fields, vocab: int | None) -> None:
    for key in _TOKEN_FIELDS:
        _token_ids(f, key, vocab)


def _token_ids(f: _Fields, key: str, vocab: int | None) -> tuple[int, ...] | None:
    """The ids of ``key`` (a token id, or a list of them for ``eos_token_id``); None when absent."""
    value = f.data.get(key)
    if value is None:
        return None
    top = f"{vocab - 1}" if vocab else "the vocabulary size - 1"
    need = (f"a token id from 0 to {top}" + (", or a list of them" if key == "eos_token_id" else "")
            + " (or null)")
    items = value if isinstance(value, list) and key == "eos_token_id" else [value]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0 or (vocab and item >= vocab):
            raise f.fail(key, need)
    return tuple(items)


# -- generation_config.json ------------------------------------------------------------------------

def _vocab_of(config: dict | None) -> int | None:
    vocab = (config or {}).get("vocab_size")
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and 1 <= vocab <= MAX_VOCAB else None


def check_generation_config(folder: Path, config: dict | None = None) -> dict | None:
    """The checkpoint's generation_config.json (None when there is none) with its token ids checked."""
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return None
    data = read_json_object(path, "generation_config.json")
    f = _Fields(data, f"'{path}'", _GEN_FIX)
    vocab = _vocab_of(config)
    for key in _TOKEN_FIELDS:
        _token_ids(f, key, vocab)
    return data


def read_end_of_sequence(folder: Path | None) -> tuple[tuple[int, ...], int | None]:
    """(end-of-sequence ids, padding id) of a checkpoint folder: from generation_config.json, else
    config.json, as transformers' ``generate`` takes them; ``((), None)`` when neither names one.

    Both files are untrusted: an id that is not a whole number from 0 to vocab_size - 1 (a list of
    them for ``eos_token_id``), or a file that is not a JSON object, is refused with one
    :class:`DSAUserError` sentence naming the file and the field.
    """
    if folder is None:
        return (), None
    folder = Path(folder)
    config_file = folder / "config.json"
    config = read_json_object(config_file) if config_file.is_file() else None
    vocab = _vocab_of(config)
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if not path.is_file():
            continue
        data = config if name == "config.json" else read_json_object(path, name)
        f = _Fields(data, f"'{path}'", _GEN_FIX if name == "generation_config.json" else _FIX)
        eos = _token_ids(f, "eos_token_id", vocab)
        pad = _token_ids(f, "pad_token_id", vocab)
        if eos is None:
            continue
        return eos, (pad[0] if pad else None)
    return (), None


__all__ = ["CONFIG_DTYPES", "MAX_CONFIG_BYTES", "MAX_LAYERS", "MAX_PARAMETERS", "SUPPORTED_TYPES",
           "check_generation_config", "config_dtype", "read_config", "read_config_and_digest", "read_end_of_sequence", "read_json_object",
           "validate_config"]
