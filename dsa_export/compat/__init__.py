"""Environment and compatibility checks: probes, the compatibility matrix, rules and the engine gate.

The build command calls :func:`run_checks` as its gate and the runtime calls :func:`gate_engine`
before deserializing an engine. Importing this package imports neither TensorRT nor torch and does
not touch CUDA; probing happens only when called.
"""

from dsa_export.compat.engine_gate import EngineRequirements, check_engine, gate_engine
from dsa_export.compat.probe import (
    ComponentRecord,
    EnvironmentProbe,
    GpuRecord,
    ProbeSettings,
    probe_environment,
)
from dsa_export.compat.rules import (
    BACKENDS,
    PRECISIONS,
    CheckReport,
    CheckSettings,
    Finding,
    manifest_record,
    require_no_blocking,
    run_checks,
)

__all__ = [
    "BACKENDS",
    "PRECISIONS",
    "CheckReport",
    "CheckSettings",
    "ComponentRecord",
    "EngineRequirements",
    "EnvironmentProbe",
    "Finding",
    "GpuRecord",
    "ProbeSettings",
    "check_engine",
    "gate_engine",
    "manifest_record",
    "probe_environment",
    "require_no_blocking",
    "run_checks",
]
