"""What the environment probes found (:class:`EnvironmentProbe`, one :class:`ComponentRecord` per
component, :class:`GpuRecord` per GPU), how probing runs (:class:`ProbeSettings`) and reading a
saved snapshot: the records the rules, the report and ``check --engine`` read, without probing
anything (:mod:`dsa_export.compat.probe` probes).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsa_export.compat.versions import (
    parse_version,
)

PROBE_SCHEMA_VERSION = 1
PLUGIN_LIB_ENV = "DSA_EXPORT_PLUGIN_LIB"

# Stable component names, in report order.
COMPONENTS: tuple[str, ...] = (
    "driver",
    "cuda_driver",
    "cuda_runtime",
    "cudnn",
    "nvcc",
    "tensorrt",
    "tensorrt_rtx",
    "onnxruntime",
    "torch",
    "polygraphy",
    "plugin_library",
)


@dataclass
class ComponentRecord:
    """What one probe found: a version, or the reason there is none."""

    name: str
    found: bool
    version: str | None = None
    reason: str | None = None  # why it is absent, or why its version is unknown
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ComponentRecord:
        return cls(
            name=data["name"],
            found=bool(data["found"]),
            version=data.get("version"),
            reason=data.get("reason"),
            details=dict(data.get("details") or {}),
        )


@dataclass
class GpuRecord:
    """One visible GPU."""

    index: int
    name: str
    compute_capability: str | None  # "9.0"
    memory_total_mib: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuRecord:
        return cls(
            index=int(data["index"]),
            name=str(data["name"]),
            compute_capability=data.get("compute_capability"),
            memory_total_mib=data.get("memory_total_mib"),
        )


@dataclass
class EnvironmentProbe:
    """A snapshot of the environment: one record per component, the GPUs, the host.

    Recorded snapshots of other machines (tests/compat/fixtures) are this object as JSON.
    """

    components: dict[str, ComponentRecord]
    gpus: list[GpuRecord] = field(default_factory=list)
    host: dict[str, str] = field(default_factory=dict)
    elapsed_s: float | None = None

    def component(self, name: str) -> ComponentRecord:
        """The record for ``name``; a not-probed record when the snapshot lacks it."""
        return self.components.get(name) or ComponentRecord(name, False, reason="not probed")

    def version(self, name: str) -> tuple[int, ...] | None:
        record = self.component(name)
        return parse_version(record.version) if record.found else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": PROBE_SCHEMA_VERSION,
            "host": dict(self.host),
            "gpus": [gpu.to_dict() for gpu in self.gpus],
            "components": {
                name: self.components[name].to_dict() for name in _ordered(self.components)
            },
            "elapsed_s": self.elapsed_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvironmentProbe:
        schema = data.get("schema_version")
        if schema != PROBE_SCHEMA_VERSION:
            raise ValueError(f"probe snapshot schema {schema!r} is not {PROBE_SCHEMA_VERSION}")
        components = {
            name: ComponentRecord.from_dict({"name": name, **record})
            for name, record in data.get("components", {}).items()
        }
        return cls(
            components=components,
            gpus=[GpuRecord.from_dict(gpu) for gpu in data.get("gpus", [])],
            host=dict(data.get("host", {})),
            elapsed_s=data.get("elapsed_s"),
        )


def load_snapshot(path: str | os.PathLike[str]) -> EnvironmentProbe:
    """Read a probe snapshot: a ``check --json`` report, a bare snapshot, or a test fixture.

    Lets a maintainer re-run the rules on a user's environment. Raises DSAUserError when unreadable.
    """
    import json

    from dsa_export.errors import DSAUserError

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise DSAUserError(f"Cannot read snapshot {path}: {exc.strerror or exc}.") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DSAUserError(f"Snapshot {path} is not valid JSON ({exc}).") from exc
    if isinstance(data, dict):
        for key in ("environment", "probe"):  # check --json report, test fixture
            if isinstance(data.get(key), dict):
                data = data[key]
                break
    remedy = "pass a report written by `dsa-export check --json`"
    if not isinstance(data, dict):
        kind = {list: "list", str: "string"}.get(type(data), "value")
        raise DSAUserError(f"Snapshot {path} holds a JSON {kind}, not a dsa-export probe snapshot; {remedy}.")
    if data.get("schema_version") != PROBE_SCHEMA_VERSION:
        raise DSAUserError(
            f"Snapshot {path} has schema_version {data.get('schema_version')!r}, not {PROBE_SCHEMA_VERSION}; {remedy}."
        )
    try:
        return EnvironmentProbe.from_dict(data)
    except KeyError as exc:
        raise DSAUserError(
            f"Snapshot {path} is not a dsa-export probe snapshot: a record lacks its '{exc.args[0]}' field; {remedy}."
        ) from exc
    except (TypeError, ValueError, AttributeError) as exc:
        raise DSAUserError(
            f"Snapshot {path} is not a dsa-export probe snapshot: a component or GPU record is not an object with "
            f"the expected fields; {remedy}."
        ) from exc


def _ordered(components: dict[str, ComponentRecord]) -> list[str]:
    known = [name for name in COMPONENTS if name in components]
    return known + sorted(name for name in components if name not in COMPONENTS)


@dataclass
class ProbeSettings:
    """How probing runs."""

    #: Seconds for all probes together; None: DEFAULT_PROBE_TIMEOUT_S for the library and tool
    #: probes and DEFAULT_IMPORT_TIMEOUT_S for the Python imports. Given, it bounds both.
    timeout_s: float | None = None
    subprocess_timeout_s: float | None = (
        None  # per external tool; None -> DEFAULT_SUBPROCESS_TIMEOUT_S
    )
    components: tuple[str, ...] | None = None  # None -> all of COMPONENTS


DEFAULT_PROBE_TIMEOUT_S = 4.0
#: The probes that import Python packages (torch, onnxruntime, TensorRT, Polygraphy) one after
#: another: a cold torch import takes 5 s and more on a busy machine, which is slow, not missing.
DEFAULT_IMPORT_TIMEOUT_S = 60.0
DEFAULT_SUBPROCESS_TIMEOUT_S = 3.0
