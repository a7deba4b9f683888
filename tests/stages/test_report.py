"""The whole-pipeline accuracy report of quantized stage builds (``dsa_export/stages/report.py``).

Two tiny quantized stage builds are shared by the module (DeepSeek-V3.2 as INT8 decode stages,
GLM-5 as FP8 paged stages), calibrated by a recipe placed like the bundled ones that takes 4
samples and holds 2 out (the bundled recipes calibrate on 512), so six calibration files leave two
for the report. The
harness is proved on the float export against itself (everything exactly equal), on the
free-running divergence it infers from teacher forcing, and on a stage whose weight was broken.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the hf extra is not installed")

GREEDY_TOKENS = 6  # the direct calls (the build decodes DEFAULT_TOKENS)


def _cli(*args):
    from tests.stages.test_session import _cli as run

    return run(*args)


#: The placement of the bundled DeepSeek-V3.2 and GLM-5 recipes (high-precision indexer projections
#: and LM head, FP8 routed experts in 128-blocks), calibrating on 4 samples and holding 2 out; kept
#: here so that the report's tests do not move with the bundled recipes' tuning.
SMALL_RECIPE = {"match": {"model_type": ["deepseek_v32", "glm_moe_dsa"]}, "method": "percentile",
                "percentile": 99.99, "samples": 4, "eval_samples": 2, "exclude": ["logits", "*lm_head*"],
                "keep_indexer_projections": True, "experts": "fp8", "expert_block_size": 128,
                "thresholds": {"cosine": 0.99, "sqnr_db": 15.0, "topk_overlap": 0.95, "router_agreement": 0.9}}


@pytest.fixture(scope="module")
def small_recipes(tmp_path_factory):
    """:data:`SMALL_RECIPE` as the only recipe the builds of this module find."""
    from dsa_export.quantize import recipe

    folder = tmp_path_factory.mktemp("recipes")
    (folder / "small-stages.json").write_text(json.dumps(SMALL_RECIPE), encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recipe, "CALIBRATION_DIR", folder)
        yield folder


@pytest.fixture(scope="module")
def token_ids(tmp_path_factory):
    folder = tmp_path_factory.mktemp("token_ids")
    rng = np.random.default_rng(0)
    for i in range(6):
        np.save(folder / f"sample{i}.npy", rng.integers(2, 128, (2, 24)))
    return folder


def _build(checkpoint, out, graph, precision, data):
    return _cli("build", checkpoint, "--stages", 2, "--graph", graph, "--precision", precision,
                "--calibration-data", data, "--max-batch", 2, "--max-seq", 64, "--backend", "onnxruntime",
                "--no-validate", "-o", out)


def _make(tmp_path_factory, small_recipes, data, kind, graph, precision):
    from tests.hf.conftest import make_checkpoint

    root = tmp_path_factory.mktemp(kind)
    checkpoint = make_checkpoint(root, kind, layers=3 if kind == "deepseek_v32" else 4, index_topk=8)
    out = root / "build"
    return {"checkpoint": checkpoint, "out": out, "graph": graph, "precision": precision, "data": data,
            "result": _build(checkpoint, out, graph, precision, data)}


@pytest.fixture(scope="module")
def decode_build(tmp_path_factory, small_recipes, token_ids):
    return _make(tmp_path_factory, small_recipes, token_ids, "deepseek_v32", "decode", "int8")


@pytest.fixture(scope="module")
def paged_build(tmp_path_factory, small_recipes, token_ids):
    return _make(tmp_path_factory, small_recipes, token_ids, "glm_moe_dsa", "paged", "fp8")


@pytest.fixture(params=["decode_build", "paged_build"])
def build(request):
    return request.getfixturevalue(request.param)


def _report(build):
    return json.loads((build["out"] / "calibration" / "pipeline_report.json").read_text(encoding="utf-8"))


def _held_out(build):
    return [(f"sample{i}.npy", np.load(build["data"] / f"sample{i}.npy")) for i in (4, 5)]


def _indexer_nodes(folder):
    import onnx

    from dsa_export.stages.record import read_pipeline

    count = 0
    for stage in read_pipeline(folder).stages:
        graph = onnx.load(str(folder / stage.onnx), load_external_data=False)
        count += sum(node.op_type in ("DSAIndexerTopK", "DSAIndexerTopKPaged") for node in graph.graph.node)
    return count


def test_the_build_writes_the_pipeline_report(build):
    from dsa_export.stages.record import read_pipeline
    from dsa_export.stages.report import GREEDY_AGREEMENT

    out, result = build["out"], build["result"]
    report = _report(build)
    # A failing report fails the build (exit 1, one sentence naming the metrics); the files stay.
    assert result.exit_code == (0 if report["passed"] else 1), result.stderr
    if not report["passed"]:
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("Error: the quantized pipeline fails its accuracy thresholds end to end ("), last
        assert "Traceback" not in result.stderr
    assert "Accuracy of the quantized pipeline" in result.stdout
    assert ("PASSED:" if report["passed"] else "FAILED:") in result.stdout

    assert set(report) == {"build_keys", "data_digest", "eval_inputs", "float_pipeline", "graph", "greedy", "logits",
                           "notes", "passed", "quantized_pipeline", "router", "thresholds", "topk"}
    assert report["eval_inputs"] == ["sample4.npy", "sample5.npy"]  # the files the per-stage reports held out
    assert report["graph"] == build["graph"]
    (digest,) = [p.name for p in (out / "calibration").iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert report["data_digest"] == digest
    assert report["build_keys"] == [stage.build_key for stage in read_pipeline(out).stages]
    assert report["thresholds"] == {"cosine": 0.99, "sqnr_db": 15.0, "topk_overlap": 0.95, "router_agreement": 0.9,
                                    "greedy_agreement": GREEDY_AGREEMENT}

    # Real quantization moves the numbers, but not to nothing.
    logits, greedy = report["logits"], report["greedy"]
    assert 0 < logits["cosine"] < 1 and 0 < logits["sqnr_db"] < math.inf and logits["max_abs"] > 0
    assert [s["input"] for s in logits["samples"]] == report["eval_inputs"]
    assert greedy["tokens"] == 16 and greedy["positions"] == 2 * 2 * 16
    assert 0 < greedy["agreement"] <= 1 and greedy["matches"] == round(greedy["agreement"] * greedy["positions"])
    assert all(len(s["first_divergence"]) == 2 for s in greedy["samples"])
    # Every DSA layer of the pipeline (the paged indexer too) and every MoE layer, every prompt row.
    assert len(report["topk"]) == _indexer_nodes(out / "export") > 0
    assert [k["stage"] for k in report["topk"]] == sorted(k["stage"] for k in report["topk"])
    assert {k["stage"] for k in report["topk"]} == {0, 1}
    for k in report["topk"]:
        assert 0 < k["overlap"] <= 1 and 0 < k["worst_row"] <= k["overlap"] and k["rows"] == 2 * 2 * 24
        assert k["passed"] == (k["overlap"] >= 0.95)
    assert report["router"] and all(0 < r["agreement"] <= 1 and r["rows"] == 2 * 2 * 24 for r in report["router"])
    expected = (logits["cosine"] >= 0.99 and logits["sqnr_db"] >= 15 and greedy["agreement"] >= GREEDY_AGREEMENT
                and all(k["overlap"] >= 0.95 for k in report["topk"])
                and all(r["agreement"] >= 0.9 for r in report["router"]))
    assert report["passed"] == expected


def test_the_float_stages_against_themselves_agree_exactly(build, tmp_path):
    """The harness itself adds nothing: the export compared with itself is equal everywhere."""
    from dsa_export.stages.report import pipeline_report

    export = build["out"] / "export"
    report = pipeline_report(export, export, _held_out(build), GREEDY_TOKENS, scratch=tmp_path)
    assert report.logits.cosine == pytest.approx(1.0, abs=1e-12) and report.logits.sqnr_db == math.inf
    assert report.logits.max_abs == 0.0
    assert report.greedy.agreement == 1.0 and report.greedy.first_divergence is None
    assert report.greedy.positions == 2 * 2 * GREEDY_TOKENS
    assert len(report.topk) == _indexer_nodes(export)
    assert all(k.overlap == 1.0 and k.worst_row == 1.0 for k in report.topk)
    assert report.router and all(r.agreement == 1.0 and r.overlap == 1.0 for r in report.router)
    assert report.passed and report.failures() == []
    assert list(tmp_path.iterdir()) == []  # the spilled tensors are gone


def test_teacher_forcing_finds_where_free_running_decoding_diverges(build):
    """Greedy decoding of the quantized build on its own leaves the float tokens exactly where the
    report's forced run first disagrees."""
    from dsa_export.runtime.generate import SamplingSettings, generate
    from dsa_export.stages.session import PipelineSession

    report = _report(build)
    settings = SamplingSettings(max_new_tokens=16)
    tokens = {}
    for name, folder in (("float", build["out"] / "export"), ("quantized", build["out"])):
        model = PipelineSession.open(folder, "onnxruntime")
        try:
            tokens[name] = [generate(model, ids, settings).tokens for _, ids in _held_out(build)]
        finally:
            model.close()
    for sample, reference, own in zip(report["greedy"]["samples"], tokens["float"], tokens["quantized"]):
        differ = reference != own
        assert sample["first_divergence"] == [int(np.argmax(row)) if row.any() else None for row in differ]


