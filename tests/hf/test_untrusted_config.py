"""config.json (and the token ids of generation_config.json) are untrusted input: every field is
checked by one schema (dsa_export.hf.config_schema) before any work, by every command that reads a
checkpoint's config: ``plan``, ``export`` (whole or as stages) and ``build`` given a checkpoint
folder (whole or as stages).

Each case below damages one field of a copy of a tiny checkpoint one way (a layer count that is
text, negative, zero, a float or a billion; a per-layer list of the wrong length; a dtype or token
id that is nonsense; a width that is a bool, zero or absurd; routing that does not divide; a model
too large to exist) and the commands must refuse it the house way: exit 1, one sentence naming
the field on stderr, no traceback, no "Internal error", no output file, the inputs untouched. Every
case goes through ``plan`` and through the loader that ``export`` and ``build`` share; one or two
cases of each class go through every command. The absurd layer counts must be refused by
arithmetic at once, never by trying.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import time
import tracemalloc
from pathlib import Path

import pytest

from dsa_export.errors import DSAUserError
from dsa_export.hf.config_schema import MAX_LAYERS, read_end_of_sequence, validate_config

CONFIG = "config.json"
GENERATION = "generation_config.json"
DROP = object()  # remove the field

# config.json of the tiny checkpoints of tests/hf/conftest.py as transformers 5 saves them.
_COMMON = {
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "dtype": "float32", "eos_token_id": 1,
    "first_k_dense_replace": 1, "head_dim": 8, "hidden_act": "silu", "hidden_size": 64, "index_head_dim": 32,
    "index_n_heads": 16, "index_topk": 8, "initializer_range": 0.02, "intermediate_size": 96, "kv_lora_rank": 32,
    "max_position_embeddings": 512, "mlp_bias": False, "moe_intermediate_size": 32, "n_group": 1,
    "n_routed_experts": 4, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 4,
    "num_experts_per_tok": 2, "num_key_value_heads": 4, "output_router_logits": False, "pad_token_id": None,
    "q_lora_rank": 48, "qk_head_dim": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "routed_scaling_factor": 2.5,
    "tie_word_embeddings": False, "topk_group": 1, "transformers_version": "5.24.0", "use_cache": True,
    "vocab_size": 128,
}
TINY = {
    "deepseek_v32": {**_COMMON, "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
                     "num_hidden_layers": 3, "rms_norm_eps": 1e-06, "v_head_dim": 16,
                     "layer_types": ["indexed_attention"] * 3, "mlp_layer_types": ["dense", "sparse", "sparse"]},
    "glm_moe_dsa": {**_COMMON, "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
                    "num_hidden_layers": 4, "rms_norm_eps": 1e-05, "v_head_dim": 24, "index_skip_topk_offset": 1,
                    "index_topk_freq": 2, "indexer_types": ["full", "shared", "full", "shared"],
                    "layer_types": ["indexed_attention"] * 4,
                    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"]},
}
TINY_GENERATION = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1, "transformers_version": "5.24.0"}


def write_tiny(folder: Path, kind: str) -> Path:
    """A checkpoint folder with the tiny config, its generation config and a shard holding no tensors:
    each case fails on config.json before a weight would be read."""
    folder.mkdir(parents=True)
    (folder / CONFIG).write_text(json.dumps(TINY[kind], indent=2))
    (folder / GENERATION).write_text(json.dumps(TINY_GENERATION, indent=2))
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    header += b" " * (-len(header) % 8)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


def _set(key, value, file=CONFIG):
    def damage(folder: Path) -> None:
        data = json.loads((folder / file).read_text())
        if value is DROP:
            data.pop(key, None)
        else:
            data[key] = value
        (folder / file).write_text(json.dumps(data))
    return damage


def _raw(text: str, file=CONFIG):
    def damage(folder: Path) -> None:
        (folder / file).write_text(text)
    return damage


def _widen(**fields):
    def damage(folder: Path) -> None:
        for key, value in fields.items():
            _set(key, value)(folder)
    return damage


def _raw_nan(key):
    def damage(folder: Path) -> None:
        data = json.loads((folder / CONFIG).read_text())
        data[key] = float("nan")
        (folder / CONFIG).write_text(json.dumps(data))  # written as the bare NaN Python's json reads back
    return damage


def _huge_file(folder: Path) -> None:
    data = json.loads((folder / CONFIG).read_text())
    data["padding"] = "x" * (17 << 20)
    (folder / CONFIG).write_text(json.dumps(data))


def _deep(folder: Path) -> None:
    data = (folder / CONFIG).read_text()
    (folder / CONFIG).write_text(data[:-1] + ', "nested": ' + "[" * 100_000 + "]" * 100_000 + "}")


V32, GLM = "deepseek_v32", "glm_moe_dsa"

# (case, checkpoint kind, damage, part of the message: the field it names)
CASES = [
    # the layer count
    ("layers-text", V32, _set("num_hidden_layers", "four"), "'num_hidden_layers'"),
    ("layers-negative", V32, _set("num_hidden_layers", -3), "'num_hidden_layers'"),
    ("layers-zero", V32, _set("num_hidden_layers", 0), "'num_hidden_layers'"),
    ("layers-float-1e9", V32, _set("num_hidden_layers", 1e9), "'num_hidden_layers'"),
    ("layers-billion", V32, _set("num_hidden_layers", 10**9), "'num_hidden_layers'"),
    ("layers-bool", V32, _set("num_hidden_layers", True), "'num_hidden_layers'"),
    ("layers-whole-float", V32, _set("num_hidden_layers", 3.0), "'num_hidden_layers'"),
    ("layers-above-bound", V32, _set("num_hidden_layers", MAX_LAYERS + 1), "'num_hidden_layers'"),
    ("layers-null", V32, _set("num_hidden_layers", None), "'num_hidden_layers'"),
    ("layers-missing", V32, _set("num_hidden_layers", DROP), "'num_hidden_layers'"),
    # per-layer lists against the layer count
    ("mlp-types-short", V32, _set("mlp_layer_types", ["dense"]), "'mlp_layer_types'"),
    ("mlp-types-long", V32, _set("mlp_layer_types", ["dense"] + ["sparse"] * 9), "'mlp_layer_types'"),
    ("mlp-types-unknown", V32, _set("mlp_layer_types", ["dense", "sparse", "evil"]), "'mlp_layer_types'"),
    ("mlp-types-text", V32, _set("mlp_layer_types", "dense"), "'mlp_layer_types'"),
    ("layer-types-short", V32, _set("layer_types", ["indexed_attention"]), "'layer_types'"),
    ("indexer-types-short", GLM, _set("indexer_types", ["full", "shared"]), "'indexer_types'"),
    ("indexer-types-long", GLM, _set("indexer_types", ["full"] * 40), "'indexer_types'"),
    ("indexer-types-unknown", GLM, _set("indexer_types", ["full", "evil", "full", "shared"]), "'indexer_types'"),
    ("indexer-types-first-shared", GLM, _set("indexer_types", ["shared", "full", "full", "full"]), "'indexer_types'"),
    ("indexer-types-v32-shared", V32, _set("indexer_types", ["full", "shared", "full"]), "'indexer_types'"),
    ("index-pattern-short", GLM, _set("index_topk_pattern", "FS"), "'index_topk_pattern'"),
    ("index-freq-text", GLM, _set("index_topk_freq", "2"), "'index_topk_freq'"),
    # dtypes
    ("dtype-evil", V32, _set("dtype", "evil"), "'dtype'"),
    ("torch-dtype-evil", V32, _set("torch_dtype", "evil"), "'torch_dtype'"),
    ("dtype-number", V32, _set("dtype", 16), "'dtype'"),
    ("dtypes-disagree", V32, _set("torch_dtype", "float16"), "'torch_dtype'"),
    # token ids, in config.json and in generation_config.json
    ("eos-evil", V32, _set("eos_token_id", "evil"), "'eos_token_id'"),
    ("eos-list-evil", V32, _set("eos_token_id", [1, "evil"]), "'eos_token_id'"),
    ("eos-outside-vocab", V32, _set("eos_token_id", 128), "'eos_token_id'"),
    ("eos-negative", V32, _set("eos_token_id", -1), "'eos_token_id'"),
    ("pad-bool", V32, _set("pad_token_id", True), "'pad_token_id'"),
    ("generation-eos-evil", V32, _set("eos_token_id", "evil", GENERATION), "'eos_token_id'"),
    ("generation-bos-float", V32, _set("bos_token_id", 0.5, GENERATION), "'bos_token_id'"),
    ("generation-not-object", V32, _raw("[1, 2]", GENERATION), GENERATION),
    # widths: wrong types (a bool is no number), non-positive, absurd
    ("hidden-bool", V32, _set("hidden_size", True), "'hidden_size'"),
    ("hidden-text", V32, _set("hidden_size", "64"), "'hidden_size'"),
    ("hidden-zero", V32, _set("hidden_size", 0), "'hidden_size'"),
    ("hidden-absurd", V32, _set("hidden_size", 10**12), "'hidden_size'"),
    ("intermediate-list", V32, _set("intermediate_size", [96]), "'intermediate_size'"),
    ("moe-intermediate-negative", V32, _set("moe_intermediate_size", -32), "'moe_intermediate_size'"),
    ("heads-zero", V32, _set("num_attention_heads", 0), "'num_attention_heads'"),
    ("kv-heads-not-divisor", V32, _set("num_key_value_heads", 3), "'num_key_value_heads'"),
    ("kv-lora-text", V32, _set("kv_lora_rank", "32"), "'kv_lora_rank'"),
    ("q-lora-null", V32, _set("q_lora_rank", None), "'q_lora_rank'"),
    ("rope-odd", V32, _set("qk_rope_head_dim", 7), "'qk_rope_head_dim'"),
    ("rope-float", V32, _set("qk_rope_head_dim", 8.5), "'qk_rope_head_dim'"),
    ("nope-zero", V32, _set("qk_nope_head_dim", 0), "'qk_nope_head_dim'"),
    ("v-head-bool", V32, _set("v_head_dim", False), "'v_head_dim'"),
    ("index-topk-zero", V32, _set("index_topk", 0), "'index_topk'"),
    ("index-heads-missing", V32, _set("index_n_heads", DROP), "'index_n_heads'"),
    ("index-dim-below-rope", V32, _set("index_head_dim", 4), "'index_head_dim'"),
    ("experts-absurd", V32, _set("n_routed_experts", 10**6), "'n_routed_experts'"),
    ("experts-per-token-above", V32, _set("num_experts_per_tok", 5), "'num_experts_per_tok'"),
    ("experts-alias-disagrees", V32, _set("num_experts", 8), "'num_experts'"),
    ("groups-not-divisor", V32, _set("n_group", 3), "'n_group'"),
    ("topk-group-above", V32, _set("topk_group", 2), "'topk_group'"),
    ("vocab-zero", V32, _set("vocab_size", 0), "'vocab_size'"),
    ("positions-text", V32, _set("max_position_embeddings", "big"), "'max_position_embeddings'"),
    ("dense-negative", V32, _set("first_k_dense_replace", -1), "'first_k_dense_replace'"),
    ("dense-above-layers", V32, _set("first_k_dense_replace", 10**9), "'first_k_dense_replace'"),
    ("moe-freq-zero", V32, _set("moe_layer_freq", 0), "'moe_layer_freq'"),
    ("mtp-absurd", V32, _set("num_nextn_predict_layers", 10**9), "'num_nextn_predict_layers'"),
    ("eps-negative", V32, _set("rms_norm_eps", -1e-6), "'rms_norm_eps'"),
    ("scaling-nan", V32, _raw_nan("routed_scaling_factor"), "'routed_scaling_factor'"),
    ("bias-text", V32, _set("attention_bias", "false"), "'attention_bias'"),
    ("activation-evil", V32, _set("hidden_act", "evil"), "'hidden_act'"),
    ("rope-parameters-text", V32, _set("rope_parameters", "yarn"), "'rope_parameters'"),
    ("rope-type-evil", V32, _set("rope_parameters", {"rope_type": "evil", "rope_theta": 10000.0}),
     "'rope_parameters.rope_type'"),
    ("rope-yarn-no-factor", V32, _set("rope_parameters", {"rope_type": "yarn", "rope_theta": 10000.0}),
     "'rope_parameters.factor'"),
    ("rope-scaling-factor-text", V32, _set("rope_scaling", {"type": "yarn", "factor": "40"}), "'rope_scaling.factor'"),
    ("rope-theta-negative", V32, _set("rope_parameters", {"rope_type": "default", "rope_theta": -1}),
     "'rope_parameters.rope_theta'"),
    # quantization
    ("quant-not-object", V32, _set("quantization_config", "fp8"), "'quantization_config'"),
    ("quant-method-evil", V32, _set("quantization_config", {"quant_method": "evil"}),
     "'quantization_config.quant_method'"),
    ("quant-block-short", V32, _set("quantization_config", {"quant_method": "fp8", "weight_block_size": [128]}),
     "'quantization_config.weight_block_size'"),
    ("quant-block-zero", V32, _set("quantization_config", {"quant_method": "fp8", "weight_block_size": [0, 0]}),
     "'quantization_config.weight_block_size'"),
    ("quant-block-bool", V32, _set("quantization_config", {"quant_method": "fp8", "weight_block_size": [True, True]}),
     "'quantization_config.weight_block_size'"),
    # the whole file, and the size of the whole model
    ("model-type-evil", V32, _set("model_type", "evil"), "dsa-export reads deepseek_v32 and glm_moe_dsa"),
    ("model-type-list", V32, _set("model_type", ["deepseek_v32"]), "dsa-export reads deepseek_v32 and glm_moe_dsa"),
    ("config-list", V32, _raw("[1, 2, 3]"), "not a JSON object"),
    ("config-not-json", V32, _raw("{num_hidden_layers: 3"), "is not valid JSON"),
    ("config-huge-number", V32, _raw('{"model_type": "deepseek_v32", "num_hidden_layers": ' + "9" * 5000 + "}"),
     "is not valid JSON"),
    ("config-deep", V32, _deep, "is not valid JSON"),
    ("config-huge-file", V32, _huge_file, "a config.json is a few kilobytes"),
    ("model-too-large", V32, _widen(hidden_size=1 << 20, intermediate_size=1 << 20, moe_intermediate_size=1 << 20,
                                    n_routed_experts=4096, num_hidden_layers=1000, mlp_layer_types=DROP,
                                    layer_types=DROP), "num_hidden_layers (1000)"),
]
COMMANDS = ["plan", "export", "export-stages", "build", "build-stages"]
# Through the CLI, every case runs through plan (which reads config.json with
# dsa_export.hf.sizes.Geometry) and one or two cases of each class through every command; export
# (whole or as stages) and build (whole or as stages) all read the checkpoint with
# dsa_export.hf.loader.inspect_checkpoint, which test_loader_refuses_every_case gives every case.
EVERY_COMMAND = {"layers-text", "layers-float-1e9", "layers-billion", "mlp-types-short", "indexer-types-long",
                 "dtype-evil", "eos-evil", "generation-eos-evil", "hidden-bool", "kv-heads-not-divisor",
                 "quant-block-short", "model-too-large"}
RUNS = [(c[0], c[3], command) for c in CASES for command in (COMMANDS if c[0] in EVERY_COMMAND else COMMANDS[:1])]


def _argv(command: str, folder: Path, out: Path) -> list[str]:
    return {
        "plan": ["plan", str(folder), "--gpu-memory", "141GiB"],
        "export": ["export", str(folder), "-o", str(out / "model.onnx")],
        "export-stages": ["export", str(folder), "--stages", "2", "-o", str(out / "stages")],
        "build": ["build", str(folder), "-o", str(out / "build")],
        "build-stages": ["build", str(folder), "--stages", "2", "-o", str(out / "build-stages")],
    }[command]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            stat = (Path(dirpath) / name).lstat()
            state[str(Path(dirpath, name).relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return state


@pytest.fixture(scope="module")
def bad_configs(tmp_path_factory):
    """One damaged copy of a tiny checkpoint folder per case."""
    root = tmp_path_factory.mktemp("untrusted-config")
    folders = {}
    for name, kind, damage, _ in CASES:
        damage(write_tiny(root / name, kind))
        folders[name] = root / name
    return root, folders


@pytest.fixture(scope="module")
def fast_probe():
    from dsa_export.compat import probe_environment

    return probe_environment()


def _run(argv: list[str], capsys) -> tuple[int, str]:
    from dsa_export.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    _, err = capsys.readouterr()
    return exit_info.value.code, err


@pytest.mark.parametrize("name,field,command", RUNS, ids=[f"{name}-{command}" for name, _, command in RUNS])
def test_refused_cleanly(bad_configs, fast_probe, capsys, monkeypatch, tmp_path, command, name, field):
    root, folders = bad_configs
    monkeypatch.setattr("dsa_export.compat.probe_environment", lambda *a, **k: fast_probe)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "out"
    before = _snapshot(root)
    code, err = _run(_argv(command, folders[name], out), capsys)
    # A stage build announces its export step before the export reads the checkpoint.
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("Exporting the stages of ")]
    assert code == 1, err
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "Traceback" not in err and "Internal error" not in err
    assert field in lines[0], err
    assert lines[0].endswith(".") and ". " not in lines[0][len("Error: "):], err  # one sentence
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())
    assert _snapshot(root) == before


@pytest.mark.parametrize("name,field", [(c[0], c[3]) for c in CASES], ids=[c[0] for c in CASES])
def test_loader_refuses_every_case(bad_configs, name, field):
    """The reader of export and build: one user-error sentence naming the field, for every case."""
    from dsa_export.hf.loader import inspect_checkpoint

    _, folders = bad_configs
    with pytest.raises(DSAUserError) as info:
        inspect_checkpoint(folders[name])
    text = str(info.value)
    assert field in text and text.endswith(".") and "\n" not in text and ". " not in text, text


@pytest.mark.parametrize("layers", [10**9, 1e9, 10**18])
def test_absurd_layer_counts_are_refused_by_arithmetic(tmp_path, capsys, layers):
    """``plan`` refuses a billion layers at once, allocating next to nothing (it used to take 44 s and 15 GB)."""
    folder = write_tiny(tmp_path / "ckpt", V32)
    _set("num_hidden_layers", layers)(folder)
    _set("mlp_layer_types", DROP)(folder)
    _set("layer_types", DROP)(folder)
    tracemalloc.start()
    began = time.perf_counter()
    try:
        code, err = _run(_argv("plan", folder, tmp_path / "out"), capsys)
    finally:
        seconds = time.perf_counter() - began
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert code == 1 and "'num_hidden_layers'" in err and "Internal error" not in err, err
    assert seconds < 5, seconds
    assert peak < 256 << 20, peak


# -- the schema on its own -------------------------------------------------------------------------

def _published() -> list[dict]:
    from tests.stages.test_plan import GLM5
    from tests.stages.test_plan import V32 as V32_CONFIG

    return [V32_CONFIG, GLM5]


@pytest.mark.parametrize("kind", [V32, GLM])
def test_published_and_synthetic_configs_pass(kind):
    """The published configs, and the synthetic generator's at full and narrow width, pass unchanged."""
    from dsa_export.hf.synthetic_plan import NARROW, plan_checkpoint

    for config in _published():
        assert validate_config(config) is config
    full = plan_checkpoint(kind, layers=61 if kind == V32 else 78, dense_layers=3, experts=256, precision="fp8",
                           mtp=True)
    assert validate_config(full.config) is full.config
    for precision in ("bf16", "fp8"):
        narrow = plan_checkpoint(kind, layers=2, dense_layers=1, experts=4, precision=precision, **NARROW[kind])
        validate_config(narrow.config)


