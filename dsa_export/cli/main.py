"""Entry point of the ``dsa-export`` CLI.

Each subcommand lives in its own module exposing a click command named ``command``; modules are
imported only when their subcommand runs, so ``dsa-export --help`` stays fast and a subcommand
whose optional dependency is missing explains what to install instead of breaking the whole CLI.

:func:`main` is where every command ends, the same way: exit 0 on success, 2 for a wrong command
line (click's errors and :class:`DSAUsageError`, printed as one line), 1 for a user error (one
sentence, no traceback; library exceptions caused by the user's input are turned into user errors
by :func:`dsa_export.errors.as_user_error`), 130 on SIGINT/SIGTERM within seconds, even inside native code
(:func:`dsa_export.interrupts.guard`), and 1 with "Internal
error" for a real bug. ``--debug`` (accepted anywhere on the command line) shows tracebacks and the
third-party output that is otherwise hidden (:mod:`dsa_export.quiet`).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

import click

from dsa_export import __version__, interrupts, quiet
from dsa_export.cli import json_stdout
from dsa_export.errors import DSAUsageError, DSAUserError, as_user_error

# name -> (module, one-line help). Keep sorted by pipeline order.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("dsa_export.cli.plan_cmd", "Split a checkpoint into pipeline stages that each fit one GPU."),
    "export": ("dsa_export.cli.export_cmd", "Export a model to ONNX with DSA custom ops."),
    "calibrate": ("dsa_export.cli.calibrate_cmd", "Calibrate an exported model into INT8/FP8 Q/DQ ONNX."),
    "validate": ("dsa_export.cli.validate_cmd", "Compare an ONNX file against its PyTorch reference."),
    "inspect": ("dsa_export.cli.inspect_cmd", "Show the ops, custom nodes, I/O and metadata of an ONNX file."),
    "build": ("dsa_export.cli.build_cmd", "Build an engine, an ONNX Runtime artifact and a manifest."),
    "run": ("dsa_export.cli.run_cmd", "Run a built engine or ONNX Runtime artifact."),
    "generate": ("dsa_export.cli.generate_cmd", "Generate tokens from a build or pipeline (prefill, then decode)."),
    "serve": ("dsa_export.cli.serve_cmd", "Serve a paged build behind an OpenAI-compatible HTTP API."),
    "check": ("dsa_export.cli.check_cmd", "Check the GPU software stack before a build or engine load."),
    "plugins": ("dsa_export.cli.plugins_cmd", "Build the CUDA/TensorRT plugin libraries and find them."),
    "bench": ("dsa_export.cli.bench_cmd", "Time a DSA layer against dense attention across sequence lengths."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module_name, short_help = SUBCOMMANDS[name]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing = exc.name or str(exc)

            @click.command(name=name, short_help=short_help, context_settings={"ignore_unknown_options": True})
            @click.argument("args", nargs=-1, type=click.UNPROCESSED)
            def _missing(args: tuple[str, ...]) -> None:
                raise DSAUserError(
                    f"'dsa-export {name}' needs the Python module '{missing}', which is not installed; "
                    f"install it (see README) and run the command again."
                )

            return _missing
        command = module.command
        if command.short_help is None:
            command.short_help = short_help
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Use the static help so listing commands imports nothing heavy.
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, text) in SUBCOMMANDS.items()])


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dsa-export")
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.option("-v", "--verbose", count=True, help="More log output (repeatable).")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: int) -> None:
    """Compile DeepSeek Sparse Attention models into ONNX, TensorRT engines and validated artifacts."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    ctx.obj["verbose"] = verbose
    import logging

    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2), format="[dsa-export] %(levelname)s: %(message)s"
    )


