#!/usr/bin/env python3
"""How a decode step can write its new cache rows in place on ONNX Runtime (CPU): a measurement.

    python tools/bench_cache_update.py [--cache-len N] [--batch B] [--width W] [--repeats R]
                                       [--page P] [--no-options] [--rtx] [--json OUT]

Builds one-node (and a few two-node) graphs over a cache [B, N, W] float32 and times one update
of one new token per row under several ways of running them:

* ``run``        ``session.run`` with numpy inputs; ORT allocates the outputs;
* ``iob-same``   IO binding, the cache OrtValue bound as the input *and* as the output;
* ``iob-other``  IO binding, the output bound to a second pre-allocated OrtValue;
* ``iob-alloc``  IO binding, the output bound by name only (ORT allocates it).

Graphs: ``TensorScatter`` (opset 24) alone, with a reader of the present cache (a GatherND of the
new rows, a ReduceSum over the whole cache as attention's read), with a reader of the *past* cache
(the aliasing hazard), and with the present cache kept internal; ``ScatterND`` (opset 18) on the
same cache and on a paged pool [P, page, W] indexed by (page, offset); ``Concat`` past [B, N-1, W]
+ new (the decode graph of today) and ``Identity`` (a bare cache-sized copy) as baselines.

Each row prints the median wall milliseconds per update and the process CPU milliseconds per
update (user + system, all threads: less disturbed than wall time when other work shares the
cores), the bytes the update writes (an estimate
from the rule below), whether the output's data pointer is the input's, the freshly touched
memory per call (minor page faults x page size: memory ORT allocated and wrote for the first
time), whether the result is right, and the ORT warnings seen on stderr. Bytes written: the
update's rows (B x S x W x 4) when the output buffer is the input's and no copy was logged;
otherwise the whole cache as well (TensorScatter and ScatterND copy past -> present first when
the two buffers differ; Concat and Identity always write the whole present cache). The RSS
column is the growth of the resident set from just before the first call (inputs, and the
pre-allocated output of ``iob-other``, already resident) to after the last: the memory ORT holds
for outputs it allocates.

The machine matters: record its cores (``nproc``) with the numbers; memory bandwidth, not compute,
sets every copying row.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
OLD, PAGE_BYTES = 0.25, resource.getpagesize()
MODES = ("run", "iob-same", "iob-other", "iob-alloc")


@dataclass(frozen=True)
class Geometry:
    batch: int
    cache_len: int
    width: int
    page: int = 64

    @property
    def cache_bytes(self) -> int:
        return self.batch * self.cache_len * self.width * 4

    @property
    def update_bytes(self) -> int:
        return self.batch * self.width * 4

    @property
    def pages(self) -> int:
        return -(-self.batch * self.cache_len // self.page)

    def write_indices(self) -> np.ndarray:
        # Distinct positions per row, the last row writing the last slot of the cache.
        n = self.cache_len
        rows = [(n - 1 - 7 * (self.batch - 1 - b)) % n for b in range(self.batch)]
        return np.array(rows, np.int64)


@dataclass
class Graph:
    """A model and how to feed it: ``cache`` names the input updated, ``present`` its output."""

    name: str
    model: bytes
    feeds: dict[str, np.ndarray]
    cache: str
    present: str
    check: object  # (outputs: dict[str, np.ndarray], geometry) -> str ("ok" or what is wrong)
    extra_outputs: tuple[str, ...] = ()
    copies_always: bool = False  # Concat / Identity: the present cache is always written whole
    no_same: bool = False  # input and output shapes differ: no iob-same


def _model(nodes, inputs, outputs, opset: int) -> bytes:
    graph = helper.make_graph(nodes, "cache_update", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset <= 21 else 11
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _rows(g: Geometry) -> np.ndarray:
    return np.stack([np.arange(g.batch), g.write_indices()], 1).astype(np.int64)


def _update(g: Geometry) -> np.ndarray:
    return (1.0 + np.arange(g.batch, dtype=np.float32))[:, None, None] * np.ones((1, 1, g.width),
                                                                                 np.float32)


def _check_cache(present: np.ndarray, g: Geometry) -> str:
    """The new rows hold the update and a neighbouring row still holds the old value."""
    wi, upd = g.write_indices(), _update(g)
    for b in range(g.batch):
        if not np.array_equal(present[b, wi[b]], upd[b, 0]):
            return f"row {b} not written"
        if present[b, wi[b] - 1, 0] != OLD:
            return f"row {b} neighbour changed"
    return "ok"


def tensor_scatter(g: Geometry, reader: str | None = None, internal: bool = False) -> Graph:
    b, n, w = g.batch, g.cache_len, g.width
    inputs = [_vi("past", F32, [b, n, w]), _vi("update", F32, [b, 1, w]),
              _vi("write_indices", I64, [b])]
    nodes = [helper.make_node("TensorScatter", ["past", "update", "write_indices"], ["present"],
                              axis=1, mode="linear")]
    outputs = [] if internal else [_vi("present", F32, [b, n, w])]
    feeds = {"update": _update(g), "write_indices": g.write_indices()}
    extra: tuple[str, ...] = ()
    if reader in ("new-rows", "past-rows") or internal:
        source = "past" if reader == "past-rows" else "present"
        inputs.append(_vi("rows", I64, [b, 2]))
        nodes.append(helper.make_node("GatherND", [source, "rows"], ["rows_read"]))
        outputs.append(_vi("rows_read", F32, [b, w]))
        feeds["rows"] = _rows(g)
        extra = ("rows_read",)
    elif reader == "all":
        nodes.append(helper.make_node("ReduceSum", ["present", "axis1"], ["attn"], keepdims=0))
        nodes.insert(0, helper.make_node("Constant", [], ["axis1"],
                                         value=helper.make_tensor("v", I64, [1], [1])))
        outputs.append(_vi("attn", F32, [b, w]))
        extra = ("attn",)
    name = "TensorScatter"
    if reader == "new-rows":
        name += " + GatherND(present)"
    elif reader == "past-rows":
        name += " + GatherND(past)"
    elif reader == "all":
        name += " + ReduceSum(present)"
    if internal:
        name = "TensorScatter -> GatherND (present not an output)"

    def check(out, geo):
        if "rows_read" in out:
            upd = _update(geo)[:, 0]
            read = out["rows_read"]
            if reader == "past-rows":
                return ("reads NEW rows (aliased)" if np.array_equal(read, upd)
                        else "reads old rows")
            if not np.array_equal(read, upd):
                return "rows read are not the update"
        if "attn" in out:
            want = OLD * (geo.cache_len - 1) + _update(geo)[:, 0]
            if not np.allclose(out["attn"], want, rtol=1e-3):
                return "attention-like read wrong"
        return _check_cache(out["present"], geo) if "present" in out else "ok"

    return Graph(name, _model(nodes, inputs, outputs, 24), feeds, "past",
                 "present" if not internal else "", check, extra)


def scatter_nd(g: Geometry) -> Graph:
    b, n, w = g.batch, g.cache_len, g.width
    nodes = [helper.make_node("ScatterND", ["data", "indices", "updates"], ["present"],
                              reduction="none")]
    inputs = [_vi("data", F32, [b, n, w]), _vi("indices", I64, [b, 2]), _vi("updates", F32, [b, w])]
    model = _model(nodes, inputs, [_vi("present", F32, [b, n, w])], 18)
    feeds = {"indices": _rows(g), "updates": _update(g)[:, 0]}
    return Graph("ScatterND [B,N,W] idx (b,pos)", model, feeds, "data", "present",
                 lambda out, geo: _check_cache(out["present"], geo))


def paged(g: Geometry) -> Graph:
    p, w = g.pages, g.width
    nodes = [helper.make_node("ScatterND", ["pool", "indices", "updates"], ["present"],
                              reduction="none")]
    inputs = [_vi("pool", F32, [p, g.page, w]), _vi("indices", I64, [g.batch, 2]),
              _vi("updates", F32, [g.batch, w])]
    model = _model(nodes, inputs, [_vi("present", F32, [p, g.page, w])], 18)
    # Row b owns pages [b * N/page, ...); its write lands on (page, offset) of its position.
    per_row = g.cache_len // g.page
    wi = g.write_indices()
    idx = np.array([[b * per_row + wi[b] // g.page, wi[b] % g.page] for b in range(g.batch)],
                   np.int64)
    feeds = {"indices": idx, "updates": _update(g)[:, 0]}

    def check(out, geo):
        flat = out["present"].reshape(geo.batch, -1, geo.width)[:, : geo.cache_len]
        return _check_cache(flat, geo)

    return Graph(f"ScatterND paged [P={p},{g.page},W] idx (page,off)", model, feeds, "pool",
                 "present", check)


def concat(g: Geometry) -> Graph:
    b, n, w = g.batch, g.cache_len, g.width
    nodes = [helper.make_node("Concat", ["past", "update"], ["present"], axis=1)]
    inputs = [_vi("past", F32, [b, n - 1, w]), _vi("update", F32, [b, 1, w])]
    model = _model(nodes, inputs, [_vi("present", F32, [b, n, w])], 18)

    def check(out, geo):
        ok = np.array_equal(out["present"][:, -1], _update(geo)[:, 0])
        return "ok" if ok and out["present"][0, 0, 0] == OLD else "wrong"

    return Graph("Concat past[N-1]+new (today)", model, {"update": _update(g)}, "past", "present",
                 check, copies_always=True, no_same=True)


def identity(g: Geometry) -> Graph:
    b, n, w = g.batch, g.cache_len, g.width
    model = _model([helper.make_node("Identity", ["past"], ["present"])],
                   [_vi("past", F32, [b, n, w])], [_vi("present", F32, [b, n, w])], 18)

    def check(out, geo):
        return "ok" if out["present"][0, 0, 0] == OLD else "wrong"

    return Graph("Identity (cache-sized copy)", model, {}, "past", "present", check,
                 copies_always=True)


@contextlib.contextmanager
def captured_stderr():
    """The native stderr (file descriptor 2) of the block, where ORT's default logger writes."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        box: list[str] = []
        try:
            yield box
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            box.append(tmp.read().decode(errors="replace"))


