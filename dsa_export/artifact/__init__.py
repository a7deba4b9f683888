"""One build: its steps export -> validate -> calibrate -> check -> engine, into one artifact folder.

Importing this package imports neither torch, onnxruntime nor TensorRT; each step imports what it
needs when it runs. The manifest schema it writes lives in :mod:`dsa_export.manifest`.
"""

from dsa_export.artifact.builder import (
    STEPS,
    BackendPlan,
    BuildResult,
    StepRecord,
    build,
    plan_backends,
)
from dsa_export.artifact.settings import BACKENDS, PRECISIONS, BuildSettings, parse_shape_ranges

__all__ = [
    "BACKENDS",
    "PRECISIONS",
    "STEPS",
    "BackendPlan",
    "BuildResult",
    "BuildSettings",
    "StepRecord",
    "build",
    "parse_shape_ranges",
    "plan_backends",
]
