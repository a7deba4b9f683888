"""The demo build, made once per test session and shared by tests/build and tests/runtime."""

from __future__ import annotations

import importlib.util

HAS_RTX = importlib.util.find_spec("tensorrt_rtx_bindings") is not None


def build_demo(out):
    from dsa_export.build import BuildSettings, build

    lines: list[str] = []
    result = build(BuildSettings(output=out), log=lines.append)
    return result, lines
