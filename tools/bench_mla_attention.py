#!/usr/bin/env python3
"""DSASparseAttention alone at DeepSeek-V3.2's absorbed-MLA dims (H=128 query heads over one latent
head, Dk=576, Dv=512, top-k 2048): values passed as their own tensor (a copy of the keys' first Dv
channels, the form used before values-from-keys) against values taken from the keys (an empty v).

    OMP_WAIT_POLICY=PASSIVE python tools/bench_mla_attention.py --seq 4096 --backends torch,onnxruntime

Prints one JSON line per (backend, form): median wall and CPU seconds of ``--repeats`` calls after
one warm-up, the bytes of key/value rows each form gathers, and the largest difference from the
other form (the two must agree: the values are the same numbers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

H, DK, DV, K = 128, 576, 512, 2048


def _inputs(seq: int):
    import torch

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, seq, H, DK, generator=g) * 0.05
    latent = torch.randn(1, seq, 1, DK, generator=g)
    pos = torch.arange(seq)[:, None]
    # Causal selections: query s picks min(s + 1, K) distinct keys of 0..s, the rest -1.
    scores = torch.rand(seq, seq, generator=g).masked_fill(torch.arange(seq)[None] > pos, -1.0)
    top = scores.topk(min(K, seq), dim=-1)
    idx = torch.where(top.values >= 0, top.indices, -1).int()
    if seq < K:
        idx = torch.cat([idx, torch.full((seq, K - seq), -1, dtype=torch.int32)], dim=1)
    return q, latent, idx[None].contiguous()


def _time(fn, repeats: int) -> tuple[object, float, float]:
    out = fn()
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return out, statistics.median(walls), statistics.median(cpus)


def _onnx_model(v_rows: str):
    from onnx import TensorProto, helper

    from dsa_export.ops.contract import PLUGIN_ATTRIBUTES
    from dsa_export.ops.onnx_ops import function_protos, register_schemas, use_onnxruntime_bodies

    register_schemas()
    node = helper.make_node("DSASparseAttention", ["q", "k", "v", "indices"], ["out"], domain="dsa", scale=DK**-0.5,
                            **PLUGIN_ATTRIBUTES)
    graph = helper.make_graph([node], "mla", [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, ["B", "S", H, DK]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, ["B", "T", 1, DK]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, ["B", v_rows, 1, DV]),
        helper.make_tensor_value_info("indices", TensorProto.INT32, ["B", "S", K])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", "S", H, DV])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dsa", 1)],
                              functions=function_protos(18))
    model.ir_version = 10
    use_onnxruntime_bodies(model)  # the body dsa-export's ONNX Runtime sessions run
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=2048, help="queries = keys (batch 1)")
    parser.add_argument("--backends", default="torch,onnxruntime")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from dsa_export.ops import dsa_sparse_attention

    if args.threads:
        torch.set_num_threads(args.threads)
    q, latent, idx = _inputs(args.seq)
    valid = int((idx >= 0).sum())
    row_bytes = {"separate v": (DK + DV) * 4, "values from keys": DK * 4}
    for backend in args.backends.split(","):
        outputs = {}
        for form in ("separate v", "values from keys"):
            if backend == "torch":
                v = latent[..., :DV].contiguous() if form == "separate v" else latent.new_zeros(1, 0, 1, DV)
                with torch.inference_mode():
                    out, wall, cpu = _time(lambda: dsa_sparse_attention(q, latent, v, idx, scale=DK**-0.5),
                                           args.repeats)
                out = out.numpy()
            elif backend == "onnxruntime":
                import onnxruntime as ort

                options = ort.SessionOptions()
                options.intra_op_num_threads = args.threads or torch.get_num_threads()
                sess = ort.InferenceSession(_onnx_model("T" if form == "separate v" else "Tv").SerializeToString(),
                                            options, providers=["CPUExecutionProvider"])
                v = latent[..., :DV].contiguous() if form == "separate v" else latent.new_zeros(1, 0, 1, DV)
                feed = {"q": q.numpy(), "k": latent.numpy(), "v": v.numpy(), "indices": idx.numpy()}
                out, wall, cpu = _time(lambda: sess.run(None, feed)[0], args.repeats)
            else:
                parser.error(f"unknown backend {backend!r}; choose torch or onnxruntime")
            outputs[form] = np.asarray(out, dtype=np.float64)
            print(json.dumps({"backend": backend, "form": form, "seq": args.seq, "heads": H, "dk": DK, "dv": DV,
                              "topk": K, "median_wall_s": round(wall, 3), "median_cpu_s": round(cpu, 3),
                              "repeats": args.repeats, "threads": torch.get_num_threads(),
                              "gathered_row_bytes": row_bytes[form],
                              "gathered_gib": round(valid * row_bytes[form] / 2**30, 3)}), flush=True)
        diff = float(np.abs(outputs["separate v"] - outputs["values from keys"]).max())
        print(json.dumps({"backend": backend, "max_abs_diff_between_forms": diff}), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
