"""Every recorded environment yields exactly the blocking findings its fixture file lists."""

from __future__ import annotations

from typing import Any

import pytest

from dsa_export.compat.rules import CheckSettings, run_checks

from .helpers import FIXTURE_NAMES, fixture_probe, load_fixture

CASES = [
    pytest.param(name, index, expectation, id=f"{name}-{index}")
    for name in FIXTURE_NAMES
    for index, expectation in enumerate(load_fixture(name)["expectations"])
]


def test_every_issue_scenario_has_a_fixture() -> None:
    assert set(FIXTURE_NAMES) >= {
        "l40s_cuda129_trt11",
        "a10_cuda130_trt10130",
        "rtx4090_cuda130_rtx11",
        "a10g_cuda118_ort1181",
        "h100_driver580_cuda131",
        "h200_driver580_cuda13_trt11",
        "a100_cuda124_trt103",
        "t4_tensorrt_rtx",
        "driver_older_than_toolkit",
        "cpu_only",
        "volta_trt105",
        "cudnn805",
    }


@pytest.mark.parametrize(("name", "index", "expectation"), CASES)
def test_fixture_yields_expected_findings(
    name: str, index: int, expectation: dict[str, Any]
) -> None:
    report = run_checks(CheckSettings(**expectation["settings"]), fixture_probe(name))
    ids = [finding.id for finding in report.findings]
    assert sorted(f.id for f in report.blocking) == expectation["blocking"], report.to_json()
    assert report.exit_code == (1 if expectation["blocking"] else 0)
    for finding_id in expectation["present"]:
        assert finding_id in ids, f"{finding_id} missing from {ids}"
    for finding_id in expectation["absent"]:
        assert finding_id not in ids, f"{finding_id} unexpectedly in {ids}"
    if "resolved_backend" in expectation:
        assert report.request["resolved_backend"] == expectation["resolved_backend"]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_finding_is_one_sentence_with_a_fix(name: str) -> None:
    for settings in (
        CheckSettings(),
        CheckSettings(for_build=True, backend="tensorrt", precision="fp8"),
        CheckSettings(for_build=True, backend="onnxruntime", precision="bf16"),
        CheckSettings(for_build=True, backend="tensorrt-rtx", precision="int8"),
    ):
        for finding in run_checks(settings, fixture_probe(name)).findings:
            assert finding.severity in ("error", "warning", "info")
            assert finding.message.endswith(".") and finding.fix.endswith("."), finding
            assert finding.message.count(". ") == 0, finding.message
            assert finding.fix.count(". ") == 0, finding.fix
