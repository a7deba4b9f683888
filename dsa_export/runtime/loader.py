"""``load(artifact)``: whatever the user points at, opened as a session: a pipeline folder
(``pipeline.json`` without a ``manifest.json``) as a
:class:`~dsa_export.stages.session.PipelineSession`, anything else by
:func:`~dsa_export.runtime.artifact.open_artifact`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsa_export.manifest import MANIFEST_NAME
from dsa_export.runtime.artifact import checked_path, open_artifact
from dsa_export.runtime.session import Session
from dsa_export.stages.record import PIPELINE_NAME


def load(artifact: str | Path, runtime: str = "auto", device: int = 0, *, verify: bool = True,
         **options: Any) -> Session:
    """Open a build folder, an engine file, the ``onnxruntime/`` artifact, a plain .onnx, or a
    pipeline folder (``pipeline.json``: a :class:`~dsa_export.stages.session.PipelineSession`).

    ``runtime``: ``engine`` or ``onnxruntime`` to insist on one; ``auto`` takes the folder's engine
    when the gate accepts it on this machine and otherwise its ONNX Runtime artifact, with a note
    saying why. ``verify``: check each file against the build's manifest before loading it (an
    engine or ONNX file that was truncated or replaced is refused).
    """
    path = checked_path(artifact, runtime)
    if path.is_dir() and (path / PIPELINE_NAME).is_file() and not (path / MANIFEST_NAME).is_file():
        from dsa_export.stages.session import PipelineSession

        return PipelineSession.open(path, runtime, verify=verify, **options)
    return open_artifact(path, runtime, device, verify=verify, **options)


__all__ = ["load"]
