"""Calibrated files of the default model, made once per session from the bundled demo data."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_int8(exported):
    """The default recipe (INT8, entropy, bundled data) applied to the plugin-mode export."""
    from dsa_export.quantize import QuantizeSettings, quantize

    return quantize(exported["plugin"], QuantizeSettings(data="builtin"))


@pytest.fixture(scope="session")
def saved_int8(default_int8, tmp_path_factory):
    from dsa_export.quantize import save

    out = tmp_path_factory.mktemp("int8")
    paths = {"model": out / "tiny.qdq.onnx", "cache": out / "tiny.cache", "report": out / "tiny.report.json"}
    save(default_int8, paths["model"], cache=paths["cache"], report=paths["report"])
    return paths


@pytest.fixture(scope="session")
def moe_exported(tmp_path_factory):
    """The plugin-mode export of the built-in ``tiny-moe`` (two MoE layers of 16 experts)."""
    from dsa_export.export import ExportSettings, export_model, save_model
    from dsa_export.sources import resolve

    out = tmp_path_factory.mktemp("moe")
    return save_model(export_model(resolve("tiny-moe"), ExportSettings()), out / "tiny-moe.onnx")


@pytest.fixture(scope="session")
def moe_int8(moe_exported):
    """``tiny-moe`` calibrated with its recipe (INT8; routed experts INT8 per expert per channel)."""
    from dsa_export.quantize import QuantizeSettings, quantize

    return quantize(moe_exported, QuantizeSettings(data="builtin"))


@pytest.fixture(scope="session")
def moe_fp8(moe_exported):
    """``tiny-moe`` calibrated in FP8 (routed experts through DSAMoEExpertsFP8)."""
    from dsa_export.quantize import QuantizeSettings, quantize

    return quantize(moe_exported, QuantizeSettings(data="builtin", precision="fp8"))


def shared_expert_matmuls(model, experts_node):
    """(gate_proj, up_proj, down_proj) MatMuls of the shared expert beside a routed-experts node of a
    calibrated model: the two that read the experts' tokens through Q/DQ and the one whose output is
    added to the routed output."""
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers = {}
    for n in model.graph.node:
        for v in n.input:
            consumers.setdefault(v, []).append(n)
    source = producers[experts_node.input[0]].input[0]  # tokens before the [N, H] reshape of the experts
    if f"{source}_dequantized" in consumers:
        gate, up = (n for n in consumers[f"{source}_dequantized"] if n.op_type == "MatMul")
        routed = consumers[experts_node.output[0]][0].output[0]  # the routed output, back to [B, S, H]
        add = next(n for n in consumers[routed] if n.op_type == "Add")
        down = producers[next(v for v in add.input if v != routed)]
        return gate, up, down
    # Streamed checkpoints export Linear layers as Gemm on the stored weight: find them by name
    # (the shared expert of the same MoE block as the experts' stacked weights).
    block = experts_node.input[3].rsplit(".experts.", 1)[0]
    by_proj = {}
    for n in model.graph.node:
        if n.op_type in ("MatMul", "Gemm") and n.input[1].startswith(f"{block}.shared_experts."):
            by_proj[n.input[1].split(".shared_experts.")[1].split(".")[0]] = n
    gate, up, down = by_proj["gate_proj"], by_proj["up_proj"], by_proj["down_proj"]
    return gate, up, down
