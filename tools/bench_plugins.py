#!/usr/bin/env python3
"""Benchmark the DSA CUDA kernels (through the C ABI) against torch references on one GPU.

  python tools/bench_plugins.py --out bench.json [--lib path/to/libdsa_kernels.so] [--quick]

Sparse attention: DeepSeek-V3.2 MQA form (Hkv = 1, Dk = 576, Dv = 512, K = 2048, bf16) at
S = 4K/16K/64K queries and H = 128/64, with the values as a separate v (plugin_*) and taken from
the keys (empty v, plugin_vfk_*: each selected row is read once); reports TFLOP/s counting
2*H*K*(Dk+Dv) per query for both, next to torch gather + batched matmul/softmax on the same
selection and dense causal SDPA (flash/efficient/cuDNN only, qk 192 / v 128 per head, the
non-absorbed MLA prefill form) at the same S.
Indexer + top-k: S = T = 4K/16K/64K, 64 indexer heads, D = 128, top-2048, bf16 q/k and fp32 w,
against torch matmul + ReLU/weighted head sum + topk, chunked over query rows to fit memory.

Every timed output is spot-checked against a float32 torch reference on a few query rows
(attention: max error within 2e-2 of the output scale; indexer: the selection is a top set of the
reference scores up to 1e-3 of their scale). A case that fails its check gets "valid": false, is
listed under "invalid_cases" and counts toward no goal, and the exit status is 1: a fast but wrong
kernel cannot report a speed. Writes one JSON document, rewritten after every case; every case
records its error instead of aborting the run.
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


def cuda_time(fn, *, warmup: int = 1, iters: int = 3, budget_s: float = 20.0) -> float:
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


def guarded(results: list, name: str, fn):
    entry = {"case": name}
    try:
        entry.update(fn())
    except Exception as exc:  # a failing case is recorded, the run goes on
        entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["traceback"] = traceback.format_exc(limit=3)
        torch.cuda.empty_cache()
    results.append(entry)
    print(json.dumps({k: v for k, v in entry.items() if k != "traceback"}), flush=True)


# ---------------------------------------------------------------------------------------------
# Spot checks: one timed output of every case against a float32 torch reference.
ATTN_CHECK_TOL = 2e-2   # bf16 output, fp32 accumulation (tests/plugins/test_kernels_gpu.py ATTN_TOL)
INDEXER_CHECK_TOL = 1e-3  # selection may differ only among keys within this of the k-th score


def check_rows(S: int) -> list[int]:
    return sorted({0, S // 2, S - 1})


def check_attention(out, q, k, v, idx, scale: float, Dv: int) -> dict:
    """out[0, s] for a few rows s against softmax(q k^T) v in float32 over the valid selection."""
    worst, bound = 0.0, 0.0
    rows = check_rows(q.shape[1])
    for s in rows:
        sel = idx[0, s].long()
        sel = sel[(sel >= 0) & (sel < k.shape[1])]
        kg = k[0, sel, 0].float()                                            # [K, Dk]
        vg = (v[0, sel, 0] if v is not None else k[0, sel, 0, :Dv]).float()  # values from keys: k prefix
        probs = torch.softmax(q[0, s].float() @ kg.t() * scale, dim=-1)      # [H, K]
        want = probs @ vg                                                    # [H, Dv]
        worst = max(worst, (out[0, s].float() - want).abs().max().item())
        bound = max(bound, ATTN_CHECK_TOL * max(want.abs().max().item(), 1e-3))
    ok = math.isfinite(worst) and worst <= bound
    return {"checked_rows": rows, "max_err": worst, "bound": bound, "valid": ok}


def check_indexer(out, q, k, w, topk: int, scale: float) -> dict:
    """The selection of a few rows against float32 scores: count, range, no duplicates, a top set."""
    S, T = q.shape[1], k.shape[1]
    problems = []
    rows = check_rows(S)
    kf = k[0].float()
    for s in rows:
        n = T - S + s + 1
        scores = (torch.relu(q[0, s].float() @ kf[:n].t() * scale) * w[0, s].float().unsqueeze(1)).sum(0)  # [n]
        row = out[0, s].long()
        got = row[row >= 0]
        want_n = min(topk, n)
        if got.numel() != want_n or got.unique().numel() != want_n or int(got.max()) >= n:
            problems.append(f"row {s}: {got.numel()} indices ({got.unique().numel()} distinct), "
                            f"expected {want_n} in [0, {n})")
            continue
        kth = scores.topk(want_n).values.min().item()
        tol = INDEXER_CHECK_TOL * max(scores.abs().max().item(), 1e-12)
        low = scores[got].min().item()
        if low < kth - tol:
            problems.append(f"row {s}: selected a key scoring {low:.6g} below the k-th score {kth:.6g} - {tol:.3g}")
    return {"checked_rows": rows, "valid": not problems, **({"check_problems": problems} if problems else {})}


# ---------------------------------------------------------------------------------------------
def sparse_attention_case(kern, S: int, H: int, K: int = 2048, Dk: int = 576, Dv: int = 512, refs: bool = True):
    dev = "cuda"
    T = S
    scale = Dk ** -0.5
    q = torch.randn(1, S, H, Dk, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(1, T, 1, Dk, device=dev, dtype=torch.bfloat16)
    k = kv
    v = kv[..., :Dv].contiguous()  # MLA: V is the first Dv channels of the latent
    empty_v = kv[:, :0, :, :Dv]    # the same values taken from the keys: one row read per selected key
    idx = torch.randint(0, T, (1, S, K), device=dev, dtype=torch.int32)
    flops = 2.0 * H * K * (Dk + Dv) * S
    t = cuda_time(lambda: kern.sparse_attention(q, k, v, idx, scale=scale), iters=5)
    t_vfk = cuda_time(lambda: kern.sparse_attention(q, k, empty_v, idx, scale=scale), iters=5)
    out = {"S": S, "H": H, "K": K, "Dk": Dk, "Dv": Dv, "dtype": "bf16",
           "path": kern.sparse_attention_path(H, 1, Dk, Dv, torch.bfloat16),
           "plugin_ms": t * 1e3, "plugin_tflops": flops / t / 1e12,
           "plugin_vfk_ms": t_vfk * 1e3, "plugin_vfk_tflops": flops / t_vfk / 1e12,
           "bytes_per_selected_row": {"explicit_v": (Dk + Dv) * 2, "values_from_keys": Dk * 2}}
    explicit = check_attention(kern.sparse_attention(q, k, v, idx, scale=scale), q, k, v, idx, scale, Dv)
    from_keys = check_attention(kern.sparse_attention(q, k, empty_v, idx, scale=scale), q, k, None, idx, scale, Dv)
    out["check"] = {"explicit_v": explicit, "values_from_keys": from_keys}
    out["valid"] = explicit["valid"] and from_keys["valid"]
    if refs:
        chunk = max(1, min(S, (1 << 30) // (K * (Dk + Dv) * 2)))

        def gather_attention():
            # SDPA with Dk = 576 has no fused kernel and its math path would expand K/V per head,
            # so the reference is the same math as batched matmuls on the gathered rows.
            res = torch.empty(1, S, H, Dv, device=dev, dtype=torch.bfloat16)
            for c0 in range(0, S, chunk):
                c1 = min(S, c0 + chunk)
                sel = idx[0, c0:c1].long()
                kg = k[0, :, 0][sel]                          # [C,K,Dk]
                vg = v[0, :, 0][sel]                          # [C,K,Dv]
                logits = torch.bmm(q[0, c0:c1], kg.transpose(1, 2)).float() * scale  # [C,H,K]
                probs = torch.softmax(logits, dim=-1).to(torch.bfloat16)
                res[0, c0:c1] = torch.bmm(probs, vg)
            return res

        try:
            tg = cuda_time(gather_attention, warmup=1, iters=2)
            out.update(torch_gather_ms=tg * 1e3, torch_gather_tflops=flops / tg / 1e12, speedup_vs_torch_gather=tg / t)
        except Exception as exc:
            out["torch_gather_error"] = f"{type(exc).__name__}: {exc}"
        del q, kv, k, v, empty_v, idx
        torch.cuda.empty_cache()
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            qd = torch.randn(1, H, S, 192, device=dev, dtype=torch.bfloat16)
            kd = torch.randn(1, H, S, 192, device=dev, dtype=torch.bfloat16)
            vd = torch.randn(1, H, S, 128, device=dev, dtype=torch.bfloat16)
            backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
            with sdpa_kernel(backends):
                td = cuda_time(lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True),
                               warmup=1, iters=2)
            dense_flops = 2.0 * H * (192 + 128) * S * S / 2
            out.update(dense_sdpa_ms=td * 1e3, dense_sdpa_tflops=dense_flops / td / 1e12,
                       dense_sdpa_shape="H x S x (qk 192, v 128), causal", speedup_vs_dense_sdpa=td / t)
            del qd, kd, vd
        except Exception as exc:
            out["dense_sdpa_error"] = f"{type(exc).__name__}: {exc}"
    torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------------------------
def torch_indexer_topk(q, k, w, topk, scale):
    """Chunked torch reference: bf16 matmul, ReLU, weighted head sum in fp32, causal mask, topk."""
    B, S, H, D = q.shape
    T = k.shape[1]
    out = torch.empty(B, S, topk, device=q.device, dtype=torch.int64)
    chunk = max(1, min(S, (1 << 31) // (H * T * 2)))
    kt = k[0].t()
    cols = torch.arange(T, device=q.device)
    for c0 in range(0, S, chunk):
        c1 = min(S, c0 + chunk)
        logits = (q[0, c0:c1].reshape(-1, D) @ kt).view(c1 - c0, H, T)
        scores = (torch.relu(logits.float() * scale) * w[0, c0:c1].unsqueeze(-1)).sum(1)
        limit = (T - S + torch.arange(c0, c1, device=q.device)).unsqueeze(1)
        scores.masked_fill_(cols.unsqueeze(0) > limit, float("-inf"))
        out[0, c0:c1] = scores.topk(min(topk, T), dim=-1).indices
    return out


def indexer_case(kern, S: int, H: int = 64, D: int = 128, topk: int = 2048, refs: bool = True):
    dev = "cuda"
    T = S
    scale = D ** -0.5
    q = torch.randn(1, S, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, T, D, device=dev, dtype=torch.bfloat16)
    w = torch.randn(1, S, H, device=dev, dtype=torch.float32) * H ** -0.5
    ws = torch.empty(kern.indexer_topk_workspace_size(1, S, T, H, D, topk), dtype=torch.uint8, device=dev)
    t = cuda_time(lambda: kern.indexer_topk(q, k, w, topk=topk, scale=scale, workspace=ws), iters=3)
    causal_flops = 2.0 * H * D * (S * (S + 1) / 2)
    out = {"S": S, "T": T, "H_I": H, "D": D, "topk": topk, "dtype": "bf16 q/k, fp32 w",
           "path": kern.indexer_topk_path(H, D, torch.bfloat16), "workspace_mib": ws.numel() / 2**20,
           "plugin_ms": t * 1e3, "plugin_logit_tflops": causal_flops / t / 1e12}
    got = kern.indexer_topk(q, k, w, topk=topk, scale=scale, workspace=ws)
    out["check"] = check_indexer(got, q, k, w, topk, scale)
    out["valid"] = out["check"]["valid"]
    if refs:
        try:
            tr = cuda_time(lambda: torch_indexer_topk(q, k, w, topk, scale), warmup=1, iters=2, budget_s=60)
            out.update(torch_matmul_topk_ms=tr * 1e3, speedup_vs_torch=tr / t)
        except Exception as exc:
            out["torch_error"] = f"{type(exc).__name__}: {exc}"
    del q, k, w, ws
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--lib", type=Path, default=None, help="libdsa_kernels.so (default: the loader's search)")
    parser.add_argument("--quick", action="store_true", help="only S = 4K and 16K")
    parser.add_argument("--no-refs", action="store_true", help="skip the torch references")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    kern = load_kernels(args.lib)
    sizes = [4096, 16384] if args.quick else [4096, 16384, 65536]
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "library": str(kern.path),
        "flop_convention": "sparse attention: 2*H*K*(Dk+Dv) per query; indexer: 2*H*D per allowed (s,t) pair",
        "sparse_attention": [],
        "indexer_topk": [],
    }
    torch.manual_seed(0)
    t0 = time.monotonic()

    def dump() -> None:  # after every case, so a run stopped by its timeout keeps what it measured
        results["wall_s"] = time.monotonic() - t0
        results["invalid_cases"] = [e["case"] for e in results["sparse_attention"] + results["indexer_topk"]
                                    if e.get("valid") is False]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2,
                                       default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o)))

    results["finished"] = False
    for H in (128, 64):
        for S in sizes:
            refs = not args.no_refs
            guarded(results["sparse_attention"], f"sparse_attention S={S} H={H}",
                    lambda S=S, H=H, refs=refs: sparse_attention_case(kern, S, H, refs=refs))
            dump()
    for S in sizes:
        refs = not args.no_refs
        guarded(results["indexer_topk"], f"indexer_topk S=T={S}", lambda S=S, refs=refs: indexer_case(kern, S, refs=refs))
        dump()
    goals = {}
    # Only outputs that passed their spot check count toward a goal.
    for e in results["sparse_attention"]:
        if e.get("H") == 128 and e.get("valid") and "plugin_tflops" in e:
            goals.setdefault("sparse_attention_h128_bf16_tflops", []).append(e["plugin_tflops"])
            goals.setdefault("sparse_attention_h128_bf16_values_from_keys_tflops", []).append(e["plugin_vfk_tflops"])
    for e in results["indexer_topk"]:
        if e.get("S") == 16384 and e.get("valid") and "speedup_vs_torch" in e:
            goals["indexer_16k_speedup_vs_torch"] = e["speedup_vs_torch"]
    if "sparse_attention_h128_bf16_tflops" in goals:
        best = max(goals["sparse_attention_h128_bf16_tflops"] + goals["sparse_attention_h128_bf16_values_from_keys_tflops"])
        goals["sparse_attention_goal_300_tflops_met"] = best >= 300
    if "indexer_16k_speedup_vs_torch" in goals:
        goals["indexer_goal_5x_met"] = goals["indexer_16k_speedup_vs_torch"] >= 5
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
