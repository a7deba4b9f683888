"""``dsa-export check``: probe the GPU software stack and say what blocks a build or an engine load."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from dsa_export.compat.probe import timed_out
from dsa_export.compat.records import (
    COMPONENTS,
    DEFAULT_IMPORT_TIMEOUT_S,
    DEFAULT_PROBE_TIMEOUT_S,
    ProbeSettings,
    load_snapshot,
)
from dsa_export.compat.rules import BACKENDS, PRECISIONS, CheckReport, CheckSettings, run_checks
from dsa_export.errors import DSAUserError

_MARKS = {"error": "ERROR", "warning": "WARN ", "info": "info "}


def _component_line(report: CheckReport, name: str) -> tuple[str, str, str]:
    record = report.environment.component(name)
    seconds = timed_out(record)
    if seconds is not None:
        return name, "not probed", f"(timed out after {seconds:g} s; raise --timeout)"
    if not record.found:
        return name, "missing", record.reason or ""
    extra = ""
    details = record.details
    if name == "driver":
        extra = (
            f"CUDA {details['cuda_driver_version']} " if details.get("cuda_driver_version") else ""
        )
        extra += f"via {details.get('source', '?')}"
    elif name == "torch":
        extra = f"CUDA {details.get('cuda') or 'none (CPU build)'}"
        if details.get("cudnn"):
            extra += f", cuDNN {details['cudnn']}"
    elif name == "onnxruntime":
        extra = "providers: " + ", ".join(details.get("providers", []))
    elif name == "plugin_library":
        extra = f"{details.get('path')} (sha256 {str(details.get('sha256'))[:12]})"
    elif name == "cudnn" and details.get("built_for_cuda"):
        extra = f"built for CUDA {details['built_for_cuda']}"
    elif details.get("path") or details.get("library_path"):
        extra = str(details.get("path") or details.get("library_path"))
    return name, record.version or "found", extra


def render_table(report: CheckReport) -> str:
    """The human-readable report: components, GPUs, findings, verdict."""
    lines = ["Environment:"]
    rows = [
        _component_line(report, name)
        for name in COMPONENTS
        if name in report.environment.components
    ]
    width = max(len(row[0]) for row in rows) if rows else 10
    version_width = max(len(row[1]) for row in rows) if rows else 10
    for name, version, extra in rows:
        lines.append(f"  {name:<{width}}  {version:<{version_width}}  {extra}".rstrip())
    if report.environment.gpus:
        lines.append("GPUs:")
        for gpu in report.environment.gpus:
            memory = f", {gpu.memory_total_mib} MiB" if gpu.memory_total_mib else ""
            lines.append(
                f"  [{gpu.index}] {gpu.name} (compute capability {gpu.compute_capability}{memory})"
            )
    matrix = report.matrix
    lines.append(
        f"Matrix: {matrix['version']} of {matrix['date']} ({matrix['path']}; "
        + ", ".join(f"{n} {v}" for v, n in matrix["verdicts"].items())
        + " rows)"
    )
    request = report.request
    if request["for_build"]:
        lines.append(
            f"Asked: build with backend {request['backend']} (resolved: {request['resolved_backend']}), precision {request['precision']}"
        )
    if request["engine"]:
        lines.append(f"Asked: load engine {request['engine']}")
    lines.append("Findings:" if report.findings else "Findings: none")
    for finding in report.findings:
        lines.append(f"  {_MARKS[finding.severity]} [{finding.id}] {finding.message}")
        lines.append(f"        fix: {finding.fix}")
    if report.ok:
        lines.append("Result: nothing blocks what was asked.")
    else:
        lines.append(
            f"Result: blocked by {len(report.blocking)} error(s): {', '.join(f.id for f in report.blocking)}."
        )
    return "\n".join(lines)


@click.command(name="check")
@click.option("--json", "as_json", is_flag=True, help="Print the report as stable JSON.")
@click.option(
    "--for-build",
    is_flag=True,
    help="Check that an engine can be built (implied by --backend/--precision).",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help="Backend the build will use [default: auto].",
)
@click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    default=None,
    help="Precision the build will use [default: fp16].",
)
@click.option(
    "--engine",
    type=click.Path(path_type=Path, dir_okay=True),
    default=None,
    help="Also check that this engine (with manifest.json next to it) can be loaded here.",
)
@click.option(
    "--device",
    type=click.IntRange(min=0),
    default=None,
    help="GPU index to check against [default: 0].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=None,
    help=f"Seconds allowed for all probes [default: {DEFAULT_PROBE_TIMEOUT_S:g} for the library and tool "
    f"probes, {DEFAULT_IMPORT_TIMEOUT_S:g} for importing torch, onnxruntime, TensorRT and Polygraphy]. A probe "
    "that runs out of time is reported as not probed, not as missing.",
)
@click.option(
    "--snapshot",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Check a saved environment (a `check --json` report) instead of probing this machine.",
)
@click.option(
    "--matrix",
    "matrix_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Use this compatibility matrix (a newer matrix.json, same schema) instead of the packaged one.",
)
def command(
    as_json: bool,
    for_build: bool,
    backend: str | None,
    precision: str | None,
    engine: Path | None,
    device: int | None,
    timeout: float | None,
    snapshot: Path | None,
    matrix_path: Path | None,
) -> None:
    """Check the driver, CUDA, cuDNN, TensorRT, ONNX Runtime and torch against the compatibility matrix.

    Exits 0 when nothing blocks what was asked and 1 when an error-level finding does.
    """
    settings = CheckSettings(
        for_build=for_build,
        backend=backend,
        precision=precision,
        engine=engine,
        device=device,
        matrix_path=matrix_path,
        probe=ProbeSettings(timeout_s=timeout),
    )
    report = run_checks(settings, load_snapshot(snapshot) if snapshot else None)
    click.echo(report.to_json() if as_json else render_table(report))
    if as_json and report.blocking:
        # With --json the failure is also one sentence on stderr and an "error" key in the report.
        raise DSAUserError(f"blocked by {len(report.blocking)} error(s): {', '.join(f.id for f in report.blocking)} "
                           "(see the findings).")
    # SystemExit, not ctx.exit(): with standalone_mode=False click returns ctx.exit's code from
    # cli.main instead of raising it, and main() does not pass that value on.
    sys.exit(report.exit_code)
