"""Synthetic checkpoints: published format, loadable by transformers, reproducible, real widths."""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from pathlib import Path

import pytest

from dsa_export.errors import DSAUserError

from . import realwidth

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")

from dsa_export.hf import synthetic  # noqa: E402
from dsa_export.hf.synthetic import NARROW, dequantize_fp8, plan_checkpoint, write_checkpoint  # noqa: E402

REALWIDTH_CI = realwidth.REALWIDTH_CI
# The session fixtures, usable here whether or not a conftest imports them too.
synthetic_checkpoint_factory = realwidth.synthetic_checkpoint_factory
realwidth_checkpoint_factory = realwidth.realwidth_checkpoint_factory
realwidth_checkpoint = realwidth.realwidth_checkpoint

_EXPERT = re.compile(r"(?P<base>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")
# A GLM-5 schedule with a shared layer (2): indexer_types full, full, shared.
_GLM_SCHEDULE = dict(index_topk_freq=2, index_skip_topk_offset=2)


def narrow_args(kind: str, precision: str, **changes) -> dict:
    args = dict(layers=3, dense_layers=1, experts=4, precision=precision, vocab_size=512, index_topk=16,
                shard_bytes=1_500_000, **NARROW[kind])
    if kind == "glm_moe_dsa":
        args.update(_GLM_SCHEDULE)
    return {**args, **changes}


def load_transformers(path: Path, fp8: bool):
    """As dsa_export.hf.loader loads: float32, FP8 dequantized by transformers on load."""
    kwargs = {}
    if fp8:
        kwargs["quantization_config"] = transformers.FineGrainedFP8Config(dequantize=True, weight_block_size=(128, 128))
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, local_files_only=True, output_loading_info=True, **kwargs)


def expected_value(plan, name: str):
    spec = plan.spec(name)
    if spec.fp8:
        return dequantize_fp8(plan.tensor(name), plan.tensor(name + "_scale_inv"))
    return plan.tensor(name).float()


def loaded_value(state: dict, name: str):
    """The part of a transformers parameter that checkpoint tensor ``name`` became."""
    match = _EXPERT.match(name)
    if match is None:
        return state[name]
    e = int(match["e"])
    if match["proj"] == "down":
        return state[match["base"] + ".down_proj"][e]
    gate_up = state[match["base"] + ".gate_up_proj"][e]  # [gate; up] along the rows
    half = gate_up.shape[0] // 2
    return gate_up[:half] if match["proj"] == "gate" else gate_up[half:]


def stacked_name(name: str) -> str:
    """The transformers parameter a checkpoint tensor loads into (experts are stacked)."""
    return _EXPERT.sub(lambda m: m["base"] + (".down_proj" if m["proj"] == "down" else ".gate_up_proj"), name)


