"""The sparse-attention patterns of dsa_export.nn.patterns against direct (dense, masked) references."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import torch

from dsa_export.nn import BUILTIN_CONFIGS, DSACausalLM, build_builtin, example_inputs
from dsa_export.nn.layers import LightningIndexer, rope_tables
from dsa_export.nn.patterns import (
    BlockPatternPredictor,
    BlockSparseSelfAttention,
    FedStaticPatternLM,
    GumbelTopKIndexer,
    LSHAttention,
    StaticPatternIndexer,
    block_gated_attention,
    block_index_from_logits,
    block_mask_from_index,
    block_mean,
    bucket_mask,
    bucket_selections,
    check_static_pattern,
    freeze_static_patterns,
    gate_from_logits,
    index_scores,
    lsh_buckets,
    relaxed_topk,
    slice_static_pattern,
    static_indexers,
)

CFG = BUILTIN_CONFIGS["tiny"]


def _has_block_op() -> bool:
    return hasattr(importlib.import_module("dsa_export.ops"), "dsa_block_sparse_attention")


needs_block_op = pytest.mark.skipif(not _has_block_op(), reason="needs the DSABlockSparseAttention op")


def _tables(s: int, cfg=CFG):
    return rope_tables(s, cfg.qk_rope_head_dim, cfg.rope_theta, "cpu", torch.float32)


def _init(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.1))
    return module


# -- block patterns ----------------------------------------------------------------------------
def _block_index_reference(logits: torch.Tensor, kb: int, gate: bool) -> list:
    """Per row, the set of chosen key blocks, by the rule written out with loops."""
    b, h, nq, nk = logits.shape
    rows = []
    for bi in range(b):
        for hi in range(h):
            for i in range(nq):
                candidates = [j for j in range(nk) if j <= i and (not gate or logits[bi, hi, i, j] > 0 or j == i)]
                others = sorted((j for j in candidates if j != i), key=lambda j: -float(logits[bi, hi, i, j]))
                rows.append({i, *others[: kb - 1]})
    return rows


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("nb,kb", [(1, 4), (3, 4), (7, 3), (9, 12)])
def test_block_index_is_the_top_gated_causal_blocks_with_the_diagonal(gate, nb, kb):
    logits = torch.randn(2, 3, nb, nb, generator=torch.Generator().manual_seed(nb * 10 + kb))
    index = block_index_from_logits(logits, kb, gate=gate)
    assert index.shape == (2, 3, nb, kb) and index.dtype == torch.int32
    got = [set(row[row >= 0].tolist()) for row in index.reshape(-1, kb)]
    assert got == _block_index_reference(logits, kb, gate)
    for row in index.reshape(-1, kb):  # -1 only after the chosen blocks, each block once
        kept = row[row >= 0]
        assert kept.unique().numel() == kept.numel() and (row[kept.numel():] == -1).all()


def test_block_mean_averages_partial_blocks_over_their_positions():
    x = torch.randn(2, 70, 3, 5)
    pooled = block_mean(x, 32)
    assert pooled.shape == (2, 3, 3, 5)
    torch.testing.assert_close(pooled[:, 1], x[:, 32:64].mean(1))
    torch.testing.assert_close(pooled[:, 2], x[:, 64:].mean(1))


def test_block_mask_round_trips_the_block_index():
    logits = torch.randn(1, 2, 6, 6)
    index = block_index_from_logits(logits, 3, gate=True)
    mask = block_mask_from_index(index, 6)
    assert mask.sum(-1).tolist() == (index >= 0).sum(-1).float().tolist()
    assert all(mask[0, h, i, j] == 1 for h in range(2) for i in range(6) for j in index[0, h, i].tolist() if j >= 0)


def test_block_index_round_trips_through_csr():
    csr = pytest.importorskip("dsa_export.ops.csr", reason="needs the CSR helpers of DSABlockSparseAttention")
    logits = torch.randn(2, 3, 9, 9, generator=torch.Generator().manual_seed(12))
    index = block_index_from_logits(logits, 4, gate=True)
    row_ptr, col_idx = csr.block_index_to_csr(index, 9)
    back = csr.csr_to_block_index(row_ptr, col_idx, 4)

    def rows(x):
        return [set(r[r >= 0].tolist()) for r in x.reshape(-1, 4)]

    assert rows(back) == rows(index)
    assert int(row_ptr[-1, -1, -1]) == int((index >= 0).sum())


def _dense_block_reference(q, k, v, index, bs, scale):
    """Loops: each query attends its causal keys inside the key blocks its query block lists."""
    b, s, h, _ = q.shape
    out = torch.zeros(b, s, h, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for p in range(s):
                blocks = {int(j) for j in index[bi, hi, p // bs] if j >= 0}
                keys = [t for t in range(p + 1) if t // bs in blocks]
                scores = torch.stack([q[bi, p, hi].double() @ k[bi, t, hi].double() for t in keys]) * scale
                out[bi, p, hi] = torch.softmax(scores, 0) @ v[bi, keys, hi].double()
    return out.float()


def test_block_gated_attention_with_a_hard_gate_is_block_sparse_attention():
    b, s, h, d, bs = 1, 21, 2, 8, 4
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, s, h, d, generator=gen) for _ in range(3))
    index = block_index_from_logits(torch.randn(b, h, 6, 6, generator=gen), 3, gate=True)
    got = block_gated_attention(q, k, v, block_mask_from_index(index, 6), block_size=bs, scale=0.3)
    torch.testing.assert_close(got, _dense_block_reference(q, k, v, index, bs, 0.3), atol=1e-5, rtol=1e-5)


@needs_block_op
@pytest.mark.parametrize("pattern", ["pooled", "predictor"])
def test_block_layer_eval_op_matches_its_dense_training_path(pattern):
    """Eval (the block-sparse op) and training with the hard / straight-through gate compute the same."""
    cfg = dataclasses.replace(CFG, block_size=8, block_topk=3)
    layer = _init(BlockSparseSelfAttention(cfg, pattern))
    x = torch.randn(2, 45, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    cos, sin = _tables(45, cfg)
    with torch.no_grad():
        want = layer.eval()(x, cos, sin)
        got = layer.train()(x, cos, sin)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_straight_through_gate_is_hard_forward_and_sigmoid_backward():
    logits = torch.randn(1, 2, 5, 5, requires_grad=True)
    index = block_index_from_logits(logits.detach(), 2, gate=True)
    gate = gate_from_logits(logits, index, "straight-through")
    torch.testing.assert_close(gate.detach(), block_mask_from_index(index, 5))
    gate.sum().backward()
    sig = torch.sigmoid(logits.detach())
    torch.testing.assert_close(logits.grad, sig * (1 - sig))


def test_soft_gate_is_the_sigmoid_on_causal_blocks():
    logits = torch.randn(1, 2, 5, 5)
    gate = gate_from_logits(logits, block_index_from_logits(logits, 2, gate=True), "soft")
    torch.testing.assert_close(gate, torch.sigmoid(logits) * torch.ones(5, 5).tril())


@pytest.mark.parametrize("gating", ["straight-through", "soft"])
def test_predictor_learns_through_its_gate_in_training(gating):
    cfg = dataclasses.replace(CFG, block_size=8, block_topk=3, predictor_gating=gating)
    layer = _init(BlockSparseSelfAttention(cfg, "predictor")).train()
    x = torch.randn(2, 40, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    cos, sin = _tables(40, cfg)
    layer(x, cos, sin).square().sum().backward()
    for name, p in layer.predictor.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    if gating == "soft":  # the soft mask computes something else than the hard selection
        with torch.no_grad():
            logits = layer.predictor(x)
            index = block_index_from_logits(logits, 3, gate=True)
            q, k, v = layer.qkv_proj(x).view(2, 40, 3, cfg.num_heads, -1).unbind(2)
            hard = block_gated_attention(q, k, v, block_mask_from_index(index, 5), block_size=8, scale=layer.scale)
            soft = block_gated_attention(q, k, v, gate_from_logits(logits, index, "soft"), block_size=8,
                                         scale=layer.scale)
        assert (hard - soft).abs().max() > 1e-3


def test_predictor_logits_have_one_row_per_query_block_and_head():
    predictor = BlockPatternPredictor(64, 4, 16, 32, 8)
    assert predictor(torch.randn(3, 50, 64)).shape == (3, 4, 4, 4)


# -- LSH ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("s,k,n_buckets", [(1, 4, 2), (37, 5, 4), (64, 64, 8), (50, 200, 2)])
def test_bucket_selections_are_the_latest_k_keys_of_the_bucket(s, k, n_buckets):
    buckets = torch.randint(0, n_buckets, (3, s), generator=torch.Generator().manual_seed(s + k))
    sel = bucket_selections(buckets, k, n_buckets)
    assert sel.shape == (3, s, k) and sel.dtype == torch.int32
    mask = bucket_mask(buckets, k)
    for n in range(3):
        for p in range(s):
            row = sel[n, p]
            assert set(row[row >= 0].tolist()) == set(mask[n, p].nonzero().flatten().tolist())
            assert p in row.tolist()  # a query is always in its own bucket


def test_lsh_hash_is_argmax_over_the_rotations_and_their_negation():
    x = torch.randn(2, 9, 3, 8)
    rotations = torch.randn(3, 8, 2)
    got = lsh_buckets(x, rotations)
    for b in range(2):
        for h in range(3):
            for s in range(9):
                proj = x[b, s, h] @ rotations[h]
                assert got[b, h, s] == int(torch.cat((proj, -proj)).argmax())


def _lsh_reference(layer: LSHAttention, x, cos, sin, k: int):
    """Masked dense attention: each head's query over the keys of its bucket (the k latest, causal)."""
    cfg, (b, s, _) = layer.cfg, x.shape
    h, d, r = cfg.num_heads, cfg.local_head_dim, cfg.qk_rope_head_dim
    from dsa_export.nn.patterns import _rope_prefix

    qk = layer.qk_proj(x).view(b, s, h, d)
    keys = torch.nn.functional.normalize(qk, dim=-1)
    buckets = lsh_buckets(keys, layer.rotations)  # [B,H,S]
    q, keys = _rope_prefix(qk, cos, sin, r), _rope_prefix(keys, cos, sin, r)
    v = layer.v_proj(x).view(b, s, h, d)
    scores = torch.einsum("bshd,bthd->bhst", q.double(), keys.double()) * d**-0.5
    allowed = bucket_mask(buckets.reshape(b * h, s), k).view(b, h, s, s)
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    out = torch.einsum("bhst,bthd->bshd", weights, v.double()).float()
    return layer.o_proj(out.reshape(b, s, h * d))


