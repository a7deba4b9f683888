"""Compare an exported ONNX file with the torch model it came from.

Polygraphy's ``Comparator`` runs our :class:`TorchRunner` and an ONNX Runtime runner on the same
inputs (one batch per sequence length) and judges each output with ``CompareFunc.simple``
(``|a - b| <= atol + rtol * |b|`` elementwise); we add a per-output table of max / median
absolute and max relative error for the report.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx

from dsa_export.errors import DSAUserError
from dsa_export.export.exporter import META_CONFIG, META_FILE_SHA, META_SETTINGS, META_SPEC
from dsa_export.runtime.onnxrt import polygraphy_runner
from dsa_export.runtime.torch_runner import TorchRunner, metadata_from_onnx

log = logging.getLogger(__name__)

#: Default (atol, rtol, error statistic) per exported dtype. The reference always runs in fp32.
#: fp32 files must match elementwise (the core acceptance bar). In fp16/bf16 a rounding difference
#: in an indexer score can swap which key is selected near the k-th place, which moves single
#: logits by O(0.1) while the bulk stays close, so low precision is judged on the median error.
DEFAULT_TOLERANCES = {"fp32": (1e-4, 1e-4, "elemwise"), "fp16": (1e-2, 1e-2, "median"), "bf16": (5e-2, 5e-2, "median")}
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


@dataclass
class OutputError:
    seq_len: int
    output: str
    max_abs: float
    median_abs: float
    max_rel: float
    passed: bool


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
    passed: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def table(self) -> str:
        header = f"{'seq_len':>7}  {'output':<16} {'max_abs':>10} {'median_abs':>10} {'max_rel':>10}  result"
        rows = [
            f"{e.seq_len:>7}  {e.output:<16} {e.max_abs:>10.3e} {e.median_abs:>10.3e} {e.max_rel:>10.3e}  "
            f"{'PASS' if e.passed else 'FAIL'}"
            for e in self.errors
        ]
        for seq_len, layers in self.topk_overlap.items():
            cells = ", ".join(f"L{layer}: {value:.4f}" for layer, value in layers.items())
            rows.append(f"{seq_len:>7}  top-k overlap with transformers ({cells})")
        verdict = "PASSED" if self.passed else "FAILED"
        return "\n".join([header, *rows, f"{verdict}: {self.runners[1]} vs {self.runners[0]} "
                          f"({self.error_stat} error within atol={self.atol:g}/rtol={self.rtol:g}, {self.dtype} file, "
                          "fp32 reference)"])


def _reference_source(meta: dict[str, str], settings: ValidationSettings, path: Path):
    from dsa_export.sources import resolve

    spec = settings.reference or meta.get(META_SPEC)
    recorded = meta.get(META_SPEC, "")
    if settings.reference and recorded.startswith("hf:") and Path(settings.reference).is_dir():
        # A checkpoint directory given by hand: rebuild the graph the file was exported as.
        from dsa_export.hf.source import format_spec, parse_spec

        _, graph, layers, fp8 = parse_spec(recorded)
        spec = format_spec(settings.reference, graph, layers, fp8)
    if not spec:
        raise DSAUserError(f"'{path}' records no reference model; pass one with --reference MODEL.")
    source = resolve(spec, batch=settings.batch, seq_len=max(2, settings.seq_lens[0]), seed=settings.seed)
    if settings.reference is None and META_CONFIG in meta and source.config is not None:
        if json.loads(meta[META_CONFIG]) != json.loads(json.dumps(source.config, sort_keys=True, default=str)):
            raise DSAUserError(
                f"the reference '{spec}' no longer matches the config recorded in '{path}'; "
                "re-export the model or pass --reference."
            )
    if META_FILE_SHA in meta and source.file_sha256 and meta[META_FILE_SHA] != source.file_sha256:
        log.warning("the reference file %s changed since export; comparing against its current code", spec)
    return source


def validate_onnx(path: str | Path, settings: ValidationSettings = ValidationSettings()) -> ValidationReport:
    """Run torch and ONNX Runtime on the same inputs through Polygraphy and judge every output."""
    import torch
    from polygraphy.comparator import Comparator, SimpleCompareFunc
    from polygraphy.logger import G_LOGGER

    from dsa_export.onnx_files import load_graph, metadata

    path = Path(path)
    model = load_graph(path)
    meta = metadata(model)
    dtype = json.loads(meta.get(META_SETTINGS, "{}")).get("dtype", "fp32")
    default_atol, default_rtol, default_stat = DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES["fp32"])
    atol = default_atol if settings.atol is None else settings.atol
    rtol = default_rtol if settings.rtol is None else settings.rtol
    error_stat = settings.error_stat or default_stat
    if error_stat not in ERROR_STATS:
        raise DSAUserError(f"error statistic '{error_stat}' is unknown; use one of {', '.join(ERROR_STATS)}.")

    source = _reference_source(meta, settings, path)
    source.module.to(torch.float32)  # the reference is the fp32 model, whatever the file's dtype
    output_names = [o.name for o in model.graph.output]
    onnx_inputs = [i.name for i in model.graph.input]
    feeds = []
    for seq_len in settings.seq_lens:
        inputs = source.inputs_for(settings.batch, seq_len, settings.seed)
        missing = sorted(set(onnx_inputs) - set(inputs))
        if missing:
            raise DSAUserError(f"the reference gives no value for ONNX input(s) {missing}; pass the matching --reference.")
        feeds.append({name: _to_numpy(inputs[name], dtype) for name in onnx_inputs})

    reference = source.reference_module or source.module
    reference_name = "transformers" if source.reference_module is not None else "torch"
    torch_runner = TorchRunner(reference, metadata_from_onnx(model), output_names, name=reference_name,
                               input_order=source.input_names)
    if dtype == "bf16":
        import onnxruntime

        if not set(onnxruntime.get_available_providers()) - {"CPUExecutionProvider", "AzureExecutionProvider"}:
            raise DSAUserError(
                "ONNX Runtime's CPU provider has no bf16 kernels, so a bf16 file cannot be validated here; "
                "validate the fp32 or fp16 export, or the TensorRT engine built from this file."
            )
    ort_runner = polygraphy_runner(path, name="onnxruntime")
    previous = G_LOGGER.module_severity
    G_LOGGER.module_severity = G_LOGGER.ERROR
    try:
        results = Comparator.run([torch_runner, ort_runner], data_loader=feeds)
        canonicalize_selections(results, selection_outputs(model))
        compare = SimpleCompareFunc(atol=atol, rtol=rtol, check_error_stat=error_stat)
        verdict = Comparator.compare_accuracy(results, compare_func=compare)
    finally:
        G_LOGGER.module_severity = previous
    report = ValidationReport(
        model=str(path), reference=source.spec, dtype=dtype, atol=atol, rtol=rtol, error_stat=error_stat,
        runners=[reference_name, "onnxruntime"], passed=bool(verdict),
    )
    (_, torch_iters), (_, ort_iters) = results[0], results[1]
    for seq_len, expected, actual in zip(settings.seq_lens, torch_iters, ort_iters):
        for name in output_names:
            ref = np.asarray(expected[name], dtype=np.float64)
            out = np.asarray(actual[name], dtype=np.float64)
            diff = np.abs(out - ref)
            rel = diff / np.maximum(np.abs(ref), 1e-12)
            report.errors.append(OutputError(
                seq_len=seq_len, output=name, max_abs=float(diff.max()), median_abs=float(np.median(diff)),
                max_rel=float(rel.max()), passed=_within(diff, rel, ref, atol, rtol, error_stat),
            ))
    if source.reference_module is not None and source.spec.startswith("hf:"):
        # A transformers reference: compare the indexers' selections too.
        from dsa_export.hf.overlap import topk_overlap

        transformers_model = source.reference_module.model

        for seq_len, feed in zip(settings.seq_lens, feeds):
            tensors = {k: torch.from_numpy(v) for k, v in feed.items()}
            report.topk_overlap[seq_len] = topk_overlap(path, transformers_model, tensors)
        report.min_topk_overlap = min(v for layers in report.topk_overlap.values() for v in layers.values())
        report.passed = report.passed and report.min_topk_overlap >= settings.min_topk_overlap
    report.passed = report.passed and all(e.passed for e in report.errors)
    return report


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
        if node is not None and node.domain == "dsa" and node.op_type == "DSAIndexerTopK":
            found.add(output.name)
    return found


def canonicalize_selections(results, names: set[str]) -> None:
    """Sort selection rows in place: their order is unspecified by the op contract (sets compare)."""
    for _, iterations in results:
        for outputs in iterations:
            for name in names & set(outputs.keys()):
                outputs[name] = np.sort(np.asarray(outputs[name]), axis=-1)


def _to_numpy(tensor, dtype: str) -> np.ndarray:
    import torch

    if tensor.is_floating_point():
        # Feed ONNX Runtime the file's float type; bf16 needs ml_dtypes via float32.
        tensor = tensor.to({"fp32": torch.float32, "fp16": torch.float16}.get(dtype, torch.float32))
    return tensor.detach().cpu().numpy()
