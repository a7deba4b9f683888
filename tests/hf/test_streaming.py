"""Streamed Hugging Face exports: weights from safetensors, checkpoint precision, FP8, stages, references."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from dsa_export.errors import DSAUserError
from dsa_export.export import ExportSettings, export_to_file
from dsa_export.hf.loader import load_model
from dsa_export.hf.reference import load_reference
from dsa_export.hf.source import hf_reference
from dsa_export.runtime.onnxrt import session
from dsa_export.sources import resolve
from dsa_export.validate import ValidationSettings, validate_onnx

from .conftest import make_fp8_checkpoint

KINDS = ["deepseek_v32", "glm_moe_dsa"]


def _ids(batch, seq, seed=0):
    return torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _initializers(path):
    return {t.name: t for t in onnx.load(str(path), load_external_data=False).graph.initializer}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dsa_export", *args], capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_modules_equal_from_pretrained(checkpoints, kind):
    """The tensor-by-tensor loading (expert stacking included) gives transformers' own weights."""
    path = checkpoints[kind]
    config = json.loads((path / "config.json").read_text())
    ours = load_reference(path, config, 0, config["num_hidden_layers"], embed=True, head=True).hf.state_dict()
    theirs = load_model(path)[0].state_dict()
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key


@pytest.fixture(scope="module")
def fp8_checkpoint(checkpoints, tmp_path_factory):
    return make_fp8_checkpoint(tmp_path_factory.mktemp("fp8"), checkpoints["deepseek_v32"])[0]


def test_fp8_checkpoint_keeps_fp8_weights_and_matches_transformers(fp8_checkpoint, tmp_path):
    pytest.importorskip("accelerate", reason="transformers' FP8 dequantize on load needs accelerate")
    from dsa_export.hf.checkpoint import SafetensorsCheckpoint

    out = export_to_file(resolve(str(fp8_checkpoint)), ExportSettings(), tmp_path / "fp8.onnx")
    assert out.settings.opset == 21  # blocked DequantizeLinear
    inits = _initializers(out.path)
    stored = SafetensorsCheckpoint(fp8_checkpoint)
    fp8_keys = [k for k, t in stored.tensors.items() if t.dtype == "F8_E4M3"]
    fp8_inits = {n for n, t in inits.items() if t.data_type == onnx.TensorProto.FLOAT8E4M3FN}
    # Every FP8 tensor of the checkpoint is an FP8 initializer (experts stacked per layer), and no
    # float copy of one exists: its float form is only ever computed in the graph.
    plain = {k for k in fp8_keys if ".experts." not in k}
    assert {f"hf.{k}" for k in plain} <= fp8_inits
    assert {n for n in fp8_inits if "experts" in n} or not (set(fp8_keys) - plain)
    for name in fp8_inits:
        scale = name.replace(".weight", ".weight_scale_inv") if name.endswith(".weight") else name + "_scale_inv"
        assert scale in inits and inits[scale].data_type == onnx.TensorProto.FLOAT
        twins = [n for n, t in inits.items() if n != name and list(t.dims) == list(inits[name].dims)
                 and t.data_type != onnx.TensorProto.FLOAT8E4M3FN and n.split(".")[:-1] == name.split(".")[:-1]]
        assert not twins, (name, twins)
    ops = {n.op_type for n in onnx.load(str(out.path), load_external_data=False).graph.node}
    assert "DequantizeLinear" in ops
    hf, _ = load_model(fp8_checkpoint, dequantize_fp8=True)
    ids = _ids(2, 20, seed=3)
    mask = torch.ones_like(ids)
    (got,) = session(out.path).run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits.numpy()
    assert np.abs(got - want).max() < 1e-4  # the same dequantized weights, in fp32 on both sides
    pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT-RTX is not installed (the rtx extra)")
    from dsa_export.trt.profiles import ShapeRange
    from dsa_export.trt.rtx import build_engine

    # Two FP8 experts nodes and the FP8 linears parse and build (SM89: FP8 needs Ada or newer).
    assert sum(n.op_type == "DSAMoEExpertsFP8" for n in onnx.load(str(out.path)).graph.node) == 2
    assert len(build_engine(out.path, ShapeRange({"batch": (1, 1, 2), "sequence": (1, 16, 64)})).engine) > 100_000


