"""What third-party libraries may print: nothing, unless the user asked for ``--debug``.

transformers draws "Loading weights" / "Writing model shards" bars, torch.export prints graphs and
fake-tensor warnings to stderr when a trace fails, ONNX Runtime logs red lines for errors it also
raises. Our own messages say what matters in one sentence, so these are hidden by default:
:func:`configure` sets the libraries' switches before they are imported (environment variables
they read at import), and :func:`third_party_output` catches what they print during one call.
``--debug`` shows all of it. Imports nothing heavy.

Progress bars (tqdm: ours, transformers', huggingface_hub's) are drawn only on a terminal: when
stderr is a file or a pipe (a CI log), :func:`configure` turns them off, ``--debug`` or not, and
:func:`progress_bars` says so to our own bars. Polygraphy's logger prints to stdout; while it
compares, :func:`polygraphy_to_stderr` sends its lines to stderr, where logs go.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from collections.abc import Iterator

_DEBUG = False

#: Environment switches read by the libraries when they are imported (set only if unset).
QUIET_ENVIRONMENT = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' tqdm bars follow huggingface_hub's switch
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
#: Loggers of libraries whose warnings repeat what our errors say.
NOISY_LOGGERS = ("torch", "onnxscript", "onnx_ir", "transformers", "polygraphy", "onnxruntime")
#: ONNX Runtime log severities: 3 shows errors, 4 only fatal ones (we raise the errors ourselves).
ORT_QUIET_SEVERITY = 4
ORT_DEBUG_SEVERITY = 2


def set_debug(enabled: bool) -> None:
    """Record whether ``--debug`` was given (the CLI calls this once, before any command runs)."""
    global _DEBUG
    _DEBUG = bool(enabled)


def debug() -> bool:
    return _DEBUG


#: Environment switches that turn every tqdm bar off (tqdm >= 4.66 reads ``TQDM_*`` defaults).
NO_PROGRESS_BARS_ENVIRONMENT = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def progress_bars() -> bool:
    """Whether progress bars may be drawn: stderr is a terminal and no switch turned them off."""
    return _stderr_is_terminal() and os.environ.get("TQDM_DISABLE", "").lower() not in ("1", "true", "yes")


def configure() -> None:
    """Silence third-party progress bars and logs for this process, unless ``--debug``; no progress
    bars at all when stderr is not a terminal (they would fill a log file with carriage returns)."""
    if not _stderr_is_terminal():
        for key, value in NO_PROGRESS_BARS_ENVIRONMENT.items():
            os.environ.setdefault(key, value)
    if _DEBUG:
        return
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def ort_severity() -> int:
    """The ``log_severity_level`` ONNX Runtime sessions get."""
    return ORT_DEBUG_SEVERITY if _DEBUG else ORT_QUIET_SEVERITY


def quiet_onnxruntime(ort) -> None:
    """Lower ONNX Runtime's process-wide logger (lines it prints outside any session's options)."""
    with contextlib.suppress(Exception):
        ort.set_default_logger_severity(ort_severity())


#: The stderr in effect outside each :func:`third_party_output` block, outermost first.
_OUTSIDE: list = []


def user_stderr():
    """Where our own progress lines go: stderr as it is outside any :func:`third_party_output`
    block (inside one, ``sys.stderr`` is the sink that catches what libraries print)."""
    return _OUTSIDE[0] if _OUTSIDE else sys.stderr


@contextlib.contextmanager
def third_party_output() -> Iterator[io.StringIO]:
    """Catch what libraries print to stdout/stderr and log below ERROR during the block.

    The caught text is yielded (callers may add it to an error) and dropped afterwards; with
    ``--debug`` nothing is caught.
    """
    sink = io.StringIO()
    if _DEBUG:
        yield sink
        return
    saved = {}
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split(".")[0] in NOISY_LOGGERS:
            saved[name] = logger.level
            logger.setLevel(logging.ERROR)
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        saved.setdefault(name, logger.level)
        logger.setLevel(logging.ERROR)
    real_out, real_err = sys.stdout, sys.stderr
    _OUTSIDE.append(real_err)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield sink
    finally:
        _OUTSIDE.pop()
        sys.stdout, sys.stderr = real_out, real_err
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def polygraphy_to_stderr() -> Iterator[None]:
    """Polygraphy's G_LOGGER prints its ``[W]``/``[E]`` lines to ``sys.stdout``; during the block they
    go to stderr, so that stdout carries only the command's report (and nothing but JSON with
    ``--json``)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


__all__ = ["configure", "debug", "ort_severity", "polygraphy_to_stderr", "progress_bars", "quiet_onnxruntime",
           "set_debug", "third_party_output", "user_stderr"]
