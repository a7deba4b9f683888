"""ONNX Runtime sessions for our files (custom nodes run through their function bodies)."""

from __future__ import annotations

from pathlib import Path

from dsa_export.errors import DSAUserError


def session(
    path: str | Path,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
    threads: int | None = None,
    memory_arena: bool = True,
):
    """An ``onnxruntime.InferenceSession`` for ``path`` with a clear error if ORT rejects it.

    ``memory_arena=False`` makes every run allocate from and free to the system, so that the
    memory a run needs can be measured from outside (the benchmark does this).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    options.enable_cpu_mem_arena = memory_arena
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=list(providers))
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DSAUserError(f"ONNX Runtime cannot load '{path}': {first}") from exc


def polygraphy_runner(path: str | Path, name: str = "onnxruntime"):
    """A Polygraphy ``OnnxrtRunner`` over our session factory."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    return OnnxrtRunner(lambda: session(path), name=name)
