"""Where the layer runs: torch on CPU, ONNX Runtime on CPU, and the CUDA kernels on a GPU.

A backend turns (variant, L) into a zero-argument call, knows how it measures peak memory, and
describes its environment. Nothing here touches CUDA unless the ``cuda`` backend is asked for.
"""

from __future__ import annotations

import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

import dsa_export.bench.memory as memory
from dsa_export.bench.block import AttentionBlock, make_blocks, make_input
from dsa_export.bench.settings import BenchSettings
from dsa_export.errors import DSAUserError


class Backend:
    """One runtime; subclasses fill in :meth:`call` and :meth:`measure_peak`."""

    name = ""
    #: How :meth:`measure_peak` measures, in words for the report.
    memory_method = ""

    def __init__(self, settings: BenchSettings):
        self.settings = settings
        #: The selection of each variant's last call (dsa: indices ``[B,L,K]``; block:
        #: ``block_index [B,H,nqb,Kb]``; lsh: indices ``[B*H,L,K]``).
        self.last_selection: dict[str, torch.Tensor] = {}
        #: Seconds spent in the layers' parts per call, where the backend can time them
        #: synchronously (``indexer``: DSA's indexer scores + top-k; ``selection``: the block and
        #: LSH selections; ``sparse_attention``, ``block_sparse_attention``, ``dense_attention``).
        self.part_seconds: dict[str, list[float]] = {}

    @classmethod
    def check_available(cls) -> None:
        """Raise a one-sentence DSAUserError when this backend cannot run here (cheap, before any work)."""

    def skip_reason(self, variant: str, seq_len: int) -> str | None:
        """Why this case is not run (None: it runs)."""
        return None

    def call(self, variant: str, seq_len: int) -> Callable[[], object]:
        raise NotImplementedError

    def measure_peak(self, thunk: Callable[[], float]) -> tuple[float, int | None]:
        """Run ``thunk`` (one timed call) and return its result and the peak extra bytes."""
        if not memory.peak_rss_supported():
            return thunk(), None
        return memory.measure_peak_rss(thunk)

    def selected_indices(self, variant: str = "dsa") -> torch.Tensor | None:
        """The selection of the variant's last call (for the measured sparsity), on the CPU."""
        selection = self.last_selection.get(variant)
        return None if selection is None else selection.cpu()

    def gemm_gflops(self) -> float | None:
        """GFLOP/s of a plain float32 matmul of the layer's projection shape on this runtime."""
        return None

    def agreement(self, variant: str, seq_len: int) -> dict | None:
        """How the last call's output compares with our torch layer's (None: not compared)."""
        return None

    def environment(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def _recording_indexer(backend: Backend, indexer: Callable[..., torch.Tensor],
                       variant: str = "dsa") -> Callable[..., torch.Tensor]:
    """``indexer`` (or a block/LSH selection function) that keeps its result as the variant's selection."""

    def record(*args, **kwargs):
        backend.last_selection[variant] = indexer(*args, **kwargs)
        return backend.last_selection[variant]

    return record


def _wire_selections(backend: Backend, blocks: dict[str, AttentionBlock], timed: bool) -> None:
    """Record (and with ``timed``, time) the block and LSH layers' selections and attention."""
    for variant in ("block", "lsh"):
        block = blocks.get(variant)
        if block is None:
            continue
        select = _recording_indexer(backend, block.selection_fn, variant)
        block.selection_fn = _timed_part(backend, "selection", select) if timed else select
        if timed and variant == "block":
            block.block_attention_fn = _timed_part(backend, "block_sparse_attention", block.block_attention_fn)
        elif timed:
            block.attention_fn = _timed_part(backend, "sparse_attention", block.attention_fn)


def _timed_part(backend: Backend, part: str, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` that also appends its duration to ``backend.part_seconds[part]`` (CPU: synchronous)."""

    def timed(*args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        backend.part_seconds.setdefault(part, []).append(time.perf_counter() - start)
        return result

    return timed


class TorchBackend(Backend):
    """Our torch ops (the chunked CPU implementations) against ``F.scaled_dot_product_attention``."""

    name = "torch"
    memory_method = "peak RSS growth of one call (VmHWM after, VmRSS before, after malloc_trim)"

    def __init__(self, settings: BenchSettings):
        super().__init__(settings)
        if settings.threads:
            torch.set_num_threads(settings.threads)
        self.blocks = make_blocks(settings.block, settings.variants)
        dsa = self.blocks.get("dsa")
        if dsa is not None:
            dsa.indexer_fn = _timed_part(self, "indexer", _recording_indexer(self, dsa.indexer_fn))
            dsa.attention_fn = _timed_part(self, "sparse_attention", dsa.attention_fn)
        dense = self.blocks.get("dense")
        if dense is not None:
            dense.dense_attention_fn = _timed_part(self, "dense_attention", dense.dense_attention_fn)
        _wire_selections(self, self.blocks, timed=True)
        self._inputs: dict[int, torch.Tensor] = {}

    def _input(self, seq_len: int) -> torch.Tensor:
        if seq_len not in self._inputs:
            self._inputs = {seq_len: make_input(self.settings.block, seq_len)}
        return self._inputs[seq_len]

    def call(self, variant: str, seq_len: int) -> Callable[[], object]:
        block, x = self.blocks[variant], self._input(seq_len)

        def run() -> torch.Tensor:
            with torch.inference_mode():
                return block(x)

        return run

    def gemm_gflops(self) -> float | None:
        from dsa_export.bench.gemm import torch_gemm_gflops

        return torch_gemm_gflops(self.settings.block.hidden)

    def environment(self) -> dict:
        return {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}


class OnnxRuntimeBackend(Backend):
    """Every variant exported with the project's exporter (``dsa`` nodes run as function bodies).

    The DSA, block and LSH files also return their selection (the indexer's indices, the
    ``block_index``, the LSH indices), so every call is checked against our torch layer (same
    weights, same input): selections compared as sets per row (a query, or a head's query block),
    outputs by their largest difference.
    """

    name = "onnxruntime"
    memory_method = (
        "peak RSS growth of one call (VmHWM after, VmRSS before, after malloc_trim), session memory arena off"
    )

    def __init__(self, settings: BenchSettings):
        super().__init__(settings)
        from dsa_export.export import ExportSettings, export_model, save_model
        from dsa_export.model_ref import ModelReference
        from dsa_export.model_source import ModelSource
        from dsa_export.runtime.onnxrt import session

        cfg = settings.block
        self._tmp = tempfile.TemporaryDirectory(prefix="dsa-bench-")
        self.sessions = {}
        self.export_s: dict[str, float] = {}
        threads = settings.threads or torch.get_num_threads()
        self.blocks = make_blocks(cfg, settings.variants)
        for variant, block in self.blocks.items():
            start = time.perf_counter()
            # The block layer's example holds two and a half blocks: with one whole block the
            # exporter would specialize the sequence to it (ceil(S/bs) = 1 and no ragged block).
            seq = 2 * cfg.block_size + cfg.block_size // 2 if variant == "block" else 64
            export_settings = ExportSettings(ops="plugin", batch=2, seq_len=max(seq, 3))
            example = make_input(cfg, export_settings.seq_len).expand(export_settings.batch, -1, -1).contiguous()
            source = ModelSource(
                reference=ModelReference("module", name=f"bench:{variant}-block"), module=block,
                example_inputs={"x": example}, output_names=["out"],
                config={"bench_block": {**cfg.__dict__, "variant": variant}},
            )
            model = export_model(source, export_settings)
            if variant in _SELECTION_NODE:
                _output_selection(model, variant)
            path = save_model(model, Path(self._tmp.name) / f"{variant}.onnx")
            self.export_s[variant] = time.perf_counter() - start
            self.sessions[variant] = session(path, threads=threads, memory_arena=False)
        self._threads = threads
        self._last: dict[str, list] = {}

    def skip_reason(self, variant: str, seq_len: int) -> str | None:
        limit = self.settings.max_onnxruntime_seq
        if seq_len > limit:
            return f"skipped above --max-onnxruntime-seq {limit}"
        if variant == "dense":
            # The dense export's SDPA becomes [B,H,L,L] scores (measured peak: about 2.2 of those
            # tensors at L = 4096); the DSA bodies hold one chunk.
            need = 2.5 * 4 * self.settings.block.batch * self.settings.block.heads * seq_len**2
            available = memory.available_bytes()
            if available is not None and need > available:
                return (f"skipped: the dense export's [B,H,L,L] scores need about {_gib(need)} GiB at L={seq_len}, "
                        f"more than the {_gib(available)} GiB available")
        return None

    def call(self, variant: str, seq_len: int) -> Callable[[], object]:
        sess = self.sessions[variant]
        feed = {"x": make_input(self.settings.block, seq_len).numpy()}

        def run():
            self._last[variant] = sess.run(None, feed)

        return run

    def selected_indices(self, variant: str = "dsa") -> torch.Tensor | None:
        last = self._last.get(variant)
        return None if last is None or len(last) < 2 else torch.from_numpy(last[1])

    def agreement(self, variant: str, seq_len: int) -> dict | None:
        """Our torch layer on the same input, against the last ONNX Runtime call."""
        import numpy as np

        last = self._last.pop(variant, None)
        if last is None:
            return None
        block, recorded = self.blocks[variant], {}
        hook = {"dsa": "indexer_fn", "block": "selection_fn", "lsh": "selection_fn"}.get(variant)
        if hook is not None:
            select = getattr(block, hook)

            def record(*args, **kwargs):
                recorded["indices"] = select(*args, **kwargs)
                recorded["call"] = (args, kwargs)
                return recorded["indices"]

            setattr(block, hook, record)
        try:
            with torch.inference_mode():
                reference = block(make_input(self.settings.block, seq_len)).numpy().astype(np.float64)
        finally:
            if hook is not None:
                setattr(block, hook, select)
        out = last[0].astype(np.float64)
        diff = np.abs(out - reference)
        result = {"reference": "torch", "max_abs_diff": float(diff.max()),
                  "max_abs_reference": float(np.abs(reference).max()),
                  "cosine": float((out * reference).sum() / (np.linalg.norm(out) * np.linalg.norm(reference)))}
        if variant == "dsa":
            ours, theirs = np.sort(last[1], axis=-1), np.sort(recorded["indices"].numpy(), axis=-1)
            same = (ours == theirs).all(-1)  # [B,L]: the same set of keys selected
            result["queries"] = int(same.size)
            result["selection_differs"] = int((~same).sum())
            result["max_abs_diff_same_selection"] = float(diff[same].max()) if same.any() else None
            result["near_tie_rows"], result["max_near_tie_gap"] = _near_ties(last[1], recorded, ~same)
        elif variant in ("block", "lsh") and len(last) > 1:
            # Rows: a head's query block (block) or a head's query (lsh); -1 pads sort first.
            ours, theirs = np.sort(last[1], axis=-1), np.sort(recorded["indices"].numpy(), axis=-1)
            same = (ours == theirs).all(-1)
            result["queries"] = int(same.size)
            result["selection_differs"] = int((~same).sum())
        return result

    def gemm_gflops(self) -> float | None:
        from dsa_export.bench.gemm import onnxruntime_gemm_gflops

        return onnxruntime_gemm_gflops(self.settings.block.hidden, self._threads)

    def environment(self) -> dict:
        import onnxruntime as ort

        return {
            "onnxruntime": ort.__version__,
            "onnxruntime_threads": self._threads,
            "export_s": {k: round(v, 2) for k, v in self.export_s.items()},
        }

    def close(self) -> None:
        self.sessions.clear()
        self._tmp.cleanup()


#: A differing selection is a near tie when ours is still a top set of the float64 scores up to
#: this share of the row's largest score (validate's float32 default).
TIE_RTOL = 1e-4


def _near_ties(ours, recorded: dict, differs) -> tuple[int, float]:
    """Of the query rows whose selection differs from torch's, how many are near-tie flips: every
    key we kept scores (in float64, from the torch indexer's own inputs) at least every key we left
    out minus ``TIE_RTOL`` of the row's largest score; and the largest such gap, relative."""
    import numpy as np

    args, kwargs = recorded["call"]
    q, k, w = (np.asarray(x.detach().to(torch.float64)) for x in args[:3])
    scale, t = float(kwargs["scale"]), k.shape[1]
    near, largest = 0, 0.0
    for b, s in zip(*np.nonzero(differs)):
        limit = t - q.shape[1] + s + 1  # causal: the keys up to the query's position
        scores = (np.maximum(q[b, s] @ k[b, :limit].T * scale, 0) * w[b, s][:, None]).sum(0)
        mine = np.unique(ours[b, s][(ours[b, s] >= 0) & (ours[b, s] < limit)])
        left = np.setdiff1d(np.arange(limit), mine)
        gap = (scores[left].max() - scores[mine].min()) if left.size and mine.size else 0.0
        top = max(float(np.abs(scores).max()), 1e-30)
        if gap <= TIE_RTOL * top:
            near += 1
            largest = max(largest, float(gap) / top)
    return near, largest


#: Where each variant's selection is in its exported graph: (op type, input or output, position).
_SELECTION_NODE = {"dsa": ("DSAIndexerTopK", "output", 0), "block": ("DSABlockSparseAttention", "input", 3),
                   "lsh": ("DSASparseAttention", "input", 3)}


def _output_selection(model, variant: str = "dsa") -> None:
    """Make the layer's selection (the DSAIndexerTopK output, the block_index or the LSH indices fed
    to the attention node) a graph output too: the selection to compare and to measure."""
    from onnx import TensorProto, helper

    op_type, side, position = _SELECTION_NODE[variant]
    node = next(n for n in model.graph.node if n.op_type == op_type)
    name = (node.output if side == "output" else node.input)[position]
    info = next((v for v in model.graph.value_info if v.name == name), None)
    if info is None:  # a standard op's output without recorded shape: int32 of unknown shape
        info = helper.make_tensor_value_info(name, TensorProto.INT32, None)
    model.graph.output.append(info)


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f}"


class CudaBackend(Backend):
    """The plugin kernels (``libdsa_kernels.so`` through its C ABI) against CUDA SDPA, in bf16: the
    indexer and sparse attention (dsa, and lsh's attention), the block-sparse attention (block); the
    block and LSH selections run as torch ops on the GPU."""

    name = "cuda"
    memory_method = "torch.cuda.max_memory_allocated growth over one call"
    device = "cuda"
    dtype = torch.bfloat16

    @classmethod
    def check_available(cls) -> None:
        load_cuda_kernels()

    def __init__(self, settings: BenchSettings):
        super().__init__(settings)
        self.kernels = load_cuda_kernels()
        self.blocks = {v: b.to(self.device, self.dtype)
                       for v, b in make_blocks(settings.block, settings.variants).items()}
        kern = self.kernels

        def indexer(q, k, w, *, topk, scale, causal):
            return kern.indexer_topk(q, k, w.float(), topk=topk, scale=scale, causal=causal)

        def attention(q, k, v, indices, *, scale):
            return kern.sparse_attention(q, k, v, indices, scale=scale)

        def block_attention(q, k, v, block_index, *, block_size, scale, causal):
            return kern.block_sparse_attention(q, k, v, block_index, block_size=block_size, scale=scale,
                                               causal=causal)

        if "dsa" in self.blocks:
            self.blocks["dsa"].indexer_fn = _recording_indexer(self, indexer)
            self.blocks["dsa"].attention_fn = attention
        if "block" in self.blocks:
            self.blocks["block"].block_attention_fn = block_attention
        if "lsh" in self.blocks:
            self.blocks["lsh"].attention_fn = attention
        _wire_selections(self, self.blocks, timed=False)  # selections in torch on the GPU
        self._inputs: dict[int, torch.Tensor] = {}

    def call(self, variant: str, seq_len: int) -> Callable[[], object]:
        if seq_len not in self._inputs:
            self._inputs = {seq_len: make_input(self.settings.block, seq_len, self.dtype, self.device)}
        block, x = self.blocks[variant], self._inputs[seq_len]

        def run() -> torch.Tensor:
            with torch.inference_mode():
                out = block(x)
            self.synchronize()
            return out

        return run

    @staticmethod
    def synchronize() -> None:
        torch.cuda.synchronize()

    def measure_peak(self, thunk: Callable[[], float]) -> tuple[float, int | None]:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = thunk()
        return result, max(0, torch.cuda.max_memory_allocated() - before)

    def environment(self) -> dict:
        return {"torch": torch.__version__, "kernels": str(self.kernels.path), **cuda_environment()}


def load_cuda_kernels():
    """The plugin kernels' library, or a one-sentence error saying what is missing."""
    if not torch.cuda.is_available():
        raise DSAUserError(
            f"The cuda benchmark backend needs a CUDA GPU visible to torch, and this torch {torch.__version__} "
            f"(CUDA build: {torch.version.cuda or 'none'}) sees none; run it on a GPU machine or drop cuda."
        )
    try:
        from dsa_export.plugins.kernels import load_kernels  # type: ignore[import-not-found]
    except ImportError as exc:
        raise DSAUserError(
            "The cuda benchmark backend needs the DSA kernel library binding (dsa_export.plugins.kernels), which this "
            f"installation lacks ({exc}); install a dsa-export with the plugins and build the kernels."
        ) from exc
    return load_kernels(os.environ.get("DSA_EXPORT_PLUGIN_LIB") or None)


def cuda_environment() -> dict:
    """GPU, driver and CUDA versions for the results file."""
    info: dict = {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda,
                  "compute_capability": ".".join(map(str, torch.cuda.get_device_capability()))}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        )
        info["driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        info["driver"] = None
    return info


def host_environment() -> dict:
    """What the CPU numbers depend on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    threading = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")
                 if k in os.environ}
    return {
        "threading_env": threading,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15": [round(v, 2) for v in load] if load else None,
    }


BACKEND_TYPES: dict[str, type[Backend]] = {
    "torch": TorchBackend,
    "onnxruntime": OnnxRuntimeBackend,
    "cuda": CudaBackend,
}
