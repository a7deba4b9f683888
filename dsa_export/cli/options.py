"""Shared click parameter types and helpers for the subcommands.

Conventions every command follows: ``--json`` prints the command's report as JSON on stdout (and
nothing else there), ``--json-out FILE`` writes the same JSON to a file next to the usual output;
every output path is checked before any work (:func:`check_outputs`); malformed option values are
usage errors (exit 2), raised by the parameter types below while the command line is parsed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click


class IntList(click.ParamType):
    """A comma-separated list of positive integers, e.g. ``16,64,256``."""

    name = "N,N,..."

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            items = tuple(int(v) for v in str(value).split(",") if v.strip())
        except ValueError:
            self.fail(f"'{value}' is not a comma-separated list of integers.", param, ctx)
        if not items or min(items) < 1:
            self.fail(f"'{value}' must list integers >= 1.", param, ctx)
        return items


INT_LIST = IntList()


class DimSizes(click.ParamType):
    """``name=size,...`` with sizes >= 1, e.g. ``batch=2,sequence=64``."""

    name = "DIM=N,..."

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        dims: dict[str, int] = {}
        for item in str(value).split(","):
            if not item.strip():
                continue
            name, sep, size = item.partition("=")
            name = name.strip()
            if not sep or not name or not size.strip().isdigit() or int(size) < 1:
                self.fail(f"takes name=size pairs such as batch=2,sequence=64 (sizes >= 1); got {value!r}.", param, ctx)
            if name in dims:
                self.fail(f"names {name} twice ({value!r}).", param, ctx)
            dims[name] = int(size)
        return dims


DIM_SIZES = DimSizes()


class LayerSpan(click.ParamType):
    """``A:B`` (either side may be empty): decoder layers A..B-1. The range against the model's
    layer count is checked once the model is read."""

    name = "A:B"

    def convert(self, value, param, ctx):
        text = str(value).strip()
        match = re.fullmatch(r"(\d*):(\d*)", text)
        if match is None:
            self.fail(f"'{value}' is not A:B (e.g. 0:2).", param, ctx)
        a, b = match.groups()
        if a and b and int(a) >= int(b):
            self.fail(f"'{value}' is empty: A must be smaller than B (e.g. {b}:{a} or {a}:{int(a) + 1}).", param, ctx)
        return text


LAYER_SPAN = LayerSpan()


class RtxTarget(click.ParamType):
    """A TensorRT-RTX compute capability name, ``SM89`` (case-insensitive)."""

    name = "SMxy"

    def convert(self, value, param, ctx):
        text = str(value).strip().upper()
        if not re.fullmatch(r"SM\d{2,3}", text):
            self.fail(f"'{value}' is not a compute capability name such as SM89 or SM120.", param, ctx)
        return text


RTX_TARGET = RtxTarget()


def json_options(function):
    """``--json`` (report on stdout) and ``--json-out FILE`` (report in a file), for every command."""
    function = click.option("--json-out", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
                            help="Also write the report as JSON to this file (atomically).")(function)
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the report as JSON on stdout (nothing else goes there).")(function)


def check_outputs(*outputs: tuple[Path | None, str], inputs: tuple[Path | None, ...] = ()) -> None:
    """Refuse, before any work, output files that cannot be written, that repeat, or that are an input."""
    from dsa_export.errors import DSAUsageError
    from dsa_export.fileio import check_output_path

    seen: dict[Path, str] = {}
    for path in inputs:
        if path is not None:
            seen[Path(path).resolve()] = "an input"
    for path, option in outputs:
        if path is None:
            continue
        key = Path(path).resolve()
        if key in seen:
            raise DSAUsageError(f"{option} '{path}' is also {seen[key]}; choose another path.")
        seen[key] = f"the {option} file"
        check_output_path(path, option)


def emit_report(report: dict[str, Any] | str, as_json: bool, json_out: Path | None) -> None:
    """Print the JSON report (``--json``) and/or write it (``--json-out``)."""
    from dsa_export.fileio import atomic_output

    text = report if isinstance(report, str) else json.dumps(report, indent=2, sort_keys=True, default=str)
    if as_json:
        click.echo(text)
    if json_out is not None:
        with atomic_output(json_out) as tmp:
            tmp.write_text(text + "\n", encoding="utf-8")


def say(message: str, as_json: bool) -> None:
    """A human line: on stdout, or on stderr when stdout carries the JSON report."""
    click.echo(message, err=as_json)