def test_fp8_dequantize_writes_plain_weights(fp8_checkpoint, tmp_path):
    reference = hf_reference(fp8_checkpoint, dequantize_fp8=True)
    out = export_to_file(resolve(reference, dtype="bf16"), ExportSettings(), tmp_path / "bf16.onnx")
    inits = _initializers(out.path)
    assert not any(t.data_type == onnx.TensorProto.FLOAT8E4M3FN for t in inits.values())
    assert not any(n.endswith("_scale_inv") for n in inits)
    assert {t.data_type for n, t in inits.items() if n.endswith("_proj")} <= {onnx.TensorProto.BFLOAT16}
    assert inits["hf.model.embed_tokens.weight"].data_type == onnx.TensorProto.BFLOAT16
    assert out.settings.dtype == "bf16" and out.settings.opset == 18


def test_fp8_with_an_opset_below_21_is_a_user_error(fp8_checkpoint, tmp_path):
    result = _cli("export", str(fp8_checkpoint), "--opset", "18", "-o", str(tmp_path / "x.onnx"))
    assert result.returncode == 1 and "--opset 21" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize(("kind", "dtype"), [("deepseek_v32", "fp16"), ("glm_moe_dsa", "bf16")])
def test_half_precision_exports(checkpoints, tmp_path, kind, dtype):
    """Weights and activations in half precision; the indexer's head weights and the router stay
    float32 as transformers keeps them, so DSAIndexerTopK takes float32 w with half q/k. (Each
    precision on one model: the dtype handling is the same code for both.)"""
    out = export_to_file(resolve(str(checkpoints[kind]), dtype=dtype), ExportSettings(), tmp_path / f"{dtype}.onnx")
    model = onnx.load(str(out.path), load_external_data=False)
    half = onnx.TensorProto.FLOAT16 if dtype == "fp16" else onnx.TensorProto.BFLOAT16
    inits = {t.name: t for t in model.graph.initializer}
    assert inits["hf.model.embed_tokens.weight"].data_type == half
    types = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.value_info, *model.graph.input)}
    for node in (n for n in model.graph.node if n.op_type == "DSAIndexerTopK"):
        assert (types[node.input[0]], types[node.input[2]]) == (half, onnx.TensorProto.FLOAT)
    if dtype == "fp16":
        hf, _ = load_model(checkpoints[kind])
        ids = _ids(2, 24, seed=5)
        mask = torch.ones_like(ids)
        (got,) = session(out.path).run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        with torch.no_grad():
            want = hf(input_ids=ids, attention_mask=mask).logits.numpy()
        cosine = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
        assert got.dtype == np.float16 and cosine > 0.999
    else:
        pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT-RTX is not installed (the rtx extra)")
        from dsa_export.trt.profiles import ShapeRange
        from dsa_export.trt.rtx import build_engine

        assert len(build_engine(out.path, ShapeRange({"batch": (1, 1, 2), "sequence": (1, 16, 64)})).engine) > 100_000


def test_stages_chain_to_the_full_model_and_resume(checkpoints, tmp_path):
    """GLM-5 (layers full, shared, full, shared) in 3 stages: hidden states and, where a stage
    starts at a shared layer, the top-k selection flow between stages as pipeline.json says."""
    from dsa_export.stages.export import StageExportSettings, export_stages
    from dsa_export.stages.record import read_pipeline

    path = checkpoints["glm_moe_dsa"]
    pipeline, outcomes = export_stages(path, tmp_path / "stages", StageExportSettings(stages=3), progress=False)
    assert [o.status for o in outcomes] == ["exported"] * 3
    assert pipeline.stages[0].embed and pipeline.stages[-1].head and len(pipeline.stages) == 3
    assert [s.layers for s in pipeline.stages][0][0] == 0 and pipeline.stages[-1].layers[1] == 4
    assert read_pipeline(tmp_path / "stages").to_dict() == pipeline.to_dict()
    assert not pipeline.model["path"].startswith("/")  # relative to the pipeline folder
    ids = _ids(2, 20, seed=6)
    mask = torch.ones_like(ids).numpy()
    carried = {"input_ids": ids.numpy()}
    for stage in pipeline.stages:
        sess = session(tmp_path / "stages" / stage.onnx)
        feed = {i.name: carried[i.name] if i.name in carried else mask for i in sess.get_inputs()}
        outputs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
        for link in pipeline.links:
            if link.source == stage.index:
                carried[link.input] = outputs[link.output]
    hf, _ = load_model(path)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.numpy()
    assert np.abs(outputs["logits"] - want).max() < 1e-3
    # A second run keeps every stage; a damaged stage file is exported again.
    damaged = tmp_path / "stages" / pipeline.stages[1].onnx
    _, again = export_stages(path, tmp_path / "stages", StageExportSettings(stages=3), progress=False)
    assert [o.status for o in again] == ["kept"] * 3
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\0")
    _, again = export_stages(path, tmp_path / "stages", StageExportSettings(stages=3), progress=False)
    assert [o.status for o in again] == ["kept", "exported", "kept"]


