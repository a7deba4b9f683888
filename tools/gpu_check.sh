#!/usr/bin/env bash
# One-shot GPU check of the DSA kernels: build for this GPU, run the GPU tests, run the benchmark,
# and write everything under one directory (default: $OUT if set, else ./gpu_check_out).
#
#   tools/gpu_check.sh [OUT_DIR]
#
# Needs: an NVIDIA GPU (sm_80+), the CUDA toolkit (nvcc), cmake >= 3.24, a C++ compiler, Python
# with CUDA torch and pytest. No TensorRT and no network access needed. Budget: about 8 minutes
# on an H200 (build ~1 min, tests ~2 min, benchmark ~4 min, MoE benchmark ~1 min; each step has
# its own timeout, and the later steps shrink or skip themselves when the 8 minutes run short).
# Result: $OUT_DIR/gpu_check.json (summary), build.log, pytest.log, pytest.xml, bench.json, bench.log,
# bench_moe.json, bench_moe.log.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-${OUT:-$PWD/gpu_check_out}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
BUILD_DIR="${DSA_GPU_CHECK_BUILD_DIR:-${TMPDIR:-/tmp}/dsa-gpu-check-build}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
cd "$REPO"

log() { echo "[gpu_check $(($(date +%s) - T0))s] $*" | tee -a "$OUT_DIR/steps.log"; }

# ---- 1. build for the local GPU architecture -------------------------------------------------
ARCH=""
if command -v nvidia-smi >/dev/null 2>&1; then
    ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')"
fi
if [ -z "$ARCH" ]; then
    ARCH="$("$PY" -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}")' 2>/dev/null || echo native)"
fi
NVCC="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
JOBS="$(nproc 2>/dev/null || echo 4)"
log "building kernels for sm_$ARCH with $NVCC into $BUILD_DIR"
BUILD_START=$(date +%s)
# cmake directly (not the CLI) so a missing optional Python package cannot stop the build.
timeout 300 bash -c "cmake -S '$REPO/plugins' -B '$BUILD_DIR' -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER='$NVCC' -DCMAKE_CUDA_ARCHITECTURES='$ARCH' ${TensorRT_INCLUDE_DIR:+-DTensorRT_INCLUDE_DIR=$TensorRT_INCLUDE_DIR} \
    && cmake --build '$BUILD_DIR' -j '$JOBS'" > "$OUT_DIR/build.log" 2>&1
BUILD_RC=$?
if [ "$BUILD_RC" -ne 0 ] && [ -x "$NVCC" ] && [ "$ARCH" != "native" ]; then
    # No usable CMake (missing or older than 3.24): compile the kernel library with nvcc directly.
    log "cmake build failed (rc=$BUILD_RC, see build.log); falling back to a direct nvcc build"
    mkdir -p "$BUILD_DIR"
    timeout 300 "$NVCC" -std=c++17 -O3 -shared -Xcompiler=-fPIC,-fvisibility=hidden,-Wall,-Wextra \
        -gencode "arch=compute_$ARCH,code=[compute_$ARCH,sm_$ARCH]" -cudart static -I "$REPO/plugins" \
        "$REPO/plugins/common/dsaKernelCommon.cpp" "$REPO/plugins/api/dsaKernelsApi.cpp" \
        "$REPO/plugins/dsaIndexerTopKPlugin/dsaIndexerTopKKernel.cu" \
        "$REPO/plugins/dsaSparseAttentionPlugin/dsaSparseAttentionKernel.cu" \
        "$REPO/plugins/dsaMoEExpertsPlugin/dsaMoEExpertsKernel.cu" \
        "$REPO/plugins/dsaMoEExpertsPlugin/dsaMoEExpertsRouting.cu" \
        "$REPO/plugins/dsaMoEExpertsPlugin/dsaMoEExpertsGemm.cu" \
        -o "$BUILD_DIR/libdsa_kernels.so" >> "$OUT_DIR/build.log" 2>&1
    BUILD_RC=$?
    printf '{"cuda_architectures": ["%s"], "built_by": "nvcc fallback", "glue_built": false, "libraries": {"kernels": "libdsa_kernels.so"}}\n' \
        "$ARCH" > "$BUILD_DIR/dsa_build_info.json"
fi
BUILD_S=$(($(date +%s) - BUILD_START))
log "build rc=$BUILD_RC in ${BUILD_S}s"
cp -f "$BUILD_DIR/dsa_build_info.json" "$OUT_DIR/" 2>/dev/null || true
export DSA_EXPORT_PLUGIN_LIB="$BUILD_DIR/libdsa_kernels.so"

# ---- 2. GPU tests ----------------------------------------------------------------------------
TEST_RC=-1
if [ "$BUILD_RC" -eq 0 ]; then
    # The kernel tests and the references they trust; the CPU-only CLI/build tests run in CI.
    TESTS=("$REPO/tests/plugins/test_kernels_gpu.py" "$REPO/tests/plugins/test_reference_cpu.py")
    log "running ${TESTS[*]}"
    timeout 240 "$PY" -m pytest "${TESTS[@]}" -q -rs -p no:cacheprovider \
        --junitxml="$OUT_DIR/pytest.xml" > "$OUT_DIR/pytest.log" 2>&1
    TEST_RC=$?
    log "pytest rc=$TEST_RC"
