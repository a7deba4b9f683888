#!/usr/bin/env bash
# One-shot GPU check of the DSA kernels for a GPU machine with CUDA torch, no TensorRT and no
# network: build for this GPU, run the GPU parity tests, run compute-sanitizer on small cases, run
# the benchmarks (whose outputs are checked against torch), and leave the evidence in one folder.
#
#   tools/gpu_check.sh [OUT_DIR]        (default: $OUT if set, else ./gpu_check_out)
#
# $OUT_DIR/gpu_check.json is rewritten after EVERY step (and once before the first), so a run cut
# short still says what ran: "steps" lists {name, rc, seconds, status, note} with status ok, failed,
# timeout, skipped or pending. Logs: steps.log and one log per step; results: probe.json,
# dsa_build_info.json, pytest.xml or parity.json, memcheck.log + memcheck_cases.json, bench.json,
# bench_moe.json, bench_layer.{json,md}, bench_decode.json.
#
# Step timeouts in seconds (each step also gets KILL_GRACE seconds between TERM and KILL):
#   probe 25, build 110, tests 150, memcheck 50, bench_moe 40, bench 55, bench_layer 30, bench_decode 40
#   sum 500 s + 8 x 3 s grace = 524 s < 540 s (tests/test_gpu_check_script.py checks the sum).
#
# Fallbacks, said at once in steps.log and gpu_check.json ("tools"): no CMake >= 3.24 -> the kernel
# library is compiled with nvcc alone; no pytest -> tools/gpu_parity.py runs the same test cases;
# no compute-sanitizer (PATH, $CUDA_HOME/bin, nvcc's folder, /usr/local/cuda) -> memcheck is
# skipped. Without a GPU every GPU step is skipped within seconds (exit 2); DSA_GPU_CHECK_ARCH=90
# still compiles for that architecture. DSA_GPU_CHECK_FORCE_NVCC=1 takes the nvcc-only build.
# Exit status: 0 when every step that ran passed, 1 when one failed or timed out, 2 without a GPU.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-${OUT:-$PWD/gpu_check_out}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
BUILD_DIR="${DSA_GPU_CHECK_BUILD_DIR:-${TMPDIR:-/tmp}/dsa-gpu-check-build}"
PY="${PYTHON:-python3}"
KILL_GRACE=3
STEP_PLAN="probe:25 build:110 tests:150 memcheck:50 bench_moe:40 bench:55 bench_layer:30 bench_decode:40"
T0=$(date +%s)
STEPS_TSV="$OUT_DIR/steps.tsv"
# A reused OUT_DIR must not lend an earlier run's results to this one.
for f in gpu_check.json probe.json probe.env probe.log dsa_build_info.json build.log pytest.xml pytest.log \
    parity.json parity.log memcheck.log memcheck_cases.json bench.json bench.log bench_moe.json bench_moe.log \
    bench_layer.json bench_layer.md bench_layer.png bench_layer.log bench_decode.json bench_decode.log; do
    rm -f "$OUT_DIR/$f"
done
: > "$STEPS_TSV"
: > "$OUT_DIR/steps.log"
export REPO OUT_DIR BUILD_DIR PY STEP_PLAN STEPS_TSV T0 KILL_GRACE
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
cd "$REPO" || exit 1

log() { echo "[gpu_check $(($(date +%s) - T0))s] $*" | tee -a "$OUT_DIR/steps.log"; }

