"""Run a model cut into pipeline stages: :class:`PipelineSession`.

A pipeline folder holds ``pipeline.json`` (:class:`dsa_export.stages.record.Pipeline`): the stages in
order, what each hands to the next (``links``: ``hidden_states_out`` -> ``hidden_states``, GLM-5's
``topk_indices`` -> ``prev_topk_indices``) and, in a stage build, each stage's build folder and GPU.
Every stage is opened like one model (:func:`dsa_export.runtime.load`): its engine on its own GPU
(``cuda:{device}``) where the engine gate accepts it, else its ONNX Runtime artifact; the stages of
an export folder run their .onnx files on ONNX Runtime's CPU provider.

Two ways to call it:

- :meth:`PipelineSession.run` is the :class:`~dsa_export.runtime.session.Session` interface of one
  engine: the caller passes every input (caches included) and gets the last stage's outputs plus
  every stage's ``present_*`` caches.
- :meth:`PipelineSession.forward` keeps the decode caches inside the stages, per *slot* (one
  sequence batch being generated): each call passes only ``input_ids`` and ``attention_mask``, each
  stage feeds its ``past_*`` from what it returned for that slot last time, and only the last
  stage's outputs come back. This is what generation uses; the caches never leave the stage (on
  Ray they stay on the actor's node).

``micro_batches=n`` splits the batch into ``n`` parts that flow through the stages one after the
other, each stage working on its own thread (or Ray actor): stage ``i`` computes part ``m + 1``
while stage ``i + 1`` computes part ``m``, so ``n`` parts over ``k`` stages take about
``(n + k - 1) / (n * k)`` of the serial time when the stages are balanced.

The stage runners (:class:`LocalStage`) are the same in this process and inside a Ray actor
(:mod:`dsa_export.stages.ray_actors`); only the handle that schedules them differs. A pipeline of
one stage (a single file or build: :meth:`PipelineSession.of_session`) runs it in the caller's
thread (:class:`InlineStage`): there is nothing to overlap.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.manifest import TensorSpec, check_feeds
from dsa_export.runtime.paged import (
    PAST,
    PRESENT,
    PageAllocator,
    StagePools,
    is_paged,
    page_size,
    pool_inputs,
)
from dsa_export.runtime.session import RUNTIME_CHOICES, Session
from dsa_export.stages.record import Pipeline, StageFiles, read_pipeline


class StageLostError(DSAUserError):
    """A stage is gone for good (its Ray actor died): the pipeline cannot run another call and
    must be opened again."""


def present_name(cache: str) -> str:
    """``past_latent_3`` -> ``present_latent_3``."""
    return PRESENT + cache[len(PAST):]


@dataclass(frozen=True)
class InLink:
    """Input ``input`` of a stage comes from output ``output`` of the ``source``-th upstream stage
    (counted among the stages this one depends on, in pipeline order)."""

    source: int
    output: str
    input: str


def stage_inputs(pipeline: Pipeline) -> list[tuple[list[int], list[InLink]]]:
    """For each stage: (indices of the stages it takes tensors from, its in-links)."""
    wiring = []
    for stage in pipeline.stages:
        links = [link for link in pipeline.links if link.target == stage.index]
        sources = sorted({link.source for link in links})
        wiring.append((sources, [InLink(sources.index(link.source), link.output, link.input) for link in links]))
    return wiring


class LocalStage:
    """One stage in this process: its session and the decode caches of every slot it serves.

    ``run(feeds, slot, *upstream)``: ``feeds`` are the caller's tensors (those this stage takes are
    picked), ``upstream`` the outputs of the stages named by the in-links. With a ``slot``, the
    stage's ``past_*`` inputs come from its own store (empty at the slot's first call) and its
    ``present_*`` outputs go back there instead of being returned; an engine session keeps them on
    its GPU (``run_resident``), so a decode step moves only the hidden states. A stage of a paged
    graph keeps one set of pools for every slot (:class:`~dsa_export.runtime.paged.StagePools`):
    the caller's block table says which pages a row owns.
    """

    def __init__(self, index: int, session: Session, links: Sequence[InLink], device: str):
        self.index = index
        self.session = session
        self.links = list(links)
        self.device = device
        self.names = [spec.name for spec in session.inputs]
        self.pools = StagePools(session, pool_inputs(session.inputs)) if is_paged(self.names) else None
        self.cache_specs = {} if self.pools is not None else {
            spec.name: spec for spec in session.inputs
            if spec.name.startswith(PAST) and present_name(spec.name) in {o.name for o in session.outputs}}
        self.caches: dict[str, dict[str, np.ndarray]] = {}
        self._lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        return {"stage": self.index, "runtime": self.session.kind, "device": self.device,
                "notes": list(self.session.notes), "sequence_limit": _sequence_limit(self.session),
                "pages_limit": self.pools.limit if self.pools is not None else None,
                "batch_limit": _dim_limit(self.session, "batch"), "call_limit": _dim_limit(self.session, "sequence")}

    def run(self, feeds: dict[str, np.ndarray], slot: str | None, *upstream: dict[str, np.ndarray]
            ) -> dict[str, np.ndarray]:
        mine = {name: feeds[name] for name in self.names if name in feeds}
        for link in self.links:
            mine[link.input] = upstream[link.source][link.output]
        if slot is None:
            return self.session.run(mine)
        if self.pools is not None:
            return self.pools.run(mine)
        with self._lock:
            past = self.caches.get(slot)
        if past is None:
            past = self._empty_caches(mine)
        resident = getattr(self.session, "run_resident", None)
        if resident is not None:  # an engine: the caches stay on its GPU between calls
            out = resident({**mine, **past}, {present_name(name) for name in self.cache_specs})
        else:
            out = self.session.run({**mine, **past})
        with self._lock:
            self.caches[slot] = {name: out.pop(present_name(name)) for name in self.cache_specs}
        return out

    def _empty_caches(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch = next(iter(feeds.values())).shape[0] if feeds else 1
        empty = {}
        for name, spec in self.cache_specs.items():
            width = spec.shape[2] if len(spec.shape) == 3 else None
            if not isinstance(width, int):
                raise DSAUserError(f"stage {self.index}'s cache input '{name}' has no static width; export the "
                                   "stages again with --graph decode.")
            empty[name] = np.zeros((batch, 0, width), dtype=np.float32 if spec.dtype == "bfloat16" else spec.dtype)
        return empty

    def drop(self, slot: str | None = None) -> None:
        """Forget one slot's caches, or every slot's (a paged stage: its pools)."""
        with self._lock:
            if slot is None:
                self.caches.clear()
                if self.pools is not None:
                    self.pools.clear()
            else:
                self.caches.pop(slot, None)

    def close(self) -> None:
        self.drop()
        self.session.close()


class StageHandle(Protocol):
    """How the pipeline schedules one stage: here on a thread, on Ray in an actor."""

    index: int

    def submit(self, feeds: Any, slot: str | None, upstream: list[Any]) -> Any: ...

    def result(self, pending: Any, timeout: float | None) -> dict[str, np.ndarray]: ...

    def drop(self, slot: str | None) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class ThreadStage:
    """A :class:`LocalStage` behind one worker thread: calls to the stage run in submission order,
    and stages run concurrently (a stage waits for its upstream results on its own thread)."""

    def __init__(self, stage: LocalStage):
        self.index = stage.index
        self.stage = stage
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"dsa-stage-{stage.index}")

    def submit(self, feeds: Any, slot: str | None, upstream: list[Any]) -> concurrent.futures.Future:
        def call() -> dict[str, np.ndarray]:
            return self.stage.run(feeds, slot, *(future.result() for future in upstream))

        return self.pool.submit(call)

    def result(self, pending: concurrent.futures.Future, timeout: float | None) -> dict[str, np.ndarray]:
        try:
            return pending.result(timeout)
        except concurrent.futures.TimeoutError:
            raise DSAUserError(f"stage {self.index} gave no result within {timeout:g} s; raise the timeout or "
                               "check the stage's device.") from None

    def drop(self, slot: str | None) -> None:
        self.pool.submit(self.stage.drop, slot).result()

    def describe(self) -> dict[str, Any]:
        return self.stage.describe()

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.stage.close()


class InlineStage:
    """The one stage of a one-stage pipeline, run in the caller's thread: nothing can overlap it,
    and a hop to a worker thread and back costs a decode step ~0.2 ms (measured: 2-core host, a
    hidden-512 model's 6 ms step). Calls come from one thread (generate's loop, the server's
    scheduler), as for any :class:`PipelineSession`; a ``timeout`` does not apply (the call
    returns when the stage does)."""

    def __init__(self, stage: LocalStage):
        self.index = stage.index
        self.stage = stage

    def submit(self, feeds: Any, slot: str | None, upstream: list[Any]) -> concurrent.futures.Future:
        done: concurrent.futures.Future = concurrent.futures.Future()
        try:
            done.set_result(self.stage.run(feeds, slot, *(future.result() for future in upstream)))
        except Exception as exc:  # noqa: BLE001 - raised where the caller collects the result, as on a thread
            done.set_exception(exc)  # (an interrupt is not held back: it stops the caller at once)
        return done

    def result(self, pending: concurrent.futures.Future, timeout: float | None) -> dict[str, np.ndarray]:
        return pending.result()

    def drop(self, slot: str | None) -> None:
        self.stage.drop(slot)

    def describe(self) -> dict[str, Any]:
        return self.stage.describe()

    def close(self) -> None:
        self.stage.close()


def split_batch(feeds: dict[str, np.ndarray], parts: int) -> list[dict[str, np.ndarray]]:
    """``parts`` feeds along the batch axis (the first axis of every input)."""
    batches = {np.shape(value)[0] for value in feeds.values()}
    if len(batches) != 1:
        raise DSAUserError(f"the inputs disagree on the batch size ({sorted(batches)}); give every input the same "
                           "first dimension.")
    (batch,) = batches
    if not 1 <= parts <= batch:
        raise DSAUsageError(f"micro-batches must be between 1 and the batch size {batch}; got {parts}.")
    if parts == 1:  # a decode step: nothing to cut
        return [feeds]
    bounds = np.linspace(0, batch, parts + 1).round().astype(int)
    return [{name: value[lo:hi] for name, value in feeds.items()} for lo, hi in zip(bounds, bounds[1:])]


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:  # nothing to join (and no copy of the logits)
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts], axis=0) for name in parts[0]}


class PipelineSession(Session):
    """The stages of a pipeline folder run in order, with the :class:`Session` interface of one
    model (:meth:`run`) and stage-held caches for generation (:meth:`forward`). Use :meth:`open`."""

    def __init__(self, pipeline: Pipeline, handles: list[StageHandle], kind: str, *, timeout: float | None = None,
                 folder: Path | None = None):
        self.pipeline = pipeline
        self.handles = handles
        self.timeout = timeout
        self.folder = folder
        self.wiring = stage_inputs(pipeline)
        consumed = {(link.target, link.input) for link in pipeline.links}
        produced = {(link.source, link.output) for link in pipeline.links}
        inputs: dict[str, TensorSpec] = {}
        outputs: list[TensorSpec] = []
        for stage in pipeline.stages:
            for spec in stage.inputs:
                if (stage.index, spec.name) not in consumed:
                    inputs.setdefault(spec.name, spec)
            last = stage.index == pipeline.stages[-1].index
            outputs += [spec for spec in stage.outputs if spec.name.startswith(PRESENT)
                        or (last and (stage.index, spec.name) not in produced)]
        notes = []
        for described in (handle.describe() for handle in handles):
            notes.append(f"stage {described['stage']}: {described['runtime']} on {described['device']}")
            notes += [f"stage {described['stage']}: {note}" for note in described["notes"]]
        super().__init__(kind=kind, inputs=list(inputs.values()), outputs=outputs, notes=notes)
        self.step_inputs = [spec for spec in self.inputs if not spec.name.startswith(PAST)]
        self._slots = 0
        #: A paged pipeline's pages (one allocator: every stage uses the same page ids), capped by
        #: the smallest stage's profile.
        limits = [d["pages_limit"] for d in self.describe() if d.get("pages_limit") is not None]
        self.pages = PageAllocator(page_size(self.inputs), min(limits) if limits else None) if self.paged else None

    @property
    def paged(self) -> bool:
        return is_paged(spec.name for spec in self.inputs)

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, folder: str | Path, runtime: str = "auto", *, devices: Sequence[int] | None = None,
             verify: bool = True, threads: int | None = None, timeout: float | None = None,
             pipeline: Pipeline | None = None, **_options: Any) -> PipelineSession:
        """Open every stage of ``folder`` (a stage export or a stage build) in this process.

        ``devices``: GPU per stage, overriding the build's assignment. ``threads``: ONNX Runtime
        threads per stage (default: its own choice). ``pipeline``: the folder's ``pipeline.json``
        when the caller has read it already (it is not read again).
        """
        from dsa_export.compat.engine_gate import GateProbe

        folder = Path(folder)
        pipeline = pipeline if pipeline is not None else read_pipeline(folder)
        wiring = stage_inputs(pipeline)
        handles: list[StageHandle] = []
        probe = GateProbe()  # the environment probed once for every stage's engine, when one is opened
        try:
            for stage, (_sources, links) in zip(pipeline.stages, wiring):
                device = _device_of(stage, devices)
                session = open_stage(folder, stage, runtime, device, verify=verify, threads=threads, probe=probe)
                local = LocalStage(stage.index, session, links, _where(session))
                handles.append(InlineStage(local) if len(pipeline.stages) == 1 else ThreadStage(local))
        except BaseException:
            for handle in handles:
                handle.close()
            raise
        return cls(pipeline, handles, f"pipeline of {len(handles)} stages ({folder})", timeout=timeout, folder=folder)

    @classmethod
    def of_session(cls, session: Session, name: str = "model") -> PipelineSession:
        """One model (a decode graph or its build) as a pipeline of one stage, for generation."""
        stage = StageFiles(index=0, layers=(0, 0), embed=True, head=True, onnx=name, data=None, sha256={}, sizes={},
                           inputs=list(session.inputs), outputs=list(session.outputs), weight_bytes=0,
                           checkpoint_bytes=0, key="", plan={})
        pipeline = Pipeline(model={}, model_type="", num_layers=0, graph="decode", settings={}, plan={},
                            stages=[stage], links=[], tool_version="")
        return cls(pipeline, [InlineStage(LocalStage(0, session, [], _where(session)))], session.kind)

    # -- running ---------------------------------------------------------------------------------

    @staticmethod
    def share(feeds: dict[str, np.ndarray]) -> Any:
        """How one step's inputs reach every stage (Ray: one object-store copy)."""
        return feeds

    def _submit(self, feeds: dict[str, np.ndarray], slot: str | None) -> list[Any]:
        feeds = self.share(feeds)
        pending: list[Any] = []
        for handle, (sources, _links) in zip(self.handles, self.wiring):
            pending.append(handle.submit(feeds, slot, [pending[i] for i in sources]))
        return pending

    def _flow(self, parts: list[dict[str, np.ndarray]], slots: list[str | None], every_stage: bool
              ) -> list[dict[str, np.ndarray]]:
        """Submit every part to every stage (parts overlap across stages), then collect: the last
        stage's outputs, plus every stage's ``present_*`` when ``every_stage``."""
        flows = [self._submit(part, slot) for part, slot in zip(parts, slots)]
        results = []
        for pending in flows:
            if every_stage:
                merged: dict[str, np.ndarray] = {}
                for handle, item in zip(self.handles, pending):
                    out = handle.result(item, self.timeout)
                    merged.update({k: v for k, v in out.items() if k.startswith(PRESENT) or handle is self.handles[-1]})
                results.append(merged)
            else:
                results.append(self.handles[-1].result(pending[-1], self.timeout))
        return results

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run_microbatches(feeds, 1, checked=True)

    def run_microbatches(self, feeds: dict[str, np.ndarray], micro_batches: int, *, checked: bool = False
                         ) -> dict[str, np.ndarray]:
        """:meth:`run` with the batch split into ``micro_batches`` parts that overlap across stages."""
        if not checked:
            feeds = self._checked(feeds, self.inputs)
        wanted = {spec.name for spec in self.outputs}
        results = self._flow(split_batch(feeds, micro_batches), [None] * micro_batches, every_stage=True)
        return {name: value for name, value in _concat(results).items() if name in wanted}

    def new_slot(self) -> str:
        """A name for the caches of one generation (see :meth:`forward`)."""
        self._slots += 1
        return f"slot{self._slots}"

    def forward(self, feeds: dict[str, np.ndarray], slot: str, micro_batches: int = 1) -> dict[str, np.ndarray]:
        """One prefill or decode step of the sequences of ``slot``: ``feeds`` has the step's inputs
        (``input_ids``, ``attention_mask``; a paged graph: ``input_ids, query_start,
        query_lengths, block_table`` with pages from :attr:`pages`), the stages keep the caches.
        With ``micro_batches``, part ``m`` of the batch keeps its caches under ``{slot}/{m}``: call
        with the same count for every step of a slot."""
        feeds = self._checked(feeds, self.step_inputs)
        parts = split_batch(feeds, micro_batches)
        slots: list[str | None] = [slot if micro_batches == 1 else f"{slot}/{m}" for m in range(micro_batches)]
        return _concat(self._flow(parts, slots, every_stage=False))

    def forward_calls(self, calls: list[dict[str, np.ndarray]], slot: str) -> list[dict[str, np.ndarray]]:
        """Several calls of a paged pipeline (each a :meth:`forward` feed) submitted at once: every
        stage takes them in order, so stage ``i`` runs call ``c + 1`` while stage ``i + 1`` runs
        call ``c``. The calls must touch different pages (a server's decode rows and prefill
        chunks do). Returns each call's outputs, in order."""
        checked = [self._checked(feeds, self.step_inputs) for feeds in calls]
        return self._flow(checked, [slot] * len(checked), every_stage=False)

    def release(self, slot: str, micro_batches: int = 1) -> None:
        """Drop the caches of ``slot`` in every stage."""
        for handle in self.handles:
            for name in ([slot] if micro_batches == 1 else [f"{slot}/{m}" for m in range(micro_batches)]):
                handle.drop(name)

    def _checked(self, feeds: dict[str, np.ndarray], specs: list[TensorSpec]) -> dict[str, np.ndarray]:
        names = [spec.name for spec in specs]
        unknown = sorted(set(feeds) - set(names))
        missing = [name for name in names if name not in feeds]
        if unknown or missing:
            problem = f"unknown input(s) {unknown}" if unknown else f"missing input(s) {missing}"
            raise DSAUserError(f"{problem}; this pipeline takes {', '.join(names)}.")
        return check_feeds(specs, feeds, "the pipeline")

    def check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Each stage checks its own inputs against its profile when it runs."""

    def example_inputs(self, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
        """Random inputs of a prefill call (``past_sequence`` 0 unless ``dims`` says otherwise)."""
        from dsa_export.manifest import make_inputs

        unknown = sorted(set(dims or {}) - self.dim_names())
        if unknown:
            raise DSAUsageError(f"--dims names {', '.join(unknown)}, which no input of this pipeline has (its dims: "
                                f"{', '.join(sorted(self.dim_names()))}).")
        sizes = {"batch": 1, "sequence": 8, "past_sequence": 0, **(dims or {})}
        sizes.setdefault("total_sequence", sizes["sequence"] + sizes["past_sequence"])
        return make_inputs(self.inputs, sizes, seed)

    def describe(self) -> list[dict[str, Any]]:
        return [handle.describe() for handle in self.handles]

    def sequence_limit(self) -> int | None:
        """The most tokens a sequence may hold in every stage (the smallest stage limit)."""
        return self._smallest("sequence_limit")

    def call_limit(self) -> int | None:
        """The most tokens per row one call of every stage takes (the smallest of the stages'
        prefill profiles' ``sequence`` max: ``build --prefill-chunk``); None when nothing bounds it.
        Longer prompts are fed in calls of at most this many tokens."""
        return self._smallest("call_limit")

    def _smallest(self, key: str) -> int | None:
        limits = [d.get(key) for d in self.describe() if d.get(key) is not None]
        return min(limits) if limits else None

    def close(self) -> None:
        for handle in self.handles:
            handle.close()


def _sequence_limit(session: Session) -> int | None:
    limit = getattr(session, "sequence_limit", None)
    return limit() if callable(limit) else None


def _dim_limit(session: Session, name: str) -> int | None:
    limit = getattr(session, "dim_limit", None)
    return limit(name) if callable(limit) else None


def _where(session: Session) -> str:
    device = getattr(session, "device", None)  # an engine session's torch device
    return str(device) if device is not None else "host"


def _device_of(stage: StageFiles, devices: Sequence[int] | None) -> int:
    if devices is not None:
        if stage.index >= len(devices):
            raise DSAUsageError(f"--devices names {len(devices)} GPU(s) for a pipeline of more stages; give one per "
                                "stage.")
        return int(devices[stage.index])
    return stage.device if stage.device is not None else 0


def open_stage(folder: Path, stage: StageFiles, runtime: str, device: int, *, verify: bool = True,
               threads: int | None = None, probe=None) -> Session:
    """The session of one stage: its build folder (engine on ``cuda:{device}`` or the ONNX Runtime
    artifact, as ``runtime`` says) or, in a stage export, its .onnx on ONNX Runtime's CPU provider.
    ``probe``: the :class:`~dsa_export.compat.engine_gate.GateProbe` the stages of one session share."""
    from dsa_export.runtime.artifact import open_artifact

    if runtime not in RUNTIME_CHOICES:
        raise DSAUsageError(f"runtime {runtime!r} is not one of {', '.join(RUNTIME_CHOICES)}.")
    what = f"stage {stage.index} (layers {stage.layers[0]}:{stage.layers[1]})"
    options = {"threads": threads} if threads is not None else {}
    if stage.build is None:
        if runtime == "engine":
            raise DSAUsageError(f"{folder} holds exported stages, not engines; build them with `dsa-export build "
                                f"{folder} -o DIR`, or use --runtime onnxruntime.")
        path = folder / stage.onnx
        if not path.is_file():
            raise DSAUserError(f"{what}: {path} is missing; export the stages again.")
        stage.verify(folder, enabled=verify)
        return open_artifact(path, "onnxruntime", verify=False, **options)
    path = folder / stage.build
    if not path.is_dir():
        raise DSAUserError(f"{what}: its build folder {path} is missing; build the stages again.")
    if runtime != "onnxruntime":
        _check_device(what, device, required=runtime == "engine")
    try:
        return open_artifact(path, runtime, device, verify=verify, probe=probe, **options)
    except DSAUserError as exc:
        raise DSAUserError(f"{what}: {exc}") from exc


def _check_device(what: str, device: int, *, required: bool) -> None:
    """A stage assigned to a GPU this machine lacks is refused when it must run an engine; with
    ``--runtime auto`` the engine gate notes it and the stage runs its ONNX Runtime artifact."""
    if not required:
        return
    try:
        import torch
    except ImportError:
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device >= count:
        raise DSAUserError(f"{what} runs on GPU {device} but this machine has {count} GPU(s); assign devices that "
                           "exist (--devices) or use --runtime onnxruntime.")


def is_pipeline(path: str | Path) -> bool:
    from dsa_export.stages.record import PIPELINE_NAME

    path = Path(path)
    return (path / PIPELINE_NAME).is_file() if path.is_dir() else path.name == PIPELINE_NAME


__all__ = ["InlineStage", "LocalStage", "PipelineSession", "StageLostError", "ThreadStage", "is_pipeline", "open_stage",
           "split_batch"]
