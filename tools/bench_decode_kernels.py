#!/usr/bin/env python3
"""Decode-step kernels over paged caches on one GPU: time per layer next to the bytes it must read.

    python tools/bench_decode_kernels.py --out bench_decode.json [--lib libdsa_kernels.so]
        [--batches 1,8,64] [--contexts 8192,32768,131072] [--caches bf16,fp8] [--budget-s 35]

One DeepSeek-V3.2 layer's sparse part at decode (one query per row): the indexer over a paged
index-key cache (64 heads x 128, top-2048, page 64) and the sparse attention over the paged
latent cache (128 heads, 576 = 512 + 64 RoPE channels, values from keys, split-KV chosen by the
launcher), for each batch x context, with the caches in bf16 (1152 + 256 bytes a token) or in
the FP8 layouts (FlashMLA's 656-byte latent, DeepGEMM's 132-byte index keys). Pages are handed out
in a shuffled order, as an allocator that has run a while does. Reported per case: median
microseconds of each kernel (CUDA events), the bytes each must read (the index keys of every
cached token; the selected latent rows) and the rate that makes against this GPU's copy bandwidth
(a 2 GiB device-to-device copy, measured in the same run).

Every timed output is spot-checked on batch row 0 against the torch ops of dsa_export.ops (the
contract's references): the selection must be a top set of the float32 scores up to 1e-3 of their
scale, the attention output within 2e-2 of its scale; a case that fails is "valid": false and
the exit status is 1. ``--device cpu`` runs the same code on the CPU emulator's kernels at small
sizes (the test of this script), where the times mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

PAGE = 64


def shape_args(real: bool) -> dict:
    """DeepSeek-V3.2's widths, or small ones the CPU emulator runs in seconds."""
    if real:
        return {"H": 128, "C": 512, "R": 64, "HI": 64, "D": 128, "topk": 2048}
    return {"H": 16, "C": 128, "R": 64, "HI": 16, "D": 64, "topk": 64}


