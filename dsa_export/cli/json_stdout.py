"""``--json``: stdout holds one JSON document and nothing else, whether the command succeeds or fails.

While a command given ``--json`` runs, what Python writes to ``sys.stdout`` is held back and, when
the CLI runs as a program, file descriptor 1 points at stderr, so that native libraries and child
processes print there. When the command ends:

* success: the JSON document the command printed goes to stdout; any other text that reached
  stdout (a library's log line) goes to stderr;
* failure: the document with an ``"error"`` key (the same sentence the CLI prints on stderr) and
  ``"exit_code"``, or ``{"error": ..., "exit_code": ...}`` when the command printed none. The
  exit code is the one the command fails with anyway (1, 2 for bad usage, 130 when interrupted).

Commands keep printing their report with ``click.echo`` (:func:`dsa_export.cli.options.emit_report`);
nothing here is specific to one command.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from typing import Any

#: Commands whose ``--json`` may take a value: ``bench --json FILE`` is the older spelling of
#: ``--json-out FILE`` (then stdout carries the usual table).
_OPTIONAL_VALUE = {"bench"}
_DOCUMENT_START = re.compile(r"(?m)^[\[{]")


def requested(args: list[str]) -> bool:
    """Whether the command line asks for the JSON report on stdout (``--json`` before any ``--``)."""
    end = args.index("--") if "--" in args else len(args)
    words = args[:end]
    command = next((w for w in words if not w.startswith("-")), None)
    for i, word in enumerate(words):
        if word != "--json":
            continue
        if command in _OPTIONAL_VALUE:
            following = words[i + 1] if i + 1 < len(words) else None
            return following is None or following.startswith("-")
        return True
    return False


def split_document(text: str) -> tuple[Any, str | None, str]:
    """(the JSON document in ``text``, its text, everything else). A document starts at the start
    of a line with ``{`` or ``[``; text before or after it (a library's ``[W] ...`` line) is the
    rest. (None, None, text) when ``text`` holds no document."""
    stripped = text.strip()
    if not stripped:
        return None, None, text
    try:
        return json.loads(stripped), stripped, ""
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for match in _DOCUMENT_START.finditer(text):
        try:
            document, end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        after = text[end:]
        return document, text[match.start():end], text[:match.start()] + (after if after.strip() else "")
    return None, None, text


class _Held(io.StringIO):
    def isatty(self) -> bool:
        return False


class JsonStdout:
    """Hold back stdout while a ``--json`` command runs; :meth:`finish` writes the one document."""

    def __init__(self, standalone: bool):
        self._real = sys.stdout
        self._held = _Held()
        self._fd: int | None = None
        self._done = False
        with contextlib.suppress(Exception):
            self._real.flush()
        if standalone:
            try:
                self._fd = os.dup(1)
                os.dup2(2, 1)
            except OSError:
                self._fd = None
        sys.stdout = self._held

    def finish(self, error: str | None = None, exit_code: int = 0) -> None:
        """Write the document (with ``error`` when the command failed) to the real stdout."""
        if self._done:
            return
        self._done = True
        text = self._held.getvalue()
        if sys.stdout is self._held:
            sys.stdout = self._real
        if self._fd is not None:
            with contextlib.suppress(Exception):
                sys.__stdout__.flush()  # what native code or a child process left buffered goes to stderr
            with contextlib.suppress(OSError):
                os.dup2(self._fd, 1)
                os.close(self._fd)
        document, document_text, rest = split_document(text)
        if error is None and exit_code == 0:
            if document_text is None:
                out = text  # no report (e.g. --help): shown as printed
                rest = ""
            else:
                out = document_text + "\n"
        else:
            message = error or f"the command ended with exit status {exit_code}"
            if isinstance(document, dict):
                document = {**document, "error": message, "exit_code": exit_code}
            else:
                document = {"error": message, "exit_code": exit_code,
                            **({"output": document} if document is not None else {})}
            out = json.dumps(document, indent=2, default=str) + "\n"
        if rest.strip():
            with contextlib.suppress(Exception):
                sys.stderr.write(rest if rest.endswith("\n") else rest + "\n")
                sys.stderr.flush()
        with contextlib.suppress(Exception):
            self._real.write(out)
            self._real.flush()


__all__ = ["JsonStdout", "requested", "split_document"]