def read_header(file: Path) -> tuple[int, dict]:
    with open(file, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return size, json.loads(f.read(size))


def file_digests(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


# -- narrow checkpoints through transformers --------------------------------------------------------

@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize("kind", ["deepseek_v32", "glm_moe_dsa"])
def test_narrow_checkpoint_loads_in_transformers_with_the_values_written(synthetic_checkpoint_factory, kind,
                                                                         precision):
    info = synthetic_checkpoint_factory(kind, **narrow_args(kind, precision))
    model, loading = load_transformers(info.path, fp8=precision == "fp8")
    assert not loading["missing_keys"] and not loading["unexpected_keys"] and not loading["mismatched_keys"]
    assert model.config.model_type == kind and model.config.num_hidden_layers == 3
    if kind == "glm_moe_dsa":
        assert model.config.indexer_types == ["full", "full", "shared"]
        assert model.model.layers[2].self_attn.indexer is None
    state = model.state_dict()
    covered = set()
    for spec in info.plan.tensors:
        if spec.scale_of is not None:
            continue
        got = loaded_value(state, spec.name)
        # bf16 and float32 tensors load bit-exactly; FP8 ones equal weight * weight_scale_inv exactly.
        assert torch.equal(got, expected_value(info.plan, spec.name)), spec.name
        covered.add(stacked_name(spec.name))
    assert covered == set(state)  # every parameter and buffer of the model came from the checkpoint


def test_mtp_layer_is_written_and_is_the_only_thing_transformers_does_not_load(synthetic_checkpoint_factory):
    info = synthetic_checkpoint_factory("deepseek_v32", **narrow_args("deepseek_v32", "fp8", mtp=True))
    mtp = {t.name for t in info.plan.tensors if t.name.startswith("model.layers.3.")}
    for name in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                 "shared_head.head.weight", "embed_tokens.weight", "self_attn.indexer.wq_b.weight",
                 "mlp.experts.3.down_proj.weight_scale_inv", "mlp.gate.e_score_correction_bias"):
        assert f"model.layers.3.{name}" in mtp
    assert info.plan.spec("model.layers.3.eh_proj.weight").shape == (256, 512)
    assert info.config["num_nextn_predict_layers"] == 1
    _, loading = load_transformers(info.path, fp8=True)
    assert not loading["missing_keys"]
    # transformers ignores only model.layers.61 / 78 (the published depths); here the MTP keys are unexpected.
    assert loading["unexpected_keys"] and all(k.startswith("model.layers.3.") for k in loading["unexpected_keys"])
    assert {stacked_name(k) for k in mtp} >= set(loading["unexpected_keys"])


@pytest.mark.xfail(strict=True, raises=RuntimeError,
                   reason="transformers 5.24's Fp8Dequantize takes the block size from the scale grid and "
                          "rejects kv_a_proj_with_mqa's 576 rows in ceil(576/128) = 5 blocks, as in the real models")
def test_transformers_dequantizes_partial_fp8_blocks(tmp_path):
    widths = dict(NARROW["deepseek_v32"], kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128)
    info = write_checkpoint(tmp_path / "ckpt", "deepseek_v32", layers=1, dense_layers=1, experts=2,
                            precision="fp8", vocab_size=256, **widths)
    assert info.plan.spec("model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv").shape == (5, 2)
    model, _ = load_transformers(info.path, fp8=True)
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    assert torch.equal(model.state_dict()[name], expected_value(info.plan, name))


# -- the files ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,precision", [("deepseek_v32", "fp8"), ("glm_moe_dsa", "fp8"), ("glm_moe_dsa", "bf16")])
def test_files_are_safetensors_shards_indexed_once_each_and_bounded(synthetic_checkpoint_factory, kind, precision):
    from safetensors import safe_open

    info = synthetic_checkpoint_factory(kind, **narrow_args(kind, precision))
    index = json.loads((info.path / "model.safetensors.index.json").read_text())
    width = 6 if kind == "deepseek_v32" else 5
    n = len(info.shard_files)
    assert n > 1 and list(info.shard_files) == [f"model-{i:05d}-of-{n:0{width}d}.safetensors" for i in range(1, n + 1)]
    assert sorted(p.name for p in info.path.iterdir()) == sorted(
        [*info.shard_files, "config.json", "generation_config.json", "model.safetensors.index.json"])
    largest_unit = max(s.nbytes + (info.plan.spec(s.name + "_scale_inv").nbytes if s.fp8 else 0)
                       for s in info.plan.tensors if s.scale_of is None)
    seen: dict[str, str] = {}
    total = 0
    for file in info.shard_files:
        size, header = read_header(info.path / file)
        assert size % 8 == 0 and header.pop("__metadata__") == {"format": "pt"}
        data = sum(end - start for start, end in (v["data_offsets"] for v in header.values()))
        assert (info.path / file).stat().st_size == 8 + size + data
        assert data <= max(info.plan.shard_bytes, largest_unit)
        total += data
        with safe_open(str(info.path / file), framework="pt") as f:  # validates offsets (no holes or overlaps)
            for key in f.keys():
                assert key not in seen, f"{key} is in {seen.get(key)} and {file}"
                seen[key] = file
                spec = info.plan.spec(key)
                assert header[key]["dtype"] == spec.dtype and tuple(header[key]["shape"]) == spec.shape
                if key.endswith("_scale_inv"):
                    assert seen[spec.scale_of] == file  # a weight and its scale share a shard
    assert seen == index["weight_map"] and set(seen) == {t.name for t in info.plan.tensors}
    assert total == index["metadata"]["total_size"] == info.total_bytes
    assert info.disk_bytes == sum(p.stat().st_size for p in info.path.iterdir())


def test_fp8_dtypes_follow_the_published_checkpoints():
    plan = plan_checkpoint("deepseek_v32", **narrow_args("deepseek_v32", "fp8"))
    dtypes = {t.name: t.dtype for t in plan.tensors}
    for name, dtype in dtypes.items():
        if name.endswith("_scale_inv"):
            weight = plan.spec(plan.spec(name).scale_of)
            assert dtype == "F32" and plan.spec(name).shape == tuple(math.ceil(d / 128) for d in weight.shape)
        elif re.search(r"(?<!weights)(_proj|_proj_with_mqa|indexer\.wq_b|indexer\.wk)\.weight$", name):
            assert dtype == "F8_E4M3", name  # attention, indexer wq_b / wk, MLP, shared and routed experts
        elif name.endswith(("e_score_correction_bias", "k_norm.weight", "k_norm.bias")):
            assert dtype == "F32", name
        else:  # embeddings, lm_head, norms, router, weights_proj
            assert dtype == "BF16", name
    assert plan.config["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                                  "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}
    glm = plan_checkpoint("glm_moe_dsa", **narrow_args("glm_moe_dsa", "fp8"))
    assert glm.spec("model.layers.0.self_attn.indexer.k_norm.weight").dtype == "BF16"
    quant = glm.config["quantization_config"]
    assert "scale_fmt" not in quant and "model.layers.1.self_attn.indexer.weights_proj" in quant["modules_to_not_convert"]
    assert not any(t.name.startswith("model.layers.2.self_attn.indexer") for t in glm.tensors)  # a shared layer


def test_fp8_is_the_bf16_checkpoint_quantized_per_128_block(synthetic_checkpoint_factory):
    bf16 = synthetic_checkpoint_factory("glm_moe_dsa", **narrow_args("glm_moe_dsa", "bf16"))
    fp8 = synthetic_checkpoint_factory("glm_moe_dsa", **narrow_args("glm_moe_dsa", "fp8"))
    deepseek = plan_checkpoint("deepseek_v32", **narrow_args("deepseek_v32", "fp8"))
    quantized = [t for t in fp8.plan.tensors if t.fp8]
    for spec in quantized[:12]:
        weight = bf16.plan.tensor(spec.name).float()
        scale = fp8.plan.tensor(spec.name + "_scale_inv")
        blocks = torch.nn.functional.pad(weight, (0, -weight.shape[1] % 128, 0, -weight.shape[0] % 128))
        amax = blocks.reshape(scale.shape[0], 128, scale.shape[1], 128).abs().amax(dim=(1, 3))
        assert torch.equal(scale, amax / 448)  # GLM: plain amax / 448
        error = (dequantize_fp8(fp8.plan.tensor(spec.name), scale) - weight).abs()
        # e4m3: half an ulp is at most 1/16 of the value; 2^-10 * scale below the normal range.
        bound = weight.abs() / 16 + scale.repeat_interleave(128, 0)[: weight.shape[0]].repeat_interleave(128, 1)[
            :, : weight.shape[1]] * 2.0**-10
        assert (error <= bound).all(), spec.name
    for spec in [t for t in deepseek.tensors if t.fp8][:6]:
        scale = deepseek.tensor(spec.name + "_scale_inv")
        assert torch.equal(scale, torch.exp2(torch.log2(scale).round()))  # ue8m0: powers of two


def test_same_seed_same_bytes_other_seed_other_values(tmp_path):
    args = narrow_args("deepseek_v32", "fp8", layers=2, experts=2)
    first = write_checkpoint(tmp_path / "a", "deepseek_v32", seed=7, **args)
    second = write_checkpoint(tmp_path / "b", "deepseek_v32", seed=7, **args)
    other = write_checkpoint(tmp_path / "c", "deepseek_v32", seed=8, **args)
    assert file_digests(first.path) == file_digests(second.path)
    a, c = file_digests(first.path), file_digests(other.path)
    for name in ("config.json", "generation_config.json", "model.safetensors.index.json"):
        assert a[name] == c[name]
    assert all(a[f] != c[f] for f in first.shard_files)
    assert read_header(first.path / first.shard_files[0]) == read_header(other.path / other.shard_files[0])
    # Any tensor regenerates alone, and the RNG blocks do not depend on the shard layout.
    from safetensors import safe_open

    name = "model.layers.1.mlp.experts.1.up_proj.weight"
    file = json.loads((first.path / "model.safetensors.index.json").read_text())["weight_map"][name]
    with safe_open(str(first.path / file), framework="pt") as f:
        assert torch.equal(f.get_tensor(name).view(torch.uint8), first.plan.tensor(name).view(torch.uint8))
    resharded = plan_checkpoint("deepseek_v32", seed=7, **{**args, "shard_bytes": 10**9})
    assert torch.equal(resharded.tensor(name).view(torch.uint8), first.plan.tensor(name).view(torch.uint8))


# -- real widths -------------------------------------------------------------------------------------

def test_published_widths_and_sizes_are_planned_exactly():
    deepseek = plan_checkpoint("deepseek_v32", layers=61, dense_layers=3, experts=256, precision="fp8", mtp=True)
    defaults = transformers.DeepseekV32Config()
    for key in ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads", "q_lora_rank",
                "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads",
                "index_head_dim", "index_topk", "vocab_size", "n_group", "topk_group", "num_experts_per_tok"):
        assert deepseek.config[key] == getattr(defaults, key), key
    assert deepseek.config["rope_scaling"]["factor"] == 40 and deepseek.config["rope_theta"] == 10000
    # DeepSeek-V3 publishes 688,586,727,753 bytes of safetensors files (same layout without the
    # indexer); the 11.9 MB left over are the files' JSON headers.
    indexer = sum(t.nbytes for t in deepseek.tensors if ".indexer." in t.name)
    assert deepseek.total_bytes - indexer == 688_574_839_360
    assert 0 < 688_586_727_753 - (deepseek.total_bytes - indexer) < 0.02 * 10**9
    # GLM-5.2-FP8 (IndexShare every 4 layers from layer 2, MTP layer 78): 755,632,050,320 bytes of files.
    glm = plan_checkpoint("glm_moe_dsa", layers=78, dense_layers=3, experts=256, precision="fp8", mtp=True,
                          index_topk_freq=4, index_skip_topk_offset=3)
    full = [i for i, t in enumerate(glm.config["indexer_types"]) if t == "full"]
    assert full == [0, 1, 2, *range(6, 78, 4)]
    assert 0 < 755_632_050_320 - glm.total_bytes < 0.02 * 10**9
    assert {t.layer for t in glm.tensors if ".indexer." in t.name} == {*full, 78}


