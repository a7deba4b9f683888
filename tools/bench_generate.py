#!/usr/bin/env python3
"""Prefill and decode tokens/s of `generate` at several context lengths, next to this machine's bound.

    python tools/bench_generate.py MODEL --checkpoint CKPT --batch 4 --contexts 512,2048,8192 \\
        --new-tokens 8 [--eager-contexts 512] [--json FILE]

MODEL is what `dsa-export generate` takes (a decode- or paged-graph .onnx, a build folder or a
stage export / stage build); `--prefill-chunk N` feeds a paged graph's prompts N tokens at a
time. For each context length L, one prompt batch ``[B, L]`` of random ids is generated from
with the session opened once, in this process, and reported:

* prefill tokens/s (B*L over the prefill call) and its bound: the step's FLOPs (weights touched
  per token, the indexer's ``L x L / 2`` scores and the attention of each query over its top-k
  keys) at the float32 GEMM rate measured here;
* decode tokens/s (median step) and its bound: weights and caches read once per step at the
  memory bandwidth measured here (a large numpy copy);
* peak resident-set growth of the whole generation (/proc high-water mark).

With --eager-contexts, transformers' model (the checkpoint in float32, PyTorch eager mode, its
attention ``--eager-attention``: ``eager`` by default, ``sdpa`` is transformers' own default) decodes
from the same prompt at those lengths for comparison, alternated with ours ``--rounds`` times (default 3) so that
the machine's drift meets both alike; the ratio reported is the median of the rounds' ratios. Figures are medians of one run on a noisy machine: read
the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def bandwidth_gbs(size_mb: int = 512, repeats: int = 5) -> float:
    """Bytes moved per second by a numpy copy (reads + writes), best of ``repeats``."""
    src = np.ones(size_mb * 2**20 // 4, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - began)
    return 2 * src.nbytes / best / 1e9


def graph_facts(model_path: Path) -> dict:
    """Weight bytes, weights touched per token (routed experts counted k of E) and cache widths,
    from the .onnx files of MODEL (external data not loaded)."""
    import onnx

    from dsa_export.runtime.memory import weight_bytes
    from dsa_export.stages.record import PIPELINE_NAME, read_pipeline

    if model_path.is_dir() and (model_path / PIPELINE_NAME).is_file():
        pipeline = read_pipeline(model_path)
        files = [model_path / stage.onnx for stage in pipeline.stages]
    elif model_path.is_dir():
        files = sorted(model_path.glob("*.onnx"))[:1]
    else:
        files = [model_path]
    total = active = 0
    cache_width = 0
    for file in files:
        model = onnx.load(str(file), load_external_data=False)
        sizes = {t.name: int(np.prod(t.dims)) * (4 if t.data_type == 1 else 2 if t.data_type in (10, 16) else 1)
                 for t in model.graph.initializer}
        total += weight_bytes(model)
        expert = 0
        for node in model.graph.node:
            if node.domain == "dsa" and node.op_type.startswith("DSAMoEExperts"):
                routed = sum(sizes.get(name, 0) for name in node.input[3:])
                ids = next((v for v in model.graph.value_info if v.name == node.input[1]), None)
                k = ids.type.tensor_type.shape.dim[1].dim_value if ids is not None else 0
                gate_up = next((t for t in model.graph.initializer if t.name == node.input[3]), None)
                experts = gate_up.dims[0] if gate_up is not None else 1
                expert += routed - routed * (k or experts) // max(1, experts)
        active += weight_bytes(model) - expert
        itemsize = {1: 4, 10: 2, 16: 2, 2: 1}  # float, float16, bfloat16, uint8 (FP8 codes)
        for value in model.graph.input:
            if value.name.startswith("past_"):
                cache_width += (value.type.tensor_type.shape.dim[2].dim_value
                                * itemsize.get(value.type.tensor_type.elem_type, 4))
    return {"weight_bytes": total, "active_weight_bytes": active, "cache_token_bytes": cache_width}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--checkpoint", type=Path, help="the Hugging Face folder (for --eager-contexts and FLOPs)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--contexts", default="512,2048,8192")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--eager-contexts", default="", help="contexts at which transformers eager runs too")
    parser.add_argument("--rounds", type=int, default=3,
                        help="at --eager-contexts: alternate ours and eager this many times, report the median ratio")
    parser.add_argument("--eager-attention", choices=("eager", "sdpa"), default="eager",
                        help="transformers' attn_implementation for the comparison (eager: its plain PyTorch "
                             "attention; sdpa: torch's scaled_dot_product_attention, transformers' default)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prefill-chunk", type=int, default=None,
                        help="paged graphs: feed each prompt in calls of at most N tokens")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    from dsa_export.bench.gemm import torch_gemm_gflops
    from dsa_export.bench.memory import measure_peak_rss
    from dsa_export.runtime import load
    from dsa_export.runtime.generate import SamplingSettings, generate
    from dsa_export.stages.session import PipelineSession, is_pipeline

    facts = graph_facts(args.model)
    config = json.loads((args.checkpoint / "config.json").read_text()) if args.checkpoint else {}
    hidden = int(config.get("hidden_size", 1024))
    bw = bandwidth_gbs()
    gemm = torch_gemm_gflops(hidden)
    print(f"machine: memory bandwidth {bw:.1f} GB/s (numpy copy), float32 GEMM {gemm:.1f} GFLOP/s "
          f"(torch.matmul 2048x{hidden}x{hidden})", file=sys.stderr)
    if is_pipeline(args.model):
        session = PipelineSession.open(args.model, "onnxruntime", threads=args.threads)
    else:
        options = {"threads": args.threads} if args.threads else {}
        session = PipelineSession.of_session(load(args.model, "onnxruntime", **options))
    rng = np.random.default_rng(0)
    vocab = int(config.get("vocab_size", 1000))
    b = args.batch
    eager_contexts = {int(c) for c in args.eager_contexts.split(",") if c}
    model = None
    if eager_contexts:
        import torch
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.checkpoint, dtype=torch.float32, attn_implementation=args.eager_attention).eval()

    def ours_round(prompt) -> tuple[object, float, int]:
        """One generate over ``prompt``: its result, median decode step (s) and peak RSS growth."""
        steps: list[float] = []

        def timed(ids, slot, micro, _forward=session.forward):
            began = time.perf_counter()
            out = _forward(ids, slot, micro)
            steps.append(time.perf_counter() - began)
            return out

        session.forward = timed  # type: ignore[method-assign]
        try:
            result, peak = measure_peak_rss(
                lambda: generate(session, prompt, SamplingSettings(
                    max_new_tokens=args.new_tokens, prefill_chunk=args.prefill_chunk)))
        finally:
            del session.forward
        decode_calls = steps[len(steps) - (args.new_tokens - 1):] if args.new_tokens > 1 else []  # after the prefill
        return result, statistics.median(decode_calls) if decode_calls else float("nan"), peak

    def eager_round(prompt) -> float:
        """transformers' eager decode over ``prompt``: median step (s)."""
        import torch

        times: list[float] = []
        with torch.no_grad():
            out = model(torch.from_numpy(prompt), use_cache=True)
            past = out.cache
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(args.new_tokens - 1):
                began = time.perf_counter()
                out = model(token, cache=past, use_cache=True)
                times.append(time.perf_counter() - began)
                past, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        return statistics.median(times)

    rows, eager = [], []
    try:
        generate(session, rng.integers(2, vocab, (b, 16)), SamplingSettings(max_new_tokens=2))  # warm-up
        for context in [int(c) for c in args.contexts.split(",") if c]:
            prompt = rng.integers(2, vocab, (b, context))
            rounds = args.rounds if context in eager_contexts else 1
            ours_steps, eager_steps, ratios, peak = [], [], [], 0
            for _ in range(rounds):  # alternated, so that the machine's drift meets both alike
                result, step, round_peak = ours_round(prompt)
                ours_steps.append(step)
                peak = max(peak, round_peak)
                if context in eager_contexts:
                    eager_steps.append(eager_round(prompt))
                    ratios.append(eager_steps[-1] / step)
            decode_step = statistics.median(ours_steps)
            cache_bytes = b * context * facts["cache_token_bytes"]
            decode_bound = b / ((facts["active_weight_bytes"] + cache_bytes) / (bw * 1e9))
            topk = int(config.get("index_topk", 2048))
            heads, index_heads = int(config.get("num_attention_heads", 1)), int(config.get("index_n_heads", 1))
            index_dim, layers = int(config.get("index_head_dim", 128)), int(config.get("num_hidden_layers", 1))
            latent = int(config.get("kv_lora_rank", 512)) + int(config.get("qk_rope_head_dim", 64))
            flops = (2 * facts["active_weight_bytes"] / 4 * b * context
                     + layers * b * (context * context * index_heads * index_dim  # 2 * L^2/2 scores
                                     + 2 * context * min(context, topk) * heads * (latent + latent - 64)))
            prefill_bound = b * context / (flops / (gemm * 1e9))
            row = {"context": context, "batch": b, "prefill_tokens_per_s": result.prefill_tokens_per_s,
                   "prefill_bound_tokens_per_s": prefill_bound, "decode_step_s": decode_step,
                   "decode_tokens_per_s": b / decode_step, "decode_bound_tokens_per_s": decode_bound,
                   "peak_rss_gib": peak / 2**30}
            rows.append(row)
            print(f"L={context:6d}  prefill {row['prefill_tokens_per_s']:9.1f} tok/s (bound {prefill_bound:9.1f})  "
                  f"decode {row['decode_tokens_per_s']:8.2f} tok/s (bound {decode_bound:8.1f}, step "
                  f"{decode_step * 1e3:.1f} ms)  peak RSS +{row['peak_rss_gib']:.2f} GiB", flush=True)
            if eager_steps:
                step = statistics.median(eager_steps)
                ratio = statistics.median(ratios)
                eager.append({"context": context, "attn_implementation": args.eager_attention,
                              "decode_tokens_per_s": b / step, "rounds": rounds,
                              "ratio_median": ratio, "ratios": ratios,
                              "ours_steps_s": ours_steps, "eager_steps_s": eager_steps})
                print(f"L={context:6d}  transformers ({args.eager_attention} attention) decode {b / step:8.2f} tok/s (bound {decode_bound:8.1f}); "
                      f"ours {ratio:.1f}x (median of {rounds} alternated rounds: "
                      f"{', '.join(f'{r:.1f}' for r in ratios)})", flush=True)
    finally:
        session.close()
    report = {"machine": {"bandwidth_gbs": bw, "gemm_gflops": gemm}, "graph": facts, "runs": rows, "eager": eager}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
