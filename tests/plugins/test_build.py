"""The plugin CMake project builds with the machine's nvcc (no GPU needed).

CI compiles the kernels and the C ABI for sm_90 only through ``dsa-export plugins build`` (about
20-40 s on 2 cores). When ``TensorRT_INCLUDE_DIR`` points at TensorRT headers the same build also
compiles the IPluginV3 glue, links libdsa_plugins.so and runs the host-only smoke test against it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsa_export.ops.contract import PLUGIN_OPS
from dsa_export.plugins.library import exported_symbols

REPO = Path(__file__).resolve().parents[2]
C_ABI = (
    "dsa_kernels_abi_version",
    "dsa_status_string",
    "dsa_last_error",
    "dsa_indexer_topk",
    "dsa_indexer_topk_workspace_size",
    "dsa_indexer_topk_min_workspace_size",
    "dsa_sparse_attention",
    "dsa_sparse_attention_workspace_size",
    "dsa_moe_experts",
    "dsa_moe_experts_workspace_size",
    "dsa_moe_experts_min_workspace_size",
    "dsa_moe_experts_path",
    "dsa_block_sparse_attention",
    "dsa_block_sparse_attention_path",
    "dsa_indexer_topk_paged",
    "dsa_indexer_topk_paged_fp8",
    "dsa_indexer_topk_paged_workspace_size",
    "dsa_indexer_topk_paged_min_workspace_size",
    "dsa_indexer_topk_set_select_mode",
    "dsa_indexer_topk_set_fp8_mma",
    "dsa_sample_tokens",
    "dsa_paged_cache_write",
)


def _nvcc() -> str | None:
    from dsa_export.cli.plugins_cmd import _find_nvcc

    return _find_nvcc()


def _trt_include() -> Path | None:
    value = os.environ.get("TensorRT_INCLUDE_DIR")
    return Path(value) if value and (Path(value) / "NvInfer.h").is_file() else None


@pytest.fixture(scope="module")
def sm90_build(tmp_path_factory):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    if _nvcc() is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed")
    build_dir = tmp_path_factory.mktemp("dsa-plugins-sm90")
    cmd = [sys.executable, "-m", "dsa_export", "plugins", "build", "--build-dir", str(build_dir),
           "--cuda-arch", "90", "--jobs", "2", "--quiet"]
    trt = _trt_include()
    if trt is not None:
        cmd += ["--tensorrt-include", str(trt)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, f"plugins build failed:\n{proc.stdout}\n{proc.stderr}"
    return build_dir, proc, elapsed


def test_kernels_and_c_abi_compile_for_sm90(sm90_build):
    build_dir, proc, elapsed = sm90_build
    lib = build_dir / "libdsa_kernels.so"
    assert lib.is_file(), proc.stderr
    symbols = set(exported_symbols(lib))
    missing = [s for s in C_ABI if s not in symbols]
    assert not missing, f"C ABI symbols missing from libdsa_kernels.so: {missing}"
    # Only the C ABI is exported (kernels and helpers stay hidden).
    assert all(s.startswith("dsa_") or s.startswith("_") for s in symbols), sorted(symbols)
    info = json.loads((build_dir / "dsa_build_info.json").read_text())
    assert info["cuda_architectures"] == ["90"]
    assert f"kernels\t{lib}" in proc.stdout
    print(f"sm_90 build took {elapsed:.1f} s")


def _our_warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(r"warning", line, re.I) and "/plugins/" in line]


def test_no_compiler_warnings_in_our_sources(sm90_build):
    build_dir, _, _ = sm90_build
    log = (build_dir / "dsa_build.log").read_text()
    assert _our_warnings(log) == []


def test_glue_is_skipped_plainly_without_headers(sm90_build):
    if _trt_include() is not None:
        pytest.skip("TensorRT_INCLUDE_DIR is set, so the glue was built")
    build_dir, proc, _ = sm90_build
    info = json.loads((build_dir / "dsa_build_info.json").read_text())
    assert info["glue_built"] is False
    assert "glue was SKIPPED" in proc.stderr
    assert not (build_dir / "libdsa_plugins.so").exists()


def test_plugin_glue_compiles_against_tensorrt_headers(sm90_build):
    if _trt_include() is None:
        pytest.skip("set TensorRT_INCLUDE_DIR to a TensorRT include/ directory to compile the plugin glue")
    build_dir, _, _ = sm90_build
    info = json.loads((build_dir / "dsa_build_info.json").read_text())
    assert info["glue_built"] is True
    plugin = build_dir / "libdsa_plugins.so"
    symbols = set(exported_symbols(plugin))
    assert {"getCreators", "setLoggerFinder"} <= symbols
    assert symbols <= {"getCreators", "setLoggerFinder"}, f"unexpected exports: {sorted(symbols)}"
    smoke = build_dir / "dsa_plugin_smoke"
    # The static-registration source linked against the build's stand-in libnvinfer
    # (plugins/tests/dsaFakeNvinfer.cpp): loading it must register every creator under "dsa".
    static_check = build_dir / "tests" / "libdsa_plugins_static_check.so"
    assert static_check.is_file(), "the static-registration check library was not built"
    proc = subprocess.run([str(smoke), str(plugin), str(static_check)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 0 failure(s)" in proc.stdout
    for name in PLUGIN_OPS:
        assert f"PASS static registration: ({name}, 1, dsa) is found and reports namespace dsa" in proc.stdout, name
        assert f"PASS static registration: {name} is not registered under the empty namespace" in proc.stdout, name


def test_path_command_describes_the_built_library(sm90_build):
    build_dir, _, _ = sm90_build
    env = dict(os.environ, PYTHONPATH=str(REPO), DSA_EXPORT_PLUGIN_LIB=str(build_dir / "libdsa_kernels.so"))
    proc = subprocess.run([sys.executable, "-m", "dsa_export", "plugins", "path", "--kind", "kernels", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["kind"] == "kernels" and info["missing_symbols"] == []
    assert info["cuda_architectures"] == ["90"]
    assert len(info["sha256"]) == 64


def test_c_abi_loads_and_validates_without_a_gpu(sm90_build):
    """The library loads through the ctypes binding and rejects bad arguments before touching CUDA."""
    import ctypes
    import itertools

    from dsa_export.plugins.kernels import KernelLibrary

    build_dir, _, _ = sm90_build
    kern = KernelLibrary(build_dir / "libdsa_kernels.so")
    raw = kern._lib
    assert raw.dsa_kernels_abi_version() == 6
    assert raw.dsa_status_string(1) == b"invalid argument"
    status = raw.dsa_sparse_attention(None, None, None, None, None, 1, 1, 1, 3, 2, 64, 64, 1, 1.0, 2, None)
    assert status == 1 and b"multiple of Hkv" in raw.dsa_last_error()
    status = raw.dsa_indexer_topk(None, None, None, None, None, 1, 1, 1, 1, 1, 1, 1.0, 1, 7, 0, None, 0, None)
    assert status == 1 and b"dtype" in raw.dsa_last_error()
    status = raw.dsa_block_sparse_attention(None, None, None, None, None, 1, 1, 1, 3, 2, 64, 64, 1, 64, 1.0, 1, 2, None)
    assert status == 1 and b"multiple of Hkv" in raw.dsa_last_error()
    status = raw.dsa_block_sparse_attention(None, None, None, None, None, 1, 1, 1, 4, 2, 64, 64, 1, 0, 1.0, 1, 2, None)
    assert status == 1 and b"block_size" in raw.dsa_last_error()
    # The plugin sizes the workspace for a profile's maximum shapes: the size must be monotone.
    sizes = [1, 3, 100, 4096, 70000]
    ws = kern.indexer_topk_workspace_size
    for (b, s, t), (b2, s2, t2) in itertools.product(itertools.product([1, 2], sizes, sizes), repeat=2):
        if b <= b2 and s <= s2 and t <= t2:
            assert ws(b, s, t, 64, 128, 2048) <= ws(b2, s2, t2, 64, 128, 2048)
    assert ws(1, 16384, 16384, 64, 128, 2048) == 256 << 20
    assert ws(1, 4, 100, 64, 128, 8) >= 4 * 100 * 4
    assert raw.dsa_indexer_topk_min_workspace_size(ctypes.c_int64(100)) == 512


def test_sparse_attention_c_abi_takes_values_from_keys_without_a_gpu(sm90_build):
    """ABI 3: a NULL v (with T > 0) is values from keys; its argument checks run before CUDA."""
    from dsa_export.plugins.kernels import KernelLibrary

    build_dir, _, _ = sm90_build
    raw = KernelLibrary(build_dir / "libdsa_kernels.so")._lib
    fake = 0x10000  # never dereferenced: every call below stops before a launch

    def call(q=fake, k=fake, v=None, B=1, S=2, T=40, H=16, Hkv=1, Dk=64, Dv=32, K=8):
        status = raw.dsa_sparse_attention(q, k, v, fake, fake, B, S, T, H, Hkv, Dk, Dv, K, 1.0, 2, None)
        return status, raw.dsa_last_error().decode()

    status, err = call(Dv=128)
    assert status == 1 and "Dv <= Dk" in err, err
    # Dv <= Dk with a NULL v passes every argument check; the grid limit (Hkv * H > 65535) is the
    # last check before the device is queried, so reaching it proves the NULL v was accepted.
    status, err = call(H=1024, Hkv=128, Dv=64)
    assert status == 2 and "grid limits" in err, err
    status, err = call(H=1024, Hkv=128, Dv=64, v=fake)
    assert status == 2 and "grid limits" in err, err  # the explicit form is unchanged
    status, err = call(k=None)
    assert status == 1 and "null" in err, err
    assert call(B=0, Dv=128)[0] == 0  # nothing to do: success, as before ABI 3


def test_sparse_attention_without_keys_only_zeroes_the_output(sm90_build):
    """T == 0 or K == 0: the launcher zeroes out with cudaMemsetAsync and launches no kernel (the
    kernels' zero-size cp.async copies would take k/v, which TensorRT may bind to null, as source).
    Without a CUDA device the memset is what fails, before any device query."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("reads the memset's failure, which needs a machine without a CUDA device")
    from dsa_export.plugins.kernels import KernelLibrary

    build_dir, _, _ = sm90_build
    raw = KernelLibrary(build_dir / "libdsa_kernels.so")._lib
    fake = 0x10000  # never dereferenced: the memset fails first
    for T, K, k, indices in ((0, 8, None, fake), (40, 0, fake, None)):
        status = raw.dsa_sparse_attention(fake, k, None, indices, fake, 1, 2, T, 16, 1, 64, 32, K, 1.0, 2, None)
        err = raw.dsa_last_error().decode()
        assert status == 4 and "cudaMemsetAsync(DSASparseAttention out)" in err, (T, K, status, err)


def test_moe_c_abi_validates_and_sizes_without_a_gpu(sm90_build):
    """dsa_moe_experts rejects bad arguments before touching CUDA; the workspace sizes are host arithmetic."""
    import itertools

    from dsa_export.plugins.kernels import KernelLibrary

    build_dir, _, _ = sm90_build
    kern = KernelLibrary(build_dir / "libdsa_kernels.so")
    raw = kern._lib
    fake = 0x10000  # never dereferenced: every call below fails validation first
    ws_small = 1024  # one token of these shapes needs 2048 bytes

    def call(*, N=4, K=2, E=4, H=64, I=32, dtype=2, wdt=0, edt=2, bs=128, act=0, path=-1, ws=fake,
             ws_bytes=1 << 20, scales=True):
        s = fake if scales else None
        return raw.dsa_moe_experts(fake, fake, fake, fake, fake, s, s, fake, N, K, E, H, I, dtype, wdt, edt, bs, act,
                                   path, ws, ws_bytes, None)

    def error():
        return raw.dsa_last_error().decode()

    assert call(act=1) == 1 and "activation" in error()
    assert call(dtype=3) == 1 and "dtype" in error()            # FP8 is not an activation type
    assert call(edt=7) == 1 and "dtype" in error()
    assert call(E=0) == 1 and "E=0" in error()
    assert call(E=9000) == 1 and "8192" in error()
    assert call(K=0) == 1 and "K=0" in error()
    assert call(wdt=1) == 1 and "topk_weights" in error()       # fp16 weights with bf16 x
    assert call(edt=1) == 1 and "gate_up/down" in error()       # fp16 experts with bf16 x
    assert call(edt=3, bs=0) == 1 and "block_size" in error()
    assert call(edt=3, scales=False) == 1 and "null" in error()
    assert call(path=4) == 1 and "path" in error()
    assert call(ws=None) == 3 and "workspace" in error()
    assert call(ws_bytes=ws_small) == 3 and "too small" in error()
    assert call(N=0) == 0                                      # nothing to do: success without a device

    size = kern.moe_experts_workspace_size
    # Small shapes: exactly the layout of the README (256-byte aligned tables, act in x's dtype, fp32 slot rows).
    assert size(4, 2, 4, 64, 32, kern_dtype("bf16")) == 3840
    assert size(4, 2, 4, 64, 32, kern_dtype("fp32")) == 3840 + 512
    bf16 = kern_dtype("bf16")
    assert kern.moe_experts_min_workspace_size(2, 4, 64, 32, bf16) == size(1, 2, 4, 64, 32, bf16)
    # DeepSeek-V3.2 width: capped at 1 GiB (about 4K tokens per pass), never below one token.
    assert size(16384, 8, 256, 7168, 2048, kern_dtype("bf16")) == 1 << 30
    one = kern.moe_experts_min_workspace_size(8, 256, 7168, 2048, kern_dtype("bf16"))
    assert 8 * (7168 * 4 + 2048 * 2) < one < 8 * (7168 * 4 + 2048 * 2) + 8192
    assert size(0, 8, 256, 7168, 2048, kern_dtype("bf16")) == one
    # The plugin sizes the workspace for the profile maximum: monotone in every argument.
    grid = list(itertools.product([1, 7, 300, 5000], [1, 8], [4, 256], [64, 7168], [32, 2048]))
    for a, b in itertools.product(grid, repeat=2):
        if all(x <= y for x, y in zip(a, b)):
            assert size(*a, kern_dtype("bf16")) <= size(*b, kern_dtype("bf16")), (a, b)
    assert raw.dsa_moe_experts_workspace_size(4, 2, 4, 64, 32, 9) == 0
    assert size(4, 0, 4, 64, 32, kern_dtype("bf16")) == 0
    # Without a device the path query says so instead of guessing.
    import torch

    if not torch.cuda.is_available():
        assert raw.dsa_moe_experts_path(1, 8, 256, 7168, 2048, 2, 2, 128) == -1


def kern_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]
