"""Named built-in model configs with seeded weights. ``tiny`` is the default of every command."""

from __future__ import annotations

from dsa_export.nn.config import DSAModelConfig

DEFAULT_MODEL = "tiny"

BUILTIN_CONFIGS: dict[str, DSAModelConfig] = {
    # Exports in a few seconds on 2 cores; index_topk (32) is below most validation lengths so the
    # sparse selection is exercised.
    "tiny": DSAModelConfig(name="tiny"),
    "tiny-expanded": DSAModelConfig(name="tiny-expanded", mla_form="expanded"),
    # One layer of each attention kind, DeepSeek-V3-style MoE blocks after the first (dense-MLP)
    # layer: 16 routed experts in 4 groups (tokens pick 2 groups, then 4 experts), one shared
    # expert, scaling 2.5. Three layers keep its export (the slow part of its tests) short.
    "tiny-moe": DSAModelConfig(
        name="tiny-moe", layer_types=("local", "dsa", "hybrid"), moe_experts=16, moe_top_k=4,
        moe_intermediate_size=32, moe_shared_experts=1, moe_first_dense=1, moe_n_group=4, moe_topk_group=2,
        moe_routed_scaling_factor=2.5,
    ),
    # The seed design's schedule at a size where sparsity matters: window 128, top-k 256.
    "small": DSAModelConfig(
        name="small",
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        layer_types=("local", "local", "dsa", "dsa", "dsa", "dsa", "hybrid", "hybrid"),
        num_heads=8,
        q_lora_rank=96,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        index_n_heads=16,
        index_head_dim=64,
        index_topk=256,
        sliding_window=128,
        local_head_dim=32,
    ),
    # The other sparse-attention patterns (dsa_export.nn.patterns, docs/patterns.md), each in the
    # two layers above a sliding-window layer: block-sparse attention over 32x32 blocks, 4 key
    # blocks per query block, picked by pooled scores (block) or a learned predictor (predictor);
    # LSH buckets (4 per head, up to 32 keys per query); the Gumbel-top-k indexer (in eval mode
    # tiny's DSA layers); static selections taken once from a seeded 512-token calibration input.
    **{name: DSAModelConfig(name=name, layer_types=("local", name, name))
       for name in ("block", "predictor", "lsh", "gumbel", "static")},
}


def builtin_config(name: str) -> DSAModelConfig:
    try:
        return BUILTIN_CONFIGS[name]
    except KeyError:
        raise KeyError(name) from None


def build_builtin(name: str = DEFAULT_MODEL):
    """The seeded ``DSACausalLM`` of a built-in config, in eval mode."""
    from dsa_export.nn.model import DSACausalLM

    cfg = builtin_config(name)
    model = DSACausalLM(cfg).init_weights(cfg.seed).eval()
    if "static" in cfg.layer_types:
        from dsa_export.nn.model import example_inputs
        from dsa_export.nn.patterns import freeze_static_patterns

        calibration = example_inputs(cfg, 1, cfg.static_max_seq, seed=cfg.seed + 1)["input_ids"]
        freeze_static_patterns(model, calibration)
    return model