def _take_debug(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (wherever it stands before ``--``), and whether it was there."""
    end = argv.index("--") if "--" in argv else len(argv)
    kept = [a for a in argv[:end] if a != "--debug"] + argv[end:]
    return kept, len(kept) != len(argv)


def _invoke(args: list[str]):
    """What ``cli.main(standalone_mode=False)`` does, minus turning KeyboardInterrupt into a blank
    line and Abort: every exception reaches :func:`main` as it was raised."""
    with cli.make_context("dsa-export", args) as ctx:
        return cli.invoke(ctx)


def _exit_interrupted(standalone: bool) -> None:
    """Exit 130 once an interrupt has unwound the command (its cleanup has run). As the console
    script, end the process directly: CPython replaces any exit status with death by SIGINT when a
    KeyboardInterrupt once escaped code that a library ran through PyRun_* (measured with validate),
    whatever we pass to sys.exit."""
    if not standalone:
        sys.exit(interrupts.EXIT_INTERRUPTED)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe: nothing more to say
            pass
    os._exit(interrupts.EXIT_INTERRUPTED)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> None:
    """Run the CLI and map exceptions to exit codes: 2 usage, 1 failure, 130 interrupted, no
    traceback without --debug. With ``--json``, stdout holds one JSON document on success and on
    failure (:mod:`dsa_export.cli.json_stdout`)."""
    standalone = argv is None  # the console script / python -m, not a caller in Python
    args, debug = _take_debug(list(sys.argv[1:] if argv is None else argv))
    quiet.set_debug(debug)
    quiet.configure()
    stderr = sys.stderr  # kept: third-party output may be redirected while a command runs
    report = json_stdout.JsonStdout(standalone) if json_stdout.requested(args) else None
    failure: dict[str, str] = {}

    def say(message: str) -> None:
        click.echo(message, file=stderr)

    def fail(code: int, message: str, shown: str | None = None) -> None:
        """Say ``message`` (one sentence) on stderr unless ``shown`` replaces it ("": already shown),
        put it in the JSON report and exit ``code``."""
        line = f"Error: {message}" if shown is None else shown
        if line:
            say(line)
        failure["message"] = message
        sys.exit(code)

    def interrupted(message: str = "Interrupted; no partial output was kept.") -> None:
        say(message)
        if report is not None:
            report.finish(message, interrupts.EXIT_INTERRUPTED)

    if standalone:
        # What the guard restores when the command is over: a signal that arrives once the work is
        # done and the output installed (while the guard unwinds, or on the way to exit) is
        # ignored instead of killing the process with a traceback or a signal exit status.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
    def command():
        try:
            return _invoke((["--debug"] if debug else []) + args)
        except Exception:
            # A failure after a signal arrived is the interrupt's doing (e.g. a KeyboardInterrupt
            # raised inside a library's import, which the library turned into another error).
            interrupts.raise_if_cancelled()
            raise

    try:
        _run(command, debug, standalone, fail, say, interrupted, stderr)
    except SystemExit as exc:
        if report is not None:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            report.finish(failure.get("message") if code else None, code)
        raise
    except BaseException as exc:  # --debug re-raises errors with their traceback
        if report is not None:
            report.finish(f"{type(exc).__name__}: {_one_line(exc)}", 1)
        raise


def _run(command, debug: bool, standalone: bool, fail, say, interrupted, stderr) -> None:
    try:
        # In non-standalone mode click returns ctx.exit(n)'s code instead of exiting.
        code = interrupts.guard(command, on_abort=interrupted)
    except click.exceptions.Abort:
        interrupted("Aborted.")
        _exit_interrupted(standalone)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show(file=stderr)
        fail(exc.exit_code, _one_line(exc.format_message()), shown="")
    except click.UsageError as exc:
        if debug:
            raise
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        fail(exc.exit_code, f"{_one_line(exc.format_message())}{hint}")
    except click.ClickException as exc:
        if debug:
            raise
        fail(exc.exit_code, _one_line(exc.format_message()))
    except DSAUsageError as exc:
        if debug:
            raise
        fail(2, _one_line(exc))
    except DSAUserError as exc:
        if debug:
            raise
        fail(1, _one_line(exc))
    except KeyboardInterrupt:
        interrupted()
        _exit_interrupted(standalone)
    except Exception as exc:
        mapped = as_user_error(exc)
        if debug:
            raise
        if mapped is not None:  # the user's input or machine, not a bug
            fail(1, _one_line(mapped))
        message = (f"Internal error (a bug in dsa-export, please report it): {type(exc).__name__}: {_one_line(exc)}. "
                   "Run again with --debug for the traceback.")
        fail(1, message, shown=message)
    else:
        sys.exit(code if isinstance(code, int) else 0)
