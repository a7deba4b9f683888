"""Greedy generation with an exported decode graph in ONNX Runtime (the caches stay explicit).

The first call feeds the whole prompt with empty caches (past length 0); every further call feeds
one token with the caches the previous call returned.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dsa_export.errors import DSAUserError


def greedy_generate(path: str | Path, prompt_ids: np.ndarray, max_new_tokens: int,
                    eos_token_id: int | None = None) -> np.ndarray:
    """``[B, max_new_tokens]`` greedy tokens continuing ``prompt_ids [B, S]`` (equal-length prompts)."""
    from dsa_export.runtime.onnxrt import session

    sess = session(path)
    inputs = {i.name: i for i in sess.get_inputs()}
    outputs = [o.name for o in sess.get_outputs()]
    past_names = [n for n in inputs if n.startswith("past_")]
    if "input_ids" not in inputs or not past_names:
        raise DSAUserError(f"'{path}' is not a decode graph; export it with --graph decode.")
    batch = prompt_ids.shape[0]
    feed: dict[str, np.ndarray] = {}
    for name in past_names:
        width = inputs[name].shape[2]
        if not isinstance(width, int):
            raise DSAUserError(f"cache input '{name}' has no static width; re-export the decode graph.")
        feed[name] = np.zeros((batch, 0, width), dtype=np.float32)
    ids = prompt_ids.astype(np.int64)
    past_len = 0
    generated = np.zeros((batch, max_new_tokens), dtype=np.int64)
    finished = np.zeros(batch, dtype=bool)
    for step in range(max_new_tokens):
        feed["input_ids"] = ids
        feed["attention_mask"] = np.ones((batch, past_len + ids.shape[1]), dtype=np.int64)
        result = dict(zip(outputs, sess.run(None, feed)))
        next_ids = result["logits"][:, -1].argmax(-1)
        if eos_token_id is not None:
            next_ids = np.where(finished, eos_token_id, next_ids)
            finished |= next_ids == eos_token_id
        generated[:, step] = next_ids
        past_len += ids.shape[1]
        ids = next_ids[:, None]
        for name in past_names:
            feed[name] = result["present_" + name[len("past_"):]]
        if eos_token_id is not None and finished.all():
            return generated[:, : step + 1]
    return generated