@pytest.mark.parametrize("experts,groups,topk_groups,per_token", [(2, 1, 1, 1), (4, 2, 1, 2), (8, 4, 2, 4),
                                                                  (16, 8, 4, 8), (12, 6, 3, 6), (256, 8, 4, 8)])
def test_deepseek_group_routing_is_adapted_to_the_expert_count(experts, groups, topk_groups, per_token):
    config = plan_checkpoint("deepseek_v32", layers=1, dense_layers=0, experts=experts, vocab_size=256,
                             **NARROW["deepseek_v32"]).config
    assert (config["n_group"], config["topk_group"], config["num_experts_per_tok"]) == (groups, topk_groups, per_token)
    glm = plan_checkpoint("glm_moe_dsa", layers=1, dense_layers=0, experts=experts, vocab_size=256).config
    assert (glm["n_group"], glm["topk_group"], glm["num_experts_per_tok"]) == (1, 1, per_token)


def test_realwidth_checkpoint_has_deepseek_shapes_for_transformers(realwidth_checkpoint):
    from safetensors import safe_open

    info = realwidth_checkpoint
    assert info.disk_bytes < 3 * 10**9 and info.config["hidden_size"] == 7168 and info.config["vocab_size"] == 2048
    config = transformers.AutoConfig.from_pretrained(str(info.path))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    wanted = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    index = json.loads((info.path / "model.safetensors.index.json").read_text())["weight_map"]
    stacked: dict[str, list] = {}
    for name in index:
        match = _EXPERT.match(name)
        if match is None:
            assert tuple(info.plan.spec(name).shape) == wanted.pop(name), name
        else:
            key = match["base"] + (".down_proj" if match["proj"] == "down" else ".gate_up_proj")
            stacked.setdefault(key, []).append(info.plan.spec(name).shape)
    for key, shapes in stacked.items():
        e, rows, cols = wanted.pop(key)
        assert len(shapes) == e * (1 if key.endswith("down_proj") else 2)
        assert all(shape == (rows if key.endswith("down_proj") else rows // 2, cols) for shape in shapes)
    assert not wanted
    for name in ("model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                 "model.layers.1.mlp.gate.e_score_correction_bias", "lm_head.weight"):
        with safe_open(str(info.path / index[name]), framework="pt") as f:
            assert torch.equal(f.get_tensor(name), info.plan.tensor(name)), name


def test_realwidth_fp8_scales_cover_partial_blocks(realwidth_checkpoint_factory):
    from safetensors import safe_open

    info = realwidth_checkpoint_factory(precision="fp8", layers=1, dense_layers=0)
    index = json.loads((info.path / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"  # 576 = 4.5 blocks of rows
    with safe_open(str(info.path / index[name]), framework="pt") as f:
        weight, scale = f.get_tensor(name), f.get_tensor(name + "_scale_inv")
    assert weight.dtype == torch.float8_e4m3fn and weight.shape == (576, 7168) and scale.shape == (5, 56)
    assert torch.equal(scale, torch.exp2(torch.log2(scale).round()))  # ue8m0
    args = {**REALWIDTH_CI, "precision": "bf16", "layers": 1, "dense_layers": 0}
    value = plan_checkpoint(args.pop("kind"), **args).tensor(name).float()  # the same draws, unquantized
    error = (dequantize_fp8(weight, scale) - value).abs()
    step = scale.repeat_interleave(128, 0)[:576].repeat_interleave(128, 1)
    assert (error <= value.abs() / 16 + step * 2.0**-10).all()
    # The last block row holds 64 rows; its scale comes from them alone (as if zero-padded to 128).
    amax = value[512:].reshape(64, 56, 128).abs().amax(dim=(0, 2))
    assert torch.equal(scale[4], torch.exp2(torch.ceil(torch.log2(amax / 448))))


# -- arguments and the command -----------------------------------------------------------------------

@pytest.mark.parametrize("changes,message", [
    (dict(kind="llama"), "kind 'llama' is unknown"),
    (dict(precision="int8"), "precision 'int8' is unknown"),
    (dict(dense_layers=4), "dense_layers=4 must lie between"),
    (dict(experts=1), "at least 2 routed experts"),
    (dict(hidden_sizes=4), "'hidden_sizes' is not a DeepseekV32Config field"),
    (dict(num_hidden_layers=4), "pass layers= instead"),
    (dict(tie_word_embeddings=True), "the published architecture fixes it"),
    (dict(n_group=3), "n_group=3 must divide"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok=9 must lie between"),
])
def test_bad_arguments_are_user_errors(changes, message):
    args = {"kind": "deepseek_v32", **narrow_args("deepseek_v32", "bf16"), **changes}
    with pytest.raises(DSAUserError, match=re.escape(message)):
        plan_checkpoint(args.pop("kind"), **args)


def test_existing_directories_are_kept_unless_overwrite_replaces_a_checkpoint(tmp_path):
    args = narrow_args("glm_moe_dsa", "bf16", layers=1, dense_layers=1, experts=2)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(DSAUserError, match="already exists and is not empty"):
        write_checkpoint(tmp_path / "notes", "glm_moe_dsa", **args)
    with pytest.raises(DSAUserError, match="holds no checkpoint"):
        write_checkpoint(tmp_path / "notes", "glm_moe_dsa", overwrite=True, **args)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"
    with pytest.raises(DSAUserError, match="failed .*choose another directory"):
        write_checkpoint(tmp_path / "notes" / "keep.txt" / "ckpt", "glm_moe_dsa", **args)
    first = write_checkpoint(tmp_path / "ckpt", "glm_moe_dsa", seed=1, **args)
    before = file_digests(first.path)
    again = write_checkpoint(tmp_path / "ckpt", "glm_moe_dsa", seed=2, overwrite=True, **args)
    assert again.path == first.path and not list(tmp_path.glob(".ckpt.partial-*"))
    after = file_digests(again.path)
    assert after.keys() == before.keys() and after != before


def test_command_writes_and_prints_the_summary(tmp_path, capsys):
    import importlib.util

    tool = Path(__file__).resolve().parents[2] / "tools" / "make_synthetic_checkpoint.py"
    spec = importlib.util.spec_from_file_location("make_synthetic_checkpoint", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "ckpt"
    argv = ["--kind", "glm_moe_dsa", "--layers", "2", "--dense-layers", "1", "--experts", "4", "--narrow",
            "--precision", "fp8", "--vocab", "512", "--shard-size", "1MB", "--seed", "3", "--set", "index_topk_freq=2",
            "--set", "index_skip_topk_offset=1", "-o", str(out)]
    assert module.main(argv) == 0
    printed = capsys.readouterr().out
    assert "glm_moe_dsa fp8: 2 layers (1 dense), 4 routed experts (top-2), hidden 256, vocab 512" in printed
    assert re.search(r"layer +1 \(  moe\): [0-9.]+ MB", printed) and f"written to {out}" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["indexer_types"] == ["full", "shared"] and config["index_topk_freq"] == 2
    assert module.main(["--layers", "2", "--dense-layers", "3", "--experts", "4", "--dry-run"]) == 1
    assert "dense_layers=3 must lie between" in capsys.readouterr().err
    assert module.parse_size("4GB") == 4 * 10**9 and module.parse_size("5GiB") == 5 * 2**30


def test_importing_the_module_loads_neither_torch_nor_transformers():
    import subprocess
    import sys

    code = "import sys, dsa_export.hf.synthetic; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr
    assert synthetic.KINDS == ("deepseek_v32", "glm_moe_dsa")
