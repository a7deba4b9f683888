"""Opening one built artifact as a :class:`~dsa_export.runtime.session.Session`: a build folder
(its engine when the engine gate accepts it here, else its ONNX Runtime artifact), an engine file,
the ``onnxruntime/`` artifact or a plain .onnx, each verified against its record first. Pipelines
of such artifacts are :mod:`dsa_export.stages.session`'s; :func:`dsa_export.runtime.load` opens
either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dsa_export.runtime.onnxrt as onnxrt
from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.manifest import ENGINE_NAME, MANIFEST_NAME, ORT_DIR, Manifest, read_manifest
from dsa_export.runtime.session import RUNTIME_CHOICES, Session
from dsa_export.stages.record import verify_recorded_onnx


def _looks_like_engine(path: Path) -> bool:
    from dsa_export.compat.engine_gate import PLAN_MAGICS

    with open(path, "rb") as handle:
        return handle.read(4) in PLAN_MAGICS


def checked_path(artifact: str | Path, runtime: str) -> Path:
    """``artifact`` as a path, after refusing an unknown ``runtime`` and a path that does not exist."""
    if runtime not in RUNTIME_CHOICES:
        raise DSAUsageError(f"runtime {runtime!r} is not one of {', '.join(RUNTIME_CHOICES)}.")
    path = Path(artifact)
    if not path.exists():
        raise DSAUserError(f"{path} does not exist; pass a build folder, an engine, or an .onnx file.")
    return path


def open_artifact(artifact: str | Path, runtime: str = "auto", device: int = 0, *, verify: bool = True,
                  probe=None, **options: Any) -> Session:
    """Open a build folder, an engine file, the ``onnxruntime/`` artifact or a plain .onnx (a
    pipeline folder is :func:`dsa_export.runtime.loader.load`'s, which calls this for the rest).

    ``runtime``: ``engine`` or ``onnxruntime`` to insist on one; ``auto`` takes the folder's engine
    when the gate accepts it on this machine and otherwise its ONNX Runtime artifact, with a note
    saying why. ``verify``: check each file against the build's manifest before loading it (an
    engine or ONNX file that was truncated or replaced is refused). ``probe``: a
    :class:`~dsa_export.compat.engine_gate.GateProbe` shared by the engines of one session.
    """
    path = checked_path(artifact, runtime)
    if path.is_file():
        if path.suffix == ".onnx":
            if runtime == "engine":
                raise DSAUsageError(f"{path} is an ONNX file, not an engine; build one with `dsa-export build`.")
            verify_recorded_onnx(path, enabled=verify)
            return onnxrt.OnnxFileSession.open(path, **options)
        if path.name == MANIFEST_NAME:
            return open_artifact(path.parent, runtime, device, verify=verify, **options)
        if runtime == "onnxruntime":
            raise DSAUsageError(f"{path} is an engine; pass its build folder or an .onnx file for ONNX Runtime.")
        return _engine_session(path, read_manifest(path), device, verify, probe)
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
        return _engine_session(engine_path, manifest, device, verify=False, probe=probe)
    try:
        return _engine_session(engine_path, manifest, device, verify=False, probe=probe)
    except DSAUserError as exc:
        session = onnxrt.ArtifactSession.open(manifest, verify=verify, **options)
        session.notes.insert(0, f"Using the ONNX Runtime artifact because the {engine.get('backend')} engine cannot run here: {exc}")
        return session


def _engine_session(path: Path, manifest: Manifest, device: int, verify: bool = True, probe=None) -> Session:
    if path.is_dir():
        raise DSAUserError(f"{path} is a folder, not an engine; pass the build folder or the engine file in it.")
    notes = manifest.verify([path], enabled=verify)
    if not _looks_like_engine(path):
        from dsa_export.compat.engine_gate import sniff_engine

        sniff_engine(path)  # raises with what the file is instead
    from dsa_export.runtime.tensorrt import EngineSession

    session = EngineSession.open(path, manifest, device, probe)
    session.notes.extend(notes)
    return session


__all__ = ["checked_path", "open_artifact"]
