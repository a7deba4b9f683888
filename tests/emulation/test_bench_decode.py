"""tools/bench_decode_kernels.py (the GPU decode benchmark of tools/gpu_check.sh) runs on the
emulated kernels at small widths: its cases, byte counts and spot checks work before a GPU is lent,
and a wrong kernel output makes its case invalid (a fast but wrong kernel reports no speed)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from .build import BuildError
from .harness import EmulatedKernels

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_decode_kernels.py"


def _tool():
    spec = importlib.util.spec_from_file_location("bench_decode_kernels", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_decode_kernels", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def emulated():
    try:
        return EmulatedKernels()
    except BuildError as exc:
        if "not found" in str(exc) or "no host C++ compiler" in str(exc):
            pytest.skip(str(exc))
        raise


def test_every_case_runs_and_passes_its_check_on_the_emulated_kernels(tmp_path):
    out = tmp_path / "bench_decode.json"
    assert _tool().main(["--device", "cpu", "--out", str(out), "--batches", "1,2", "--contexts", "200",
                         "--caches", "bf16,fp8"]) == 0
    report = json.loads(out.read_text())
    assert [c["case"] for c in report["cases"]] == ["bf16-b1-ctx200", "bf16-b2-ctx200", "fp8-b1-ctx200",
                                                    "fp8-b2-ctx200"]
    assert all(c["valid"] for c in report["cases"]) and report["invalid_cases"] == []
    bf16, fp8 = report["cases"][1], report["cases"][3]
    dims = report["dims"]
    # Index keys of every cached token, latent rows of the selection: FP8 reads 132 / 656 of 256 / 1152.
    assert bf16["indexer_bytes"] == 2 * 200 * 2 * dims["D"]
    assert fp8["indexer_bytes"] == 2 * 200 * (dims["D"] + 4)
    assert bf16["attention_bytes"] == 2 * dims["topk"] * 2 * (dims["C"] + dims["R"])
    assert fp8["attention_bytes"] == 2 * dims["topk"] * (dims["C"] + 4 + 2 * dims["R"])


def test_a_wrong_attention_output_makes_the_case_invalid(emulated, monkeypatch):
    tool = _tool()
    real = emulated.sparse_attention_paged

    def off_by_a_bit(*args, **kwargs):
        out = real(*args, **kwargs)
        return out * 1.1

    monkeypatch.setattr(emulated, "sparse_attention_paged", off_by_a_bit)
    try:
        result = tool.run_case(emulated, 1, 200, "bf16", tool.shape_args(real=False), "cpu")
    finally:
        emulated.reset()
    assert not result["valid"] and "attention max error" in result["check_problems"][0]
