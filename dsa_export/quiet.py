"""What third-party libraries may print: nothing, unless the user asked for ``--debug``.

transformers draws "Loading weights" / "Writing model shards" bars, torch.export prints graphs and
fake-tensor warnings to stderr when a trace fails, ONNX Runtime logs red lines for errors it also
raises. Our own messages say what matters in one sentence, so these are hidden by default:
:func:`configure` sets the libraries' switches before they are imported (environment variables
they read at import), and :func:`third_party_output` catches what they print during one call.
``--debug`` shows all of it. Imports nothing heavy.
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


def configure() -> None:
    """Silence third-party progress bars and logs for this process, unless ``--debug``."""
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
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield sink
    finally:
        sys.stdout, sys.stderr = real_out, real_err
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


__all__ = ["configure", "debug", "ort_severity", "quiet_onnxruntime", "set_debug", "third_party_output"]
