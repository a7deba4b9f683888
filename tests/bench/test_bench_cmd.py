"""``dsa-export bench`` end to end on a tiny configuration, and its usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(*args, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(env_extra or []), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "dsa_export", "bench", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    args = ["--seq", "128,256", "--repeats", "2", "--max-onnxruntime-seq", "128", "--json", str(out / "b.json"),
            "--markdown", str(out / "b.md")]
    if _has_matplotlib():
        args += ["--plot", str(out / "b.png")]
    result = run(*args)
    assert result.returncode == 0, result.stderr
    return out, result


def test_json_holds_medians_ratios_exponents_flops_and_claims(tiny_run):
    out, result = tiny_run
    report = json.loads((out / "b.json").read_text())
    assert {"schema", "date", "environment", "config", "settings", "cases", "ratios", "exponents", "flops",
            "sparsity", "claims", "notes"} <= set(report)
    assert {"csr_storage"} <= set(report) and report["settings"]["variants"] == ["dsa", "dense", "block", "lsh"]
    run_cases = [c for c in report["cases"] if "skipped" not in c]
    variants = ("dsa", "dense", "block", "lsh")
    assert {(c["backend"], c["variant"], c["seq_len"]) for c in run_cases} == {
        *(("torch", v, n) for v in variants for n in (128, 256)), *(("onnxruntime", v, 128) for v in variants)}
    for c in run_cases:
        assert c["median_s"] > 0 and 1 <= c["repeats"] <= 2 and c["min_s"] <= c["median_s"] <= c["max_s"]
        assert c["peak_bytes"] is None or c["peak_bytes"] >= 0
    torch_dsa = [c for c in run_cases if (c["backend"], c["variant"]) == ("torch", "dsa")]
    for c in torch_dsa:  # the DSA layer's parts are timed inside the same calls
        assert set(c["parts_median_s"]) == {"indexer", "sparse_attention"}
        assert all(0 < v <= c["max_s"] for v in c["parts_median_s"].values())
    skipped = [c for c in report["cases"] if "skipped" in c]
    assert len(skipped) == 4 and all("--max-onnxruntime-seq 128" in c["skipped"] for c in skipped)
    assert {(r["backend"], r["seq_len"]) for r in report["ratios"]} == {("torch", 128), ("torch", 256), ("onnxruntime", 128)}
    assert set(report["exponents"]) == {
        "torch/dsa", "torch/dense", "torch/dsa/indexer", "torch/dsa/sparse_attention", "torch/dense/dense_attention",
        "torch/block", "torch/block/selection", "torch/block/block_sparse_attention", "torch/lsh", "torch/lsh/selection",
        "torch/lsh/sparse_attention"}
    assert report["exponents"]["torch/dsa/sparse_attention"]["time"]["points"] == 2
    assert [f["seq_len"] for f in report["flops"]] == [128, 256]
    # Below top-k (and with at most 8 blocks of 64) every allowed key is selected: nothing is skipped.
    sparsity = {(s["variant"], s["seq_len"]): s for s in report["sparsity"]}
    assert all(sparsity[(v, n)]["analytic"] == 0.0 and sparsity[(v, n)]["measured"] == 0.0
               for v in ("dsa", "block") for n in (128, 256))
    assert all(0.5 < sparsity[("lsh", n)]["measured"] < 1.0 for n in (128, 256))  # inside 8 buckets only
    assert [(c["claim"], c["variant"]) for c in report["claims"]] == [
        ("3-5x faster inference on long text", "dsa"), ("about 40% less memory at 2048 tokens", "dsa"),
        ("85-90% sparsity", "dsa"), ("3-5x faster inference on long text", "block"), ("85-90% sparsity", "block"),
        ("3-5x faster inference on long text", "lsh"), ("85-90% sparsity", "lsh"),
        ("4x less storage for block masks in CSR at 32x32", "block")]
    assert "dense/DSA time" in result.stdout and "--max-onnxruntime-seq" in result.stdout
    # The CSR storage figures of the block layer's selections are printed, table and claim.
    assert "bool/CSR" in result.stdout and "4x less storage for block masks in CSR at 32x32" in result.stdout
    csr = {(r["seq_len"], r["block_size"]): r for r in report["csr_storage"]}
    assert set(csr) == {(n, bs) for n in (128, 256) for bs in (32, 64)}
    assert f"CSR {csr[(256, 32)]['csr_bytes']} B (int32)" in result.stderr
    markdown = (out / "b.md").read_text()
    assert "- date: " + report["date"] in markdown and "| backend | L | DSA ms | dense ms |" in markdown


def test_plot_is_a_png(tiny_run):
    if not _has_matplotlib():
        pytest.skip("matplotlib is not installed (the bench extra); the PNG is not written")
    out, _ = tiny_run
    data = (out / "b.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 200_000


def test_plot_without_matplotlib_names_the_extra(tmp_path):
    fake = tmp_path / "fake"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is hidden by this test')\n")
    result = run("--seq", "128", "--plot", str(tmp_path / "p.png"), env_extra=[str(fake)])
    assert result.returncode == 1
    assert "pip install 'dsa-export[bench]'" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "p.png").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--backends", "torch,tpu"], "names no known backend"),
        (["--backends", "torch,torch"], "lists a backend twice"),
        (["--seq", "1024,x"], "comma-separated"),
        (["--seq", "1"], "at least 2"),
        (["--topk", "0"], "Invalid value"),
        (["--repeats", "0"], "Invalid value"),
        (["--plot", "{tmp}/plot.jpg"], "must end in .png"),
    ],
)
def test_bad_arguments_exit_2_with_one_sentence(tmp_path, args, message):
    result = run(*[a.format(tmp=tmp_path) for a in args])
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("Error")] == [result.stderr.splitlines()[-1]]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--variants", "dsa,sparse"], "names no known variant"),
        (["--variants", "block,block"], "lists a variant twice"),
        (["--lsh-buckets", "7"], "must be even"),
        (["--case", "moe", "--variants", "dsa"], "--variants belongs to --case attention"),
    ],
)
def test_bad_variant_options_exit_2_before_any_work(capsys, args, message):
    from dsa_export.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "preparing" not in err


def test_cuda_backend_without_a_gpu_fails_with_one_sentence():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible; the missing-GPU message cannot be provoked")
    result = run("--seq", "128", "--backends", "torch,cuda")
    assert result.returncode == 1
    assert "cuda benchmark backend needs a CUDA GPU" in result.stderr and "Traceback" not in result.stderr
    assert "preparing" not in result.stderr and "L=128" not in result.stderr  # failed before any work


def test_gpu_hook_without_a_gpu_fails_with_one_sentence(tmp_path, capsys):
    import torch

    from dsa_export.bench import gpu

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible; the missing-GPU message cannot be provoked")
    assert gpu.main([str(tmp_path / "out"), "--seq", "128"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: The cuda benchmark backend needs a CUDA GPU")
    assert not (tmp_path / "out").exists()


def test_json_to_stdout_is_the_only_stdout():
    result = run("--seq", "64", "--repeats", "1", "--backends", "torch", "--no-memory", "--variants", "dsa,dense",
                 "--json", "-")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [c["seq_len"] for c in report["cases"]] == [64, 64] and "peak_bytes" not in report["cases"][0]
    assert report["csr_storage"] == [] and [c["variant"] for c in report["claims"]] == ["dsa"] * 3


def test_gemm_rate_gflops_and_agreement_with_torch(tiny_run):
    out, _ = tiny_run
    report = json.loads((out / "b.json").read_text())
    gemm = report["environment"]["gemm_gflops"]
    assert set(gemm) == {"torch", "onnxruntime"}
    assert all(rate["start"] > 0 and rate["end"] > 0 for rate in gemm.values())
    run_cases = [c for c in report["cases"] if "skipped" not in c]
    for c in run_cases:
        assert c["gflops"]["layer"] > 0
    dense = next(c for c in run_cases if (c["backend"], c["variant"]) == ("torch", "dense"))
    assert set(dense["parts_median_s"]) == {"dense_attention"} and dense["gflops"]["dense_attention"] > 0
    ort_dsa = next(c for c in run_cases if (c["backend"], c["variant"]) == ("onnxruntime", "dsa"))
    agreement = ort_dsa["agreement"]
    assert agreement["reference"] == "torch" and agreement["queries"] == 128
    assert agreement["max_abs_diff"] < 1e-4 and agreement["cosine"] > 0.999999
    assert agreement["selection_differs"] == agreement["near_tie_rows"] == 0
    for variant in ("block", "lsh"):  # the exported block-sparse and LSH layers agree with torch
        agreement = next(c for c in run_cases if (c["backend"], c["variant"]) == ("onnxruntime", variant))["agreement"]
        assert agreement["max_abs_diff"] < 1e-4 and agreement["cosine"] > 0.999999
        assert agreement["selection_differs"] == 0 and agreement["queries"] > 0
    assert "GFLOP/s" in (out / "b.md").read_text()
