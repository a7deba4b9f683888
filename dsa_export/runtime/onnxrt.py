"""ONNX Runtime sessions for our files (custom nodes run through their function bodies).

:class:`ArtifactSession` opens the ``onnxruntime/`` folder of a build: ``session.json`` lists
provider chains best first (TensorRT EP with the plugin-mode model, CUDA, CPU with the optimized
model), and the first chain whose provider this ONNX Runtime offers is used.

``session.json`` is data from the build folder, never instructions: only the session options and
provider options dsa-export writes are accepted (:data:`SESSION_OPTIONS`,
:data:`dsa_export.manifest.ORT_PROVIDER_OPTIONS`), model paths stay inside the folder and are
verified against ``manifest.json``, and the TensorRT execution provider's plugin library is not
taken from the file: it is the library this machine finds (as ``dsa-export plugins path`` does),
loaded only when its sha256 is the one the manifest records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsa_export import interrupts, quiet
from dsa_export.errors import DSAUserError
from dsa_export.integrity import REBUILD
from dsa_export.manifest import (
    ORT_DIR,
    ORT_PROVIDER_OPTIONS,
    ORT_SESSION_NAME,
    Manifest,
    TensorSpec,
)
from dsa_export.runtime.session import Session

#: Session options a session.json may set, and a check of each value.
SESSION_OPTIONS = {
    "graph_optimization_level": lambda v: v in ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED",
                                                "ORT_ENABLE_ALL"),
    "log_severity_level": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 4,
    "intra_op_num_threads": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "inter_op_num_threads": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "enable_cpu_mem_arena": lambda v: isinstance(v, bool),
}


#: How many sets of dim sizes found to fit a CPU session remembers (see ``OrtSession.check_memory``).
_FITTED_SIZES = 256

#: From this much external data on, a CPU session keeps the weights in place (see
#: :func:`weights_in_place`).
LARGE_WEIGHTS_BYTES = 1 << 30


def _graph(path: str | Path, model_bytes: bytes | None, graph):
    """The graph (weights not loaded): ``graph`` when the caller has read it, else parsed from
    ``model_bytes`` or read from ``path``; None when it cannot be read (ONNX Runtime reports an
    unreadable file itself)."""
    if graph is not None:
        return graph
    import onnx

    try:
        return (onnx.load_from_string(model_bytes) if model_bytes is not None
                else onnx.load(str(path), load_external_data=False))
    except Exception:
        return None


def external_data_bytes(path: str | Path, model_bytes: bytes | None = None, graph=None) -> int:
    """Bytes of the external-data files the graph at ``path`` (or ``model_bytes``, or ``graph``) names."""
    model = _graph(path, model_bytes, graph)
    if model is None:
        return 0
    folder = data_folder(path)
    locations = {entry.value for tensor in model.graph.initializer for entry in tensor.external_data
                 if entry.key == "location"}
    return sum((folder / name).stat().st_size for name in locations if (folder / name).is_file())


def weights_in_place(options, path: str | Path, model_bytes: bytes | None = None, graph=None) -> bool:
    """Run a model of large weights (:data:`LARGE_WEIGHTS_BYTES` of external data or more) from
    its memory-mapped external data: no pre-packed copy of each MatMul/Gemm weight
    (``session.disable_prepacking``) and no CPU arena (which holds a run's peak for the session's
    life). Measured on two DeepSeek-V3.2-width dense layers in fp32 (4.8 GB of weights) at 2100
    tokens: peak RSS 13.6 GiB with both, 6.1 GiB without. Returns whether it applied."""
    if external_data_bytes(path, model_bytes, graph) < LARGE_WEIGHTS_BYTES:
        return False
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.enable_cpu_mem_arena = False
    return True


def onnxruntime_model_bytes(path: str | Path, model_bytes: bytes | None = None, graph=None) -> bytes | None:
    """The graph at ``path`` (or ``model_bytes``) with the dsa bodies ONNX Runtime runs best
    (:func:`dsa_export.ops.onnx_ops.use_onnxruntime_bodies`), serialized without reading the
    external data; None when there is nothing to swap (a native file), so ``path`` (or
    ``model_bytes``) runs as it is. ONNX Runtime cannot tell which file these bytes came from:
    pass them with ``session.model_external_initializers_file_folder_path`` set, as
    :func:`session` does. ``graph``: the file read already (its bodies are swapped in place)."""
    from dsa_export.ops.onnx_ops import use_onnxruntime_bodies

    model = _graph(path, model_bytes, graph)
    if model is None:
        return None
    return model.SerializeToString() if use_onnxruntime_bodies(model) else None


def session(
    path: str | Path,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
    threads: int | None = None,
    memory_arena: bool = True,
    model_bytes: bytes | None = None,
    graph=None,
):
    """An ``onnxruntime.InferenceSession`` for ``path`` with a clear error if ORT rejects it.

    ``memory_arena=False`` makes every run allocate from and free to the system, so that the
    memory a run needs can be measured from outside (the benchmark does this). ``model_bytes``
    runs a modified copy of the graph at ``path`` (e.g. with extra outputs) whose external data
    is still read from beside ``path``: nothing is written next to the user's file. Models with
    large weights keep them in place (:func:`weights_in_place`). The session runs the trimmed
    sparse-attention body (:func:`onnxruntime_model_bytes`), in memory. ``graph``: the file (or
    ``model_bytes``) read already, as a copy this function may change (the file is then not read
    again).
    """
    import onnxruntime as ort

    quiet.quiet_onnxruntime(ort)
    read = _graph(path, model_bytes, graph)  # once: the checks, the weights' size and the body swap
    _check_external_data(path, model_bytes, REFUSED_EXPORT, read)
    options = ort.SessionOptions()
    options.log_severity_level = quiet.ort_severity()
    if threads:
        options.intra_op_num_threads = threads
    options.enable_cpu_mem_arena = memory_arena
    weights_in_place(options, path, model_bytes, read)
    model_bytes = onnxruntime_model_bytes(path, model_bytes, read) or model_bytes
    target: str | bytes = str(path)
    if model_bytes is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         str(data_folder(path)))
        target = model_bytes
    try:
        return ort.InferenceSession(target, sess_options=options, providers=list(providers))
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DSAUserError(f"ONNX Runtime cannot load '{path}': {first}") from exc


#: The advice after a refusal of :func:`_check_external_data`, for a file the user names and for a build.
REFUSED_EXPORT = "export the model again"


def data_folder(path: str | Path) -> Path:
    """The folder ONNX Runtime reads the external data of ``path`` from: the file's own folder (a
    link to the file is not followed, as ONNX Runtime does not follow it), resolved."""
    return Path(path).absolute().parent.resolve()


def _check_external_data(path: str | Path, model_bytes: bytes | None, remedy: str, graph=None) -> None:
    """Before ONNX Runtime opens ``path`` (or ``model_bytes``, whose external data is read beside
    ``path``): every external data location lies inside that folder and every tensor's bytes lie
    within its data file (:func:`dsa_export.integrity.check_external_data`). ONNX Runtime refuses
    locations out of the folder itself only from 1.32 on; this holds for every supported version."""
    from dsa_export.integrity import check_external_data

    model = _graph(path, model_bytes, graph)
    if model is not None:
        check_external_data(path, model, remedy=remedy)


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
                 enforce_profile: bool = True, graph_path: Path | None = None, memory=None):
        """``graph_path``: the plugin-mode .onnx whose dsa nodes the memory estimate reads (the
        optimized model has them inlined); None skips the estimate. ``memory``: that file's
        :class:`~dsa_export.runtime.memory.GraphMemory` when the caller has read the file already.

        The graph's memory facts are read here, once: running reads no file."""
        inputs = manifest.inputs if manifest is not None and manifest.inputs else _specs(ort_session.get_inputs())
        outputs = manifest.outputs if manifest is not None and manifest.outputs else _specs(ort_session.get_outputs())
        super().__init__(kind=kind, inputs=inputs, outputs=outputs, manifest=manifest, notes=list(notes or []))
        self.ort_session = ort_session
        self.enforce_profile = enforce_profile
        self.graph_path = graph_path
        #: the largest estimate (bytes) found to fit: a smaller run (a decode step after its
        #: prefill) is not checked against the machine's free memory again.
        self._fits_bytes = -1
        #: dim sizes already estimated and found to fit: a decode step of the same sizes as an
        #: earlier one (most steps of a paged graph: its sizes change once a page) skips the
        #: estimate, which costs ~0.7 ms on a 2-layer graph (measured: a tenth of a decode step).
        self._fitted: set[tuple[tuple[str, int], ...]] = set()
        self._graph_memory = None
        if graph_path is not None and "CPUExecutionProvider" == ort_session.get_providers()[0]:
            if memory is None:
                import onnx

                from dsa_export.runtime.memory import GraphMemory

                memory = GraphMemory.of(onnx.load(str(graph_path), load_external_data=False))
            self._graph_memory = memory

    def check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        if self.enforce_profile and self.manifest is not None:  # what the build declared and validated
            self.manifest.check_shapes(shapes, "the build")
        else:
            super().check_shapes(shapes)

    def check_memory(self, shapes: dict[str, tuple[int, ...]]) -> None:
        if self._graph_memory is None:
            return
        from dsa_export.runtime.memory import require_fits

        sizes = self._graph_memory.sizes(shapes)
        key = tuple(sorted(sizes.items()))
        if key in self._fitted:
            return
        need = self._graph_memory.estimate(sizes)
        if need.total > self._fits_bytes:  # else no larger than a run already found to fit
            asked = ", ".join(f"{name}={size}" for name, size in sizes.items())
            require_fits(need, f"running {asked or 'these inputs'} on ONNX Runtime's CPU provider",
                         fix="ask for smaller dims (--dims) or run the engine on a GPU")
            self._fits_bytes = need.total
        if len(self._fitted) >= _FITTED_SIZES:
            self._fitted.clear()
        self._fitted.add(key)

    def _options(self):
        import onnxruntime as ort

        options = ort.RunOptions()
        options.log_severity_level = quiet.ort_severity()
        return options

    def _run(self, feeds):
        options = self._options()

        def stop() -> None:
            options.terminate = True

        with interrupts.on_cancel(stop):
            outputs = self.ort_session.run([o.name for o in self.outputs], dict(feeds), options)
        interrupts.raise_if_cancelled()
        return {spec.name: value for spec, value in zip(self.outputs, outputs)}

    def binds_in_place(self) -> bool:
        """Whether :meth:`run_resident` can bind an output to an input's buffer (the CPU provider)."""
        return self.ort_session.get_providers()[0] == "CPUExecutionProvider"

    def run_resident(self, feeds: dict[str, Any], keep: set[str], alias: dict[str, str] | None = None
                     ) -> dict[str, Any]:
        """Run with inputs that may be this session's own earlier outputs, kept as ONNX Runtime
        values (the decode caches a pipeline stage keeps, :class:`~dsa_export.stages.session.LocalStage`);
        the outputs named in ``keep`` come back as such values, the others as numpy. Through IO
        binding: a kept cache is never copied into or out of numpy between steps. Host inputs are
        checked as :meth:`run` checks them; kept ones are the session's own outputs.

        ``alias`` ``{output: input}`` binds each such output to the OrtValue fed as that input, so a
        node that updates it in place (ScatterND, TensorScatter) writes only the changed rows; no
        other node may read the input (it holds the output's values once the update ran)."""
        import numpy as np
        import onnxruntime as ort

        if self.ort_session.get_providers()[0] != "CPUExecutionProvider":  # values would live on a device
            return self.run({name: value.numpy() if isinstance(value, ort.OrtValue) else value
                             for name, value in feeds.items()})
        shapes = {name: tuple(value.shape()) if isinstance(value, ort.OrtValue) else tuple(np.shape(value))
                  for name, value in feeds.items()}
        host = self._checked_feeds({name: value for name, value in feeds.items()
                                    if not isinstance(value, ort.OrtValue)}, shapes)
        binding = self.ort_session.io_binding()
        alive = []  # the host arrays must outlive the run
        for name, value in {**feeds, **host}.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                array = np.ascontiguousarray(value)
                alive.append(array)
                binding.bind_cpu_input(name, array)
        alias = alias or {}
        for spec in self.outputs:
            target = feeds.get(alias.get(spec.name, ""))
            if isinstance(target, ort.OrtValue):
                binding.bind_ortvalue_output(spec.name, target)
            else:
                binding.bind_output(spec.name, "cpu")
        options = self._options()

        def stop() -> None:
            options.terminate = True

        def run() -> None:
            with interrupts.on_cancel(stop):
                self.ort_session.run_with_iobinding(binding, options)
            interrupts.raise_if_cancelled()

        self._guarded(run)
        values = binding.get_outputs()
        return {spec.name: value if spec.name in keep else value.numpy() for spec, value in zip(self.outputs, values)}