@pytest.mark.parametrize("k", [4, 256])  # 256 >= S: plain "attend within the bucket"
def test_lsh_attention_matches_masked_dense_attention_within_buckets(k):
    cfg = dataclasses.replace(CFG, lsh_topk=k, lsh_buckets=4)
    layer = _init(LSHAttention(cfg, index=1))
    x = torch.randn(2, 53, cfg.hidden_size, generator=torch.Generator().manual_seed(4))
    cos, sin = _tables(53, cfg)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, cos, sin), _lsh_reference(layer, x, cos, sin, k), atol=2e-5, rtol=1e-5)
    if k == 256:  # with every key of a bucket allowed, the buckets alone cut the attention
        h, d = cfg.num_heads, cfg.local_head_dim
        with torch.no_grad():
            buckets = layer.buckets(torch.nn.functional.normalize(layer.qk_proj(x).view(2, 53, h, d), dim=-1))
        causal_pairs = 2 * h * 53 * 54 / 2
        assert bucket_mask(buckets.flatten(0, 1), k).sum() < 0.6 * causal_pairs


def test_lsh_rotations_are_seeded_per_layer():
    a, b, c = LSHAttention(CFG, 1), LSHAttention(CFG, 1), LSHAttention(CFG, 2)
    assert torch.equal(a.rotations, b.rotations) and not torch.equal(a.rotations, c.rotations)
    assert a.rotations.shape == (CFG.num_heads, CFG.local_head_dim, CFG.lsh_buckets // 2)
    assert "rotations" in dict(a.named_buffers())


# -- Gumbel top-k ------------------------------------------------------------------------------
def _indexer_inputs(s: int = 60, seed: int = 5):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, s, CFG.hidden_size, generator=gen)
    q_resid = torch.randn(2, s, CFG.q_lora_rank, generator=gen)
    return (x, q_resid, *_tables(s))


def _rows(indices: torch.Tensor) -> list:
    return [frozenset(r[r >= 0].tolist()) for r in indices.reshape(-1, indices.shape[-1])]


def test_gumbel_indexer_in_eval_is_the_plain_indexer():
    plain = _init(LightningIndexer(CFG), 6).eval()
    gumbel = GumbelTopKIndexer(CFG, seed=1)
    gumbel.load_state_dict(plain.state_dict())
    inputs = _indexer_inputs()
    with torch.no_grad():
        assert torch.equal(gumbel.eval()(*inputs), plain(*inputs))


def test_gumbel_indexer_in_training_samples_reproducibly_and_causally():
    inputs = _indexer_inputs()
    a, b = _init(GumbelTopKIndexer(CFG, seed=7), 6), _init(GumbelTopKIndexer(CFG, seed=7), 6)
    with torch.no_grad():
        plain = _rows(a.eval()(*inputs))
        first, again = a.train()(*inputs), b.train()(*inputs)
        second = a(*inputs)
        a.reseed()
        replay = a(*inputs)
    assert torch.equal(first, again) and torch.equal(first, replay)  # seeded: the same samples
    assert not torch.equal(first, second)  # a fresh draw per call
    assert _rows(first) != plain  # the noise moves selections away from the deterministic top-k
    positions = torch.arange(60)[None, :, None]
    assert ((first <= positions) | (first == -1)).all()  # only allowed keys, -1 past the causal limit
    assert ((first >= 0).sum(-1) == torch.clamp(positions[..., 0] + 1, max=CFG.index_topk)).all()


def test_gumbel_noise_scales_with_the_temperature():
    inputs = _indexer_inputs()
    cold = _init(GumbelTopKIndexer(dataclasses.replace(CFG, gumbel_temperature=1e-6), seed=7), 6).train()
    hot = _init(GumbelTopKIndexer(dataclasses.replace(CFG, gumbel_temperature=10.0), seed=7), 6).train()
    with torch.no_grad():
        plain = _rows(cold.eval()(*inputs))
        cold_rows, hot_rows = _rows(cold.train()(*inputs)), _rows(hot(*inputs))
    agree = lambda rows: np.mean([len(a & b) / max(1, len(b)) for a, b in zip(rows, plain)])  # noqa: E731
    assert agree(cold_rows) > 0.99 > agree(hot_rows)


def test_relaxed_topk_is_a_differentiable_k_hot():
    scores = torch.randn(3, 40, generator=torch.Generator().manual_seed(9), requires_grad=True)
    masked = scores.masked_fill(torch.arange(40) >= 30, float("-inf"))
    khot = relaxed_topk(masked, 8, 0.5)
    torch.testing.assert_close(khot.sum(-1), torch.full((3,), 8.0))
    assert (khot[:, 30:] == 0).all()
    khot[:, 0].sum().backward()
    assert scores.grad.abs().sum() > 0
    cold = relaxed_topk(masked.detach(), 8, 1e-3)  # near zero temperature: the hard top-k
    assert torch.equal(cold.topk(8).indices.sort().values, masked.detach().topk(8).indices.sort().values)
    short = relaxed_topk(torch.tensor([[0.0, 1.0, float("-inf")]]), 4, 1.0)  # two allowed keys, k = 4
    torch.testing.assert_close(short.sum(), torch.tensor(2.0))


def test_index_scores_match_the_indexer_op_selection():
    from dsa_export.ops import dsa_indexer_topk

    gen = torch.Generator().manual_seed(8)
    q, k = torch.randn(1, 20, 16, 8, generator=gen), torch.randn(1, 20, 8, generator=gen)
    w = torch.rand(1, 20, 16, generator=gen)
    scores = index_scores(q, k, w, 0.3)
    want = dsa_indexer_topk(q, k, w, topk=5, scale=0.3)
    got = scores.topk(5, dim=-1).indices
    for s in range(5, 20):
        assert set(got[0, s].tolist()) == set(want[0, s].tolist())


