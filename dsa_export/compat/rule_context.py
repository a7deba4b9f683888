"""What every rule sees: the probe snapshot, the matrix and the request, with the helpers rules share."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dsa_export.compat.findings import Finding
from dsa_export.compat.matrix import CompatibilityMatrix
from dsa_export.compat.records import EnvironmentProbe, GpuRecord
from dsa_export.compat.versions import Version, parse_version

# Backends whose builds need a GPU here. TensorRT-RTX builds ahead of time for a chosen compute
# capability without one (measured on the CPU-only development machine), so it is not listed.
GPU_BUILD_BACKENDS = ("tensorrt",)


@dataclass
class RuleContext:
    """Everything a rule looks at."""

    probe: EnvironmentProbe
    matrix: CompatibilityMatrix
    for_build: bool
    backend: str  # resolved: "auto" only when nothing was asked
    precision: str
    gpu: GpuRecord | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def sm(self) -> Version | None:
        return (
            parse_version(self.gpu.compute_capability)
            if self.gpu and self.gpu.compute_capability
            else None
        )

    def asked(self, backend: str) -> bool:
        return self.for_build and self.backend == backend

    def severity(self, asked: bool, otherwise: str = "warning") -> str:
        return "error" if asked else otherwise

    def version(self, component: str) -> Version | None:
        return self.probe.version(component)

    def text(self, component: str) -> str:
        record = self.probe.component(component)
        return record.version or "unknown"

    def finding(
        self,
        id: str,
        severity: str,
        component: str,
        message: str,
        fix: str,
        row: dict[str, Any],
        fields: tuple[str, ...],
    ) -> Finding:
        """A finding that rests on ``fields`` of matrix ``row``: cited, and info when they are unverified."""
        verified = self.matrix.is_verified(row, fields)
        return Finding(
            id,
            severity if verified else "info",
            component,
            message,
            fix,
            self.matrix.source_text(row, fields),
            verified,
        )

    def not_in_matrix(self, id: str, component: str, label: str, unchecked: str) -> Finding:
        record = self.probe.component(component)
        return Finding(
            id,
            "info",
            component,
            f"{label} {record.version} is not in compatibility matrix {self.matrix.matrix_version}, so {unchecked} were not checked.",
            "Pass a newer matrix with `dsa-export check --matrix FILE` or add a row for it (see docs/compat.md).",
        )


Rule = Callable[[RuleContext], Iterable[Finding]]


def gpu_label(ctx: RuleContext) -> str:
    gpu = ctx.gpu
    return (
        f"GPU {gpu.index} ({gpu.name}, compute capability {gpu.compute_capability})"
        if gpu
        else "no GPU"
    )


def driver_cuda_version(ctx: RuleContext) -> Version | None:
    return ctx.version("cuda_driver") or parse_version(
        ctx.probe.component("driver").details.get("cuda_driver_version")
    )


__all__ = ["GPU_BUILD_BACKENDS", "Rule", "RuleContext", "driver_cuda_version", "gpu_label"]
