"""The demo build, made once per test session and shared by tests/build and tests/runtime."""

from __future__ import annotations

import importlib.util

HAS_RTX = importlib.util.find_spec("tensorrt_rtx_bindings") is not None


def build_demo(out):
    from dsa_export.build import BuildSettings, build

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
