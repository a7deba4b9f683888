"""The kernels' C ABI on the CPU: dsa_export.plugins.kernels.KernelLibrary over the emulation build.

Every tensor the kernels see is staged into a buffer of the emulator's allocator (an inaccessible
page right after its end, or right before its start, and pattern bytes on the other side); outputs
and workspaces start as NaN bytes, as uninitialized device memory would. After every call the
emulator's fault record and every buffer's guard bytes are checked, and a fault fails the call
with the thread and address that caused it, even when the C ABI itself returned success.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from dsa_export.plugins.kernels import KernelError, KernelLibrary

from .build import Patch, build_library

#: Scheduling orders (emu_runtime.cpp): thread order, reverse thread and CTA order, seeded random.
ORDERS = {"lockstep": 0, "reverse": 1, "scrambled": 2}
#: When cp.async lands: as it is issued, or at the wait that retires its group (NaN until then).
COPIES = {"issue": 0, "wait": 1}
#: Emulated devices (index = emu device ordinal): compute capability and opt-in shared memory.
DEVICES = {"sm90": 0, "sm89": 1, "sm80": 2, "sm75": 3}


@dataclass(frozen=True)
class Schedule:
    """One way of running a launch: the order threads and CTAs run in and when async copies land."""

    order: str = "lockstep"
    copies: str = "wait"
    resident_ctas: int = 2
    yield_probability: float = 0.25

    @property
    def name(self) -> str:
        return f"{self.order}-copies-at-{self.copies}"


#: The schedules every case runs under. Lock-step with late copies catches missing barriers and
#: early reads of in-flight copies; reverse order catches barriers missing in the other direction;
#: scrambled orders with copies landing at issue catch the races through shared and global memory
#: (atomics, preemption at loads) that a fixed order hides.
DEFAULT_SCHEDULES = (
    Schedule("lockstep", "wait"),
    Schedule("reverse", "wait"),
    Schedule("scrambled", "issue", resident_ctas=3),
)


class EmulationFault(KernelError):
    """The emulator caught a kernel doing something a GPU would not allow (or would race on)."""


class EmulatedKernels(KernelLibrary):
    """KernelLibrary whose kernels run on the CPU emulator; tensors are CPU torch tensors."""

    def __init__(self, patches: tuple[Patch, ...] = ()):
        path = build_library(patches)
        super().__init__(path)
        lib = self._lib
        lib.emu_configure.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_double]
        lib.emu_configure.restype = ctypes.c_int
        lib.emu_set_device.argtypes = [ctypes.c_int]
        lib.emu_set_device.restype = ctypes.c_int
        lib.emu_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int]
        lib.emu_malloc.restype = ctypes.c_void_p
        lib.emu_free.argtypes = [ctypes.c_void_p]
        lib.emu_buffer_id.argtypes = [ctypes.c_void_p]
        lib.emu_fault.restype = ctypes.c_char_p
        lib.emu_check_guards.restype = ctypes.c_int
        lib.emu_stats.argtypes = [ctypes.POINTER(ctypes.c_ulonglong)]
        self._buffers: list[int] = []
        self._guard_front = 0
        self.schedule = Schedule()
        self.device = "sm90"
        self.configure(self.schedule, seed=1)

    # -- configuration --------------------------------------------------------------------------
    def configure(self, schedule: Schedule, *, seed: int, device: str = "sm90") -> None:
        """Set the schedule, the seed of its random choices and the emulated device for the next calls."""
        if self._lib.emu_configure(ORDERS[schedule.order], COPIES[schedule.copies], seed & (2**64 - 1),
                                   schedule.resident_ctas, schedule.yield_probability) != 0:
            raise ValueError(f"bad schedule {schedule}")
        if self._lib.emu_set_device(DEVICES[device]) != 0:
            raise ValueError(f"unknown device {device}")
        # Which side of the buffers touches the inaccessible page: alternates with the seed and the
        # order, so the lock-step and reverse runs of a case guard opposite ends.
        self._guard_front = (seed + ORDERS[schedule.order]) & 1
        self.schedule = schedule
        self.device = device

    def reset(self) -> None:
        """Free every staged buffer and clear the fault record (tensors of earlier calls die with it)."""
        for ptr in self._buffers:
            self._lib.emu_free(ptr)
        self._buffers.clear()
        self._lib.emu_clear_fault()

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_ulonglong * 7)()
        self._lib.emu_stats(out)
        return dict(zip(("launches", "ctas", "threads", "switches", "collectives", "copies", "mma"), map(int, out)))

    # -- KernelLibrary hooks --------------------------------------------------------------------
    @staticmethod
    def _stream(device: Any) -> None:
        return None

    def _alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)  # data_ptr() 0: the NULL TensorRT passes for empty tensors
        ptr = self._lib.emu_malloc(nbytes, self._guard_front)
        if not ptr:
            raise MemoryError(f"the emulator could not allocate {nbytes} bytes")
        self._buffers.append(ptr)
        raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(shape)

    def _is_staged(self, t: torch.Tensor) -> bool:
        return t.is_contiguous() and t.numel() > 0 and self._lib.emu_buffer_id(t.data_ptr()) >= 0

    def _staged(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu":
            raise ValueError("the emulated kernels take CPU tensors")
        if t.numel() == 0 or self._is_staged(t):
            return t.contiguous()
        staged = self._alloc(tuple(t.shape), t.dtype)
        staged.copy_(t)
        return staged

    def _empty(self, shape: tuple[int, ...], dtype: Any, like: torch.Tensor) -> torch.Tensor:
        return self._alloc(tuple(shape), dtype)

    def _check(self, status: int, what: str) -> None:
        self._lib.emu_check_guards()
        fault = (self._lib.emu_fault() or b"").decode(errors="replace")
        if fault:
            self._lib.emu_clear_fault()
            raise EmulationFault(f"{what}: {fault}")
        super()._check(status, what)


def run_case(kl: EmulatedKernels, case, schedule: Schedule, seed: int = 0) -> None:
    """Run one case under one schedule; its inputs and the schedule's random choices follow from the seed."""
    if case.schedules is not None and schedule.name not in case.schedules:
        return
    case_seed = case.seed(seed)
    kl.configure(schedule, seed=case_seed, device=case.device)
    try:
        case.run(kl, case_seed)
    finally:
        kl.reset()