# ---- the summary, rewritten after every step -------------------------------------------------
write_summary() {
    GC_FINISHED="${1:-0}" "$PY" - 2>>"$OUT_DIR/steps.log" <<'PYEOF' || write_minimal_summary
import json, os, re, time, xml.etree.ElementTree as ET
from pathlib import Path

out = Path(os.environ["OUT_DIR"])
env = os.environ
def read_json(name):
    try:
        return json.loads((out / name).read_text())
    except Exception:  # missing, partial or not JSON yet
        return None

plan = [(p.split(":")[0], int(p.split(":")[1])) for p in env["STEP_PLAN"].split()]
done = {}
for line in (out / "steps.tsv").read_text().splitlines():
    name, rc, secs, status, note = (line.split("\t") + [""] * 5)[:5]
    done[name] = {"name": name, "rc": int(rc), "seconds": int(secs), "status": status, "note": note}
steps = []
for name, limit in plan:
    step = done.get(name, {"name": name, "rc": None, "seconds": 0, "status": "pending", "note": ""})
    steps.append({**step, "timeout_s": limit})
grace = int(env["KILL_GRACE"])
summary = {
    "script": "tools/gpu_check.sh", "out_dir": str(out), "elapsed_s": int(time.time()) - int(env["T0"]),
    "finished": env.get("GC_FINISHED") == "1", "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "timeout_budget_s": sum(l for _, l in plan) + grace * len(plan),
    "steps": steps,
    "tools": {k[3:].lower(): env.get(k, "") for k in ("GC_NVCC", "GC_CMAKE", "GC_PYTEST", "GC_SANITIZER",
                                                      "GC_NVIDIA_SMI", "GC_ARCH")},
    "fallbacks": [f for f in env.get("GC_FALLBACKS", "").split("|") if f],
}
if (probe := read_json("probe.json")) is not None:
    summary["probe"] = probe
if (info := read_json("dsa_build_info.json")) is not None:
    summary["build_info"] = info

# tests: pytest's junit XML, else its -v log (a run killed by its timeout writes no XML), else the runner's JSON
tests = None
xml = out / "pytest.xml"
if xml.is_file():
    try:
        root = ET.parse(xml).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        tests = {"runner": "pytest", "source": "pytest.xml",
                 **{k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")},
                 "failed": [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                            if c.find("failure") is not None or c.find("error") is not None]}
    except Exception as exc:
        tests = {"runner": "pytest", "error": f"unreadable pytest.xml: {exc}"}
elif (out / "pytest.log").is_file():
    outcome = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR)")
    seen = [m.groups() for m in map(outcome.match, (out / "pytest.log").read_text(errors="replace").splitlines()) if m]
    tests = {"runner": "pytest", "source": "pytest.log (no XML: the run did not finish)",
             "passed": sum(s == "PASSED" for _, s in seen), "skipped": sum(s == "SKIPPED" for _, s in seen),
             "failed": [t for t, s in seen if s in ("FAILED", "ERROR")]}
elif (parity := read_json("parity.json")) is not None:
    tests = {"runner": "tools/gpu_parity.py", "source": "parity.json", "finished": parity.get("finished"),
             **parity.get("counts", {}),
             "failed": [t["id"] for t in parity.get("tests", []) if t.get("status") == "failed"]}
if tests is not None:
    summary["tests"] = tests

memlog = out / "memcheck.log"
if memlog.is_file():
    text = memlog.read_text(errors="replace")
    m = re.findall(r"ERROR SUMMARY: (\d+) error", text)
    mem = {"errors": int(m[-1]) if m else None, "tool": "compute-sanitizer --tool memcheck"}
    if not m:
        mem["note"] = "no ERROR SUMMARY line (the run did not finish)"
    cases = read_json("memcheck_cases.json")
    if cases is not None:
        mem["cases"] = cases.get("counts")
        mem["failed_cases"] = [c["case"] for c in cases.get("cases", []) if c.get("status") == "failed"]
    summary["memcheck"] = mem

bench = read_json("bench.json")
if bench is not None:
    summary["bench"] = {
        "finished": bench.get("finished"), "goals": bench.get("goals", {}),
        "invalid_cases": bench.get("invalid_cases", []),
        "all_checked_valid": not bench.get("invalid_cases") and all(
            e.get("valid") is True for e in bench.get("sparse_attention", []) + bench.get("indexer_topk", [])
            if "error" not in e),
        "sparse_attention": [{k: e.get(k) for k in ("case", "path", "plugin_tflops", "plugin_vfk_tflops", "valid",
                                                     "error")} for e in bench.get("sparse_attention", [])],
        "indexer_topk": [{k: e.get(k) for k in ("case", "path", "plugin_ms", "speedup_vs_torch", "valid", "error")}
                         for e in bench.get("indexer_topk", [])],
    }
moe = read_json("bench_moe.json")
if moe is not None:
    summary["moe_bench"] = {
        "finished": moe.get("finished"), "goals": moe.get("goals", {}), "invalid_cases": moe.get("invalid_cases", []),
        "cases": [{k: e.get(k) for k in ("case", "path", "kernel_ms", "kernel_tflops", "weight_gbps",
                                         "speedup_vs_torch", "valid", "error")} for e in moe.get("moe_experts", [])],
    }
if (out / "bench_layer.json").is_file():
    summary["layer_bench"] = {"json": "bench_layer.json", "markdown": "bench_layer.md"}
decode = read_json("bench_decode.json")
if decode is not None:
    summary["decode_bench"] = {
        "copy_bandwidth_gbs": decode.get("copy_bandwidth_gbs"), "invalid_cases": decode.get("invalid_cases", []),
        "skipped": decode.get("skipped", []),
        "cases": [{k: e.get(k) for k in ("case", "splits", "indexer_us", "attention_us", "indexer_of_bandwidth",
                                         "attention_of_bandwidth", "valid", "error")} for e in decode.get("cases", [])],
    }

invalid = (summary.get("bench", {}).get("invalid_cases", []) + summary.get("moe_bench", {}).get("invalid_cases", [])
           + summary.get("decode_bench", {}).get("invalid_cases", []))
if invalid:
    summary["benchmark_results_invalid"] = invalid  # fast but wrong: these timings do not count
bad = [s["name"] for s in steps if s["status"] in ("failed", "timeout")]
summary["failed_steps"] = bad
tmp = out / "gpu_check.json.tmp"
tmp.write_text(json.dumps(summary, indent=2))
os.replace(tmp, out / "gpu_check.json")
PYEOF
}

