"""Compare an exported ONNX file with the torch model it came from.

Polygraphy's ``Comparator`` runs our :class:`TorchRunner` and an ONNX Runtime runner on the same
inputs (one batch per sequence length) and judges each output with ``SimpleCompareFunc``
(``|a - b| <= atol + rtol * |b|`` elementwise); we add a per-output table of max / median
absolute and max relative error for the report.

For Hugging Face checkpoints the reference is transformers running the graph's layers (loaded
streamed, :mod:`dsa_export.hf.reference`); for built-in models and factories it is the torch
module, whose ``dsa.indexer_topk`` calls are recorded (:class:`TorchOpSelections`). Either way
every indexer's selection is compared too
(:mod:`dsa_export.validate.selections`): a query whose keys differ from the reference's only by
near-ties at the k-th place is a near-tie flip, counted and shown, and its positions are left out
of the strict elementwise comparison; any other difference fails. The ONNX Runtime side exposes
the DSAIndexerTopK outputs through a modified copy of the graph held in memory, which reads the
original external data, so files of any size work and nothing is written beside them.

Before anything runs: the reference recorded in the file is rebuilt only if it is a built-in
model or a checkpoint directory (a recorded Python factory is refused: it runs only when passed
with ``--reference``), a file that belongs to a build folder or a pipeline is verified against its
recorded hashes, the generated inputs are checked against the file's input types and token-id
range, and every sequence length's memory is estimated (:mod:`dsa_export.runtime.memory`) and
refused when it cannot fit.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx

from dsa_export.errors import DSAUserError
from dsa_export.onnx_files import META_CONFIG, META_SETTINGS, META_SPEC
from dsa_export.ops.contract import SELECTING_OPS
from dsa_export.quiet import polygraphy_to_stderr
from dsa_export.runtime.onnxrt import polygraphy_runner
from dsa_export.runtime.torch_runner import TorchRunner, metadata_from_onnx
from dsa_export.validate.cache_codes import code_flips
from dsa_export.validate.selections import LayerSelections, compare_selections

log = logging.getLogger(__name__)

#: Default (atol, rtol, error statistic) per exported dtype. The reference always runs in fp32.
#: fp32 files must match elementwise (the core acceptance bar). In fp16/bf16 a rounding difference
#: in an indexer score can swap which key is selected near the k-th place, which moves single
#: logits by O(0.1) while the bulk stays close, so low precision is judged on the median error.
DEFAULT_TOLERANCES = {"fp32": (1e-4, 1e-4, "elemwise"), "fp16": (1e-2, 1e-2, "median"), "bf16": (5e-2, 5e-2, "median")}
#: Default near-tie tolerance of the indexer scores per exported dtype, relative to the row's
#: largest score: float32 scores of the same math differ by ~1e-6 relative between runtimes.
DEFAULT_TIE_RTOL = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 2e-2}
ERROR_STATS = ("elemwise", "max", "mean", "median")


@dataclass(frozen=True)
class ValidationSettings:
    """What to compare and how strictly.

    Attributes:
        reference: MODEL spec of the torch reference; ``None`` reads it from the file's metadata.
        seq_lens: sequence lengths to test; lengths the export never saw are the point.
        batch: batch size of the generated inputs.
        atol, rtol: tolerances; ``None`` takes the exported dtype's default.
        error_stat: ``elemwise`` (every element within atol + rtol*|ref|) or a statistic of the
            error (``median``, ``mean``, ``max``) that must be within atol or rtol, as Polygraphy's
            ``SimpleCompareFunc`` defines them; ``None`` takes the dtype's default.
        seed: seed of the generated inputs.
    """

    reference: str | None = None
    seq_lens: tuple[int, ...] = (16, 64, 256)
    batch: int = 2
    atol: float | None = None
    rtol: float | None = None
    error_stat: str | None = None
    seed: int = 1
    #: Minimum mean top-k overlap per layer with transformers' indexers (Hugging Face references).
    min_topk_overlap: float = 0.99
    #: Near-tie tolerance of index scores relative to the row's largest score; None: per dtype.
    tie_rtol: float | None = None
    #: Check a file of a build folder or pipeline against its recorded sha256 first.
    verify: bool = True


@dataclass
class OutputError:
    seq_len: int
    output: str
    max_abs: float
    median_abs: float
    max_rel: float
    passed: bool
    #: positions (batch, query) left out of the comparison as near-tie flips
    excluded_positions: int = 0
    cosine: float | None = None


@dataclass
class ValidationReport:
    model: str
    reference: str
    dtype: str
    atol: float
    rtol: float
    error_stat: str
    runners: list[str]
    errors: list[OutputError] = field(default_factory=list)
    #: {seq_len: {layer: overlap}} of top-k selections against transformers' indexers (HF models).
    topk_overlap: dict[int, dict[int, float]] = field(default_factory=dict)
    min_topk_overlap: float | None = None
    #: {seq_len: [per-layer classification of the selections]} (HF models).
    selections: dict[int, list[LayerSelections]] = field(default_factory=dict)
    tie_rtol: float | None = None
    passed: bool = False

    @property
    def near_tie_flips(self) -> int:
        return sum(layer.near_tie_rows for layers in self.selections.values() for layer in layers)

    @property
    def unexplained_selections(self) -> int:
        return sum(layer.unexplained_rows for layers in self.selections.values() for layer in layers)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def table(self) -> str:
        header = (f"{'seq_len':>7}  {'output':<17} {'max_abs':>10} {'median_abs':>10} {'max_rel':>10} "
                  f"{'cosine':>10}  result")
        rows = [
            f"{e.seq_len:>7}  {e.output:<17} {e.max_abs:>10.3e} {e.median_abs:>10.3e} {e.max_rel:>10.3e} "
            f"{'' if e.cosine is None else f'{e.cosine:.6f}':>10}  {'PASS' if e.passed else 'FAIL'}"
            for e in self.errors
        ]
        for e in self.errors:
            if e.excluded_positions:
                rows.append(f"{e.seq_len:>7}  {e.output}: {e.excluded_positions} position(s) left out as near-tie flips")
        for seq_len, layers in self.selections.items():
            for layer in layers:
                rows.append(
                    f"{seq_len:>7}  L{layer.layer} top-k vs {self.runners[0]}: overlap {layer.overlap:.4f}, "
                    f"{layer.near_tie_rows} near-tie flip(s) (max gap {layer.max_near_tie_gap:.1e} of the row's "
                    f"largest score), {layer.propagated_rows} propagated, {layer.unexplained_rows} unexplained"
                    + "".join(f"; e.g. batch {b} query {q}: ours {o} vs theirs {t}" for b, q, o, t in layer.examples[:1]))
        verdict = "PASSED" if self.passed else "FAILED"
        return "\n".join([header, *rows, f"{verdict}: {self.runners[1]} vs {self.runners[0]} "
                          f"({self.error_stat} error within atol={self.atol:g}/rtol={self.rtol:g}, {self.dtype} file, "
                          "fp32 reference)"])


def _reference_source(meta: dict[str, str], settings: ValidationSettings, path: Path, dtype: str):
    from dataclasses import replace

    from dsa_export.model_ref import from_metadata
    from dsa_export.sources import resolve

    recorded = from_metadata(meta.get(META_SPEC), path.resolve().parent)
    reference = settings.reference or recorded
    if settings.reference and recorded is not None and recorded.kind == "hf" and Path(settings.reference).is_dir():
        # A checkpoint directory given by hand: rebuild the graph the file was exported as.
        reference = replace(recorded, path=str(Path(settings.reference).resolve()), relative=False)
    if not reference:
        raise DSAUserError(f"'{path}' records no reference model; pass one with --reference MODEL.")
    source = resolve(reference, batch=settings.batch, seq_len=max(2, settings.seq_lens[0]), seed=settings.seed,
                     dtype=dtype if recorded is not None and recorded.kind == "hf" else None)
    if settings.reference is None and META_CONFIG in meta and source.config is not None:
        if json.loads(meta[META_CONFIG]) != json.loads(json.dumps(source.config, sort_keys=True, default=str)):
            raise DSAUserError(
                f"the reference '{source.spec}' no longer matches the config recorded in '{path}'; "
                "re-export the model or pass --reference."
            )
    if (recorded is not None and recorded.kind == "factory" and recorded.sha256 and source.file_sha256
            and recorded.sha256 != source.file_sha256):
        log.warning("the reference file %s changed since export; comparing against its current code", source.spec)
    return source


#: The indexer ops whose selections are judged per query row, near ties allowed (the contract's
#: ops whose output is a selection).
INDEXER_OPS = SELECTING_OPS


class TorchOpSelections:
    """A torch reference whose ``dsa.indexer_topk`` calls are recorded: per call the selection and
    the scores it was taken from, recomputed in float64 from the op's own inputs (``relu(scale *
    q.k)`` weighted by ``w`` and summed over heads, keys a query may not see at ``-inf``), keyed by
    call order, which is the order of the exported DSAIndexerTopK nodes. Gives built-in models and
    factories the near-tie verdict that transformers references get."""

    def __init__(self, module):
        self.module = module

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def eval(self):
        self.module.eval()
        return self

    def parameters(self):
        return self.module.parameters()

    def run_with_selections(self, *args, **kwargs):
        from torch.overrides import TorchFunctionMode

        calls: list[tuple] = []

        class Capture(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                name = getattr(func, "_qualified_op_name", None) or str(func).replace(".", "::", 1)
                if name.startswith(("dsa::indexer_topk_paged", "dsa::indexer_topk")):
                    scorer = (_paged_fp8_index_scores if name.startswith("dsa::indexer_topk_paged_fp8")
                              else _paged_index_scores if name.startswith("dsa::indexer_topk_paged")
                              else _index_scores)
                    calls.append((scorer, args, kwargs or {}, out))
                return out

        with Capture():
            outputs = self.module(*args, **kwargs)
        captured = {i: (out.detach().clone(), scorer(*call_args, **call_kwargs))
                    for i, (scorer, call_args, call_kwargs, out) in enumerate(calls)}
        return (outputs if isinstance(outputs, tuple) else (outputs,)), captured


def _index_scores(q, k, w, lengths=None, topk=None, scale=1.0, causal=True):
    """float64 ``[B,S,T]`` index scores of one DSAIndexerTopK call (the op contract's), masked."""
    import torch

    q64, k64, w64 = (x.detach().to(torch.float64) for x in (q, k, w))
    b, s, t = q64.shape[0], q64.shape[1], k64.shape[1]
    scores = torch.empty(b, s, t, dtype=torch.float64)
    for bi in range(b):  # one batch row at a time: [S,H,T] float64 at most
        logits = torch.einsum("shd,td->sht", q64[bi], k64[bi]) * float(scale)
        scores[bi] = (logits.clamp_min(0) * w64[bi][..., None]).sum(1)
    limit = torch.full((b, 1, 1), t, dtype=torch.int64)
    if lengths is not None:
        limit = lengths.detach().to(torch.int64).clamp(0, t).reshape(b, 1, 1)
    keys = torch.arange(t).reshape(1, 1, t)
    hidden = keys >= limit
    if causal:
        hidden = hidden | (keys > (t - s + torch.arange(s)).reshape(1, s, 1))
    return scores.masked_fill(hidden, float("-inf"))


def _paged_index_scores(q, k_pool, w, block_table, query_start, lengths, topk=None, scale=1.0, causal=True):
    """float64 ``[B,S,M*page]`` index scores of one DSAIndexerTopKPaged call over logical key
    positions (keys of invalid pages, past ``lengths`` or after the query's position at ``-inf``)."""
    import torch

    b, s = q.shape[0], q.shape[1]
    n_pages, page = k_pool.shape[0], k_pool.shape[1]
    table = block_table.detach().to(torch.int64)
    t = table.shape[1] * page
    ok_page = (table >= 0) & (table < n_pages)
    keys = k_pool.detach()[torch.where(ok_page, table, 0)].reshape(b, t, -1)  # [B, M*page, D]
    scores = _index_scores(q, keys, w, None, topk, scale, causal=False)
    positions = torch.arange(t).reshape(1, 1, t)
    hidden = ~ok_page.repeat_interleave(page, dim=1)[:, None, :]
    hidden = hidden | (positions >= lengths.detach().to(torch.int64).reshape(b, 1, 1))
    if causal:
        first = query_start.detach().to(torch.int64).reshape(b, 1, 1)
        hidden = hidden | (positions > first + torch.arange(s).reshape(1, s, 1))
    return scores.masked_fill(hidden, float("-inf"))


def _paged_fp8_index_scores(q, k_pool, k_scale_pool, w, block_table, query_start, lengths, topk=None, scale=1.0,
                            causal=True):
    """:func:`_paged_index_scores` of one DSAIndexerTopKPagedFP8 call: its uint8 e4m3fn key codes
    decoded and times their per-token scales (float32) first."""
    from dsa_export.ops.torch_ops import decode_fp8

    keys = decode_fp8(k_pool.detach()) * k_scale_pool.detach().float()
    return _paged_index_scores(q, keys, w, block_table, query_start, lengths, topk, scale, causal)


class _RecordingReference:
    """A reference whose indexer selections are kept per call (for the comparison)."""

    def __init__(self, layers):
        import torch

        self.layers = layers
        self.records: list[dict[int, tuple[np.ndarray, np.ndarray]]] = []
        self._torch = torch

    def eval(self):
        return self

    def parameters(self):
        return self.layers.parameters()

    def release(self) -> None:
        self.layers = None

    def __call__(self, *args, **kwargs):
        outputs, captured = self.layers.run_with_selections(*args, **kwargs)
        self.records.append({i: (idx.numpy(), sc.numpy()) for i, (idx, sc) in captured.items()})
        return outputs


def with_indexer_outputs(model) -> tuple[bytes, list[str]]:
    """A copy of ``model`` (a ModelProto without external data loaded) whose every DSAIndexerTopK
    output is also a graph output, serialized; and those names in graph (= layer) order."""
    import copy

    model = copy.deepcopy(model)
    infos = {v.name: v for v in model.graph.value_info}
    names = [n.output[0] for n in model.graph.node if n.domain == "dsa" and n.op_type in INDEXER_OPS]
    existing = {o.name for o in model.graph.output}
    for name in names:
        if name not in existing:
            model.graph.output.append(infos[name])
    return model.SerializeToString(), names


def validate_onnx(path: str | Path, settings: ValidationSettings = ValidationSettings(), *,
                  model: onnx.ModelProto | None = None) -> ValidationReport:
    """Run torch and ONNX Runtime on the same inputs through Polygraphy and judge every output.

    ``model``: the graph of ``path`` without external data when the caller has read it already
    (``build``), so the file is not parsed twice; its external data is checked all the same."""
    return _Validation(Path(path), settings, model).run()


@dataclass
class _Runners:
    """The two Polygraphy runners and what judging the indexer selections needs of them."""

    torch: TorchRunner
    ort: object
    reference_name: str
    #: whether the indexer selections are compared (the reference records them)
    select: bool
    recorder: _RecordingReference | None
    #: the DSAIndexerTopK outputs ONNX Runtime is asked for, in layer order
    index_names: list[str]


class _Validation:
    """One :func:`validate_onnx` call: its settings resolved against the file, then
    feeds -> runners -> Polygraphy comparison -> report, one method each."""

    def __init__(self, path: Path, settings: ValidationSettings, model: onnx.ModelProto | None):
        from dsa_export.onnx_files import load_graph, metadata

        self.path, self.settings = path, settings
        if model is None:
            model = load_graph(path)
        else:
            from dsa_export.integrity import check_external_data

            check_external_data(path, model, missing_ok=True)  # as load_graph does
        self.model = model
        self.meta = metadata(model)
        self.dtype = json.loads(self.meta.get(META_SETTINGS, "{}")).get("dtype", "fp32")
        default_atol, default_rtol, default_stat = DEFAULT_TOLERANCES.get(self.dtype, DEFAULT_TOLERANCES["fp32"])
        self.atol = default_atol if settings.atol is None else settings.atol
        self.rtol = default_rtol if settings.rtol is None else settings.rtol
        self.fp8_pools = [o.name for o in model.graph.output
                          if o.name.startswith("present_") and o.type.tensor_type.elem_type == onnx.TensorProto.UINT8]
        if self.fp8_pools and not any(n.domain == "dsa" and n.op_type in INDEXER_OPS for n in model.graph.node):
            # FP8 cache pools (uint8 e4m3 codes): a cached value the two runtimes compute a last bit
            # apart may sit on an FP8 rounding midpoint and round to the neighbouring code, which
            # moves every output that reads it by up to one e4m3 step (2^-3 relative). With an
            # indexer the queries that read such a code are found and left out (cache_codes);
            # without one, there is no selection to follow: judged on the median error.
            default_stat = "median"
        self.error_stat = settings.error_stat or default_stat
        self.tie_rtol = DEFAULT_TIE_RTOL.get(self.dtype, 1e-4) if settings.tie_rtol is None else settings.tie_rtol
        if self.error_stat not in ERROR_STATS:
            raise DSAUserError(f"error statistic '{self.error_stat}' is unknown; use one of {', '.join(ERROR_STATS)}.")
        if self.dtype == "bf16":
            _require_bf16_provider()
        self.output_names = [o.name for o in model.graph.output]

    def run(self) -> ValidationReport:
        from dsa_export.stages.record import verify_recorded_onnx

        verify_recorded_onnx(self.path, enabled=self.settings.verify)
        source = _reference_source(self.meta, self.settings, self.path, self.dtype)
        feeds = self.feeds(source)
        runners = self.runners(source)
        report = ValidationReport(
            model=str(self.path), reference=source.spec, dtype=self.dtype, atol=self.atol, rtol=self.rtol,
            error_stat=self.error_stat, runners=[runners.reference_name, "onnxruntime"],
            tie_rtol=self.tie_rtol if runners.select else None,
        )
        results, excluded, past = self.compare(source, runners, feeds, report)
        (_, torch_iters), (_, ort_iters) = results[0], results[1]
        selections = selection_outputs(self.model)
        for k, (seq_len, expected, actual) in enumerate(zip(self.settings.seq_lens, torch_iters, ort_iters)):
            for name in self.output_names:
                mask = excluded[k] if name not in selections else None
                report.errors.append(self.output_error(seq_len, name, expected, actual, mask, past[k], feeds[k]))
        self.verdict(report)
        return report

    def feeds(self, source) -> list[dict[str, np.ndarray]]:
        """One feed per sequence length, checked against the file's inputs and the memory here."""
        from dsa_export.manifest import check_feeds, io_specs
        from dsa_export.runtime.memory import dims_of, estimate, require_fits

        model, settings = self.model, self.settings
        onnx_inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
        specs, _ = io_specs(model)
        feeds = []
        for seq_len in settings.seq_lens:
            inputs = source.inputs_for(settings.batch, seq_len, settings.seed)
            missing = sorted(set(onnx_inputs) - set(inputs))
            if missing:
                raise DSAUserError(f"the reference gives no value for ONNX input(s) {missing}; pass the matching "
                                   "--reference.")
            declared = {spec.name: spec.dtype for spec in specs}
            feed = {name: _to_numpy(inputs[name], self.dtype, declared.get(name)) for name in onnx_inputs}
            feed = check_feeds(specs, feed, f"'{self.path.name}'")
            sizes = dims_of(model, {name: value.shape for name, value in feed.items()})
            require_fits(estimate(model, sizes), f"validating at seq_len {seq_len} (batch {settings.batch})",
                         fix="pass shorter --seq-lens or a smaller --batch")
            feeds.append(feed)
        return feeds

    def runners(self, source) -> _Runners:
        """The reference (transformers, else the fp32 torch module) and ONNX Runtime runners."""
        import torch

        from dsa_export.quiet import third_party_output

        # Loaded here rather than through the source's cached properties: the runner drops it once it
        # has run, so the reference's weights are not held while ONNX Runtime runs (at real width
        # that is a layer's float32 weights).
        with third_party_output():  # transformers' loading bars
            transformers_reference = source.reference_loader() if source.reference_loader is not None else None
        select = transformers_reference is not None and hasattr(transformers_reference, "run_with_selections")
        owned = transformers_reference is not None
        if transformers_reference is not None:
            reference, reference_name = transformers_reference, "transformers"
        else:
            reference, reference_name = source.runnable_module, "torch"
            reference.to(torch.float32)  # the reference is the fp32 model, whatever the file's dtype
            if any(n.op_type in INDEXER_OPS for n in self.model.graph.node):
                reference, select = TorchOpSelections(reference), True
        del transformers_reference
        recorder = _RecordingReference(reference) if select else None
        torch_runner = TorchRunner(recorder or reference, metadata_from_onnx(self.model), self.output_names,
                                   name=reference_name, input_order=source.input_names, release_on_deactivate=owned)
        del reference
        index_names: list[str] = []
        model_bytes = None
        if select:
            model_bytes, index_names = with_indexer_outputs(self.model)
        ort_runner = polygraphy_runner(self.path, name="onnxruntime", model_bytes=model_bytes)
        return _Runners(torch_runner, ort_runner, reference_name, select, recorder, index_names)

    def compare(self, source, runners: _Runners, feeds: list[dict], report: ValidationReport):
        """Run both runners through Polygraphy and judge them: the selections per layer (into
        ``report``), then every other output with near-tie positions left out. Returns the
        results and, per feed, the excluded ``[B,S]`` positions and the decode step's past length."""
        from polygraphy.comparator import Comparator, SimpleCompareFunc
        from polygraphy.logger import G_LOGGER

        previous = G_LOGGER.module_severity
        G_LOGGER.module_severity = G_LOGGER.ERROR
        logs = contextlib.ExitStack()
        logs.enter_context(polygraphy_to_stderr())  # its [W]/[E] lines are logs, not part of the report
        try:
            results = self._run_comparator(Comparator, runners, feeds, source)
            excluded: list[np.ndarray | None] = [None] * len(feeds)
            past = [0] * len(feeds)
            if runners.select:
                self.judge_selections(results, runners, feeds, report, excluded, past)
            self._exclude(results, excluded, past, feeds)
            compare = SimpleCompareFunc(atol=self.atol, rtol=self.rtol, check_error_stat=self.error_stat)
            report.passed = bool(Comparator.compare_accuracy(results, compare_func=compare))
        finally:
            G_LOGGER.module_severity = previous
            logs.close()
        return results, excluded, past

    def _run_comparator(self, comparator, runners: _Runners, feeds: list[dict], source):
        try:
            return comparator.run([runners.torch, runners.ort], data_loader=feeds)
        except DSAUserError:
            raise
        except Exception as exc:
            from dsa_export.errors import as_user_error

            mapped = as_user_error(exc, f"comparing '{self.path.name}' with {source.spec}")
            if mapped is None:
                raise
            raise mapped from exc

    def judge_selections(self, results, runners: _Runners, feeds: list[dict], report: ValidationReport,
                         excluded: list, past: list[int]) -> None:
        """Compare every indexer's selection with the reference's, per sequence length; fills
        ``excluded`` (near-tie positions, and the queries that wrote or read an FP8 code the two
        runtimes rounded to neighbouring values) and ``past`` per feed."""
        (_, torch_iters), (_, ort_iters) = results[0], results[1]
        for k, (seq_len, feed, outputs) in enumerate(zip(self.settings.seq_lens, feeds, ort_iters)):
            ours = [np.asarray(outputs[name]) for name in runners.index_names]
            for name in runners.index_names:
                if name not in self.output_names:
                    outputs.dct.pop(name)  # Polygraphy's IterationResult keeps its arrays in .dct
            theirs = runners.recorder.records[k]
            layers = sorted(theirs)
            if len(layers) != len(ours):
                raise RuntimeError(f"{len(ours)} DSAIndexerTopK nodes but {len(layers)} transformers indexers")
            lengths, past[k] = _selection_lengths(feed, ours)
            flips = code_flips(torch_iters[k], outputs, self.fp8_pools, layers, feed, past[k],
                                ours[0].shape[:2]) if self.fp8_pools and ours else {}
            classified, diverged = compare_selections(dict(zip(layers, ours)), theirs, lengths,
                                                      tie_rtol=self.tie_rtol, past=past[k], flipped=flips)
            report.selections[seq_len] = classified
            report.topk_overlap[seq_len] = {c.layer: c.overlap for c in classified}
            excluded[k] = diverged

    def _exclude(self, results, excluded: list, past: list[int], feeds: list[dict]) -> None:
        """Sort the selection outputs, and copy the reference over the near-tie positions of the
        other outputs (Polygraphy then judges the rest)."""
        (_, torch_iters), (_, ort_iters) = results[0], results[1]
        selections = selection_outputs(self.model)
        canonicalize_selections(results, selections)
        for k, (expected, actual) in enumerate(zip(torch_iters, ort_iters)):
            if excluded[k] is not None and excluded[k].any():
                for name in self.output_names:
                    if name in selections:
                        # Judged through the per-layer classification above.
                        actual[name] = np.asarray(expected[name])
                    else:
                        _exclude_positions(expected, actual, name, excluded[k], past[k], feeds[k])

    def output_error(self, seq_len: int, name: str, expected, actual, mask: np.ndarray | None, past: int,
                     feed: dict) -> OutputError:
        """The error table row of one output at one sequence length (near-tie positions left out)."""
        ref = np.asarray(expected[name], dtype=np.float64)
        out = np.asarray(actual[name], dtype=np.float64)
        keep = None
        aligned = _aligned(mask, ref.shape, past, feed) if mask is not None else None
        if aligned is not None:
            keep = ~aligned
        r, o = (ref[keep], out[keep]) if keep is not None else (ref, out)
        diff = np.abs(o - r)
        rel = diff / np.maximum(np.abs(r), 1e-12)
        denominator = float(np.linalg.norm(r) * np.linalg.norm(o))
        return OutputError(
            seq_len=seq_len, output=name, max_abs=float(diff.max()) if diff.size else 0.0,
            median_abs=float(np.median(diff)) if diff.size else 0.0, max_rel=float(rel.max()) if rel.size else 0.0,
            passed=_within(diff, rel, r, self.atol, self.rtol, self.error_stat) if diff.size else True,
            excluded_positions=int(mask.sum()) if keep is not None else 0,
            cosine=float((r * o).sum() / denominator) if denominator else None,
        )

    def verdict(self, report: ValidationReport) -> None:
        """Polygraphy's verdict (already in ``report.passed``), the top-k overlap and every row."""
        if report.topk_overlap:
            report.min_topk_overlap = min(v for layers in report.topk_overlap.values() for v in layers.values())
            report.passed = (report.passed and report.min_topk_overlap >= self.settings.min_topk_overlap
                             and report.unexplained_selections == 0)
        report.min_topk_overlap = report.min_topk_overlap if report.topk_overlap else None
        report.passed = report.passed and all(e.passed for e in report.errors)


def _require_bf16_provider() -> None:
    import onnxruntime

    if not set(onnxruntime.get_available_providers()) - {"CPUExecutionProvider", "AzureExecutionProvider"}:
        raise DSAUserError(
            "ONNX Runtime's CPU provider has no bf16 kernels, so a bf16 file cannot be validated here; "
            "validate the fp32 or fp16 export, or the TensorRT engine built from this file."
        )


def _selection_lengths(feed: dict, ours: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """Per row, the keys a query may see, and the position of the first query (a decode step's
    queries follow the cached keys: query s is key past + s)."""
    lengths = (feed["attention_mask"].sum(-1) if "attention_mask" in feed
               else np.full(ours[0].shape[0] if ours else 0, ours[0].shape[1] if ours else 0))
    past = int(feed["attention_mask"].shape[1]) - int(ours[0].shape[1]) if ours and "attention_mask" in feed else 0
    if "query_start" in feed:  # a paged call: every row's queries start at one position
        starts = np.asarray(feed["query_start"])
        if starts.size and (starts != starts.flat[0]).any():
            raise DSAUserError("validating a paged graph needs rows that start at one position "
                               "(query_start); give equal query_start values.")
        past = int(starts.flat[0]) if starts.size else 0
        lengths = starts + np.asarray(feed["query_lengths"])
    return lengths, past


def _aligned(mask: np.ndarray, shape: tuple[int, ...], past: int, feed: dict | None = None) -> np.ndarray | None:
    """The ``[B,S]`` query mask on an output's first two axes: queries (``[B,S,...]``) or, for a
    decode step's ``present_*`` caches (``[B,past+S,...]``), the positions after the past; for a
    paged call's pools (``[pages, page, ...]``), the rows the masked queries were written to."""
    if feed is not None and "block_table" in feed and len(shape) >= 2 and shape[1] != mask.shape[1]:
        return _pool_mask(mask, shape, past, np.asarray(feed["block_table"]))
    if len(shape) < 2 or shape[0] != mask.shape[0]:
        return None
    if shape[1] == mask.shape[1]:
        return mask
    if past and shape[1] == past + mask.shape[1]:
        return np.concatenate([np.zeros((mask.shape[0], past), dtype=bool), mask], axis=1)
    return None


def _pool_mask(mask: np.ndarray, shape: tuple[int, ...], past: int, table: np.ndarray) -> np.ndarray | None:
    """``[pages, page]`` rows of a paged pool written by the masked ``[B,S]`` queries (query ``s``
    of row ``b`` sits at logical position ``past + s``)."""
    pages, page = shape[0], shape[1]
    out = np.zeros((pages, page), dtype=bool)
    for b, s in zip(*np.nonzero(mask)):
        position = past + int(s)
        block = position // page
        if block < table.shape[1] and 0 <= table[b, block] < pages:
            out[table[b, block], position % page] = True
    return out


def _exclude_positions(expected, actual, name: str, mask: np.ndarray, past: int = 0, feed: dict | None = None) -> None:
    """Copy the reference into ``actual`` at the excluded ``[B,S]`` positions (Polygraphy then
    judges the rest); the report counts what was left out."""
    ref, out = np.asarray(expected[name]), np.array(actual[name])
    aligned = _aligned(mask, out.shape, past, feed)
    if aligned is not None:
        out[aligned] = ref[aligned].astype(out.dtype)
        actual[name] = out


def _within(diff: np.ndarray, rel: np.ndarray, ref: np.ndarray, atol: float, rtol: float, stat: str) -> bool:
    if stat == "elemwise":
        return bool(np.all(diff <= atol + rtol * np.abs(ref)))
    reduce = {"max": np.max, "mean": np.mean, "median": np.median}[stat]
    return bool(reduce(diff) <= atol or reduce(rel) <= rtol)


def selection_outputs(model: onnx.ModelProto) -> set[str]:
    """Graph outputs that carry DSAIndexerTopK selections (directly or through Identity/Cast)."""
    producers = {out: node for node in model.graph.node for out in node.output}
    found = set()
    for output in model.graph.output:
        node = producers.get(output.name)
        while node is not None and node.op_type in ("Identity", "Cast") and node.domain in ("", "ai.onnx"):
            node = producers.get(node.input[0])
        if node is not None and node.domain == "dsa" and node.op_type in INDEXER_OPS:
            found.add(output.name)
    return found


def canonicalize_selections(results, names: set[str]) -> None:
    """Sort selection rows in place: their order is unspecified by the op contract (sets compare)."""
    for _, iterations in results:
        for outputs in iterations:
            for name in names & set(outputs.keys()):
                outputs[name] = np.sort(np.asarray(outputs[name]), axis=-1)


def _to_numpy(tensor, dtype: str, declared: str | None = None) -> np.ndarray:
    """``tensor`` as the input's declared float type (an FP8 cache's float32 scale pools keep
    theirs), else the file's; bf16 needs ml_dtypes via float32."""
    import torch

    if tensor.is_floating_point():
        wanted = {"float32": torch.float32, "float16": torch.float16}.get(declared or "")
        tensor = tensor.to(wanted or {"fp32": torch.float32, "fp16": torch.float16}.get(dtype, torch.float32))
    return tensor.detach().cpu().numpy()
