"""Accuracy of a quantized stage build against the float stage export it was built from, end to end.

Each stage's own report (:mod:`dsa_export.quantize.report`) feeds that stage with *float* inputs,
so it cannot see errors that grow from stage to stage. This report runs both pipelines whole, each
stage fed by the previous stage of the same pipeline (the quantized pipeline chains quantized
stages), on held-out token ids:

* **final logits** of the prefill call: cosine and SQNR over all held-out prompts together (the
  per-stage report's measures, :func:`~dsa_export.quantize.report.cosine` and
  :func:`~dsa_export.quantize.report.sqnr_db`, per prompt and for all of them as one array);
* **greedy agreement** over ``N`` tokens: the float pipeline decodes ``N`` tokens greedily; that
  token path is then forced through the quantized pipeline, and a position agrees when the
  quantized argmax is the float token. Both runs go through :func:`dsa_export.runtime.generate.generate`
  over :class:`~dsa_export.stages.session.PipelineSession` (the caches and pages of ``generate``
  itself). Up to the first disagreement the forced path is the path the quantized pipeline would
  choose itself, so the first disagreement is where free-running greedy decoding first diverges;
* **top-k overlap** per DSA layer (every ``DSAIndexerTopK`` and ``DSAIndexerTopKPaged`` node) and
  **router agreement** per MoE layer on the prefill call, as the per-stage report defines them, the
  selections exposed as extra outputs of in-memory copies of each stage graph (the weights are
  read from beside the stage's file, :func:`dsa_export.runtime.onnxrt.session`).

Memory: the prefill measures open one stage at a time and run one sample at a time; what a stage
hands on (and the float logits and selections, until the quantized stage is compared) is spilled
to a scratch folder, so neither all samples' logits nor two stages' weights are held at once.
Greedy decoding needs a whole pipeline open; the float one is closed before the quantized one
opens.

:func:`stage_build_report` is the build's use of it (``build --stages N --precision int8|fp8``):
held-out samples are the calibration files every stage's calibration held out, and the result is
``OUT/calibration/pipeline_report.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from dsa_export.errors import DSAUserError
from dsa_export.manifest import read_manifest
from dsa_export.quantize.report import (
    Thresholds,
    cosine,
    experts_nodes,
    indexer_nodes,
    router_agreement,
    selection_overlap,
    sqnr_db,
    with_indexer_outputs,
)
from dsa_export.stages.record import Pipeline, StageFiles, read_pipeline

log = logging.getLogger(__name__)

#: Where a stage build writes the report (under ``OUT/calibration/``).
REPORT_NAME = "pipeline_report.json"
#: Greedy tokens a stage build decodes per held-out sample.
DEFAULT_TOKENS = 16
#: Pass mark of greedy agreement. One flipped argmax changes every later token of free-running
#: decoding, so agreement is measured teacher-forced (every position on the float path); 0.9
#: allows the rare position where the float model's two best tokens are nearly tied (logits within
#: the quantization noise that cosine >= 0.99 still permits) and fails a pipeline whose argmax
#: moves on one token in ten or more.
GREEDY_AGREEMENT = 0.9
#: Failed metrics named in the build's one-sentence error before "and N more".
_NAMED_FAILURES = 3


@dataclass(frozen=True)
class PipelineThresholds:
    """Pass marks of the whole-pipeline report: the per-stage report's (:class:`Thresholds`) plus
    greedy agreement."""

    cosine: float = 0.99
    sqnr_db: float = 15.0
    topk_overlap: float = 0.95
    router_agreement: float = 0.9
    greedy_agreement: float = GREEDY_AGREEMENT

    @classmethod
    def from_stages(cls, stages: Sequence[Thresholds], greedy_agreement: float | None = None) -> PipelineThresholds:
        """The marks of the recipes the stages were calibrated with: the logits' from the last
        stage's (the stage that makes them), top-k overlap and router agreement the strictest of
        any stage (every stage of one model uses one recipe, so they are the same in practice)."""
        if not stages:
            return cls(greedy_agreement=GREEDY_AGREEMENT if greedy_agreement is None else greedy_agreement)
        return cls(cosine=stages[-1].cosine, sqnr_db=stages[-1].sqnr_db,
                   topk_overlap=max(t.topk_overlap for t in stages),
                   router_agreement=max(t.router_agreement for t in stages),
                   greedy_agreement=GREEDY_AGREEMENT if greedy_agreement is None else greedy_agreement)


@dataclass
class SampleLogits:
    input: str
    cosine: float
    sqnr_db: float


@dataclass
class LogitsAccuracy:
    """The last stage's ``logits`` of the prefill call (a decode graph: every prompt position; a
    paged graph: the last one), all held-out prompts as one array."""

    cosine: float
    sqnr_db: float
    max_abs: float
    samples: list[SampleLogits]
    passed: bool


@dataclass
class GreedySample:
    input: str
    rows: int
    tokens: int  # greedy tokens compared per row
    matches: int  # positions (rows x tokens) whose quantized argmax is the float token
    agreement: float
    first_divergence: list[int | None]  # per row: first position that differs (None: none within tokens)


@dataclass
class GreedyAgreement:
    tokens: int  # asked for per row
    positions: int  # compared in all
    matches: int
    agreement: float
    first_divergence: int | None  # earliest over every row
    samples: list[GreedySample]
    passed: bool


@dataclass
class LayerTopk:
    layer: int  # DSA layer (indexer node) of the pipeline, counted over the stages in order
    stage: int
    node: str
    overlap: float  # mean over query rows of |selected_q & selected_float| / |selected_float|
    worst_row: float
    rows: int
    passed: bool


@dataclass
class LayerRouter:
    layer: int  # MoE layer (routed-experts node) of the pipeline, counted over the stages in order
    stage: int
    node: str
    agreement: float  # share of token rows whose selected expert set is the float pipeline's
    overlap: float
    rows: int
    passed: bool


@dataclass
class PipelineReport:
    """What :func:`pipeline_report` measured; ``data_digest`` and ``build_keys`` say which stage
    build and data it belongs to (a resumed build reuses a report whose keys still match)."""

    float_pipeline: str
    quantized_pipeline: str
    graph: str
    eval_inputs: list[str]
    thresholds: PipelineThresholds
    logits: LogitsAccuracy
    greedy: GreedyAgreement
    topk: list[LayerTopk] = field(default_factory=list)
    router: list[LayerRouter] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data_digest: str | None = None
    build_keys: list[str | None] = field(default_factory=list)
    passed: bool = False

    def judge(self) -> PipelineReport:
        """Set every ``passed`` from the measures and :attr:`thresholds`."""
        t = self.thresholds
        self.logits.passed = self.logits.cosine >= t.cosine and self.logits.sqnr_db >= t.sqnr_db
        self.greedy.passed = self.greedy.agreement >= t.greedy_agreement
        for k in self.topk:
            k.passed = k.overlap >= t.topk_overlap
        for r in self.router:
            r.passed = r.agreement >= t.router_agreement
        self.passed = (self.logits.passed and self.greedy.passed and all(k.passed for k in self.topk)
                       and all(r.passed for r in self.router))
        return self

    def failures(self) -> list[str]:
        """Each failed metric, as ``name value < mark``."""
        t = self.thresholds
        out = []
        if self.logits.cosine < t.cosine:
            out.append(f"logit cosine {self.logits.cosine:.4f} < {t.cosine:g}")
        if self.logits.sqnr_db < t.sqnr_db:
            out.append(f"logit SQNR {self.logits.sqnr_db:.2f} dB < {t.sqnr_db:g} dB")
        if not self.greedy.passed:
            out.append(f"greedy agreement {self.greedy.agreement:.4f} < {t.greedy_agreement:g}")
        out += [f"top-k overlap of DSA layer {k.layer} (stage {k.stage}) {k.overlap:.4f} < {t.topk_overlap:g}"
                for k in self.topk if not k.passed]
        out += [f"router agreement of MoE layer {r.layer} (stage {r.stage}) {r.agreement:.4f} < "
                f"{t.router_agreement:g}" for r in self.router if not r.passed]
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=float)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PipelineReport:
        """The report :meth:`to_dict` wrote (KeyError / TypeError on another layout)."""
        greedy = dict(data["greedy"])
        greedy["samples"] = [GreedySample(**s) for s in greedy["samples"]]
        logits = dict(data["logits"])
        logits["samples"] = [SampleLogits(**s) for s in logits["samples"]]
        return cls(float_pipeline=data["float_pipeline"], quantized_pipeline=data["quantized_pipeline"],
                   graph=data["graph"], eval_inputs=list(data["eval_inputs"]),
                   thresholds=PipelineThresholds(**data["thresholds"]), logits=LogitsAccuracy(**logits),
                   greedy=GreedyAgreement(**greedy), topk=[LayerTopk(**k) for k in data["topk"]],
                   router=[LayerRouter(**r) for r in data["router"]], notes=list(data["notes"]),
                   data_digest=data["data_digest"], build_keys=list(data["build_keys"]), passed=data["passed"])

    def table(self) -> str:
        """The report as text, in the per-stage report's layout."""
        t, g, lg = self.thresholds, self.greedy, self.logits

        def verdict(ok: bool) -> str:
            return "PASS" if ok else "FAIL"

        rows = sum(sample.rows for sample in g.samples)
        steps = max((sample.tokens for sample in g.samples), default=g.tokens)
        greedy = f"greedy agreement ({rows} rows x {steps} tokens)"
        title = (f"Accuracy of the quantized pipeline ({self.quantized_pipeline}) vs the float stages "
                 f"({self.float_pipeline}) on {len(self.eval_inputs)} held-out inputs, each stage fed by the stage "
                 "before it")
        lines = [
            title,
            f"{'measure':<40} {'value':>10} {'pass mark':>10}  result",
            f"{'logits cosine (prefill)':<40} {lg.cosine:>10.5f} {f'>= {t.cosine:g}':>10}  {verdict(lg.cosine >= t.cosine)}",
            f"{'logits SQNR dB (prefill)':<40} {lg.sqnr_db:>10.2f} {f'>= {t.sqnr_db:g}':>10}  {verdict(lg.sqnr_db >= t.sqnr_db)}",
            f"{greedy:<40} {g.agreement:>10.4f} {f'>= {t.greedy_agreement:g}':>10}  {verdict(g.passed)}",
        ]
        if g.first_divergence is None:
            lines.append(f"  free-running greedy decoding follows the float tokens for all {steps} tokens of every row")
        else:
            where = next(f"{sample.input} row {row}" for sample in g.samples
                         for row, first in enumerate(sample.first_divergence) if first == g.first_divergence)
            lines.append(f"  free-running greedy decoding first leaves the float tokens at token {g.first_divergence} "
                         f"({where})")
        if self.topk:
            lines.append(f"{'DSA layer (stage, indexer node)':<42} {'top-k overlap':>13} {'worst row':>10} "
                         f"{'rows':>6}  result")
            for k in self.topk:
                label = f"{k.layer} (stage {k.stage}, {k.node})"
                lines.append(f"{label:<42} {k.overlap:>13.4f} {k.worst_row:>10.4f} {k.rows:>6}  {verdict(k.passed)}")
        if self.router:
            lines.append(f"{'MoE layer (stage, experts node)':<42} {'router agreement':>16} {'overlap':>8} "
                         f"{'rows':>6}  result")
            for r in self.router:
                label = f"{r.layer} (stage {r.stage}, {r.node})"
                lines.append(f"{label:<42} {r.agreement:>16.4f} {r.overlap:>8.4f} {r.rows:>6}  {verdict(r.passed)}")
        marks = (f"logits cosine >= {t.cosine:g}, SQNR >= {t.sqnr_db:g} dB, greedy agreement >= "
                 f"{t.greedy_agreement:g}")
        marks += f", top-k overlap >= {t.topk_overlap:g}" if self.topk else " (no indexer nodes: no top-k overlap)"
        if self.router:
            marks += f", router agreement >= {t.router_agreement:g}"
        lines += [f"note: {note}" for note in self.notes]
        lines.append(f"{'PASSED' if self.passed else 'FAILED'}: {marks}")
        return "\n".join(lines)


