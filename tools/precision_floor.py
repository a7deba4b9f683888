#!/usr/bin/env python3
"""How far a DSA checkpoint's own bf16 run lies from its float32 run: the floor under any
quantized build's accuracy figures.

    python tools/precision_floor.py CKPT [--prompts 2] [--length 512] [--seed 0] [--json FILE]

CKPT is a DeepSeek-V3.2 / GLM-5 checkpoint (e.g. a real-width synthetic one from
tools/make_synthetic_checkpoint.py; FP8 weights are dequantized). transformers' own model (the
oracle, not our export) runs the same random prompts (``--prompts`` rows of ``--length`` token
ids, as the pipeline report's calibration files hold them) twice: in float32, then with every
weight and activation in bfloat16. Reported with the pipeline report's measures
(dsa_export.stages.report: the same functions): final-logit cosine and SQNR over all positions,
greedy (arg max) agreement per position, and per indexer layer the top-k overlap of the bf16
selections with the float32 ones, over all query rows and over the rows that choose among more
keys than the top-k (the others select every key they may, so they agree trivially).

What it tells: a quantized build is judged against a reference run; when the bf16 run itself moves
a layer's selections by more than a bar allows, an exact (float32) build would miss that bar
against the bf16 build, and so would any quantized one. Memory: the model's weights in float32
once (converted to bf16 in place for the second run) plus one prefill's activations.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path


def _run(reference, ids):
    import torch

    mask = torch.ones_like(ids)
    outputs, selections = reference.run_with_selections(ids, mask)
    return outputs[0].float().numpy(), {layer: idx.numpy() for layer, (idx, _) in selections.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from dsa_export.hf.reference import load_reference
    from dsa_export.quantize.report import cosine, selection_overlap, sqnr_db

    config = json.loads((args.checkpoint / "config.json").read_text())
    layers = config["num_hidden_layers"]
    topk = config.get("index_topk")
    started = time.perf_counter()
    reference = load_reference(args.checkpoint, config, 0, layers, embed=True, head=True)
    rng = np.random.default_rng(args.seed)
    ids = torch.from_numpy(rng.integers(0, config["vocab_size"], (args.prompts, args.length)))
    with torch.no_grad():
        logits32, sel32 = _run(reference, ids)
        reference.to(torch.bfloat16)
        logits16, sel16 = _run(reference, ids)

    # Row t (0-based) of a causal prompt may select among t + 1 keys.
    keys = np.broadcast_to(np.arange(1, args.length + 1), (args.prompts, args.length)).reshape(-1)
    layers_out = {}
    for layer in sorted(sel32):
        per_row = selection_overlap(sel32[layer], sel16[layer], args.length)
        chooses = per_row[keys > topk] if topk else per_row
        layers_out[layer] = {"overlap": float(per_row.mean()), "worst_row": float(per_row.min()),
                             "rows": int(per_row.size),
                             "overlap_rows_choosing": float(chooses.mean()) if chooses.size else None,
                             "worst_row_choosing": float(chooses.min()) if chooses.size else None,
                             "rows_choosing": int(chooses.size)}
    result = {
        "checkpoint": str(args.checkpoint), "prompts": args.prompts, "length": args.length, "index_topk": topk,
        "logits_cosine": cosine(logits32, logits16), "logits_sqnr_db": sqnr_db(logits32, logits16),
        "greedy_agreement": float((logits32.argmax(-1) == logits16.argmax(-1)).mean()),
        "topk_overlap": layers_out, "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    print(f"bf16 against float32, transformers, {args.prompts} x {args.length} random tokens (index top-k {topk}):")
    print(f"  logits cosine {result['logits_cosine']:.5f}, SQNR {result['logits_sqnr_db']:.2f} dB, "
          f"greedy agreement {result['greedy_agreement']:.4f}")
    for layer, row in layers_out.items():
        choosing = ("" if row["overlap_rows_choosing"] is None else
                    f"; rows choosing among > top-k keys: {row['overlap_rows_choosing']:.4f} "
                    f"(worst {row['worst_row_choosing']:.4f}, {row['rows_choosing']} rows)")
        print(f"  layer {layer}: top-k overlap {row['overlap']:.4f} (worst row {row['worst_row']:.4f}, "
              f"{row['rows']} rows){choosing}")
    print(f"  {result['seconds']} s, peak RSS {result['peak_rss_gib']} GiB")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
