"""One interface over the runtimes: ``load(artifact)`` returns a :class:`Session`.

A session takes numpy inputs by name and returns numpy outputs by name, whatever runs underneath
(ONNX Runtime on CPU/CUDA/TensorRT execution providers, a TensorRT or TensorRT-RTX engine).
Loading an engine runs the engine gate first (:func:`dsa_export.compat.gate_engine`), so a
mismatched TensorRT, GPU or plugin library is refused with its reason before deserialization.
Every file a session loads from a build folder is checked against the sizes and sha256 in its
``manifest.json`` first (``verify=False`` skips that, for users who insist), and every run checks
its inputs' names, shapes (against the build's profile), dtypes and token-id range before running.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dsa_export.errors import DSAUsageError, DSAUserError, as_user_error
from dsa_export.manifest import (
    ENGINE_NAME,
    MANIFEST_NAME,
    Manifest,
    ORT_DIR,
    TensorSpec,
    check_feeds,
    make_inputs,
    read_manifest,
)
from dsa_export.pipeline_record import verify_recorded_onnx

RUNTIME_CHOICES = ("auto", "engine", "onnxruntime")


@dataclass
class Session:
    """Base of the runtime sessions. Subclasses implement :meth:`_run`."""

    kind: str  # e.g. "onnxruntime (cpu)", "tensorrt-rtx 1.7.1"
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    manifest: Manifest | None = None
    notes: list[str] = field(default_factory=list)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Check the feeds against the inputs (names, ranks, profile, dtypes, token-id range,
        memory) and run; what the runtime then refuses about the inputs is a user error too."""
        shapes = {name: tuple(np.shape(value)) for name, value in feeds.items()}
        return self._guarded(self._run, self._checked_feeds(feeds, shapes))

    def _checked_feeds(self, host: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
        """``host`` checked (names, profile, dtypes, token-id range) and the memory a run of
        ``shapes`` (every input's shape, device-resident ones included) needs; returns ``host``
        as the runtime takes it."""
        names = [spec.name for spec in self.inputs]
        unknown = sorted(set(shapes) - set(names))
        if unknown:
            raise DSAUserError(f"unknown input(s) {unknown}; this model takes {', '.join(names)}.")
        self.check_shapes(shapes)
        host = check_feeds([spec for spec in self.inputs if spec.name in host], host, "the model")
        self.check_memory(shapes)
        return host

    @staticmethod
    def _guarded(run, *args):
        """``run(*args)``, with what the runtime refuses about the inputs as a user error."""
        try:
            return run(*args)
        except DSAUserError:
            raise
        except Exception as exc:
            mapped = as_user_error(exc, "running the model on these inputs")
            if mapped is None:
                raise
            raise mapped from exc

    def check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        from dsa_export.manifest import check_shapes

        check_shapes(self.inputs, {}, shapes, self.kind)

    def check_memory(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Refuse shapes whose run cannot fit in this machine's memory (CPU runtimes only)."""

    def sequence_limit(self) -> int | None:
        """The most tokens one sequence may hold (prompt and generated), as the build's profiles
        allow (``total_sequence``; a paged graph: ``max_pages`` pages per row); None when nothing
        bounds it (an .onnx on ONNX Runtime)."""
        if self.manifest is None:
            return None
        limits = [dims["total_sequence"][2] for dims in self.manifest.profile_sets if "total_sequence" in dims]
        if any("max_pages" in dims for dims in self.manifest.profile_sets):
            from dsa_export.runtime.paged import page_size

            page = page_size(self.inputs)
            limits += [dims["max_pages"][2] * page for dims in self.manifest.profile_sets if "max_pages" in dims]
        return max(limits) if limits else None

    def dim_limit(self, name: str) -> int | None:
        """The largest value of dim ``name`` any profile of the build allows (``batch``: rows per
        call, ``sequence``: tokens per row and call); None when nothing bounds it."""
        if self.manifest is None:
            return None
        limits = [dims[name][2] for dims in self.manifest.profile_sets if name in dims]
        return max(limits) if limits else None

    def dim_names(self) -> set[str]:
        """The named dynamic dims of the inputs (what ``--dims`` may set)."""
        return {d for spec in self.inputs for d in spec.shape if isinstance(d, str)}

    def example_inputs(self, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
        """Random inputs at the profile's opt shape (or ``dims``), as the manifest describes them."""
        unknown = sorted(set(dims or {}) - self.dim_names())
        if unknown:
            known = ", ".join(sorted(self.dim_names())) or "none"
            raise DSAUsageError(f"--dims names {', '.join(unknown)}, which no input of this model has (its dims: "
                                f"{known}).")
        sizes = dict(self.manifest.opt_dims()) if self.manifest is not None else {}
        sizes.update(dims or {})
        return make_inputs(self.inputs, sizes, seed, before=self.check_memory)

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        pass


def _looks_like_engine(path: Path) -> bool:
    from dsa_export.compat.engine_gate import PLAN_MAGICS

    with open(path, "rb") as handle:
        return handle.read(4) in PLAN_MAGICS


def load(artifact: str | Path, runtime: str = "auto", device: int = 0, *, verify: bool = True,
         **options: Any) -> Session:
    """Open a build folder, an engine file, the ``onnxruntime/`` artifact, a plain .onnx, or a
    pipeline folder (``pipeline.json``: a :class:`~dsa_export.runtime.pipeline.PipelineSession`).

    ``runtime``: ``engine`` or ``onnxruntime`` to insist on one; ``auto`` takes the folder's engine
    when the gate accepts it on this machine and otherwise its ONNX Runtime artifact, with a note
    saying why. ``verify``: check each file against the build's manifest before loading it (an
    engine or ONNX file that was truncated or replaced is refused).
    """
    if runtime not in RUNTIME_CHOICES:
        raise DSAUsageError(f"runtime {runtime!r} is not one of {', '.join(RUNTIME_CHOICES)}.")
    path = Path(artifact)
    if not path.exists():
        raise DSAUserError(f"{path} does not exist; pass a build folder, an engine, or an .onnx file.")
    from dsa_export.runtime import onnxrt

    from dsa_export.pipeline_record import PIPELINE_NAME

    if path.is_dir() and (path / PIPELINE_NAME).is_file() and not (path / MANIFEST_NAME).is_file():
        from dsa_export.runtime.pipeline import PipelineSession

        return PipelineSession.open(path, runtime, verify=verify, **options)
    if path.is_file():
        if path.suffix == ".onnx":
            if runtime == "engine":
                raise DSAUsageError(f"{path} is an ONNX file, not an engine; build one with `dsa-export build`.")
            verify_recorded_onnx(path, enabled=verify)
            return onnxrt.OnnxFileSession.open(path, **options)
        if path.name == MANIFEST_NAME:
            return load(path.parent, runtime, device, verify=verify, **options)
        if runtime == "onnxruntime":
            raise DSAUsageError(f"{path} is an engine; pass its build folder or an .onnx file for ONNX Runtime.")
        return _engine_session(path, read_manifest(path), device, verify)
    if path.name == ORT_DIR and (path.parent / MANIFEST_NAME).is_file():
        return onnxrt.ArtifactSession.open(read_manifest(path.parent), verify=verify, **options)
    manifest = read_manifest(path)
    engine = manifest.engine
    has_ort = manifest.onnxruntime is not None
    if runtime == "onnxruntime" or (runtime == "auto" and engine is None):
        if not has_ort:
            raise DSAUserError(f"{path} has no ONNX Runtime artifact; rebuild with --backend auto or onnxruntime.")
        return onnxrt.ArtifactSession.open(manifest, verify=verify, **options)
    if engine is None:
        raise DSAUserError(f"{path} has no engine; rebuild with --backend tensorrt or tensorrt-rtx.")
    engine_path = manifest.artifact(engine.get("file", ENGINE_NAME), "engine.file")
    # A damaged engine is refused outright, never replaced by the ONNX Runtime artifact.
    manifest.verify([engine_path], enabled=verify)
    if runtime == "engine" or not has_ort:
        return _engine_session(engine_path, manifest, device, verify=False)
    try:
        return _engine_session(engine_path, manifest, device, verify=False)
    except DSAUserError as exc:
        session = onnxrt.ArtifactSession.open(manifest, verify=verify, **options)
        session.notes.insert(0, f"Using the ONNX Runtime artifact because the {engine.get('backend')} engine cannot run here: {exc}")
        return session


def _engine_session(path: Path, manifest: Manifest, device: int, verify: bool = True) -> Session:
    if path.is_dir():
        raise DSAUserError(f"{path} is a folder, not an engine; pass the build folder or the engine file in it.")
    notes = manifest.verify([path], enabled=verify)
    if not _looks_like_engine(path):
        from dsa_export.compat.engine_gate import sniff_engine

        sniff_engine(path)  # raises with what the file is instead
    from dsa_export.runtime.tensorrt import EngineSession

    session = EngineSession.open(path, manifest, device)
    session.notes.extend(notes)
    return session


__all__ = ["RUNTIME_CHOICES", "Session", "load"]