@pytest.mark.parametrize("kind", [V32, GLM])
def test_tiny_configs_pass(tmp_path, kind):
    from dsa_export.hf.loader import inspect_checkpoint
    from dsa_export.stages.plan import plan_stages

    folder = write_tiny(tmp_path / kind, kind)
    assert inspect_checkpoint(folder).num_layers == TINY[kind]["num_hidden_layers"]
    assert plan_stages(TINY[kind], gpu_memory_bytes="141GiB").num_stages == 1
    assert read_end_of_sequence(folder) == ((1,), None)


def test_every_refusal_is_a_user_error():
    """The schema raises DSAUserError for any JSON value in any field, never another exception."""
    from tests.stages.test_plan import V32 as V32_CONFIG

    odd = [None, True, False, -1, 0, 1, 2**70, 1.5, float("nan"), float("inf"), "", "evil", [], [1], {}, {"a": 1}]
    for key in list(V32_CONFIG) + ["mlp_layer_types", "layer_types", "indexer_types", "eos_token_id", "rope_scaling",
                                   "rope_parameters", "dtype", "n_group", "topk_group", "num_key_value_heads"]:
        for value in odd:
            try:
                validate_config({**V32_CONFIG, key: value})
            except DSAUserError as exc:
                text = str(exc)
                assert "\n" not in text and text.endswith("."), text
            quant = {**V32_CONFIG["quantization_config"], "weight_block_size": value}
            with pytest.raises(DSAUserError) if value is not None else contextlib.nullcontext():
                validate_config({**V32_CONFIG, "quantization_config": quant})


