"""Fixtures of the plugin tests: the CUDA kernel library when a GPU and a build are present."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cuda_kernels():
    """The loaded libdsa_kernels.so, or a skip that says what is missing."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)")
    from dsa_export.plugins import find_library

    path = find_library("kernels")
    if path is None:
        pytest.skip(
            "libdsa_kernels.so is not built; run `dsa-export plugins build --cuda-arch native` or "
            "tools/gpu_check.sh (or set DSA_EXPORT_PLUGIN_LIB)"
        )
    from dsa_export.plugins.kernels import load_kernels

    return load_kernels(path)
