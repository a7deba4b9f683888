#!/usr/bin/env python3
"""How much FP8 cache storage changes a DSA model's decode, against bf16 caches.

    python tools/fp8_cache_accuracy.py CKPT --prompt 1024 --steps 16 [--batch 1] [--runs A,B] [--prefill-chunk N] [--json FILE]

CKPT is a DeepSeek-V3.2 / GLM-5 checkpoint (e.g. a real-width synthetic one from
tools/make_synthetic_checkpoint.py). The paged graph's torch module (float32 weights) prefills a
random prompt and decodes ``--steps`` tokens twice, teacher-forced with the same tokens: once with
every cache entry stored as bf16, once with the latent stored as FlashMLA's FP8 token (512 FP8
e4m3 + 4 float32 scales + 64 bf16 RoPE values, 656 bytes) and the index keys as FP8 with one
float32 scale per token (DeepGEMM's layout, 132 bytes); see dsa_export/hf/kv_quant.py. Each
cache entry is encoded when it is written and decoded when it is read, exactly once.

Reported per decode step (medians and minima over steps and rows): cosine of the final hidden
states and of the logits, whether the arg max agrees, and per indexer layer the overlap of the
top-k selections (|FP8 ∩ bf16| / |bf16|); ``prefill_topk_overlap`` the same over the prompt's
queries that choose among more keys than the top-k (each run's own prefill, so a layer's rows
also carry the earlier layers' rounding). The same figures for bf16 caches against float32
caches (nothing rounded) come with them: how far the model moves when only bf16 rounding is
applied, the scale against which the FP8 figures read; and each FP8 encoding alone (latent FP8
with bf16 index keys, and the reverse). ``fp8_indexer`` is the indexer as DeepSeek's inference
code runs it (FP8 index keys with a scale per token, and the queries in FP8 too, one power-of-two
scale per 128 channels: ``kv_quant.query_roundtrip``) with the latent in bf16, against bf16:
the FP8 indexer kernel's accuracy. ``--runs`` picks the comparisons (each costs a prefill).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from unittest import mock


def _run(module, prompt, steps, batch, codec, page, query=None, chunk=1024):
    """Final hidden states, logits and per-layer selections of each decode step; ``query`` (if
    given) rounds the indexer's queries before they score the keys; the prompt is fed ``chunk``
    tokens per call."""
    import torch

    from dsa_export.hf import model as hf_model
    from dsa_export.hf.model import PagedStep
    from dsa_export.validate.compare import TorchOpSelections

    latent_width = module.hf.config.kv_lora_rank + module.hf.config.qk_rope_head_dim
    rope = module.hf.config.qk_rope_head_dim
    original = PagedStep.write

    def write(self, pool, new):
        return original(self, pool, codec(new, latent=new.shape[-1] == latent_width, rope=rope))

    total = prompt.shape[1] + steps
    blocks = -(-total // page)
    table = (1 + torch.arange(batch * blocks, dtype=torch.int32)).reshape(batch, blocks)
    pools = {}
    for name in module.input_names():
        if "_pool_" in name:
            width = latent_width if "latent" in name else module.hf.config.index_head_dim
            pools[name] = torch.zeros(1 + batch * blocks, page, width)
    hidden = {}
    hook = module.hf.model.norm.register_forward_hook(lambda _m, args, _out: hidden.__setitem__("h", args[0].detach()))
    selector = TorchOpSelections(module)
    names = module.input_names()
    records = []
    indexer = hf_model.dsa_indexer_topk_paged

    def rounded_queries(q, *args, **kwargs):
        return indexer(query(q), *args, **kwargs)

    with mock.patch.object(PagedStep, "write", write), torch.no_grad(), contextlib.ExitStack() as stack:
        if query is not None:
            stack.enter_context(mock.patch.object(hf_model, "dsa_indexer_topk_paged", rounded_queries))
        def call(ids, start, select):
            feeds = {"input_ids": ids, "query_start": torch.full((batch,), start, dtype=torch.int32),
                     "query_lengths": torch.full((batch,), ids.shape[1], dtype=torch.int32), "block_table": table,
                     **pools}
            args = [feeds[n] for n in names]
            if select:
                outputs, captured = selector.run_with_selections(*args)
            else:
                outputs, captured = module(*args), {}
            presents = [n for n in module.output_names() if n.startswith("present_")]
            for name, value in zip(module.output_names(), outputs):
                if name in presents:
                    pools["past_" + name[len("present_"):]] = value
            return outputs[0], captured

        # The prompt in chunks (each call's working memory is a chunk's), keeping the selections of
        # the queries with more allowed keys than the top-k (the others take every key).
        topk = module.hf.config.index_topk
        prefill: list[list] = []
        for begin in range(0, prompt.shape[1], chunk):
            _, captured = call(prompt[:, begin:begin + chunk], begin, select=True)
            for layer, i in enumerate(sorted(captured)):
                rows = captured[i][0][:, max(0, topk - begin):]
                if layer == len(prefill):
                    prefill.append([])
                prefill[layer].append(rows)
        prefill = [torch.cat(parts, dim=1) for parts in prefill]
        for step in range(steps):
            token = torch.full((batch, 1), 7 + step, dtype=torch.int64)  # the same forced tokens for both runs
            logits, captured = call(token, prompt.shape[1] + step, select=True)
            records.append({"hidden": hidden["h"].reshape(batch, -1).clone(), "logits": logits.clone(),
                            "selections": [captured[i][0][:, -1] for i in sorted(captured)]})
    hook.remove()
    return {"steps": records, "prefill_selections": prefill}


def _cosine(a, b):
    import torch

    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).tolist()


def _overlaps(overlap: dict[int, list[float]], layer: int, a, b) -> None:
    for row_a, row_b in zip(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])):
        want, got = set(row_a[row_a >= 0].tolist()), set(row_b[row_b >= 0].tolist())
        overlap.setdefault(layer, []).append(len(want & got) / max(1, len(want)))


def _summary(overlap: dict[int, list[float]]) -> dict:
    return {str(layer): {"mean": statistics.fmean(v), "min": min(v), "rows": len(v)} for layer, v in overlap.items() if v}


def _compare(reference: dict, other: dict) -> dict:
    hidden, logits, agree = [], [], []
    overlap: dict[int, list[float]] = {}
    prefill: dict[int, list[float]] = {}
    for layer, (a, b) in enumerate(zip(reference["prefill_selections"], other["prefill_selections"])):
        _overlaps(prefill, layer, a, b)
    for ref, q in zip(reference["steps"], other["steps"]):
        hidden += _cosine(ref["hidden"], q["hidden"])
        logits += _cosine(ref["logits"], q["logits"])
        agree += (ref["logits"].argmax(-1) == q["logits"].argmax(-1)).tolist()
        for layer, (a, b) in enumerate(zip(ref["selections"], q["selections"])):
            _overlaps(overlap, layer, a, b)
    return {"hidden_cosine": {"median": statistics.median(hidden), "min": min(hidden)},
            "logits_cosine": {"median": statistics.median(logits), "min": min(logits)},
            "argmax_agreement": sum(agree) / len(agree),
            "topk_overlap": _summary(overlap), "prefill_topk_overlap": _summary(prefill)}


#: Each comparison of the report: (reference run, compared run).
COMPARISONS = {"fp8_vs_bf16": ("bf16", "fp8"), "fp8_latent_only_vs_bf16": ("bf16", "fp8_latent_only"),
               "fp8_index_keys_only_vs_bf16": ("bf16", "fp8_index_keys_only"),
               "fp8_indexer_vs_bf16": ("bf16", "fp8_indexer"), "bf16_vs_fp32": ("fp32", "bf16")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--prompt", type=int, default=1024, help="prompt tokens before the decode steps")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--prefill-chunk", type=int, default=1024, help="prompt tokens per call (bounds memory)")
    parser.add_argument("--runs", default=",".join(COMPARISONS),
                        help=f"comparisons to make, comma-separated (default all: {','.join(COMPARISONS)})")
    args = parser.parse_args(argv)
    wanted = [name for name in args.runs.split(",") if name]
    unknown = sorted(set(wanted) - set(COMPARISONS))
    if unknown:
        parser.error(f"unknown --runs {unknown}; choose from {', '.join(COMPARISONS)}")

    import torch

    from dsa_export.hf import kv_quant
    from dsa_export.hf.model import PAGE_SIZE
    from dsa_export.hf.source import hf_reference, hf_source

    began = time.perf_counter()
    module = hf_source(hf_reference(args.checkpoint, graph="paged")).module_loader()
    cfg = module.hf.config
    prompt = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), generator=torch.Generator().manual_seed(args.seed))

    def bf16(x, latent, rope):
        return kv_quant.bf16_roundtrip(x)

    def fp8(x, latent, rope):
        return kv_quant.latent_roundtrip(x, rope) if latent else kv_quant.index_keys_roundtrip(x)

    def exact(x, latent, rope):
        return x

    def fp8_latent(x, latent, rope):  # the latent in FP8, the index keys in bf16
        return kv_quant.latent_roundtrip(x, rope) if latent else kv_quant.bf16_roundtrip(x)

    def fp8_index(x, latent, rope):  # the index keys in FP8, the latent in bf16
        return kv_quant.bf16_roundtrip(x) if latent else kv_quant.index_keys_roundtrip(x)

    codecs = {"fp32": (exact, None), "bf16": (bf16, None), "fp8": (fp8, None), "fp8_latent_only": (fp8_latent, None),
              "fp8_index_keys_only": (fp8_index, None), "fp8_indexer": (fp8_index, kv_quant.query_roundtrip)}
    needed = sorted({run for name in wanted for run in COMPARISONS[name]}, key=list(codecs).index)
    runs = {}
    for name in needed:
        codec, query = codecs[name]
        runs[name] = _run(module, prompt, args.steps, args.batch, codec, PAGE_SIZE, query=query,
                          chunk=args.prefill_chunk)
    report = {
        "checkpoint": str(args.checkpoint), "prompt": args.prompt, "steps": args.steps, "batch": args.batch,
        "index_topk": cfg.index_topk, "latent_bytes_per_token": {"fp8": kv_quant.latent_bytes_per_token(
            cfg.kv_lora_rank, cfg.qk_rope_head_dim), "bf16": 2 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)},
        "index_key_bytes_per_token": {"fp8": kv_quant.index_key_bytes_per_token(cfg.index_head_dim),
                                      "bf16": 2 * cfg.index_head_dim},
        **{name: _compare(runs[COMPARISONS[name][0]], runs[COMPARISONS[name][1]]) for name in wanted},
        "seconds": round(time.perf_counter() - began, 1),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