# -- prefill measures: one stage session at a time ------------------------------------------------

def _stage_graph(folder: Path, stage: StageFiles, verify: bool) -> Path:
    """The ONNX graph a stage runs: a stage export's .onnx, or a stage build's calibrated Q/DQ model
    (the graph its ONNX Runtime artifact was made from), else its model.onnx."""
    if stage.build is None:
        stage.verify(folder, enabled=verify)
        return folder / stage.onnx
    manifest = read_manifest(folder / stage.build)
    calibration = manifest.data.get("calibration") or {}
    name = calibration.get("model") or (manifest.data.get("model") or {}).get("onnx")
    if not isinstance(name, str):
        raise DSAUserError(f"{manifest.path} names no ONNX model of stage {stage.index}; build the stages again.")
    path = manifest.artifact(name)
    manifest.verify([path], enabled=verify)
    return path


class _Logits:
    """Cosine and SQNR of several arrays taken as one (what :func:`cosine` and :func:`sqnr_db` give
    for their concatenation) without holding them: running sums in float64."""

    def __init__(self) -> None:
        self.dot = self.ref = self.qnt = self.noise = self.max_abs = 0.0
        self.equal = True

    def add(self, reference: np.ndarray, quantized: np.ndarray) -> None:
        r, q = reference.astype(np.float64).ravel(), quantized.astype(np.float64).ravel()
        self.dot += float(np.dot(r, q))
        self.ref += float(np.dot(r, r))
        self.qnt += float(np.dot(q, q))
        self.noise += float(np.sum((r - q) ** 2))
        self.max_abs = max(self.max_abs, float(np.max(np.abs(r - q), initial=0.0)))
        self.equal = self.equal and bool(np.array_equal(r, q))

    def cosine(self) -> float:
        denom = math.sqrt(self.ref) * math.sqrt(self.qnt)
        if denom == 0:
            return 1.0 if self.equal else 0.0
        return self.dot / denom

    def sqnr_db(self) -> float:
        if self.noise == 0:
            return math.inf
        if self.ref == 0:
            return -math.inf
        return 10.0 * math.log10(self.ref / self.noise)