write_minimal_summary() {  # when Python itself is unusable: the step table only
    {
        printf '{"script": "tools/gpu_check.sh", "note": "python (%s) failed; step table only", "steps": [' "$PY"
        awk -F'\t' 'BEGIN { sep = "" } { printf "%s{\"name\": \"%s\", \"rc\": %s, \"seconds\": %s, \"status\": \"%s\"}", sep, $1, $2, $3, $4; sep = ", " }' "$STEPS_TSV"
        printf ']}\n'
    } > "$OUT_DIR/gpu_check.json"
}

record() {  # record NAME RC SECONDS STATUS NOTE
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5//$'\t'/ }" >> "$STEPS_TSV"
    write_summary
}

skip_step() {  # skip_step NAME REASON
    log "step $1: skipped ($2)"
    record "$1" -1 0 skipped "$2"
}

# run_step NAME TIMEOUT LOG CMD...: runs CMD under `timeout TIMEOUT`, logs to $OUT_DIR/LOG, records.
run_step() {
    local name="$1" limit="$2" logfile="$3" start rc secs status
    shift 3
    log "step $name (timeout ${limit}s): $*"
    start=$(date +%s)
    timeout -k "$KILL_GRACE" "$limit" "$@" > "$OUT_DIR/$logfile" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    case "$rc" in
        0) status=ok ;;
        124 | 137) status=timeout ;;
        *) status=failed ;;
    esac
    log "step $name: $status (rc=$rc, ${secs}s, log $logfile)"
    record "$name" "$rc" "$secs" "$status" "${STEP_NOTE:-}"
    STEP_NOTE=""
    return "$rc"
}

# ---- tools: found in a second, said at once ---------------------------------------------------
FALLBACKS=()
find_first() { local c; for c in "$@"; do if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi; done; return 1; }
NVCC="$(find_first "${CUDACXX:-}" "$(command -v nvcc 2>/dev/null)" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" \
    /usr/local/cuda/bin/nvcc || true)"
CUDA_BIN="$(dirname "${NVCC:-/usr/local/cuda/bin/nvcc}")"
NVCC_REAL_BIN="$(dirname "$(readlink -f "${NVCC:-/usr/local/cuda/bin/nvcc}")")"  # nvcc may be a symlink
# shellcheck disable=SC2046  # the globs are meant to split into candidates
SANITIZER="$(find_first "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer}" \
    "$CUDA_BIN/compute-sanitizer" "$NVCC_REAL_BIN/compute-sanitizer" "$CUDA_BIN/../compute-sanitizer/compute-sanitizer" \
    /usr/local/cuda/bin/compute-sanitizer $(ls -d /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null) || true)"
CMAKE=""
if command -v cmake >/dev/null 2>&1; then
    CMAKE_VERSION="$(cmake --version 2>/dev/null | head -n1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n1)"
    if [ -n "$CMAKE_VERSION" ] && [ "$(printf '3.24\n%s\n' "$CMAKE_VERSION" | sort -V | head -n1)" = "3.24" ]; then
        CMAKE="$(command -v cmake)"
    else
        FALLBACKS+=("cmake ${CMAKE_VERSION:-?} is older than 3.24: nvcc-only build")
    fi
