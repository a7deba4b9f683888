"""DeepSeek-V3.2 and GLM-5 from Hugging Face directories: transformers eager is the oracle."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from dsa_export.errors import DSAUserError
from dsa_export.export import ExportSettings, export_model, save_model
from dsa_export.hf.loader import load_model
from dsa_export.hf.model import DSAExportModel, _per_head
from dsa_export.hf.source import hf_reference
from dsa_export.runtime.onnxrt import session
from dsa_export.sources import resolve
from dsa_export.validate.compare import with_indexer_outputs
from dsa_export.validate.selections import compare_selections

from .conftest import make_checkpoint, make_fp8_checkpoint

KINDS = ["deepseek_v32", "glm_moe_dsa"]


def _ids(batch, seq, vocab=128, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def prefill_exports(checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf-prefill")
    files = {}
    for kind, path in checkpoints.items():
        source = resolve(str(path))
        files[kind] = (save_model(export_model(source, ExportSettings()), out / f"{kind}.onnx"), source)
    return files


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("index_topk", [4, 64])
def test_wrapper_matches_transformers_with_right_padding(tmp_path, kind, index_topk):
    path = make_checkpoint(tmp_path, kind, layers=3, index_topk=index_topk, seed=2)
    hf, _ = load_model(path)
    wrapper = DSAExportModel(load_model(path)[0])
    ids = _ids(2, 24, seed=3)
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0  # row 1 is right-padded
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = wrapper(ids, mask)[0]
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1, :17], want[1, :17], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_graph_has_one_indexer_per_full_layer_and_hf_io(prefill_exports, kind):
    import onnx

    path, source = prefill_exports[kind]
    model = onnx.load(str(path))
    ops = [n.op_type for n in model.graph.node if n.domain == "dsa"]
    types = source.module.indexer_types
    assert ops.count("DSAIndexerTopK") == types.count("full")
    assert ops.count("DSASparseAttention") == len(types)
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in model.graph.output] == ["logits"]
    attn = next(n for n in model.graph.node if n.op_type == "DSASparseAttention")
    infos = {v.name: v for v in model.graph.value_info}
    # MQA form: one latent head, Dk = kv_lora_rank + rope, Dv = kv_lora_rank.
    k_dims = [d.dim_value or d.dim_param for d in infos[attn.input[1]].type.tensor_type.shape.dim]
    assert k_dims[2:] == [1, 32 + 8]


def _selections(path, source, feed):
    """Our DSAIndexerTopK outputs (ONNX Runtime) vs transformers' indexers, classified per layer."""
    import onnx

    model_bytes, names = with_indexer_outputs(onnx.load(str(path), load_external_data=False))
    sess = session(path, model_bytes=model_bytes)
    outputs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {k: v.numpy() for k, v in feed.items()})))
    (want, *_), theirs = source.reference_module.run_with_selections(*feed.values())
    theirs = {i: (idx.numpy(), sc.numpy()) for i, (idx, sc) in theirs.items()}
    ours = dict(zip(sorted(theirs), [outputs[n] for n in names]))
    layers, _ = compare_selections(ours, theirs, feed["attention_mask"].sum(-1).numpy(), tie_rtol=1e-4)
    return outputs, want, layers


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seq", [5, 40])  # index_topk 8: above and below the sequence length
def test_onnxruntime_matches_transformers_eager(prefill_exports, kind, seq):
    path, source = prefill_exports[kind]
    feed = source.inputs_for(2, seq, seed=seq)
    outputs, want, layers = _selections(path, source, feed)
    assert np.abs(outputs["logits"] - want.numpy()).max() < 1e-3
    assert layers and min(layer.overlap for layer in layers) >= 0.99
    assert sum(layer.unexplained_rows for layer in layers) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_padded_batch_in_onnxruntime(prefill_exports, kind):
    path, source = prefill_exports[kind]
    ids = _ids(3, 30, seed=9)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    mask[2, 11:] = 0
    (got,) = session(path).run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        want = source.reference_module(ids, mask).numpy()  # transformers, loaded tensor by tensor
    for row, length in enumerate(mask.sum(-1).tolist()):
        assert np.abs(got[row, :length] - want[row, :length]).max() < 1e-3


def greedy_generate(path, prompt: np.ndarray, max_new_tokens: int) -> np.ndarray:
    """The decode graph at ``path`` driven greedily on ONNX Runtime (no end-of-sequence id)."""
    from dsa_export.runtime import load
    from dsa_export.runtime.generate import SamplingSettings, generate
    from dsa_export.stages.session import PipelineSession

    model = PipelineSession.of_session(load(path, "onnxruntime"))
    try:
        return generate(model, prompt, SamplingSettings(max_new_tokens=max_new_tokens)).tokens
    finally:
        model.close()


