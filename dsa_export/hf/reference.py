"""transformers itself, running only the layers an exported graph holds: the validation oracle.

:class:`TransformersLayers` runs decoder layers A..B of a transformers DeepSeek-V3.2 / GLM-5
model the way the model's own ``forward`` does (transformers' causal mask, rotary embedding and
decoder layers, GLM-5's top-k hand-over between layers), with the embedding before them when the
graph embeds and the final norm + ``lm_head`` after them when it has the head. Only those modules
are loaded, from the safetensors one tensor at a time, in float32 (FP8 weights dequantized), so
the reference of a real-width stage needs about what the stage's weights need, never the model.

The indexers' selections and their scores are captured on the way (:meth:`run_with_selections`),
so validation can tell a top-k flip between two nearly equal keys from a real fault.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from dsa_export.hf.checkpoint import SafetensorsCheckpoint
from dsa_export.hf.weights import build_meta_model, checkpoint_block_size, materialize


def module_names(start: int, stop: int, *, embed: bool, head: bool) -> list[str]:
    """transformers module paths a graph of layers ``start..stop-1`` (+ embedding, head) needs."""
    names = [f"model.layers.{i}" for i in range(start, stop)]
    if embed:
        names.append("model.embed_tokens")
    if head:
        names += ["model.norm", "lm_head"]
    return names


class _CaptureTopkScores(TorchFunctionMode):
    """Records the scores each ``topk`` call of an indexer forward selects from."""

    def __init__(self):
        super().__init__()
        self.scores: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.topk, torch.topk):
            self.scores.append(args[0].detach().float().clone())
        return func(*args, **kwargs)


class TransformersLayers(nn.Module):
    """transformers decoder layers ``start..stop-1`` called as the exported graph is called.

    Inputs (positional, as the graph): ``input_ids`` or ``hidden_states``, ``attention_mask`` and,
    for a GLM-5 slice starting at a shared layer, ``prev_topk_indices``. Outputs: ``logits`` or the
    hidden states, plus ``topk_indices`` when the next layer reuses this slice's last selection.
    """

    def __init__(self, hf_model, start: int, stop: int, *, embed: bool, head: bool, emits_indices: bool = False):
        super().__init__()
        self.hf, self.start, self.stop, self.embed, self.head = hf_model, start, stop, embed, head
        self.emits_indices = emits_indices
        self.model_type = hf_model.config.model_type
        self._capture: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def layers(self) -> list[nn.Module]:
        return [self.hf.model.layers[i] for i in range(self.start, self.stop)]

    def forward(self, first: torch.Tensor, attention_mask: torch.Tensor, prev_topk_indices: torch.Tensor | None = None):
        from transformers.masking_utils import create_causal_mask

        model = self.hf.model
        x = model.embed_tokens(first) if self.embed else first
        position_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        mask = create_causal_mask(config=self.hf.config, inputs_embeds=x, attention_mask=attention_mask, cache=None,
                                  position_ids=position_ids, allow_is_causal_skip=False)
        position_embeddings = model.rotary_emb(x, position_ids=position_ids)
        topk = prev_topk_indices
        for i in range(self.start, self.stop):
            layer = model.layers[i]
            kwargs = dict(attention_mask=mask, position_embeddings=position_embeddings, position_ids=position_ids)
            if self.model_type == "glm_moe_dsa":
                x, topk = layer(x, prev_topk_indices=topk, **kwargs)
            else:
                x = layer(x, **kwargs)
        out = self.hf.lm_head(model.norm(x)) if self.head else x
        return (out, topk) if self.emits_indices else out

    @torch.no_grad()
    def run_with_selections(self, *args) -> tuple[tuple[torch.Tensor, ...], dict[int, tuple[torch.Tensor, torch.Tensor]]]:
        """Outputs plus ``{layer: (indices [B,S,k], scores [B,S,T])}`` of every full indexer."""
        captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        hooks = []
        for i in range(self.start, self.stop):
            indexer = getattr(self.hf.model.layers[i].self_attn, "indexer", None)
            if indexer is None:
                continue
            mode = _CaptureTopkScores()

            def pre(_module, _args, mode=mode):
                mode.scores.clear()
                mode.__enter__()

            def post(_module, _args, out, i=i, mode=mode):
                mode.__exit__(None, None, None)
                captured[i] = (out.detach().clone(), mode.scores[-1])

            hooks += [indexer.register_forward_pre_hook(pre), indexer.register_forward_hook(post)]
        try:
            outputs = self(*args)
        finally:
            for hook in hooks:
                hook.remove()
        return (outputs if isinstance(outputs, tuple) else (outputs,)), captured


def load_reference(path: str | Path, config: dict, start: int, stop: int, *, embed: bool, head: bool,
                   emits_indices: bool = False) -> TransformersLayers:
    """transformers layers ``start..stop-1`` of the checkpoint, in float32, loaded tensor by tensor."""
    checkpoint = SafetensorsCheckpoint(path)
    model = build_meta_model(config, checkpoint, dtype=torch.float32, fp8="dequantize")
    materialize(model, module_names(start, stop, embed=embed, head=head), checkpoint, checkpoint_block_size(config))
    checkpoint.close()
    return TransformersLayers(model, start, stop, embed=embed, head=head, emits_indices=emits_indices).eval()

