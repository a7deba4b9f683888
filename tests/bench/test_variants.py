"""The block-sparse and LSH layers of the benchmark: their outputs against dense references, the
sparsity and CSR figures of their selections, the claims rows computed from known inputs, and the
cuda backend's wiring of them (stand-in kernels)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dsa_export.bench.block import make_blocks, make_input
from dsa_export.bench.claims import claims, csr_claim, sparsity_claim, speed_claim
from dsa_export.bench.flops import block_pairs, block_sparsity, causal_pairs, layer_flops
from dsa_export.bench.runner import ratios, run_bench
from dsa_export.bench.selection import block_selection_pairs, csr_figures, measured_sparsity
from dsa_export.bench.settings import BenchSettings, BlockConfig
from dsa_export.nn.patterns import block_gated_attention, block_mask_from_index, bucket_mask, lsh_buckets
from dsa_export.ops.csr import block_index_to_csr, canonical_block_index, csr_to_block_index

CFG = BlockConfig(hidden=64, heads=4, kv_heads=1, head_dim=16, index_heads=16, index_head_dim=16, topk=8,
                  block_size=8, lsh_buckets=4)


def _layer_parts(block, x):
    with torch.inference_mode():
        q, k, v = block.qkv(x)
    return q, k, v


def test_block_layer_is_dense_attention_over_its_selected_blocks():
    block = make_blocks(CFG, ("block",))["block"]
    x = make_input(CFG, 44)  # 6 blocks of 8, the last ragged
    q, k, v = _layer_parts(block, x)
    index = block.select_blocks(q, k)
    assert index.shape == (1, CFG.heads, 6, 1)  # topk 8 // block 8 = 1 block per query block: the diagonal
    wide = block.select_blocks(q, k, 8, 3)
    assert (wide[..., 0] == torch.arange(6)).all()  # the diagonal block first
    with torch.inference_mode():
        block.selection_fn = lambda q_, k_: block.select_blocks(q_, k_, 8, 3)
        got = block(x)
        gate = block_mask_from_index(wide, 6)
        want = block.o_proj(block_gated_attention(q, k, v, gate, block_size=8, scale=16**-0.5).reshape(1, 44, -1))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_lsh_layer_is_dense_attention_inside_its_buckets():
    block = make_blocks(CFG, ("lsh",))["lsh"]
    x = make_input(CFG, 40)
    q, _, v = _layer_parts(block, x)
    keys = torch.nn.functional.normalize(q, dim=-1)
    buckets = lsh_buckets(keys, block.rotations).reshape(CFG.heads, 40)
    allowed = bucket_mask(buckets, CFG.topk)  # [H,S,S]: the topk latest keys of the bucket
    scores = torch.einsum("shd,thd->hst", q[0], keys[0]) * 16**-0.5
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    want = torch.einsum("hst,td->shd", probs, v[0, :, 0]).reshape(1, 40, -1)
    with torch.inference_mode():
        got = block(x)
        want = block.o_proj(want)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    selection = block.select_lsh(q, keys)
    assert selection.shape == (CFG.heads, 40, CFG.topk)
    assert int((selection >= 0).sum()) == int(allowed.sum())


def _brute_force_pairs(index, seq_len, bs):
    pairs = 0
    for row in index.reshape(-1, index.shape[2], index.shape[3]):
        for i, ids in enumerate(row):
            for j in {int(j) for j in ids if 0 <= j < -(-seq_len // bs)}:
                pairs += sum(1 for qp, kp in itertools.product(range(i * bs, min(seq_len, i * bs + bs)),
                                                               range(j * bs, min(seq_len, j * bs + bs))) if kp <= qp)
    return pairs


def test_block_pairs_count_listed_causal_pairs_once():
    # L = 10, blocks of 4 (4, 4, 2 positions): pads, a repeat, an id past the end, a future block.
    index = torch.tensor([[[[0, -1, -1], [1, 0, 0], [2, 5, 1]],
                           [[0, 2, -1], [1, -1, -1], [2, 0, 1]]]], dtype=torch.int32)
    assert block_selection_pairs(index, 10, 4) == _brute_force_pairs(index, 10, 4) == (10 + 26 + 11) + (10 + 10 + 19)
    # Every causal block listed: every causal pair, and the analytic count agrees.
    full = torch.tensor([[[[0, -1, -1], [1, 0, -1], [2, 1, 0]]]], dtype=torch.int32)
    assert block_selection_pairs(full, 10, 4) == causal_pairs(10) == block_pairs(10, 4, 3)
    assert block_pairs(10, 4, 1) == _brute_force_pairs(torch.tensor([[[[0], [1], [2]]]]), 10, 4) == 10 + 10 + 3
    assert measured_sparsity("block", full, 10, BlockConfig(block_size=4)) == 0.0
    assert block_sparsity(10, 4, 1) == pytest.approx(1 - 23 / 55)


def test_dsa_and_lsh_sparsity_count_valid_slots():
    sel = torch.tensor([[[0, -1], [0, 1], [2, -1]], [[0, -1], [-1, -1], [1, 2]]], dtype=torch.int32)  # [2,3,2]
    assert measured_sparsity("lsh", sel, 3, CFG) == pytest.approx(1 - 7 / 12)
    assert measured_sparsity("dsa", sel[:1], 3, CFG) == pytest.approx(1 - 4 / 6)
    assert measured_sparsity("dsa", sel, 4, CFG) is None and measured_sparsity("block", None, 3, CFG) is None


def test_csr_figures_are_csr_storage_of_the_layers_selections():
    cfg = BlockConfig(hidden=64, heads=4, kv_heads=1, head_dim=16, topk=64, block_size=16)
    block = make_blocks(cfg, ("block",))["block"]
    x = make_input(cfg, 200)
    figures = csr_figures(block, x, (8, 16))
    assert [(f["block_size"], f["blocks_per_query_block"]) for f in figures] == [(8, 8), (16, 4)]
    q, k, _ = _layer_parts(block, x)
    for f in figures:
        bs, kb = f["block_size"], f["blocks_per_query_block"]
        n = -(-200 // bs)
        index = block.select_blocks(q, k, bs, kb)
        row_ptr, col_idx = block_index_to_csr(index, n)
        np.testing.assert_array_equal(csr_to_block_index(row_ptr, col_idx, kb), canonical_block_index(index, n))
        nnz = cfg.heads * sum(min(i + 1, kb) for i in range(n))
        rows = cfg.heads * n
        assert f["nnz"] == nnz and f["rows"] == rows
        assert f["csr_bytes"] == 4 * (rows + 1) + 4 * nnz and f["dense_block_bytes"] == rows * n
        assert f["saving_vs_dense_block"] == pytest.approx(rows * n / (4 * (rows + 1) + 4 * nnz))
        ptr_bytes = 1 if nnz < 256 else 2  # the narrowest ints: ids < 256 in one byte, pointers < 65536 in two
        assert f["narrowest_csr_bytes"] == ptr_bytes * (rows + 1) + nnz
        assert f["seq_len"] == 200 and f["density"] == pytest.approx(nnz / (rows * n))


def _report(ratio_rows, sparsity_rows, csr_rows):
    return {"ratios": ratio_rows, "sparsity": sparsity_rows, "csr_storage": csr_rows}


def test_claims_rows_compute_verdicts_from_known_inputs():
    settings = BenchSettings(seq_lens=(4096, 16384), backends=("torch",))
    cfg = settings.block
    case = lambda v, n, t, peak=None: {"backend": "torch", "variant": v, "seq_len": n, "median_s": t, "min_s": t,
                                       "peak_bytes": peak}
    cases = [case("dense", 4096, 1.0), case("block", 4096, 0.5), case("lsh", 4096, 2.0),
             case("dense", 16384, 16.0), case("block", 16384, 4.0), case("lsh", 16384, 8.0)]
    rows = ratios(cases)
    assert rows[1]["dense_over_block_time"] == 4.0 and rows[1]["dense_over_lsh_time"] == 2.0
    sparsity = [{"variant": "block", "seq_len": 4096, "analytic": 0.8, "measured": 0.8},
                {"variant": "block", "seq_len": 16384, "analytic": 0.95, "measured": 0.95},
                {"variant": "lsh", "seq_len": 4096, "analytic": None, "measured": 0.87},
                {"variant": "lsh", "seq_len": 16384, "analytic": None, "measured": None}]
    csr = [{"seq_len": n, "block_size": bs, "blocks_per_query_block": 512 // bs, "density": d, "csr_bytes": c,
            "dense_block_bytes": m, "saving_vs_dense_block": m / c, "saving_vs_dense_block_bit": m / 8 / c}
           for n, bs, d, c, m in ((4096, 32, 0.12, 100, 300), (16384, 32, 0.03, 100, 700), (16384, 64, 0.06, 100, 350))]
    report = _report(rows, sparsity, csr)
    block_speed = speed_claim(report, settings, "block")
    assert block_speed["verdict"] == "holds" and block_speed["measured"][0]["value"] == 4.0
    flops = layer_flops(cfg, 16384)
    assert block_speed["measured"][0]["flop_ratio"] == pytest.approx(flops.dense_total / flops.block_total)
    lsh_speed = speed_claim(report, settings, "lsh")
    assert lsh_speed["verdict"] == "does not hold" and "2.00x" in lsh_speed["note"]
    assert lsh_speed["measured"][0]["flop_ratio"] is None  # no measured LSH selection at 16384
    assert sparsity_claim(report, settings, "block")["verdict"] == "does not hold"  # 80% and 95%
    lsh_sparsity = sparsity_claim(report, settings, "lsh")
    assert lsh_sparsity["verdict"] == "holds" and "L = 4096" in lsh_sparsity["note"]
    storage = csr_claim(report)
    assert storage["verdict"] == "holds" and "7.00x at the longest L=16384" in storage["note"]
    assert "L = 16384 of this run" in storage["note"]
    assert csr_claim(_report(rows, sparsity, csr[:1]))["verdict"] == "does not hold"  # 3x at the longest L
    missing = csr_claim(_report([], [], []))
    assert missing["verdict"] == "not measured" and not missing["agrees"]
    assert speed_claim(_report([], [], []), settings, "block")["verdict"] == "not measured"
    names = [(c["claim"], c["variant"]) for c in claims({**report, "sparsity": sparsity}, settings)]
    assert names == [("3-5x faster inference on long text", "dsa"), ("about 40% less memory at 2048 tokens", "dsa"),
                     ("85-90% sparsity", "dsa"), ("3-5x faster inference on long text", "block"),
                     ("85-90% sparsity", "block"), ("3-5x faster inference on long text", "lsh"),
                     ("85-90% sparsity", "lsh"), ("4x less storage for block masks in CSR at 32x32", "block")]


def test_torch_run_of_the_new_variants_reports_sparsity_csr_and_claims():
    settings = BenchSettings(seq_lens=(32, 96), backends=("torch",), variants=("dense", "block", "lsh"), block=CFG,
                             repeats=1, warmup=0, memory=False)
    lines = []
    report = run_bench(settings, progress=lines.append)
    done = {(c["variant"], c["seq_len"]) for c in report["cases"] if "skipped" not in c}
    assert done == {(v, n) for v in ("dense", "block", "lsh") for n in (32, 96)}
    parts = {c["variant"]: set(c.get("parts_median_s", {})) for c in report["cases"]}
    assert parts == {"dense": {"dense_attention"}, "block": {"selection", "block_sparse_attention"},
                     "lsh": {"selection", "sparse_attention"}}
    sparsity = {(s["variant"], s["seq_len"]): s for s in report["sparsity"]}
    assert set(sparsity) == {(v, n) for v in ("block", "lsh") for n in (32, 96)}
    for n in (32, 96):  # the block layer lists min(i+1, Kb) causal blocks: measured equals analytic
        assert sparsity[("block", n)]["measured"] == pytest.approx(sparsity[("block", n)]["analytic"])
        assert 0.0 < sparsity[("lsh", n)]["measured"] < 1.0 and sparsity[("lsh", n)]["analytic"] is None
    assert [(r["seq_len"], r["block_size"]) for r in report["csr_storage"]] == [(32, 32), (32, 64), (96, 32), (96, 64)]
    assert any(line.startswith("csr storage L=96") for line in lines)
    assert {r["seq_len"] for r in report["ratios"]} == {32, 96}
    assert all("dense_over_block_time" in r and "dense_over_lsh_time" in r for r in report["ratios"])
    assert [c["variant"] for c in report["claims"]] == ["block", "block", "lsh", "lsh", "block"]
    assert all(c["verdict"] in ("holds", "does not hold", "not measured") for c in report["claims"])
    from dsa_export.bench.report import render

    text = render(report)
    assert "bool/CSR" in text and "4x less storage for block masks in CSR at 32x32" in text
    assert "block sparsity" in text and "LSH sparsity" in text and "dense/block time" in text
