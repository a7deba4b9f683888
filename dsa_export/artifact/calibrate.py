"""The calibrate step: a thin adapter over :mod:`dsa_export.quantize`, imported only for int8/fp8.

The quantize package ships separately from the build; an install without it can still
build fp32/fp16/bf16 artifacts and says plainly that calibration is missing when int8/fp8 is asked.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUserError


@dataclass
class CalibrationOutcome:
    model: Path  # the Q/DQ ONNX file
    cache: Path | None  # TensorRT 10 INT8 calibration cache, if written
    report: Path | None  # accuracy report JSON, if one could be made
    provenance: dict[str, Any] = field(default_factory=dict)


def quantize_module():
    """``dsa_export.quantize``, or a one-sentence error when this install has no calibration."""
    try:
        return importlib.import_module("dsa_export.quantize")
    except ImportError as exc:
        if exc.name and not exc.name.startswith("dsa_export.quantize") and exc.name != "dsa_export":
            raise DSAUserError(
                f"Calibration needs the Python module '{exc.name}', which is not installed; install it and build again."
            ) from exc
        raise DSAUserError(
            "Calibration (--precision int8/fp8) is not available in this install of dsa-export; "
            "build with --precision fp32, fp16 or bf16, or pass an already calibrated Q/DQ .onnx."
        ) from exc


def calibrate(
    onnx_path: Path,
    output: Path,
    precision: str,
    *,
    data: str | None,
    cache: Path | None,
    report: Path | None,
    trt_version: str | None = None,
) -> CalibrationOutcome:
    """Calibrate ``onnx_path`` at ``precision`` and write the Q/DQ model (and cache, report) atomically."""
    quantize = quantize_module()
    settings = quantize.QuantizeSettings(precision=precision, data=data or "builtin")
    result = quantize.quantize(onnx_path, settings)
    has_report = getattr(result, "report", None) is not None
    kwargs: dict[str, Any] = {"cache": cache if precision == "int8" else None, "report": report if has_report else None}
    if trt_version:
        kwargs["trt_version"] = trt_version
    quantize.save(result, output, **kwargs)
    recipe = getattr(result, "recipe", None)
    provenance = {
        "precision": precision,
        "data": data or "builtin",
        "samples": getattr(result, "calibration_samples", None),
        "recipe": getattr(recipe, "name", None) or (str(recipe) if recipe is not None else None),
        "method": getattr(recipe, "method", None),
        "recipe_path": str(getattr(recipe, "path", None) or "") or None,
        "source_model": onnx_path.name,
        "report_passed": getattr(getattr(result, "report", None), "passed", None),
    }
    return CalibrationOutcome(
        model=output,
        cache=kwargs["cache"] if kwargs["cache"] is not None and Path(kwargs["cache"]).is_file() else None,
        report=kwargs["report"] if kwargs["report"] is not None and Path(kwargs["report"]).is_file() else None,
        provenance=provenance,
    )


__all__ = ["CalibrationOutcome", "calibrate", "quantize_module"]
