"""``dsa-export bench --case moe``: the harness wiring on a tiny layer, its formulas, and usage errors.

The real-width numbers are a command's output (docs/bench.md), not a test: here the layer is
hidden 64, experts of 32, top-2, so every backend runs in milliseconds.
"""

from __future__ import annotations

import json

import pytest

from dsa_export.bench.moe import (
    batched_mm_gather_bytes,
    build_block,
    check_export_space,
    layer_weight_bytes,
    moe_exponents,
    moe_flops,
    moe_ratios,
    run_moe_bench,
)
from dsa_export.bench.settings import MoEBenchSettings, MoEConfig
from tests.bench.test_bench_cmd import _has_matplotlib, run

pytest.importorskip("transformers", reason="the MoE case times transformers' experts")

TINY = ["--hidden", "64", "--intermediate", "32", "--top-k", "2", "--experts", "8"]
TINY_CFG = MoEConfig(hidden=64, intermediate=32, top_k=2)
#: batched_mm's gather of 4 tokens at the tiny width, in GiB: N=4 runs, N=16 is skipped.
GATHER_4 = 4 * 2 * 3 * 64 * 32 * 4 / 2**30


@pytest.fixture(scope="module")
def tiny_moe_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-moe")
    plot = ["--plot", str(out / "m.png")] if _has_matplotlib() else []
    result = run("--case", "moe", *TINY, "--tokens", "1,4,16", "--repeats", "2", "--batched-mm-limit", str(GATHER_4),
                 "--json", str(out / "m.json"), "--markdown", str(out / "m.md"), *plot)
    assert result.returncode == 0, result.stderr
    return out, result


def test_json_holds_every_backend_ratios_growth_and_agreement(tiny_moe_run):
    out, result = tiny_moe_run
    report = json.loads((out / "m.json").read_text())
    assert report["schema"] == "dsa-export-bench-moe/1" and report["case"] == "moe"
    assert {"transformers", "onnxruntime", "load_average_1_5_15", "load_average_after"} <= set(report["environment"])
    assert report["config"] == {**TINY_CFG.__dict__}
    ran = {(c["backend"], c["tokens"]) for c in report["cases"] if "skipped" not in c}
    assert ran == {(b, n) for b in ("ours", "eager", "onnxruntime") for n in (1, 4, 16)} | {
        ("batched_mm", 1), ("batched_mm", 4)}
    (skipped,) = [c for c in report["cases"] if "skipped" in c]
    assert skipped["backend"] == "batched_mm" and skipped["tokens"] == 16
    assert "would gather" in skipped["skipped"] and report["notes"] == [skipped["skipped"]]
    for case in report["cases"]:
        if "skipped" not in case:
            assert 0 < case["min_s"] <= case["median_s"] <= case["max_s"] and 1 <= case["repeats"] <= 2
            assert case["peak_bytes"] is None or case["peak_bytes"] >= 0
            assert case["gflops"] == pytest.approx(moe_flops(TINY_CFG, 8, case["tokens"]) / case["median_s"] / 1e9)
    assert {(r["backend"], r["tokens"]) for r in report["ratios"]} == ran - {("eager", n) for n in (1, 4, 16)}
    assert set(report["exponents"]) == {"E8/ours", "E8/eager", "E8/batched_mm", "E8/onnxruntime"}
    (layer,) = report["layers"]
    assert layer["experts"] == 8 and layer["weight_bytes"] == 4 * (8 * 3 * 64 * 32 + 3 * 64 * 32 + 8 * 64)
    # every backend computes the same layer: checked against eager at 16 tokens (batched_mm at its last)
    assert {b: a["tokens"] for b, a in layer["agreement"].items()} == {
        "ours": 16, "eager": 16, "batched_mm": 1, "onnxruntime": 16}
    for a in layer["agreement"].values():
        assert a["max_abs_diff"] <= 1e-5 * a["max_abs_reference"] and a["cosine"] > 0.999999
    assert layer["onnxruntime_export_s"] > 0
    assert "ours ms (MiB)" in result.stdout and "ours/eager time" in result.stdout
    markdown = (out / "m.md").read_text()
    assert "- date: " + report["date"] in markdown and "| E | N | ours ms (MiB) | eager ms (MiB) |" in markdown


