#!/usr/bin/env python3
"""Where a decode step's time and written bytes go, from ONNX Runtime's profiler.

    python tools/profile_decode_step.py PAGED.onnx [--baseline DECODE.onnx] --batch 1 --past 32768

PAGED.onnx is a paged graph (``export --graph paged``); it runs decode steps (one token per row
after ``--past`` cached tokens) the way ``generate`` runs them: the pools are OrtValues bound as
the ``past_*`` input and the ``present_*`` output of each call (IO binding), so ScatterND writes
in place. ``--baseline`` runs the same steps on a decode graph (``--graph decode``: caches passed
in and ``Concat(past, new)`` returned), the form the paged graph replaces.

For each graph, per op type over the profiled steps (median step): share of node time and bytes
written per step; and the largest single tensor a node wrote (to hold against the cache sizes). Written bytes are the nodes' output sizes as the profiler reports them, except
for a ScatterND whose output is bound to its input's buffer: it writes only its updates (the
step checks that the pool kept its address and that only the new tokens' rows changed) and the
view ops (Reshape, Unsqueeze, Squeeze, Flatten, Identity), which alias their input. Control flow
(Loop, If, Scan) is left out of the total: its subgraphs' nodes are reported themselves. Figures
are from one run on a shared machine: read the shares and bytes, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

PAGE = 64
#: Control flow: their time includes the nodes of their subgraphs, which the profiler also reports.
CONTROL_FLOW = ("Loop", "If", "Scan")
#: Ops whose output is a view of their input on ONNX Runtime's CPU provider (kernels registered
#: with Alias(0, 0)): they write nothing, though the profiler reports the output's size.
VIEWS = ("Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")


def _session(path: Path, threads: int | None, folder: Path, tag: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / tag)
    if threads:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # The bodies dsa-export's own sessions run (the trimmed attention, the dense routed experts).
    from dsa_export.runtime.onnxrt import data_folder, onnxruntime_model_bytes

    swapped = onnxruntime_model_bytes(path)
    if swapped is None:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(data_folder(path)))
    return ort.InferenceSession(swapped, options, providers=["CPUExecutionProvider"])


def _pool(rng, spec, pages: int) -> np.ndarray:
    """Random contents of a float32 pool, or of an FP8 cache's pools (``--kv-cache-dtype fp8``):
    finite e4m3 codes (uint8, never 0x7F/0xFF) and positive float32 scales."""
    shape = (pages, PAGE, spec.shape[2])
    if spec.type == "tensor(uint8)":
        return (rng.integers(0, 0x7F, shape) | (rng.integers(0, 2, shape) << 7)).astype(np.uint8)
    if "scale_pool" in spec.name:
        return (rng.random(shape) * 0.01 + 1e-3).astype(np.float32)
    return (rng.standard_normal(shape) * 0.1).astype(np.float32)


def _node_events(profile: Path, runs: int) -> list[list[dict]]:
    """The node events of the last ``runs`` model runs, one list per run."""
    events = json.loads(profile.read_text())
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")[-runs:]
    nodes = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    return [[e for e in nodes if lo <= e["ts"] <= hi] for lo, hi in spans]


def _summary(per_run: list[list[dict]], in_place_bytes: dict[str, int]) -> dict:
    """Per op type: median share of node time and bytes written per step."""
    shares, written, times, largest = defaultdict(list), defaultdict(list), [], (0, "")
    for run in per_run:
        run = [e for e in run if e["args"].get("op_name") not in CONTROL_FLOW]
        total = sum(e["dur"] for e in run) or 1
        times.append(total)
        by_type_time, by_type_bytes = defaultdict(int), defaultdict(int)
        for e in run:
            op = e["args"].get("op_name", "?")
            node = e["name"][: -len("_kernel_time")]
            by_type_time[op] += e["dur"]
            out_bytes = in_place_bytes.get(node, 0 if op in VIEWS else int(e["args"].get("output_size", 0) or 0))
            by_type_bytes[op] += out_bytes
            largest = max(largest, (out_bytes, node))
        for op in set(by_type_time) | set(shares):
            shares[op].append(by_type_time.get(op, 0) / total)
            written[op].append(by_type_bytes.get(op, 0))
    ops = {op: {"time_share": statistics.median(shares[op]), "bytes_written": int(statistics.median(written[op]))}
           for op in shares}
    return {"node_ms_per_step": statistics.median(times) / 1e3,
            "bytes_written_per_step": int(sum(o["bytes_written"] for o in ops.values())),
            "largest_tensor_written": {"bytes": largest[0], "node": largest[1]},
            "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1]["time_share"]))}


def profile_paged(path: Path, batch: int, past: int, steps: int, threads: int | None, folder: Path) -> dict:
    import onnxruntime as ort

    session = _session(path, threads, folder, "paged")
    rng = np.random.default_rng(0)
    inputs = {i.name: i for i in session.get_inputs()}
    per_row = -(-(past + steps + 1) // PAGE)
    pages = 1 + batch * per_row
    table = (1 + np.arange(batch * per_row, dtype=np.int32)).reshape(batch, per_row)
    host, values = {}, {}
    for name, spec in inputs.items():
        if name.startswith("past_"):
            host[name] = _pool(rng, spec, pages)
            values[name] = ort.OrtValue.ortvalue_from_numpy(host[name])
    pointers = {name: value.data_ptr() for name, value in values.items()}
    vocab = 1000
    in_place_bytes: dict[str, int] = {}
    graph_outputs = [o.name for o in session.get_outputs()]
    for step in range(steps + 2):  # two warm-up steps
        binding = session.io_binding()
        feeds = {"input_ids": rng.integers(2, vocab, (batch, 1)).astype(np.int64),
                 "query_start": np.full(batch, past + step, np.int32), "query_lengths": np.ones(batch, np.int32),
                 "block_table": table}
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        for name, value in values.items():
            binding.bind_ortvalue_input(name, value)
        before = {name: array.copy() for name, array in host.items()} if step == steps + 1 else None
        for name in graph_outputs:
            source = "past_" + name[len("present_"):]
            if source in values:
                binding.bind_ortvalue_output(name, values[source])
            else:
                binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        if before is not None:  # the last step: only each row's new token changed, same buffers
            position = past + step
            expected = {(int(table[b, position // PAGE]), position % PAGE) for b in range(batch)}
            for name, array in host.items():
                assert values[name].data_ptr() == pointers[name] == array.ctypes.data, name
                changed = {tuple(map(int, rc)) for rc in np.argwhere((array != before[name]).any(-1))}
                assert changed == expected, (name, changed, expected)
    profile = Path(session.end_profiling())
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    for node in graph.node:
        if node.op_type == "ScatterND" and node.input[0] in values:
            width = inputs[node.input[0]].shape[2]
            in_place_bytes[node.name] = batch * width * host[node.input[0]].itemsize  # one token per row
    return {"graph": str(path), "batch": batch, "past": past,
            "cache_bytes": int(sum(batch * (past + 1) * inputs[n].shape[2] * host[n].itemsize for n in values)),
            "in_place_verified": True, **_summary(_node_events(profile, steps), in_place_bytes)}


def profile_decode(path: Path, batch: int, past: int, steps: int, threads: int | None, folder: Path) -> dict:
    session = _session(path, threads, folder, "decode")
    rng = np.random.default_rng(0)
    caches = {i.name: (rng.standard_normal((batch, past, i.shape[2])) * 0.1).astype(np.float32)
              for i in session.get_inputs() if i.name.startswith("past_")}
    names = [o.name for o in session.get_outputs()]
    for step in range(steps + 2):
        feeds = {"input_ids": rng.integers(2, 1000, (batch, 1)).astype(np.int64),
                 "attention_mask": np.ones((batch, past + step + 1), np.int64), **caches}
        out = dict(zip(names, session.run(None, feeds)))
        caches = {name: out["present_" + name[len("past_"):]] for name in caches}
    profile = Path(session.end_profiling())
    return {"graph": str(path), "batch": batch, "past": past,
            "cache_bytes": int(sum(batch * (past + 1) * c.shape[2] * 4 for c in caches.values())),
            **_summary(_node_events(profile, steps), {})}


def _print(result: dict) -> None:
    print(f"{result['graph']}: batch {result['batch']}, past {result['past']}, caches "
          f"{result['cache_bytes'] / 2**20:.1f} MiB; node time {result['node_ms_per_step']:.2f} ms/step, written "
          f"{result['bytes_written_per_step'] / 2**20:.3f} MiB/step; largest tensor written "
          f"{result['largest_tensor_written']['bytes'] / 2**20:.3f} MiB ({result['largest_tensor_written']['node']})")
    for op, row in list(result["ops"].items())[:8]:
        print(f"  {op:22s} {100 * row['time_share']:5.1f}% of node time  {row['bytes_written'] / 2**10:12.1f} KiB "
              "written")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paged", type=Path, help="a paged graph (export --graph paged)")
    parser.add_argument("--baseline", type=Path, default=None, help="a decode graph (export --graph decode)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--past", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = [profile_paged(args.paged, args.batch, args.past, args.steps, args.threads, Path(tmp))]
        if args.baseline:
            results.append(profile_decode(args.baseline, args.batch, args.past, args.steps, args.threads, Path(tmp)))
    for result in results:
        _print(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
