"""Top-k selection overlap between our exported indexers (run by ONNX Runtime) and transformers'.

The sparse pattern is load-bearing: two implementations can agree on logits of a tiny model while
selecting different keys. For every full indexer layer we compare, per valid query row, the set of
keys our DSAIndexerTopK picked with the keys transformers' indexer picked, restricted to the keys
the query may see (transformers' top-k also returns masked keys when fewer than k are allowed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch


def onnx_indexer_outputs(path: str | Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``path`` with every DSAIndexerTopK output exposed; results in graph (= layer) order."""
    from dsa_export.runtime.onnxrt import session

    model = onnx.load(str(path))
    infos = {v.name: v for v in model.graph.value_info}
    names = [n.output[0] for n in model.graph.node if n.domain == "dsa" and n.op_type == "DSAIndexerTopK"]
    existing = {o.name for o in model.graph.output}
    for name in names:
        if name not in existing:
            model.graph.output.append(infos[name])
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp) / "with_indices.onnx"
        onnx.save_model(model, tmp_path)
        sess = session(tmp_path)
        outputs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    return [outputs[n] for n in names]


def hf_indexer_outputs(hf_model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[int, np.ndarray]:
    """``{layer: indices [B,S,k]}`` from transformers' own indexers during an eager forward."""
    captured: dict[int, np.ndarray] = {}
    hooks = []
    for i, layer in enumerate(hf_model.model.layers):
        indexer = getattr(layer.self_attn, "indexer", None)
        if indexer is not None:
            hooks.append(indexer.register_forward_hook(
                lambda _m, _a, out, i=i: captured.__setitem__(i, out.detach().cpu().numpy())))
    try:
        with torch.no_grad():
            hf_model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        for hook in hooks:
            hook.remove()
    return captured


def selection_overlap(ours: np.ndarray, theirs: np.ndarray, lengths: np.ndarray) -> float:
    """Mean over valid query rows of |ours & theirs| / |theirs|, both restricted to allowed keys."""
    b, s, _ = ours.shape
    scores = []
    for bi in range(b):
        for si in range(min(s, int(lengths[bi]))):
            limit = min(si + 1, int(lengths[bi]))  # prefill: query si sees keys 0..si below the row length
            mine = {int(t) for t in ours[bi, si] if 0 <= t < limit}
            ref = {int(t) for t in theirs[bi, si] if 0 <= t < limit}
            if ref:
                scores.append(len(mine & ref) / len(ref))
    return float(np.mean(scores)) if scores else 1.0


def topk_overlap(path: str | Path, hf_model, feed: dict[str, torch.Tensor]) -> dict[int, float]:
    """``{layer: overlap}`` for every full indexer layer of a prefill export."""
    ours = onnx_indexer_outputs(path, {k: v.numpy() for k, v in feed.items()})
    theirs = hf_indexer_outputs(hf_model, feed["input_ids"], feed["attention_mask"])
    lengths = feed["attention_mask"].sum(-1).numpy()
    layers = sorted(theirs)
    if len(layers) != len(ours):
        raise RuntimeError(f"{len(ours)} DSAIndexerTopK nodes but {len(layers)} transformers indexers")
    return {layer: selection_overlap(mine, theirs[layer], lengths) for layer, mine in zip(layers, ours)}
