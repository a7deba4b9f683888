#!/usr/bin/env python3
"""One real-width MoE layer through the DSAMoEExperts function body in ONNX Runtime (a command, not a test).

    python tools/moe_realwidth.py all [--dir DIR] [--tokens 2048] [--experts 16]   # export, run, report
    python tools/moe_realwidth.py speed [--hidden 2048 --inter 512 ...]          # torch op vs transformers

``all`` builds transformers' ``DeepseekV32MoE`` at DeepSeek-V3.2 width (hidden 7168, experts of
2048, top-8, one shared expert; fewer routed experts than the real 256 so it fits here) with
seeded random fp32 weights, computes transformers' eager output for ``--tokens`` tokens, exports
``RoutedMoE.from_hf`` of it (weights as external data), then runs the file in ONNX Runtime in a
process of its own under ``/usr/bin/time -v`` and checks the acceptance bounds: peak RSS of that
process within the layer's weight bytes + 2 GiB, cosine to transformers >= 0.9999.

ONNX Runtime settings of the run: ``session.disable_prepacking=1`` (``--prepacking`` leaves it on),
so the bound does not depend on how many constant MatMul weights ONNX Runtime packs into buffers
of its own; the routed stacks are read by Gather inside the loop and never prepacked, and with
only the shared expert and router as MatMul constants here both settings peaked alike (measured).
``--no-arena`` runs without the CPU memory arena (lower peak, slower: see docs/ops.md).

``speed`` times our torch op (``RoutedMoE``'s routed experts) against transformers' ``eager`` and
``batched_mm`` experts at a width where ``batched_mm``'s per-token weight gather fits in memory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 1 << 30


def _moe(hidden: int, inter: int, experts: int, top_k: int, n_group: int, topk_group: int, seed: int = 0):
    import torch
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32MoE

    cfg = DeepseekV32Config(hidden_size=hidden, moe_intermediate_size=inter, n_routed_experts=experts,
                            num_experts_per_tok=top_k, n_group=n_group, topk_group=topk_group, n_shared_experts=1,
                            norm_topk_prob=True, routed_scaling_factor=2.5)
    cfg._experts_implementation = "eager"
    with torch.device("meta"):
        moe = DeepseekV32MoE(cfg)
    moe = moe.to_empty(device="cpu").eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in moe.named_parameters():
            param.normal_(0.0, param.shape[-1] ** -0.5, generator=gen)  # O(1) activations
        moe.gate.e_score_correction_bias.normal_(0.0, 0.05, generator=gen)
    return moe, cfg


def _weight_bytes(model_path: Path) -> int:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    total = 0
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            total += int({e.key: e.value for e in tensor.external_data}["length"])
        else:
            total += len(tensor.raw_data) or 4 * math.prod(tensor.dims)
    return total


def export(args) -> None:
    """Export the layer and store the input and transformers' output beside it."""
    import numpy as np
    import onnx
    import torch

    from dsa_export.nn.moe import RoutedMoE
    from dsa_export.ops.onnx_ops import function_protos, register_schemas, translation_table

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    moe, _ = _moe(args.hidden, args.inter, args.experts, args.top_k, args.n_group, args.topk_group)
    x = torch.randn(1, args.tokens, args.hidden, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        t = time.perf_counter()
        want = moe(x)
        eager_s = time.perf_counter() - t
        ours = RoutedMoE.from_hf(moe)
        t = time.perf_counter()
        torch_out = ours(x)
        ours_s = time.perf_counter() - t
    np.save(out / "x.npy", x.numpy())
    np.save(out / "transformers.npy", want.numpy())
    register_schemas()
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}
    example = x[:, :8]
    with torch.no_grad():
        program = torch.onnx.export(ours, (example,), dynamic_shapes=(dims,),
                                    custom_translation_table=translation_table(), opset_version=18, dynamo=True,
                                    verbose=False)
    path = out / "moe.onnx"
    program.save(str(path), external_data=True)
    del program
    model = onnx.load(str(path), load_external_data=False)
    model.functions.extend(function_protos(18))
    onnx.save(model, str(path))  # the graph only; the weights stay in moe.onnx.data
    onnx.checker.check_model(str(path), full_check=True)
    report = {
        "export_s": round(time.perf_counter() - start, 1),
        "transformers_eager_s": round(eager_s, 2),
        "torch_op_s": round(ours_s, 2),
        "torch_op_vs_transformers_max_abs": float((torch_out - want).abs().max()),
        "dsa_nodes": [n.op_type for n in model.graph.node if n.domain == "dsa"],
    }
    (out / "export.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


def run(args) -> None:
    """ONNX Runtime alone (this process is the one measured): load, run once, compare."""
    import numpy as np
    import onnxruntime as ort

    out = Path(args.dir)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "0" if args.prepacking else "1")
    options.enable_cpu_mem_arena = not args.no_arena
    t = time.perf_counter()
    sess = ort.InferenceSession(str(out / "moe.onnx"), options, providers=["CPUExecutionProvider"])
    load_s = time.perf_counter() - t
    x = np.load(out / "x.npy")
    t = time.perf_counter()
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
    run_s = time.perf_counter() - t
    want = np.load(out / "transformers.npy", mmap_mode="r")
    g, w = got.astype(np.float64).ravel(), np.asarray(want, np.float64).ravel()
    cosine = float(g @ w / (np.linalg.norm(g) * np.linalg.norm(w)))
    print(json.dumps({"session_s": round(load_s, 2), "run_s": round(run_s, 2), "cosine": cosine,
                      "max_abs": float(np.abs(g - w).max()), "ref_max_abs": float(np.abs(w).max())}))


