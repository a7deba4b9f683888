"""The exported file builds in TensorRT-RTX as it is, with no dsa_export code in the build.

A user gives the file of `dsa-export export` to TensorRT-RTX's parser (its Python API, trtexec or
Polygraphy), which inlines the dsa function bodies (TensorRT-RTX has no plugins). Our own build
path (dsa_export.trt.rtx) swaps bodies in memory first; these tests do not, so they show the file's
own bodies build: Loops with a trip count only (no "both a trip limit and a loop termination
condition" warning) and the static sparse-attention body (the trimmed one fails in the builder,
graphScope.cpp's newNodeOrder assertion in TensorRT-RTX 1.7).

The default model here; the tiny Hugging Face DeepSeek-V3.2 and GLM-5 checkpoints in
tests/hf/test_hf_export.py (test_tensorrt_rtx_builds_the_exported_files_as_they_are), next to the
exports they reuse.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.build_fixtures import LOOP_WARNING, check_plain_build

pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT-RTX is not installed (pip install dsa-export[rtx])")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plugin", "native"])
def test_exported_default_model_builds_in_plain_tensorrt_rtx(exported, mode):
    check_plain_build(exported[mode])


@pytest.mark.slow
def test_polygraphy_builds_the_exported_file_with_tensorrt_rtx(exported, tmp_path):
    # Polygraphy's TensorRT backend imports `tensorrt_rtx` when POLYGRAPHY_USE_TENSORRT_RTX=1:
    # the module of NVIDIA's tensorrt-rtx-cu13 package, which the rtx extra does not install (it
    # installs the bindings and libs only). `polygraphy run FILE --trt` then needs a GPU to run the
    # engine; `polygraphy convert --convert-to trt` is its build alone, and targets a compute
    # capability without one.
    if importlib.util.find_spec("tensorrt_rtx") is None:
        pytest.skip("Polygraphy imports the module tensorrt_rtx (pip install tensorrt-rtx-cu13), which is not "
                    "installed here: the rtx extra installs tensorrt_rtx_bindings only")
    polygraphy = shutil.which("polygraphy") or str(Path(sys.executable).with_name("polygraphy"))
    engine = tmp_path / "model.engine"
    env = {**os.environ, "POLYGRAPHY_USE_TENSORRT_RTX": "1"}
    proc = subprocess.run(
        [polygraphy, "convert", str(exported["plugin"]), "--convert-to", "trt",
         "-o", str(engine), "--compute-capabilities", "8.9", "--trt-min-shapes", "input_ids:[1,1]",
         "--trt-opt-shapes", "input_ids:[2,64]", "--trt-max-shapes", "input_ids:[2,64]"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert engine.stat().st_size > 100_000
    assert LOOP_WARNING not in proc.stdout + proc.stderr
