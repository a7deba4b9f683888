"""The pattern built-ins (block, predictor, lsh, gumbel, static) through export, ONNX Runtime,
TensorRT-RTX, and build + run, as the other built-ins go."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from dsa_export.export import ExportSettings, export_model, save_model
from dsa_export.export.exporter import inline_custom_ops
from dsa_export.model_source import ModelSource
from dsa_export.nn import BUILTIN_CONFIGS
from dsa_export.runtime.onnxrt import session
from dsa_export.sources import resolve

ROOT = Path(__file__).resolve().parents[2]
HAS_BLOCK_OP = hasattr(importlib.import_module("dsa_export.ops"), "dsa_block_sparse_attention")
HAS_RTX = importlib.util.find_spec("tensorrt_rtx_bindings") is not None


def _model_param(name: str):
    waiting = name not in BUILTIN_CONFIGS or (name in ("block", "predictor") and not HAS_BLOCK_OP)
    return pytest.param(name, marks=pytest.mark.skipif(waiting, reason="needs the DSABlockSparseAttention op"))


MODELS = [_model_param(n) for n in ("block", "predictor", "lsh", "gumbel", "static")]
#: The op nodes each model's plugin file has: the pattern layers and a sliding-window layer below.
EXPECTED_OPS = {
    "block": {"DSABlockSparseAttention": 2, "DSASparseAttention": 1},
    "predictor": {"DSABlockSparseAttention": 2, "DSASparseAttention": 1},
    "lsh": {"DSASparseAttention": 3},
    "gumbel": {"DSAIndexerTopK": 2, "DSASparseAttention": 3},
    "static": {"DSASparseAttention": 3},  # the indexer is skipped at run time
}
#: (batch, sequence) the export (batch 2, sequence 64) never saw; 300 spans 10 blocks of 32.
UNSEEN = [(1, 17), (3, 100), (2, 300)]


def _native_form(plugin: onnx.ModelProto) -> onnx.ModelProto:
    """What ``export --ops native`` writes: the same trace with every dsa node inlined
    (``exporter._finish``), so one trace gives both files and the tests stay within CI time."""
    native = inline_custom_ops(copy.deepcopy(plugin))
    for prop in native.metadata_props:
        if prop.key == "dsa_export.ops_mode":
            prop.value = "native"
        elif prop.key == "dsa_export.export_settings":
            prop.value = json.dumps({**json.loads(prop.value), "ops": "native"}, sort_keys=True)
    native.doc_string = plugin.doc_string.replace("(plugin ops)", "(native ops)")
    onnx.checker.check_model(native, full_check=True)
    return native


@pytest.fixture(scope="module")
def pattern_exports(tmp_path_factory):
    """``{name: (source, {"plugin": path, "native": path})}``, exported on first use."""
    out, cache = tmp_path_factory.mktemp("patterns"), {}

    def get(name: str):
        if name not in cache:
            source = resolve(name)
            plugin = export_model(source, ExportSettings(ops="plugin"))
            paths = {"plugin": save_model(plugin, out / f"{name}-plugin.onnx"),
                     "native": save_model(_native_form(plugin), out / f"{name}-native.onnx")}
            cache[name] = (source, paths)
        return cache[name]

    return get


@pytest.mark.parametrize("name", MODELS)
def test_exports_with_the_pattern_ops_and_matches_torch_at_unseen_lengths(pattern_exports, name):
    source, paths = pattern_exports(name)
    plugin = onnx.load(str(paths["plugin"]))
    counts: dict[str, int] = {}
    for node in plugin.graph.node:
        if node.domain == "dsa":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    assert counts == EXPECTED_OPS[name]
    assert {f.name for f in plugin.functions} == set(counts)
    native = onnx.load(str(paths["native"]))
    assert all(n.domain in ("", "ai.onnx") for n in native.graph.node) and not native.functions
    for mode, path in paths.items():
        sess = session(path)
        for batch, seq_len in UNSEEN:
            inputs = source.inputs_for(batch, seq_len, seed=11)
            with torch.no_grad():
                want = source.module(**inputs).numpy()
            (got,) = sess.run(None, {"input_ids": inputs["input_ids"].numpy()})
            err = float(np.abs(got - want).max())
            assert err <= 1e-4, f"{name} {mode} at {batch}x{seq_len}: max abs error {err:.3g}"


def test_static_pattern_is_a_constant_of_the_graph(pattern_exports):
    source, paths = pattern_exports("static")
    model = onnx.load(str(paths["plugin"]))
    cfg = source.module.config
    patterns = [i for i in model.graph.initializer
                if i.data_type == onnx.TensorProto.INT32 and list(i.dims) == [cfg.static_max_seq, cfg.index_topk]]
    assert len(patterns) == 2
    names = [i.name for i in model.graph.initializer]
    assert any(n.endswith("indexer.pattern") for n in names)
    assert not any("wq_b" in n or "weights_proj" in n for n in names)  # no indexer weights left


def test_static_pattern_as_a_graph_input(pattern_exports, tmp_path):
    """The selections fed at run time: ``patterns [L, S, K]`` with its rows tied to the sequence."""
    from dsa_export.model_ref import ModelReference
    from dsa_export.nn.patterns import FedStaticPatternLM

    model = pattern_exports("static")[0].module
    fed = FedStaticPatternLM(model).eval()
    window = torch.arange(64)[:, None] - torch.arange(12)[None, :]
    pattern = torch.where(window >= 0, window, -1).to(torch.int32)

    def inputs(batch, seq_len, seed=0):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, model.config.vocab_size, (batch, seq_len), generator=gen)
        return {"input_ids": ids, "patterns": torch.stack([pattern[:seq_len]] * 2)}

    axes = {"input_ids": {0: "batch", 1: "sequence"}, "patterns": {1: "sequence"}}
    source = ModelSource(reference=ModelReference("module", name="fed-static"), module=fed,
                         example_inputs=inputs(2, 24), dynamic_axes=axes)
    path = save_model(export_model(source, ExportSettings(ops="plugin")), tmp_path / "fed.onnx")
    onnx_model = onnx.load(str(path))
    assert [i.name for i in onnx_model.graph.input] == ["input_ids", "patterns"]
    assert not any(n.op_type == "DSAIndexerTopK" for n in onnx_model.graph.node)
    sess = session(path)
    for batch, seq_len in ((1, 9), (3, 50)):
        feed = inputs(batch, seq_len, seed=seq_len)
        with torch.no_grad():
            want = fed(**feed).numpy()
        (got,) = sess.run(None, {k: v.numpy() for k, v in feed.items()})
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not HAS_RTX, reason="TensorRT-RTX is not installed (pip install dsa-export[rtx])")
@pytest.mark.parametrize("mode", ["plugin", "native"])
def test_rtx_parses_and_builds_lsh(pattern_exports, mode):
    from dsa_export.trt.profiles import ShapeRange
    from dsa_export.trt.rtx import build_engine

    _, paths = pattern_exports("lsh")
    result = build_engine(paths[mode], ShapeRange({"batch": (1, 2, 4), "sequence": (1, 64, 512)}))
    assert len(result.engine) > 100_000 and result.layers > 100


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "dsa_export", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.skipif(not HAS_RTX, reason="TensorRT-RTX is not installed (pip install dsa-export[rtx])")
def test_build_then_run_the_static_model(tmp_path):
    out = tmp_path / "static"
    built = _cli("build", "static", "-o", str(out), "--max-shapes", "batch=2,sequence=256")
    assert built.returncode == 0, built.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["validation"]["passed"] is True
    ids = resolve("static").inputs_for(2, 40, seed=3)["input_ids"]
    np.savez(tmp_path / "in.npz", input_ids=ids.numpy())
    ran = _cli("run", str(out), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "o.npz"))
    assert ran.returncode == 0, ran.stderr
    with torch.no_grad():
        want = resolve("static").module(input_ids=ids).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["logits"], want, atol=1e-4, rtol=1e-4)