def _run_stage(folder: Path, pipeline: Pipeline, stage: StageFiles, samples: Sequence[tuple[str, np.ndarray]],
               scratch: Path, tag: str, verify: bool) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Run the prefill of every sample through one stage (a copy of its graph that also returns its
    selections), fed by what the same pipeline's earlier stages left in ``scratch/tag``; write each
    sample's outputs (no caches) there. Returns the stage's (indexer, experts) nodes."""
    import onnx

    from dsa_export.runtime.onnxrt import session
    from dsa_export.runtime.paged import page_size
    from dsa_export.stages.calibration import _call_feeds

    graph = _stage_graph(folder, stage, verify)
    model = onnx.load(str(graph), load_external_data=False)
    indexers, experts = indexer_nodes(model), experts_nodes(model)
    exposed = with_indexer_outputs(model).SerializeToString()
    del model
    sess = session(graph, model_bytes=exposed)
    del exposed
    if any(i.type == "tensor(bfloat16)" for i in sess.get_inputs()):
        raise DSAUserError(f"stage {stage.index} of {folder} is bf16, which ONNX Runtime's CPU provider cannot run "
                           "to compare; export (or build) the stages with --dtype fp32.")
    names = [o.name for o in sess.get_outputs()]
    wanted = {spec.name for spec in stage.inputs}
    page = page_size(stage.inputs) if pipeline.graph == "paged" else None
    for number, (_label, ids) in enumerate(samples):
        feeds = _call_feeds(stage.inputs, pipeline.graph, ids, None, page, {})
        for link in pipeline.links:
            if link.target == stage.index:
                with np.load(scratch / tag / f"{link.source:02d}_{number:05d}.npz") as upstream:
                    feeds[link.input] = upstream[link.output]
        feeds = {name: value for name, value in feeds.items() if name in wanted}
        result = dict(zip(names, sess.run(names, feeds)))
        kept = {name: value for name, value in result.items() if not name.startswith("present_")}
        np.savez(scratch / tag / f"{stage.index:02d}_{number:05d}.npz", **kept)
    del sess
    return indexers, experts


def _check_pipelines(reference: Pipeline, quantized: Pipeline, float_folder: Path, quantized_folder: Path) -> None:
    same = (len(reference.stages) == len(quantized.stages) and reference.graph == quantized.graph
            and {(k.source, k.target, k.output, k.input) for k in reference.links}
            == {(k.source, k.target, k.output, k.input) for k in quantized.links}
            and all(a.layers == b.layers for a, b in zip(reference.stages, quantized.stages)))
    if not same:
        raise DSAUserError(f"{quantized_folder} and {float_folder} are not the same pipeline (stages, layers, graph or "
                           "links differ); compare a stage build with the stage export it was built from.")


def _prefill_measures(float_folder: Path, reference: Pipeline, quantized_folder: Path, quantized: Pipeline,
                      samples: Sequence[tuple[str, np.ndarray]], scratch: Path, verify: bool,
                      say: Callable[[str], None]) -> tuple[_Logits, list[SampleLogits], list[tuple], list[tuple]]:
    """Logits, top-k overlap and router agreement of the prefill call, stage by stage: the float
    stage over every sample, then the quantized stage, compared as soon as both exist."""
    for tag in ("float", "quantized"):
        (scratch / tag).mkdir(parents=True, exist_ok=True)
    logits, per_sample = _Logits(), []
    topk: list[tuple] = []  # (stage, node, overlaps)
    router: list[tuple] = []  # (stage, node, equal, overlap)
    last = reference.stages[-1].index
    for stage_f, stage_q in zip(reference.stages, quantized.stages):
        say(f"  stage {stage_f.index}: prefill of {len(samples)} sample(s), float then quantized")
        indexers_f, experts_f = _run_stage(float_folder, reference, stage_f, samples, scratch, "float", verify)
        indexers_q, experts_q = _run_stage(quantized_folder, quantized, stage_q, samples, scratch, "quantized", verify)
        if len(indexers_f) != len(indexers_q) or len(experts_f) != len(experts_q):
            raise DSAUserError(f"stage {stage_f.index} has {len(indexers_q)} indexer and {len(experts_q)} experts nodes "
                               f"in {quantized_folder} but {len(indexers_f)} and {len(experts_f)} in {float_folder}; "
                               "compare a stage build with the stage export it was built from.")
        overlaps: list[list[np.ndarray]] = [[] for _ in indexers_f]
        equal: list[list[np.ndarray]] = [[] for _ in experts_f]
        shares: list[list[np.ndarray]] = [[] for _ in experts_f]
        for number, (label, _ids) in enumerate(samples):
            name = f"{stage_f.index:02d}_{number:05d}.npz"
            with np.load(scratch / "float" / name) as f, np.load(scratch / "quantized" / name) as q:
                for n, ((_, out_f), (_, out_q)) in enumerate(zip(indexers_f, indexers_q)):
                    keys = int(max(f[out_f].max(initial=-1), q[out_q].max(initial=-1)) + 1)
                    overlaps[n].append(selection_overlap(f[out_f], q[out_q], keys))
                for n, ((_, ids_f), (_, ids_q)) in enumerate(zip(experts_f, experts_q)):
                    count = int(max(f[ids_f].max(initial=-1), q[ids_q].max(initial=-1)) + 1)
                    same, share = router_agreement(f[ids_f], q[ids_q], count)
                    equal[n].append(same)
                    shares[n].append(share)
                if stage_f.index == last:
                    logits.add(f["logits"], q["logits"])
                    per_sample.append(SampleLogits(label, cosine(f["logits"], q["logits"]),
                                                   sqnr_db(f["logits"], q["logits"])))
        topk += [(stage_f.index, node, np.concatenate(rows) if rows else np.zeros(0))
                 for (node, _), rows in zip(indexers_f, overlaps)]
        router += [(stage_f.index, node, np.concatenate(e) if e else np.zeros(0, bool),
                    np.concatenate(s) if s else np.zeros(0)) for (node, _), e, s in zip(experts_f, equal, shares)]
        # What the next stages need stays; this stage's own comparison is done.
        consumed = {link.source for link in reference.links if link.target > stage_f.index}
        if stage_f.index not in consumed:
            for tag in ("float", "quantized"):
                for path in (scratch / tag).glob(f"{stage_f.index:02d}_*.npz"):
                    path.unlink()
    return logits, per_sample, topk, router


# -- greedy agreement: generate over whole pipelines -----------------------------------------------

class _TeacherForced:
    """A pipeline as :func:`~dsa_export.runtime.generate.generate` sees it, that records the argmax
    of every call's last-position logits and then hands ``generate`` logits that pick the forced
    token, so the pipeline is fed the reference's token path with ``generate``'s own caches and
    pages."""

    def __init__(self, model, forced: np.ndarray):
        self._model = model
        self._forced = forced  # [rows, tokens]
        self.chosen: list[np.ndarray] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def forward(self, feeds: dict[str, np.ndarray], slot: str, micro_batches: int = 1) -> dict[str, np.ndarray]:
        logits = self._model.forward(feeds, slot, micro_batches)["logits"]
        last = logits[:, -1] if logits.ndim == 3 else logits
        self.chosen.append(last.astype(np.float64).argmax(axis=-1))  # generate's greedy choice
        forced = np.zeros(last.shape, dtype=np.float32)
        forced[np.arange(last.shape[0]), self._forced[:, len(self.chosen) - 1]] = 1.0
        return {"logits": forced[:, None] if logits.ndim == 3 else forced}


def _limits(folder: Path, pipeline: Pipeline) -> tuple[int | None, int | None]:
    """(tokens per sequence, rows per call) the stage build's profiles allow (None: unbounded), as
    the runtime sessions compute them, read from the manifests without opening a stage."""
    from dsa_export.runtime.session import Session

    sequence, batch = [], []
    for stage in pipeline.stages:
        if stage.build is None:
            continue
        probe = Session(kind="limits", inputs=list(stage.inputs), outputs=[],
                        manifest=read_manifest(folder / stage.build))
        sequence.append(probe.sequence_limit())
        batch.append(probe.dim_limit("batch"))
    sequence = [s for s in sequence if s is not None]
    batch = [b for b in batch if b is not None]
    return (min(sequence) if sequence else None), (min(batch) if batch else None)


def _chunks(ids: np.ndarray, rows: int | None) -> list[np.ndarray]:
    step = rows or ids.shape[0]
    return [ids[i:i + step] for i in range(0, ids.shape[0], step)]


def _greedy(float_folder: Path, quantized_folder: Path, prompts: Sequence[tuple[str, np.ndarray]], tokens: int,
            rows: int | None, runtime: str, verify: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(float tokens, quantized argmax on the float path) per sample, ``[rows, tokens]`` each."""
    from dsa_export.runtime.generate import SamplingSettings, generate
    from dsa_export.stages.session import PipelineSession

    settings = SamplingSettings(max_new_tokens=tokens, temperature=0.0)
    model = PipelineSession.open(float_folder, "onnxruntime", verify=verify)
    try:
        reference = [np.concatenate([generate(model, part, settings).tokens for part in _chunks(ids, rows)])
                     for _, ids in prompts]
    finally:
        model.close()
    model = PipelineSession.open(quantized_folder, runtime, verify=verify)
    try:
        chosen = []
        for (_, ids), path in zip(prompts, reference):
            parts = []
            for part, forced in zip(_chunks(ids, rows), _chunks(path, rows)):
                forcing = _TeacherForced(model, forced)
                generate(forcing, part, settings)
                parts.append(np.stack(forcing.chosen, axis=1))
            chosen.append(np.concatenate(parts))
    finally:
        model.close()
    return reference, chosen


