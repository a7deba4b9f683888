"""``build``: export -> validate -> calibrate -> check -> engine, into one artifact folder.

Everything is written into a temporary sibling of the output folder (``.<name>.build-<pid>-XXXX``)
and renamed onto it at the very end, after ``manifest.json``; any failure or Ctrl-C removes the
temporary folder, so the output folder is either the complete new build or untouched. Each file
inside is written with :func:`dsa_export.fileio.atomic_output` as well. The process id in the
name lets the next build remove what a killed build (SIGKILL) left, and refuse to run while another
build writes the same folder.

Everything that can be checked without work is checked before the first step: the output path,
the plugin library, the TensorRT-RTX targets, the shape-range dim names against the model's
dynamic dims, and the model itself. The manifest lists every file of the build with its size and
sha256 (``files``), which the runtimes verify before they load anything.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export import __version__, interrupts
from dsa_export.artifact.backend_plan import BackendPlan, default_precision, plan_backends
from dsa_export.artifact.output_folder import (
    apply_umask,
    check_library,
    file_records,
    install,
    link_external_data,
    prepare_output,
)
from dsa_export.artifact.settings import (
    DEFAULT_PRECISION_CPU,
    DEFAULT_RANGE,
    BuildSettings,
)
from dsa_export.errors import DSAUsageError, DSAUserError, trace_errors
from dsa_export.fileio import (
    atomic_output,
    check_output_path,
    make_parents,
    remove_created,
    sha256_file,
)
from dsa_export.integrity import remember_hashes
from dsa_export.manifest import (
    CALIBRATION_CACHE_NAME,
    CALIBRATION_REPORT_NAME,
    ENGINE_NAME,
    FILES_KEY,
    MANIFEST_NAME,
    ONNX_NAME,
    QDQ_NAME,
    SCHEMA_VERSION,
    TIMING_CACHE_NAME,
    VALIDATION_NAME,
    TensorSpec,
    io_specs,
    write_manifest,
)

STEPS = ("export", "validate", "calibrate", "check", "engine")
#: What the export step's first progress line says for a built-in model (measured: docs/build.md).
EXPORT_TIME_NOTE = "about 20-60 s for a built-in model on 2 CPU cores"
EXPORT_DTYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "int8": "fp32", "fp8": "fp32"}


@dataclass
class StepRecord:
    name: str
    status: str  # done | skipped | failed
    seconds: float
    detail: str




@dataclass
class BuildResult:
    output: Path
    manifest: dict[str, Any]
    steps: list[StepRecord]
    seconds: float

    def summary_table(self) -> str:
        width = max(len(s.detail) for s in self.steps) if self.steps else 10
        lines = [f"{'step':<10} {'status':<8} {'time':>7}  result", f"{'-' * 10} {'-' * 8} {'-' * 7}  {'-' * min(width, 70)}"]
        for s in self.steps:
            lines.append(f"{s.name:<10} {s.status:<8} {s.seconds:>6.1f}s  {s.detail}")
        files = sorted(str(p.relative_to(self.output)) for p in self.output.rglob("*")
                       if p.is_file() and not p.name.startswith("."))
        lines.append(f"Built {self.output} in {self.seconds:.1f} s: {', '.join(files)}")
        return "\n".join(lines)


def _stderr(line: str) -> None:
    from dsa_export.quiet import user_stderr

    print(line, file=user_stderr(), flush=True)



# ---------------------------------------------------------------------------------------------
# Manifest pieces


def _io_specs(model) -> tuple[list[TensorSpec], list[TensorSpec]]:
    return io_specs(model)


def _plugin_library(settings: BuildSettings, kind: str) -> tuple[Path | None, str | None, str | None]:
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


def _load_onnx(path: Path):
    """The graph of a user-supplied .onnx (no external data), or a one-sentence error."""
    from dsa_export.onnx_files import load_graph

    return load_graph(path, "an exported .onnx file or a MODEL")


# ---------------------------------------------------------------------------------------------
# The pipeline


def preflight(settings: BuildSettings) -> Any:
    """Check what needs neither the environment nor any work, before probing and the first step;
    returns the resolved MODEL source (None for a supplied .onnx), so a bad MODEL fails here too and
    the export step reuses it."""
    s = settings
    if s.plugin_library is not None:
        check_library(Path(s.plugin_library))
    if s.backend in ("tensorrt", "onnxruntime") and s.rtx_targets:
        raise DSAUsageError(f"--rtx-target applies to TensorRT-RTX engines, not to --backend {s.backend}; drop it "
                            "or pass --backend tensorrt-rtx.")
    data = s.calibration_data
    if data and data != "builtin":
        script = data.rsplit(":", 1)[0] if ".py:" in data else data
        if not Path(script).exists():
            kind = "data-loader script" if script.endswith(".py") else "--calibration-data"
            raise DSAUserError(f"{kind} '{script}' does not exist; pass a folder of .npz/.npy inputs, a "
                               "data-loader script or 'builtin'.")
    if s.rtx_targets:
        import importlib.util

        from dsa_export.trt.rtx import RTX_MODULE, check_targets

        if importlib.util.find_spec(RTX_MODULE) is not None:
            check_targets(s.rtx_targets)
    source = None
    if s.model_is_onnx:
        from dsa_export.stages.record import verify_recorded_onnx

        dims = _onnx_dims(_load_onnx(Path(str(s.model))))
        verify_recorded_onnx(Path(str(s.model)))
    else:
        from dsa_export.export import ExportSettings
        from dsa_export.sources import resolve

        export_settings = ExportSettings(ops="plugin")
        # The precision's float type; without --precision fp32, unless TensorRT builds on a GPU
        # (fp16), which only the probe knows: a checkpoint's modules are then built again.
        dtype = EXPORT_DTYPES[s.precision or DEFAULT_PRECISION_CPU]
        source = resolve(s.model, batch=export_settings.batch, seq_len=export_settings.seq_len,
                         seed=export_settings.seed, dtype=dtype)
        dims = _source_dims(source)
    asked = set(s.ranges.dims) - set(DEFAULT_RANGE.dims)
    unknown = sorted(asked - dims)
    if unknown:
        raise DSAUsageError(
            f"--min/--opt/--max-shapes name {', '.join(unknown)}, which is not a dynamic dim of the model (its "
            f"dims: {', '.join(sorted(dims)) or 'none'})."
        )
    missing = sorted(dims - set(s.ranges.dims))
    if missing:
        raise DSAUsageError(f"the model has the dynamic dim(s) {', '.join(missing)}, which need a shape range; give "
                            f"one with --min-shapes/--opt-shapes/--max-shapes {missing[0]}=N.")
    return source


class _Pipeline:
    def __init__(self, settings: BuildSettings, work: Path, log: Callable[[str], None], source: Any = None):
        self.settings = settings
        self.work = work
        self.log = log
        self.source = source
        self.steps: list[StepRecord] = []
        self.manifest: dict[str, Any] = {}

    def step(self, name: str, fn: Callable[[], tuple[str, str]]) -> None:
        index = STEPS.index(name) + 1
        self.log(f"[{index}/{len(STEPS)}] {name} ...")
        start = time.perf_counter()
        try:
            status, detail = fn()
        except BaseException:
            self.steps.append(StepRecord(name, "failed", time.perf_counter() - start, ""))
            raise
        record = StepRecord(name, status, time.perf_counter() - start, detail)
        self.steps.append(record)
        self.log(f"[{index}/{len(STEPS)}] {name}: {status} in {record.seconds:.1f} s: {detail}")

    def check_plan(self, plan: BackendPlan) -> None:
        """What depends on the backends this machine builds, before the first step."""
        s = self.settings
        if s.timing_cache is not None and plan.engine == "tensorrt":
            check_output_path(s.timing_cache, "--timing-cache")
        if s.rtx_targets and plan.engine != "tensorrt-rtx":
            if s.backend != "auto":
                raise DSAUsageError(f"--rtx-target applies to TensorRT-RTX engines, not to --backend {s.backend}; drop it "
                                    "or pass --backend tensorrt-rtx.")
            self.log(f"Note: --rtx-target {','.join(s.rtx_targets)} is ignored: this build makes no TensorRT-RTX engine.")
        if plan.engine == "tensorrt-rtx":
            from dsa_export.trt.rtx import check_targets

            plan.rtx_targets = check_targets(plan.rtx_targets)

    def run(self, probe) -> None:
        import onnx

        s = self.settings
        plan = plan_backends(s, probe)
        precision = s.precision or default_precision(plan)
        self.check_plan(plan)
        source = self.source
        if source is not None and source.reference.kind == "hf" and EXPORT_DTYPES[precision] != \
                EXPORT_DTYPES[s.precision or DEFAULT_PRECISION_CPU]:
            from dsa_export.sources import resolve

            source = resolve(s.model, dtype=EXPORT_DTYPES[precision])  # fp16 for a TensorRT engine
        if s.model_is_onnx:
            from dsa_export.trt.tensorrt import file_precision

            typed = file_precision(_load_onnx(Path(str(s.model))))
            if s.precision is None and precision in EXPORT_DTYPES and typed != precision:
                precision = typed  # a supplied file keeps its own float type
            elif precision in ("fp32", "fp16", "bf16") and typed != precision and plan.engine != "tensorrt":
                raise DSAUserError(
                    f"'{s.model}' is {typed} but --precision {precision} was asked, and only TensorRT 10 can lower "
                    f"a file's precision at build time; give MODEL instead of the .onnx to export it at {precision}."
                )
        self.log(f"Plan: {', '.join(plan.backends)} at {precision} ({plan.reason}).")
        # The rules are cheap once probed: a blocked build fails here, before minutes of export,
        # and the check step records the same reports in pipeline order.
        from dsa_export.compat import CheckSettings, require_no_blocking, run_checks

        reports = {
            backend: run_checks(CheckSettings(for_build=True, backend=backend, precision=precision, device=s.device), probe)
            for backend in plan.backends
        }
        if not s.skip_checks:
            for report in reports.values():
                require_no_blocking(report)
        onnx_path = self.work / ONNX_NAME
        state: dict[str, Any] = {"engine_input": onnx_path}

        # 1. export -------------------------------------------------------------------------
        def export() -> tuple[str, str]:
            if s.model_is_onnx:
                src = Path(str(s.model))
                if not src.is_file():
                    raise DSAUserError(f"'{src}' does not exist; pass an exported .onnx file or a MODEL.")
                from dsa_export.stages.record import verify_recorded_onnx

                verify_recorded_onnx(src)
                # Calibration loads the weights with onnx.load, which refuses a data file with
                # several hard links: an int8/fp8 build copies them.
                linked = link_external_data(src, self.work, copy=precision in ("int8", "fp8"))
                from dsa_export.export.exporter import relocate_reference

                copied = onnx.load(str(src), load_external_data=False)
                if relocate_reference(copied, src.resolve().parent, s.output.resolve()):
                    # The recorded reference path is relative to the file's folder: re-base it on
                    # the build folder, or validation would look for the checkpoint elsewhere.
                    with atomic_output(onnx_path) as tmp:
                        onnx.save(copied, str(tmp))
                else:
                    with atomic_output(onnx_path) as tmp:
                        shutil.copyfile(src, tmp)
                state["source"] = str(src.resolve())
                how = "copied" if precision in ("int8", "fp8") else "hard-linked where possible"
                data = f" and its external data ({', '.join(linked)}, {how})" if linked else ""
                return "skipped", f"supplied {src.name}, copied to {ONNX_NAME}{data}"
            from dsa_export.export import ExportSettings, export_model, save_model
            from dsa_export.quiet import third_party_output

            export_settings = ExportSettings(ops="plugin", dtype=EXPORT_DTYPES[precision])
            began = time.perf_counter()

            def step(text: str) -> None:
                # The longest step of a demo build, and torch.export says nothing while it works.
                if text.startswith("tracing"):
                    note = EXPORT_TIME_NOTE if source.spec.startswith("builtin:") else "the longest part"
                else:
                    note = f"{time.perf_counter() - began:.0f} s so far"
                self.log(f"[{STEPS.index('export') + 1}/{len(STEPS)}] export: {text} ({note}) ...")

            with trace_errors(source.spec), third_party_output():
                model = export_model(source, export_settings, step=step)
            save_model(model, onnx_path)
            state["source"] = source.spec
            custom = sum(1 for n in model.graph.node if n.domain == "dsa")
            return "done", f"{source.spec} -> {ONNX_NAME} (plugin ops, {custom} dsa nodes, {export_settings.dtype})"

        self.step("export", export)
        model = onnx.load(str(onnx_path), load_external_data=False)
        meta = {p.key: p.value for p in model.metadata_props}

        # 2. validate -----------------------------------------------------------------------
        def validate() -> tuple[str, str]:
            from dsa_export.export.exporter import META_SETTINGS, META_SPEC

            dtype = json.loads(meta.get(META_SETTINGS, "{}")).get("dtype", "fp32")
            if not s.validate:
                state["validation"] = {"skipped": True, "reason": "--no-validate"}
                return "skipped", "--no-validate"
            if META_SPEC not in meta:
                state["validation"] = {"skipped": True, "reason": "the file records no torch reference"}
                return "skipped", "the supplied file records no torch reference"
            if dtype == "bf16":
                state["validation"] = {"skipped": True, "reason": "ONNX Runtime's CPU provider has no bf16 kernels"}
                return "skipped", "bf16: ONNX Runtime's CPU provider has no bf16 kernels"
            from dsa_export.model_ref import from_metadata

            # The copy's reference was re-based on the build folder by the export step.
            recorded = from_metadata(meta.get(META_SPEC), s.output.resolve()) if s.model_is_onnx else None
            if recorded is not None and recorded.kind in ("factory", "module"):
                # A supplied file names code as its reference: build does not run it (see sources.py).
                spec = recorded.describe()
                reason = (f"the file's reference is the Python factory {spec}, which build does not run from a file; "
                          f"validate it with `dsa-export validate FILE --reference {spec}`"
                          if recorded.kind == "factory" else f"the file's reference '{spec}' cannot be rebuilt")
                state["validation"] = {"skipped": True, "reason": reason}
                return "skipped", reason
            from dsa_export.validate import ValidationSettings, validate_onnx

            # The MODEL the user named (a factory in it is theirs to run); the exported module itself
            # may have been cast to the export's precision, and the reference runs in fp32.
            reference = None if s.model_is_onnx or s.model is None else str(s.model)
            report = validate_onnx(onnx_path, ValidationSettings(seq_lens=tuple(s.validation_seq_lens),
                                                                 reference=reference))
            with atomic_output(self.work / VALIDATION_NAME) as tmp:
                tmp.write_text(report.to_json() + "\n", encoding="utf-8")
            worst = max(report.errors, key=lambda e: e.max_abs)
            state["validation"] = {
                "skipped": False, "report": VALIDATION_NAME, "passed": report.passed, "runners": report.runners,
                "reference": report.reference, "seq_lens": list(s.validation_seq_lens), "atol": report.atol,
                "rtol": report.rtol, "error_stat": report.error_stat, "max_abs": worst.max_abs,
            }
            if not report.passed:
                raise DSAUserError(
                    f"Validation failed: ONNX Runtime differs from torch beyond atol={report.atol:g}/rtol={report.rtol:g} "
                    f"(worst '{worst.output}' at seq_len {worst.seq_len}, max abs {worst.max_abs:.3e}); nothing was built."
                )
            return "done", (f"{report.runners[1]} vs {report.runners[0]} at seq {','.join(map(str, s.validation_seq_lens))}: "
                            f"PASSED ({report.error_stat} within atol {report.atol:g}; max abs {worst.max_abs:.2e}) "
                            f"-> {VALIDATION_NAME}")

        self.step("validate", validate)

        # 3. calibrate ----------------------------------------------------------------------
        def calibrate() -> tuple[str, str]:
            from dsa_export.trt.tensorrt import is_calibrated

            if precision not in ("int8", "fp8"):
                state["calibration"] = None
                return "skipped", f"{precision} needs no calibration"
            if is_calibrated(model):  # FP8 checkpoint weights alone (DequantizeLinear) still need it
                state["calibration"] = {"supplied": True, "model": ONNX_NAME}
                return "skipped", "the supplied file already has Q/DQ nodes"
            from dsa_export.artifact.calibrate import calibrate as run_calibration

            outcome = run_calibration(
                onnx_path, self.work / QDQ_NAME, precision, data=s.calibration_data,
                cache=self.work / CALIBRATION_CACHE_NAME, report=self.work / CALIBRATION_REPORT_NAME,
            )
            state["engine_input"] = outcome.model
            state["calibration"] = {
                **outcome.provenance, "model": QDQ_NAME, "model_sha256": sha256_file(outcome.model),
                "cache": outcome.cache.name if outcome.cache else None,
                "report": outcome.report.name if outcome.report else None,
            }
            verdict = {True: "report passed", False: f"report FAILED (see {CALIBRATION_REPORT_NAME})", None: "no report"}
            return "done", f"{precision} Q/DQ -> {QDQ_NAME}; {verdict[outcome.provenance.get('report_passed')]}"

        self.step("calibrate", calibrate)

        # 4. check --------------------------------------------------------------------------
        def check() -> tuple[str, str]:
            from dsa_export.compat import manifest_record

            records: dict[str, Any] = {}
            summary = []
            for backend, report in reports.items():
                records[backend] = manifest_record(None if s.skip_checks else report, skipped=s.skip_checks)
                records[backend]["blocking"] = [f.id for f in report.blocking]
                summary.append(f"{backend}: {'ok' if report.ok else 'blocked (ignored: --skip-checks)'}"
                               f" ({len(report.findings)} findings)")
            state["checks"] = records
            return ("skipped" if s.skip_checks else "done"), "; ".join(summary)

        self.step("check", check)

        # 5. engine -------------------------------------------------------------------------
        def engine() -> tuple[str, str]:
            from dsa_export.trt.profiles import input_profiles

            engine_input = Path(state["engine_input"])
            engine_model = onnx.load(str(engine_input), load_external_data=False)
            profiles = input_profiles(engine_model, s.ranges)
            state["profiles"] = profiles
            details = []
            if plan.engine == "tensorrt":
                state["engine"] = self._tensorrt_engine(engine_input, precision, probe)
                details.append(f"TensorRT {state['engine']['trt_version']} -> {ENGINE_NAME}")
            elif plan.engine == "tensorrt-rtx":
                state["engine"] = self._rtx_engine(engine_input, plan.rtx_targets)
                details.append(f"TensorRT-RTX {state['engine']['trt_version']} for {', '.join(plan.rtx_targets)} -> {ENGINE_NAME}")
            else:
                state["engine"] = None
            if plan.onnxruntime:
                from dsa_export.artifact.onnxrt import write_artifact

                lib, sha, reason = _plugin_library(s, "static")
                state["onnxruntime"] = write_artifact(
                    self.work, engine_input, precision=precision, profiles=profiles, plugin_library=lib,
                    plugin_reason=reason, optimization=s.ort_optimization, optimization_level=s.optimization_level,
                )
                state["onnxruntime"]["plugin_library_sha256"] = sha
                optimized = state["onnxruntime"]["optimized_model"]
                details.append(f"ONNX Runtime -> {optimized or ONNX_NAME} + session.json")
            return "done", "; ".join(details)

        self.step("engine", engine)
        self.manifest = self._manifest(plan, precision, model, meta, state)
        self.manifest[FILES_KEY] = file_records(self.work)
        write_manifest(self.manifest, self.work / MANIFEST_NAME)

    def _tensorrt_engine(self, onnx_path: Path, precision: str, probe) -> dict[str, Any]:
        from dsa_export.trt.tensorrt import TensorRTBuildSettings, build_engine

        s = self.settings
        lib, sha, reason = _plugin_library(s, "plugin")
        previous = s.output / TIMING_CACHE_NAME
        cache_in = s.timing_cache if s.timing_cache is not None else (previous if previous.is_file() else None)
        result = build_engine(onnx_path, TensorRTBuildSettings(
            ranges=s.ranges, profiles=s.profiles, precision=precision, plugin_library=lib, timing_cache=cache_in,
            version_compatible=s.version_compatible, hardware_compatibility=s.hardware_compatibility,
            optimization_level=s.optimization_level,
        ))
        for warning in result.warnings:
            if "timing cache" in warning:
                self.log(f"Warning: {warning.removeprefix('WARNING: ')}")
        with atomic_output(self.work / ENGINE_NAME) as tmp:
            tmp.write_bytes(result.engine)
        if result.timing_cache:
            with atomic_output(self.work / TIMING_CACHE_NAME) as tmp:
                tmp.write_bytes(result.timing_cache)
            if s.timing_cache is not None:
                with atomic_output(s.timing_cache) as tmp:
                    tmp.write_bytes(result.timing_cache)
        gpus = probe.gpus
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
            "sha256": sha256_file(self.work / ENGINE_NAME),
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
            "optimization_level": s.optimization_level,
            "timing_cache": TIMING_CACHE_NAME if result.timing_cache else None,
            "timing_cache_reused": str(cache_in) if cache_in and result.timing_cache_reused else None,
            "layers": result.layers,
            "gpu": gpu.name if gpu else None,
            "notes": notes,
        }

    def _rtx_engine(self, onnx_path: Path, targets: tuple[str, ...]) -> dict[str, Any]:
        from dsa_export.trt.rtx import build_engine

        result = build_engine(onnx_path, self.settings.ranges, targets, self.settings.profiles)
        with atomic_output(self.work / ENGINE_NAME) as tmp:
            tmp.write_bytes(result.engine)
        capabilities = [f"{t[2:-1]}.{t[-1]}" for t in result.targets]
        return {
            "file": ENGINE_NAME,
            "sha256": sha256_file(self.work / ENGINE_NAME),
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

    def _manifest(self, plan: BackendPlan, precision: str, model, meta: dict[str, str], state: dict[str, Any]) -> dict[str, Any]:
        from dsa_export.export.exporter import META_MODE, META_OPS, META_SETTINGS
        from dsa_export.trt.profiles import input_profiles, profile_ranges

        inputs, outputs = _io_specs(model)
        profiles = state.get("profiles", {})
        every = profile_ranges(self.settings.ranges, self.settings.profiles)
        if self.settings.profiles and profiles:  # state holds the single range's; the engine's first profile here
            profiles = input_profiles(model, every[0])
        lib, sha, reason = _plugin_library(self.settings, "plugin")
        engine = state.get("engine")
        if engine is not None:
            target = {"backend": engine["backend"], "compute_capability": engine["compute_capability"],
                      "hardware_compatibility": engine["hardware_compatibility"]}
        else:
            target = {"backend": "onnxruntime", "compute_capability": [],
                      "hardware_compatibility": "any (CPU, or the CUDA/TensorRT execution providers)"}
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "dsa-export", "version": __version__},
            "model": {
                "source": state.get("source"),
                "onnx": ONNX_NAME,
                "sha256": sha256_file(self.work / ONNX_NAME),
                "ops_mode": meta.get(META_MODE),
                "op_versions": json.loads(meta.get(META_OPS, "{}")),
                "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
                "export_settings": json.loads(meta.get(META_SETTINGS, "{}")),
            },
            "precision": precision,
            "backends": plan.backends,
            "backend_choice": {"requested": self.settings.backend, "reason": plan.reason},
            "gpu_target": target,
            "profiles": {  # dims and inputs: the first optimization profile; all: the dims of each, in order
                "dims": {name: list(r) for name, r in every[0].dims.items()},
                "inputs": {name: {"min": p[0], "opt": p[1], "max": p[2]} for name, p in profiles.items()},
                "all": [{name: list(r) for name, r in ranges.dims.items()} for ranges in every],
            },
            "inputs": [i.to_dict() for i in inputs],
            "outputs": [o.to_dict() for o in outputs],
            "engine": engine,
            "onnxruntime": state.get("onnxruntime"),
            "plugin_library": {"path": str(lib) if lib else None, "sha256": sha, "reason": reason},
            "calibration": state.get("calibration"),
            "checks": state.get("checks"),
            "validation": state.get("validation"),
            "steps": [{"name": r.name, "status": r.status, "seconds": round(r.seconds, 2), "detail": r.detail}
                       for r in self.steps],
        }


def _onnx_dims(model) -> set[str]:
    initializers = {i.name for i in model.graph.initializer}
    return {d.dim_param for v in model.graph.input if v.name not in initializers
            for d in v.type.tensor_type.shape.dim if d.dim_param}


def _source_dims(source) -> set[str]:
    """The dynamic dims the exporter gives ``source``'s inputs (its named axes, else batch/sequence)."""
    from dsa_export.export.exporter import BATCH_DIM, SEQ_DIM

    if source.dynamic_axes is not None:
        return {name for axes in source.dynamic_axes.values() for name in axes.values()}
    dims: set[str] = set()
    for value in source.example_inputs.values():
        dims.update(name for axis, name in ((0, BATCH_DIM), (1, SEQ_DIM)) if value.dim() > axis)
    return dims



