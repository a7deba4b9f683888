"""tools/cpp_runtime's library, host side: built with g++ and run, no TensorRT, CUDA or GPU.

``dsa_runtime_host_test`` (host_test.cpp) tests what the runtime library decides on the host:
the page allocator (dsa_export.runtime.paged.PageAllocator's rules: page 0 is scratch, pages come
back lowest first), the slots and the control inputs of each prefill and decode call, the argument
checks, the paged plan's checks and limits, and the logits' greedy ids. It also reads a paged build
folder written here the way dsa_export.manifest writes one. Runs in CI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

SOURCES = Path(__file__).resolve().parents[1] / "tools" / "cpp_runtime"
HOST_SOURCES = ("host_test.cpp", "host_math.cpp", "scheduler.cpp", "paged_plan.cpp", "pipeline.cpp", "json.cpp",
                "engine_gate.cpp")
FLAGS = ("-std=c++17", "-Wall", "-Wextra", "-Werror", "-O0")


@pytest.fixture(scope="module")
def host_test(tmp_path_factory) -> Path:
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")
    if compiler is None:
        pytest.fail("needs g++ (or $CXX) to build the C++ runtime's host tests")
    out = tmp_path_factory.mktemp("cpp-host")

    def one(name: str) -> Path:
        obj = out / (Path(name).stem + ".o")
        result = subprocess.run([compiler, *FLAGS, "-c", str(SOURCES / name), "-o", str(obj)],
                                capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, f"{name} does not compile:\n{result.stderr[-3000:]}"
        return obj

    with ThreadPoolExecutor(max_workers=2) as pool:
        objects = list(pool.map(one, HOST_SOURCES))
    binary = out / "dsa_runtime_host_test"
    result = subprocess.run([compiler, *map(str, objects), "-o", str(binary)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    return binary


def _tensor(name: str, dtype: str, shape: list, value_range: list | None = None) -> dict:
    data = {"name": name, "dtype": dtype, "shape": shape}
    if value_range:
        data["value_range"] = value_range
    return data


def write_paged_build(folder: Path) -> Path:
    """A paged build folder of one stage: manifest.json and a stand-in engine file."""
    folder.mkdir(parents=True, exist_ok=True)
    pool = ["pages", 64, 576]
    manifest = {
        "schema_version": 1,
        "inputs": [_tensor("input_ids", "int64", ["batch", "sequence"], [0, 1000]),
                   _tensor("query_start", "int32", ["batch"]), _tensor("query_lengths", "int32", ["batch"]),
                   _tensor("block_table", "int32", ["batch", "max_pages"]),
                   _tensor("past_latent_pool_0", "bfloat16", pool)],
        "outputs": [_tensor("logits", "float32", ["batch", 1000]), _tensor("present_latent_pool_0", "bfloat16", pool)],
        "profiles": {"dims": {"batch": [1, 2, 4], "sequence": [1, 128, 256], "max_pages": [1, 2, 4],
                              "pages": [1, 9, 17]}},
        "engine": {"file": "model.plan", "backend": "tensorrt", "trt_version": "10.15.1.29",
                   "version_compatible": False, "compute_capability": ["9.0"], "hardware_compatibility": "none",
                   "plugin_library_sha256": None, "plugin_library": None},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    (folder / "model.plan").write_bytes(b"ftrt" + bytes(60))
    return folder


def test_host_logic(host_test, tmp_path):
    build = write_paged_build(tmp_path / "paged")
    result = subprocess.run([str(host_test), str(build)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1].endswith(" checks, 0 failed"), result.stdout
    assert "ok   reads a paged build" in lines, result.stdout
    assert not any(line.startswith("FAIL") for line in lines), result.stdout


def test_host_test_reports_a_failure(host_test, tmp_path):
    """A folder that is not a paged build makes the plan-reading test fail, with exit 1."""
    result = subprocess.run([str(host_test), str(tmp_path / "missing")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "FAIL reads a paged build" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("language, standard", [("c++", "c++17"), ("c", "c99")])
def test_public_header_stands_alone(tmp_path, language, standard):
    """include/dsa_runtime.h compiles on its own, without TensorRT or CUDA, as C++ and (its C part) as C."""
    compiler = shutil.which("g++" if language == "c++" else "gcc")
    if compiler is None:
        pytest.fail(f"needs a {language} compiler")
    source = tmp_path / ("use.cpp" if language == "c++" else "use.c")
    source.write_text('#include "dsa_runtime.h"\nint main(void) { return dsa_runtime_error(0)[0] != 0; }\n')
    result = subprocess.run([compiler, f"-std={standard}", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                             "-I", str(SOURCES / "include"), str(source)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