def timer(device: str, fn, *, iters: int = 5) -> float:
    """Median seconds of ``fn`` (CUDA events on a GPU, wall clock on the CPU)."""
    fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth(device: str, nbytes: int = 2 << 30) -> float:
    """Bytes per second a device-to-device copy moves (read + write)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / timer(device, lambda: dst.copy_(src), iters=3)


def make_case(batch: int, context: int, cache: str, dims: dict, device: str, seed: int) -> dict:
    """Pools, block table, queries of one decode step (each row's query at position context-1)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    blocks = -(-context // PAGE)
    pages = batch * blocks + 1
    table = (1 + torch.randperm(pages - 1, generator=gen)).to(torch.int32).reshape(batch, blocks)
    C, R, D = dims["C"], dims["R"], dims["D"]

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    case = {"table": table.to(device), "q": randn(batch, 1, dims["H"], C + R, scale=0.5).to(torch.bfloat16),
            "iq": randn(batch, 1, dims["HI"], D).to(torch.bfloat16),
            "w": randn(batch, 1, dims["HI"], scale=dims["HI"] ** -0.5).float(),
            "start": torch.full((batch,), context - 1, dtype=torch.int32, device=device),
            "lengths": torch.full((batch,), context, dtype=torch.int32, device=device)}
    if cache == "bf16":
        case["latent"] = randn(pages, PAGE, 1, C + R, scale=0.5).to(torch.bfloat16)
        case["keys"] = randn(pages, PAGE, D).to(torch.bfloat16)
        return case
    # FP8 e4m3 codes of normal values (no NaN patterns) with float32 scales, RoPE in bf16.
    def codes(*shape):
        magnitude = torch.randint(8, 0x70, shape, generator=gen, dtype=torch.int32)
        sign = torch.randint(0, 2, shape, generator=gen, dtype=torch.int32) * 0x80
        return (magnitude + sign).to(torch.uint8).to(device)

    case["latent"] = codes(pages, PAGE, 1, C)
    case["latent_scale"] = (torch.rand(pages, PAGE, 1, C // 128 if C % 128 == 0 else 1, generator=gen) * 0.01
                            + 1e-3).to(device)
    case["rope"] = randn(pages, PAGE, 1, R, scale=0.5).to(torch.bfloat16)
    case["keys"] = codes(pages, PAGE, D)
    case["key_scale"] = (torch.rand(pages, PAGE, 1, generator=gen) * 0.01 + 1e-3).to(device)
    return case


def read_bytes(batch: int, context: int, cache: str, dims: dict) -> tuple[int, int]:
    """(indexer, attention) bytes a decode step of one layer must read from the caches."""
    C, R, D, K = dims["C"], dims["R"], dims["D"], dims["topk"]
    if cache == "bf16":
        key_token, latent_token = 2 * D, 2 * (C + R)
    else:
        key_token, latent_token = D + 4, C + 4 * (C // 128 if C % 128 == 0 else 1) + 2 * R
    return batch * context * key_token, batch * min(K, context) * latent_token


def run_case(kl, batch: int, context: int, cache: str, dims: dict, device: str, seed: int = 0) -> dict:
    case = make_case(batch, context, cache, dims, device, seed)
    fp8 = cache == "fp8"
    C, R, D, topk = dims["C"], dims["R"], dims["D"], dims["topk"]
    scale_i, scale_a = D ** -0.5, (C + R) ** -0.5
    blocks = case["table"].shape[1]
    ix_ws = torch.empty(kl.indexer_topk_paged_workspace_size(batch, 1, blocks, PAGE, dims["HI"], D, topk),
                        dtype=torch.uint8, device=device)
    sa_ws = torch.empty(max(16, kl.sparse_attention_paged_workspace_size(batch, 1, dims["H"], 1, C, topk)),
                        dtype=torch.uint8, device=device)

    def indexer():
        return kl.indexer_topk_paged(case["iq"], case["keys"], case["w"], case["table"], case["start"],
                                     case["lengths"], topk=topk, scale=scale_i,
                                     k_scale_pool=case.get("key_scale"), workspace=ix_ws)

    selected = indexer()

    def attention():
        if fp8:
            return kl.sparse_attention_paged_fp8(case["q"], case["latent"], case["latent_scale"], case["rope"],
                                                 selected, case["table"], scale=scale_a,
                                                 block_size=128 if C % 128 == 0 else C, workspace=sa_ws)
        return kl.sparse_attention_paged(case["q"], case["latent"], None, selected, case["table"], scale=scale_a,
                                         v_head_dim=C, workspace=sa_ws)

    out = attention()
    t_ix, t_sa = timer(device, indexer), timer(device, attention)
    ix_bytes, sa_bytes = read_bytes(batch, context, cache, dims)
    result = {"batch": batch, "context": context, "cache": cache,
              "splits": kl.sparse_attention_paged_num_splits(batch, 1, dims["H"], 1, topk),
              "indexer_us": t_ix * 1e6, "attention_us": t_sa * 1e6,
              "indexer_bytes": ix_bytes, "attention_bytes": sa_bytes,
              "indexer_gbs": ix_bytes / t_ix / 1e9, "attention_gbs": sa_bytes / t_sa / 1e9}
    result.update(check_row0(case, selected, out, fp8, dims, scale_i, scale_a))
    return result


def check_row0(case: dict, selected, out, fp8: bool, dims: dict, scale_i: float, scale_a: float) -> dict:
    """Batch row 0 against the contract's torch ops (float32 on the case's device)."""
    from dsa_export import ops
    from dsa_export.ops.torch_ops import decode_fp8

    C, topk = dims["C"], dims["topk"]
    row = slice(0, 1)
    table = case["table"][row]
    lengths = case["lengths"][row]
    # Indexer: float32 scores of every key of row 0, the selection a top set of them.
    keys = case["keys"]
    if fp8:
        keys = decode_fp8(keys) * case["key_scale"].float()
    n = int(lengths[0])
    pages = table[0].long()
    flat = keys.float().index_select(0, pages).reshape(-1, keys.shape[-1])[:n]
    q = case["iq"][0, 0].float()
    scores = (torch.relu(q @ flat.t() * scale_i) * case["w"][0, 0].float().unsqueeze(1)).sum(0)
    got = selected[0, 0].long()
    got = got[got >= 0]
    problems = []
    want_n = min(topk, n)
    if got.numel() != want_n or got.unique().numel() != want_n or int(got.max()) >= n:
        problems.append(f"{got.numel()} indices ({got.unique().numel()} distinct), expected {want_n} in [0, {n})")
    else:
        kth = scores.topk(want_n).values.min().item()
        tol = 1e-3 * max(scores.abs().max().item(), 1e-12)
        if scores[got].min().item() < kth - tol:
            problems.append(f"a key below the k-th score {kth:.6g} - {tol:.3g} was selected")
    # Attention: the op's torch implementation on the same selection.
    q_a = case["q"][row].float()
    if fp8:
        want = ops.dsa_sparse_attention_paged_fp8(q_a, case["latent"], case["latent_scale"], case["rope"],
                                                  selected[row], table, scale=scale_a,
                                                  block_size=128 if C % 128 == 0 else C)
    else:
        want = ops.dsa_sparse_attention_paged(q_a, case["latent"].float(), None, selected[row], table,
                                              scale=scale_a, v_head_dim=C)
    err = (out[row].float() - want.float()).abs().max().item()
    bound = 2e-2 * max(want.abs().max().item(), 1e-3)
    if not (math.isfinite(err) and err <= bound):
        problems.append(f"attention max error {err:.3g} above {bound:.3g}")
    return {"attention_max_err": err, "attention_bound": bound, "valid": not problems,
            **({"check_problems": problems} if problems else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lib", default=None, help="libdsa_kernels.so (default: the installed one)")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--contexts", default="8192,32768,131072")
    parser.add_argument("--caches", default="bf16,fp8")
    parser.add_argument("--budget-s", type=float, default=35.0, help="stop starting cases after this many seconds")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the emulated kernels at small widths (tests the script, times mean nothing)")
    args = parser.parse_args(argv)
    batches = [int(x) for x in args.batches.split(",") if x]
    contexts = [int(x) for x in args.contexts.split(",") if x]
    caches = [x for x in args.caches.split(",") if x]
    if any(c not in ("bf16", "fp8") for c in caches):
        parser.error(f"--caches takes bf16 and fp8; got {args.caches}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("bench_decode_kernels: no CUDA device; nothing measured.", file=sys.stderr)
            return 2
        from dsa_export.plugins.kernels import load_kernels

        kl = load_kernels(args.lib)
        dims = shape_args(real=True)
    else:
        from tests.emulation.harness import EmulatedKernels

        kl = EmulatedKernels()
        dims = shape_args(real=False)
    report = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (emulated kernels)",
              "dims": dims, "page": PAGE, "copy_bandwidth_gbs": copy_bandwidth(args.device, 2 << 30 if
                                                                                  args.device == "cuda" else 1 << 24) / 1e9,
              "cases": [], "skipped": []}
    began = time.monotonic()
    for cache in caches:
        for batch in batches:
            for context in contexts:
                name = f"{cache}-b{batch}-ctx{context}"
                if time.monotonic() - began > args.budget_s:
                    report["skipped"].append(name)
                    continue
                entry = {"case": name}
                try:
                    entry.update(run_case(kl, batch, context, cache, dims, args.device))
                    bw = report["copy_bandwidth_gbs"]
                    entry["indexer_of_bandwidth"] = entry["indexer_gbs"] / bw
                    entry["attention_of_bandwidth"] = entry["attention_gbs"] / bw
                except Exception as exc:  # a failing case is recorded, the run goes on
                    entry.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=3),
                                 valid=False)
                if args.device == "cuda":
                    torch.cuda.empty_cache()
                elif hasattr(kl, "reset"):
                    kl.reset()
                report["cases"].append(entry)
                print(json.dumps({k: v for k, v in entry.items() if k != "traceback"}), flush=True)
                args.out.write_text(json.dumps(report, indent=2))
    report["invalid_cases"] = [c["case"] for c in report["cases"] if not c.get("valid")]
    args.out.write_text(json.dumps(report, indent=2))
    return 1 if report["invalid_cases"] else 0


if __name__ == "__main__":
    sys.exit(main())
