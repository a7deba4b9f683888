"""The five steps of ``build``: export -> validate -> calibrate -> check -> engine.

Each step is a class with a ``name`` and ``run(ctx) -> StepResult``; what a step hands on to the
later steps and to the manifest is a typed field of :class:`BuildState` (``ctx.state``). The
build's ``model.onnx`` is read once, into a :class:`GraphSummary` that the validate, calibrate and
engine steps and the manifest share; a supplied .onnx is read once too, by the preflight checks,
and its summary is what the export step copies.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from dsa_export.artifact.backend_plan import BackendPlan
from dsa_export.artifact.output_folder import link_external_data
from dsa_export.artifact.settings import BuildSettings
from dsa_export.errors import DSAUserError, trace_errors
from dsa_export.fileio import atomic_output, sha256_file
from dsa_export.integrity import remember_hashes
from dsa_export.manifest import (
    CALIBRATION_CACHE_NAME,
    CALIBRATION_REPORT_NAME,
    ENGINE_NAME,
    ONNX_NAME,
    QDQ_NAME,
    TIMING_CACHE_NAME,
    VALIDATION_NAME,
    TensorSpec,
    io_specs,
)
from dsa_export.onnx_files import META_SETTINGS, META_SPEC

#: What the export step's first progress line says for a built-in model (measured: docs/build.md).
EXPORT_TIME_NOTE = "about 20-60 s for a built-in model on 2 CPU cores"
EXPORT_DTYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "int8": "fp32", "fp8": "fp32"}


@dataclass
class StepResult:
    status: str  # done | skipped
    detail: str


class GraphSummary:
    """One ``onnx.load`` of a graph (no external data) and what the build reads of it, each
    computed on first use: metadata, graph inputs/outputs, dynamic dims, dsa nodes, float type,
    and whether it is calibrated (Q/DQ)."""

    def __init__(self, model: Any):
        self.model = model

    @classmethod
    def load(cls, path: Path, what: str = "an exported .onnx file or a MODEL") -> GraphSummary:
        """The graph of a user-supplied .onnx, or a one-sentence error."""
        from dsa_export.onnx_files import load_graph

        return cls(load_graph(path, what))

    @cached_property
    def meta(self) -> dict[str, str]:
        return {p.key: p.value for p in self.model.metadata_props}

    @cached_property
    def io(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        return io_specs(self.model)

    @cached_property
    def dims(self) -> set[str]:
        """The dim names of the graph inputs (initializers aside)."""
        initializers = {i.name for i in self.model.graph.initializer}
        return {d.dim_param for v in self.model.graph.input if v.name not in initializers
                for d in v.type.tensor_type.shape.dim if d.dim_param}

    @cached_property
    def dsa_nodes(self) -> int:
        return sum(1 for n in self.model.graph.node if n.domain == "dsa")

    @cached_property
    def precision(self) -> str:
        from dsa_export.trt.tensorrt import file_precision

        return file_precision(self.model)

    @cached_property
    def calibrated(self) -> bool:
        from dsa_export.trt.tensorrt import is_calibrated

        return is_calibrated(self.model)

    @cached_property
    def export_dtype(self) -> str:
        return json.loads(self.meta.get(META_SETTINGS, "{}")).get("dtype", "fp32")


@dataclass
class BuildState:
    """What the steps hand on to the later steps and to the manifest."""

    engine_input: Path
    #: The build's model.onnx, from the export step on.
    graph: GraphSummary | None = None
    source: str | None = None
    validation: dict[str, Any] | None = None
    calibration: dict[str, Any] | None = None
    checks: dict[str, Any] | None = None
    profiles: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] | None = None
    onnxruntime: dict[str, Any] | None = None


@dataclass
class BuildContext:
    """Everything a step reads: the settings, the plan made before the first step, and the state."""

    settings: BuildSettings
    work: Path
    log: Callable[[str], None]
    probe: Any
    plan: BackendPlan
    precision: str
    #: compat reports per backend, computed before the first step
    reports: dict[str, Any]
    #: the resolved MODEL source (None for a supplied .onnx)
    source: Any
    #: the supplied .onnx as the preflight checks read it (None for a MODEL)
    supplied: GraphSummary | None
    state: BuildState

    @property
    def onnx_path(self) -> Path:
        return self.work / ONNX_NAME

    @property
    def graph(self) -> GraphSummary:
        assert self.state.graph is not None, "the export step runs first"
        return self.state.graph


def _write_hashed(work: Path, name: str, data: bytes) -> str:
    """Write ``data`` to ``work/name`` and return its sha256, hashed from memory and remembered in
    the folder's cache: the manifest's file records do not read a multi-GB engine back to hash it."""
    with atomic_output(work / name) as tmp:
        tmp.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    remember_hashes(work, {name: sha})
    return sha


def plugin_library(settings: BuildSettings, kind: str) -> tuple[Path | None, str | None, str | None]:
    """(path, sha256, reason when absent) of our plugin library of ``kind``."""
    from dsa_export.plugins import LIBRARY_NAMES, find_library, library_info

    if settings.plugin_library is not None:
        path = Path(settings.plugin_library)
        if not path.is_file():
            raise DSAUserError(f"--plugins {path} does not exist; pass the built libdsa_plugins.so.")
        if kind == "static" and path.name != LIBRARY_NAMES["static"]:
            sibling = path.with_name(LIBRARY_NAMES["static"])  # ONNX Runtime only dlopens: needs self-registration
            if not sibling.is_file():
                return None, None, f"no {LIBRARY_NAMES['static']} next to {path}"
            path = sibling
        return path.resolve(), library_info(path).sha256, None
    path = find_library(kind)  # type: ignore[arg-type]
    if path is None:
        return None, None, "not built (run `dsa-export plugins build`)"
    return path, library_info(path).sha256, None


# ---------------------------------------------------------------------------------------------
# 1. export


class ExportStep:
    name = "export"

    def run(self, ctx: BuildContext) -> StepResult:
        if ctx.settings.model_is_onnx:
            return self._copy_supplied(ctx)
        return self._export(ctx)

    def _copy_supplied(self, ctx: BuildContext) -> StepResult:
        s, precision = ctx.settings, ctx.precision
        src = Path(str(s.model))
        # preflight has read the file (ctx.supplied) and verified it against its record.
        # Calibration loads the weights with onnx.load, which refuses a data file with
        # several hard links: an int8/fp8 build copies them.
        linked = link_external_data(src, ctx.work, copy=precision in ("int8", "fp8"))
        from dsa_export.export.exporter import relocate_reference

        assert ctx.supplied is not None, "preflight reads a supplied file"
        copied = ctx.supplied.model
        if relocate_reference(copied, src.resolve().parent, s.output.resolve()):
            # The recorded reference path is relative to the file's folder: re-base it on
            # the build folder, or validation would look for the checkpoint elsewhere.
            import onnx

            with atomic_output(ctx.onnx_path) as tmp:
                onnx.save(copied, str(tmp))
        else:
            with atomic_output(ctx.onnx_path) as tmp:
                shutil.copyfile(src, tmp)
        ctx.state.graph = GraphSummary(copied)  # what model.onnx now holds
        ctx.state.source = str(src.resolve())
        how = "copied" if precision in ("int8", "fp8") else "hard-linked where possible"
        data = f" and its external data ({', '.join(linked)}, {how})" if linked else ""
        return StepResult("skipped", f"supplied {src.name}, copied to {ONNX_NAME}{data}")

    def _export(self, ctx: BuildContext) -> StepResult:
        import onnx

        from dsa_export.export import ExportSettings, export_model, save_model
        from dsa_export.quiet import third_party_output

        source = ctx.source
        export_settings = ExportSettings(ops="plugin", dtype=EXPORT_DTYPES[ctx.precision])
        began = time.perf_counter()

        def step(text: str) -> None:
            # The longest step of a demo build, and torch.export says nothing while it works.
            if text.startswith("tracing"):
                note = EXPORT_TIME_NOTE if source.spec.startswith("builtin:") else "the longest part"
            else:
                note = f"{time.perf_counter() - began:.0f} s so far"
            ctx.log(f"[{STEPS.index('export') + 1}/{len(STEPS)}] export: {text} ({note}) ...")

        with trace_errors(source.spec), third_party_output():
            model = export_model(source, export_settings, step=step)
        save_model(model, ctx.onnx_path)
        # The file as written (save_model may move weights to external data), read once for the build.
        ctx.state.graph = GraphSummary(onnx.load(str(ctx.onnx_path), load_external_data=False))
        ctx.state.source = source.spec
        return StepResult("done", f"{source.spec} -> {ONNX_NAME} (plugin ops, {ctx.graph.dsa_nodes} dsa nodes, "
                                  f"{export_settings.dtype})")


# ---------------------------------------------------------------------------------------------
# 2. validate


class ValidateStep:
    name = "validate"

    def run(self, ctx: BuildContext) -> StepResult:
        reason = self._skip_reason(ctx)
        if reason is not None:
            recorded, detail = reason
            ctx.state.validation = {"skipped": True, "reason": recorded}
            return StepResult("skipped", detail)
        return self._validate(ctx)

    def _skip_reason(self, ctx: BuildContext) -> tuple[str, str] | None:
        """(reason recorded in the manifest, detail shown) when validation does not run."""
        s, meta = ctx.settings, ctx.graph.meta
        dtype = ctx.graph.export_dtype
        if not s.validate:
            return "--no-validate", "--no-validate"
        if META_SPEC not in meta:
            return "the file records no torch reference", "the supplied file records no torch reference"
        if dtype == "bf16":
            return ("ONNX Runtime's CPU provider has no bf16 kernels",
                    "bf16: ONNX Runtime's CPU provider has no bf16 kernels")
        from dsa_export.model_ref import from_metadata

        # The copy's reference was re-based on the build folder by the export step.
        recorded = from_metadata(meta.get(META_SPEC), s.output.resolve()) if s.model_is_onnx else None
        if recorded is not None and recorded.kind in ("factory", "module"):
            # A supplied file names code as its reference: build does not run it (see sources.py).
            spec = recorded.describe()
            reason = (f"the file's reference is the Python factory {spec}, which build does not run from a file; "
                      f"validate it with `dsa-export validate FILE --reference {spec}`"
                      if recorded.kind == "factory" else f"the file's reference '{spec}' cannot be rebuilt")
            return reason, reason
        return None

    def _validate(self, ctx: BuildContext) -> StepResult:
        from dsa_export.validate import ValidationSettings, validate_onnx

        s = ctx.settings
        # The MODEL the user named (a factory in it is theirs to run); the exported module itself
        # may have been cast to the export's precision, and the reference runs in fp32.
        reference = None if s.model_is_onnx or s.model is None else str(s.model)
        report = validate_onnx(ctx.onnx_path, ValidationSettings(seq_lens=tuple(s.validation_seq_lens),
                                                                 reference=reference), model=ctx.graph.model)
        with atomic_output(ctx.work / VALIDATION_NAME) as tmp:
            tmp.write_text(report.to_json() + "\n", encoding="utf-8")
        worst = max(report.errors, key=lambda e: e.max_abs)
        ctx.state.validation = {
            "skipped": False, "report": VALIDATION_NAME, "passed": report.passed, "runners": report.runners,
            "reference": report.reference, "seq_lens": list(s.validation_seq_lens), "atol": report.atol,
            "rtol": report.rtol, "error_stat": report.error_stat, "max_abs": worst.max_abs,
        }
        if not report.passed:
            raise DSAUserError(
                f"Validation failed: ONNX Runtime differs from torch beyond atol={report.atol:g}/rtol={report.rtol:g} "
                f"(worst '{worst.output}' at seq_len {worst.seq_len}, max abs {worst.max_abs:.3e}); nothing was built."
            )
        return StepResult("done", (
            f"{report.runners[1]} vs {report.runners[0]} at seq {','.join(map(str, s.validation_seq_lens))}: "
            f"PASSED ({report.error_stat} within atol {report.atol:g}; max abs {worst.max_abs:.2e}) "
            f"-> {VALIDATION_NAME}"))


# ---------------------------------------------------------------------------------------------
# 3. calibrate


class CalibrateStep:
    name = "calibrate"

    def run(self, ctx: BuildContext) -> StepResult:
        precision = ctx.precision
        if precision not in ("int8", "fp8"):
            ctx.state.calibration = None
            return StepResult("skipped", f"{precision} needs no calibration")
        if ctx.graph.calibrated:  # FP8 checkpoint weights alone (DequantizeLinear) still need it
            ctx.state.calibration = {"supplied": True, "model": ONNX_NAME}
            return StepResult("skipped", "the supplied file already has Q/DQ nodes")
        from dsa_export.artifact.calibrate import calibrate as run_calibration

        outcome = run_calibration(
            ctx.onnx_path, ctx.work / QDQ_NAME, precision, data=ctx.settings.calibration_data,
            cache=ctx.work / CALIBRATION_CACHE_NAME, report=ctx.work / CALIBRATION_REPORT_NAME,
        )
        ctx.state.engine_input = outcome.model
        sha = sha256_file(outcome.model)
        remember_hashes(ctx.work, {QDQ_NAME: sha})  # the manifest's file records reuse it
        ctx.state.calibration = {
            **outcome.provenance, "model": QDQ_NAME, "model_sha256": sha,
            "cache": outcome.cache.name if outcome.cache else None,
            "report": outcome.report.name if outcome.report else None,
        }
        verdict = {True: "report passed", False: f"report FAILED (see {CALIBRATION_REPORT_NAME})", None: "no report"}
        return StepResult("done", f"{precision} Q/DQ -> {QDQ_NAME}; {verdict[outcome.provenance.get('report_passed')]}")


# ---------------------------------------------------------------------------------------------
# 4. check


class CheckStep:
    name = "check"

    def run(self, ctx: BuildContext) -> StepResult:
        from dsa_export.compat import manifest_record

        skip = ctx.settings.skip_checks
        records: dict[str, Any] = {}
        summary = []
        for backend, report in ctx.reports.items():
            records[backend] = manifest_record(None if skip else report, skipped=skip)
            records[backend]["blocking"] = [f.id for f in report.blocking]
            summary.append(f"{backend}: {'ok' if report.ok else 'blocked (ignored: --skip-checks)'}"
                           f" ({len(report.findings)} findings)")
        ctx.state.checks = records
        return StepResult("skipped" if skip else "done", "; ".join(summary))


# ---------------------------------------------------------------------------------------------
# 5. engine


class EngineStep:
    name = "engine"

    def run(self, ctx: BuildContext) -> StepResult:
        from dsa_export.trt.profiles import input_profiles

        s, plan, state = ctx.settings, ctx.plan, ctx.state
        engine_input = Path(state.engine_input)
        if engine_input == ctx.onnx_path:
            engine_model = ctx.graph.model
        else:  # the calibrated copy
            import onnx

            engine_model = onnx.load(str(engine_input), load_external_data=False)
        profiles = input_profiles(engine_model, s.ranges)
        state.profiles = profiles
        details = []
        if plan.engine == "tensorrt":
            state.engine = self._tensorrt_engine(ctx, engine_input)
            details.append(f"TensorRT {state.engine['trt_version']} -> {ENGINE_NAME}")
        elif plan.engine == "tensorrt-rtx":
            state.engine = self._rtx_engine(ctx, engine_input)
            details.append(f"TensorRT-RTX {state.engine['trt_version']} for {', '.join(plan.rtx_targets)} "
                           f"-> {ENGINE_NAME}")
        else:
            state.engine = None
        if plan.onnxruntime:
            from dsa_export.artifact.onnxrt import write_artifact

            lib, sha, reason = plugin_library(s, "static")
            state.onnxruntime = write_artifact(
                ctx.work, engine_input, precision=ctx.precision, profiles=profiles, plugin_library=lib,
                plugin_reason=reason, optimization=s.ort_optimization, optimization_level=s.optimization_level,
            )
            state.onnxruntime["plugin_library_sha256"] = sha
            optimized = state.onnxruntime["optimized_model"]
            details.append(f"ONNX Runtime -> {optimized or ONNX_NAME} + session.json")
        return StepResult("done", "; ".join(details))

    def _tensorrt_engine(self, ctx: BuildContext, onnx_path: Path) -> dict[str, Any]:
        from dsa_export.trt.tensorrt import TensorRTBuildSettings, build_engine

        s, work = ctx.settings, ctx.work
        lib, sha, reason = plugin_library(s, "plugin")
        previous = s.output / TIMING_CACHE_NAME
        cache_in = s.timing_cache if s.timing_cache is not None else (previous if previous.is_file() else None)
        result = build_engine(onnx_path, TensorRTBuildSettings(
            ranges=s.ranges, profiles=s.profiles, precision=ctx.precision, plugin_library=lib, timing_cache=cache_in,
            version_compatible=s.version_compatible, hardware_compatibility=s.hardware_compatibility,
            optimization_level=s.optimization_level,
        ))
        for warning in result.warnings:
            if "timing cache" in warning:
                ctx.log(f"Warning: {warning.removeprefix('WARNING: ')}")
        engine_sha = _write_hashed(work, ENGINE_NAME, result.engine)
        if result.timing_cache:
            with atomic_output(work / TIMING_CACHE_NAME) as tmp:
                tmp.write_bytes(result.timing_cache)
            if s.timing_cache is not None:
                with atomic_output(s.timing_cache) as tmp:
                    tmp.write_bytes(result.timing_cache)
        gpus = ctx.probe.gpus
        gpu = gpus[s.device] if s.device < len(gpus) else None
        notes = []
        if lib is None:
            notes.append(f"plugin library {reason}; the dsa nodes were built from their function bodies")
        elif result.dsa_nodes:
            notes.append(f"the engine inspector shows {result.plugin_layers} plugin layers for the "
                         f"{result.dsa_nodes} dsa nodes (the parser was given the file without their function bodies)")
        if cache_in and not result.timing_cache_reused:
            notes.append(f"the timing cache {cache_in} was not reused (TensorRT rejected it); a fresh one was written")
        return {
            "file": ENGINE_NAME,
            "sha256": engine_sha,
            "backend": "tensorrt",
            "trt_version": result.version,
            "compute_capability": [gpu.compute_capability] if gpu and gpu.compute_capability else [],
            "hardware_compatibility": s.hardware_compatibility,
            "version_compatible": s.version_compatible,
            "plugin_library_sha256": sha if result.plugin_layers else None,
            "plugin_library": str(lib) if lib else None,
            "uses_plugins": bool(result.plugin_layers),
            "plugin_layers": result.plugin_layers,
            "dsa_nodes": result.dsa_nodes,
            "plugins_serialized": result.plugins_serialized,
            "strongly_typed": result.strongly_typed,
            "builder_flags": result.builder_flags,
            "in_place_pools": result.in_place_pools,  # present pools written in place (DSAPagedCacheWrite)
            "optimization_level": s.optimization_level,
            "timing_cache": TIMING_CACHE_NAME if result.timing_cache else None,
            "timing_cache_reused": str(cache_in) if cache_in and result.timing_cache_reused else None,
            "layers": result.layers,
            "gpu": gpu.name if gpu else None,
            "notes": notes,
        }

    def _rtx_engine(self, ctx: BuildContext, onnx_path: Path) -> dict[str, Any]:
        from dsa_export.trt.rtx import build_engine

        result = build_engine(onnx_path, ctx.settings.ranges, ctx.plan.rtx_targets, ctx.settings.profiles)
        engine_sha = _write_hashed(ctx.work, ENGINE_NAME, result.engine)
        capabilities = [f"{t[2:-1]}.{t[-1]}" for t in result.targets]
        return {
            "file": ENGINE_NAME,
            "sha256": engine_sha,
            "backend": "tensorrt-rtx",
            "trt_version": result.version,
            "compute_capability": capabilities,
            "targets": list(result.targets),
            "hardware_compatibility": "none",
            "version_compatible": False,
            "plugin_library_sha256": None,
            "plugin_library": None,
            "uses_plugins": False,
            "strongly_typed": True,
            "layers": result.layers,
            "notes": [
                "TensorRT-RTX supports no plugins: the dsa nodes were inlined from their ONNX function bodies "
                "(dense masked attention, no O(L*k) saving)",
                f"built ahead of time without a GPU for compute capability {', '.join(capabilities)}; TensorRT-RTX "
                "runs on Turing, Ampere (consumer), Ada and Blackwell RTX GPUs, not on Hopper or A100",
            ],
        }


#: The steps in build order, and their names.
BUILD_STEPS = (ExportStep(), ValidateStep(), CalibrateStep(), CheckStep(), EngineStep())
STEPS = tuple(step.name for step in BUILD_STEPS)
