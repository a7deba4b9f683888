"""The demo build, made once per test session and shared by tests/artifact and tests/runtime."""

from __future__ import annotations

import importlib.util

HAS_RTX = importlib.util.find_spec("tensorrt_rtx_bindings") is not None


def build_demo(out):
    from dsa_export.artifact import BuildSettings, build

    lines: list[str] = []
    result = build(BuildSettings(output=out), log=lines.append)
    return result, lines


def rtx_build(model, profile: dict) -> tuple[bool, str]:
    """Parse ``model`` (an in-memory ModelProto) with TensorRT-RTX and AOT-build it for SM89 under
    ``profile`` ({input: (min, opt, max) shape}); returns (built, error messages)."""
    import pytest

    trt = pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT-RTX is not installed")
    messages: list[str] = []

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if severity <= trt.ILogger.Severity.ERROR:
                messages.append(msg)

    logger = Logger()
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString()):
        return False, "; ".join(parser.get_error(i).desc() for i in range(parser.num_errors))
    config = builder.create_builder_config()
    optimization = builder.create_optimization_profile()
    for name, shapes in profile.items():
        optimization.set_shape(name, *shapes)
    config.add_optimization_profile(optimization)
    config.num_compute_capabilities = 1
    config.set_compute_capability(trt.ComputeCapability.SM89, 0)
    engine = builder.build_serialized_network(network, config)
    return engine is not None and engine.nbytes > 0, "; ".join(messages)


def plain_rtx_build(path, batch: tuple[int, int, int] = (1, 2, 2),
                    sequence: tuple[int, int, int] = (1, 64, 64)) -> tuple[bool, list[str]]:
    """Build the ONNX file at ``path`` as a TensorRT-RTX user would, with no dsa_export code: the
    parser reads the file by its path, one optimization profile sets every input's ``batch`` and
    ``sequence`` dims to (min, opt, max), and the AOT builder targets SM89 (no GPU needed).
    Returns (built, the parser's and builder's warnings and errors).

    ``tensorrt_rtx`` is the module NVIDIA's ``tensorrt-rtx-cu13`` package adds; it re-exports
    ``tensorrt_rtx_bindings``, which the rtx extra installs, so either serves."""
    import importlib.util

    import onnx
    import pytest

    name = "tensorrt_rtx" if importlib.util.find_spec("tensorrt_rtx") else "tensorrt_rtx_bindings"
    trt = pytest.importorskip(name, reason="TensorRT-RTX is not installed")
    messages: list[str] = []

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if severity <= trt.ILogger.Severity.WARNING:
                messages.append(f"{severity.name}: {msg}")

    logger = Logger()
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(path)):
        return False, messages + [f"ERROR: {parser.get_error(i).desc()}" for i in range(parser.num_errors)]
    ranges = {"batch": batch, "sequence": sequence}
    profile = builder.create_optimization_profile()
    for value in onnx.load(str(path), load_external_data=False).graph.input:
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        shapes = [[ranges[d][i] if isinstance(d, str) else d for d in dims] for i in range(3)]
        profile.set_shape(value.name, *shapes)
    config = builder.create_builder_config()
    config.add_optimization_profile(profile)
    config.num_compute_capabilities = 1
    config.set_compute_capability(trt.ComputeCapability.SM89, 0)
    engine = builder.build_serialized_network(network, config)
    return engine is not None and engine.nbytes > 0, messages


#: What TensorRT's ONNX parser logs for a Loop with both a trip count and a condition input.
LOOP_WARNING = "both a trip limit and a loop termination condition"


def check_plain_build(path) -> None:
    """``path`` builds in plain TensorRT-RTX (:func:`plain_rtx_build`) for batch 1..2 and sequence
    1..64, and the parser had no Loop warning."""
    built, log = plain_rtx_build(path)
    assert built, "\n".join(m for m in log if m.startswith(("ERROR", "INTERNAL_ERROR")))[:2000]
    assert not [m for m in log if LOOP_WARNING in m]
