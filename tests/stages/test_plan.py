"""The stage planner: its formulas against real safetensors headers, the published models' sizes,
optimal splits, errors and the CLI (in subprocesses, without torch)."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import time

import pytest

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.hf import sizes as S
from dsa_export.hf.checkpoint import INDEX_NAME, read_header
from dsa_export.stages import plan as P
from dsa_export.stages.plan import Plan, parse_size, plan_stages

GIB = 1 << 30

# config.json of deepseek-ai/DeepSeek-V3.2 (the geometry keys; FP8 e4m3 with 128x128 block scales).
V32 = {
    "model_type": "deepseek_v32", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "first_k_dense_replace": 3,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048, "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
# config.json of zai-org/GLM-5 (bf16; every layer runs its own indexer unless indexer_types says otherwise).
GLM5 = {
    "model_type": "glm_moe_dsa", "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288,
    "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64, "n_shared_experts": 1,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "kv_lora_rank": 512, "q_lora_rank": 2048,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "first_k_dense_replace": 3,
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048, "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False, "attention_bias": False, "dtype": "bfloat16",
}
GEOMETRY_KEYS = [k for k in V32 if k not in ("model_type", "num_nextn_predict_layers", "torch_dtype",
                                              "quantization_config")]


def write_safetensors(path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A safetensors file with these keys whose data is a sparse hole: the planner reads headers only."""
    width = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1}
    header, offset = {}, 0
    for key, (dtype, shape) in tensors.items():
        n = width[dtype]
        for d in shape:
            n *= d
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as handle:
        handle.write(len(raw).to_bytes(8, "little") + raw)
        handle.truncate(8 + len(raw) + offset)


