"""Tiny random DeepSeek-V3.2 and GLM-5 checkpoints, written with transformers' save_pretrained."""
# The real-width synthetic checkpoints (tests/hf/realwidth.py) are imported where used; the session
# fixture `checkpoints` (one of each) is in tests/conftest.py, for tests/hf and tests/stages alike.

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

COMMON = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
    num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
    kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, index_head_dim=32,
    # >= 16 indexer heads: fewer make exact score ties common, and HF's torch.topk orders ties arbitrarily.
    index_n_heads=16, first_k_dense_replace=1, max_position_embeddings=512,
)


def make_checkpoint(root, kind: str, *, layers: int = 3, index_topk: int = 8, seed: int = 0, router_bias: float = 0.0,
                    **extra):
    """A tiny random checkpoint; ``router_bias`` > 0 draws the MoE routers' score-correction bias
    (transformers initializes it to zero, which would leave its part of the routing untested)."""
    import torch

    torch.manual_seed(seed)
    if kind == "deepseek_v32":
        cfg = transformers.DeepseekV32Config(num_hidden_layers=layers, index_topk=index_topk, v_head_dim=16,
                                             **{**COMMON, **extra})
        model = transformers.DeepseekV32ForCausalLM(cfg)
    else:
        cfg = transformers.GlmMoeDsaConfig(num_hidden_layers=layers, index_topk=index_topk, v_head_dim=24,
                                           index_topk_freq=2, index_skip_topk_offset=1, **{**COMMON, **extra})
        model = transformers.GlmMoeDsaForCausalLM(cfg)
    if router_bias:
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_(0.0, router_bias)
    suffix = f"-e{extra['n_routed_experts']}" if "n_routed_experts" in extra else ""
    path = root / f"{kind}-L{layers}-k{index_topk}-s{seed}{suffix}"
    model.save_pretrained(path, safe_serialization=True)
    return path


def make_fp8_checkpoint(root, source, block: int = 16):
    """Rewrite ``source``'s 2-D projection weights as FP8 e4m3 with per-block ``weight_scale_inv``,
    the layout DeepSeek publishes its checkpoints in; returns (path, {key: dequantized weight})."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    state = {}
    for file in sorted(source.glob("*.safetensors")):
        state.update(load_file(str(file)))
    out, expected = {}, {}
    for key, value in state.items():
        quantizable = value.dim() == 2 and key.endswith("proj.weight") and not any(
            skip in key for skip in ("weights_proj", "embed", "lm_head"))
        if quantizable and value.shape[0] % block == 0 and value.shape[1] % block == 0:
            rows, cols = value.shape
            blocks = value.float().reshape(rows // block, block, cols // block, block)
            scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
            quant = (blocks / scale[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
            out[key], out[key.replace(".weight", ".weight_scale_inv")] = quant, scale
            expected[key] = (quant.float().reshape(rows // block, block, cols // block, block)
                             * scale[:, None, :, None]).reshape(rows, cols)
        else:
            out[key] = value
    path = root / (source.name + "-fp8")
    path.mkdir()
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": [block, block]}
    (path / "config.json").write_text(json.dumps(config))
    return path, expected