def _break_stage(stage_folder, weight):
    """Negate an int8 weight in a built stage (its Q/DQ model and its ONNX Runtime artifact) and
    record the new hashes, so that the build still takes the stage for its own."""
    import onnx
    from onnx import numpy_helper

    from dsa_export.fileio import sha256_file
    from dsa_export.manifest import write_manifest

    manifest = json.loads((stage_folder / "manifest.json").read_text(encoding="utf-8"))
    for name in ("model.qdq.onnx", "onnxruntime/model.optimized.onnx"):
        path = stage_folder / name
        model = onnx.load(str(path))
        (tensor,) = [t for t in model.graph.initializer if t.name == weight]
        values = numpy_helper.to_array(tensor)
        tensor.CopyFrom(numpy_helper.from_array(np.negative(np.clip(values, -127, 127)).astype(values.dtype), weight))
        onnx.save(model, str(path))
        manifest["files"][name] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    write_manifest(manifest, stage_folder / "manifest.json")


def test_a_broken_stage_fails_the_report_and_the_build(decode_build, tmp_path):
    """A sign-flipped attention output of the first layer in the kept stage 0: the resumed build
    computes the report (none is there), which fails, and exits 1 with the files kept."""
    from dsa_export.stages.record import read_pipeline

    out = decode_build["out"]
    stage = out / "stage_00"
    backup = tmp_path / "backup"
    shutil.copytree(stage, backup / "stage_00")
    report_file = out / "calibration" / "pipeline_report.json"
    shutil.copy2(report_file, backup / "pipeline_report.json")
    try:
        _break_stage(stage, "hf.model.layers.0.self_attn.o_proj.weight_quantized")
        report_file.unlink()
        result = _build(decode_build["checkpoint"], out, "decode", "int8", decode_build["data"])
        assert result.exit_code == 1, result.stderr
        assert result.stdout.count("kept") == 2  # the broken stage was not rebuilt
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("Error: the quantized pipeline fails its accuracy thresholds end to end (logit cosine ")
        assert str(report_file) in last and "Traceback" not in result.stderr
        report = json.loads(report_file.read_text(encoding="utf-8"))
        assert not report["passed"] and not report["logits"]["passed"]
        assert report["logits"]["cosine"] < 0.9 and report["greedy"]["agreement"] < 0.9
        assert min(k["overlap"] for k in report["topk"][1:]) < 0.95  # the layers after the broken one
        assert all((out / s.build / "manifest.json").is_file() for s in read_pipeline(out).stages)
    finally:
        shutil.rmtree(stage)
        shutil.copytree(backup / "stage_00", stage)
        shutil.copy2(backup / "pipeline_report.json", report_file)


