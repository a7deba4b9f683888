"""The build pipeline: export -> validate -> calibrate -> check -> engine, into one artifact folder.

Importing this package imports neither torch, onnxruntime nor TensorRT; each stage imports what it
needs when it runs. The manifest schema it writes lives in :mod:`dsa_export.manifest`.
"""

from dsa_export.build.pipeline import STAGES, BackendPlan, BuildResult, StageRecord, build, plan_backends
from dsa_export.build.settings import BACKENDS, PRECISIONS, BuildSettings, parse_shape_ranges

__all__ = [
    "BACKENDS",
    "PRECISIONS",
    "STAGES",
    "BackendPlan",
    "BuildResult",
    "BuildSettings",
    "StageRecord",
    "build",
    "parse_shape_ranges",
    "plan_backends",
]
