"""tools/cpp_runtime: the pipeline plan is checked for real; the TensorRT runner is compiled.

- ``dsa_pipeline_check`` (check_pipeline.cpp + pipeline/json/engine_gate.cpp, plain C++17, built
  here with g++) reads pipeline.json fixtures the way ``dsa_runtime`` does: good pipelines are
  accepted, bad ones refused with one ``Error: ...`` line and exit 1. Its version gate is compared
  case by case with the Python engine gate's rule.
- With ``TensorRT_INCLUDE_DIR`` set (TensorRT 10/11 headers) the runner's sources compile to
  object files with -Wall -Wextra -Werror, and link against the CUDA runtime plus a stub
  libnvinfer (the three TensorRT symbols it imports); the linked binary runs up to the point where it
  needs a GPU. Nothing here runs an engine or uses a GPU: see tools/cpp_runtime/README.md.
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
PLAN_SOURCES = ("pipeline.cpp", "json.cpp", "engine_gate.cpp")
RUNNER_SOURCES = ("main.cpp", "runner.cpp", "engine_io.cpp", "generate.cpp", "dsa_runtime.cpp", "paged_engine.cpp",
                  "host_math.cpp", "scheduler.cpp", "paged_plan.cpp")
#: The runtime library (include/dsa_runtime.h): what an application links besides the plan's objects.
LIBRARY_SOURCES = ("dsa_runtime.cpp", "paged_engine.cpp", "engine_io.cpp", "host_math.cpp", "scheduler.cpp",
                   "paged_plan.cpp")
FLAGS = ("-std=c++17", "-Wall", "-Wextra", "-Werror")
HIDDEN = 64


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")


def _compile(compiler: str, sources: list[Path], out_dir: Path, extra: tuple[str, ...] = ()) -> list[Path]:
    """Object files of ``sources`` (two at a time, this machine has two cores)."""

    def one(source: Path) -> Path:
        obj = out_dir / (source.stem + ".o")
        result = subprocess.run([compiler, *FLAGS, "-O0", *extra, "-c", str(source), "-o", str(obj)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{source.name} does not compile:\n{result.stderr[-3000:]}"
        return obj

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, sources))


@pytest.fixture(scope="module")
def plan_objects(tmp_path_factory) -> tuple[str, list[Path], Path]:
    compiler = _compiler()
    if compiler is None:
        pytest.skip("needs g++ (or $CXX) to build the C++ pipeline checker")
    out = tmp_path_factory.mktemp("cpp-plan")
    objects = _compile(compiler, [SOURCES / s for s in (*PLAN_SOURCES, "check_pipeline.cpp")], out)
    return compiler, objects, out


@pytest.fixture(scope="module")
def checker(plan_objects) -> Path:
    compiler, objects, out = plan_objects
    binary = out / "dsa_pipeline_check"
    result = subprocess.run([compiler, *map(str, objects), "-o", str(binary)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    return binary


# ---------------------------------------------------------------------------------------------
# fixtures: build folders and pipeline.json as dsa_export.manifest writes them


def _tensor(name: str, dtype: str, shape: list, value_range: list | None = None) -> dict:
    data = {"name": name, "dtype": dtype, "shape": shape}
    if value_range:
        data["value_range"] = value_range
    return data


def write_stage(root: Path, index: int, *, first: bool = False, last: bool = False, hidden: int = HIDDEN,
                dtype: str = "float32", profile_seq: tuple[int, int, int] = (1, 128, 256), engine: dict | None = None,
                glm: bool = False, folder: str | None = None) -> Path:
    """One stage's build folder: manifest.json and a stand-in engine file (a plan tag and zeros)."""
    stage = root / (folder or f"stage_{index:02d}")
    stage.mkdir(parents=True, exist_ok=True)
    inputs = ([_tensor("input_ids", "int64", ["batch", "sequence"], [0, 1000])] if first
              else [_tensor("hidden_states", dtype, ["batch", "sequence", hidden])])
    inputs.append(_tensor("attention_mask", "int64", ["batch", "sequence"], [0, 2]))
    if glm and not first:
        inputs.append(_tensor("prev_topk_indices", "int32", ["batch", "sequence", 16]))
    outputs = ([_tensor("logits", "float32", ["batch", "sequence", 1000])] if last
               else [_tensor("hidden_states_out", dtype, ["batch", "sequence", hidden])])
    if glm and not last:
        outputs.append(_tensor("topk_indices", "int32", ["batch", "sequence", 16]))
    section = {"file": "model.plan", "backend": "tensorrt", "trt_version": "10.15.1.29", "version_compatible": False,
               "compute_capability": ["9.0"], "hardware_compatibility": "none", "plugin_library_sha256": None,
               "plugin_library": None}
    section.update(engine or {})
    manifest = {"schema_version": 1, "inputs": inputs, "outputs": outputs,
                "profiles": {"dims": {"batch": [1, 1, 4], "sequence": list(profile_seq)}}, "engine": section}
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    if isinstance(section.get("file"), str):
        (stage / section["file"]).write_bytes(b"ftrt" + bytes(60))
    return stage