else
    FALLBACKS+=("cmake missing: nvcc-only build")
fi
if [ "${DSA_GPU_CHECK_FORCE_NVCC:-0}" = 1 ] && [ -n "$CMAKE" ]; then
    CMAKE=""
    FALLBACKS+=("DSA_GPU_CHECK_FORCE_NVCC=1: nvcc-only build")
fi
PYTEST=""
if "$PY" -c "import pytest" >/dev/null 2>&1; then
    PYTEST="$("$PY" -c "import pytest; print(pytest.__version__)" 2>/dev/null)"
else
    FALLBACKS+=("pytest missing: the GPU tests run through tools/gpu_parity.py")
fi
[ -n "$NVCC" ] || FALLBACKS+=("nvcc missing: nothing can be built")
[ -n "$SANITIZER" ] || FALLBACKS+=("compute-sanitizer missing: memcheck skipped")
NVIDIA_SMI="$(command -v nvidia-smi 2>/dev/null || true)"
GC_FALLBACKS="$(IFS='|'; echo "${FALLBACKS[*]:-}")"
export GC_NVCC="${NVCC:-missing}" GC_CMAKE="${CMAKE:-missing}" GC_PYTEST="${PYTEST:-missing}" \
    GC_SANITIZER="${SANITIZER:-missing}" GC_NVIDIA_SMI="${NVIDIA_SMI:-missing}" GC_ARCH="" GC_FALLBACKS
log "repo $REPO, out $OUT_DIR, python $PY"
log "nvcc: ${NVCC:-MISSING}; cmake: ${CMAKE:-not used (see FALLBACK)}; pytest: ${PYTEST:-MISSING}; compute-sanitizer: ${SANITIZER:-MISSING}"
for f in ${FALLBACKS[@]+"${FALLBACKS[@]}"}; do log "FALLBACK: $f"; done
write_summary

# ---- 1. probe: GPU, driver, torch ----------------------------------------------------------------
# shellcheck disable=SC2329  # invoked as `bash -c probe_gpu` under timeout
probe_gpu() {
    "$PY" - <<'PYEOF'
import json, os, subprocess
out = os.environ["OUT_DIR"]
info = {"gpu": False}

def save():
    # Written after nvidia-smi and again after torch: if a cold torch import outlasts the step's
    # timeout, nvidia-smi's answer stands and the torch steps report their own errors.
    with open(os.path.join(out, "probe.json"), "w") as f:
        json.dump(info, f, indent=2)
    with open(os.path.join(out, "probe.env"), "w") as f:
        f.write(f"PROBE_GPU={1 if info['gpu'] else 0}\nPROBE_ARCH={info.get('arch', '')}\n")

try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=8)
    info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    first = smi.stdout.strip().splitlines()[0].split(",") if smi.returncode == 0 and smi.stdout.strip() else []
    if len(first) >= 2:
        info.update(arch=first[1].strip().replace(".", ""), gpu=True, gpu_seen_by="nvidia-smi")
except Exception as exc:  # no nvidia-smi, or it hung
    info["nvidia_smi"] = f"unavailable: {exc}"
save()
try:
    import torch
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        info.update(gpu=True, gpu_seen_by="torch", device=torch.cuda.get_device_name(),
                    capability=f"{major}.{minor}", arch=info.get("arch") or f"{major}{minor}")
    else:
        info.update(gpu=False, gpu_seen_by="nobody (torch.cuda.is_available() is False)")
except Exception as exc:  # torch missing or broken: the GPU steps cannot run
    info.update(gpu=False, torch_error=f"{type(exc).__name__}: {exc}")