class OnnxFileSession:
    """A plain .onnx file on ONNX Runtime's CPU provider (no manifest)."""

    @staticmethod
    def open(path: str | Path, threads: int | None = None) -> OrtSession:
        import onnx

        from dsa_export.manifest import io_specs

        path = Path(path)
        from dsa_export.runtime.memory import GraphMemory

        graph = onnx.load(str(path), load_external_data=False)  # read once for everything below
        # The graph's own record of token-id ranges (the vocabulary) checks inputs before they run;
        # both read the graph's nodes and values, before session() swaps its function bodies.
        inputs, _ = io_specs(graph)
        memory = GraphMemory.of(graph)
        session_ = OrtSession(session(path, threads=threads, graph=graph),
                              kind=f"onnxruntime (CPUExecutionProvider, {path.name})", graph_path=path,
                              memory=memory)
        ranges = {spec.name: spec.value_range for spec in inputs}
        session_.inputs = [TensorSpec(s.name, s.dtype, s.shape, ranges.get(s.name)) for s in session_.inputs]
        return session_


def _session_error(path: Path, what: str) -> DSAUserError:
    return DSAUserError(f"{path} {what}; {REBUILD}.")


def read_session_config(path: Path) -> dict[str, Any]:
    """``session.json``, its fields checked (see the module docstring)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _session_error(path, f"is not readable JSON ({exc})") from exc
    if not isinstance(config, dict) or not isinstance(config.get("chains"), list):
        raise _session_error(path, "has no list of provider chains")
    options = config.get("session_options", {})
    if not isinstance(options, dict):
        raise _session_error(path, "has session_options that are not an object")
    for key, value in options.items():
        if key not in SESSION_OPTIONS or not SESSION_OPTIONS[key](value):
            raise _session_error(path, f"sets the session option {key}={value!r}, which dsa-export does not write")
    for i, chain in enumerate(config["chains"]):
        if not (isinstance(chain, dict) and isinstance(chain.get("name"), str) and isinstance(chain.get("model"), str)
                and isinstance(chain.get("providers"), list) and chain["providers"]):
            raise _session_error(path, f"has a malformed provider chain {i}")
        for entry in chain["providers"]:
            if not (isinstance(entry, list) and len(entry) == 2 and entry[0] in ORT_PROVIDER_OPTIONS
                    and isinstance(entry[1], dict)):
                raise _session_error(path, f"names a provider dsa-export does not use in chain '{chain['name']}' "
                                           f"({entry!r:.80})")
            allowed = ORT_PROVIDER_OPTIONS[entry[0]]
            for key, value in entry[1].items():
                if key not in allowed or not isinstance(value, str):
                    raise _session_error(path, f"sets the {entry[0]} option {key}={value!r:.80}, which dsa-export "
                                               "does not write")
    if not isinstance(config.get("notes", []), list):
        raise _session_error(path, "has notes that are not a list")
    return config


def _plugin_library_for_ep(manifest: Manifest) -> tuple[str | None, str]:
    """(path of the static plugin library found here, or None; why) for the TensorRT EP: only a
    library whose sha256 is the manifest's is used."""
    section = manifest.onnxruntime or {}
    wanted = section.get("plugin_library_sha256")
    if not wanted:
        return None, "the build used no plugin library"
    from dsa_export.plugins import find_library, library_info

    found = find_library("static")
    if found is None:
        return None, "the static plugin library is not built here (run `dsa-export plugins build`)"
    digest = library_info(found).sha256
    if digest != wanted:
        return None, (f"the plugin library {found} (sha256 {digest[:12]}) is not the one the build used "
                      f"(sha256 {str(wanted)[:12]})")
    return str(found), f"plugin library {found} (sha256 matches the manifest)"


