"""Every kernel of the C ABI, run on the CPU emulator against the float64 references, under each
schedule of DEFAULT_SCHEDULES (see harness.py). This is the GPU half of the project executed on
every CI run; speed is not measured here (tools/gpu_check.sh does that on a GPU).
"""

from __future__ import annotations

import pytest

from .build import BuildError
from .cases import SMALL_CASES
from .harness import DEFAULT_SCHEDULES, EmulatedKernels, run_case


@pytest.fixture(scope="module")
def emulated():
    try:
        return EmulatedKernels()
    except BuildError as exc:
        if "not found" in str(exc) or "no host C++ compiler" in str(exc):
            pytest.skip(str(exc))
        raise


PAIRS = [(c, s) for c in SMALL_CASES for s in DEFAULT_SCHEDULES if c.schedules is None or s.name in c.schedules]


@pytest.mark.parametrize("case,schedule", PAIRS, ids=[f"{c.name}-{s.name}" for c, s in PAIRS])
def test_kernel_case(emulated, case, schedule):
    run_case(emulated, case, schedule)
