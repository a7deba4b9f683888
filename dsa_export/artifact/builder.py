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
    prepare_output,
)
from dsa_export.artifact.settings import (
    DEFAULT_PRECISION_CPU,
    DEFAULT_RANGE,
    BuildSettings,
)
from dsa_export.artifact.steps import (
    BUILD_STEPS,
    EXPORT_DTYPES,
    EXPORT_TIME_NOTE,
    STEPS,
    BuildContext,
    BuildState,
    GraphSummary,
    StepResult,
    plugin_library,
)
from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.fileio import (
    check_output_path,
    make_parents,
    remove_created,
)
from dsa_export.integrity import remember_hashes
from dsa_export.manifest import (
    FILES_KEY,
    MANIFEST_NAME,
    ONNX_NAME,
    SCHEMA_VERSION,
    write_manifest,
)

#: The test suite and older callers import these from here.
_plugin_library = plugin_library


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
# The build


def preflight(settings: BuildSettings) -> tuple[Any, GraphSummary | None]:
    """Check what needs neither the environment nor any work, before probing and the first step;
    returns the resolved MODEL source (None for a supplied .onnx) and the supplied .onnx's graph
    (None for a MODEL), so a bad MODEL fails here too and the export step reuses both."""
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
    source = supplied = None
    if s.model_is_onnx:
        from dsa_export.stages.record import verify_recorded_onnx

        supplied = GraphSummary.load(Path(str(s.model)))
        dims = supplied.dims
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
    return source, supplied


class _Build:
    def __init__(self, settings: BuildSettings, work: Path, log: Callable[[str], None], source: Any = None,
                 supplied: GraphSummary | None = None):
        self.settings = settings
        self.work = work
        self.log = log
        self.source = source
        self.supplied = supplied
        self.steps: list[StepRecord] = []
        self.manifest: dict[str, Any] = {}

    def step(self, name: str, fn: Callable[[], StepResult]) -> None:
        index = STEPS.index(name) + 1
        self.log(f"[{index}/{len(STEPS)}] {name} ...")
        start = time.perf_counter()
        try:
            result = fn()
            # An interrupt whose KeyboardInterrupt a library swallowed (raised inside a finalizer
            # or a callback: Python prints "Exception ignored" and goes on) still set the flag:
            # the build stops here, before the next step and before anything is installed.
            interrupts.raise_if_cancelled()
        except BaseException:
            self.steps.append(StepRecord(name, "failed", time.perf_counter() - start, ""))
            raise
        record = StepRecord(name, result.status, time.perf_counter() - start, result.detail)
        self.steps.append(record)
        self.log(f"[{index}/{len(STEPS)}] {name}: {result.status} in {record.seconds:.1f} s: {result.detail}")

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

    def context(self, probe) -> BuildContext:
        """The plan, the precision and the compat reports, before the first step; a blocked build
        fails here, before minutes of export."""
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
            precision = self._supplied_precision(plan, precision)
        self.log(f"Plan: {', '.join(plan.backends)} at {precision} ({plan.reason}).")
        # The rules are cheap once probed: the check step records the same reports in step order.
        from dsa_export.compat import CheckSettings, require_no_blocking, run_checks

        reports = {
            backend: run_checks(CheckSettings(for_build=True, backend=backend, precision=precision, device=s.device), probe)
            for backend in plan.backends
        }
        if not s.skip_checks:
            for report in reports.values():
                require_no_blocking(report)
        return BuildContext(settings=s, work=self.work, log=self.log, probe=probe, plan=plan, precision=precision,
                            reports=reports, source=source, supplied=self.supplied,
                            state=BuildState(engine_input=self.work / ONNX_NAME))

    def _supplied_precision(self, plan: BackendPlan, precision: str) -> str:
        """A supplied file keeps its own float type unless --precision asks for one TensorRT can lower."""
        s = self.settings
        assert self.supplied is not None, "preflight reads a supplied file"
        typed = self.supplied.precision
        if s.precision is None and precision in EXPORT_DTYPES and typed != precision:
            return typed
        if precision in ("fp32", "fp16", "bf16") and typed != precision and plan.engine != "tensorrt":
            raise DSAUserError(
                f"'{s.model}' is {typed} but --precision {precision} was asked, and only TensorRT 10 can lower "
                f"a file's precision at build time; give MODEL instead of the .onnx to export it at {precision}."
            )
        return precision

    def run(self, probe) -> None:
        ctx = self.context(probe)
        for step in BUILD_STEPS:
            self.step(step.name, lambda step=step: step.run(ctx))
        records = file_records(self.work)  # every file hashed once (or taken from the folder's cache)
        self.manifest = self._manifest(ctx, records[ONNX_NAME]["sha256"])
        self.manifest[FILES_KEY] = records
        write_manifest(self.manifest, self.work / MANIFEST_NAME)

    def _manifest(self, ctx: BuildContext, onnx_sha256: str) -> dict[str, Any]:
        from dsa_export.onnx_files import META_MODE, META_OPS, META_SETTINGS
        from dsa_export.trt.profiles import input_profiles, profile_ranges

        state, graph, plan = ctx.state, ctx.graph, ctx.plan
        model, meta = graph.model, graph.meta
        inputs, outputs = graph.io
        profiles = state.profiles
        every = profile_ranges(self.settings.ranges, self.settings.profiles)
        if self.settings.profiles and profiles:  # state holds the single range's; the engine's first profile here
            profiles = input_profiles(model, every[0])
        lib, sha, reason = plugin_library(self.settings, "plugin")
        engine = state.engine
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
                "source": state.source,
                "onnx": ONNX_NAME,
                "sha256": onnx_sha256,
                "ops_mode": meta.get(META_MODE),
                "op_versions": json.loads(meta.get(META_OPS, "{}")),
                "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
                "export_settings": json.loads(meta.get(META_SETTINGS, "{}")),
            },
            "precision": ctx.precision,
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
            "onnxruntime": state.onnxruntime,
            "plugin_library": {"path": str(lib) if lib else None, "sha256": sha, "reason": reason},
            "calibration": state.calibration,
            "checks": state.checks,
            "validation": state.validation,
            "steps": [{"name": r.name, "status": r.status, "seconds": round(r.seconds, 2), "detail": r.detail}
                       for r in self.steps],
        }


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
    """Run the steps into a temporary sibling of ``settings.output`` and rename it into place."""
    log = log or _stderr
    start = time.perf_counter()
    output = settings.output
    prepare_output(output, settings.force, log)
    source, supplied = preflight(settings)
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
            run = _Build(settings, work, log, source, supplied)
            run.run(probe)
            apply_umask(work)
            # The hashes just recorded are the verification cache: the first run hashes nothing.
            remember_hashes(work, {name: record["sha256"] for name, record in run.manifest[FILES_KEY].items()})
            install(work, output)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            remove_created(created)
            raise
    return BuildResult(output, run.manifest, run.steps, time.perf_counter() - start)


__all__ = ["EXPORT_TIME_NOTE", "STEPS", "BackendPlan", "BuildResult", "StepRecord", "build", "plan_backends"]
