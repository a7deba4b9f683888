"""ELF DT_NEEDED and fat binary parsing, checked against readelf and a library nvcc builds here."""

from __future__ import annotations

import _ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from dsa_export.compat.binaries import cuda_architectures, elf_needed_libraries

KERNEL = """
__global__ void scale(float* x) { x[threadIdx.x] *= 2.0f; }
extern "C" void launch(float* x) { scale<<<1, 32>>>(x); }
"""


@pytest.fixture(scope="module")
def cuda_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shared library with sm_90 SASS and compute_120 PTX, linked to the shared CUDA runtime."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    folder = tmp_path_factory.mktemp("cudalib")
    source = folder / "scale.cu"
    source.write_text(KERNEL)
    library = folder / "libscale.so"
    subprocess.run(
        [
            "nvcc", "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared",
            "-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_120,code=compute_120",
            str(source), "-o", str(library),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    return library


def _readelf_needed(path: str) -> list[str]:
    output = subprocess.run(
        ["readelf", "-d", path], capture_output=True, text=True, check=True
    ).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in output.splitlines() if "(NEEDED)" in line]


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not installed")
def test_needed_libraries_match_readelf() -> None:
    assert elf_needed_libraries(_ctypes.__file__) == _readelf_needed(_ctypes.__file__)


def test_non_elf_is_rejected(tmp_path: Path) -> None:
    text = tmp_path / "lib.so"
    text.write_text("not a library")
    with pytest.raises(ValueError, match="not an ELF"):
        elf_needed_libraries(text)


def test_cuda_library_architectures_and_runtime(cuda_library: Path) -> None:
    assert cuda_architectures(cuda_library) == {"sass": ["9.0"], "ptx": ["12.0"]}
    needed = elf_needed_libraries(cuda_library)
    assert any(name.startswith("libcudart.so.") for name in needed)


def test_library_without_device_code_has_no_architectures() -> None:
    assert cuda_architectures(_ctypes.__file__) == {"sass": [], "ptx": []}
