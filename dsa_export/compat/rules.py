"""Checks: a probe snapshot plus the compatibility matrix become a report of findings.

A finding has a stable id, a severity and two sentences: what is wrong and how to fix it. Severity
follows what the user asked for: a missing TensorRT is an error for ``--for-build --backend
tensorrt`` and only information for a plain ``check``. Errors that break the environment for any GPU
use (a driver too old for the installed CUDA runtime) are errors always, and a finding that rests
on a matrix fact no published text supports is only ever information. ``report.blocking`` lists
the error findings; the build command refuses to start while it is non-empty. The rules themselves
live in :mod:`dsa_export.compat.rulebook`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export.compat.findings import SEVERITIES, Finding
from dsa_export.compat.matrix import CompatibilityMatrix, load_matrix
from dsa_export.compat.probe import probe_environment
from dsa_export.compat.records import COMPONENTS, EnvironmentProbe, GpuRecord, ProbeSettings
from dsa_export.compat.rulebook import GPU_BUILD_BACKENDS, RULES, RuleContext
from dsa_export.compat.versions import parse_version, version_matches
from dsa_export.errors import DSAUsageError, DSAUserError

REPORT_SCHEMA_VERSION = 1
BACKENDS: tuple[str, ...] = ("auto", "tensorrt", "tensorrt-rtx", "onnxruntime")
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "fp8")
DEFAULT_BACKEND = "auto"
DEFAULT_PRECISION = "fp16"
DEFAULT_DEVICE = 0


@dataclass
class CheckSettings:
    """What the check is asked. ``None`` means the default."""

    for_build: bool = False  # check that an engine can be built; --backend/--precision imply it
    backend: str | None = None  # one of BACKENDS; None -> "auto" (pick the best available)
    precision: str | None = None  # one of PRECISIONS; None -> "fp16"; checked only for builds
    engine: Path | None = None  # also gate this engine (reads manifest.json next to it)
    device: int | None = None  # index of the GPU to check against; None -> 0
    matrix_path: Path | None = None  # None -> the packaged matrix.json; else a newer one (--matrix)
    probe: ProbeSettings | None = None  # how probing runs

    def validated(self) -> CheckSettings:
        """A copy with defaults filled in; DSAUsageError on values outside the allowed sets."""
        backend = self.backend or DEFAULT_BACKEND
        precision = self.precision or DEFAULT_PRECISION
        if backend not in BACKENDS:
            raise DSAUsageError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}.")
        if precision not in PRECISIONS:
            raise DSAUsageError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}.")
        for_build = self.for_build or self.backend is not None or self.precision is not None
        device = DEFAULT_DEVICE if self.device is None else self.device
        if device < 0:
            raise DSAUsageError(f"device index {device} is negative.")
        return dataclasses.replace(
            self, for_build=for_build, backend=backend, precision=precision, device=device
        )


@dataclass
class CheckReport:
    """Findings for one request against one environment snapshot."""

    request: dict[str, Any]
    findings: list[Finding]
    environment: EnvironmentProbe
    matrix: dict[str, Any]  # CompatibilityMatrix.summary(): version, date, path, verdict counts
    engine: dict[str, Any] | None = None

    @property
    def matrix_version(self) -> str:
        return str(self.matrix["version"])

    @property
    def blocking(self) -> list[Finding]:
        """Error findings: what stops the requested build or engine load."""
        return [finding for finding in self.findings if finding.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.blocking

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        from dsa_export import __version__

        counts = {severity: 0 for severity in SEVERITIES}
        for finding in self.findings:
            counts[finding.severity] += 1
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "dsa_export_version": __version__,
            "matrix_version": self.matrix_version,
            "matrix": dict(self.matrix),
            "request": dict(self.request),
            "ok": self.ok,
            "blocking": [finding.id for finding in self.blocking],
            "counts": counts,
            "findings": [finding.to_dict() for finding in self.findings],
            "engine": self.engine,
            "environment": self.environment.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def manifest_record(report: CheckReport | None, skipped: bool) -> dict[str, Any]:
    """What a build manifest stores about the gate: whether it ran, was skipped, and what it said."""
    if skipped or report is None:
        return {"skipped": True, "findings": []}
    return {
        "skipped": False,
        "matrix_version": report.matrix_version,
        "matrix_date": report.matrix["date"],
        "findings": [{"id": f.id, "severity": f.severity} for f in report.findings],
    }


def require_no_blocking(report: CheckReport) -> None:
    """Raise DSAUserError naming the first blocking finding (the build command's gate)."""
    blocking = report.blocking
    if blocking:
        first = blocking[0]
        more = (
            f" ({len(blocking) - 1} more: run `dsa-export check --for-build` to see them)"
            if len(blocking) > 1
            else ""
        )
        raise DSAUserError(f"{first.message} {first.fix}{more} Pass --skip-checks to build anyway.")


# ---------------------------------------------------------------------------------------------
# Running the checks


def resolve_backend(
    requested: str,
    for_build: bool,
    probe: EnvironmentProbe,
    gpu: GpuRecord | None,
    matrix: CompatibilityMatrix,
) -> str:
    """``auto`` becomes the best backend the environment can build with; other values stay."""
    if requested != "auto" or not for_build:
        return requested
    if gpu is not None and probe.component("tensorrt").found:
        return "tensorrt"
    rtx = matrix.release_row("tensorrt_rtx", probe.version("tensorrt_rtx"))
    sm = parse_version(gpu.compute_capability) if gpu and gpu.compute_capability else None
    if (
        probe.component("tensorrt_rtx").found
        and rtx is not None
        and sm is not None
        and version_matches(sm, rtx["sm"])
    ):
        return "tensorrt-rtx"
    return "onnxruntime"


_SEVERITY_RANK = {severity: rank for rank, severity in enumerate(SEVERITIES)}
_COMPONENT_RANK = {
    name: rank for rank, name in enumerate(("driver", "gpu", *COMPONENTS, "engine", "environment"))
}


def _selected_gpu(probe: EnvironmentProbe, device: int | None) -> GpuRecord | None:
    index = DEFAULT_DEVICE if device is None else device
    return probe.gpus[index] if index < len(probe.gpus) else None


def _sorted(findings: list[Finding]) -> list[Finding]:
    """Severity first, then component in report order, then id: the stable order of the report."""
    return sorted(
        findings,
        key=lambda f: (_SEVERITY_RANK[f.severity], _COMPONENT_RANK.get(f.component, 99), f.id),
    )


def evaluate(
    settings: CheckSettings, probe: EnvironmentProbe, matrix: CompatibilityMatrix
) -> tuple[list[Finding], str]:
    """Apply RULES to a snapshot: the sorted findings and the backend ``auto`` resolved to."""
    gpu = _selected_gpu(probe, settings.device)
    extra: dict[str, Any] = {}
    if probe.gpus and gpu is None:
        extra["device_missing"] = settings.device
    backend = resolve_backend(
        settings.backend or DEFAULT_BACKEND, settings.for_build, probe, gpu, matrix
    )
    precision = settings.precision or DEFAULT_PRECISION
    ctx = RuleContext(probe, matrix, settings.for_build, backend, precision, gpu, extra)
    return _sorted([finding for rule in RULES for finding in rule(ctx)]), backend


def run_checks(
    settings: CheckSettings | None = None, probe: EnvironmentProbe | None = None
) -> CheckReport:
    """Probe the environment (unless a snapshot is given), apply the rules, and gate an engine if asked.

    Raises DSAUsageError for invalid settings, MatrixError (a DSAUserError) for a matrix file that
    cannot be used, and DSAUserError when ``settings.engine`` is not an engine with a readable
    manifest; every environment problem becomes a finding instead.
    """
    settings = (settings or CheckSettings()).validated()
    matrix = load_matrix(settings.matrix_path)
    requirements = None
    if settings.engine is not None:  # a file that is not an engine fails before the slow probing
        from dsa_export.compat.engine_gate import read_requirements

        requirements = read_requirements(Path(settings.engine))
    if probe is None:
        probe = probe_environment(settings.probe)
    findings, resolved = evaluate(settings, probe, matrix)
    engine_info = None
    if requirements is not None:
        from dsa_export.compat.engine_gate import compare_engine

        engine_findings = compare_engine(requirements, probe, device=settings.device or 0)
        engine_info = {"path": str(settings.engine), "requirements": requirements.to_dict()}
        findings = _sorted(findings + engine_findings)
    request = {
        "for_build": settings.for_build,
        "backend": settings.backend,
        "resolved_backend": resolved if settings.for_build else None,
        "precision": settings.precision if settings.for_build else None,
        "device": settings.device,
        "engine": str(settings.engine) if settings.engine else None,
    }
    return CheckReport(request, findings, probe, matrix.summary(), engine_info)


__all__ = [
    "BACKENDS",
    "GPU_BUILD_BACKENDS",
    "PRECISIONS",
    "SEVERITIES",
    "CheckReport",
    "CheckSettings",
    "Finding",
    "evaluate",
    "manifest_record",
    "require_no_blocking",
    "resolve_backend",
    "run_checks",
]
