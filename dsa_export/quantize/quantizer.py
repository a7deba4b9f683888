"""``quantize()``: calibrate an exported fp32 file and write its explicit Q/DQ form.

Stages, each testable alone: recipe -> placement (:mod:`.qdq`) -> data (:mod:`.calibrate`) ->
ranges (ONNX Runtime's calibrators) -> Q/DQ graph -> accuracy report (:mod:`.report`) -> files.
Everything is computed before anything is written, so bad data or a failed step leaves no output.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

import dsa_export.quantize.cache as trt_cache
from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.fileio import atomic_output
from dsa_export.onnx_files import (
    META_CONFIG,
    META_INDEXER_SCALES,
    META_MOE,
    META_OPS,
    META_QUANT,
    META_SPEC,
)
from dsa_export.ops.contract import DOMAIN, SELECTION_CONSUMERS
from dsa_export.quantize.calibrate import Feed, check_feeds, collect_amax, input_specs, load_feeds
from dsa_export.quantize.experts import expert_forms, experts_table
from dsa_export.quantize.formats import get_precision
from dsa_export.quantize.fp8 import E4M3_MAX
from dsa_export.quantize.qdq import DynamicForm, Placement, insert_qdq, plan
from dsa_export.quantize.recipe import DEFAULTS, Recipe, find_recipe, load_recipe
from dsa_export.quantize.report import AccuracyReport, Thresholds, accuracy_report

log = logging.getLogger(__name__)

BUILTIN_DATA = "builtin"


@dataclass(frozen=True)
class QuantizeSettings:
    """What ``calibrate`` was asked; ``None`` takes the recipe's value (then :data:`DEFAULTS`).

    Attributes:
        precision, method, samples, percentile, quantize_indexer, keep_indexer_projections, experts,
            fp8_activations, fp8_weights, indexer_hadamard: override the recipe.
        exclude: extra fnmatch patterns of nodes kept in high precision (added to the recipe's).
        data: a folder of .npz/.npy files, a Polygraphy data-loader script (``file.py[:func]``), or
            ``builtin`` for the recipe's bundled data.
        recipe: a recipe file; ``None`` picks the bundled one matching the file's metadata.
        from_cache: a TensorRT calibration cache whose scales replace calibration (INT8 only).
        report: compute the accuracy report (needs held-out inputs).
        progress: show a progress bar while calibrating.
    """

    precision: str | None = None
    method: str | None = None
    data: str | None = None
    samples: int | None = None
    percentile: float | None = None
    exclude: tuple[str, ...] = ()
    quantize_indexer: bool | None = None
    keep_indexer_projections: bool | None = None
    experts: str | None = None
    fp8_activations: str | None = None
    fp8_weights: str | None = None
    indexer_hadamard: bool | None = None
    recipe: str | None = None
    from_cache: str | None = None
    report: bool = True
    progress: bool = False


@dataclass
class QuantizeResult:
    model: onnx.ModelProto
    recipe: Recipe
    placement: Placement
    activation_scales: dict[str, np.float32]
    amax: dict[str, float] = field(default_factory=dict)
    indexer_scales: dict[str, dict] = field(default_factory=dict)
    report: AccuracyReport | None = None
    calibration_samples: int = 0
    #: per routed-experts node: its weight form, router and input range (``dsa_export.moe_experts``)
    experts: dict[str, dict] = field(default_factory=dict)

    def cache(self, trt_version: str = trt_cache.DEFAULT_TRT_VERSION) -> trt_cache.CalibrationCache:
        """The TensorRT 10 INT8 cache of every activation that carries Q/DQ."""
        if self.recipe.precision != "int8":
            raise DSAUsageError("TensorRT calibration caches hold INT8 scales; use --precision int8 with --cache.")
        return trt_cache.CalibrationCache(
            scales={k: np.float32(v) for k, v in self.activation_scales.items()},
            version=trt_cache.version_number(trt_version),
        )


def _metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def _set_metadata(model: onnx.ModelProto, key: str, value: str) -> None:
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    model.metadata_props.add(key=key, value=value)


def resolve_recipe(model: onnx.ModelProto, settings: QuantizeSettings) -> Recipe:
    meta = _metadata(model)
    if settings.recipe:
        recipe = load_recipe(settings.recipe)
    else:
        model_type = None
        if META_CONFIG in meta:
            try:
                model_type = json.loads(meta[META_CONFIG]).get("model_type")
            except (json.JSONDecodeError, AttributeError):
                model_type = None
        from dsa_export.model_ref import from_metadata

        recorded = from_metadata(meta.get(META_SPEC), None)
        recipe = find_recipe(recorded.describe() if recorded is not None else None, model_type)
    overrides = {
        key: value for key, value in (
            ("precision", settings.precision), ("method", settings.method), ("samples", settings.samples),
            ("percentile", settings.percentile), ("quantize_indexer", settings.quantize_indexer),
            ("keep_indexer_projections", settings.keep_indexer_projections), ("experts", settings.experts),
            ("fp8_activations", settings.fp8_activations), ("fp8_weights", settings.fp8_weights),
            ("indexer_hadamard", settings.indexer_hadamard),
        ) if value is not None
    }
    if settings.exclude:
        overrides["exclude"] = recipe.exclude + tuple(settings.exclude)
    resolved = replace(recipe, **overrides).check()
    if resolved.precision != "fp8" and (settings.fp8_activations == "dynamic" or settings.fp8_weights == "block"):
        raise DSAUsageError(f"--fp8-activations dynamic and --fp8-weights block apply to FP8, and this calibration is "
                            f"{resolved.precision}; add --precision fp8 or drop them.")
    return resolved


def _load_model(path: Path) -> onnx.ModelProto:
    from dsa_export.ops.onnx_ops import register_schemas

    register_schemas()
    if not path.is_file():
        raise DSAUserError(f"'{path}' does not exist; pass an exported .onnx file.")
    from dsa_export.integrity import check_external_data

    try:
        check_external_data(path, remedy="export the model again")
        model = onnx.load(str(path))
    except DSAUserError:
        raise
    except Exception as exc:
        raise DSAUserError(f"'{path}' is not a readable ONNX file ({type(exc).__name__}).") from exc
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear", "TRT_DynamicQuantize") for n in model.graph.node):
        raise DSAUserError(f"'{path}' already holds Q/DQ nodes; calibrate the fp32 export instead.")
    return model


def _data(settings: QuantizeSettings, recipe: Recipe, model: onnx.ModelProto) -> tuple[list[Feed], list[str]]:
    specs = input_specs(model)
    source = settings.data
    if source == BUILTIN_DATA:
        from dsa_export.quantize.recipe import CALIBRATION_DIR

        if recipe.data_dir is None and not CALIBRATION_DIR.is_dir():
            raise DSAUserError(
                f"the bundled recipes and data ({CALIBRATION_DIR}) come with a source checkout and are not "
                "installed here; pass --data DIR."
            )
        if recipe.data_dir is None:
            raise DSAUserError(
                f"recipe '{recipe.name}' bundles no calibration data; pass --data DIR (a folder of .npz/.npy files)."
            )
        if not recipe.data_dir.is_dir():
            raise DSAUserError(f"the bundled calibration data '{recipe.data_dir}' is missing; pass --data DIR.")
        source = str(recipe.data_dir)
    feeds, labels = load_feeds(source, specs)
    check_feeds(feeds, labels, specs)
    return feeds, labels


def _generated_eval_inputs(model: onnx.ModelProto, recipe: Recipe, folder: Path) -> tuple[list[Feed], list[str]]:
    from dsa_export.model_ref import from_metadata
    from dsa_export.sources import resolve

    reference = from_metadata(_metadata(model).get(META_SPEC), folder)
    if reference is None:
        return [], []
    spec = reference.describe()
    ev = recipe.eval_inputs
    try:
        source = resolve(reference, batch=ev.batch, seq_len=ev.seq_lens[0], seed=ev.seed)
    except DSAUserError as exc:  # e.g. a reference this installation cannot rebuild
        log.warning("cannot generate held-out inputs from '%s' (%s)", spec, exc)
        return [], []
    names = [s.name for s in input_specs(model)]
    feeds, labels = [], []
    seq_lens = _eval_lengths(model, ev.seq_lens)
    for i, seq_len in enumerate(seq_lens):
        inputs = source.inputs_for(ev.batch, seq_len, ev.seed + i)
        if not set(names) <= set(inputs):
            return [], []
        feeds.append({n: inputs[n].detach().cpu().numpy() for n in names})
        labels.append(f"{spec} batch {ev.batch} seq {seq_len} seed {ev.seed + i}")
    return feeds, labels


def _eval_lengths(model: onnx.ModelProto, seq_lens: tuple[int, ...]) -> tuple[int, ...]:
    """``seq_lens``, plus one a quarter past the indexer's top-k when none exceeds it: below it the
    indexer selects every key and the top-k overlap is 1 whatever the quantization does."""
    try:
        topk = int(json.loads(_metadata(model).get(META_CONFIG, "{}")).get("index_topk") or 0)
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        topk = 0
    if topk and max(seq_lens, default=0) <= topk:
        return (*seq_lens, topk + max(16, topk // 4))
    return tuple(seq_lens)


def indexer_scale_table(placement: Placement, amax: dict[str, float]) -> dict[str, dict]:
    """The indexer q/k ranges in the form recorded as ``dsa_export.indexer_scales``."""
    table = {}
    for ix in placement.indexers:
        entry = {}
        for role, tensor in (("q", ix.q), ("k", ix.k)):
            if tensor not in amax:
                continue
            a = float(amax[tensor])
            fp8 = a / E4M3_MAX if a > 0 else 1.0
            entry[role] = {
                "tensor": tensor, "amax": a,
                "int8_scale": float(np.float32(a / 127.0 if a > 0 else 1.0)),
                "fp8_e4m3_scale": float(np.float32(fp8)),
                # DeepSeek-V3.2 rounds FP8 scales up to a power of two.
                "fp8_e4m3_scale_pow2": float(2.0 ** math.ceil(math.log2(fp8))),
            }
        table[ix.node] = entry
    return table


def _check_indexer_qdq_opset(model: onnx.ModelProto, recipe: Recipe, placement: Placement, indexer_qdq: bool) -> None:
    """Refuse INT8 Q/DQ on the indexer's inputs in a file that ends up at opset 21 or later.

    Measured with ONNX Runtime 1.32: its QDQ propagation moves an int8 ``QuantizeLinear`` ->
    ``DequantizeLinear`` pair across the ``Reshape`` / ``Transpose`` inside the inlined indexer
    body and, from opset 21 on, writes a QuantizeLinear whose ``output_dtype`` (INT8) contradicts
    its zero point (UINT8), so the session does not load (2-D weights and the INT8 expert stacks,
    dequantized from initializers, are not affected). FP8 experts raise a file to opset 21.
    """
    from dsa_export.quantize.graph import opset_of

    if not indexer_qdq or recipe.precision != "int8":
        return
    fp8_experts = bool(placement.experts) and recipe.experts_mode == "fp8"
    if opset_of(model) >= 21 or fp8_experts:
        cause = "FP8 experts make the file opset 21" if fp8_experts else f"the file is opset {opset_of(model)}"
        raise DSAUserError(
            f"INT8 Q/DQ on the indexer's q/k (--quantize-indexer) cannot run in ONNX Runtime at opset 21 or later "
            f"(its QDQ propagation breaks the int8 pair inside the indexer body) and {cause}; drop "
            "--quantize-indexer, or keep the experts out of FP8 (--experts int8 or keep)."
        )


def no_indexer_message(model: onnx.ModelProto, path: str | Path) -> str:
    """Why a file without DSAIndexerTopK nodes gets no indexer placement and no top-k overlap.

    A plugin-mode file of a pattern model (block, predictor, lsh, static) selects its keys another
    way, and that is no fault of the file; a file without any ``dsa`` node may be a native export,
    whose plugin-mode twin would let calibration find the indexers.
    """
    counts: dict[str, int] = {}
    for node in model.graph.node:
        # Without an indexer, the dsa nodes that attend to a selection got it another way (block
        # lists from pooled scores or a predictor, LSH buckets, a static pattern stored as a constant).
        if node.domain == DOMAIN and node.op_type in SELECTION_CONSUMERS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    if counts:
        nodes = ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
        return (f"'{path}' selects its keys without a lightning indexer (no DSAIndexerTopK node; {nodes} attend to "
                "block lists or key indices made by standard ops or stored as constants), so there is no indexer "
                "to keep in high precision and no top-k overlap to measure: the report compares outputs only.")
    return (f"'{path}' has no dsa::DSAIndexerTopK nodes, so the indexer's head weights cannot be told apart and no "
            "top-k overlap is measured; calibrate the plugin-mode export for DSA-aware placement.")


def _placement_text(recipe: Recipe) -> str:
    if recipe.dynamic:
        weights = ("one scale per square block" if recipe.fp8_weights == "block" else "per-channel") + " symmetric"
        return (f"FP8 weights {weights}, activations dynamic (one scale per token and block of channels, computed at "
                "run time: trt::TRT_DynamicQuantize + trt::TRT_BlockDequantize), MatMul/Gemm inputs only; routed "
                "experts weight-only, per expert (see dsa_export.moe_experts)")
    return ("weights per-channel symmetric, activations per-tensor symmetric, MatMul/Gemm inputs only; "
            "routed experts weight-only, per expert (see dsa_export.moe_experts)")


def _activation_block(model: onnx.ModelProto) -> int | None:
    from onnx import helper

    for node in model.graph.node:
        if node.op_type == "TRT_DynamicQuantize":
            return int(next(helper.get_attribute_value(a) for a in node.attribute if a.name == "block_shape")[-1])
    return None


def quantize(path: str | Path, settings: QuantizeSettings = QuantizeSettings()) -> QuantizeResult:
    """Calibrate ``path`` (an fp32 export, plugin or native) and return its Q/DQ model and report."""
    path = Path(path)
    model = _load_model(path)
    recipe = resolve_recipe(model, settings)
    precision = get_precision(recipe.precision)
    placement = plan(model, recipe.op_types, recipe.exclude, recipe.keep_indexer_projections,
                     quantize_experts=recipe.experts_mode != "keep")
    if not placement.indexers:
        log.warning(no_indexer_message(model, path))
    if not placement.targets and not placement.experts:
        raise DSAUserError(f"'{path}' has no {'/'.join(recipe.op_types)} with a weight initializer left to quantize.")

    extra: dict[str, list[int]] = {}
    if recipe.quantize_indexer:
        by_node = {ix.node: ix for ix in placement.indexers}
        for i, node in enumerate(model.graph.node):
            ix = by_node.get(node.name or f"{node.op_type}_{i}")
            for tensor in (ix.q, ix.k) if ix is not None else ():
                if tensor:  # an FP8 indexer's keys are quantized already (no k)
                    extra.setdefault(tensor, []).append(i)
    _check_indexer_qdq_opset(model, recipe, placement, bool(extra))

    feeds: list[Feed] = []
    labels: list[str] = []
    if settings.data is not None:
        feeds, labels = _data(settings, recipe, model)
    # Scales from a cache need no calibration data, so all of it can be held out.
    first_held_out = 0 if settings.from_cache else recipe.samples
    calib_feeds = [] if settings.from_cache else feeds[: recipe.samples]
    held_out = feeds[first_held_out : first_held_out + recipe.eval_samples]
    held_labels = labels[first_held_out : first_held_out + recipe.eval_samples]

    amax: dict[str, float] = {}
    if settings.from_cache:
        if recipe.precision != "int8":
            raise DSAUsageError("a TensorRT calibration cache holds INT8 scales; use --precision int8 with --from-cache.")
        cache = trt_cache.read_cache(settings.from_cache)
        needed = sorted({*placement.activations, *extra})
        missing = [n for n in needed if n not in cache.scales]
        if missing:
            raise DSAUserError(
                f"the cache '{settings.from_cache}' has no scale for {len(missing)} tensor(s) of this model "
                f"(first: '{missing[0]}'); it was made for another file."
            )
        scales = {n: np.float32(cache.scales[n]) for n in needed}
        for name in placement.indexer_activations:
            if name in cache.scales:
                amax[name] = float(cache.scales[name]) * 127.0
        calibration_samples = 0
    else:
        if not calib_feeds:
            raise DSAUserError("calibration needs data; pass --data DIR, a data-loader script, or --data builtin.")
        # The experts' inputs are observed to be recorded (weight-only: they get no Q/DQ). Dynamic
        # activations need no ranges: only the indexer's and the experts' inputs are recorded.
        static = () if recipe.dynamic else (*placement.activations, *extra)
        tensors = sorted({*static, *placement.indexer_activations, *(t.x for t in placement.experts)})
        amax = collect_amax(path, calib_feeds, tensors, recipe.method, recipe.percentile, recipe.num_bins,
                            progress=settings.progress)
        scales = {n: precision.scale(amax[n])[()] for n in sorted(set(static))}
        calibration_samples = len(calib_feeds)

    dynamic = None
    if recipe.dynamic:
        dynamic = DynamicForm(
            activation_block=recipe.activation_block,
            weight_block_size=recipe.weight_block_size if recipe.fp8_weights == "block" else None,
            weight_scale_pow2=recipe.weight_scale_pow2,
            hadamard=tuple(sorted(extra)) if recipe.indexer_hadamard else (),
        )
    experts_precision = get_precision(recipe.experts_mode) if placement.experts else precision
    qmodel = insert_qdq(model, placement, scales, precision, extra, experts_precision, recipe.expert_block_size,
                        recipe.expert_scale_pow2, dynamic=dynamic)
    indexer_scales = indexer_scale_table(placement, amax)
    _set_metadata(qmodel, META_INDEXER_SCALES, json.dumps(indexer_scales, sort_keys=True))
    experts = experts_table(placement.moe, expert_forms(qmodel, placement.experts, recipe.expert_scale_pow2), amax,
                            {"int8": 127.0, "fp8_e4m3": E4M3_MAX})
    if placement.moe.routing:
        _set_metadata(qmodel, META_MOE, json.dumps(experts, sort_keys=True))
        used = sorted({n.op_type for n in qmodel.graph.node if n.domain == "dsa"})
        _set_metadata(qmodel, META_OPS, json.dumps({name: 1 for name in used}))
    _set_metadata(qmodel, META_QUANT, json.dumps({
        "precision": recipe.precision,
        "method": "trt-cache" if settings.from_cache else "dynamic" if recipe.dynamic else recipe.method,
        "percentile": recipe.percentile if recipe.method == "percentile" else None,
        "recipe": recipe.name,
        "calibration_samples": calibration_samples,
        "quantized_nodes": [t.node for t in placement.targets],
        "high_precision_nodes": placement.skipped,
        "quantize_indexer": recipe.quantize_indexer,
        "keep_indexer_projections": recipe.keep_indexer_projections,
        "quantized_experts": [t.node for t in placement.experts],
        "experts": recipe.experts_mode if placement.experts else None,
        "fp8_activations": recipe.fp8_activations if recipe.precision == "fp8" else None,
        "activation_block": _activation_block(qmodel) if recipe.dynamic else None,
        "fp8_weights": recipe.fp8_weights if recipe.dynamic else None,
        "indexer_hadamard": bool(dynamic and dynamic.hadamard),
        "placement": _placement_text(recipe),
    }, sort_keys=True))
    try:
        onnx.checker.check_model(qmodel, full_check=True)
    except Exception as exc:  # a bug in the rewrite, not in the user's file
        raise RuntimeError(f"the Q/DQ model fails onnx.checker: {exc}") from exc

    report = None
    if settings.report:
        if not held_out:
            held_out, held_labels = _generated_eval_inputs(model, recipe, path.resolve().parent)
        if held_out:
            report = accuracy_report(
                model, qmodel, held_out, held_labels, model_name=str(path), precision=recipe.precision,
                method="trt-cache" if settings.from_cache else "dynamic" if recipe.dynamic else recipe.method,
                calibration_samples=calibration_samples, thresholds=recipe.thresholds,
            )
        else:
            log.warning("no held-out inputs (all data went to calibration and the file names no reference "
                        "model), so no accuracy report; give more samples than --samples.")
    return QuantizeResult(qmodel, recipe, placement, scales, amax, indexer_scales, report, calibration_samples,
                          experts)


def save(
    result: QuantizeResult,
    output: str | Path,
    *,
    cache: str | Path | None = None,
    report: str | Path | None = None,
    trt_version: str = trt_cache.DEFAULT_TRT_VERSION,
) -> None:
    """Write the Q/DQ model and, if asked, the TensorRT cache and report JSON (each atomically)."""
    cache_obj = result.cache(trt_version) if cache is not None else None
    if report is not None and result.report is None:
        raise DSAUserError("no accuracy report could be made (no held-out inputs); give more samples than --samples.")
    with atomic_output(output) as tmp:
        onnx.save(result.model, str(tmp))
    if cache_obj is not None:
        trt_cache.write_cache(cache_obj, cache)
    if report is not None:
        with atomic_output(report) as tmp:
            tmp.write_text(result.report.to_json() + "\n", encoding="utf-8")


__all__ = ["DEFAULTS", "QuantizeResult", "QuantizeSettings", "Thresholds", "quantize", "save"]