def test_external_data_validates_and_moves_with_its_checkpoint(checkpoints, tmp_path):
    """A file whose weights live in external data validates (the ONNX Runtime copy with the
    indexer outputs reads the original data), records no absolute path, and still finds its
    checkpoint when both move together."""
    root = tmp_path / "a"
    shutil.copytree(checkpoints["deepseek_v32"], root / "ckpt")
    out = export_to_file(resolve(str(root / "ckpt")), ExportSettings(), root / "out" / "model.onnx",
                         external_data_bytes=0)
    assert out.external_bytes > 0 and (root / "out" / "model.onnx.data").is_file()
    text = (root / "out" / "model.onnx").read_bytes()
    assert str(tmp_path).encode() not in text
    moved = tmp_path / "b"
    shutil.move(root, moved)
    report = validate_onnx(moved / "out" / "model.onnx", ValidationSettings(seq_lens=(12,)))
    assert report.passed and report.selections[12] and report.unexplained_selections == 0
    (moved / "ckpt" / "config.json").write_text((moved / "ckpt" / "config.json").read_text().replace("1e-06", "2e-06"))
    with pytest.raises(DSAUserError, match="changed since the export"):
        validate_onnx(moved / "out" / "model.onnx", ValidationSettings(seq_lens=(12,)))


def test_exact_score_ties_are_near_tie_flips_not_failures(tmp_path):
    """3 indexer heads make exact ties (ReLU zeros) common, and torch.topk (transformers) keeps an
    arbitrary one of the tied keys where we keep the lowest: those queries differ, are counted as
    near-tie flips and left out; every other position still matches strictly (one layer, so a
    flip changes nothing downstream)."""
    from .conftest import make_checkpoint

    path = make_checkpoint(tmp_path, "deepseek_v32", layers=1, index_topk=8, seed=0, index_n_heads=3)
    out = export_to_file(resolve(str(path)), ExportSettings(), tmp_path / "ties.onnx")
    settings = ValidationSettings(seq_lens=(40,))
    report = validate_onnx(out.path, settings)
    assert report.passed and report.near_tie_flips >= 1 and report.unexplained_selections == 0
    (logits,) = report.errors
    assert logits.excluded_positions >= report.near_tie_flips and logits.max_abs < 1e-4
    # Those positions really differ: without leaving them out the comparison fails.
    feed = resolve(str(path)).inputs_for(settings.batch, 40, settings.seed)
    (got,) = session(out.path).run(None, {k: v.numpy() for k, v in feed.items()})
    with torch.no_grad():
        want = load_model(path)[0](**feed).logits.numpy()
    assert np.abs(got - want).max() > 1e-3


def test_build_of_a_checkpoint_keeps_a_reference_that_resolves(checkpoints, tmp_path):
    """dsa-export build on a checkpoint: the streamed export validates against transformers inside
    the build's staging folder, and the folder's model.onnx still finds the checkpoint after the
    rename."""
    out = tmp_path / "build"
    result = _cli("build", str(checkpoints["deepseek_v32"]), "-o", str(out), "--backend", "onnxruntime")
    assert result.returncode == 0, result.stderr
    validation = json.loads((out / "validation.json").read_text())
    assert validation["passed"] and validation["runners"] == ["transformers", "onnxruntime"]
    assert validate_onnx(out / "model.onnx", ValidationSettings(seq_lens=(12,))).passed


def test_cli_stage_export_needs_a_gpu_size_for_auto(checkpoints, tmp_path):
    result = _cli("export", str(checkpoints["deepseek_v32"]), "--stages", "auto", "-o", str(tmp_path / "s"))
    assert result.returncode == 2 and "--gpu-memory" in result.stderr
    result = _cli("export", str(checkpoints["deepseek_v32"]), "--stages", "auto", "--gpu-memory", "3GiB",
                  "--max-seq", "256", "-o", str(tmp_path / "s"))
    assert result.returncode == 0, result.stderr
    assert "stage" in result.stdout and (tmp_path / "s" / "pipeline.json").is_file()
