"""Peak memory of one call on the host: the growth of the process's resident set.

torch's CPU allocator keeps no statistics and tracemalloc does not see its allocations, and ONNX
Runtime exposes no arena statistics to Python, so one method serves both: before the call, free
what the allocator caches (``gc.collect`` and glibc ``malloc_trim(0)``), reset the kernel's
high-water mark of the resident set (write ``5`` to ``/proc/self/clear_refs``) and read the
current resident set; after the call, read the high-water mark (``VmHWM``). The difference is the
peak extra memory the call touched: its activations and scratch, not the weights or inputs that
existed before it. ONNX Runtime sessions used for this have their memory arena disabled, so that
what a call frees goes back to the system and the next call's peak is its own.

This needs Linux (procfs with ``clear_refs``); elsewhere :func:`peak_rss_supported` is false and
the report carries no memory numbers rather than wrong ones.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from typing import Callable, TypeVar

T = TypeVar("T")

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _status_kib(key: str) -> int:
    with open(_STATUS) as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} missing from {_STATUS}")


def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


_LIBC = _libc()


def release_cached_memory() -> None:
    """Return freed heap memory to the system so that it does not hide the next call's peak."""
    gc.collect()
    trim = getattr(_LIBC, "malloc_trim", None) if _LIBC is not None else None
    if trim is not None:
        trim(0)


def peak_rss_supported() -> bool:
    """Whether the high-water mark can be reset and read (Linux procfs)."""
    try:
        with open(_CLEAR_REFS, "w") as handle:
            handle.write("5")
        _status_kib("VmHWM")
        return True
    except (OSError, RuntimeError, ValueError):
        return False


def measure_peak_rss(fn: Callable[[], T]) -> tuple[T, int]:
    """Call ``fn`` and return its result and the peak growth of the resident set in bytes."""
    release_cached_memory()
    with open(_CLEAR_REFS, "w") as handle:
        handle.write("5")
    before = _status_kib("VmRSS")
    result = fn()
    peak = _status_kib("VmHWM")
    return result, max(0, peak - before) * 1024


def available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo (what can be allocated without swapping), or None."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
