"""Interrupts always stop: SIGINT or SIGTERM ends any command within seconds, with exit code 130
and nothing of its output left behind.

Python runs signal handlers in the main thread only, between two bytecodes: a command that sits in
native code (a TensorRT-RTX engine build, one long ONNX Runtime or torch call) sees Ctrl-C only when
that call returns, and an exception raised inside a library's Python callback (the TensorRT-RTX
logger) is swallowed by the library. :func:`guard` therefore runs the command in the main thread
as usual (SIGTERM then raises KeyboardInterrupt like SIGINT, and ``finally`` blocks remove
temporary files as on any failure) and adds a watchdog thread that is woken by the signal itself
(``signal.set_wakeup_fd``, written by the C-level handler even while the main thread is in native
code). The watchdog

1. sets :func:`cancelled`, which native work polls where it can (the TensorRT-RTX progress
   monitor returns False and the builder stops), and calls the hooks registered with
   :func:`on_cancel` (ONNX Runtime's ``RunOptions.terminate``);
2. if the command has not ended after :data:`GRACE_S` (its thread is still inside native code),
   removes every temporary path registered with :func:`temporary` or :func:`temporaries_of` and
   ends the process with exit code 130 (``os._exit``: the native call cannot be unwound). A second
   signal ends it at once.

No exception is ever injected into another thread: raising inside frames that native code called
can abort the process (measured: torch.export, "terminate called without an active exception").

:func:`deferred` marks the few statements that move finished output into place: an interrupt that
arrives during them is raised right after them, so callers can undo a half-done install and the
output is the old one or the new one, never a mix. Temporary names carry the process id
(:func:`tagged_name`), so a later run can tell leftovers of a killed process (SIGKILL cannot be
caught) from work in progress (:func:`stale_siblings`).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: Seconds a command gets to unwind after an interrupt before the process is ended from outside.
GRACE_S = 2.0
#: Seconds an interrupt waits at most for a :func:`deferred` block (renames) to finish.
DEFERRED_WAIT_S = 10.0
EXIT_INTERRUPTED = 130

_cancel = threading.Event()
_lock = threading.RLock()
_temporaries: dict[int, Path] = {}
_sibling_targets: dict[int, Path] = {}
_hooks: dict[int, Callable[[], None]] = {}
_state: dict[str, Any] = {"deferring": 0, "pending": False, "flag_only": 0, "own_grace": None}
_counter = iter(range(1, 1 << 62))
_STARTED = time.time()


def cancelled() -> bool:
    """Whether an interrupt asked the running command to stop (poll this in native callbacks)."""
    return _cancel.is_set()


def raise_if_cancelled() -> None:
    if _cancel.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def temporary(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Register ``path`` (a file or folder being written) for removal if the process is ended."""
    key = next(_counter)
    with _lock:
        _temporaries[key] = Path(path)
    try:
        yield Path(path)
    finally:
        with _lock:
            _temporaries.pop(key, None)


@contextlib.contextmanager
def temporaries_of(final: str | os.PathLike[str]) -> Iterator[None]:
    """Register the hidden siblings ``.<name>.*`` that libraries create next to ``final`` while
    writing it (e.g. the exporter's staging folder): if the process is ended, those created since
    it started are removed."""
    key = next(_counter)
    with _lock:
        _sibling_targets[key] = Path(final)
    try:
        yield
    finally:
        with _lock:
            _sibling_targets.pop(key, None)


@contextlib.contextmanager
def on_cancel(hook: Callable[[], None]) -> Iterator[None]:
    """Call ``hook`` (from the watchdog thread, at once) when an interrupt arrives during the block:
    for native calls that can be told to stop from another thread."""
    key = next(_counter)
    with _lock:
        _hooks[key] = hook
    try:
        if _cancel.is_set():
            hook()
        yield
    finally:
        with _lock:
            _hooks.pop(key, None)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Interrupts wait until the block has finished and are raised at its end.

    An interrupt that arrived before the block is raised on entry, even if its KeyboardInterrupt
    never reached the command (a library swallowed it: a finalizer, a callback): the block is
    where finished output is moved into place, so a command that went on after a swallowed
    interrupt still installs nothing and exits 130."""
    raise_if_cancelled()
    with _lock:
        _state["deferring"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["deferring"] -= 1
            pending = _state["deferring"] == 0 and _state["pending"]
            if pending:
                _state["pending"] = False
        if pending:
            raise KeyboardInterrupt


@contextlib.contextmanager
def handled_by_command(grace: float) -> Iterator[None]:
    """For a command that stops by itself on SIGINT/SIGTERM (``serve`` drains its requests, then
    returns): while inside, the command's own handlers get the signal, a first signal neither sets
    :func:`cancelled` nor runs the cancel hooks (the requests in flight go on), and the watchdog
    ends the process only if the command has not returned ``grace`` seconds later. A second
    signal still ends it at once."""
    with _lock:
        _state["own_grace"] = grace
    try:
        yield
    finally:
        with _lock:
            _state["own_grace"] = None


@contextlib.contextmanager
def native_call() -> Iterator[None]:
    """Around a long native call whose callbacks poll :func:`cancelled`: SIGINT/SIGTERM only set the
    flag during the call (an exception raised inside a callback would be swallowed by the
    library), and KeyboardInterrupt is raised once the call has returned."""
    raise_if_cancelled()
    on_main = threading.current_thread() is threading.main_thread()
    previous = {}
    if on_main and not _installed():
        def flag(signum, frame) -> None:
            _cancel.set()

        previous = {sig: signal.signal(sig, flag) for sig in (signal.SIGINT, signal.SIGTERM)}
    with _lock:
        _state["flag_only"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["flag_only"] -= 1
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if _cancel.is_set():
        if previous:  # outside the CLI's guard: the next call starts afresh
            _cancel.clear()
        raise KeyboardInterrupt


def tagged_name(prefix: str) -> str:
    """``prefix`` plus this process's id, for temporary names that :func:`stale_siblings` reads."""
    return f"{prefix}{os.getpid()}-"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_siblings(parent: Path, prefixes: tuple[str, ...]) -> tuple[list[Path], list[tuple[Path, int]]]:
    """Hidden temporaries in ``parent`` named by :func:`tagged_name` with one of ``prefixes``:
    (those whose process is gone, those whose process still runs with its pid)."""
    stale, busy = [], []
    if not parent.is_dir():
        return stale, busy
    for entry in parent.iterdir():
        if not entry.name.startswith(prefixes):
            continue
        tail = entry.name
        for prefix in prefixes:
            if tail.startswith(prefix):
                tail = tail[len(prefix):]
                break
        match = re.match(r"(\d+)-", tail)
        if match is None:
            continue
        pid = int(match.group(1))
        (busy.append((entry, pid)) if _alive(pid) else stale.append(entry))
    return stale, busy


def remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()


def _remove_temporaries() -> None:
    with _lock:
        paths = list(_temporaries.values())
        targets = list(_sibling_targets.values())
    for path in reversed(paths):
        remove(path)
    for final in targets:
        with contextlib.suppress(OSError):
            for entry in final.parent.iterdir():
                if entry.name.startswith(f".{final.name}.") and entry.lstat().st_ctime >= _STARTED - 1:
                    remove(entry)


def _installed() -> bool:
    return signal.getsignal(signal.SIGTERM) is _on_signal


def _on_signal(signum, frame) -> None:
    """SIGINT/SIGTERM in the main thread: KeyboardInterrupt, unless a native call only wants the
    flag or a :func:`deferred` block is moving output into place (then it is raised after it)."""
    _cancel.set()
    with _lock:
        if _state["flag_only"]:
            return
        if _state["deferring"]:
            _state["pending"] = True
            return
    raise KeyboardInterrupt


def _watch(read_fd: int, done: threading.Event, on_abort: Callable[[], None] | None) -> None:
    signals = 0
    deadline = None
    while not done.is_set():
        timeout = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
        ready, _, _ = select.select([read_fd], [], [], timeout)
        if done.is_set():
            return
        if ready:
            try:
                got = os.read(read_fd, 64)
            except OSError:
                got = b""
            wanted = {signal.SIGINT, signal.SIGTERM}
            count = sum(1 for b in got if b in wanted)
            if count:
                signals += count
                with _lock:
                    own = _state["own_grace"]
                    hooks = list(_hooks.values()) if own is None else []
                if own is None:
                    _cancel.set()
                for hook in hooks:
                    with contextlib.suppress(Exception):
                        hook()
                if deadline is None:
                    deadline = time.monotonic() + (GRACE_S if own is None else own)
        if deadline is None:
            continue
        with _lock:
            deferring = _state["deferring"]
        now = time.monotonic()
        if signals >= 2 or (now >= deadline and (not deferring or now >= deadline + DEFERRED_WAIT_S)):
            if done.is_set():
                return
            _abort(on_abort)


def _abort(on_abort: Callable[[], None] | None) -> None:
    _remove_temporaries()
    if on_abort is not None:
        with contextlib.suppress(Exception):
            on_abort()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_INTERRUPTED)


def guard(fn: Callable[[], Any], *, on_abort: Callable[[], None] | None = None) -> Any:
    """Run ``fn`` (in this, the main thread) with SIGINT and SIGTERM raising KeyboardInterrupt, and
    a watchdog that ends the process with exit code 130 when ``fn`` has not stopped
    :data:`GRACE_S` seconds after a signal. ``on_abort`` runs just before that (e.g. to print the
    message). From another thread, ``fn`` simply runs."""
    if threading.current_thread() is not threading.main_thread():
        return fn()
    _cancel.clear()
    _state["pending"] = False
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    os.set_blocking(read_fd, False)
    done = threading.Event()
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watchdog = threading.Thread(target=_watch, args=(read_fd, done, on_abort), name="dsa-export-watchdog",
                                daemon=True)
    watchdog.start()
    try:
        return fn()
    finally:
        done.set()
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        watchdog.join(1.0)
        for fd in (read_fd, write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


__all__ = [
    "EXIT_INTERRUPTED",
    "GRACE_S",
    "cancelled",
    "deferred",
    "native_call",
    "on_cancel",
    "raise_if_cancelled",
    "guard",
    "handled_by_command",
    "remove",
    "stale_siblings",
    "tagged_name",
    "temporaries_of",
    "temporary",
]