def summarize_warnings(text: str) -> str:
    """Distinct warning messages, timestamps and byte counts folded, with their counts."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if "W:onnxruntime" not in line and "WARNING" not in line:
            continue
        msg = re.sub(r"^.*?\] ", "", line)
        msg = re.sub(r"\(\d+ bytes\)", "(<cache> bytes)", msg)
        counts[msg] = counts.get(msg, 0) + 1
    return "; ".join(f"{n}x {m[:64]}" for m, n in counts.items()) or "-"


def filled(shape: tuple[int, ...], offset: int) -> np.ndarray:
    """An array of OLD whose data starts ``offset`` bytes past a page boundary.

    A cache-sized memcpy runs about 3x slower on this machine when source and destination sit a
    few bytes apart modulo 4096 (4K aliasing): numpy's large arrays start 16 bytes into a page,
    ORT's arena hands out buffers 64 bytes into one. The offset keeps the copying baselines fair.
    """
    nbytes = int(np.prod(shape)) * 4
    raw = np.empty(nbytes + 2 * PAGE_BYTES, np.uint8)
    start = (-raw.ctypes.data) % PAGE_BYTES + offset
    out = raw[start:start + nbytes].view(np.float32).reshape(shape)
    out[...] = OLD
    return out


def cache_input(graph: Graph, g: Geometry, offset: int) -> np.ndarray:
    if graph.name.startswith("Concat"):
        return filled((g.batch, g.cache_len - 1, g.width), offset)
    if graph.cache == "pool":
        return filled((g.pages, g.page, g.width), offset)
    return filled((g.batch, g.cache_len, g.width), offset)


def present_shape(graph: Graph, g: Geometry) -> tuple[int, ...]:
    if graph.cache == "pool":
        return (g.pages, g.page, g.width)
    return (g.batch, g.cache_len, g.width)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_BYTES


@dataclass
class Row:
    variant: str
    mode: str
    options: str
    ms: float
    cpu_ms: float
    bytes_written: int
    same_ptr: bool
    fresh_mib: float
    rss_growth_mib: float
    result: str
    warnings: str
    notes: list[str] = field(default_factory=list)


def measure(graph: Graph, mode: str, g: Geometry, repeats: int,
            options: tuple[str, dict] = ("default", {}), offset: int = 2048,
            spin: bool = False) -> Row:
    so = ort.SessionOptions()
    if not spin:
        # Spinning pool threads would count as CPU time of every call.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    label, opts = options
    for key, value in opts.items():
        if key == "graph_optimization_level":
            so.graph_optimization_level = value
        elif key == "enable_cpu_mem_arena":
            so.enable_cpu_mem_arena = value
        elif key == "enable_mem_pattern":
            so.enable_mem_pattern = value
        elif key == "execution_mode":
            so.execution_mode = value
        else:
            so.add_session_config_entry(key, value)
    sess = ort.InferenceSession(graph.model, so, providers=["CPUExecutionProvider"])
    cache = cache_input(graph, g, offset)
    in_ptr = cache.ctypes.data
    outputs: dict[str, np.ndarray] = {}
    out_names = ([graph.present] if graph.present else []) + list(graph.extra_outputs)

    if mode == "run":
        feeds = {graph.cache: cache, **graph.feeds}
        holder: dict = {}

        def step():
            holder["out"] = sess.run(out_names, feeds)

        def collect():
            return dict(zip(out_names, holder["out"])), holder["out"][0].ctypes.data
    else:
        cache_ov = ort.OrtValue.ortvalue_from_numpy(cache)
        in_ptr = cache_ov.data_ptr()
        io = sess.io_binding()
        io.bind_ortvalue_input(graph.cache, cache_ov)
        small = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in graph.feeds.items()}
        for k, v in small.items():
            io.bind_ortvalue_input(k, v)
        other = None
        if graph.present:
            if mode == "iob-same":
                io.bind_ortvalue_output(graph.present, cache_ov)
            elif mode == "iob-other":
                other = ort.OrtValue.ortvalue_from_numpy(
                    filled(present_shape(graph, g), offset))
                io.bind_ortvalue_output(graph.present, other)
            else:
                io.bind_output(graph.present)
        for name in graph.extra_outputs:
            io.bind_output(name)
        fresh = {k: v.copy() for k, v in graph.feeds.items()}

        def step():
            # A decode loop refreshes the small inputs each step; do the same.
            for k, v in small.items():
                v.update_inplace(fresh[k])
            sess.run_with_iobinding(io)

        def collect():
            outs = io.get_outputs()
            got = dict(zip(out_names, [o.numpy() for o in outs]))
            ptr = outs[0].data_ptr() if graph.present else 0
            return got, ptr

    rss0 = rss_bytes()  # inputs (and a pre-allocated output) already resident
    with captured_stderr() as err:
        step()
        step()  # warm-up: first touch of the arena and of the output buffers
        times = []
        use0 = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        use1 = resource.getrusage(resource.RUSAGE_SELF)
        rss1 = rss_bytes()
        outputs, out_ptr = collect()
    warnings = summarize_warnings(err[0])
    same = bool(graph.present) and out_ptr == in_ptr
    copied = graph.copies_always or not same or "not activated" in warnings
    written = g.update_bytes + (g.cache_bytes if copied else 0)
    result = graph.check(outputs, g)
    if mode != "iob-same" and graph.present and not graph.name.startswith("Concat"):
        # ORT must never write into an input it does not also hold as the output.
        if cache.reshape(-1)[-1] != OLD:
            result += "; INPUT MODIFIED"
    cpu = (use1.ru_utime - use0.ru_utime) + (use1.ru_stime - use0.ru_stime)
    faults = use1.ru_minflt - use0.ru_minflt
    row = Row(graph.name, mode, label, 1e3 * statistics.median(times), 1e3 * cpu / repeats,
              written, same, faults * PAGE_BYTES / repeats / 2**20, (rss1 - rss0) / 2**20, result,
              warnings)
    del sess, outputs
    gc.collect()
    return row


def print_table(rows: list[Row], g: Geometry) -> None:
    print(f"cache [B={g.batch}, N={g.cache_len}, W={g.width}] float32 = "
          f"{g.cache_bytes / 2**20:.1f} MiB; update {g.update_bytes} B; "
          f"onnxruntime {ort.__version__}; {os.cpu_count()} CPUs; load average "
          f"{os.getloadavg()[0]:.1f}")
    head = (f"{'variant':<48} {'mode':<9} {'options':<16} {'median ms':>10} {'cpu ms':>8} "
            f"{'bytes written':>14} "
            f"{'in-place':>8} {'fresh MiB':>9} {'RSS+ MiB':>8}  {'result':<26} ORT warnings")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.variant:<48} {r.mode:<9} {r.options:<16} {r.ms:>10.3f} {r.cpu_ms:>8.3f} "
              f"{r.bytes_written:>14,} "
              f"{'yes' if r.same_ptr else 'no':>8} {r.fresh_mib:>9.1f} {r.rss_growth_mib:>8.1f}  "
              f"{r.result:<26} "
              f"{r.warnings}")


def rtx_probe(g: Geometry) -> list[dict]:
    """Parse and AOT-build small TensorScatter / ScatterND graphs with TensorRT-RTX (no GPU needed
    to build; running the engine needs one). Returns one dict per case."""
    try:
        import tensorrt_rtx as trt
    except ImportError:
        return [{"case": "tensorrt_rtx not installed"}]

    b, n, w = g.batch, g.cache_len, g.width

    def ts(past, update, wi=("b",), attrs=None, read=False, present_out=True, dtype=F32):
        nodes = [helper.make_node("TensorScatter", ["past", "update", "wi"], ["present"],
                                  **(attrs or {}))]
        outputs = [_vi("present", dtype, list(past))] if present_out else []
        if read:
            nodes.append(helper.make_node("ReduceSum", ["present"], ["attn"], keepdims=1))
            outputs.append(_vi("attn", dtype, [1] * len(past)))
        graph = helper.make_graph(nodes, "g", [_vi("past", dtype, list(past)),
                                               _vi("update", dtype, list(update)),
                                               _vi("wi", I64, list(wi))], outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
        model.ir_version = 11
        return model

    def snd(shape, idx_rows):
        graph = helper.make_graph(
            [helper.make_node("ScatterND", ["data", "indices", "updates"], ["present"])], "g",
            [_vi("data", F32, list(shape)), _vi("indices", I64, [idx_rows, 2]),
             _vi("updates", F32, [idx_rows, shape[-1]])], [_vi("present", F32, list(shape))])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        model.ir_version = 10
        return model

    cases = [
        ("TensorScatter 3D [B,N,W] axis=1", ts((b, n, w), (b, 1, w), (b,), {"axis": 1}), None),
        ("TensorScatter 4D [B,1,N,W] axis=-2", ts((b, 1, n, w), (b, 1, 1, w), (b,)), None),
        ("  + present read by ReduceSum", ts((b, 1, n, w), (b, 1, 1, w), (b,), read=True), None),
        ("  present not a graph output", ts((b, 1, n, w), (b, 1, 1, w), (b,), read=True,
                                            present_out=False), None),
        ("  mode=circular", ts((b, 1, n, w), (b, 1, 1, w), (b,), {"mode": "circular"}), None),
        ("  dynamic batch", ts(("B", 1, n, w), ("B", 1, 1, w), ("B",)),
         {"past": ((1, 1, n, w), (b, 1, n, w), (b, 1, n, w)),
          "update": ((1, 1, 1, w), (b, 1, 1, w), (b, 1, 1, w)), "wi": ((1,), (b,), (b,))}),
        ("  dynamic update length (prefill)", ts((b, 1, n, w), (b, 1, "S", w), (b,)),
         {"update": ((b, 1, 1, w), (b, 1, 64, w), (b, 1, 512, w))}),
        ("  dynamic cache length", ts((b, 1, "N", w), (b, 1, 1, w), (b,)),
         {"past": ((b, 1, 64, w), (b, 1, n, w), (b, 1, n, w))}),
        ("  bf16", ts((b, 1, n, w), (b, 1, 1, w), (b,), dtype=TensorProto.BFLOAT16), None),
        ("ScatterND [B,N,W]", snd((b, n, w), b), None),
        ("ScatterND paged [P,page,W]", snd((g.pages, g.page, w), b), None),
    ]

    class Log(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            if severity <= trt.ILogger.Severity.ERROR and "CUDA driver" not in msg \
                    and "catchCudaError" not in msg:
                self.errors.append(msg)

    out = []
    for name, model, profile in cases:
        log = Log()
        builder = trt.Builder(log)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, log)
        row = {"case": name, "parsed": bool(parser.parse(model.SerializeToString()))}
        if not row["parsed"]:
            row["error"] = parser.get_error(0).desc().splitlines()[-1][:160] \
                if parser.num_errors else "?"
            for line in parser.get_error(0).desc().splitlines() if parser.num_errors else ():
                if "Error Code" in line or "Assertion" in line:
                    row["error"] = line[:160]
                    break
            out.append(row)
            continue
        row["layers"] = ",".join(network.get_layer(i).type.name for i in range(network.num_layers))
        config = builder.create_builder_config()
        if profile:
            opt = builder.create_optimization_profile()
            for tensor, (lo, mid, hi) in profile.items():
                opt.set_shape(tensor, lo, mid, hi)
            config.add_optimization_profile(opt)
        config.num_compute_capabilities = 1
        config.set_compute_capability(trt.ComputeCapability.SM89, 0)
        row["built"] = builder.build_serialized_network(network, config) is not None
        if not row["built"] and log.errors:
            row["error"] = log.errors[-1][:160]
        out.append(row)
    return out


OPTION_SETS = [
    ("opt=DISABLE_ALL", {"graph_optimization_level": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}),
    ("opt=BASIC", {"graph_optimization_level": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}),
    ("opt=EXTENDED", {"graph_optimization_level": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}),
    ("arena off", {"enable_cpu_mem_arena": False}),
    ("mem_pattern off", {"enable_mem_pattern": False}),
    ("parallel exec", {"execution_mode": ort.ExecutionMode.ORT_PARALLEL}),
    ("dev-alloc-init=1", {"session.use_device_allocator_for_initializers": "1"}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-len", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--width", type=int, default=576)
    parser.add_argument("--page", type=int, default=64, help="tokens per page of the paged pool")
    parser.add_argument("--repeats", type=int, default=7,
                        help="timed calls of the copying variants (in-place ones get 20x)")
    parser.add_argument("--no-options", action="store_true",
                        help="skip the session-option sweep of (f)")
    parser.add_argument("--input-offset", type=int, default=2048,
                        help="bytes past a page boundary where input caches start (see filled())")
    parser.add_argument("--spin", action="store_true",
                        help="leave ORT's intra-op spinning on (it inflates the cpu ms column)")
    parser.add_argument("--rtx", action="store_true",
                        help="also parse and build the graphs with TensorRT-RTX (if installed)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    g = Geometry(args.batch, args.cache_len, args.width, args.page)
    if g.cache_len < 8 * g.batch or g.cache_len % g.page:
        parser.error("--cache-len must be >= 8 x --batch and a multiple of --page")

    plan: list[tuple[Graph, str, tuple[str, dict]]] = []
    base = ("default", {})
    for graph in (identity(g), concat(g)):
        for mode in ("run", "iob-other", "iob-alloc"):
            plan.append((graph, mode, base))
    for graph in (tensor_scatter(g), scatter_nd(g), paged(g)):
        for mode in MODES:
            plan.append((graph, mode, base))
    for reader in ("new-rows", "all", "past-rows"):
        plan.append((tensor_scatter(g, reader), "iob-same", base))
    plan.append((tensor_scatter(g, "new-rows"), "run", base))
    plan.append((tensor_scatter(g, "past-rows"), "run", base))
    plan.append((tensor_scatter(g, internal=True), "iob-same", base))
    if not args.no_options:
        ts = tensor_scatter(g)
        for opt in OPTION_SETS:
            for mode in ("run", "iob-same"):
                plan.append((ts, mode, opt))

    rows = []
    for graph, mode, opt in plan:
        in_place_expected = mode == "iob-same" and not graph.copies_always
        repeats = args.repeats * (20 if in_place_expected else 1)
        row = measure(graph, mode, g, repeats, opt, args.input_offset, args.spin)
        rows.append(row)
        print(f"  {row.variant} / {mode} / {opt[0]}: {row.ms:.3f} ms", file=sys.stderr, flush=True)
    print_table(rows, g)
    rtx = []
    if args.rtx:
        rtx = rtx_probe(g)
        print("\nTensorRT-RTX: parse + AOT build (SM89) of the same updates")
        for r in rtx:
            detail = r.get("layers", "") + (f"  built={r['built']}" if "built" in r else "")
            print(f"  {r['case']:<38} parsed={r.get('parsed', '-')!s:<5} {detail}  "
                  f"{r.get('error', '')}")
    if args.json:
        args.json.write_text(json.dumps({
            "geometry": g.__dict__, "onnxruntime": ort.__version__, "cpus": os.cpu_count(),
            "rows": [r.__dict__ for r in rows], "rtx": rtx}, indent=1))


if __name__ == "__main__":
    main()