def all_steps(args) -> int:
    directory = Path(args.dir or tempfile.mkdtemp(prefix="moe-realwidth-"))
    args.dir = str(directory)
    if not (directory / "moe.onnx").exists():
        subprocess.run([sys.executable, __file__, "export", "--dir", args.dir, *_shape_args(args)], check=True)
    weights = _weight_bytes(directory / "moe.onnx")
    command = ["/usr/bin/time", "-v", sys.executable, __file__, "run", "--dir", args.dir]
    command += ["--no-arena"] * args.no_arena + ["--prepacking"] * args.prepacking
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))}
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode:
        print(proc.stdout, proc.stderr, file=sys.stderr)
        return proc.returncode
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    peak_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", proc.stderr).group(1)
    peak = peak_kib * 1024
    report = {
        "tokens": args.tokens, "hidden": args.hidden, "experts": args.experts, "moe_intermediate": args.inter,
        "top_k": args.top_k, "weight_bytes": weights, "weight_gib": round(weights / GIB, 3),
        "peak_rss_gib": round(peak / GIB, 3), "bound_gib": round((weights + 2 * GIB) / GIB, 3),
        "rss_within_bound": peak <= weights + 2 * GIB, "process_wall": wall, **result,
        "cosine_ok": result["cosine"] >= 0.9999, "arena": not args.no_arena, "prepacking": args.prepacking,
        "export": json.loads((directory / "export.json").read_text()),
    }
    print(json.dumps(report, indent=2))
    return 0 if report["rss_within_bound"] and report["cosine_ok"] else 1


def speed(args) -> None:
    """Routed experts only: our torch op against transformers' eager and batched_mm experts."""
    import torch

    from dsa_export.nn.moe import RoutedMoE

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    moe, cfg = _moe(args.hidden, args.inter, args.experts, args.top_k, args.n_group, args.topk_group)
    ours = RoutedMoE.from_hf(moe)
    slot_bytes = 3 * args.hidden * args.inter * 4  # one slot's gathered weights in batched_mm
    rows = []
    for tokens in (int(t) for t in args.speed_tokens.split(",")):
        x = torch.randn(tokens, args.hidden, generator=torch.Generator().manual_seed(tokens))
        with torch.no_grad():
            _, weights, ids = moe.gate(x)
            row = {"tokens": tokens}
            for name in ("ours", "eager", "batched_mm"):
                if name == "batched_mm" and tokens * args.top_k * slot_bytes > args.batched_mm_limit_gib * GIB:
                    row[name] = None  # its per-token weight gather would not fit
                    continue
                cfg._experts_implementation = "eager" if name == "eager" else "batched_mm"
                fn = (lambda: ours.routed(x, ids.to(torch.int32), weights)) if name == "ours" else (
                    lambda: moe.experts(x, ids, weights))
                fn()
                best = float("inf")
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    fn()
                    best = min(best, time.perf_counter() - t)
                row[name] = round(best * 1e3, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    cfg._experts_implementation = "eager"


def _shape_args(args) -> list[str]:
    return ["--tokens", str(args.tokens), "--hidden", str(args.hidden), "--inter", str(args.inter),
            "--experts", str(args.experts), "--top-k", str(args.top_k), "--n-group", str(args.n_group),
            "--topk-group", str(args.topk_group)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("all", "export", "run", "speed"))
    parser.add_argument("--dir", help="working folder (default: a new temporary one)")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--inter", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=8)
    # 4 groups of 4, 3 of them eligible: group-limited routing with a real choice of 8 out of 12.
    parser.add_argument("--n-group", type=int, default=4)
    parser.add_argument("--topk-group", type=int, default=3)
    parser.add_argument("--no-arena", action="store_true", help="run ONNX Runtime without its CPU memory arena")
    parser.add_argument("--prepacking", action="store_true", help="leave ONNX Runtime's weight prepacking on")
    parser.add_argument("--speed-tokens", default="1,16,128,1024")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batched-mm-limit-gib", type=float, default=4.0)
    args = parser.parse_args()
    if args.step == "export":
        export(args)
    elif args.step == "run":
        run(args)
    elif args.step == "speed":
        speed(args)
    else:
        return all_steps(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