def write_pipeline(root: Path, stages: list[dict], links: list[dict] | None = None, **extra) -> Path:
    data = {"format": "dsa-export-pipeline", "version": 1, "tool_version": "test", "model_type": "deepseek_v32",
            "num_layers": 2 * len(stages), "graph": "prefill", "stages": stages, "links": links or []}
    data.update(extra)
    path = root / "pipeline.json"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def _hidden_links(n: int) -> list[dict]:
    return [{"from": i, "to": i + 1, "output": "hidden_states_out", "input": "hidden_states"} for i in range(n - 1)]


def good_pipeline(root: Path, n: int = 2, devices: list[int | None] | None = None, **stage_args) -> Path:
    entries = []
    for i in range(n):
        write_stage(root, i, first=i == 0, last=i == n - 1, **stage_args)
        entry = {"index": i, "layers": [2 * i, 2 * i + 2], "build": f"stage_{i:02d}"}
        if devices is not None and devices[i] is not None:
            entry["device"] = devices[i]
        entries.append(entry)
    return write_pipeline(root, entries, _hidden_links(n))


def check(binary: Path, path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), str(path), *args], capture_output=True, text=True, timeout=30)


def refused(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """The single error line, after checking the exit code and that it names ``fragments``."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------------------------------------
# accepted


def test_accepts_a_two_stage_pipeline_on_two_gpus(checker, tmp_path):
    path = good_pipeline(tmp_path, devices=[0, 1])
    result = check(checker, tmp_path, "--devices", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"pipeline {path}: 2 stages, 1 link" in out
    assert "stage 1 (stage_01) on GPU 1" in out
    assert f"input  hidden_states [1, 128, {HIDDEN}] float32 <- stage 0.hidden_states_out" in out
    assert "input  input_ids [1, 128] int64" in out
    assert "link 0.hidden_states_out -> 1.hidden_states: GPU 0 -> GPU 1" in out
    assert out.rstrip().endswith("OK")
    # pipeline.json itself is accepted as well as its folder.
    assert check(checker, path, "--devices", "2").returncode == 0


def test_default_device_is_the_stage_index_modulo_the_gpu_count(checker, tmp_path):
    path = good_pipeline(tmp_path, n=3)
    data = json.loads(path.read_text())
    data["stages"][2]["device"] = None  # as a missing "device"
    path.write_text(json.dumps(data))
    result = check(checker, tmp_path, "--devices", "2")
    assert result.returncode == 0, result.stderr
    assert "stage 0 (stage_00) on GPU 0" in result.stdout
    assert "stage 1 (stage_01) on GPU 1" in result.stdout
    assert "stage 2 (stage_02) on GPU 0" in result.stdout


def test_glm_topk_link_and_dim_override(checker, tmp_path):
    for i in range(2):
        write_stage(tmp_path, i, first=i == 0, last=i == 1, glm=True)
    links = _hidden_links(2) + [{"from": 0, "to": 1, "output": "topk_indices", "input": "prev_topk_indices"}]
    write_pipeline(tmp_path, [{"index": 0}, {"index": 1}], links)
    result = check(checker, tmp_path, "--dim", "sequence=200")
    assert result.returncode == 0, result.stderr
    assert "input  prev_topk_indices [1, 200, 16] int32 <- stage 0.topk_indices" in result.stdout
    assert "same GPU, no copy" in result.stdout


def test_reads_the_pipeline_json_dsa_export_writes(checker, tmp_path):
    """pipeline.json written by dsa_export.manifest (the schema the stage build uses), not by hand."""
    from dsa_export.manifest import TensorSpec
    from dsa_export.stages.record import Pipeline, StageFiles, StageLink

    stages = []
    for i in range(2):
        folder = write_stage(tmp_path, i, first=i == 0, last=i == 1)
        manifest = json.loads((folder / "manifest.json").read_text())
        stages.append(StageFiles(
            index=i, layers=(i, i + 1), embed=i == 0, head=i == 1, onnx=f"export/stage_{i:02d}/model.onnx", data=None,
            sha256={}, sizes={}, inputs=[TensorSpec.from_dict(t) for t in manifest["inputs"]],
            outputs=[TensorSpec.from_dict(t) for t in manifest["outputs"]], weight_bytes=0, checkpoint_bytes=0,
            key="k", plan={}, build=folder.name, device=1 - i, build_key="b"))
    links = [StageLink(0, 1, "hidden_states_out", "hidden_states")]
    pipeline = Pipeline(model={}, model_type="deepseek_v32", num_layers=2, graph="prefill", settings={}, plan={},
                        stages=stages, links=links, tool_version="test")
    (tmp_path / "pipeline.json").write_text(json.dumps(pipeline.to_dict()), encoding="utf-8")
    result = check(checker, tmp_path, "--devices", "2")
    assert result.returncode == 0, result.stderr
    assert "stage 0 (stage_00) on GPU 1" in result.stdout and "stage 1 (stage_01) on GPU 0" in result.stdout
    assert "link 0.hidden_states_out -> 1.hidden_states: GPU 1 -> GPU 0" in result.stdout


def test_single_build_folder_manifest_and_engine_path(checker, tmp_path):
    stage = write_stage(tmp_path, 0, first=True, last=True, folder="build")
    for path in (stage, stage / "manifest.json", stage / "model.plan"):
        result = check(checker, path)
        assert result.returncode == 0, result.stderr
        assert "1 stage, 0 links" in result.stdout and "the engine on GPU 0" in result.stdout
    refused(check(checker, stage, "--device", "1"), "the engine asks for GPU 1 but 1 GPU is visible")


# ---------------------------------------------------------------------------------------------
# refused, one line each


def test_missing_stage_engine(checker, tmp_path):
    good_pipeline(tmp_path)
    (tmp_path / "stage_01" / "model.plan").unlink()
    refused(check(checker, tmp_path), "stage 1 (stage_01): the engine file", "model.plan does not exist")


def test_missing_stage_build(checker, tmp_path):
    good_pipeline(tmp_path)
    shutil.rmtree(tmp_path / "stage_01")
    refused(check(checker, tmp_path), "stage_01/manifest.json does not exist")


def test_stage_without_engine(checker, tmp_path):
    good_pipeline(tmp_path)
    manifest = tmp_path / "stage_00" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["engine"] = None
    manifest.write_text(json.dumps(data))
    refused(check(checker, tmp_path), "stage 0 (stage_00):", "holds no engine")


def test_device_index_past_the_gpu_count(checker, tmp_path):
    good_pipeline(tmp_path, devices=[0, 2])
    refused(check(checker, tmp_path, "--devices", "2"),
            "stage 1 (stage_01) asks for GPU 2 but 2 GPUs are visible (0..1)")


def test_no_gpu(checker, tmp_path):
    good_pipeline(tmp_path)
    refused(check(checker, tmp_path, "--devices", "0"), "no CUDA GPU is visible")


@pytest.mark.parametrize("field, value, message", [
    ("output", "hidden",
     "names the unknown tensor 'hidden': stage 0 (stage_00)'s engine has the outputs hidden_states_out"),
    ("input", "hidden",
     "names the unknown tensor 'hidden': stage 1 (stage_01)'s engine has the inputs hidden_states, attention_mask"),
    ("to", 5, "names stage 5, but the pipeline has stages 0..1"),
    ("from", 1, "does not feed a later stage"),
])
def test_bad_links(checker, tmp_path, field, value, message):
    path = good_pipeline(tmp_path)
    data = json.loads(path.read_text())
    data["links"][0][field] = value
    path.write_text(json.dumps(data))
    refused(check(checker, tmp_path), message)


def test_input_fed_twice(checker, tmp_path):
    path = good_pipeline(tmp_path)
    data = json.loads(path.read_text())
    data["links"].append(dict(data["links"][0]))
    path.write_text(json.dumps(data))
    refused(check(checker, tmp_path), "feeds an input that 0.hidden_states_out -> 1.hidden_states already feeds")


def test_shape_mismatch_on_a_fixed_dim(checker, tmp_path):
    good_pipeline(tmp_path)
    write_stage(tmp_path, 1, last=True, hidden=32)
    refused(check(checker, tmp_path),
            f"shape mismatch on link 0.hidden_states_out -> 1.hidden_states: the output is [1, 128, {HIDDEN}] but "
            "stage 1 (stage_01)'s input 'hidden_states' is [batch, sequence, 32] (axis 2 is 64, not 32)")


def test_shape_mismatch_outside_the_next_stage_profile(checker, tmp_path):
    good_pipeline(tmp_path)
    write_stage(tmp_path, 1, last=True, profile_seq=(1, 64, 100))
    refused(check(checker, tmp_path), "shape mismatch on link 0.hidden_states_out -> 1.hidden_states",
            "sequence 128 is outside that engine's profile 1..100")
    # Within both profiles it is accepted.
    assert check(checker, tmp_path, "--dim", "sequence=90").returncode == 0


def test_dtype_mismatch(checker, tmp_path):
    good_pipeline(tmp_path)
    write_stage(tmp_path, 1, last=True, dtype="float16")
    refused(check(checker, tmp_path), "joins tensors of different types: stage 0 (stage_00) gives float32 but "
                                      "stage 1 (stage_01) takes float16")


def test_dim_outside_profile_for_the_first_stage(checker, tmp_path):
    good_pipeline(tmp_path)
    refused(check(checker, tmp_path, "--dim", "sequence=4096"),
            "stage 0 (stage_00)'s input 'input_ids' has sequence 4096 (axis 1), outside its optimization profile")


def test_build_folder_outside_the_pipeline_folder(checker, tmp_path):
    inner = tmp_path / "pipe"
    inner.mkdir()
    write_stage(tmp_path, 0, first=True, last=True, folder="elsewhere")
    write_pipeline(inner, [{"index": 0, "build": "../elsewhere"}])
    refused(check(checker, inner), "stages[0].build is '../elsewhere', which leads out of")


def test_not_a_pipeline_or_broken_json(checker, tmp_path):
    path = good_pipeline(tmp_path)
    path.write_text('{"format": "dsa-export-pipeline", "stages": [')
    refused(check(checker, tmp_path), "pipeline.json is not valid JSON")
    path.write_text(json.dumps({"format": "something-else"}))
    refused(check(checker, tmp_path), "is not a dsa-export pipeline file")
    write_pipeline(tmp_path, [{"index": 1}])
    refused(check(checker, tmp_path), "lists stage 1 at position 0")


def test_stages_with_different_plugin_libraries(checker, tmp_path):
    write_stage(tmp_path, 0, first=True, engine={"plugin_library_sha256": "a" * 64})
    write_stage(tmp_path, 1, last=True, engine={"plugin_library_sha256": "b" * 64})
    write_pipeline(tmp_path, [{"index": 0}, {"index": 1}], _hidden_links(2))
    refused(check(checker, tmp_path), "stage 1 (stage_01) was built with another DSA plugin library")


def test_a_plan_that_carries_its_plugin_library_needs_no_shared_one(checker, tmp_path):
    """``plugins_serialized`` (version-compatible plans only, as engine_gate reads it): TensorRT
    loads the library from the plan, so it does not count as the process's plugin library."""
    write_stage(tmp_path, 0, first=True, engine={"plugin_library_sha256": "a" * 64, "version_compatible": True,
                                                 "plugins_serialized": True})
    write_stage(tmp_path, 1, last=True, engine={"plugin_library_sha256": "b" * 64})
    write_pipeline(tmp_path, [{"index": 0}, {"index": 1}], _hidden_links(2))
    result = check(checker, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "version compatible, DSA plugins serialized in the plan" in result.stdout
    # Without the version-compatible flag the field is ignored, as in the Python gate.
    write_stage(tmp_path, 0, first=True, engine={"plugin_library_sha256": "a" * 64, "plugins_serialized": True})
    refused(check(checker, tmp_path), "was built with another DSA plugin library")


def test_usage_errors_exit_2(checker, tmp_path):
    good_pipeline(tmp_path)
    for args in (("--dim", "sequence"), ("--frobnicate",)):
        result = check(checker, tmp_path, *args)
        assert result.returncode == 2 and result.stderr.startswith("Error: "), result.stderr


# ---------------------------------------------------------------------------------------------
# the version and GPU gate, against the Python engine gate

VERSION_CASES = [
    # (engine trt_version, linked runtime, version_compatible)
    ("10.15.1", "10.15.1", False),
    ("10.15.1", "10.15.2", False),
    ("10.15.1", "10.16.0", True),
    ("10.16.0", "10.15.1", True),
    ("10.15.1", "11.1.0", True),   # the issue: a version-compatible TensorRT 10 engine under TensorRT 11
    ("10.15.1", "11.1.0", False),
    ("11.1.0", "10.15.1", True),
    ("8.5.3", "8.6.1", True),      # version compatibility needs an 8.6+ builder
    ("8.6.1", "10.3.0", True),
    ("9.2.0", "11.1.0", True),     # two majors apart: not documented
    ("10.15.1", "12.0.0", True),
]


@pytest.mark.parametrize("engine, runtime, compatible", VERSION_CASES)
def test_version_gate_matches_the_python_gate(checker, tmp_path, engine, runtime, compatible):
    from dsa_export.compat.engine_gate import _runtime_accepts
    from dsa_export.compat.versions import parse_version

    expected = _runtime_accepts(parse_version(engine), parse_version(runtime), compatible, "tensorrt")
    stage = write_stage(tmp_path, 0, first=True, last=True, folder="build",
                        engine={"trt_version": engine + ".29", "version_compatible": compatible})
    result = check(checker, stage, "--runtime-version", runtime)
    if expected:
        assert result.returncode == 0, result.stderr
    else:
        how = "version-compatible " if compatible else ""
        refused(result, f"refusing to load the engine: the {how}engine was built with TensorRT {engine}.29 and "
                        f"cannot be loaded by the linked TensorRT {runtime}")


def test_version_gate_of_each_stage(checker, tmp_path):
    write_stage(tmp_path, 0, first=True, engine={"version_compatible": True})
    write_stage(tmp_path, 1, last=True)
    write_pipeline(tmp_path, [{"index": 0}, {"index": 1}], _hidden_links(2))
    refused(check(checker, tmp_path, "--runtime-version", "11.1.0"), "refusing to load stage 1 (stage_01)")


@pytest.mark.parametrize("built, hardware, gpu, ok", [
    (["9.0"], "none", "9.0", True),
    (["9.0"], "none", "8.9", False),
    (["9.0"], "ampere_plus", "8.0", True),
    (["9.0"], "ampere_plus", "7.5", False),
    ([], "none", "7.5", True),
])
def test_compute_capability_gate(checker, tmp_path, built, hardware, gpu, ok):
    stage = write_stage(tmp_path, 0, first=True, last=True, folder="build",
                        engine={"compute_capability": built, "hardware_compatibility": hardware})
    result = check(checker, stage, "--compute-capability", gpu)
    if ok:
        assert result.returncode == 0, result.stderr
    else:
        refused(result, "refusing to load the engine: the engine was built for", f"is {gpu}")


# ---------------------------------------------------------------------------------------------
# the TensorRT runner: compiled (and linked with a stub libnvinfer), never run on a GPU here


def _trt_include() -> Path | None:
    value = os.environ.get("TensorRT_INCLUDE_DIR")
    return Path(value) if value and (Path(value) / "NvInfer.h").is_file() else None


def _cuda_root() -> Path | None:
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "include" / "cuda_runtime_api.h").is_file():
            return Path(root)
    return None


@pytest.fixture(scope="module")
def runner_objects(plan_objects) -> tuple[str, list[Path], Path, Path]:
    include = _trt_include()
    if include is None:
        pytest.skip("set TensorRT_INCLUDE_DIR to a folder with NvInfer.h (TensorRT 10/11 headers)")
    cuda = _cuda_root()
    if cuda is None:
        pytest.skip("needs the CUDA runtime headers (CUDA_HOME or /usr/local/cuda)")
    compiler, _objects, out = plan_objects
    objects = _compile(compiler, [SOURCES / s for s in RUNNER_SOURCES], out,
                       ("-I", str(SOURCES / "include"), "-isystem", str(include), "-isystem", str(cuda / "include")))
    return compiler, objects, out, cuda


def _stub_nvinfer(compiler: str, cuda: Path, where: Path) -> Path:
    """libnvinfer.so in ``where`` defining only the three symbols the runtime imports; returns
    the CUDA toolkit's library folder (skips when it has no libcudart.so)."""
    libdir = next((cuda / d for d in ("lib64", "lib", "targets/x86_64-linux/lib")
                   if (cuda / d / "libcudart.so").exists()), None)
    if libdir is None:
        pytest.skip("libcudart.so not found under the CUDA toolkit")
    stub_src = where / "nvinfer_stub.cpp"
    stub_src.write_text('#include <cstdint>\n'
                        'extern "C" void* createInferRuntime_INTERNAL(void*, int32_t) { return nullptr; }\n'
                        'extern "C" int32_t getInferLibVersion() { return 110100; }\n'
                        'extern "C" void* getPluginRegistry() { return nullptr; }\n')
    result = subprocess.run([compiler, "-shared", "-fPIC", str(stub_src), "-o", str(where / "libnvinfer.so")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return libdir


def test_runner_compiles_against_tensorrt_headers(runner_objects):
    _compiler, objects, _out, _cuda = runner_objects
    assert all(o.is_file() and o.stat().st_size > 0 for o in objects)


def test_runner_links_and_stops_cleanly_without_a_gpu(runner_objects, plan_objects, tmp_path):
    """Linked against libcudart and a stub for the three symbols it takes from libnvinfer
    (createInferRuntime_INTERNAL, getInferLibVersion, getPluginRegistry): everything else resolves. Without a GPU
    (or driver) it stops at cudaGetDeviceCount with one error line."""
    compiler, objects, out, cuda = runner_objects
    _compiler, plan_objs, _out = plan_objects
    libdir = _stub_nvinfer(compiler, cuda, tmp_path)
    binary = tmp_path / "dsa_runtime"
    plan_only = [o for o in plan_objs if o.stem != "check_pipeline"]
    result = subprocess.run([compiler, *map(str, objects), *map(str, plan_only), "-o", str(binary), f"-L{tmp_path}",
                             "-lnvinfer", f"-L{libdir}", "-lcudart", f"-Wl,-rpath,{tmp_path}:{libdir}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"link failed:\n{result.stderr[-3000:]}"
    good_pipeline(tmp_path / "pipe")
    usage = subprocess.run([str(binary)], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and usage.stderr.startswith("Error: usage: dsa_runtime PATH"), usage.stderr
    bad = subprocess.run([str(binary), str(tmp_path / "pipe"), "--generate", "0"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2 and "--generate takes the number of tokens" in bad.stderr, bad.stderr
    for extra in ([], ["--generate", "4"]):
        run = subprocess.run([str(binary), str(tmp_path / "pipe"), *extra], capture_output=True, text=True, timeout=30)
        if run.returncode == 1 and "no CUDA GPU is usable here" in run.stderr:
            assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        elif extra:  # a machine with a GPU: the plan is read and refused, its stages are not paged graphs
            assert run.returncode == 1 and "not a paged graph" in run.stderr, run.stderr
        else:  # a machine with a GPU: the plan is read, then the stub's runtime is refused
            assert run.returncode == 1 and run.stderr.startswith("Error: "), run.stderr


C_CLIENT = r"""
#include "dsa_runtime.h"
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv)
{
    int64_t const ids[2] = {1, 2};
    int64_t const lengths[1] = {2};
    int slots[4];
    int count = 0;
    /* Every entry point refuses a null handle with -1 and a sentence. */
    if (dsa_runtime_submit(NULL, ids, lengths, 1, slots) != -1 || dsa_runtime_step(NULL, slots, 4, &count) != -1
        || dsa_runtime_set_chunking(NULL, 64, 256) != -1 || strstr(dsa_runtime_error(NULL), "null") == NULL)
    {
        return 4;
    }
    dsa_runtime* runtime = dsa_runtime_open(argc > 1 ? argv[1] : "", 0, NULL);
    if (runtime != NULL)
    {
        dsa_runtime_close(runtime);
        return 3;
    }
    printf("%s\n", dsa_runtime_error(NULL));
    return strlen(dsa_runtime_error(NULL)) > 0 ? 1 : 2;
}
"""


def test_library_links_into_a_c_program(runner_objects, plan_objects, tmp_path):
    """The runtime library (LIBRARY_SOURCES, compiled with -Wall -Wextra -Werror against the TensorRT
    headers) linked into a C program through its C interface: without a GPU, opening fails with one
    sentence (no CUDA GPU); with one, the stub libnvinfer or the stand-in engine is refused."""
    compiler, objects, out, cuda = runner_objects
    _compiler, plan_objs, _out = plan_objects
    libdir = _stub_nvinfer(compiler, cuda, tmp_path)
    library = [o for o in objects if o.stem in {Path(s).stem for s in LIBRARY_SOURCES}]
    assert len(library) == len(LIBRARY_SOURCES)
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    client = tmp_path / "client.c"
    client.write_text(C_CLIENT)
    client_obj = tmp_path / "client.o"
    result = subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", str(SOURCES / "include"), "-c",
                             str(client), "-o", str(client_obj)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    binary = tmp_path / "client"
    plan_only = [o for o in plan_objs if o.stem != "check_pipeline"]
    result = subprocess.run([compiler, str(client_obj), *map(str, library), *map(str, plan_only), "-o", str(binary),
                             f"-L{tmp_path}", "-lnvinfer", f"-L{libdir}", "-lcudart",
                             f"-Wl,-rpath,{tmp_path}:{libdir}"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"link failed:\n{result.stderr[-3000:]}"
    good_pipeline(tmp_path / "pipe")
    run = subprocess.run([str(binary), str(tmp_path / "pipe")], capture_output=True, text=True, timeout=30)
    assert run.returncode == 1, (run.returncode, run.stdout, run.stderr)
    line = run.stdout.strip()
    assert "no CUDA GPU is usable here" in line or "not a paged graph" in line, line