fi

# ---- 2b. routed-experts (MoE) benchmark: one DeepSeek-V3.2 layer, bf16 and FP8 experts ---------
# Cases run most informative first (decode N=1, prefill N=4096) and stop at --budget-s (about
# 30 s for the quick set), so the benchmark below keeps its time.
MOE_BENCH_RC=-1
ELAPSED=$(($(date +%s) - T0))
if [ "$BUILD_RC" -eq 0 ] && [ "$ELAPSED" -lt 400 ]; then
    MOE_ARGS=(--budget-s $((420 - ELAPSED < 60 ? 420 - ELAPSED : 60)))
    if [ "$ELAPSED" -gt 150 ]; then MOE_ARGS+=(--quick); fi
    log "running the MoE benchmark (${MOE_ARGS[*]})"
    timeout $((450 - ELAPSED < 120 ? 450 - ELAPSED : 120)) "$PY" "$REPO/tools/bench_moe_kernel.py" \
        --out "$OUT_DIR/bench_moe.json" --lib "$DSA_EXPORT_PLUGIN_LIB" "${MOE_ARGS[@]}" > "$OUT_DIR/bench_moe.log" 2>&1
    MOE_BENCH_RC=$?
    log "MoE benchmark rc=$MOE_BENCH_RC"
fi

# ---- 3. benchmark ----------------------------------------------------------------------------
BENCH_RC=-1
if [ "$BUILD_RC" -eq 0 ]; then
    log "running the benchmark"
    BENCH_ARGS=()
    # Keep the whole check inside 8 minutes: fall back to the quick sizes when time is short.
    if [ $(($(date +%s) - T0)) -gt 200 ]; then BENCH_ARGS+=(--quick); fi
    timeout 270 "$PY" "$REPO/tools/bench_plugins.py" --out "$OUT_DIR/bench.json" --lib "$DSA_EXPORT_PLUGIN_LIB" \
        "${BENCH_ARGS[@]}" > "$OUT_DIR/bench.log" 2>&1
    BENCH_RC=$?
    log "benchmark rc=$BENCH_RC"
fi

# ---- 3b. DSA-vs-dense layer benchmark through the kernels (dsa-export bench's cuda backend) --------
# Writes bench_layer.{json,md,png} stating GPU, driver, CUDA and date; the .md is what
# docs/bench_gpu.md should hold. Runs only while the 8-minute budget allows it.
LAYER_RC=-1
if [ "$BUILD_RC" -eq 0 ] && [ $(($(date +%s) - T0)) -lt 330 ]; then
    log "running the layer benchmark"
    timeout 120 "$PY" -m dsa_export.bench.gpu "$OUT_DIR" > "$OUT_DIR/bench_layer.log" 2>&1
    LAYER_RC=$?
    log "layer benchmark rc=$LAYER_RC"
fi

# ---- 4. summary JSON -------------------------------------------------------------------------
"$PY" - "$OUT_DIR" "$ARCH" "$BUILD_RC" "$BUILD_S" "$TEST_RC" "$BENCH_RC" "$(($(date +%s) - T0))" "$LAYER_RC" \
    "$MOE_BENCH_RC" <<'PYEOF'
import json, sys, pathlib, xml.etree.ElementTree as ET
out, arch, build_rc, build_s, test_rc, bench_rc, total_s, layer_rc, moe_rc = sys.argv[1:]
out = pathlib.Path(out)
summary = {"cuda_arch": arch, "build_rc": int(build_rc), "build_s": int(build_s), "pytest_rc": int(test_rc),
           "bench_rc": int(bench_rc), "moe_bench_rc": int(moe_rc), "layer_bench_rc": int(layer_rc),
           "total_s": int(total_s)}
try:
    import torch
    summary["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    summary["torch"] = torch.__version__
except Exception as exc:  # noqa: BLE001
    summary["device_error"] = str(exc)
xml = out / "pytest.xml"
if xml.is_file():
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    summary["pytest"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    summary["pytest_failed"] = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase") if case.find("failure") is not None or case.find("error") is not None
    ]
bench = out / "bench.json"
if bench.is_file():
    data = json.loads(bench.read_text())
    summary["bench_goals"] = data.get("goals", {})
    summary["bench"] = {k: data.get(k) for k in ("sparse_attention", "indexer_topk")}
moe = out / "bench_moe.json"
if moe.is_file():
    data = json.loads(moe.read_text())
    summary["moe_bench_goals"] = data.get("goals", {})
    summary["moe_bench"] = [{k: e.get(k) for k in ("case", "path", "kernel_ms", "kernel_tflops", "weight_gbps",
                                                    "speedup_vs_torch", "error")} for e in data.get("moe_experts", [])]
for name in ("dsa_build_info.json",):
    p = out / name
    if p.is_file():
        summary["build_info"] = json.loads(p.read_text())
(out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
print(json.dumps({k: summary.get(k) for k in ("device", "build_rc", "pytest", "bench_goals", "moe_bench_goals",
                                              "total_s")}, indent=2))
PYEOF
log "done; results in $OUT_DIR/gpu_check.json"
[ "$BUILD_RC" -eq 0 ] && [ "$TEST_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ] && [ "$MOE_BENCH_RC" -le 0 ]