def test_a_resumed_build_keeps_the_report(decode_build):
    out = decode_build["out"]
    report_file = out / "calibration" / "pipeline_report.json"
    before = report_file.stat().st_mtime_ns, report_file.read_bytes()
    result = _build(decode_build["checkpoint"], out, "decode", "int8", decode_build["data"])
    assert result.exit_code == decode_build["result"].exit_code, result.stderr
    assert result.stdout.count("kept") == 2
    assert f"The pipeline report of these stages and data is in {report_file} already." in result.stderr
    assert (report_file.stat().st_mtime_ns, report_file.read_bytes()) == before
    assert "Accuracy of the quantized pipeline" in result.stdout


def test_running_sums_give_the_reports_cosine_and_sqnr():
    """Logits are compared sample by sample without holding them all; the sums give what the
    per-stage report's functions give for all samples as one array."""
    from dsa_export.quantize.report import cosine, sqnr_db
    from dsa_export.stages.report import _Logits

    rng = np.random.default_rng(3)
    refs = [rng.normal(size=(2, n, 7)).astype(np.float32) for n in (3, 5)]
    noisy = [r + rng.normal(scale=0.1, size=r.shape).astype(np.float32) for r in refs]
    sums = _Logits()
    for r, q in zip(refs, noisy):
        sums.add(r, q)
    whole_r = np.concatenate([r.ravel() for r in refs])
    whole_q = np.concatenate([q.ravel() for q in noisy])
    assert sums.cosine() == pytest.approx(cosine(whole_r, whole_q), rel=1e-12)
    assert sums.sqnr_db() == pytest.approx(sqnr_db(whole_r, whole_q), rel=1e-12)
    same = _Logits()
    same.add(refs[0], refs[0])
    assert same.cosine() == pytest.approx(1.0) and same.sqnr_db() == math.inf
    zero = _Logits()
    zero.add(np.zeros(3), np.ones(3))
    assert zero.cosine() == cosine(np.zeros(3), np.ones(3)) and zero.sqnr_db() == -math.inf
