"""Peak-RSS measurement sees a known allocation and not much more."""

from __future__ import annotations

import pytest
import torch

from dsa_export.bench import memory

pytestmark = pytest.mark.skipif(not memory.peak_rss_supported(), reason="needs Linux procfs with clear_refs")

MIB = 2**20


def test_a_touched_allocation_is_counted_and_freed_memory_is_not():
    def allocate():
        big = torch.ones(256 * MIB // 4)  # 256 MiB, written
        return float(big[::4096].sum())

    _, peak = memory.measure_peak_rss(allocate)
    assert 240 * MIB <= peak <= 320 * MIB
    # The tensor is gone: a call that allocates nothing shows (almost) no growth afterwards.
    _, idle = memory.measure_peak_rss(lambda: None)
    assert idle < 16 * MIB


def test_peak_is_the_maximum_not_the_sum():
    def twice():
        for _ in range(2):
            block = torch.ones(128 * MIB // 4)
            del block
            memory.release_cached_memory()

    _, peak = memory.measure_peak_rss(twice)
    assert 110 * MIB <= peak <= 200 * MIB
