#!/usr/bin/env python3
"""Benchmark the routed-experts kernels (DSAMoEExperts / DSAMoEExpertsFP8, through the C ABI) on one GPU.

  python tools/bench_moe_kernel.py --out bench_moe.json [--lib path/to/libdsa_kernels.so] [--quick]
                                   [--budget-s 90] [--experts 256]

One DeepSeek-V3.2 MoE layer: H = 7168, I = 2048, top-8 of 256 routed experts (22.5 GB of bf16
weights, 11.3 GB FP8 + block scales), random balanced routing (8 distinct experts per token).
Tokens N = 1, 16, 128, 1024, 4096 (--quick: 1, 128, 4096) for bf16 and FP8 weights with bf16 x.
Reports per case:
  * ms per call (median of CUDA-event timings),
  * TFLOP/s counting 6 * H * I FLOPs per routed slot (2 * 2I * H for gate_up, 2 * H * I for down),
  * GB/s of expert weights: bytes of the distinct experts the batch touches / time (what bounds
    decode; H200 HBM3e peaks at about 4.8 TB/s),
  * the kernel family the library picked,
  * for bf16: a torch baseline over the same routing (tokens sorted by expert, one gate_up and one
    down matmul per active expert, index_add combine), and its ratio.
Cases run in order of interest (decode and the largest prefill first) until --budget-s is spent;
every case records its error instead of aborting the run. Writes one JSON document, rewritten
after every case.

Every timed case checks its output for a few tokens (first, middle, last) against a float32 torch
reference of the same routing (FP8 experts dequantized with their block scales), within the GPU
tests' bounds (1e-2 of the output scale for bf16 experts, 2e-2 for FP8). A case that fails gets
"valid": false, is listed under "invalid_cases", counts toward no goal, and the exit status is 1.
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

import torch  # noqa: E402

from dsa_export.plugins.kernels import load_kernels  # noqa: E402

H, I, K = 7168, 2048, 8


def cuda_time(fn, *, warmup: int = 2, iters: int = 10, budget_s: float = 10.0) -> float:
    """Median seconds per call, with fewer iterations when one call is slow."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    t_start = time.monotonic()
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
        if time.monotonic() - t_start > budget_s:
            break
    times.sort()
    return times[len(times) // 2]


def make_layer(E: int, fp8: bool, gen: torch.Generator):
    """Random expert weights at DeepSeek width, built one expert at a time (bounded temporaries)."""
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    gate_up = torch.empty(E, 2 * I, H, device="cuda", dtype=dtype)
    down = torch.empty(E, H, I, device="cuda", dtype=dtype)
    for e in range(E):
        for w, std in ((gate_up[e], H ** -0.5), (down[e], I ** -0.5)):
            r = torch.randn(w.shape, device="cuda", generator=gen)
            # FP8: values around 32 (well inside e4m3's +-448), the block scale brings them back to std.
            w.copy_((r * 32).to(dtype) if fp8 else (r * std).to(dtype))
    if not fp8:
        return gate_up, down, None, None
    gu_scale = torch.full((E, -(-2 * I // 128), -(-H // 128)), H ** -0.5 / 32, device="cuda")
    dn_scale = torch.full((E, -(-H // 128), -(-I // 128)), I ** -0.5 / 32, device="cuda")
    return gate_up, down, gu_scale, dn_scale


def torch_moe(x, ids, w, gate_up, down):
    """Baseline: tokens sorted by expert, two matmuls per active expert, fp32 index_add combine."""
    N = x.shape[0]
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    tok = order // ids.shape[1]
    wts = w.reshape(-1)[order].unsqueeze(1)
    out = torch.zeros(N, x.shape[1], device=x.device, dtype=torch.float32)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        t = tok[start:start + c]
        h = x[t] @ gate_up[e].t()
        a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
        out.index_add_(0, t, (a @ down[e].t()).float() * wts[start:start + c])
        start += c
    return out.to(x.dtype)


CHECK_TOL = {False: 1e-2, True: 2e-2}  # max |out - ref| / max |ref|, as MOE_TOL in tests/plugins/test_kernels_gpu.py


def dequantized(weight: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """float32 copy of one expert matrix; FP8 values times the scale of their 128 x 128 block."""
    if scale is None:
        return weight.float()
    rows, cols = weight.shape
    full = scale.repeat_interleave(128, dim=0)[:rows].repeat_interleave(128, dim=1)[:, :cols]
    return weight.float() * full


def check_tokens(got, x, ids, w, layer) -> dict:
    """got[n] for a few tokens n against the routed-experts formula in float32."""
    gate_up, down, gu_scale, dn_scale = layer
    fp8 = gu_scale is not None
    N, inter = x.shape[0], down.shape[2]
    tokens = sorted({0, N // 2, N - 1})
    worst, scale = 0.0, 0.0
    for n in tokens:
        want = torch.zeros(x.shape[1], device=x.device, dtype=torch.float32)
        for j in range(ids.shape[1]):
            e = int(ids[n, j])
            if not 0 <= e < gate_up.shape[0]:
                continue
            h = dequantized(gate_up[e], gu_scale[e] if fp8 else None) @ x[n].float()
            act = torch.nn.functional.silu(h[:inter]) * h[inter:]
            want += float(w[n, j]) * (dequantized(down[e], dn_scale[e] if fp8 else None) @ act)
        worst = max(worst, (got[n].float() - want).abs().max().item())
        scale = max(scale, want.abs().max().item())
    rel = worst / max(scale, 1e-6)
    ok = math.isfinite(rel) and rel <= CHECK_TOL[fp8]
    return {"checked_tokens": tokens, "max_rel_err": rel, "tol": CHECK_TOL[fp8], "valid": ok}


def moe_case(kern, layer, N: int, fp8: bool, E: int, gen: torch.Generator, refs: bool) -> dict:
    gate_up, down, gu_scale, dn_scale = layer
    x = torch.randn(N, H, device="cuda", generator=gen).to(torch.bfloat16)
    ids = torch.rand(N, E, device="cuda", generator=gen).topk(K, dim=1).indices.to(torch.int32)
    w = torch.rand(N, K, device="cuda", generator=gen).softmax(dim=1)
    ws = torch.empty(kern.moe_experts_workspace_size(N, K, E, H, I, torch.bfloat16), dtype=torch.uint8, device="cuda")
    fn = lambda: kern.moe_experts(x, ids, w, gate_up, down, gu_scale, dn_scale, workspace=ws)  # noqa: E731
    t = cuda_time(fn)
    active = int(torch.unique(ids).numel())
    weight_bytes = active * 3 * H * I * (1 if fp8 else 2)
    if fp8:
        weight_bytes += active * 4 * (gu_scale[0].numel() + dn_scale[0].numel())
    flops = 6.0 * H * I * N * K
    out = {"N": N, "K": K, "E": E, "H": H, "I": I, "x": "bf16",
           "experts": "fp8_e4m3 (128x128 scales)" if fp8 else "bf16",
           "path": kern.moe_experts_path(N, K, E, H, I, torch.bfloat16, torch.float8_e4m3fn if fp8 else None),
           "active_experts": active, "workspace_mib": ws.numel() / 2**20, "kernel_ms": t * 1e3,
           "kernel_tflops": flops / t / 1e12, "weight_gbps": weight_bytes / t / 1e9}
    out["check"] = check_tokens(fn(), x, ids, w, layer)
    out["valid"] = out["check"]["valid"]
    if refs and not fp8:
        try:
            tr = cuda_time(lambda: torch_moe(x, ids, w, gate_up, down), warmup=1, iters=3)
            out.update(torch_ms=tr * 1e3, torch_tflops=flops / tr / 1e12, speedup_vs_torch=tr / t)
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            out["torch_error"] = f"{type(exc).__name__}: {exc}"
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--lib", type=Path, default=None, help="libdsa_kernels.so (default: the loader's search)")
    parser.add_argument("--quick", action="store_true", help="only N = 1, 128, 4096")
    parser.add_argument("--no-refs", action="store_true", help="skip the torch baseline")
    parser.add_argument("--experts", type=int, default=256, help="routed experts in the layer (default 256)")
    parser.add_argument("--budget-s", type=float, default=90.0, help="stop starting new cases after this long")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    kern = load_kernels(args.lib)
    sizes = [1, 4096, 128] if args.quick else [1, 4096, 128, 16, 1024]
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "library": str(kern.path),
        "flop_convention": "6 * H * I per routed slot (gate_up 2*2I*H + down 2*H*I); weight_gbps counts the bytes "
                           "of the distinct experts a batch touches",
        "moe_experts": [],
    }
    gen = torch.Generator(device="cuda").manual_seed(0)
    t0 = time.monotonic()

    def dump() -> None:  # after every case, so a run stopped by its timeout keeps what it measured
        results["wall_s"] = time.monotonic() - t0
        results["invalid_cases"] = [e["case"] for e in results["moe_experts"] if e.get("valid") is False]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))

    results["finished"] = False
    for fp8 in (False, True):
        if time.monotonic() - t0 > args.budget_s:
            break
        try:
            layer = make_layer(args.experts, fp8, gen)
        except Exception as exc:  # noqa: BLE001
            results["moe_experts"].append({"case": f"layer fp8={fp8}", "error": f"{type(exc).__name__}: {exc}"})
            continue
        for N in sizes:
            if time.monotonic() - t0 > args.budget_s:
                results.setdefault("skipped_for_time", []).append(f"N={N} fp8={fp8}")
                continue
            entry = {"case": f"moe N={N} {'fp8' if fp8 else 'bf16'}"}
            try:
                entry.update(moe_case(kern, layer, N, fp8, args.experts, gen, refs=not args.no_refs))
            except Exception as exc:  # noqa: BLE001 - a failing case is recorded, the run goes on
                entry["error"] = f"{type(exc).__name__}: {exc}"
                entry["traceback"] = traceback.format_exc(limit=3)
            results["moe_experts"].append(entry)
            print(json.dumps({k: v for k, v in entry.items() if k != "traceback"}), flush=True)
            dump()
        del layer
        torch.cuda.empty_cache()
    goals = {}
    for e in results["moe_experts"]:
        if "kernel_tflops" not in e or not e.get("valid"):  # only checked outputs count toward a goal
            continue
        tag = "fp8" if e["experts"].startswith("fp8") else "bf16"
        if e["N"] == 1:
            goals[f"decode_n1_{tag}_weight_gbps"] = e["weight_gbps"]
        if e["N"] == 4096:
            goals[f"prefill_n4096_{tag}_tflops"] = e["kernel_tflops"]
        if "speedup_vs_torch" in e:
            goals.setdefault("speedup_vs_torch_bf16", {})[str(e["N"])] = e["speedup_vs_torch"]
    results["goals"] = goals
    results["finished"] = True
    dump()
    print(f"wrote {args.out}")
    if results["invalid_cases"]:
        print(f"INVALID (output disagrees with the reference): {results['invalid_cases']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
