"""The GPU benchmark as one call for device scripts (``tools/gpu_check.sh``): no click needed.

    python -m dsa_export.bench.gpu [OUT_DIR] [--seq 4096,16384,65536] [--topk 512] [--repeats 5]

Runs the ``cuda`` backend (the plugin kernels through their C ABI against CUDA SDPA, bf16) with
the CPU benchmark's layer and writes ``bench_layer.json``, ``bench_layer.md`` (GPU, driver, CUDA,
date, tables) and, when matplotlib is installed, ``bench_layer.png`` into OUT_DIR (default
``$OUT`` or ``./bench_gpu_out``). The kernel library is found as the plugins package finds it
(``$DSA_EXPORT_PLUGIN_LIB`` first). Exit 0 on success, 1 with one sentence on stderr otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dsa_export.errors import DSAUserError

GPU_SEQ_LENS = (4096, 16384, 65536)


def run(out_dir: Path, seq_lens: tuple[int, ...] = GPU_SEQ_LENS, topk: int = 512, repeats: int = 5,
        variants: tuple[str, ...] = ("dsa", "dense")) -> dict:
    """Benchmark the cuda backend and write the results files; returns the report (``variants``:
    dsa and dense by default, the kernels this hook was written for; block and lsh run too)."""
    from dsa_export.bench.report import render, render_markdown
    from dsa_export.bench.runner import run_bench
    from dsa_export.bench.settings import BenchSettings, BlockConfig

    settings = BenchSettings(seq_lens=seq_lens, backends=("cuda",), block=BlockConfig(topk=topk), repeats=repeats,
                             variants=variants)
    report = run_bench(settings, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_layer.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "bench_layer.md").write_text(render_markdown(report))
    try:
        from dsa_export.bench.plot import save_plot

        save_plot(report, out_dir / "bench_layer.png")
    except DSAUserError as exc:  # matplotlib missing: the JSON and Markdown still count
        print(f"no plot: {exc}", file=sys.stderr)
    print(render(report))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path,
                        default=Path(os.environ.get("OUT") or "bench_gpu_out"))
    parser.add_argument("--seq", default=",".join(map(str, GPU_SEQ_LENS)))
    parser.add_argument("--topk", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        seq_lens = tuple(int(s) for s in args.seq.split(",") if s.strip())
    except ValueError:
        parser.error(f"--seq '{args.seq}' is not a comma-separated list of integers.")
    try:
        run(args.out_dir, seq_lens, args.topk, args.repeats)
    except (DSAUserError, ValueError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
