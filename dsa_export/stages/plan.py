"""Stage planning: split a DSA model into contiguous pipeline stages that each fit one GPU.

A 671B DeepSeek-V3.2 fits no single GPU, so it is deployed as stages, one engine per GPU. The
planner answers from ``config.json`` (and, when the weights are present, only the headers of the
safetensors shards) with plain arithmetic: no torch, transformers or onnx import, so ``dsa-export
plan`` answers in about a second and the export pipeline can call :func:`plan_stages` before it
loads anything. Every formula is written out in ``docs/plan.md``.

A stage's memory is its weights + its decode caches at the profile maximum + the activations of a
prefill of ``max_seq`` tokens at ``max_batch`` (a paged graph: of one prefill call, ``prefill_chunk``
tokens per row, returning one row of logits per sequence) + a fixed reserve for the CUDA/TensorRT
context.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.hf.config_schema import check_generation_config, read_json_object
from dsa_export.hf.sizes import (  # noqa: F401  (re-exported: the planner's public sizes)
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_SEQ,
    DEFAULT_RESERVE_BYTES,
    DTYPE_BYTES,
    FP8_CACHE,
    GIB,
    Geometry,
    LayerCosts,
    StagePlan,
    check_prefill_chunk,
    format_gib,
    layer_costs,
    parse_size,
    shard_files,
    weights_from_config,
    weights_from_headers,
)

#: Buffers of each cache pool of a paged stage on a GPU. TensorRT's scatter layer (the paged
#: graph's cache write) does not alias its input, so the runtimes hold two buffers per pool that
#: swap roles every call (tools/cpp_runtime/paged_engine.cpp) or a new output beside the input
#: (EngineSession); an in-place write would make this 1.
PAGED_POOL_BUFFERS = 2


class StagesDoNotFit(DSAUserError):
    """The model, read correctly, needs more or larger GPUs than asked for (not a bad input file)."""


# -- splitting -------------------------------------------------------------------------------------

def _cost_table(costs: LayerCosts) -> list[list[int]]:
    """``table[i][j]`` = total bytes of the stage running layers i:j (j > i): ``costs.stage(0, i,
    j).total_bytes``, with running sums and maxima along each row (O(n^2), not O(n^3))."""
    n, w = costs.num_layers, costs.weights
    table = []
    for i in range(n):
        row = [0] * (i + 1)
        base = costs.io_bytes + costs.reserve_bytes
        if i == 0:
            base += w.embedding + costs.embedding_io_bytes
        elif costs.shared[i]:
            base += costs.indices_io_bytes  # the selection handed in across the cut
        summed, peak = 0, 0
        for j in range(i + 1, n + 1):
            summed += w.layers[j - 1] + costs.cache[j - 1]
            peak = max(peak, costs.transient[j - 1])
            if j == n:
                end = w.head + costs.head_io_bytes
            else:
                end = costs.indices_io_bytes if costs.shared[j] else 0  # handed on across the cut
            row.append(base + summed + peak + end)
        table.append(row)
    return table


def best_split_of_any_count(table: list[list[int]], n: int) -> tuple[int, list[int]]:
    """(largest total, stage starts) of the split into any number of stages whose largest stage is
    the smallest possible (the fewest stages among equals): O(n^2), so a model that no split fits is
    told so without trying every count."""
    best: list[tuple[int, int]] = [(0, 0)] * (n + 1)
    arg = [0] * (n + 1)
    for j in range(1, n + 1):
        key, choice = None, 0
        for i in range(j):
            cand = (max(best[i][0], table[i][j]), best[i][1] + 1)
            if key is None or cand < key:
                key, choice = cand, i
        best[j], arg[j] = key, choice  # type: ignore[assignment]
    starts, j = [], n
    while j:
        j = arg[j]
        starts.append(j)
    return best[n][0], starts[::-1]


def min_max_splits(table: list[list[int]], n: int) -> Iterator[tuple[int, int, list[int]]]:
    """Exact DP over the cut points: for count = 1, 2, ..., n, the ``count`` non-empty contiguous
    stages of ``n`` layers with the smallest largest total, as (count, largest total, stage starts).

    ``best[s][j] = min over i of max(best[s-1][i], table[i][j])``, one count at a time so ``auto``
    stops at the first count that fits. It assumes nothing of the costs (a stage that starts on a
    GLM-5 "shared" layer takes an extra input, so removing a layer can make a stage bigger). Among
    equally good splits it keeps the one whose earlier stages have the smaller maximum, which spreads
    the slack instead of piling it up front.
    """
    best: list[float] = [table[0][j] if j else 0 for j in range(n + 1)]
    back: list[list[int]] = []
    for s in range(1, n + 1):
        if s > 1:
            new, arg = [math.inf] * (n + 1), [0] * (n + 1)
            for j in range(s, n + 1):
                choice, key = 0, (math.inf, math.inf)
                for i in range(s - 1, j):
                    cand = (max(best[i], table[i][j]), best[i])
                    if cand < key:
                        choice, key = i, cand
                new[j], arg[j] = key[0], choice
            best = new
            back.append(arg)
        starts, j = [], n
        for k in range(s - 1, 0, -1):
            j = back[k - 1][j]
            starts.append(j)
        yield s, int(best[n]), [0, *starts[::-1]]


def split_min_max(table: list[list[int]], n: int, count: int) -> tuple[int, list[int]]:
    """(largest total, stage starts) of the best split into exactly ``count`` stages."""
    for k, largest, starts in min_max_splits(table, n):
        if k == count:
            return largest, starts
    raise ValueError(f"count {count} is outside 1..{n}")


def fewest_stages(table: list[list[int]], n: int, capacity: int) -> tuple[int, int, list[int]] | None:
    """(count, largest, starts) of the fewest stages that all fit ``capacity``, or None if no split does."""
    if best_split_of_any_count(table, n)[0] > capacity:
        return None
    return next(((k, big, starts) for k, big, starts in min_max_splits(table, n) if big <= capacity), None)


# -- the plan --------------------------------------------------------------------------------------

@dataclass
class Plan:
    """A split of a model into stages plus the settings it was computed for (all sizes in bytes)."""

    model_type: str
    num_layers: int
    weights_source: str
    weight_precision: str  # fp8 (checkpoint FP8 kept), bf16, fp16 or fp32
    activation_dtype: str
    cache_dtype: str
    max_batch: int
    max_seq: int
    gpu_memory_bytes: int
    gpus: int | None
    reserve_bytes: int
    requested_stages: str | int  # "auto" or the count asked for
    total_parameters: int
    ignored_bytes: int
    ignored_parameters: int
    stages: list[StagePlan] = field(default_factory=list)
    #: ``paged``: the serving graph (last-token logits, prompts fed ``prefill_chunk`` tokens per
    #: call); ``decode``/``prefill``: a prefill returns every position's logits.
    graph: str = "decode"
    #: Prompt tokens per row and prefill call (paged graphs; None: the whole ``max_seq`` at once).
    prefill_chunk: int | None = None

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)

    @property
    def largest_stage(self) -> StagePlan:
        return max(self.stages, key=lambda s: s.total_bytes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        try:
            stages = [StagePlan(**s) for s in data["stages"]]
            return cls(**{**data, "stages": stages})
        except (KeyError, TypeError) as exc:
            raise DSAUserError(f"the plan JSON is not one dsa-export wrote ({exc}); run 'dsa-export plan --json' again.") from exc

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DSAUserError(f"the plan is not valid JSON ({exc.msg} at line {exc.lineno}).") from exc
        if not isinstance(data, dict):
            raise DSAUserError("the plan JSON is not an object; run 'dsa-export plan --json' again.")
        return cls.from_dict(data)

    def render_table(self) -> str:
        """The stages as an aligned text table followed by a one-line summary."""
        head = ("stage", "layers", "weights", "cache", "activations", "total", "fits")
        rows = [head]
        for s in self.stages:
            extras = "+emb" * s.includes_embedding + "+head" * s.includes_head
            rows.append((str(s.index), s.layers + extras, format_gib(s.weight_bytes), format_gib(s.cache_bytes),
                         format_gib(s.activation_bytes), format_gib(s.total_bytes), "yes" if s.fits else "NO"))
        widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
        lines = ["  ".join(cell.ljust(widths[c]) if c < 2 else cell.rjust(widths[c]) for c, cell in enumerate(r))
                 for r in rows]
        return "\n".join(lines + [self.summary()])

    def summary(self) -> str:
        big = self.largest_stage
        gpus = f" (of {self.gpus} GPUs)" if self.gpus else ""
        ignored = (f"; {format_gib(self.ignored_bytes)} ({self.ignored_parameters / 1e9:.2f}B parameters, "
                   "MTP layer and other keys transformers ignores) left out") if self.ignored_bytes else ""
        return (f"{self.num_stages} stage{'s' * (self.num_stages != 1)}{gpus} of {format_gib(self.gpu_memory_bytes)}: "
                f"largest {format_gib(big.total_bytes)} (stage {big.index}), "
                f"{self.total_parameters / 1e9:.1f}B parameters, {self.weight_precision} weights from "
                f"{self.weights_source}, {self.cache_dtype} cache, activations {self.activation_dtype} at "
                f"batch {self.max_batch} x {self.max_seq} tokens{self._calls()}, reserve "
                f"{format_gib(self.reserve_bytes)}/GPU{ignored}.")

    def _calls(self) -> str:
        if self.graph != "paged":
            return ""
        chunk = min(self.prefill_chunk or self.max_seq, self.max_seq)
        return f" (paged: prefill calls of {chunk} tokens per row, last-token logits)"


def load_config(source) -> tuple[dict, Path | None]:
    """config.json of a checkpoint directory, a config.json path, or a config dict; plus the directory."""
    if isinstance(source, dict):
        return source, None
    if hasattr(source, "config_sha256"):  # an opened HFCheckpoint: validated and read already
        return source.config, source.path
    path = Path(source)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise DSAUserError(f"'{path}' is neither a model directory with config.json nor a config.json file.")
    return read_json_object(file), file.parent


def plan_stages(
    checkpoint,
    *,
    gpu_memory_bytes: int | str,
    stages: str | int = "auto",
    gpus: int | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_seq: int = DEFAULT_MAX_SEQ,
    dtype: str | None = None,
    cache_dtype: str | None = None,
    reserve_bytes: int | str = DEFAULT_RESERVE_BYTES,
    strict: bool = True,
    graph: str = "decode",
    prefill_chunk: int | None = None,
) -> Plan:
    """Split ``checkpoint`` into contiguous stages, one per GPU of ``gpu_memory_bytes``.

    Args:
        checkpoint: a Hugging Face directory (its safetensors headers are read when all shards are
            there), a config.json path, the config as a dict, or an opened
            :class:`~dsa_export.hf.loader.HFCheckpoint` (its config and headers are not read again).
        gpu_memory_bytes: memory of one GPU (bytes, or text such as ``"141GiB"``).
        stages: ``"auto"`` = the fewest stages that fit, balanced; an int = that many stages with
            the smallest possible largest stage.
        gpus: GPUs available; a plan needing more is refused.
        max_batch, max_seq: the optimization profile's maximum batch and sequence length; caches
            hold ``max_seq`` tokens per row and activations are those of a ``max_seq``-token prefill.
        dtype: ``fp32``/``fp16``/``bf16`` as an export with ``--dtype`` writes it; None keeps the
            checkpoint's precision (FP8 with block scales stays FP8).
        cache_dtype: dtype of the decode caches (``fp8``: the paged graph's FP8 pools); None
            follows the activations (bf16 for FP8 and bf16 checkpoints).
        reserve_bytes: fixed per-GPU reserve for the CUDA/TensorRT context and workspaces.
        strict: raise when a requested stage count does not fit; False returns the plan with
            ``fits`` False on the stages that do not.
        graph: the stages' graph. ``paged`` (the serving graph) returns the logits of each row's
            last token only, and its cache pools count :data:`PAGED_POOL_BUFFERS` times;
            ``decode`` and ``prefill`` return every position's.
        prefill_chunk: paged graphs: prompt tokens per row and prefill call (``build
            --prefill-chunk``); activations are those of one such call over ``max_seq`` cached
            tokens. None: the whole ``max_seq`` prompt in one call.

    Raises:
        DSAUserError: the model cannot be split as asked (one sentence naming the fix).
    """
    config, directory = load_config(checkpoint)
    where = f"'{directory / 'config.json'}'" if directory else "the config"
    g = Geometry.from_config(config, where)  # every field checked, the model's size by arithmetic
    opened = hasattr(checkpoint, "config_sha256")
    if directory and not opened:  # an opened checkpoint was checked when it was opened
        check_generation_config(directory, config)
    capacity = parse_size(gpu_memory_bytes, "GPU memory")
    reserve = parse_size(reserve_bytes, "reserve", allow_zero=True)
    if dtype is not None and dtype not in DTYPE_BYTES:
        raise DSAUsageError(f"dtype '{dtype}' is not one of {', '.join(DTYPE_BYTES)} (or None to keep the checkpoint's).")
    if cache_dtype is not None and cache_dtype not in (*DTYPE_BYTES, "fp8"):
        raise DSAUsageError(f"cache dtype '{cache_dtype}' is not one of {', '.join(DTYPE_BYTES)}, fp8.")
    if max_batch < 1 or max_seq < 1:
        raise DSAUsageError("max batch and max sequence length must be at least 1.")
    if gpus is not None and gpus < 1:
        raise DSAUsageError(f"--gpus {gpus} must be at least 1.")
    if graph not in ("prefill", "decode", "paged"):
        raise DSAUsageError(f"graph '{graph}' is not one of prefill, decode, paged.")
    check_prefill_chunk(prefill_chunk, graph)
    if cache_dtype == "fp8" and graph != "paged":
        raise DSAUsageError("FP8 caches (--cache-dtype fp8) are stored in the paged graph's pools; add --graph paged.")
    count = _stage_count(stages, g.layers, gpus)

    shards, missing = ([], []) if opened or not directory else shard_files(directory)
    if opened:
        weights = weights_from_headers(g, {directory / s: h for s, h in checkpoint.weights.headers.items()}, dtype)
    elif shards and not missing:
        weights = weights_from_headers(g, shards, dtype)
    else:
        weights = weights_from_config(g, dtype)
        if missing:
            weights.source = f"config.json ({len(missing)} of the index's shards missing)"
    act_dtype = dtype or ("bf16" if g.fp8 else g.storage_dtype)
    cache_dtype = cache_dtype or act_dtype
    costs = layer_costs(g, weights, batch=max_batch, seq=max_seq, act_bytes=DTYPE_BYTES[act_dtype],
                        cache_bytes=FP8_CACHE if cache_dtype == "fp8" else DTYPE_BYTES[cache_dtype],
                        reserve_bytes=reserve, prefill_tokens=prefill_chunk,
                        logits_rows=max_batch if graph == "paged" else None,
                        cache_buffers=PAGED_POOL_BUFFERS if graph == "paged" else 1)
    table = _cost_table(costs)
    n = g.layers

    if count is None:
        found = fewest_stages(table, n, capacity)
        if found is None:
            raise _no_split_fits(table, capacity, max_batch, max_seq, dtype)
        count, largest, starts = found
        if gpus is not None and count > gpus:
            raise StagesDoNotFit(
                f"the model needs {count} stages of {format_gib(capacity)} at batch {max_batch} x {max_seq} tokens but "
                f"--gpus is {gpus}; add GPUs, lower --max-seq/--max-batch or use GPUs with more memory."
            )
    else:
        largest, starts = split_min_max(table, n, count)
        if largest > capacity and strict:
            found = fewest_stages(table, n, capacity)
            if found is None:
                raise _no_split_fits(table, capacity, max_batch, max_seq, dtype)
            raise StagesDoNotFit(
                f"with {count} stages the largest needs {format_gib(largest)}, more than the {format_gib(capacity)} "
                f"GPU; use --stages {found[0]} (or --stages auto), or lower --max-seq/--max-batch."
            )
    bounds = starts + [n]
    stage_plans = [costs.stage(k, bounds[k], bounds[k + 1], capacity) for k in range(len(starts))]
    return Plan(
        model_type=g.model_type, num_layers=n, weights_source=weights.source,
        weight_precision=dtype or ("fp8" if g.fp8 else g.storage_dtype), activation_dtype=act_dtype,
        cache_dtype=cache_dtype, max_batch=max_batch, max_seq=max_seq, gpu_memory_bytes=capacity, gpus=gpus,
        reserve_bytes=reserve, requested_stages=stages if stages == "auto" else count,
        total_parameters=sum(weights.parameters) + weights.embedding_parameters + weights.head_parameters,
        ignored_bytes=weights.ignored_bytes, ignored_parameters=weights.ignored_parameters, stages=stage_plans,
        graph=graph, prefill_chunk=prefill_chunk,
    )


def _no_split_fits(table: list[list[int]], capacity: int, batch: int, seq: int, dtype: str | None) -> StagesDoNotFit:
    """The error for a model no split fits, naming the stage that stays too big in the best split of all."""
    n = len(table)
    largest, starts = best_split_of_any_count(table, n)
    bounds = [*starts, n]
    worst = max(range(len(starts)), key=lambda k: table[bounds[k]][bounds[k + 1]])
    a, b = bounds[worst], bounds[worst + 1]
    what = f"layer {a}" if b == a + 1 else f"layers {a}:{b}"
    extra = (" with the embedding" if a == 0 else "") + (" with the final norm and lm_head" if b == n else "")
    return StagesDoNotFit(
        f"no split fits the {format_gib(capacity)} GPU: {what}{extra} "
        f"{'alone needs' if b == a + 1 else 'need even in the best split'} {format_gib(largest)} (weights, cache, "
        f"activations at batch {batch} x {seq} tokens and reserve); lower --max-seq or --max-batch"
        f"{', keep the checkpoint precision (--dtype auto)' if dtype else ''}, or use GPUs with more memory."
    )


def _stage_count(stages: str | int, layers: int, gpus: int | None) -> int | None:
    """None for ``auto``, else the validated count."""
    if stages == "auto":
        return None
    try:
        count = int(stages)
    except (TypeError, ValueError):
        raise DSAUsageError(f"--stages '{stages}' is neither 'auto' nor a number of stages.") from None
    if count < 1:
        raise DSAUsageError(f"--stages {count} must be at least 1 (or 'auto').")
    if count > layers:
        raise DSAUserError(f"--stages {count} is more than the model's {layers} layers; use at most {layers} stages.")
    if gpus is not None and count > gpus:
        raise DSAUsageError(f"--stages {count} needs {count} GPUs but --gpus is {gpus}; raise --gpus or lower --stages.")
    return count


__all__ = ["DEFAULT_MAX_SEQ", "DEFAULT_RESERVE_BYTES", "Geometry", "LayerCosts", "Plan", "StagePlan", "StagesDoNotFit",
           "fewest_stages", "min_max_splits", "parse_size", "plan_stages", "split_min_max"]
