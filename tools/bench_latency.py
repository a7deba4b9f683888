#!/usr/bin/env python3
"""Latency of the exported model in ONNX Runtime against the torch reference (a command, not a test).

    python tools/bench_latency.py [--model tiny] [--seq 256,1024,4096] [--repeats 5] [--json OUT]

Exports the model (plugin and native modes) once, then times batch-1 inference at each length:
torch eager (our chunked CPU ops) and ONNX Runtime on the CPU provider (function bodies). Reports
medians and the ORT/torch ratio of one run; machines are noisy, compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dsa_export.export import ExportSettings, export_model, save_model
from dsa_export.runtime.onnxrt import session
from dsa_export.sources import resolve


def median_seconds(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq", default="256,1024,4096")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    seqs = [int(s) for s in args.seq.split(",")]

    source = resolve(args.model)
    results = {"model": source.spec, "threads": torch.get_num_threads(), "export_s": {}, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {}
        for mode in ("plugin", "native"):
            start = time.perf_counter()
            path = save_model(export_model(source, ExportSettings(ops=mode)), Path(tmp) / f"{mode}.onnx")
            results["export_s"][mode] = round(time.perf_counter() - start, 2)
            sessions[mode] = session(path)
        for seq in seqs:
            inputs = source.inputs_for(1, seq, seed=0)
            feed = {"input_ids": inputs["input_ids"].numpy()}
            with torch.no_grad():
                t_torch = median_seconds(lambda: source.module(**inputs), args.repeats)
            row = {"seq_len": seq, "torch_s": t_torch}
            for mode, sess in sessions.items():
                row[f"ort_{mode}_s"] = median_seconds(lambda: sess.run(None, feed), args.repeats)
                row[f"ort_{mode}_over_torch"] = row[f"ort_{mode}_s"] / t_torch
            results["rows"].append(row)
            print(f"S={seq:>6}  torch {t_torch * 1e3:9.1f} ms  "
                  + "  ".join(f"ort-{m} {row[f'ort_{m}_s'] * 1e3:9.1f} ms (x{row[f'ort_{m}_over_torch']:.2f})"
                              for m in sessions), flush=True)
    print(f"export: {results['export_s']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