# -- the report -------------------------------------------------------------------------------------

def pipeline_report(float_folder: str | Path, quantized_folder: str | Path,
                    samples: Sequence[tuple[str, np.ndarray]], tokens: int = DEFAULT_TOKENS, *,
                    thresholds: PipelineThresholds = PipelineThresholds(), runtime: str = "onnxruntime",
                    verify: bool = True, scratch: str | Path | None = None,
                    say: Callable[[str], None] = lambda line: None) -> PipelineReport:
    """Compare the pipeline in ``quantized_folder`` (a stage build, or any pipeline folder of the
    same stages) with the float stage export in ``float_folder`` on ``samples`` (label, token ids
    ``[B, L]``), greedy agreement over ``tokens`` tokens per row. ``scratch``: where intermediate
    tensors are spilled (default: the system's temporary folder); ``runtime``: how the quantized
    build's stages are opened for greedy decoding."""
    float_folder, quantized_folder = Path(float_folder), Path(quantized_folder)
    if tokens < 1:
        raise DSAUserError(f"the pipeline report needs at least one greedy token; got {tokens}.")
    if not samples:
        raise DSAUserError("the pipeline report needs held-out token ids; give samples that were not calibrated on.")
    reference, quantized = read_pipeline(float_folder), read_pipeline(quantized_folder)
    if any(stage.build is not None for stage in reference.stages):
        raise DSAUserError(f"{float_folder} is a stage build; the reference is the float stage export (its export/ "
                           "folder).")
    _check_pipelines(reference, quantized, float_folder, quantized_folder)
    prompts = []
    for label, ids in samples:
        ids = np.asarray(ids)
        ids = ids[None, :] if ids.ndim == 1 else ids
        if ids.ndim != 2 or ids.shape[1] < 1 or not np.issubdtype(ids.dtype, np.integer):
            raise DSAUserError(f"held-out sample '{label}' is {ids.dtype} of shape {list(ids.shape)}; give integer "
                               "token ids of shape [B, L].")
        prompts.append((label, ids.astype(np.int64)))
    notes: list[str] = []
    limit, rows = _limits(quantized_folder, quantized)
    steps = tokens
    greedy_prompts = prompts
    if limit is not None:
        longest = max(ids.shape[1] for _, ids in prompts)
        if longest + tokens - 1 > limit:
            keep = max(1, min(longest, limit - tokens + 1))
            steps = min(tokens, limit - keep + 1)
            greedy_prompts = [(label, ids[:, :keep]) for label, ids in prompts]
            notes.append(f"greedy decoding: prompts cut to their first {keep} tokens and {steps} tokens decoded, as the "
                         f"quantized build holds at most {limit} tokens per sequence")
    with tempfile.TemporaryDirectory(prefix=".dsa-pipeline-report-", dir=scratch) as tmp:
        logits, per_sample, topk, router = _prefill_measures(float_folder, reference, quantized_folder, quantized,
                                                             prompts, Path(tmp), verify, say)
    say(f"  greedy decoding of {steps} tokens: float pipeline, then the quantized one on the float tokens")
    paths, chosen = _greedy(float_folder, quantized_folder, greedy_prompts, steps, rows, runtime, verify)
    greedy_samples = []
    for (label, ids), path, argmax in zip(greedy_prompts, paths, chosen):
        same = argmax == path
        firsts = [int(np.argmin(row)) if not row.all() else None for row in same]
        greedy_samples.append(GreedySample(label, ids.shape[0], int(same.shape[1]), int(same.sum()),
                                           float(same.mean()), firsts))
    positions = sum(s.rows * s.tokens for s in greedy_samples)
    matches = sum(s.matches for s in greedy_samples)
    divergences = [d for s in greedy_samples for d in s.first_divergence if d is not None]
    report = PipelineReport(
        float_pipeline=str(float_folder), quantized_pipeline=str(quantized_folder), graph=reference.graph,
        eval_inputs=[label for label, _ in prompts], thresholds=thresholds,
        logits=LogitsAccuracy(logits.cosine(), logits.sqnr_db(), logits.max_abs, per_sample, False),
        greedy=GreedyAgreement(tokens, positions, matches, matches / positions if positions else 1.0,
                               min(divergences) if divergences else None, greedy_samples, False),
        topk=[LayerTopk(n, stage, node, float(o.mean()) if o.size else 1.0, float(o.min()) if o.size else 1.0,
                        int(o.size), False) for n, (stage, node, o) in enumerate(topk)],
        router=[LayerRouter(n, stage, node, float(e.mean()) if e.size else 1.0, float(s.mean()) if s.size else 1.0,
                            int(e.size), False) for n, (stage, node, e, s) in enumerate(router)],
        notes=notes)
    return report.judge()


