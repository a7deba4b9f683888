"""The MoE case of ``dsa-export bench``: one DeepSeek-V3.2-width MoE block, four ways.

The layer is transformers' ``DeepseekV32MoE`` (router, routed experts, one shared expert) with
seeded random weights. The same weights run as

* ``ours``: :class:`dsa_export.nn.moe.RoutedMoE` over the block's modules, the routed experts as
  the ``dsa::moe_experts`` torch op (one GEMM pair per active expert over exactly its tokens);
* ``eager`` / ``batched_mm``: the transformers block with that experts implementation (``eager``
  loops over the hit experts; ``batched_mm`` gathers every routing slot's weight matrices, so its
  cases above ``batched_mm_limit_gib`` of gathered weights are skipped);
* ``onnxruntime``: ``ours`` exported with the project's exporter (weights as external data) and
  run on the CPU provider, the experts node through its function body. It runs last for each
  layer, after the torch weights are freed, so that two copies of the weights never coexist.

Peak memory is the growth of the resident set over one call (:mod:`.memory`), next to the weight
bytes that exist before the call.
"""

from __future__ import annotations

import datetime as _dt
import gc
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import dsa_export.bench.memory as memory
from dsa_export import __version__
from dsa_export.bench.backends import host_environment
from dsa_export.bench.harness import fit_power_law, time_calls
from dsa_export.bench.settings import MoEBenchSettings, MoEConfig
from dsa_export.errors import DSAUserError

SCHEMA = "dsa-export-bench-moe/1"
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: Token count at which every backend's output is compared with ``eager``'s (or fewer).
CHECK_TOKENS = 64
_RSS_METHOD = "peak RSS growth of one call (VmHWM after, VmRSS before, after malloc_trim)"


def moe_flops(cfg: MoEConfig, experts: int, tokens: int) -> int:
    """Multiply-adds x 2 of one block call: router ``2 N H E``, routed experts ``6 N K H I`` (gate,
    up, down), shared experts ``6 N H I S``. Softmax-free routing and the SiLU are not counted."""
    n, h, i = tokens, cfg.hidden, cfg.intermediate
    return 2 * n * h * experts + 6 * n * cfg.top_k * h * i + 6 * n * h * i * cfg.shared_experts


def batched_mm_gather_bytes(cfg: MoEConfig, tokens: int) -> int:
    """Bytes of the per-slot weight copies transformers' ``batched_mm`` holds at once."""
    return tokens * cfg.top_k * 3 * cfg.hidden * cfg.intermediate * _DTYPES[cfg.dtype].itemsize


def layer_weight_bytes(cfg: MoEConfig, experts: int) -> int:
    """Bytes of the parameters of :func:`build_block`'s layer (router, routed and shared experts)."""
    values = experts * 3 * cfg.hidden * cfg.intermediate + cfg.shared_experts * 3 * cfg.hidden * cfg.intermediate
    return (values + experts * cfg.hidden) * _DTYPES[cfg.dtype].itemsize


def check_export_space(settings: MoEBenchSettings) -> None:
    """Refuse, before any timing, a run whose ONNX Runtime export cannot fit in the temporary folder."""
    import shutil

    if "onnxruntime" not in settings.backends:
        return
    folder = tempfile.gettempdir()
    needed = max(layer_weight_bytes(settings.layer, e) for e in settings.experts) + (256 << 20)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise DSAUserError(
            f"the onnxruntime backend exports the layer ({needed / 2**30:.1f} GiB with its graph) to {folder}, which "
            f"has {free / 2**30:.1f} GiB free; point TMPDIR at a folder with room (e.g. /dev/shm) or drop onnxruntime."
        )


def build_block(cfg: MoEConfig, experts: int):
    """transformers' ``DeepseekV32MoE`` in ``cfg.dtype`` with seeded weights ``N(0, fan_in^-0.5)``
    (activations of order one) and a float32 correction bias ``N(0, 0.05)``; eager experts selected."""
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32MoE

    config = DeepseekV32Config(
        hidden_size=cfg.hidden, moe_intermediate_size=cfg.intermediate, n_routed_experts=experts,
        num_experts_per_tok=cfg.top_k, n_group=cfg.n_group, topk_group=cfg.topk_group,
        n_shared_experts=cfg.shared_experts, norm_topk_prob=True, routed_scaling_factor=cfg.routed_scaling_factor,
    )
    config._experts_implementation = "eager"
    dtype = _DTYPES[cfg.dtype]
    with torch.device("meta"):
        block = DeepseekV32MoE(config).to(dtype)  # on meta: no float32 copy is ever allocated
    block = block.to_empty(device="cpu").eval()
    # The correction bias stays float32, as checkpoints store it.
    block.gate.register_buffer("e_score_correction_bias", torch.zeros(experts, dtype=torch.float32))
    generator = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for _, param in block.named_parameters():
            param.normal_(0.0, param.shape[-1] ** -0.5, generator=generator)
        block.gate.e_score_correction_bias.normal_(0.0, 0.05, generator=generator)
    return block


