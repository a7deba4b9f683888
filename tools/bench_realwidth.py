#!/usr/bin/env python3
"""Time one side of the real-width peer comparison: a layer slice of a checkpoint on CPU, run by
transformers (eager), by our export wrapper in torch, or by ONNX Runtime from the exported file.

Each side runs in its own process so that ``/usr/bin/time -v`` reports that side's peak memory
(weights included) alone:

    dsa-export export CKPT --layers 0:2 --dtype fp32 -o l2.onnx
    for side in transformers torch onnxruntime; do
        OMP_WAIT_POLICY=PASSIVE /usr/bin/time -v python tools/bench_realwidth.py $side CKPT \\
            --layers 0:2 --onnx l2.onnx --seq 2100 --out $side.npy
    done
    python tools/bench_realwidth.py compare transformers.npy torch.npy onnxruntime.npy

Every side feeds the same hidden states (seed 0, the inputs ``dsa-export validate`` uses) and
prints one JSON line: load seconds, forward seconds (the median of ``--repeats`` calls), and the
peak resident set of the process so far (``VmHWM``). ``compare`` prints the largest absolute
difference and the cosine of each output against the first file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _peak_rss_gib() -> float | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _source(ckpt: str, layers: tuple[int, int], seq: int):
    from dsa_export.hf.source import hf_reference
    from dsa_export.sources import resolve

    return resolve(hf_reference(ckpt, layers=layers), batch=1, seq_len=seq, dtype="fp32")


def _time(fn, repeats: int) -> tuple[object, list[float]]:
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - start)
    return result, seconds


def run_side(args) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    layers = tuple(int(x) for x in args.layers.split(":"))
    start = time.perf_counter()
    source = _source(args.ckpt, layers, args.seq)
    feed = source.inputs_for(1, args.seq, 0)
    names = source.input_names
    if args.side == "onnxruntime":
        from dsa_export.runtime.onnxrt import session

        sess = session(args.onnx, threads=args.threads or torch.get_num_threads())
        inputs = {i.name for i in sess.get_inputs()}
        arrays = {k: v.numpy() for k, v in feed.items() if k in inputs}
        load_s = time.perf_counter() - start
        outputs, seconds = _time(lambda: sess.run(None, arrays)[0], args.repeats)
        out = np.asarray(outputs)
    else:
        module = source.reference_module if args.side == "transformers" else source.runnable_module
        module.eval()
        load_s = time.perf_counter() - start
        tensors = [feed[n] for n in names]

        def call():
            with torch.inference_mode():
                result = module(*tensors)
            return result[0] if isinstance(result, (tuple, list)) else result

        outputs, seconds = _time(call, args.repeats)
        out = outputs.float().numpy()
    if args.out:
        np.save(args.out, out)
    return {"side": args.side, "seq": args.seq, "layers": args.layers, "load_s": round(load_s, 1),
            "forward_s": [round(s, 2) for s in seconds], "forward_median_s": round(statistics.median(seconds), 2),
            "peak_rss_gib": _peak_rss_gib(), "threads": torch.get_num_threads()}


def compare(files: list[str]) -> list[dict]:
    ref = np.load(files[0]).astype(np.float64)
    rows = []
    for name in files[1:]:
        out = np.load(name).astype(np.float64)
        diff = np.abs(out - ref)
        cosine = float((out * ref).sum() / (np.linalg.norm(out) * np.linalg.norm(ref)))
        rows.append({"file": name, "against": files[0], "max_abs_diff": float(diff.max()),
                     "max_abs_reference": float(np.abs(ref).max()), "cosine": cosine})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="side", required=True)
    for side in ("transformers", "torch", "onnxruntime"):
        p = sub.add_parser(side)
        p.add_argument("ckpt", help="checkpoint directory")
        p.add_argument("--layers", default="0:2", help="layer slice A:B (the export's --layers)")
        p.add_argument("--seq", type=int, default=2100, help="tokens (batch 1)")
        p.add_argument("--onnx", help="the exported slice (onnxruntime)")
        p.add_argument("--repeats", type=int, default=1)
        p.add_argument("--threads", type=int, default=0, help="0: torch's default")
        p.add_argument("--out", help="save the first output here (.npy)")
    p = sub.add_parser("compare")
    p.add_argument("files", nargs="+", help="outputs saved with --out; the first is the reference")
    args = parser.parse_args(argv)
    if args.side == "compare":
        for row in compare(args.files):
            print(json.dumps(row))
        return 0
    if args.side == "onnxruntime" and not args.onnx:
        parser.error("onnxruntime needs --onnx FILE")
    print(json.dumps(run_side(args)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
