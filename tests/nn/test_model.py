"""The reference model: forms agree, the schedule is honoured, weights are seeded."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsa_export.nn import BUILTIN_CONFIGS, DSACausalLM, DSAModelConfig, build_builtin, example_inputs
from dsa_export.nn.layers import LightningIndexer, MLAttention, SlidingWindowAttention, window_indices


def test_mqa_and_expanded_mla_compute_the_same_function():
    mqa, expanded = build_builtin("tiny"), build_builtin("tiny-expanded")
    inputs = example_inputs(mqa.config, 2, 48)
    with torch.no_grad():
        torch.testing.assert_close(mqa(**inputs), expanded(**inputs), rtol=1e-4, atol=1e-4)


def test_layer_schedule_builds_the_named_attention():
    model = build_builtin("tiny")
    kinds = [type(layer.attn) for layer in model.layers]
    assert kinds == [SlidingWindowAttention, MLAttention, MLAttention, MLAttention]
    assert model.layers[1].attn.indexer is not None and model.layers[1].attn.gate is None
    assert model.layers[3].attn.indexer is not None and model.layers[3].attn.gate is not None


def test_builtins_are_seeded_and_deterministic():
    a, b = build_builtin("tiny"), build_builtin("tiny")
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), na


def test_window_indices():
    idx = window_indices(5, 3, "cpu")
    assert idx.tolist() == [[-1, -1, 0], [-1, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4]]


def test_model_is_causal():
    model = build_builtin("tiny")
    inputs = example_inputs(model.config, 1, 40)
    changed = inputs["input_ids"].clone()
    changed[0, 30:] = (changed[0, 30:] + 1) % model.config.vocab_size
    with torch.no_grad():
        a, b = model(**inputs), model(input_ids=changed)
    torch.testing.assert_close(a[:, :30], b[:, :30])
    assert not torch.allclose(a[:, 30:], b[:, 30:])


def test_indexer_limits_attention_to_topk_keys():
    cfg = DSAModelConfig(index_topk=4)
    indexer = LightningIndexer(cfg)
    x = torch.randn(1, 10, cfg.hidden_size)
    q_resid = torch.randn(1, 10, cfg.q_lora_rank)
    from dsa_export.nn.layers import rope_tables

    cos, sin = rope_tables(10, cfg.qk_rope_head_dim, cfg.rope_theta, "cpu", torch.float32)
    idx = indexer(x, q_resid, cos, sin)
    assert idx.shape == (1, 10, 4)
    for s in range(10):
        row = [i for i in idx[0, s].tolist() if i >= 0]
        assert len(row) == min(4, s + 1) and max(row) <= s


def test_dense_layer_type_and_topk_above_length_match_dense_attention():
    # With index_topk >= sequence length, a DSA layer selects every earlier key: it must equal dense.
    base = dataclasses.replace(BUILTIN_CONFIGS["tiny"], layer_types=("dsa",), index_topk=64)
    dense = dataclasses.replace(base, layer_types=("dense",))
    a = DSACausalLM(base).init_weights(0).eval()
    b = DSACausalLM(dense).init_weights(0).eval()
    inputs = example_inputs(base, 2, 32)
    with torch.no_grad():
        torch.testing.assert_close(a(**inputs), b(**inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", [{"layer_types": ("nope",)}, {"mla_form": "x"}, {"qk_rope_head_dim": 7}, {"index_topk": 0}])
def test_config_validation(bad):
    with pytest.raises(ValueError):
        DSAModelConfig(**bad)


def test_config_round_trips_through_dict():
    cfg = BUILTIN_CONFIGS["small"]
    assert DSAModelConfig.from_dict(cfg.to_dict()) == cfg
