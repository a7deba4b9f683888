"""Shared click parameter types and helpers for the subcommands.

Conventions every command follows: ``--json`` prints the command's report as JSON on stdout (and
nothing else there), ``--json-out FILE`` writes the same JSON to a file next to the usual output;
every output path is checked before any work (:func:`check_outputs`); malformed option values are
usage errors (exit 2), raised by the parameter types below while the command line is parsed.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import click

from dsa_export.stages.plan import DEFAULT_MAX_BATCH, DEFAULT_MAX_SEQ


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


class StageCount(click.ParamType):
    """``auto`` or a positive number of stages."""

    name = "auto|N"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == "auto":
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return "auto"
        if not text.isdigit() or int(text) < 1:
            self.fail(f"'{value}' is neither 'auto' nor a number of stages >= 1.", param, ctx)
        return int(text)


STAGE_COUNT = StageCount()


@dataclass(frozen=True)
class StagePlanOptions:
    """The stage-planning options of ``plan``, ``export --stages`` and ``build --stages``, declared
    once by :func:`stage_plan_options`. ``stages`` is ``auto``, a count, or None (no stages); build
    takes it as typed and parses it with :meth:`stage_count`."""

    stages: str | int | None = None
    gpu_memory: str | None = None
    gpus: int | None = None
    devices: str | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    max_seq: int = DEFAULT_MAX_SEQ

    def stage_count(self) -> str | int | None:
        """``stages`` as ``auto``, a count or None; a usage error (exit 2) for anything else."""
        if self.stages is None or self.stages == "auto" or isinstance(self.stages, int):
            return self.stages
        if not self.stages.isdigit() or int(self.stages) < 1:
            raise click.BadParameter(f"{self.stages!r} is neither auto nor a stage count.", param_hint="--stages")
        return int(self.stages)

    def device_list(self) -> list[int] | None:
        """``devices`` as GPU indices, or None; a usage error (exit 2) for anything else."""
        if self.devices is None:
            return None
        try:
            return [int(d) for d in self.devices.split(",")]
        except ValueError:
            raise click.BadParameter(f"{self.devices!r} is not a comma-separated list of GPU indices.",
                                     param_hint="--devices") from None


def stage_plan_options(*, stages_help: str, when: str | None = None, stages_default: str | None = None,
                       stages_type: click.ParamType = STAGE_COUNT, require_gpu_memory: bool = False,
                       gpus_help: str = "GPUs available; refuse plans needing more.", devices: bool = False,
                       min_seq: int = 1):
    """Declare ``--stages --gpu-memory --gpus [--devices] --max-batch --max-seq`` and hand the
    command one ``stage_plan: StagePlanOptions`` instead of their values.

    Defaults are the same in every command (``--max-batch`` 1 and ``--max-seq``
    :data:`DEFAULT_MAX_SEQ`, the defaults of :func:`dsa_export.stages.plan.plan_stages`); what
    differs per command is passed here: ``when`` prefixes the help of the options that only apply
    with stages (e.g. "With --stages"), ``stages_default`` ("auto" for ``plan``, which always plans),
    ``stages_type`` (build takes the raw text and checks it with :meth:`StagePlanOptions.stage_count`
    after MODEL), ``require_gpu_memory`` (``plan``), ``devices`` (``build`` places stages on GPUs)
    and ``min_seq`` (``build --stages`` has always taken 2 or more).
    """

    def describe(text: str) -> str:
        if not when:
            return text
        return f"{when}: {text if text[1:2].isupper() else text[0].lower() + text[1:]}"  # "GPUs" stays

    options = [
        click.option("--stages", type=stages_type, default=stages_default, show_default=stages_default is not None,
                     metavar="AUTO|N", help=stages_help),
        # No default= here: click 8.3 takes an explicit default=None as given and skips required=.
        click.option("--gpu-memory", required=require_gpu_memory, metavar="SIZE",
                     help=describe("Memory of one GPU: 141GiB, 80GB or a number of bytes (GiB = 2^30, GB = 10^9).")),
        click.option("--gpus", type=click.IntRange(min=1), default=None, help=describe(gpus_help)),
    ]
    if devices:
        options.append(click.option("--devices", default=None, metavar="I,J,...",
                                    help=describe("The GPU of each stage, in order.")))
    options += [
        click.option("--max-batch", type=click.IntRange(min=1), default=DEFAULT_MAX_BATCH, show_default=True,
                     help=describe("Largest batch of the profiles the stages are planned for.")),
        click.option("--max-seq", type=click.IntRange(min=min_seq), default=DEFAULT_MAX_SEQ, show_default=True,
                     help=describe("Largest sequence length of the profiles (prompt + generated tokens): the cache "
                                   "length and the prefill length; the same default in `plan`, `export --stages` "
                                   "and `build --stages`.")),
    ]
    names = [f.name for f in fields(StagePlanOptions) if devices or f.name != "devices"]

    def decorate(function):
        @functools.wraps(function)
        def command(*args, **kwargs):
            stage_plan = StagePlanOptions(**{name: kwargs.pop(name) for name in names})
            return function(*args, stage_plan=stage_plan, **kwargs)

        for option in reversed(options):  # click lists the options in the order of the list above
            command = option(command)
        return command

    return decorate


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
