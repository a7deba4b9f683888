"""tools/cpp_runtime compiles against the TensorRT headers (set TensorRT_INCLUDE_DIR to run this).

Linking needs libnvinfer, which cannot be installed on the CPU-only development machine, so this
checks the compile only; see docs/build.md for what ran where.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "tools" / "cpp_runtime" / "main.cpp"


def _cuda_include() -> Path | None:
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "include" / "cuda_runtime_api.h").is_file():
            return Path(root) / "include"
    return None


def test_cpp_runtime_compiles_against_tensorrt_headers():
    include = os.environ.get("TensorRT_INCLUDE_DIR")
    if not include or not (Path(include) / "NvInfer.h").is_file():
        pytest.skip("set TensorRT_INCLUDE_DIR to a folder with NvInfer.h (TensorRT 10/11 headers)")
    cuda = _cuda_include()
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cuda is None or compiler is None:
        pytest.skip("needs a C++ compiler and the CUDA runtime headers")
    result = subprocess.run(
        [compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-isystem", include,
         "-isystem", str(cuda), str(SOURCE)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
