"""Ratios, exponents and claim verdicts computed from synthetic cases."""

from __future__ import annotations

import pytest

from dsa_export.bench.runner import claims, exponents, ratios
from dsa_export.bench.settings import BenchSettings, BlockConfig


def case(backend, variant, seq_len, seconds, peak=None, **extra):
    return {"backend": backend, "variant": variant, "seq_len": seq_len, "median_s": seconds, "min_s": seconds,
            "peak_bytes": peak, **extra}


def synthetic_cases():
    cases = []
    for n in (1024, 2048, 4096):
        scale = n / 1024
        cases.append(case("torch", "dsa", n, 0.1 * scale**1.5, peak=int(60e6 * scale)))
        cases.append(case("torch", "dense", n, 0.05 * scale**2, peak=int(100e6 * scale)))
    cases.append(case("onnxruntime", "dsa", 1024, 0.2))
    cases.append({"backend": "onnxruntime", "variant": "dense", "seq_len": 1024, "skipped": "too long"})
    return cases


def test_ratios_pair_dsa_with_dense_of_the_same_backend_and_length():
    rows = ratios(synthetic_cases())
    assert [(r["backend"], r["seq_len"]) for r in rows] == [("torch", 1024), ("torch", 2048), ("torch", 4096)]
    assert rows[0]["dense_over_dsa_time"] == pytest.approx(0.5)
    assert rows[2]["dense_over_dsa_time"] == pytest.approx(0.05 * 16 / (0.1 * 8))
    assert rows[1]["dsa_over_dense_memory"] == pytest.approx(0.6)


def test_exponents_per_curve_skip_skipped_cases():
    fits = exponents(synthetic_cases())
    assert fits["torch/dsa"]["time"]["exponent"] == pytest.approx(1.5)
    assert fits["torch/dense"]["time"]["exponent"] == pytest.approx(2.0)
    assert fits["torch/dense"]["memory"]["exponent"] == pytest.approx(1.0, abs=1e-6)
    assert "onnxruntime/dsa" not in fits and "onnxruntime/dense" not in fits  # one point, one skipped


def report_for(cases, seq_lens, measured_sparsity):
    from dsa_export.bench.flops import sparsity

    settings = BenchSettings(seq_lens=seq_lens, backends=("torch",), variants=("dsa", "dense"),
                             block=BlockConfig(topk=512))
    report = {"ratios": ratios(cases),
              "sparsity": [{"seq_len": n, "analytic": sparsity(n, 512), "measured": measured_sparsity(n)}
                           for n in seq_lens]}
    return claims(report, settings), settings


def test_claims_say_no_when_dense_is_faster_and_yes_when_they_hold():
    verdicts, _ = report_for(synthetic_cases(), (1024, 2048, 4096), lambda n: None)
    speed, memory, sparse = verdicts
    from dsa_export.bench.flops import layer_flops

    f = layer_flops(BlockConfig(topk=512), 4096)
    assert speed["measured"] == [{"backend": "torch", "seq_len": 4096, "value": pytest.approx(1.0),
                                  "flop_ratio": pytest.approx(f.dense_total / f.dsa_total)}]
    assert not speed["agrees"] and speed["verdict"] == "does not hold"
    assert memory["measured"][0]["value"] == pytest.approx(0.4) and memory["agrees"] and memory["verdict"] == "holds"
    assert not sparse["agrees"] and "6560..9976" in sparse["note"]

    fast = [case("torch", "dsa", 8192, 1.0, peak=10), case("torch", "dense", 8192, 4.0, peak=10)]
    from dsa_export.bench.flops import sparsity

    verdicts, _ = report_for(fast, (8192,), lambda n: sparsity(n, 512))
    assert verdicts[0]["agrees"] and verdicts[2]["agrees"]
    assert not verdicts[1]["agrees"] and "not measured" in verdicts[1]["note"]
    assert verdicts[1]["verdict"] == "not measured"


def test_over_budget_extends_the_curve_by_its_last_growth():
    from dsa_export.bench.runner import over_budget

    assert over_budget([], 4096, 10.0) is None
    # 1 s at 1024, 4 s at 2048: L^2, so 16 s predicted at 4096 (over 10 s), 4096 fits a 20 s budget.
    curve = [(1024, 1.0), (2048, 4.0)]
    reason = over_budget(curve, 4096, 10.0)
    assert reason is not None and "16 s" in reason and "L^2.00" in reason
    assert over_budget(curve, 4096, 20.0) is None
    # One point: assumed quadratic; a call already past the budget stops the curve.
    assert over_budget([(1024, 1.0)], 4096, 10.0) is not None
    assert "took 12 s" in over_budget([(1024, 12.0)], 2048, 10.0)
    # Growth is clamped to L^1..L^2.5 (a faster second call does not predict a shrinking time).
    assert over_budget([(1024, 4.0), (2048, 1.0)], 4096, 1.5) is not None