save()
print(json.dumps(info, indent=2))
PYEOF
}
export -f probe_gpu
rm -f "$OUT_DIR/probe.env"
run_step probe 25 probe.log bash -c probe_gpu
PROBE_GPU=0
PROBE_ARCH=""
# shellcheck disable=SC1091
[ -f "$OUT_DIR/probe.env" ] && . "$OUT_DIR/probe.env"
ARCH="${DSA_GPU_CHECK_ARCH:-$PROBE_ARCH}"
export GC_ARCH="$ARCH"
if [ "$PROBE_GPU" = 1 ]; then
    log "GPU: $(grep -o '"device": "[^"]*"' "$OUT_DIR/probe.json" | head -n1) sm_$ARCH"
else
    log "NO GPU visible to torch (see probe.log); GPU steps are skipped"
fi

# ---- 2. build the kernel library for this GPU ------------------------------------------------------
# shellcheck disable=SC2329  # invoked as `bash -c build_kernels` under timeout
build_kernels() {
    set -o pipefail
    local jobs="${DSA_GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 4)}"
    if [ -n "$CMAKE" ]; then
        echo "== cmake build for sm_$ARCH"
        if "$CMAKE" -S "$REPO/plugins" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" \
            -DCMAKE_CUDA_ARCHITECTURES="$ARCH" ${TensorRT_INCLUDE_DIR:+-DTensorRT_INCLUDE_DIR="$TensorRT_INCLUDE_DIR"} \
            && "$CMAKE" --build "$BUILD_DIR" -j "$jobs"; then
            return 0
        fi
        echo "== cmake build failed; compiling with nvcc alone"
    fi
    echo "== nvcc-only build for sm_$ARCH (one process per source)"
    local objdir="$BUILD_DIR/nvcc-objects" src obj rc=0
    local -a pids=() objs=()
    mkdir -p "$objdir"
    for src in common/dsaKernelCommon.cpp api/dsaKernelsApi.cpp dsaIndexerTopKPlugin/dsaIndexerTopKKernel.cu \
        dsaSparseAttentionPlugin/dsaSparseAttentionKernel.cu dsaMoEExpertsPlugin/dsaMoEExpertsKernel.cu \
        dsaMoEExpertsPlugin/dsaMoEExpertsRouting.cu dsaMoEExpertsPlugin/dsaMoEExpertsGemm.cu; do
        obj="$objdir/$(basename "$src").o"
        if [ "${#pids[@]}" -ge "$jobs" ]; then  # at most $jobs compilers at once
            wait "${pids[0]}" || rc=1
            pids=("${pids[@]:1}")
        fi
        [ "$rc" -eq 0 ] || break  # a source failed: start no more
        "$NVCC" -std=c++17 -O3 -c -Xcompiler=-fPIC,-fvisibility=hidden,-Wall,-Wextra --expt-relaxed-constexpr \
            -lineinfo -gencode "arch=compute_$ARCH,code=[compute_$ARCH,sm_$ARCH]" -I "$REPO/plugins" \
            "$REPO/plugins/$src" -o "$obj" &
        pids+=("$!")
        objs+=("$obj")
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    [ "$rc" -eq 0 ] || return 1
    "$NVCC" -shared -cudart static -gencode "arch=compute_$ARCH,code=[compute_$ARCH,sm_$ARCH]" "${objs[@]}" \
        -o "$BUILD_DIR/libdsa_kernels.so" || return 1
    printf '{"cuda_architectures": ["%s"], "built_by": "nvcc only (tools/gpu_check.sh)", "glue_built": false, "libraries": {"kernels": "libdsa_kernels.so"}}\n' \
        "$ARCH" > "$BUILD_DIR/dsa_build_info.json"
}
export -f build_kernels
export NVCC CMAKE ARCH
LIB="$BUILD_DIR/libdsa_kernels.so"
export DSA_EXPORT_PLUGIN_LIB="$LIB"
BUILD_OK=0
if [ -z "$NVCC" ]; then
    skip_step build "nvcc not found (CUDACXX, PATH, CUDA_HOME, /usr/local/cuda)"
elif [ -z "$ARCH" ]; then
    skip_step build "no GPU to build for (set DSA_GPU_CHECK_ARCH=90 to compile anyway)"
else
    rm -f "$LIB" "$BUILD_DIR/dsa_build_info.json"
    mkdir -p "$BUILD_DIR"
    if [ -n "$CMAKE" ]; then STEP_NOTE="sm_$ARCH, cmake"; else STEP_NOTE="sm_$ARCH, nvcc only"; fi
    if run_step build 110 build.log bash -c build_kernels && [ -f "$LIB" ]; then
        BUILD_OK=1
        WARNINGS="$(grep -ci 'warning' "$OUT_DIR/build.log" || true)"
        log "built $LIB ($WARNINGS lines mentioning warnings in build.log)"
    fi
    cp -f "$BUILD_DIR/dsa_build_info.json" "$OUT_DIR/" 2>/dev/null || true
    write_summary
fi

# ---- 3. GPU parity tests ---------------------------------------------------------------------------
TEST_MODULES=("$REPO/tests/plugins/test_kernels_gpu.py" "$REPO/tests/plugins/test_paged_attention_gpu.py"
    "$REPO/tests/plugins/test_paged_indexer_gpu.py" "$REPO/tests/plugins/test_sampling_gpu.py"
    "$REPO/tests/plugins/test_reference_cpu.py")
if [ -n "$PYTEST" ]; then
    TEST_LOG=pytest.log
    TEST_NOTE="pytest $PYTEST"
    TEST_CMD=("$PY" -m pytest "${TEST_MODULES[@]}" -v -rs -p no:cacheprovider --junitxml="$OUT_DIR/pytest.xml")
else
    TEST_LOG=parity.log
    TEST_NOTE="tools/gpu_parity.py (no pytest)"
    TEST_CMD=("$PY" "$REPO/tools/gpu_parity.py" --out "$OUT_DIR/parity.json" --lib "$LIB" --require-gpu)
fi
if [ "$PROBE_GPU" != 1 ]; then
    skip_step tests "no GPU"
elif [ "$BUILD_OK" != 1 ]; then
    skip_step tests "the build failed"
else
    STEP_NOTE="$TEST_NOTE"
    run_step tests 150 "$TEST_LOG" "${TEST_CMD[@]}"
fi

# ---- 4. compute-sanitizer memcheck on small cases ------------------------------------------------
if [ "$PROBE_GPU" != 1 ]; then
    skip_step memcheck "no GPU"
elif [ "$BUILD_OK" != 1 ]; then
    skip_step memcheck "the build failed"
elif [ -z "$SANITIZER" ]; then
    skip_step memcheck "compute-sanitizer not found (PATH, CUDA_HOME, nvcc's folder, /usr/local/cuda)"
else
    # Without torch's caching allocator every tensor is its own allocation, so reads past a tensor
    # are reported instead of landing in a neighbour inside a pooled block.
    STEP_NOTE="$SANITIZER"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 run_step memcheck 50 memcheck.log "$SANITIZER" --tool memcheck \
        --print-limit 50 --error-exitcode 9 "$PY" "$REPO/tools/gpu_parity.py" --memcheck-cases \
        --out "$OUT_DIR/memcheck_cases.json" --lib "$LIB"
fi

# ---- 5. benchmarks (each output spot-checked against torch; a wrong one makes the result invalid) --
if [ "$PROBE_GPU" != 1 ] || [ "$BUILD_OK" != 1 ]; then
    for step in bench_moe bench bench_layer bench_decode; do
        skip_step "$step" "$([ "$PROBE_GPU" != 1 ] && echo "no GPU" || echo "the build failed")"
    done
else
    run_step bench_moe 40 bench_moe.log "$PY" "$REPO/tools/bench_moe_kernel.py" --out "$OUT_DIR/bench_moe.json" \
        --lib "$LIB" --quick --budget-s 30
    run_step bench 55 bench.log "$PY" "$REPO/tools/bench_plugins.py" --out "$OUT_DIR/bench.json" --lib "$LIB" --quick
    # The DSA-vs-dense layer through the kernels (dsa-export bench's cuda backend): bench_layer.md
    # is what docs/bench_gpu.md should hold.
    run_step bench_layer 30 bench_layer.log "$PY" -m dsa_export.bench.gpu "$OUT_DIR" --seq 4096,16384 --repeats 3
    # One layer's decode over paged caches (bf16 and FP8 layouts; batch 1, 8, 64 x 8K, 32K, 128K):
    # time per step next to the bytes it must read and this GPU's copy bandwidth.
    run_step bench_decode 40 bench_decode.log "$PY" "$REPO/tools/bench_decode_kernels.py" \
        --out "$OUT_DIR/bench_decode.json" --lib "$LIB" --budget-s 30
fi

# ---- done ------------------------------------------------------------------------------------------
write_summary 1
log "done in $(($(date +%s) - T0))s; summary $OUT_DIR/gpu_check.json"
if [ "$PROBE_GPU" != 1 ]; then
    exit 2
fi
if awk -F'\t' '$4 == "failed" || $4 == "timeout" { bad = 1 } END { exit !bad }' "$STEPS_TSV"; then
    exit 1
fi
exit 0