def test_moe_plot_is_a_png(tiny_moe_run):
    if not _has_matplotlib():
        pytest.skip("matplotlib is not installed (the bench extra); the PNG is not written")
    out, _ = tiny_moe_run
    data = (out / "m.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 200_000


def test_bf16_layer_without_onnxruntime():
    settings = MoEBenchSettings(tokens=(2, 8), experts=(8,), backends=("ours", "eager"), repeats=1, memory=False,
                                layer=MoEConfig(hidden=64, intermediate=32, top_k=2, dtype="bf16"))
    report = run_moe_bench(settings)
    # the torch backends take turns at each token count
    assert [(c["backend"], c["tokens"]) for c in report["cases"]] == [("ours", 2), ("eager", 2), ("ours", 8),
                                                                      ("eager", 8)]
    agreement = report["layers"][0]["agreement"]["ours"]
    assert agreement["max_abs_diff"] <= 2e-2 * agreement["max_abs_reference"]  # bf16 rounding, float32 accumulation
    assert "onnxruntime" not in report["environment"]


def test_flops_gather_bytes_ratios_and_exponents():
    real = MoEConfig()
    assert batched_mm_gather_bytes(real, 1) == 8 * 3 * 7168 * 2048 * 4  # 1.3 GiB per token in fp32
    assert batched_mm_gather_bytes(MoEConfig(dtype="bf16"), 3) == 3 * 8 * 3 * 7168 * 2048 * 2
    assert moe_flops(real, 256, 1) == 2 * 7168 * 256 + 6 * 8 * 7168 * 2048 + 6 * 7168 * 2048
    cases = [{"experts": 16, "backend": b, "tokens": n, "median_s": s * n, "min_s": s * n, "peak_bytes": p * n}
             for b, s, p in (("eager", 2.0, 100), ("ours", 1.0, 50)) for n in (1, 2, 4)]
    cases.append({"experts": 16, "backend": "batched_mm", "tokens": 4, "skipped": "too big"})
    rows = moe_ratios(cases)
    assert [(r["backend"], r["tokens"]) for r in rows] == [("ours", 1), ("ours", 2), ("ours", 4)]
    assert all(r["time_vs_eager"] == pytest.approx(0.5) and r["memory_vs_eager"] == pytest.approx(0.5) for r in rows)
    fits = moe_exponents(cases)
    assert set(fits) == {"E16/eager", "E16/ours"}
    assert fits["E16/ours"]["time"]["exponent"] == pytest.approx(1.0)
    assert fits["E16/ours"]["memory"]["exponent"] == pytest.approx(1.0)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_layer_weight_bytes_match_the_built_block(dtype):
    cfg = MoEConfig(hidden=64, intermediate=32, top_k=2, dtype=dtype)
    block = build_block(cfg, 8)
    assert layer_weight_bytes(cfg, 8) == sum(p.numel() * p.element_size() for p in block.parameters())
    assert block.gate.e_score_correction_bias.dtype.is_floating_point and block.gate.e_score_correction_bias.std() > 0


def test_an_export_that_cannot_fit_is_refused_before_timing(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from dsa_export.errors import DSAUserError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: usage(10 << 30, 10 << 30, 1 << 30))
    with pytest.raises(DSAUserError, match=r"exports the layer \(3\.0 GiB with its graph\) to .* 1\.0 GiB free"):
        check_export_space(MoEBenchSettings(experts=(16,)))
    check_export_space(MoEBenchSettings(experts=(16,), backends=("ours", "eager")))  # no export: nothing to check


def test_settings_refuse_layers_that_cannot_route():
    with pytest.raises(ValueError, match="do not split into 4 groups"):
        MoEBenchSettings(experts=(10,))
    with pytest.raises(ValueError, match="top_k 8 exceeds the 6 experts"):
        MoEBenchSettings(experts=(8,))
    with pytest.raises(ValueError, match="fp32 only"):
        MoEBenchSettings(layer=MoEConfig(dtype="bf16"))


@pytest.mark.parametrize(
    "args,message",
    [
        (["--case", "moe", "--seq", "128"], "--seq belongs to --case attention"),
        (["--tokens", "4"], "--tokens belongs to --case moe"),
        (["--case", "moe", "--backends", "torch"], "names no known backend of --case moe"),
        (["--backends", "eager"], "names no known backend of --case attention"),
        (["--case", "moe", "--dtype", "bf16", "--backends", "ours,onnxruntime"], "fp32 only"),
        (["--case", "moe", "--experts", "6"], "do not split into 4 groups"),
    ],
)
def test_moe_usage_errors_exit_2_before_any_work(args, message):
    result = run(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr and "Traceback" not in result.stderr and "building" not in result.stderr
