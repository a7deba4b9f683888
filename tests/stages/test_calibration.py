"""Quantized stage builds: ``build HF_DIR --stages 2 --precision int8|fp8 --calibration-data DIR``.

Every stage is calibrated on what the (float) stages before it produce: stage 1's calibration
feeds must be exactly stage 0's outputs for the same tokens (checked against stage 0 run here),
every stage's build holds a calibrated Q/DQ model, and ``generate`` runs over the quantized
pipeline. DeepSeek-V3.2 as decode stages in INT8; GLM-5 (its shared-indexer layer takes its
selection across the boundary) as paged stages in FP8.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the hf extra is not installed")


def _cli(*args):
    from tests.stages.test_session import _cli as run

    return run(*args)


@pytest.fixture(scope="module")
def calibration_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("calibration")
    rng = np.random.default_rng(0)
    for i in range(6):
        np.save(folder / f"sample{i}.npy", rng.integers(2, 128, (2, 40)))
    return folder


@pytest.mark.parametrize(("kind", "graph", "precision"), [("deepseek_v32", "decode", "int8"),
                                                          ("glm_moe_dsa", "paged", "fp8"),
                                                          ("deepseek_v32", "paged", "fp8"),
                                                          ("glm_moe_dsa", "decode", "int8")])
def test_each_stage_is_calibrated_on_the_stages_before_it(tmp_path, calibration_data, kind, graph, precision, caplog):
    import onnx

    from dsa_export.runtime import load
    from dsa_export.stages.record import read_pipeline
    from tests.hf.conftest import make_checkpoint

    checkpoint = make_checkpoint(tmp_path, kind, layers=4, index_topk=8)
    out = tmp_path / "build"
    result = _cli("build", checkpoint, "--stages", 2, "--graph", graph, "--precision", precision,
                  "--calibration-data", calibration_data, "--max-batch", 2, "--max-seq", 64, "-o", out, "--json")
    assert result.exit_code == 0, result.output
    # The six files all went to calibration (the recipe takes up to 512), so none is left for the
    # whole-pipeline report: one warning, no report (tests/stages/test_report.py has one).
    assert not (out / "calibration" / "pipeline_report.json").exists()
    warned = [r.getMessage() for r in caplog.records if "whole-pipeline" in r.getMessage()]
    assert warned == [("no whole-pipeline accuracy report: no calibration file was held out from every stage's "
                       "calibration; give more --calibration-data files than the recipe's samples.")]
    pipeline = read_pipeline(out)
    assert [s.build for s in pipeline.stages] == ["stage_00", "stage_01"]
    overlaps = []
    for stage in pipeline.stages:
        manifest = json.loads((out / stage.build / "manifest.json").read_text())
        assert manifest["precision"] == precision and manifest["calibration"]["samples"] == 6
        qdq = onnx.load(str(out / stage.build / manifest["calibration"]["model"]), load_external_data=False)
        ops = collections.Counter(node.op_type for node in qdq.graph.node)
        # GLM-5's recipe scales FP8 activations per token at run time (calibration/glm-5.json).
        quantize = "TRT_DynamicQuantize" if precision == "fp8" else "QuantizeLinear"
        assert ops[quantize] > 0, (stage.index, ops)
        report = json.loads((out / stage.build / manifest["calibration"]["report"]).read_text())
        overlaps.extend(t["overlap"] for t in report["topk"])  # paged indexers are measured too
    assert overlaps and all(0.5 < o <= 1.0 for o in overlaps), overlaps

    # Stage 1 was calibrated on stage 0's float outputs for the same tokens.
    feeds = sorted((out / "calibration").glob("*/stage_01/*.npz"))
    assert len(feeds) == 6
    first = load(out / pipeline.stages[0].onnx, "onnxruntime")  # relative to the build folder
    stage0 = dict(np.load(sorted((out / "calibration").glob("*/stage_00/*.npz"))[0]))
    stage1 = dict(np.load(feeds[0]))
    produced = first.run(stage0)
    np.testing.assert_array_equal(stage1["hidden_states"], produced["hidden_states_out"])
    if kind == "glm_moe_dsa" and "prev_topk_indices" in stage1:
        np.testing.assert_array_equal(stage1["prev_topk_indices"], produced["topk_indices"])
    first.close()

    np.save(tmp_path / "ids.npy", np.random.default_rng(1).integers(2, 128, (2, 7)))
    generated = _cli("generate", out, "--input-ids", tmp_path / "ids.npy", "--max-new-tokens", 6, "--json")
    assert generated.exit_code == 0, generated.output
    assert np.asarray(json.loads(generated.stdout)["tokens"]).shape[0] == 2


def test_quantized_stage_builds_need_token_ids(tmp_path):
    from tests.hf.conftest import make_checkpoint

    checkpoint = make_checkpoint(tmp_path, "deepseek_v32", layers=2, index_topk=8)
    result = _cli("build", checkpoint, "--stages", 2, "--precision", "int8", "--max-seq", 64, "-o", tmp_path / "b")
    assert result.exit_code == 2
    assert "pass --calibration-data DIR, a folder of token ids" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_fp8_checkpoint_is_calibrated_not_taken_as_calibrated(tmp_path, calibration_data):
    """An FP8 checkpoint's weights are DequantizeLinear nodes, not a calibration: its int8 stage
    build exports the weights dequantized, calibrates every stage and quantizes them again."""
    from dsa_export.stages.record import read_pipeline
    from tests.hf.conftest import make_checkpoint, make_fp8_checkpoint

    fp8, _weights = make_fp8_checkpoint(tmp_path, make_checkpoint(tmp_path, "deepseek_v32", layers=2, index_topk=8))
    out = tmp_path / "build"
    result = _cli("build", fp8, "--stages", 2, "--precision", "int8", "--calibration-data", calibration_data,
                  "--max-batch", 2, "--max-seq", 64, "--backend", "onnxruntime", "-o", out, "--json")
    assert result.exit_code == 0, result.output
    for stage in read_pipeline(out).stages:
        calibration = json.loads((out / stage.build / "manifest.json").read_text())["calibration"]
        assert calibration["samples"] == 6 and not calibration.get("supplied"), calibration


def test_a_moved_stage_build_keeps_its_build_keys(tmp_path):
    """Calibration feeds inside the stage build count by their path relative to it (which names the
    data by digest), so a moved or copied stage build keeps its stages on resume; feeds elsewhere,
    or other data, give other keys."""
    from dsa_export.artifact.settings import BuildSettings
    from dsa_export.stages.builder import _build_key
    from dsa_export.stages.record import StageFiles

    stage = StageFiles(index=0, layers=(0, 2), embed=True, head=False, onnx="stage_00.onnx", data=None,
                       sha256={"stage_00.onnx": "0" * 64}, sizes={"stage_00.onnx": 1}, inputs=[], outputs=[],
                       weight_bytes=1, checkpoint_bytes=1, key="k", plan={})

    def key(root, data="calibration/abc/stage_00"):
        return _build_key(stage, BuildSettings(output=root / "stage_00", calibration_data=str(root / data),
                                               precision="fp8"))

    assert key(tmp_path / "a") == key(tmp_path / "moved" / "b")
    assert key(tmp_path / "a") != key(tmp_path / "a", "calibration/other/stage_00")
    outside = _build_key(stage, BuildSettings(output=tmp_path / "a" / "stage_00", precision="fp8",
                                              calibration_data=str(tmp_path / "elsewhere")))
    assert outside != key(tmp_path / "a")
