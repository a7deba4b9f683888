#!/usr/bin/env python3
"""Speed of the block-sparse CPU op with a sparse pattern against all blocks (a command, not a test).

    python tools/bench_block_sparse.py [--seq 8192] [--heads 16] [--kv-heads 1,16] [--head-dim 64]
        [--block-size 64] [--density 0.1] [--selection grid|allowed] [--repeats 5] [--json OUT]

For each kv-head count, times ``dsa_block_sparse_attention`` (causal, B = 1, float32) in one run:
with a random pattern that selects ``density`` of the blocks, and with every causally allowed
block selected. The two calls alternate (sparse, all, sparse, all, ...), so load that other jobs
put on a shared machine falls on both alike. Prints the median wall time of ``--repeats`` calls of
each, the ratio of the medians (all / sparse), the median and range of the ratios of the pairs
taken one after the other, and the same ratio in process CPU time (what the op itself used,
less disturbed by other jobs than wall time). Checks a few query rows of both against a float64
computation over the same keys (a case that disagrees fails the command), and prints the
pattern's CSR storage next to the dense masks.

``--selection grid`` (default, the stricter one): every query block lists ``ceil(density * nkb)``
key blocks of the whole ``nqb x nkb`` grid (its diagonal block and random earlier ones; early
query blocks, which are allowed fewer, list all they may). ``allowed``: each query block lists
``density`` of its causally allowed blocks (at least its diagonal block).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from dsa_export.ops import dsa_block_sparse_attention
from dsa_export.ops.csr import block_index_to_csr, csr_storage


def random_pattern(heads: int, n_blocks: int, density: float, selection: str, gen: torch.Generator) -> torch.Tensor:
    """int32 ``[1,H,n,Kb]`` causal pattern (queries = keys): the diagonal block plus random earlier ones."""
    if selection == "grid":
        per_row = [min(i + 1, max(1, math.ceil(density * n_blocks))) for i in range(n_blocks)]
    else:
        per_row = [max(1, math.ceil(density * (i + 1))) for i in range(n_blocks)]
    kb = max(per_row)
    index = torch.full((1, heads, n_blocks, kb), -1, dtype=torch.int32)
    for h in range(heads):
        for i, n in enumerate(per_row):
            earlier = torch.randperm(i, generator=gen)[: n - 1]
            index[0, h, i, :n] = torch.cat([torch.tensor([i]), earlier]).to(torch.int32)
    return index


def all_allowed(heads: int, n_blocks: int) -> torch.Tensor:
    """int32 ``[1,H,n,n]``: query block i lists key blocks 0..i."""
    ids = torch.arange(n_blocks)
    rows = torch.where(ids[None, :] <= ids[:, None], ids[None, :], -1).to(torch.int32)
    return rows.expand(1, heads, n_blocks, n_blocks).contiguous()


def check_rows(out, q, k, v, index, bs, scale, blocks=(0, 1, -1)) -> float:
    """Largest error of ``out`` on a few query blocks against float64 attention over their keys."""
    worst = 0.0
    _, s, h, _ = q.shape
    group = h // k.shape[2]
    n_qb = index.shape[2]
    for i in blocks:
        i = i % n_qb
        for head in range(h):
            listed = sorted({int(j) for j in index[0, head, i] if j >= 0})
            keys = torch.cat([torch.arange(j * bs, min(s, j * bs + bs)) for j in listed])
            for row in range(i * bs, min(s, i * bs + bs)):
                allowed = keys[keys <= row]
                logits = (k[0, allowed, head // group].double() @ q[0, row, head].double()) * scale
                want = torch.softmax(logits, 0) @ v[0, allowed, head // group].double()
                worst = max(worst, float((out[0, row, head].double() - want).abs().max()))
    return worst


def interleaved_seconds(fns, repeats: int) -> tuple[list[list[tuple[float, float]]], list[object]]:
    """(per function, its ``repeats`` (wall s, process CPU s) pairs; its last result), the functions
    called in turn ``repeats`` times after one untimed call each (allocator, thread pool)."""
    results = [fn() for fn in fns]
    times: list[list[tuple[float, float]]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            wall, cpu = time.perf_counter(), time.process_time()
            results[i] = fn()
            times[i].append((time.perf_counter() - wall, time.process_time() - cpu))
    return times, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", default="1,16", help="comma-separated kv-head counts (each divides --heads)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--density", type=float, default=0.1)
    parser.add_argument("--selection", choices=("grid", "allowed"), default="grid")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()

    s, h, d, bs = args.seq, args.heads, args.head_dim, args.block_size
    n_blocks = -(-s // bs)
    scale = d**-0.5
    gen = torch.Generator().manual_seed(args.seed)
    sparse_index = random_pattern(h, n_blocks, args.density, args.selection, gen)
    dense_index = all_allowed(h, n_blocks)
    row_ptr, col_idx = block_index_to_csr(sparse_index, n_blocks)
    storage = csr_storage(row_ptr, col_idx, num_key_blocks=n_blocks, block_size=bs, q_len=s, k_len=s)
    all_blocks = n_blocks * (n_blocks + 1) // 2 * h
    print(f"L={s} H={h} D={d} bs={bs} threads={torch.get_num_threads()} selection={args.selection}: "
          f"{storage.nnz} of {all_blocks} causally allowed blocks listed ({storage.nnz / all_blocks:.1%}; "
          f"{storage.density:.1%} of the block grid)")
    print(f"  CSR {storage.csr_bytes} B (int32) vs dense bool block mask {storage.dense_block_bytes} B "
          f"({storage.saving('dense_block'):.2f}x), bit mask {storage.dense_block_bit_bytes} B "
          f"({storage.saving('dense_block_bit'):.2f}x), element mask {storage.element_mask_bytes} B "
          f"({storage.saving('element_mask'):.0f}x)")
    results, failed = [], False
    for hkv in (int(x) for x in args.kv_heads.split(",")):
        q = torch.randn(1, s, h, d, generator=gen)
        k = torch.randn(1, s, hkv, d, generator=gen)
        v = torch.randn(1, s, hkv, d, generator=gen)

        def run(index):
            with torch.no_grad():
                return dsa_block_sparse_attention(q, k, v, index, block_size=bs, scale=scale, causal=True)

        (sparse_t, dense_t), (sparse_out, dense_out) = interleaved_seconds(
            [lambda: run(sparse_index), lambda: run(dense_index)], args.repeats)
        err = max(check_rows(sparse_out, q, k, v, sparse_index, bs, scale),
                  check_rows(dense_out, q, k, v, dense_index, bs, scale))
        ok = err <= 1e-4
        failed |= not ok
        sparse_s, dense_s = (statistics.median(w for w, _ in t) for t in (sparse_t, dense_t))
        sparse_cpu, dense_cpu = (statistics.median(c for _, c in t) for t in (sparse_t, dense_t))
        ratio = dense_s / sparse_s
        pairs = sorted(d[0] / s_[0] for s_, d in zip(sparse_t, dense_t))
        print(f"  Hkv={hkv:<3} sparse {sparse_s * 1e3:8.1f} ms  all {dense_s * 1e3:8.1f} ms  ratio {ratio:5.2f}x  "
              f"(pairs: median {statistics.median(pairs):.2f}x, {pairs[0]:.2f}-{pairs[-1]:.2f}; CPU time "
              f"{dense_cpu / sparse_cpu:.2f}x)  max error {err:.1e}{'' if ok else '  WRONG'}")
        results.append({"kv_heads": hkv, "sparse_s": sparse_s, "all_s": dense_s, "ratio": ratio,
                        "pair_ratios": pairs, "cpu_ratio": dense_cpu / sparse_cpu,
                        "sparse_times_s": sparse_t, "all_times_s": dense_t, "max_error": err, "correct": ok})
    if args.json is not None:
        args.json.write_text(json.dumps({"seq": s, "heads": h, "head_dim": d, "block_size": bs,
                                         "density": args.density, "selection": args.selection,
                                         "threads": torch.get_num_threads(), "repeats": args.repeats,
                                         "storage": storage.as_dict(), "results": results}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