@pytest.mark.parametrize("kind", ["glm_moe_dsa"])  # both kinds generate through the paged graph: test_paged.py
def test_decode_graph_greedy_matches_transformers_generate(checkpoints, tmp_path, kind):
    source = resolve(hf_reference(checkpoints[kind], graph="decode"))
    path = save_model(export_model(source, ExportSettings()), tmp_path / "decode.onnx")
    prompt = _ids(1, 12, seed=4)
    hf, _ = load_model(checkpoints[kind])
    with torch.no_grad():
        want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, min_new_tokens=16,
                           do_sample=False, eos_token_id=None, pad_token_id=0)[0, 12:].tolist()
    got = greedy_generate(path, prompt.numpy(), 16)[0].tolist()
    assert got == want
    _rtx_builds(path, {"batch": (1, 1, 2), "sequence": (1, 1, 64), "past_sequence": (0, 32, 256),
                       "total_sequence": (1, 33, 320)})


@pytest.mark.parametrize("kind", KINDS)
def test_many_experts_with_group_routing_and_correction_bias(tmp_path, kind):
    """16 experts, top-4 within 2 of 4 groups (GLM-5: no groups), a non-zero correction bias:
    the routed-experts op and the router in standard ops match transformers' eager MoE, in a
    prefill export and a decode export driven greedily."""
    groups = dict(n_group=4, topk_group=2) if kind == "deepseek_v32" else {}
    path = make_checkpoint(tmp_path, kind, layers=3, index_topk=8, seed=7, router_bias=0.05, n_routed_experts=16,
                           num_experts_per_tok=4, **groups)
    hf, _ = load_model(path)
    prefill = save_model(export_model(resolve(str(path)), ExportSettings()), tmp_path / "prefill.onnx")
    import onnx

    ops = [n.op_type for n in onnx.load(str(prefill)).graph.node]
    assert ops.count("DSAMoEExperts") == 2 and "GatherND" not in ops
    ids = _ids(2, 30, seed=8)
    mask = torch.ones_like(ids)
    (got,) = session(prefill).run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits.numpy()
    assert np.abs(got - want).max() < 1e-3
    decode = save_model(export_model(resolve(hf_reference(path, graph="decode")), ExportSettings()),
                        tmp_path / "decode.onnx")
    prompt = _ids(1, 10, seed=9)
    with torch.no_grad():
        expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, min_new_tokens=12,
                               do_sample=False, eos_token_id=None, pad_token_id=0)[0, 10:].tolist()
    assert greedy_generate(decode, prompt.numpy(), 12)[0].tolist() == expected


def _rtx_builds(path, dims):
    pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT-RTX is not installed (the rtx extra)")
    from dsa_export.trt.profiles import ShapeRange
    from dsa_export.trt.rtx import build_engine

    assert len(build_engine(path, ShapeRange(dims)).engine) > 100_000


@pytest.mark.parametrize("kind", KINDS)
def test_tensorrt_rtx_builds_the_prefill_graph(prefill_exports, kind):
    _rtx_builds(prefill_exports[kind][0], {"batch": (1, 1, 2), "sequence": (1, 64, 256)})


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plugin", "native"])
@pytest.mark.parametrize("kind", KINDS)
def test_tensorrt_rtx_builds_the_exported_files_as_they_are(prefill_exports, kind, mode, tmp_path):
    """The plain TensorRT-RTX build of tests/trt/test_plain_rtx_build.py (no dsa_export code) of
    both export modes. The native file is the plugin export inlined by ``inline_custom_ops``: the
    step `dsa-export export --ops native` adds after the same trace (the graphs were compared equal),
    which saves two exports here."""
    import onnx

    from dsa_export.export import inline_custom_ops
    from tests.build_fixtures import check_plain_build

    path = prefill_exports[kind][0]
    if mode == "native":
        path = tmp_path / f"{kind}-native.onnx"
        onnx.save_model(inline_custom_ops(onnx.load(str(prefill_exports[kind][0]))), path)
    check_plain_build(path)


def test_layer_slices_chain_to_the_full_model(checkpoints, tmp_path):
    """GLM-5 (layers full, shared, full, shared) split 0:1 + 1:4: the first stage hands its top-k on."""
    hf, _ = load_model(checkpoints["glm_moe_dsa"])
    stages = []
    for span in ((0, 1), (1, 4)):
        source = resolve(hf_reference(checkpoints["glm_moe_dsa"], layers=span))
        path = save_model(export_model(source, ExportSettings()), tmp_path / f"s{span[0]}.onnx")
        stages.append(session(path))
    assert [o.name for o in stages[0].get_outputs()] == ["hidden_states_out", "topk_indices"]
    assert [i.name for i in stages[1].get_inputs()] == ["hidden_states", "attention_mask", "prev_topk_indices"]
    ids = _ids(2, 20, seed=5)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        hidden = hf.model.embed_tokens(ids).numpy()
        h1, topk = stages[0].run(None, {"hidden_states": hidden, "attention_mask": mask.numpy()})
        (h4,) = stages[1].run(None, {"hidden_states": h1, "attention_mask": mask.numpy(), "prev_topk_indices": topk})
        logits = hf.lm_head(hf.model.norm(torch.from_numpy(h4))).numpy()
        want = hf(input_ids=ids, attention_mask=mask).logits.numpy()
    assert np.abs(logits - want).max() < 1e-3