# -- the stage build's report ----------------------------------------------------------------------

_FEED = re.compile(r"sample_(\d+)\.npz")


def held_out(output: Path, stages: Sequence[StageFiles], digest: str) -> tuple[list[int], list[Thresholds]]:
    """(indices of the calibration samples no stage calibrated on, every stage's report marks), from
    the per-stage reports of the stage build in ``output``: the feeds each stage's report was
    judged on (``eval_inputs``) are ``calibration/<digest>/stage_KK/sample_NNNNN.npz``, sample
    ``NNNNN`` being the ``NNNNN``-th calibration file. Empty when a stage has no such report."""
    common: set[int] | None = None
    marks = []
    known = {f.name for f in fields(Thresholds)}
    for stage in stages:
        if stage.build is None:
            return [], []
        manifest = read_manifest(output / stage.build)
        name = (manifest.data.get("calibration") or {}).get("report")
        if not isinstance(name, str) or not manifest.artifact(name).is_file():
            return [], []
        try:
            data = json.loads(manifest.artifact(name).read_text(encoding="utf-8"))
            marks.append(Thresholds(**{k: v for k, v in data["thresholds"].items() if k in known}))
            labels = [Path(label) for label in data["eval_inputs"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DSAUserError(f"cannot read the accuracy report {manifest.artifact(name)} ({exc}); build the stages "
                               "again.") from exc
        indices = set()
        for label in labels:
            match = _FEED.fullmatch(label.name)
            if match and label.parent.name == f"stage_{stage.index:02d}" and label.parent.parent.name == digest:
                indices.add(int(match.group(1)))
        common = indices if common is None else common & indices
    return sorted(common or ()), marks


def stage_build_report(export_folder: Path, output: Path, data: Path, feeds: Path, stages: Sequence[StageFiles],
                       *, kept: bool, tokens: int = DEFAULT_TOKENS,
                       say: Callable[[str], None] = print) -> PipelineReport | None:
    """The whole-pipeline report of the quantized stage build in ``output`` against its float
    export, on the calibration files of ``data`` that the per-stage calibrations held out
    (``feeds``: ``output/calibration/<digest>``), written to ``output/calibration/pipeline_report.json``.
    With every stage ``kept`` and a report of the same data digest, stage build keys and token
    count already there, that report is returned without running anything. None (and one warning)
    when nothing was held out."""
    from dsa_export.fileio import atomic_output
    from dsa_export.stages.calibration import _samples

    path = feeds.parent / REPORT_NAME
    digest = feeds.name
    keys = [stage.build_key for stage in stages]
    if kept and path.is_file():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            previous = PipelineReport.from_dict(json.loads(path.read_text(encoding="utf-8")))
            if previous.data_digest == digest and previous.build_keys == keys and previous.greedy.tokens == tokens:
                say(f"The pipeline report of these stages and data is in {path} already.")
                return previous
    missing = [stage.index for stage in stages
               if stage.build is None or read_manifest(output / stage.build).onnxruntime is None]
    if missing:
        log.warning("no whole-pipeline accuracy report: stage(s) %s have no ONNX Runtime artifact to run it on; build "
                    "with --backend auto or onnxruntime.", ", ".join(map(str, missing)))
        path.unlink(missing_ok=True)
        return None
    indices, marks = held_out(output, stages, digest)
    if not indices:
        log.warning("no whole-pipeline accuracy report: no calibration file was held out from every stage's "
                    "calibration; give more --calibration-data files than the recipe's samples.")
        path.unlink(missing_ok=True)
        return None
    samples = _samples(data)
    chosen = [(samples[i][0], samples[i][1]) for i in indices if i < len(samples)]
    say(f"Comparing the quantized pipeline with the float stages end to end on {len(chosen)} held-out sample(s) ...")
    # Spilled tensors go beside the build (a real-width stage's logits do not belong in /tmp).
    report = pipeline_report(export_folder, output, chosen, tokens, thresholds=PipelineThresholds.from_stages(marks),
                             scratch=feeds.parent, say=say)
    report.data_digest, report.build_keys = digest, keys
    with atomic_output(path) as tmp:
        tmp.write_text(report.to_json() + "\n", encoding="utf-8")
    return report


def failure_sentence(report: PipelineReport, path: Path) -> str:
    """The build's one-sentence error for a failing report."""
    failed = report.failures()
    named = "; ".join(failed[:_NAMED_FAILURES]) + (f"; and {len(failed) - _NAMED_FAILURES} more"
                                                   if len(failed) > _NAMED_FAILURES else "")
    return (f"the quantized pipeline fails its accuracy thresholds end to end ({named}); the stages are kept, see "
            f"{path} and the table above.")


__all__ = ["DEFAULT_TOKENS", "GREEDY_AGREEMENT", "REPORT_NAME", "PipelineReport", "PipelineThresholds",
           "failure_sentence", "held_out", "pipeline_report", "stage_build_report"]