@pytest.mark.parametrize("files,expected", [
    ({GENERATION: {"eos_token_id": [1, 2], "pad_token_id": 0}}, ((1, 2), 0)),
    ({GENERATION: {"bos_token_id": 0}, CONFIG: {"vocab_size": 8, "eos_token_id": 3}}, ((3,), None)),
    ({CONFIG: {"vocab_size": 8}}, ((), None)),
    ({}, ((), None)),
])
def test_read_end_of_sequence(tmp_path, files, expected):
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    assert read_end_of_sequence(tmp_path) == expected
    assert read_end_of_sequence(None) == ((), None)


@pytest.mark.parametrize("files,field", [
    ({GENERATION: {"eos_token_id": "evil"}}, "'eos_token_id'"),
    ({CONFIG: {"eos_token_id": "evil"}}, "'eos_token_id'"),
    ({CONFIG: {"vocab_size": 8}, GENERATION: {"eos_token_id": 8}}, "from 0 to 7"),
    ({GENERATION: {"eos_token_id": 1, "pad_token_id": [0]}}, "'pad_token_id'"),
    ({GENERATION: {"eos_token_id": True}}, "'eos_token_id'"),
    ({GENERATION: [1]}, "not a JSON object"),
])
def test_read_end_of_sequence_refuses_bad_ids(tmp_path, files, field):
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    with pytest.raises(DSAUserError, match=field.replace("(", r"\(")) as info:
        read_end_of_sequence(tmp_path)
    assert "\n" not in str(info.value)