class ArtifactSession:
    """The ``onnxruntime/`` artifact of a build."""

    @staticmethod
    def open(manifest: Manifest, threads: int | None = None, chain: str | None = None, *,
             verify: bool = True) -> OrtSession:
        import onnxruntime as ort

        quiet.quiet_onnxruntime(ort)
        section = manifest.onnxruntime or {}
        session_file = manifest.artifact(section.get("session", f"{ORT_DIR}/{ORT_SESSION_NAME}"), "onnxruntime.session")
        if not session_file.is_file():
            raise DSAUserError(f"{session_file} is missing; {REBUILD}.")
        notes = manifest.verify([session_file], enabled=verify)
        config = read_session_config(session_file)
        available = set(ort.get_available_providers())
        chains = config["chains"]
        if chain is not None:
            chains = [c for c in chains if c.get("name") == chain]
            if not chains:
                raise DSAUserError(f"{session_file} has no provider chain '{chain}'.")
        picked = None
        for candidate in chains:
            if candidate["providers"][0][0] not in available:
                continue
            if candidate["providers"][0][0] == "TensorrtExecutionProvider":
                library, why = _plugin_library_for_ep(manifest)
                if manifest.onnxruntime and manifest.onnxruntime.get("plugin_library_sha256") and library is None:
                    notes.append(f"skipped the TensorRT execution provider: {why}")
                    continue
                candidate = _with_plugin_library(candidate, library, session_file.parent)
            picked = candidate
            break
        if picked is None:
            wanted = ", ".join(c["providers"][0][0] for c in chains)
            raise DSAUserError(f"this ONNX Runtime has none of the providers {wanted} (it has {', '.join(sorted(available))}).")
        from dsa_export.integrity import confined

        model = confined(manifest.folder, manifest.relative(session_file.parent / picked["model"]),
                         f"{session_file} field chains.{picked['name']}.model ('{picked['model']}')")
        notes += manifest.verify([model], enabled=verify)
        options = ort.SessionOptions()
        for key, value in config.get("session_options", {}).items():
            if key == "graph_optimization_level":
                value = getattr(ort.GraphOptimizationLevel, value)
            setattr(options, key, value)
        options.log_severity_level = quiet.ort_severity()
        if threads:
            options.intra_op_num_threads = threads
        providers = [name for name, _ in picked["providers"] if name in available]
        provider_options = [opts for name, opts in picked["providers"] if name in available]
        target: str | bytes = str(model)
        # The CPU and CUDA chains load the optimized model (bodies inlined, trimmed attention
        # already) or, where none was saved, the plain file: that one gets the trimmed body in
        # memory. The TensorRT chain keeps the file's bodies, which TensorRT builds.
        read = _graph(model, None, None)  # once: the checks, the body swap and the weights' size
        _check_external_data(model, None, REBUILD, read)
        weights_in_place(options, model, graph=read)
        swapped = None if providers[0] == "TensorrtExecutionProvider" else onnxruntime_model_bytes(model, graph=read)
        if swapped is not None:
            options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                             str(data_folder(model)))
            target = swapped
        try:
            ort_session = ort.InferenceSession(target, sess_options=options, providers=providers,
                                               provider_options=provider_options)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DSAUserError(f"ONNX Runtime cannot load '{model}': {first}") from exc
        kind = f"onnxruntime {ort.__version__} ({picked['name']} chain: {', '.join(providers)}; {model.name})"
        graph = manifest.data.get("model", {}).get("onnx")
        graph_path = manifest.artifact(graph, "model.onnx") if isinstance(graph, str) else None
        notes = [str(n) for n in config.get("notes", [])] + notes
        return OrtSession(ort_session, kind, manifest, notes, enforce_profile=True,
                          graph_path=graph_path if graph_path is not None and graph_path.is_file() else None)


def _with_plugin_library(chain: dict[str, Any], library: str | None, folder: Path) -> dict[str, Any]:
    """The TensorRT chain with the plugin library found here (never the recorded path) and its
    engine cache kept inside the artifact folder."""
    providers = []
    for name, options in chain["providers"]:
        options = dict(options)
        if name == "TensorrtExecutionProvider":
            options.pop("trt_extra_plugin_lib_paths", None)
            if library is not None:
                options["trt_extra_plugin_lib_paths"] = library
            if "trt_engine_cache_path" in options:
                cache = options["trt_engine_cache_path"]
                options["trt_engine_cache_path"] = str(_inside(folder, cache))
        providers.append([name, options])
    return {**chain, "providers": providers}


def _inside(folder: Path, relative: str) -> Path:
    from dsa_export.integrity import confined

    return confined(folder, relative, "the TensorRT engine cache path in session.json")
