"""ONNX Runtime sessions for our files (custom nodes run through their function bodies).

:class:`ArtifactSession` opens the ``onnxruntime/`` folder of a build: ``session.json`` lists
provider chains best first (TensorRT EP with the plugin-mode model, CUDA, CPU with the optimized
model), and the first chain whose provider this ONNX Runtime offers is used.
"""

from __future__ import annotations

from pathlib import Path

from dsa_export.errors import DSAUserError
from dsa_export.manifest import ORT_DIR, ORT_SESSION_NAME, Manifest, TensorSpec
from dsa_export.runtime.session import Session


def session(
    path: str | Path,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
    threads: int | None = None,
    memory_arena: bool = True,
    model_bytes: bytes | None = None,
):
    """An ``onnxruntime.InferenceSession`` for ``path`` with a clear error if ORT rejects it.

    ``memory_arena=False`` makes every run allocate from and free to the system, so that the
    memory a run needs can be measured from outside (the benchmark does this). ``model_bytes``
    runs a modified copy of the graph at ``path`` (e.g. with extra outputs) whose external data
    is still read from beside ``path``: nothing is written next to the user's file.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    options.enable_cpu_mem_arena = memory_arena
    target: str | bytes = str(path)
    if model_bytes is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         str(Path(path).resolve().parent))
        target = model_bytes
    try:
        return ort.InferenceSession(target, sess_options=options, providers=list(providers))
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DSAUserError(f"ONNX Runtime cannot load '{path}': {first}") from exc


def polygraphy_runner(path: str | Path, name: str = "onnxruntime", model_bytes: bytes | None = None):
    """A Polygraphy ``OnnxrtRunner`` over our session factory (``model_bytes``: see :func:`session`)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    return OnnxrtRunner(lambda: session(path, model_bytes=model_bytes), name=name)




# ---------------------------------------------------------------------------------------------
# Sessions behind dsa_export.runtime.load

_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(int8)": "int8",
              "tensor(uint8)": "uint8", "tensor(bfloat16)": "bfloat16"}


def _specs(values) -> list[TensorSpec]:
    """TensorSpecs of ONNX Runtime NodeArgs (``tensor(float)`` -> float32, symbolic dims kept)."""
    return [
        TensorSpec(v.name, _ORT_TYPES.get(v.type, v.type), tuple(d if isinstance(d, (int, str)) else "?" for d in v.shape))
        for v in values
    ]


class OrtSession(Session):
    """A Session over an ``onnxruntime.InferenceSession``."""

    def __init__(self, ort_session, kind: str, manifest: Manifest | None = None, notes: list[str] | None = None,
                 enforce_profile: bool = False):
        inputs = manifest.inputs if manifest is not None and manifest.inputs else _specs(ort_session.get_inputs())
        outputs = manifest.outputs if manifest is not None and manifest.outputs else _specs(ort_session.get_outputs())
        super().__init__(kind=kind, inputs=inputs, outputs=outputs, manifest=manifest, notes=list(notes or []))
        self.ort_session = ort_session
        self.enforce_profile = enforce_profile

    def check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        if self.enforce_profile and self.manifest is not None:  # the TensorRT EP builds with this profile
            self.manifest.check_shapes(shapes, "the TensorRT execution provider's profile")
        else:
            super().check_shapes(shapes)

    def _run(self, feeds):
        outputs = self.ort_session.run([o.name for o in self.outputs], dict(feeds))
        return {spec.name: value for spec, value in zip(self.outputs, outputs)}


class OnnxFileSession:
    """A plain .onnx file on ONNX Runtime's CPU provider (no manifest)."""

    @staticmethod
    def open(path: str | Path, threads: int | None = None) -> OrtSession:
        return OrtSession(session(path, threads=threads), kind=f"onnxruntime (CPUExecutionProvider, {Path(path).name})")


class ArtifactSession:
    """The ``onnxruntime/`` artifact of a build."""

    @staticmethod
    def open(manifest: Manifest, threads: int | None = None, chain: str | None = None) -> OrtSession:
        import json

        import onnxruntime as ort

        section = manifest.onnxruntime or {}
        session_file = manifest.artifact(section.get("session", f"{ORT_DIR}/{ORT_SESSION_NAME}"))
        if not session_file.is_file():
            raise DSAUserError(f"{session_file} is missing; rebuild the folder with `dsa-export build`.")
        config = json.loads(session_file.read_text(encoding="utf-8"))
        available = set(ort.get_available_providers())
        chains = config.get("chains", [])
        if chain is not None:
            chains = [c for c in chains if c.get("name") == chain]
            if not chains:
                raise DSAUserError(f"{session_file} has no provider chain '{chain}'.")
        picked = next((c for c in chains if c["providers"] and c["providers"][0][0] in available), None)
        if picked is None:
            wanted = ", ".join(c["providers"][0][0] for c in chains)
            raise DSAUserError(f"this ONNX Runtime has none of the providers {wanted} (it has {', '.join(sorted(available))}).")
        model = (session_file.parent / picked["model"]).resolve()
        options = ort.SessionOptions()
        for key, value in config.get("session_options", {}).items():
            if key == "graph_optimization_level":
                value = getattr(ort.GraphOptimizationLevel, value)
            setattr(options, key, value)
        if threads:
            options.intra_op_num_threads = threads
        providers = [name for name, _ in picked["providers"] if name in available]
        provider_options = [opts for name, opts in picked["providers"] if name in available]
        try:
            ort_session = ort.InferenceSession(str(model), sess_options=options, providers=providers,
                                               provider_options=provider_options)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DSAUserError(f"ONNX Runtime cannot load '{model}': {first}") from exc
        kind = f"onnxruntime {ort.__version__} ({picked['name']} chain: {', '.join(providers)}; {model.name})"
        return OrtSession(ort_session, kind, manifest, config.get("notes", []), enforce_profile=picked["name"] == "tensorrt")