def release_dtype(key: str, shape: tuple[int, ...], fp8: bool) -> list[tuple[str, str, tuple[int, ...]]]:
    """How DeepSeek's FP8 release stores a tensor (read from published shard inventories): 2-D
    projections of the decoder layers in F8_E4M3 with a float32 scale per 128x128 block; router,
    indexer head weights, norms, embeddings and heads in BF16; the indexer's k_norm and the router
    bias in F32."""
    if key.endswith((".k_norm.weight", ".k_norm.bias", ".e_score_correction_bias")):
        return [(key, "F32", shape)]
    linear = (len(shape) == 2 and key.startswith("model.layers.")
              and key.endswith(("proj.weight", "proj_with_mqa.weight", ".wk.weight", ".wq_b.weight"))
              and not key.endswith(("weights_proj.weight", "eh_proj.weight")))
    if fp8 and linear:
        rows, cols = shape
        scale = (key.replace(".weight", ".weight_scale_inv"), "F32", (-(-rows // 128), -(-cols // 128)))
        return [(key, "F8_E4M3", shape), scale]
    return [(key, "BF16", shape)]


def write_release(path, config: dict, shards: int = 3, mtp_copies: bool = True) -> None:
    """A real-width checkpoint laid out like the published release, sharded with an index."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    g = S.Geometry.from_config(config)
    specs = S.embedding_tensors(g) + [t for i in range(g.layers) for t in S.layer_tensors(g, i)]
    specs += S.head_tensors(g) + S.mtp_tensors(g)
    if mtp_copies:
        specs += [S.CheckpointTensor(f"model.layers.{g.layers}.embed_tokens.weight", (g.vocab, g.hidden)),
                  S.CheckpointTensor(f"model.layers.{g.layers}.shared_head.head.weight", (g.vocab, g.hidden))]
    entries = [e for t in specs for e in release_dtype(t.key, t.shape, g.fp8)]
    chunk = -(-len(entries) // shards)
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = entries[s * chunk:(s + 1) * chunk]
        write_safetensors(path / name, {k: (d, shape) for k, d, shape in part})
        weight_map.update({k: name for k, _, _ in part})
    (path / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def small(**extra) -> dict:
    return {**V32, "num_hidden_layers": 4, "first_k_dense_replace": 1, **extra}


# -- formulas against headers ----------------------------------------------------------------------

def test_published_configs_match_transformers_defaults():
    transformers = pytest.importorskip("transformers")
    for literal, cls in ((V32, transformers.DeepseekV32Config), (GLM5, transformers.GlmMoeDsaConfig)):
        defaults = cls().to_dict()
        assert {k: literal[k] for k in GEOMETRY_KEYS} == {k: defaults[k] for k in GEOMETRY_KEYS}


def test_inventory_is_what_save_pretrained_writes(checkpoints):
    """Keys, shapes and bytes from config.json equal transformers' own files, exactly (fp32, GLM-5 shared layers)."""
    for path in checkpoints.values():
        config, _ = P.load_config(path)
        g = S.Geometry.from_config(config)
        header = {}
        for shard in S.shard_files(path)[0]:
            header.update({k: v for k, v in read_header(shard)[0].items() if k != "__metadata__"})
        specs = S.embedding_tensors(g) + [t for i in range(g.layers) for t in S.layer_tensors(g, i)]
        specs += S.head_tensors(g)
        assert {t.key: list(t.shape) for t in specs} == {k: v["shape"] for k, v in header.items()}
        shards = S.shard_files(path)[0]
        for dtype in (None, "bf16"):
            assert S.weights_from_headers(g, shards, dtype).layers == S.weights_from_config(g, dtype).layers
        plan = plan_stages(path, gpu_memory_bytes="4GiB", max_seq=64)
        assert plan.weights_source.startswith("safetensors headers")
    assert "shared" in S.Geometry.from_config(P.load_config(checkpoints["glm_moe_dsa"])[0]).indexer_types


def test_fp8_release_headers_agree_with_config_arithmetic(tmp_path):
    """Real width, the release's dtypes: within 1e-4 per layer (the k_norm/bias dtypes the config cannot tell)."""
    config = small()
    write_release(tmp_path / "v32", config)
    g = S.Geometry.from_config(config)
    shards = S.shard_files(tmp_path / "v32")[0]
    head, cfg = S.weights_from_headers(g, shards, None), S.weights_from_config(g, None)
    for a, b in zip(head.layers, cfg.layers):
        assert abs(a - b) / a < 1e-4
    assert (head.embedding, head.head, head.parameters) == (cfg.embedding, cfg.head, cfg.parameters)
    # The MTP layer is left out; the release also stores copies of the embedding and head under it.
    copies = 2 * g.vocab * g.hidden * 2
    assert abs(head.ignored_bytes - cfg.ignored_bytes - copies) / head.ignored_bytes < 1e-4
    moe = head.layers[1]
    assert 11.0e9 < moe < 12.0e9  # the published FP8 checkpoint: one MoE layer ~11 GB ...
    bf16 = S.weights_from_headers(g, shards, "bf16")
    assert 22.5e9 < bf16.layers[1] < 23.5e9  # ... ~22.5 GB of experts in bf16, scales dropped
    assert bf16.layers == S.weights_from_config(g, "bf16").layers
    plan = plan_stages(tmp_path / "v32", gpu_memory_bytes="141GiB", max_seq=4096)
    assert plan.weights_source == "safetensors headers (3 shards)" and plan.ignored_bytes == head.ignored_bytes


@pytest.mark.parametrize("kind", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_synthetic_generator_inventory_agrees(tmp_path, kind, precision):
    """The real-width synthetic generator's inventory (an independent reading of the releases), if present."""
    synthetic = pytest.importorskip("dsa_export.hf.synthetic", reason="no synthetic checkpoint generator")
    schedule = dict(index_topk_freq=2, index_skip_topk_offset=1) if kind == "glm_moe_dsa" else {}
    ckpt = synthetic.plan_checkpoint(kind, layers=3, dense_layers=1, experts=16, precision=precision, mtp=True,
                                     **schedule)
    path = tmp_path / kind
    path.mkdir()
    (path / "config.json").write_text(json.dumps(ckpt.config))
    for name, shard in zip(ckpt.shard_names(), ckpt.shards()):
        write_safetensors(path / name, {t.name: (t.dtype, t.shape) for t in shard})
    g = S.Geometry.from_config(ckpt.config)
    cfg, head = S.weights_from_config(g, None), S.weights_from_headers(g, S.shard_files(path)[0], None)
    assert head.layers == list(ckpt.layer_bytes[:3]) and head.embedding == ckpt.embedding_bytes
    assert head.head == ckpt.head_bytes and head.ignored_bytes == ckpt.layer_bytes[3]
    for a, b in zip(head.layers, cfg.layers):
        assert abs(a - b) / a < 1e-4, (kind, precision)


def test_missing_and_truncated_shards(tmp_path):
    write_release(tmp_path / "v32", small(), shards=2)
    (tmp_path / "v32" / "model-00002-of-00002.safetensors").unlink()
    plan = plan_stages(tmp_path / "v32", gpu_memory_bytes="141GiB")
    assert plan.weights_source == "config.json (1 of the index's shards missing)"
    first = tmp_path / "v32" / "model-00001-of-00002.safetensors"
    with open(first, "r+b") as handle:
        handle.truncate(first.stat().st_size // 2)
    (tmp_path / "v32" / INDEX_NAME).unlink()
    with pytest.raises(DSAUserError, match="interrupted download"):
        plan_stages(tmp_path / "v32", gpu_memory_bytes="141GiB")


def test_tied_head_is_a_copy_on_the_last_stage(tmp_path):
    config = {**small(), "tie_word_embeddings": True}
    config.pop("quantization_config")
    path = tmp_path / "tied"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    g = S.Geometry.from_config(config)
    specs = S.embedding_tensors(g) + [t for i in range(g.layers) for t in S.layer_tensors(g, i)]
    write_safetensors(path / "model.safetensors", {t.key: ("BF16", t.shape) for t in specs}
                      | {"model.norm.weight": ("BF16", (g.hidden,))})
    w = S.weights_from_headers(g, [path / "model.safetensors"], None)
    assert w.head == (g.vocab * g.hidden + g.hidden) * 2 == S.weights_from_config(g, None).head


# -- the published models --------------------------------------------------------------------------

def test_published_parameter_totals():
    v32 = plan_stages(V32, gpu_memory_bytes="141GiB")
    # DeepSeek: 671B main model + 14B MTP module = 685B on the hub. We count the MTP layer's unique
    # weights (11.6B) and the release also stores a copy of embedding and head under it (1.85B).
    assert v32.total_parameters == pytest.approx(671e9, rel=0.01)
    copies = 2 * V32["vocab_size"] * V32["hidden_size"]
    assert v32.total_parameters + v32.ignored_parameters + copies == pytest.approx(685e9, rel=0.01)
    glm5 = plan_stages(GLM5, gpu_memory_bytes="141GiB")
    assert glm5.total_parameters == pytest.approx(744e9, rel=0.01)
    # ~37B active per token: everything but the 248 routed experts a token does not use.
    g = S.Geometry.from_config(V32)
    idle = (g.routed_experts - g.experts_per_token) * 3 * g.moe_intermediate * g.hidden
    active = v32.total_parameters - idle * g.mlp_types.count("sparse") - g.vocab * g.hidden  # embedding: a lookup
    assert active == pytest.approx(37e9, rel=0.03)


def test_cache_matches_design_numbers():
    g = S.Geometry.from_config(V32)
    assert S.layer_cache_bytes(g, 0, 1, 1, 2) == 1408  # (512 + 64 + 128) values x 2 bytes
    per_sequence = sum(S.layer_cache_bytes(g, i, 1, 131072, 2) for i in range(g.layers))
    assert per_sequence == pytest.approx(11.26e9, rel=0.01)  # "~11 GB per 128K sequence"
    glm = S.Geometry.from_config({**GLM5, "index_topk_freq": 4, "index_skip_topk_offset": 3})
    assert glm.indexer_types[:7] == ("full", "full", "full", "shared", "shared", "shared", "full")
    assert S.layer_cache_bytes(glm, 3, 1, 1, 2) == 576 * 2 and S.layer_cache_bytes(glm, 2, 1, 1, 2) == 704 * 2
    plan = plan_stages({**GLM5, "index_topk_freq": 4, "index_skip_topk_offset": 3}, gpu_memory_bytes="141GiB",
                       stages=1, strict=False)
    assert plan.stages[0].cache_bytes == 8192 * 2 * (704 * glm.indexer_types.count("full")
                                                      + 576 * glm.indexer_types.count("shared"))


def test_activation_formulas_at_real_width():
    g = S.Geometry.from_config(V32)
    n = 131072
    # Absorbed MLA dominates a 128K prefill: q [L,128,576] + latent out [L,128,512] + indices + normed input.
    attention = n * 128 * 576 * 2 + n * 128 * 512 * 2 + n * 2048 * 4 + n * 7168 * 2
    assert S.layer_transient_bytes(g, 10, 1, n, 2) == attention
    assert S.indexer_workspace(1, n) == 256 << 20 and S.indexer_workspace(1, 4) == 64
    costs = S.layer_costs(g, S.weights_from_config(g, None), batch=1, seq=n, act_bytes=2, cache_bytes=2,
                          reserve_bytes=2 * GIB)
    last = costs.stage(0, 60, 61)
    assert last.activation_bytes - costs.stage(0, 59, 60).activation_bytes == n * 7168 * 2 + n * 129280 * 2
    # A cut in front of a GLM-5 "shared" layer hands the selection [B,L,index_topk] int32 across.
    glm = S.Geometry.from_config({**GLM5, "index_topk_freq": 4, "index_skip_topk_offset": 3})
    costs = S.layer_costs(glm, S.weights_from_config(glm, None), batch=1, seq=n, act_bytes=2, cache_bytes=2,
                          reserve_bytes=0)
    assert glm.indexer_types[6:11] == ("full", "shared", "shared", "shared", "full")

    def handed(a, b):
        extra = costs.stage(0, a, b).activation_bytes - costs.io_bytes - max(costs.transient[a:b])
        return extra / (n * 2048 * 4)

    assert [handed(8, 9), handed(6, 7), handed(7, 10), handed(6, 10)] == [2, 1, 1, 0]


def test_auto_split_of_v32_fp8_on_h200():
    for (batch, seq), expect in (((1, 131072), 7), ((8, 8192), 6)):
        plan = plan_stages(V32, gpu_memory_bytes="141GiB", max_batch=batch, max_seq=seq)
        assert plan.num_stages == expect and plan.fits and plan.weight_precision == "fp8"
        assert [s.start for s in plan.stages][0] == 0 and plan.stages[-1].stop == 61
        assert all(a.stop == b.start for a, b in zip(plan.stages, plan.stages[1:]))
        assert plan.stages[0].includes_embedding and plan.stages[-1].includes_head
        assert sum(s.parameters for s in plan.stages) == plan.total_parameters
        with pytest.raises(DSAUserError, match=f"use --stages {expect} "):
            plan_stages(V32, gpu_memory_bytes="141GiB", max_batch=batch, max_seq=seq, stages=expect - 1)
    bf16 = plan_stages(V32, gpu_memory_bytes="141GiB", dtype="bf16", max_seq=8192)
    assert bf16.num_stages > 9 and bf16.weight_precision == "bf16"


def test_paged_stages_are_planned_for_one_prefill_call_and_double_pools():
    """A paged graph returns each row's last-token logits, and with --prefill-chunk C its prefill
    calls hold C tokens per row over caches of max_seq: activations are those of one such call.
    Its pools count twice (TensorRT's scatter writes each call's pools into a new buffer)."""
    g = S.Geometry.from_config(V32)
    batch, seq, chunk = 2, 131072, 4096
    n = batch * chunk
    # The indexer workspace is the plugins': C queries per row over max_seq keys, capped.
    assert S.indexer_workspace(2, 3, 5) == 4 * 2 * 3 * 5 and S.indexer_workspace(1, chunk, seq) == 256 << 20
    assert S.layer_transient_bytes(g, 10, batch, chunk, 2, keys=seq) == (
        n * 128 * 576 * 2 + n * 128 * 512 * 2 + n * 2048 * 4 + n * 7168 * 2)
    decode = plan_stages(V32, gpu_memory_bytes="141GiB", stages=8, max_batch=batch, max_seq=seq, strict=False)
    paged = plan_stages(V32, gpu_memory_bytes="141GiB", stages=8, max_batch=batch, max_seq=seq, graph="paged",
                        prefill_chunk=chunk, strict=False)
    cut = [(s.start, s.stop) for s in paged.stages]
    costs = S.layer_costs(g, S.weights_from_config(g, None), batch=batch, seq=seq, act_bytes=2, cache_bytes=2,
                          reserve_bytes=2 * GIB)
    for stage, (start, stop) in zip(paged.stages, cut):
        whole = costs.stage(stage.index, start, stop)
        assert stage.cache_bytes == 2 * whole.cache_bytes and stage.weight_bytes == whole.weight_bytes
        transient = max(S.layer_transient_bytes(g, i, batch, chunk, 2, keys=seq) for i in range(start, stop))
        expected = 2 * n * 7168 * 2 + n * 8 + transient
        expected += n * 8 if start == 0 else 0  # input_ids
        expected += batch * 7168 * 2 + batch * 129280 * 2 if stop == 61 else 0  # last-token logits only
        assert stage.activation_bytes == expected, stage.index
    assert paged.largest_stage.activation_bytes < decode.largest_stage.activation_bytes / 20
    # Fewer GPUs for DeepSeek-V3.2 at 128K: 7 stages of 141 GiB whole-prompt, 5 fed 4096 tokens a call.
    assert plan_stages(V32, gpu_memory_bytes="141GiB", max_seq=seq).num_stages == 7
    chunked = plan_stages(V32, gpu_memory_bytes="141GiB", max_seq=seq, graph="paged", prefill_chunk=chunk)
    assert chunked.num_stages == 5 and chunked.fits and (chunked.graph, chunked.prefill_chunk) == ("paged", chunk)
    assert "prefill calls of 4096 tokens per row" in chunked.summary()
    # Without a chunk a paged prefill call takes the whole max_seq; a chunk past it changes nothing.
    whole_prompt = plan_stages(V32, gpu_memory_bytes="141GiB", max_seq=8192, graph="paged")
    longer = plan_stages(V32, gpu_memory_bytes="141GiB", max_seq=8192, graph="paged", prefill_chunk=10**6)
    assert longer.stages == whole_prompt.stages and "prefill calls of 8192 tokens" in longer.summary()
    assert Plan.from_json(chunked.to_json()) == chunked
    old = json.loads(decode.to_json())
    del old["graph"], old["prefill_chunk"]  # a plan written before these fields existed
    assert Plan.from_dict(old) == decode


@pytest.mark.parametrize("kwargs,message", [
    ({"prefill_chunk": 64}, "add --graph paged"),
    ({"graph": "decode", "prefill_chunk": 64}, "add --graph paged"),
    ({"graph": "paged", "prefill_chunk": 0}, "at least 1; got 0"),
    ({"graph": "native"}, "graph 'native' is not one of"),
])
def test_paged_plan_refusals(kwargs, message):
    with pytest.raises(DSAUsageError, match=message):
        plan_stages(V32, gpu_memory_bytes="141GiB", **kwargs)


def test_stage_export_plans_with_the_builds_prefill_chunk(checkpoints, tmp_path, monkeypatch):
    """build --stages --graph paged --prefill-chunk N hands N to the planner (which may then cut
    the model into fewer stages)."""
    from dsa_export.artifact import BuildSettings
    from dsa_export.stages.builder import build_stages

    seen = {}

    def planner(*args, **kwargs):
        seen.update(kwargs)
        raise DSAUserError("planned.")

    monkeypatch.setattr(P, "plan_stages", planner)
    with pytest.raises(DSAUserError, match="planned"):
        build_stages(checkpoints["glm_moe_dsa"], tmp_path / "out", BuildSettings(), stages=2, graph="paged",
                     prefill_chunk=32, max_batch=4, max_seq=128, say=lambda line: None)
    assert (seen["graph"], seen["prefill_chunk"], seen["max_seq"]) == ("paged", 32, 128)
    assert not (tmp_path / "out").exists()


def test_a_stage_export_records_its_prefill_chunk_for_the_build(checkpoints, tmp_path, monkeypatch):
    """export --stages --graph paged --prefill-chunk N plans for N-token prefill calls and records N
    in pipeline.json; a build of that folder sizes its prefill profile for N unless given its own
    chunk; a recorded chunk that is not a positive number is refused."""
    from dsa_export.artifact import BuildSettings
    from dsa_export.stages import builder
    from tests.stages.test_session import _cli

    folder = tmp_path / "export"
    ran = _cli("export", checkpoints["deepseek_v32"], "--stages", 2, "--graph", "paged", "--prefill-chunk", 32,
               "--max-seq", 128, "-o", folder)
    assert ran.exit_code == 0, ran.output
    pipeline = json.loads((folder / "pipeline.json").read_text())
    assert (pipeline["graph"], pipeline["plan"]["prefill_chunk"]) == ("paged", 32)
    ran = _cli("export", checkpoints["deepseek_v32"], "--stages", 2, "--prefill-chunk", 32, "-o", tmp_path / "decode")
    assert ran.exit_code == 2 and "add --graph paged" in ran.stderr and not (tmp_path / "decode").exists()

    seen = []

    def profiles(*args, prefill_chunk=None, **kwargs):
        seen.append(prefill_chunk)
        raise DSAUserError("profiled.")

    monkeypatch.setattr(builder, "paged_profiles", profiles)
    for chunk, expected in ((None, 32), (16, 16)):
        with pytest.raises(DSAUserError, match="profiled"):
            builder.build_stages(folder, tmp_path / "built", BuildSettings(backend="onnxruntime"), max_seq=128,
                                 prefill_chunk=chunk, say=lambda line: None)
        assert seen.pop() == expected
    pipeline["plan"]["prefill_chunk"] = "32"
    (folder / "pipeline.json").write_text(json.dumps(pipeline))
    with pytest.raises(DSAUserError, match="records a prefill chunk of '32'"):
        builder.build_stages(folder, tmp_path / "built", BuildSettings(backend="onnxruntime"), max_seq=128,
                             say=lambda line: None)


# -- splitting -------------------------------------------------------------------------------------

def _random_config(rng: random.Random, n: int) -> dict:
    return {**GLM5, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64, "num_hidden_layers": n,
            "num_attention_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 16, "v_head_dim": 16, "index_n_heads": 4, "index_head_dim": 32, "index_topk": 16,
            "vocab_size": rng.choice([1000, 50000]), "n_routed_experts": 8, "num_experts_per_tok": 2,
            "mlp_layer_types": [rng.choice(["dense", "sparse"]) for _ in range(n)],
            "indexer_types": ["full"] + [rng.choice(["full", "shared"]) for _ in range(n - 1)]}


def test_n_split_is_optimal_and_auto_is_fewest_by_brute_force():
    rng = random.Random(0)
    for trial in range(8):
        n = rng.randint(1, 9)
        config = _random_config(rng, n)
        batch, seq = rng.choice([1, 3]), rng.choice([16, 700])
        g = S.Geometry.from_config(config)
        costs = S.layer_costs(g, S.weights_from_config(g, None), batch=batch, seq=seq, act_bytes=2, cache_bytes=2,
                              reserve_bytes=0)

        def brute(k: int) -> int:
            return min(max(costs.stage(0, a, b).total_bytes for a, b in zip((0, *cuts), (*cuts, n)))
                       for cuts in itertools.combinations(range(1, n), k - 1))

        best = {k: brute(k) for k in range(1, n + 1)}
        for k in range(1, n + 1):
            plan = plan_stages(config, gpu_memory_bytes=1 << 50, stages=k, max_batch=batch, max_seq=seq,
                               reserve_bytes=0)
            assert plan.num_stages == k and plan.largest_stage.total_bytes == best[k], (trial, k)
        for capacity in {*best.values(), *(rng.randint(best[n], best[1]) for _ in range(4))}:
            plan = plan_stages(config, gpu_memory_bytes=capacity, max_batch=batch, max_seq=seq, reserve_bytes=0)
            fewest = min(k for k in best if best[k] <= capacity)
            assert plan.num_stages == fewest and plan.largest_stage.total_bytes == best[fewest] <= capacity


# -- errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,error,message", [
    (dict(gpu_memory_bytes="10GiB"), DSAUserError, "no split fits the 10.0 GiB GPU: layer 60 with the final norm"),
    (dict(gpu_memory_bytes="10GiB", stages=61), DSAUserError, "no split fits the 10.0 GiB GPU: layer 60 with"),
    (dict(gpu_memory_bytes="141GiB", stages=62), DSAUserError, "more than the model's 61 layers"),
    (dict(gpu_memory_bytes="141GiB", stages=0), DSAUsageError, "at least 1"),
    (dict(gpu_memory_bytes="141GiB", stages="many"), DSAUsageError, "neither 'auto'"),
    (dict(gpu_memory_bytes="141GiB", gpus=4), DSAUserError, "needs 5 stages"),
    (dict(gpu_memory_bytes="141GiB", gpus=4, stages=5), DSAUsageError, "--gpus is 4"),
    (dict(gpu_memory_bytes="141GiB", stages=3), DSAUserError, "use --stages 5 "),
    (dict(gpu_memory_bytes="141G"), DSAUsageError, "is not a size"),
    (dict(gpu_memory_bytes="141GiB", dtype="int4"), DSAUsageError, "dtype 'int4'"),
])
def test_user_errors_are_one_sentence(kwargs, error, message):
    with pytest.raises(error, match=message) as info:
        plan_stages(V32, max_seq=4096, **kwargs)
    text = str(info.value)
    assert text.endswith(".") and "\n" not in text and text.count(". ") == 0


def test_non_strict_plan_marks_what_does_not_fit():
    plan = plan_stages(V32, gpu_memory_bytes="141GiB", stages=3, max_seq=4096, strict=False)
    assert plan.num_stages == 3 and not plan.fits and not plan.largest_stage.fits


def test_parse_size():
    assert parse_size("141GiB") == 141 * GIB == parse_size("141 gib") == parse_size(str(141 * GIB))
    assert parse_size("80GB") == 80 * 10**9 and parse_size("1.5TiB") == 3 << 39 and parse_size(" 512 MiB ") == 512 << 20
    for bad in ("141G", "GiB", "-1GiB", "1,5GiB", "0", ""):
        with pytest.raises(DSAUsageError):
            parse_size(bad)
    assert parse_size("0", allow_zero=True) == 0


def test_json_round_trip_and_table():
    plan = plan_stages(GLM5, gpu_memory_bytes="141GiB", max_batch=8, max_seq=8192)
    again = Plan.from_json(plan.to_json())
    assert again == plan and isinstance(again.stages[0], S.StagePlan)
    table = plan.render_table().splitlines()
    assert table[0].split() == ["stage", "layers", "weights", "cache", "activations", "total", "fits"]
    assert table[1].split()[1] == "0:8+emb" and table[-2].split()[1].endswith("+head")
    assert table[-1].startswith(f"{plan.num_stages} stages of 141.0 GiB")
    with pytest.raises(DSAUserError, match="not one dsa-export wrote"):
        Plan.from_json('{"stages": []}')


# -- the CLI ---------------------------------------------------------------------------------------

def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dsa_export", "plan", *map(str, args)], capture_output=True,
                          text=True, timeout=60, cwd=cwd)


@pytest.fixture(scope="module")
def v32_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "DeepSeek-V3.2"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(V32))
    return path


def test_cli_table_json_and_speed(v32_dir):
    start = time.perf_counter()
    result = cli(v32_dir, "--gpu-memory", "141GiB", "--max-seq", "131072")
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("7 stages of 141.0 GiB")
    assert elapsed < 5, f"dsa-export plan took {elapsed:.1f} s"
    result = cli(v32_dir, "--gpu-memory", "141 GiB", "--max-batch", "8", "--max-seq", "8192", "--json")
    assert result.returncode == 0, result.stderr
    plan = Plan.from_json(result.stdout)
    assert plan == plan_stages(v32_dir, gpu_memory_bytes="141GiB", max_batch=8, max_seq=8192)
    result = cli(v32_dir / "config.json", "--gpu-memory", "80GB", "--stages", "12", "--dtype", "auto",
                 "--reserve", "1GiB", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["requested_stages"] == 12 and json.loads(result.stdout)["reserve_bytes"] == GIB


def test_cli_imports_no_torch(v32_dir):
    code = ("import sys\nfrom dsa_export.cli.main import main\n"
            f"try:\n    main(['plan', {str(v32_dir)!r}, '--gpu-memory', '141GiB'])\nexcept SystemExit as e:\n"
            "    assert e.code == 0, e.code\n"
            "heavy = [m for m in ('torch', 'transformers', 'onnx', 'onnxruntime', 'tensorrt', 'safetensors', 'numpy')"
            " if m in sys.modules]\nprint('HEAVY', heavy)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout


@pytest.mark.parametrize("args,code,message", [
    (["--gpu-memory", "10GiB"], 1, "alone needs"),
    (["--gpu-memory", "141GiB", "--stages", "62"], 1, "more than the model's 61 layers"),
    (["--gpu-memory", "141GiB", "--stages", "0"], 2, "neither 'auto' nor a number"),
    (["--gpu-memory", "141GiB", "--stages", "x"], 2, "neither 'auto' nor a number"),
    (["--gpu-memory", "141GiB", "--gpus", "4", "--max-seq", "131072"], 1, "--gpus is 4"),
    (["--gpu-memory", "141GiB", "--gpus", "2", "--stages", "3"], 2, "--gpus is 2"),
    (["--gpu-memory", "lots"], 2, "is not a size"),
    (["--gpu-memory", "141GiB", "--dtype", "fp8"], 2, "Invalid value"),
    ([], 2, "Missing option"),
])
def test_cli_errors(v32_dir, args, code, message):
    result = cli(v32_dir, *args)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert message in result.stderr and "Traceback" not in result.stderr


def test_cli_plans_paged_stages_fed_in_chunks(v32_dir):
    result = cli(v32_dir, "--gpu-memory", "141GiB", "--max-seq", "131072", "--graph", "paged", "--prefill-chunk",
                 "4096", "--json")
    assert result.returncode == 0, result.stderr
    assert Plan.from_json(result.stdout) == plan_stages(v32_dir, gpu_memory_bytes="141GiB", max_seq=131072,
                                                         graph="paged", prefill_chunk=4096)
    result = cli(v32_dir, "--gpu-memory", "141GiB", "--prefill-chunk", "4096")
    assert result.returncode == 2 and "add --graph paged" in result.stderr and "Traceback" not in result.stderr


def test_cli_plans_fp8_pools_of_paged_stages_only(v32_dir):
    """--cache-dtype fp8 plans the paged graph's FP8 pools (656 + 132 bytes a token and layer
    against bf16's 1152 + 256), and is refused for decode graphs, which keep caches in their dtype."""
    result = cli(v32_dir, "--gpu-memory", "141GiB", "--max-seq", "131072", "--graph", "paged", "--cache-dtype", "fp8",
                 "--json")
    assert result.returncode == 0, result.stderr
    fp8 = Plan.from_json(result.stdout)
    assert fp8 == plan_stages(v32_dir, gpu_memory_bytes="141GiB", max_seq=131072, graph="paged", cache_dtype="fp8")
    bf16 = plan_stages(v32_dir, gpu_memory_bytes="141GiB", max_seq=131072, graph="paged")
    g = S.Geometry.from_config(V32)
    assert S.layer_cache_bytes(g, 10, 1, 131072, S.FP8_CACHE) == 131072 * (656 + 132)
    assert sum(s.cache_bytes for s in fp8.stages) == 2 * 61 * 131072 * (656 + 132)
    assert sum(s.cache_bytes for s in bf16.stages) == 2 * 61 * 131072 * (1152 + 256)
    result = cli(v32_dir, "--gpu-memory", "141GiB", "--cache-dtype", "fp8")
    assert result.returncode == 2 and "add --graph paged" in result.stderr and "Traceback" not in result.stderr


def test_cli_too_few_stages_shows_the_table_then_fails(v32_dir, tmp_path):
    result = cli(v32_dir, "--gpu-memory", "141GiB", "--stages", "3")
    assert result.returncode == 1
    assert " NO" in result.stdout and "use --stages 5 (or --stages auto)" in result.stderr
    result = cli(tmp_path, "--gpu-memory", "141GiB")
    assert result.returncode == 1 and "neither a model directory" in result.stderr


def test_paged_profiles_take_a_prefill_chunk():
    """--prefill-chunk bounds the prefill profile's tokens per row and call, not the sequence."""
    from dsa_export.stages.builder import paged_profiles

    prefill, decode = paged_profiles(4, 1024, 64)
    assert prefill["sequence"] == (1, 128, 1024) and prefill["max_pages"] == (1, 2, 16)
    prefill, decode = paged_profiles(4, 1024, 64, prefill_chunk=96)
    assert prefill["sequence"] == (1, 96, 96) and prefill["max_pages"] == (1, 2, 16)
    assert decode["sequence"] == (1, 1, 1) and decode["max_pages"] == (1, 2, 16)
    assert paged_profiles(4, 100, 64, prefill_chunk=4096)[0]["sequence"] == (1, 99, 100)  # never past --max-seq
    with pytest.raises(DSAUsageError, match="at least 1"):
        paged_profiles(4, 1024, 64, prefill_chunk=0)


def test_a_prefill_chunk_needs_paged_stages(tmp_path):
    """Refused before anything is exported: a decode graph's prefill takes the whole prompt."""
    from dsa_export.artifact import BuildSettings
    from dsa_export.stages.builder import build_stages

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    with pytest.raises(DSAUsageError, match="add --graph paged"):
        build_stages(checkpoint, tmp_path / "out", BuildSettings(), stages=2, prefill_chunk=32)
    assert not (tmp_path / "out").exists()