def test_fp8_checkpoint_loads_dequantized_in_transformers(checkpoints, tmp_path):
    """The test's FP8 rewrite is what transformers' fine-grained FP8 loader reads (our oracle)."""
    pytest.importorskip("accelerate", reason="FP8 dequantize on load needs accelerate (the hf extra)")
    path, expected = make_fp8_checkpoint(tmp_path, checkpoints["deepseek_v32"])
    with pytest.raises(DSAUserError, match="dequantize_fp8"):
        load_model(path)
    model, ckpt = load_model(path, dequantize_fp8=True)
    assert ckpt.fp8
    state = model.state_dict()
    # Routed experts are repacked on load (gate_up_proj); every other projection keeps its key.
    compared = [key for key in expected if key in state]
    assert len(compared) >= 10
    for key in compared:
        torch.testing.assert_close(state[key], expected[key], atol=1e-6, rtol=1e-6)
    original, _ = load_model(checkpoints["deepseek_v32"])
    ids = _ids(1, 12)
    with torch.no_grad():
        got, want = model(input_ids=ids).logits, original(input_ids=ids).logits
    # e4m3 keeps 3 mantissa bits: the logits move, but stay aligned with the original model's.
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert cosine > 0.98


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dsa_export", *args], capture_output=True, text=True, timeout=600)


def test_cli_export_and_validate_against_transformers(checkpoints, tmp_path):
    out = tmp_path / "glm.onnx"
    result = _cli("export", str(checkpoints["glm_moe_dsa"]), "-o", str(out), "--seq-len", "16")
    assert result.returncode == 0, result.stderr
    result = _cli("validate", str(out), "--seq-lens", "6,24", "--json")
    assert result.returncode == 0, result.stderr
    import json

    report = json.loads(result.stdout)
    assert report["passed"] and report["min_topk_overlap"] >= 0.99
    assert set(report["topk_overlap"]["24"]) == {"0", "2"}  # the two full indexer layers


@pytest.mark.parametrize(
    "setup,message",
    [
        ("pickle", "never loads because unpickling runs code"),
        ("llama", "dsa-export reads deepseek_v32 and glm_moe_dsa"),
        ("wider", "config.json and the weights do not belong together"),
        ("no-fp8", "stores no FP8 weights; drop --dequantize-fp8"),
    ],
)
def test_bad_checkpoints_get_one_sentence(tmp_path, checkpoints, setup, message):
    import json
    import shutil

    bad = tmp_path / setup
    shutil.copytree(checkpoints["deepseek_v32"], bad)
    config = json.loads((bad / "config.json").read_text())
    if setup == "pickle":
        for file in bad.glob("*.safetensors"):
            file.rename(file.with_suffix(".bin"))
    elif setup == "llama":
        config["model_type"] = "llama"
    elif setup == "wider":
        config["moe_intermediate_size"] *= 2
    (bad / "config.json").write_text(json.dumps(config))
    extra = ["--dequantize-fp8"] if setup == "no-fp8" else []
    result = _cli("export", str(bad), "-o", str(tmp_path / "x.onnx"), *extra)
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("flag", [["--layers", "0:1"], ["--stages", "2"]])
def test_layers_and_stages_options_need_a_hf_directory(tmp_path, flag):
    result = _cli("export", "-o", str(tmp_path / "x.onnx"), *flag)
    assert result.returncode == 2 and "Hugging Face model directories only" in result.stderr


@pytest.mark.parametrize("b,s,h,k,n", [(2, 3, 4, 5, 6), (4, 1, 8, 128, 512), (1, 7, 1, 3, 2)])
def test_per_head_products_are_the_broadcast_matmul(b, s, h, k, n):
    """The absorbed MLA products (W_UK into the queries, W_UV into the output), written with the
    weight as the left operand and all tokens of a head in one product, are the plain one."""
    gen = torch.Generator().manual_seed(b * s + h)
    x, w = torch.randn(b, s, h, k, generator=gen), torch.randn(h, k, n, generator=gen)
    want = torch.matmul(x.transpose(1, 2), w).transpose(1, 2)
    torch.testing.assert_close(_per_head(x, w), want, rtol=1e-5, atol=1e-5)
