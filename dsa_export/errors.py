"""Exception types that separate a user's mistake from a bug in dsa-export, and the one mapping
from library exceptions that a user's input causes to user errors.

A :class:`DSAUserError` is something the user can fix (a missing file, a bad shape, an
unsupported option); the CLI prints its one-sentence message and exits 1 without a traceback.
:func:`as_user_error` is the single place that decides which exceptions raised by the operating
system, torch or ONNX Runtime stand for such a mistake (an unwritable output path, a full disk,
inputs of the wrong type, token ids outside the vocabulary, shapes that do not fit in memory) and
words the fix; the CLI applies it to whatever a command raises, and code that knows better context
(:func:`dsa_export.fileio.atomic_output`, the runtimes) applies it earlier with that context.
Anything else that escapes is a bug and is reported as one.
"""

from __future__ import annotations

import contextlib
import errno
import re
from collections.abc import Iterator


class DSAUserError(Exception):
    """Something the user can fix. The message says what is wrong and what to do."""


class DSAUsageError(DSAUserError):
    """The command line itself is wrong (exit code 2)."""


class MissingDependencyError(DSAUserError):
    """An optional package needed for this feature is not installed."""

    def __init__(self, package: str, feature: str, install: str | None = None):
        hint = install or f"pip install {package}"
        super().__init__(f"{feature} needs the '{package}' package, which is not installed; run `{hint}`.")
        self.package = package