def make_tokens(cfg: MoEConfig, tokens: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(cfg.seed + 1 + tokens)
    return torch.randn(1, tokens, cfg.hidden, generator=generator).to(_DTYPES[cfg.dtype])


def _weight_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


class _Layer:
    """One built block and the callables of its torch backends."""

    def __init__(self, cfg: MoEConfig, experts: int):
        from dsa_export.nn.moe import RoutedMoE

        start = time.perf_counter()
        self.cfg, self.experts = cfg, experts
        self.block = build_block(cfg, experts)
        self.ours = RoutedMoE.from_hf(self.block)
        self.weight_bytes = _weight_bytes(self.block)
        self.build_s = time.perf_counter() - start

    def forward(self, backend: str) -> Callable[[torch.Tensor], torch.Tensor]:
        if backend == "ours":
            return self.ours
        block = self.block

        def run(x: torch.Tensor) -> torch.Tensor:
            block.config._experts_implementation = backend  # read by transformers at call time
            try:
                return block(x)
            finally:
                block.config._experts_implementation = "eager"

        return run


class _OnnxRuntime:
    """``ours`` exported to a temporary folder and loaded with the CPU memory arena off."""

    def __init__(self, layer: _Layer, threads: int):
        from dsa_export.export import ExportSettings
        from dsa_export.export.exporter import export_to_file
        from dsa_export.model_ref import ModelReference
        from dsa_export.model_source import ModelSource
        from dsa_export.runtime.onnxrt import session

        self._tmp = tempfile.TemporaryDirectory(prefix="dsa-bench-moe-")
        cfg = layer.cfg
        start = time.perf_counter()
        source = ModelSource(
            reference=ModelReference("module", name="bench:moe-layer"), module=layer.ours,
            example_inputs={"hidden_states": make_tokens(cfg, 8).expand(2, -1, -1).contiguous().float()},
            output_names=["out"], config={"bench_moe": {**asdict(cfg), "experts": layer.experts}},
        )
        self.path = export_to_file(source, ExportSettings(ops="plugin", batch=2, seq_len=8),
                                   Path(self._tmp.name) / "moe.onnx").path
        self.export_s = time.perf_counter() - start
        memory.release_cached_memory()
        self.threads = threads
        self._session_factory = lambda: session(self.path, threads=threads, memory_arena=False)
        self.sess = None
        self.load_rss_bytes: int | None = None
        self.load_s = 0.0

    def load(self) -> None:
        """Create the session (after the torch weights are gone) and record its resident growth."""
        start = time.perf_counter()
        if memory.peak_rss_supported():
            self.sess, self.load_rss_bytes = memory.measure_peak_rss(self._session_factory)
        else:
            self.sess = self._session_factory()
        self.load_s = time.perf_counter() - start

    def forward(self) -> Callable[[torch.Tensor], np.ndarray]:
        sess = self.sess
        return lambda x: sess.run(None, {"hidden_states": x.float().numpy()})[0]

    def close(self) -> None:
        self.sess = None
        self._tmp.cleanup()


def _skip_reason(backend: str, cfg: MoEConfig, tokens: int, limit_gib: float) -> str | None:
    if backend == "batched_mm":
        gather = batched_mm_gather_bytes(cfg, tokens)
        if gather > limit_gib * 2**30:
            return (f"skipped: batched_mm would gather {_size(gather)} of expert weights at N={tokens} "
                    f"(limit --batched-mm-limit {limit_gib:g} GiB)")
    return None


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"


def _agreement(got: np.ndarray, want: np.ndarray) -> dict:
    got64, want64 = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    denom = np.linalg.norm(got64) * np.linalg.norm(want64)
    return {
        "max_abs_diff": float(np.abs(got64 - want64).max()),
        "max_abs_reference": float(np.abs(want64).max()),
        "cosine": float(got64 @ want64 / denom) if denom else 1.0,
    }


def _as_numpy(out) -> np.ndarray:
    return out.detach().float().numpy() if isinstance(out, torch.Tensor) else np.asarray(out, np.float32)


def run_moe_bench(settings: MoEBenchSettings, progress: Callable[[str], None] | None = None) -> dict:
    """Time every (experts, backend, tokens) case and return the report (keys in docs/bench.md)."""
    say = progress or (lambda _msg: None)
    check_export_space(settings)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    threads = settings.threads or torch.get_num_threads()
    started = _dt.datetime.now(_dt.timezone.utc)
    environment = {"dsa_export": __version__, **host_environment()}  # load average before the run
    cfg = settings.layer
    torch_backends = [b for b in settings.backends if b != "onnxruntime"]
    layers, cases = [], []
    for experts in settings.experts:
        say(f"building the E={experts} layer ({cfg.dtype}, hidden {cfg.hidden}, experts of {cfg.intermediate})")
        layer = _Layer(cfg, experts)
        info = {"experts": experts, "weight_bytes": layer.weight_bytes, "build_s": round(layer.build_s, 2),
                "agreement": {}}
        check = min(CHECK_TOKENS, max(settings.tokens))
        with torch.inference_mode():
            references = {n: _as_numpy(layer.forward("eager")(make_tokens(cfg, n)))
                          for n in {check, min(settings.tokens)}}
        cases += _torch_curves(layer, torch_backends, settings, say, check, references, info["agreement"])
        if "onnxruntime" in settings.backends:
            say(f"exporting the E={experts} layer for onnxruntime")
            ort_backend = _OnnxRuntime(layer, threads)
            del layer  # the session has its own copy of the weights: free the torch one first
            gc.collect()
            memory.release_cached_memory()
            try:
                ort_backend.load()
                info.update(onnxruntime_export_s=round(ort_backend.export_s, 1),
                            onnxruntime_load_s=round(ort_backend.load_s, 1),
                            onnxruntime_load_rss_bytes=ort_backend.load_rss_bytes)
                cases += _onnxruntime_curve(ort_backend, experts, settings, say, check, references, info["agreement"])
            finally:
                ort_backend.close()
        else:
            del layer
        gc.collect()
        memory.release_cached_memory()
        layers.append(info)
    environment.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    try:
        import transformers

        environment["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - the layer needs it
        pass
    if "onnxruntime" in settings.backends:
        import onnxruntime as ort

        environment.update(onnxruntime=ort.__version__, onnxruntime_threads=threads)
    environment["load_average_after"] = host_environment()["load_average_1_5_15"]
    for case in cases:
        if "skipped" not in case:
            case["gflops"] = moe_flops(cfg, case["experts"], case["tokens"]) / case["median_s"] / 1e9
    report = {
        "schema": SCHEMA,
        "case": "moe",
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round((_dt.datetime.now(_dt.timezone.utc) - started).total_seconds(), 1),
        "environment": environment,
        "config": asdict(cfg),
        "settings": {
            "tokens": list(settings.tokens), "experts": list(settings.experts), "backends": list(settings.backends),
            "warmup": settings.warmup, "warmup_below_s": settings.warmup_below_s, "repeats": settings.repeats,
            "case_budget_s": settings.case_budget_s, "time_budget_s": settings.time_budget_s,
            "batched_mm_limit_gib": settings.batched_mm_limit_gib, "memory": settings.memory,
            "memory_method": {b: _RSS_METHOD + (", session memory arena off" if b == "onnxruntime" else "")
                              for b in settings.backends},
        },
        "layers": layers,
        "cases": cases,
    }
    report["ratios"] = moe_ratios(cases)
    report["exponents"] = moe_exponents(cases)
    report["notes"] = list(dict.fromkeys(case["skipped"] for case in cases if "skipped" in case))
    return report


def _torch_curves(layer: _Layer, backends: list[str], settings: MoEBenchSettings, say, check: int,
                  references: dict[int, np.ndarray], agreement: dict) -> list[dict]:
    """Cases and output agreement of the torch backends. The backends take turns at each token
    count, so that a ratio compares calls made minutes apart at most on a machine whose load
    drifts; their closures end here, so deleting the layer afterwards frees its weights."""
    cfg = layer.cfg
    calls = {b: (lambda n, f=layer.forward(b): _torch_call(f, make_tokens(cfg, n))) for b in backends}
    curves = {b: _Curve(b, layer.experts, settings, say, calls[b]) for b in backends}
    for tokens in settings.tokens:
        for backend in backends:
            curves[backend].run(tokens)
    for backend in backends:
        n = check if _skip_reason(backend, cfg, check, settings.batched_mm_limit_gib) is None else min(settings.tokens)
        if _skip_reason(backend, cfg, n, settings.batched_mm_limit_gib) is None:
            agreement[backend] = {"tokens": n, **_agreement(_as_numpy(calls[backend](n)), references[n])}
    return [case for tokens in settings.tokens for b in backends for case in curves[b].cases if case["tokens"] == tokens]


def _onnxruntime_curve(backend: _OnnxRuntime, experts: int, settings: MoEBenchSettings, say, check: int,
                       references: dict[int, np.ndarray], agreement: dict) -> list[dict]:
    """Cases and output agreement of ONNX Runtime (its session is released with the closure here)."""
    fn, cfg = backend.forward(), settings.layer
    curve = _Curve("onnxruntime", experts, settings, say, lambda n: fn(make_tokens(cfg, n)))
    for tokens in settings.tokens:
        curve.run(tokens)
    agreement["onnxruntime"] = {"tokens": check, **_agreement(fn(make_tokens(cfg, check)), references[check])}
    return curve.cases


def _torch_call(fn, x: torch.Tensor):
    with torch.inference_mode():
        return fn(x)


class _Curve:
    """One backend's cases over increasing token counts: warm-up while calls are short, skips for
    batched_mm's gather bound and after a call over the time budget, memory on the first timed call."""

    def __init__(self, backend: str, experts: int, settings: MoEBenchSettings, say, call: Callable[[int], object]):
        self.backend, self.experts, self.settings, self.say, self.call = backend, experts, settings, say, call
        self.warmup = settings.warmup
        self.too_slow_at: int | None = None
        self.cases: list[dict] = []

    def run(self, tokens: int) -> None:
        settings, backend = self.settings, self.backend
        case: dict = {"experts": self.experts, "backend": backend, "tokens": tokens}
        reason = _skip_reason(backend, settings.layer, tokens, settings.batched_mm_limit_gib)
        if reason is None and self.too_slow_at is not None:
            reason = (f"skipped: one call at N={self.too_slow_at} took longer than the {settings.time_budget_s:g} s "
                      "time budget")
        if reason is not None:
            case["skipped"] = reason
            self.cases.append(case)
            self.say(f"E={self.experts:<4} {backend:<12} N={tokens:<5} {reason}")
            return
        peak: dict[str, int | None] = {}

        def first_call(thunk):
            if not memory.peak_rss_supported():
                return thunk()
            elapsed, peak["bytes"] = memory.measure_peak_rss(thunk)
            return elapsed

        timing = time_calls(lambda: self.call(tokens), warmup=self.warmup, repeats=settings.repeats,
                            budget_s=settings.case_budget_s, first_call=first_call if settings.memory else None)
        case.update(timing.to_dict())
        if settings.memory:
            case["peak_bytes"] = peak.get("bytes")
        if case["min_s"] > settings.warmup_below_s:
            self.warmup = 0
        if case["min_s"] > settings.time_budget_s:
            self.too_slow_at = tokens
        self.cases.append(case)
        mib = case.get("peak_bytes")
        self.say(f"E={self.experts:<4} {backend:<12} N={tokens:<5} {case['median_s'] * 1e3:10.1f} ms"
                 + (f"  {mib / 2**20:8.1f} MiB" if mib is not None else "") + f"  ({case['repeats']} timed)")


def moe_ratios(cases: list[dict]) -> list[dict]:
    """Per (experts, tokens, backend): time and peak memory relative to ``eager`` in the same run."""
    done = {(c["experts"], c["backend"], c["tokens"]): c for c in cases if "skipped" not in c}
    rows = []
    for (experts, backend, tokens), case in sorted(done.items()):
        eager = done.get((experts, "eager", tokens))
        if backend == "eager" or eager is None:
            continue
        row = {"experts": experts, "tokens": tokens, "backend": backend,
               "time_vs_eager": case["median_s"] / eager["median_s"]}
        if case.get("peak_bytes") and eager.get("peak_bytes"):
            row["memory_vs_eager"] = case["peak_bytes"] / eager["peak_bytes"]
        rows.append(row)
    return rows


def moe_exponents(cases: list[dict]) -> dict[str, dict]:
    """Growth exponent in N of every curve's median time and peak memory (``E<experts>/<backend>``)."""
    curves: dict[str, list[dict]] = {}
    for case in cases:
        if "skipped" not in case:
            curves.setdefault(f"E{case['experts']}/{case['backend']}", []).append(case)
    result = {}
    for name, points in curves.items():
        entry = {}
        fit = fit_power_law([p["tokens"] for p in points], [p["median_s"] for p in points])
        if fit is not None:
            entry["time"] = fit.to_dict()
        mem = [(p["tokens"], p["peak_bytes"]) for p in points if p.get("peak_bytes")]
        fit = fit_power_law([m[0] for m in mem], [m[1] for m in mem]) if mem else None
        if fit is not None:
            entry["memory"] = fit.to_dict()
        if entry:
            result[name] = entry
    return result


__all__ = ["SCHEMA", "batched_mm_gather_bytes", "build_block", "check_export_space", "layer_weight_bytes",
           "moe_exponents", "moe_flops", "moe_ratios", "run_moe_bench"]
