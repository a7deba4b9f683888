"""The ONNX Runtime artifact: an optimized model plus the session and execution-provider options.

ONNX Runtime inlines the ``dsa`` function bodies when it optimizes, so the saved optimized model
holds standard ops only and serves the CPU and CUDA execution providers; it is optimized from the
file with the trimmed sparse-attention body that ONNX Runtime runs faster
(:func:`dsa_export.ops.onnx_ops.use_onnxruntime_bodies`). The TensorRT execution
provider gets the plugin-mode ``model.onnx`` instead (its ``dsa`` nodes intact) with our
static-registration plugin library in ``trt_extra_plugin_lib_paths``: ONNX Runtime ``dlopen``s
those libraries and the creators register themselves on load. ``session.json`` lists one provider
chain per execution provider, best first; :mod:`dsa_export.runtime.onnxrt` takes the first chain
whose provider this ONNX Runtime has.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsa_export.fileio import atomic_output
from dsa_export.manifest import ORT_DIR, ORT_MODEL_NAME, ORT_SESSION_NAME

SESSION_SCHEMA_VERSION = 1
OPTIMIZATION_LEVELS = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def _shape_option(profiles: dict[str, tuple[list[int], ...]], index: int) -> str:
    """TensorRT EP profile syntax: ``input_ids:1x1,other:2x3``."""
    return ",".join(f"{name}:{'x'.join(str(d) for d in shapes[index])}" for name, shapes in profiles.items())


def tensorrt_ep_options(
    precision: str,
    profiles: dict[str, tuple[list[int], ...]],
    plugin_library: Path | None,
    optimization_level: int = 3,
) -> dict[str, str]:
    """Provider options of ONNX Runtime's TensorRT execution provider (all values are strings)."""
    options = {
        "trt_fp16_enable": str(precision == "fp16"),
        "trt_bf16_enable": str(precision == "bf16"),
        # Explicit Q/DQ models need INT8 enabled in the EP (FP8 Q/DQ is taken from the graph).
        "trt_int8_enable": str(precision == "int8"),
        "trt_profile_min_shapes": _shape_option(profiles, 0),
        "trt_profile_opt_shapes": _shape_option(profiles, 1),
        "trt_profile_max_shapes": _shape_option(profiles, 2),
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": "trt_engine_cache",
        "trt_timing_cache_enable": "True",
        "trt_builder_optimization_level": str(optimization_level),
    }
    if plugin_library is not None:
        options["trt_extra_plugin_lib_paths"] = str(plugin_library)
    return options


class _NotSaved(Exception):
    """The optimized model is deliberately not written."""


def write_artifact(
    folder: Path,
    onnx_path: Path,
    *,
    precision: str,
    profiles: dict[str, tuple[list[int], ...]],
    plugin_library: Path | None,
    plugin_reason: str | None,
    optimization: str = "basic",
    optimization_level: int = 3,
) -> dict[str, Any]:
    """Write ``folder/onnxruntime/`` and return the manifest's ``onnxruntime`` section."""
    import onnxruntime as ort

    from dsa_export import quiet

    quiet.quiet_onnxruntime(ort)
    ort_dir = folder / ORT_DIR
    ort_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    optimized: str | None = ORT_MODEL_NAME
    level = OPTIMIZATION_LEVELS[optimization]
    from dsa_export.runtime.onnxrt import external_data_bytes, onnxruntime_model_bytes

    weights = external_data_bytes(onnx_path)
    try:
        if weights:
            # The saved model would name the external data relative to the wrong folder or copy the
            # weights (ONNX Runtime writes models over 2 GB only with a second external-data
            # file): a stage of a large model is optimized at load time instead.
            raise _NotSaved(f"the weights stay in the {weights / 2**30:.2f} GiB of external data of "
                            f"{onnx_path.name}")
        with atomic_output(ort_dir / ORT_MODEL_NAME) as tmp:
            options = ort.SessionOptions()
            options.log_severity_level = quiet.ort_severity()
            options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
            options.optimized_model_filepath = str(tmp)
            # The trimmed sparse-attention body, which ONNX Runtime runs faster than the file's
            # static one (no external data here, so the bytes carry the whole model).
            swapped = onnxruntime_model_bytes(onnx_path)
            ort.InferenceSession(swapped if swapped is not None else str(onnx_path), sess_options=options,
                                 providers=["CPUExecutionProvider"])
            if not tmp.is_file() or tmp.stat().st_size == 0:
                raise RuntimeError("no optimized model was written")
    except _NotSaved as exc:
        optimized = None
        notes.append(f"No optimized model was saved ({exc}); the CPU and CUDA chains load ../{onnx_path.name} "
                     "and optimize it at load time.")
    except Exception as exc:  # ONNX Runtime cannot always serialize what it optimized
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        optimized = None
        notes.append(
            f"ONNX Runtime could not save the optimized graph ({first}); the CPU and CUDA chains load "
            f"../{onnx_path.name} and optimize it at load time."
        )
    if optimized:
        notes.append(
            f"{ORT_MODEL_NAME} was optimized at level {optimization} ({level}); the dsa function bodies are "
            "inlined in it, so it holds standard ops only."
        )
    if plugin_library is None:
        notes.append(
            f"No plugin library for the TensorRT execution provider ({plugin_reason}); TensorRT would run the dsa "
            "nodes as their function bodies."
        )
    plain = f"../{onnx_path.name}"
    generic_model = optimized or plain
    # Options of the saved model were applied already; at load time only what is cheap and safe.
    session_options = {"graph_optimization_level": "ORT_ENABLE_BASIC" if optimized else "ORT_ENABLE_ALL",
                       "log_severity_level": 3}
    chains = [
        {
            "name": "tensorrt",
            "model": plain,
            "providers": [
                ["TensorrtExecutionProvider", tensorrt_ep_options(precision, profiles, plugin_library, optimization_level)],
                ["CUDAExecutionProvider", {}],
                ["CPUExecutionProvider", {}],
            ],
        },
        {"name": "cuda", "model": generic_model, "providers": [["CUDAExecutionProvider", {}], ["CPUExecutionProvider", {}]]},
        {"name": "cpu", "model": generic_model, "providers": [["CPUExecutionProvider", {}]]},
    ]
    session = {
        "schema_version": SESSION_SCHEMA_VERSION,
        "onnxruntime_version": ort.__version__,
        "session_options": session_options,
        "chains": chains,
        "notes": notes,
    }
    with atomic_output(ort_dir / ORT_SESSION_NAME) as tmp:
        tmp.write_text(json.dumps(session, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return {
        "folder": ORT_DIR,
        "session": f"{ORT_DIR}/{ORT_SESSION_NAME}",
        "optimized_model": f"{ORT_DIR}/{ORT_MODEL_NAME}" if optimized else None,
        "optimization": optimization if optimized else None,
        "version": ort.__version__,
        "plugin_library": str(plugin_library) if plugin_library else None,
        "notes": notes,
    }


__all__ = ["OPTIMIZATION_LEVELS", "tensorrt_ep_options", "write_artifact"]
