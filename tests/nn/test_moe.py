"""RoutedMoE against transformers' DeepSeek-V3.2 / GLM-5 MoE blocks, in torch and ONNX Runtime,
and the built-in MoE model through export, ONNX Runtime and TensorRT-RTX."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from dsa_export.errors import DSAUserError
from dsa_export.nn import BUILTIN_CONFIGS, DSAModelConfig, build_builtin, example_inputs
from dsa_export.nn.moe import RoutedMoE, replace_moe_blocks
from dsa_export.ops.onnx_ops import function_protos, register_schemas, translation_table

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32MoE  # noqa: E402
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaMoE  # noqa: E402

HIDDEN = 32

ROUTINGS = {
    "groups": dict(n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, norm_topk_prob=True,
                   routed_scaling_factor=2.5),
    "many-groups-unnormalized": dict(n_routed_experts=32, num_experts_per_tok=8, n_group=8, topk_group=4,
                                     norm_topk_prob=False, routed_scaling_factor=1.0),
    "one-group-two-shared": dict(n_routed_experts=24, num_experts_per_tok=6, n_group=1, topk_group=1,
                                 norm_topk_prob=True, routed_scaling_factor=1.5, n_shared_experts=2),
}


def _randomize(moe: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in moe.named_parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * param.shape[-1] ** -0.5)
        moe.gate.e_score_correction_bias.copy_(torch.randn(moe.gate.e_score_correction_bias.shape, generator=gen) * 0.1)
    return moe.eval()


def hf_moe(routing: dict, seed: int = 0, cls=DeepseekV32MoE, config_cls=None):
    config_cls = config_cls or transformers.DeepseekV32Config
    cfg = config_cls(hidden_size=HIDDEN, moe_intermediate_size=16, **{"n_shared_experts": 1, **routing})
    cfg._experts_implementation = "eager"  # transformers' reference loop over experts
    return _randomize(cls(cfg), seed)


def _tokens(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ROUTINGS)
def test_matches_transformers_block_and_its_expert_choice(name):
    moe = hf_moe(ROUTINGS[name])
    ours = RoutedMoE.from_hf(moe)
    x = _tokens(3, 41, HIDDEN)
    with torch.no_grad():
        want = moe(x)
        got = ours(x)
        _, hf_weights, hf_ids = moe.gate(x)
        ids, weights = ours.route(x.reshape(-1, HIDDEN))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert ids.dtype == torch.int32
    assert [set(r) for r in ids.tolist()] == [set(r) for r in hf_ids.tolist()]
    order = hf_ids.argsort(-1), ids.long().argsort(-1)
    torch.testing.assert_close(weights.gather(1, order[1]), hf_weights.gather(1, order[0]))


def test_glm5_block_has_one_group_and_matches():
    cfg = transformers.GlmMoeDsaConfig()
    assert (cfg.n_group, cfg.topk_group) == (1, 1)  # GLM-5 routes without groups
    moe = hf_moe(dict(n_routed_experts=16, num_experts_per_tok=4), cls=GlmMoeDsaMoE,
                 config_cls=transformers.GlmMoeDsaConfig)
    x = _tokens(2, 9, HIDDEN)
    with torch.no_grad():
        torch.testing.assert_close(RoutedMoE.from_hf(moe)(x), moe(x), rtol=1e-5, atol=1e-5)


def test_from_hf_reuses_submodules_so_checkpoint_names_stay():
    moe = hf_moe(ROUTINGS["groups"])
    ours = RoutedMoE.from_hf(moe)
    assert ours.gate is moe.gate and ours.experts is moe.experts and ours.shared_experts is moe.shared_experts
    assert set(ours.state_dict()) == set(moe.state_dict()) == {
        "gate.weight", "gate.e_score_correction_bias", "experts.gate_up_proj", "experts.down_proj",
        "shared_experts.gate_proj.weight", "shared_experts.up_proj.weight", "shared_experts.down_proj.weight"}
    assert not ours.training


def _export(module, example, opset=18):
    register_schemas()
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}
    program = torch.onnx.export(module, (example,), dynamic_shapes=(dims,),
                                custom_translation_table=translation_table(), opset_version=opset, dynamo=True,
                                verbose=False)
    model = program.model_proto
    model.functions.extend(function_protos(opset))
    onnx.checker.check_model(model, full_check=True)
    return model


def _ort(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]


@pytest.mark.parametrize("name", ["groups", "one-group-two-shared"])
def test_exported_block_matches_transformers_in_onnxruntime(name):
    moe = hf_moe(ROUTINGS[name], seed=3)
    model = _export(RoutedMoE.from_hf(moe), _tokens(2, 8, HIDDEN))
    custom = [n for n in model.graph.node if n.domain == "dsa"]
    assert [n.op_type for n in custom] == ["DSAMoEExperts"]
    # The expert stacks reach only the dsa node: no per-token gather of weight matrices.
    stacks = {i.name for i in model.graph.initializer if len(i.dims) == 3}
    assert stacks and all(n.domain == "dsa" for n in model.graph.node if stacks & set(n.input))
    x = _tokens(3, 29, HIDDEN, seed=4)  # other batch and sequence than traced
    with torch.no_grad():
        want = moe(x).numpy()
    np.testing.assert_allclose(_ort(model, x), want, rtol=1e-4, atol=1e-4)


def _fp8_experts(moe: torch.nn.Module, block: int) -> dict[str, torch.Tensor]:
    """Quantize ``moe.experts`` in place to FP8 + block scales (the checkpoint's layout, attributes
    as the checkpoint loader sets them); returns the dequantized stacks."""
    experts = moe.experts
    dequantized = {}
    for name in ("gate_up_proj", "down_proj"):
        w = getattr(experts, name).data
        e, rows, cols = w.shape
        blocks = w.reshape(e, rows // block, block, cols // block, block)
        scale = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-12) / 448.0
        quant = (blocks / scale[:, :, None, :, None]).reshape(e, rows, cols).to(torch.float8_e4m3fn)
        dequantized[name] = (quant.float().reshape(blocks.shape) * scale[:, :, None, :, None]).reshape(e, rows, cols)
        setattr(experts, name, torch.nn.Parameter(quant, requires_grad=False))
        experts.register_buffer(f"{name}_scale_inv", scale)
    experts.block_size = block
    return dequantized


def test_fp8_experts_use_the_fp8_op_and_match_the_dequantized_block():
    reference = hf_moe(ROUTINGS["groups"], seed=5)
    fp8 = hf_moe(ROUTINGS["groups"], seed=5)
    dequantized = _fp8_experts(fp8, block=8)
    with torch.no_grad():
        reference.experts.gate_up_proj.copy_(dequantized["gate_up_proj"])
        reference.experts.down_proj.copy_(dequantized["down_proj"])
    ours = RoutedMoE.from_hf(fp8)
    assert ours.is_fp8
    x = _tokens(2, 13, HIDDEN, seed=6)
    with torch.no_grad():
        want = reference(x)
        torch.testing.assert_close(ours(x), want, rtol=1e-5, atol=1e-5)
    model = _export(ours, _tokens(2, 8, HIDDEN), opset=21)
    assert [n.op_type for n in model.graph.node if n.domain == "dsa"] == ["DSAMoEExpertsFP8"]
    np.testing.assert_allclose(_ort(model, x), want.numpy(), rtol=1e-4, atol=1e-4)


def test_fp8_experts_without_scales_are_a_user_error():
    moe = hf_moe(ROUTINGS["groups"])
    moe.experts.gate_up_proj = torch.nn.Parameter(moe.experts.gate_up_proj.data.to(torch.float8_e4m3fn),
                                                  requires_grad=False)
    with pytest.raises(DSAUserError, match="gate_up_proj_scale_inv"):
        RoutedMoE.from_hf(moe)(_tokens(1, 2, HIDDEN))


def test_replace_moe_blocks_swaps_every_sparse_layer_in_place():
    cfg = transformers.DeepseekV32Config(
        vocab_size=64, hidden_size=HIDDEN, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
        topk_group=2, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
        index_head_dim=16, index_n_heads=16, index_topk=8, first_k_dense_replace=1, max_position_embeddings=64)
    cfg._experts_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.DeepseekV32ForCausalLM(cfg).eval()
    for layer in model.model.layers[1:]:
        _randomize(layer.mlp, seed=7)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(8))
    names = set(model.state_dict())
    with torch.no_grad():
        want = model(ids).logits
    assert replace_moe_blocks(model) == 2
    assert [type(layer.mlp).__name__ for layer in model.model.layers] == ["DeepseekV32MLP", "RoutedMoE", "RoutedMoE"]
    assert set(model.state_dict()) == names
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-5)
    assert replace_moe_blocks(model) == 0


def test_runs_on_the_meta_device():
    block = RoutedMoE.build(HIDDEN, 16, 8, top_k=2, n_group=2, topk_group=1).to("meta")
    out = block(torch.empty(2, 5, HIDDEN, device="meta"))
    assert out.shape == (2, 5, HIDDEN) and out.device.type == "meta"


@pytest.mark.parametrize(
    "routing,message",
    [
        (dict(n_group=3), "do not divide"),
        (dict(n_group=8, topk_group=2), "at least two experts"),
        (dict(top_k=9, n_group=2, topk_group=1), "exceeds"),
        (dict(activation="gelu"), "activation 'gelu'"),
    ],
)
def test_bad_routing_is_a_user_error(routing, message):
    kwargs = {"top_k": 2, **routing}
    with pytest.raises(DSAUserError, match=message):
        RoutedMoE.build(HIDDEN, 16, 8, **kwargs)


# The built-in MoE model.


def test_builtin_moe_layers_and_config():
    model = build_builtin("tiny-moe")
    kinds = [type(layer.mlp).__name__ for layer in model.layers]
    assert kinds == ["SwiGLU", "RoutedMoE", "RoutedMoE"]
    assert model.layers[1].mlp.gate.e_score_correction_bias.abs().sum() > 0
    assert DSAModelConfig.from_dict(model.config.to_dict()) == model.config
    for bad in ({"moe_n_group": 3}, {"moe_top_k": 9}, {"moe_intermediate_size": 0}):
        with pytest.raises(ValueError):
            dataclasses.replace(BUILTIN_CONFIGS["tiny-moe"], **bad)
    # Dense configs keep their dense MLPs and parameters.
    assert all(type(layer.mlp).__name__ == "SwiGLU" for layer in build_builtin("tiny").layers)


@pytest.mark.slow
def test_builtin_moe_exports_runs_in_onnxruntime_and_builds_with_tensorrt_rtx(tmp_path):
    from dsa_export.export import ExportSettings, export_model
    from dsa_export.export.exporter import inline_custom_ops
    from dsa_export.sources import resolve

    source = resolve("tiny-moe")
    plugin = export_model(source, ExportSettings(ops="plugin"))
    assert sum(n.op_type == "DSAMoEExperts" for n in plugin.graph.node) == 2
    infos = {v.name: v for v in plugin.graph.value_info}
    for node in (n for n in plugin.graph.node if n.op_type == "DSAMoEExperts"):
        dims = infos[node.output[0]].type.tensor_type.shape.dim
        assert dims[0].dim_param and dims[1].dim_value == source.module.config.hidden_size  # symbolic tokens
    native = inline_custom_ops(plugin)
    inputs = example_inputs(source.module.config, 3, 70, seed=5)
    with torch.no_grad():
        want = source.module(**inputs).numpy()
    paths = {}
    for mode, model in (("plugin", plugin), ("native", native)):
        paths[mode] = tmp_path / f"{mode}.onnx"
        onnx.save(model, paths[mode])
        sess = ort.InferenceSession(str(paths[mode]), providers=["CPUExecutionProvider"])
        (got,) = sess.run(None, {"input_ids": inputs["input_ids"].numpy()})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT-RTX is not installed")
    from dsa_export.trt.profiles import ShapeRange
    from dsa_export.trt.rtx import build_engine

    result = build_engine(paths["plugin"], ShapeRange({"batch": (1, 2, 4), "sequence": (1, 64, 256)}))
    assert len(result.engine) > 100_000