# -- static patterns ---------------------------------------------------------------------------
def test_static_pattern_is_cut_to_the_run_length():
    pattern = check_static_pattern([[0, -1], [0, 1], [1, 2], [0, 3]])
    torch.testing.assert_close(slice_static_pattern(pattern, 2), torch.tensor([[0, -1], [0, 1]], dtype=torch.int32))
    # past max_seq the last stored row repeats (its keys all precede those queries)
    long = slice_static_pattern(pattern, 6)
    assert long.shape == (6, 2) and long[4:].tolist() == [[0, 3], [0, 3]]
    # keys at or past S are dropped (only non-causal user patterns have them)
    loose = check_static_pattern([[0, 3], [2, 1], [3, 0], [1, 2]], causal=False)
    assert slice_static_pattern(loose, 3).tolist() == [[0, -1], [2, 1], [-1, 0]]


@pytest.mark.parametrize("bad,match", [
    ([[0, 1]], "entry \\[0,1\\] = 1"), ([[1.0]], "integer"), ([0, 1], "max_seq, K"),
    ([[0, -1], [1, 1]], "twice"), ([[-2]], "entry"),
])
def test_static_pattern_checks_user_arrays(bad, match):
    with pytest.raises(ValueError, match=match):
        check_static_pattern(bad)


def _static_model(cfg=None):
    cfg = cfg or dataclasses.replace(BUILTIN_CONFIGS["static"], static_max_seq=96)
    return DSACausalLM(cfg).init_weights(cfg.seed).eval()


def test_frozen_patterns_reproduce_the_live_indexer_on_the_calibration_input():
    model = _static_model()
    ids = example_inputs(model.config, 1, 96, seed=3)["input_ids"]
    with torch.no_grad():
        live = model(ids)
        freeze_static_patterns(model, ids)
        frozen = model(ids)
    layers = static_indexers(model)
    assert len(layers) == 2 and all(l.frozen and l.calibration_indexer is None for l in layers)
    assert not any("calibration_indexer" in name for name, _ in model.named_parameters())
    assert all(tuple(l.pattern.shape) == (96, model.config.index_topk) for l in layers)
    torch.testing.assert_close(frozen, live)
    other = example_inputs(model.config, 2, 50, seed=4)["input_ids"]
    with torch.no_grad():
        assert model(other).shape == (2, 50, model.config.vocab_size)


def test_static_builtin_is_calibrated_when_built_and_reproducible():
    a, b = build_builtin("static"), build_builtin("static")
    for la, lb in zip(static_indexers(a), static_indexers(b)):
        assert la.frozen and torch.equal(la.pattern, lb.pattern)
        assert la.pattern.shape == (a.config.static_max_seq, a.config.index_topk)


def test_user_pattern_and_fed_pattern_give_the_same_model():
    model = _static_model()
    window = torch.arange(96)[:, None] - torch.arange(8)[None, :]
    pattern = torch.where(window >= 0, window, -1)
    for layer in static_indexers(model):
        layer.set_pattern(pattern)
    ids = example_inputs(model.config, 2, 40, seed=5)["input_ids"]
    fed = FedStaticPatternLM(model)
    with torch.no_grad():
        stored = model(ids)
        got = fed(ids, torch.stack([pattern[:40]] * 2).to(torch.int32))
    torch.testing.assert_close(got, stored)
    assert all(layer.fed is None for layer in static_indexers(model))


def test_static_indexer_without_pattern_or_indexer_says_so():
    layer = StaticPatternIndexer(CFG)
    layer.calibration_indexer = None
    with pytest.raises(RuntimeError, match="neither a pattern nor an indexer"):
        layer(*_indexer_inputs(8))


# -- configs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [{"lsh_buckets": 3}, {"block_topk": 0}, {"predictor_gating": "hard"},
                                 {"gumbel_temperature": 0.0}, {"static_max_seq": 0}])
def test_pattern_config_fields_are_checked(bad):
    with pytest.raises(ValueError):
        dataclasses.replace(CFG, **bad)


@pytest.mark.parametrize("name", ["block", "predictor", "lsh", "gumbel", "static"])
def test_pattern_builtins_use_their_layers(name):
    assert BUILTIN_CONFIGS[name].layer_types == ("local", name, name)