def build(settings: BuildSettings, log: Callable[[str], None] | None = None, probe=None) -> BuildResult:
    """Run the pipeline into a temporary sibling of ``settings.output`` and rename it into place."""
    log = log or _stderr
    start = time.perf_counter()
    output = settings.output
    prepare_output(output, settings.force, log)
    source = preflight(settings)
    created: list[Path] = []
    try:
        created = make_parents(output.parent)
        work = Path(tempfile.mkdtemp(prefix=interrupts.tagged_name(f".{output.name}.build-"), dir=output.parent))
    except OSError as exc:
        remove_created(created)
        raise DSAUserError(f"Cannot create the build folder next to {output} ({exc.strerror}); choose another -o.") from exc
    with interrupts.temporary(work):
        try:
            if probe is None:
                from dsa_export.compat import probe_environment

                log("Probing the environment ...")
                probe = probe_environment()
            pipeline = _Pipeline(settings, work, log, source)
            pipeline.run(probe)
            apply_umask(work)
            # The hashes just recorded are the verification cache: the first run hashes nothing.
            remember_hashes(work, {name: record["sha256"] for name, record in pipeline.manifest[FILES_KEY].items()})
            install(work, output)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            remove_created(created)
            raise
    return BuildResult(output, pipeline.manifest, pipeline.steps, time.perf_counter() - start)


__all__ = ["STEPS", "BackendPlan", "BuildResult", "StepRecord", "build", "plan_backends"]
