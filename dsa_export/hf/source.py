"""Hugging Face directories as MODEL sources: ``path`` plus graph options encoded in the spec.

The spec stored in an exported file's metadata is ``hf:<absolute dir>#graph=<g>,layers=<A:B>,fp8=<0|1>``
so ``validate`` can rebuild exactly the graph that was exported.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dsa_export.errors import DSAUserError
from dsa_export.sources import ModelSource

GRAPHS = ("prefill", "decode")
#: Past length of the traced decode example (any length >= 0 works at run time).
EXAMPLE_PAST = 3


def format_spec(path: str | Path, graph: str = "prefill", layers: tuple[int, int] | None = None,
                dequantize_fp8: bool = False) -> str:
    opts = [f"graph={graph}"]
    if layers is not None:
        opts.append(f"layers={layers[0]}:{layers[1]}")
    if dequantize_fp8:
        opts.append("fp8=1")
    return f"hf:{Path(path).resolve()}#{','.join(opts)}"


def parse_layers(text: str, num_layers: int) -> tuple[int, int]:
    try:
        a_text, b_text = text.split(":")
        a = int(a_text) if a_text else 0
        b = int(b_text) if b_text else num_layers
    except ValueError:
        raise DSAUserError(f"--layers '{text}' is not A:B (e.g. 0:2).") from None
    if not 0 <= a < b <= num_layers:
        raise DSAUserError(f"--layers {a}:{b} is outside the model's {num_layers} layers; use 0 <= A < B <= {num_layers}.")
    return a, b


def parse_spec(spec: str) -> tuple[Path, str, tuple[int, int] | None, bool]:
    body = spec[3:] if spec.startswith("hf:") else spec
    path_text, _, opt_text = body.partition("#")
    opts = dict(item.split("=", 1) for item in opt_text.split(",") if "=" in item)
    layers = None
    if "layers" in opts:
        a, b = opts["layers"].split(":")
        layers = (int(a), int(b))
    return Path(path_text), opts.get("graph", "prefill"), layers, opts.get("fp8") == "1"


def hf_source(spec: str, *, batch: int = 2, seq_len: int = 16, seed: int = 0) -> ModelSource:
    """Load the checkpoint and wrap it for export; the reference is a separate transformers copy."""
    from dsa_export.hf.loader import load_model
    from dsa_export.hf.model import DSAExportModel

    path, graph, layers, fp8 = parse_spec(spec)
    if graph not in GRAPHS:
        raise DSAUserError(f"graph '{graph}' is unknown; use one of {', '.join(GRAPHS)}.")
    model, ckpt = load_model(path, dequantize_fp8=fp8)
    if layers is not None:
        layers = parse_layers(f"{layers[0]}:{layers[1]}", ckpt.num_layers)
    wrapper = DSAExportModel(model, graph=graph, layers=layers)
    cfg = model.config

    def make_inputs(b: int, s: int, seed: int, past: int = EXAMPLE_PAST) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        feed: dict[str, torch.Tensor] = {}
        p = past if graph == "decode" else 0
        if wrapper.is_slice:
            feed["hidden_states"] = torch.randn(b, s, cfg.hidden_size, generator=gen)
        else:
            feed["input_ids"] = torch.randint(0, cfg.vocab_size, (b, s), generator=gen)
        feed["attention_mask"] = torch.ones(b, p + s, dtype=torch.int64)
        if wrapper.is_slice and wrapper.needs_prev_indices:
            # A valid causal selection: each query's most recent index_topk positions.
            pos = torch.arange(s)[:, None] - torch.arange(cfg.index_topk)[None, :]
            feed["prev_topk_indices"] = torch.where(pos >= 0, pos, -1).to(torch.int32).expand(b, -1, -1).contiguous()
        for name in wrapper.input_names():
            if name.startswith("past_latent_"):
                feed[name] = torch.randn(b, p, cfg.kv_lora_rank + cfg.qk_rope_head_dim, generator=gen)
            elif name.startswith("past_index_keys_"):
                feed[name] = torch.randn(b, p, cfg.index_head_dim, generator=gen)
        return feed

    axes: dict[str, dict[int, str]] = {}
    for name in wrapper.input_names():
        if name.startswith("past_"):
            axes[name] = {0: "batch", 1: "past_sequence"}
        elif name == "attention_mask" and graph == "decode":
            axes[name] = {0: "batch", 1: "total_sequence"}
        else:
            axes[name] = {0: "batch", 1: "sequence"}
    return ModelSource(
        spec=format_spec(path, graph, layers, fp8),
        module=wrapper,
        example_inputs=make_inputs(batch, seq_len, seed),
        output_names=wrapper.output_names(),
        config=cfg.to_dict(),
        input_names=wrapper.input_names(),
        dynamic_axes=axes,
        # transformers eager (a separate copy with its default experts implementation, loaded only
        # when validation asks) is the reference for whole-model prefill graphs; decode steps and
        # layer slices are compared with our torch module (itself checked against transformers).
        reference_loader=None if (graph != "prefill" or wrapper.is_slice)
        else lambda: TransformersLogits(load_model(path, dequantize_fp8=fp8)[0]),
        make_inputs=make_inputs,
    )


class TransformersLogits(torch.nn.Module):
    """transformers ``*ForCausalLM`` called positionally, returning logits only."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits
