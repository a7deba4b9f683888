"""The harness can fail: four injected bugs of different kinds (a missing barrier, an index read
one row past the keys, a pipeline wait one stage short, the element tail of a cache row left
unwritten) each fail the cases of their kernel. The
whole list runs with ``python -m tests.emulation --mutations`` (a few minutes)."""

from __future__ import annotations

import pytest

from .build import BuildError
from .cases import SMALL_CASES
from .harness import DEFAULT_SCHEDULES, EmulatedKernels, EmulationFault, run_case
from .mutations import MUTANTS_BY_NAME

CI_MUTANTS = ("sa-missing-barrier-after-wait", "sa-index-bound-off-by-one", "moe-pipeline-wait-one-stage-short",
              "pcw-tail-skipped")


@pytest.mark.parametrize("name", CI_MUTANTS)
def test_injected_bug_fails_the_harness(name):
    mutant = MUTANTS_BY_NAME[name]
    try:
        kl = EmulatedKernels(mutant.patches)
    except BuildError as exc:
        if "not found" in str(exc) or "no host C++ compiler" in str(exc):
            pytest.skip(str(exc))
        raise
    cases = [c for c in SMALL_CASES if c.kernel == mutant.kernel]
    assert cases, f"no case exercises the {mutant.kernel} kernels"
    failures = []
    for case in cases:
        for schedule in DEFAULT_SCHEDULES:
            try:
                run_case(kl, case, schedule)
            except (AssertionError, EmulationFault) as exc:
                failures.append(f"{case.name} / {schedule.name}: {exc}")
                break
        if failures:
            break
    assert failures, f"the injected bug {name!r} ({mutant.why}) passed every {mutant.kernel} case"
