"""Environment and compatibility checks: probes, the compatibility matrix, rules and the engine gate.

The build command calls :func:`run_checks` as its gate and the runtime calls :func:`gate_engine`
before deserializing an engine. Importing this package imports neither TensorRT nor torch and does
not touch CUDA; probing happens only when called.
"""

from dsa_export.compat.engine_gate import EngineRequirements, check_engine, gate_engine
from dsa_export.compat.matrix import CompatibilityMatrix, MatrixError, load_matrix
from dsa_export.compat.probe import probe_environment
from dsa_export.compat.records import ComponentRecord, EnvironmentProbe, GpuRecord, ProbeSettings
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
    "CompatibilityMatrix",
    "ComponentRecord",
    "EngineRequirements",
    "EnvironmentProbe",
    "Finding",
    "GpuRecord",
    "MatrixError",
    "ProbeSettings",
    "check_engine",
    "gate_engine",
    "load_matrix",
    "manifest_record",
    "probe_environment",
    "require_no_blocking",
    "run_checks",
]