def require(module: str, feature: str, install: str | None = None):
    """Import ``module`` or raise a :class:`MissingDependencyError` naming the install command."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(module.split(".")[0], feature, install) from exc


# ---------------------------------------------------------------------------------------------
# Library exceptions caused by the user's input

#: errno -> what to do. These are states of the user's file system or paths, never bugs of ours.
#: ENOENT is not here: a file of ours that is missing is a bug, and inputs are checked by name.
FILESYSTEM_FIXES = {
    errno.EACCES: "choose a path you may write to",
    errno.EPERM: "choose a path you may write to",
    errno.EROFS: "that file system is read-only; choose another path",
    errno.ENOSPC: "the disk is full; free some space or choose a path on another disk",
    errno.EDQUOT: "the disk quota is exhausted; free some space or choose another path",
    errno.EFBIG: "the file system cannot hold a file this large; choose a path on another disk",
    errno.ENAMETOOLONG: "use a shorter file name",
    errno.EISDIR: "it is a folder; pass a file",
    errno.ENOTDIR: "a part of that path is a file, not a folder; choose another path",
    errno.ELOOP: "the path loops through symbolic links; choose another path",
    errno.EMFILE: "too many files are open; raise the limit (ulimit -n) and run again",
    errno.ENFILE: "too many files are open on this machine; close some and run again",
}

_MEMORY_PATTERNS = (
    "can't allocate memory", "cannot allocate memory", "failed to allocate memory", "bad_alloc",
    "bad allocation", "out of memory",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def one_sentence(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text`` without terminal colours, cut to ``limit`` characters."""
    for line in _ANSI.sub("", str(text)).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception ``exc`` was raised from (``raise ... from``)."""
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


def _is_onnxruntime(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("onnxruntime")


def as_user_error(exc: BaseException, context: str | None = None) -> DSAUserError | None:
    """The user error that ``exc`` stands for, or None when it is (probably) a bug.

    ``context`` says what was being done with the user's input ("writing 'out.onnx'", "running
    the model on the given inputs"); it starts the sentence when given.
    """
    if isinstance(exc, DSAUserError):
        return exc
    lead = f"{context}: " if context else ""
    if isinstance(exc, OSError) and exc.errno in FILESYSTEM_FIXES:
        where = f"'{exc.filename}'" if exc.filename else "a file"
        reason = exc.strerror or errno.errorcode.get(exc.errno or 0, "error")
        return DSAUserError(f"{lead}cannot use {where} ({reason}); {FILESYSTEM_FIXES[exc.errno]}.")
    full = _ANSI.sub("", str(exc))
    text = one_sentence(full)
    lowered = full.lower()
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or (
        isinstance(exc, Exception) and any(p in lowered for p in _MEMORY_PATTERNS)
    ):
        detail = _allocation_detail(full)
        return DSAUserError(f"{lead}ran out of memory{detail}; use smaller shapes (batch, sequence lengths) or a "
                            "machine with more memory.")
    if _is_onnxruntime(exc):
        if "unexpected input data type" in lowered:
            found = re.search(r"actual: \((tensor\(\w+\))\)\s*,\s*expected: \((tensor\(\w+\))\)", lowered)
            types = f" ({found.group(1)} given, {found.group(2)} expected)" if found else ""
            return DSAUserError(f"{lead}an input has the wrong type{types}; pass inputs of the types the model "
                                "declares (`dsa-export inspect FILE` lists them).")
        if "out of data bounds" in lowered or "out of bounds" in lowered:
            found = re.search(r"idx=(-?\d+) must be within the inclusive range \[(-?\d+),(-?\d+)\]", lowered)
            detail = f" (index {found.group(1)}, allowed 0..{found.group(3)})" if found else ""
            return DSAUserError(f"{lead}an input holds an index outside the table it indexes{detail}; token ids "
                                "must be below the model's vocabulary size.")
        if type(exc).__name__ == "InvalidArgument" or "invalid dimensions" in lowered:
            return DSAUserError(f"{lead}ONNX Runtime refused the inputs ({_strip_status(text)}); pass inputs of the "
                                "names, types and shapes the model declares.")
    if isinstance(exc, IndexError) and "index out of range in self" in lowered:
        return DSAUserError(f"{lead}a token id is outside the model's vocabulary; pass ids below the vocabulary size.")
    return None


_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.+)')


def trace_failure(exc: BaseException, what: str) -> DSAUserError:
    """One sentence for a torch.export / torch.onnx failure of ``what``: the innermost error (not the
    exporter's "step 1/3" banner, not fake-tensor logs) and the user's line that raised it."""
    cause = root_cause(exc)
    text = _ANSI.sub("", str(cause))
    first = one_sentence(text, 240) or type(cause).__name__
    where = ""
    frames = [m for m in _USER_FRAME.finditer(text) if "site-packages" not in m.group(1)]
    if frames:
        file, line, function, code = frames[-1].groups()
        where = f" at {file}:{line} in {function} (`{code.strip()[:80]}`)"
    hint = ""
    if "data-dependent" in text or "GuardOnDataDependent" in type(cause).__name__:
        hint = " (control flow or shapes that depend on tensor values cannot be traced; use torch.cond or make them static)"
    return DSAUserError(f"torch.onnx could not export {what}: {type(cause).__name__}: {first.rstrip('.')}{where}{hint}; "
                        "run with --debug for the exporter's full message.")


@contextlib.contextmanager
def trace_errors(what: str) -> Iterator[None]:
    """Around an export: a failure of torch's exporter becomes :func:`trace_failure`'s sentence."""
    try:
        yield
    except DSAUserError as exc:
        cause = exc.__cause__
        if cause is not None and type(cause).__module__.startswith("torch"):
            raise trace_failure(cause, what) from cause
        raise


def _allocation_detail(text: str) -> str:
    found = re.search(r"(?:buffer of size|allocate memory for requested buffer of size|alloc(?:ate)?)\D{0,40}?"
                      r"(\d{6,})", text, flags=re.IGNORECASE)
    if found:
        return f" (one buffer of {int(found.group(1)) / 2**30:.1f} GiB was asked for)"
    return ""


def _strip_status(text: str) -> str:
    """ONNX Runtime's message without its ``[ONNXRuntimeError] : 2 : INVALID_ARGUMENT :`` prefix."""
    return re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", text)
