"""A TensorRT (10/11) or TensorRT-RTX engine behind the :class:`Session` interface.

Order of work when opening: the engine gate reads ``manifest.json`` and compares it with this
machine (TensorRT version, GPU, plugin library hash) before anything is deserialized; then the
plugin library is registered (TensorRT only, once per process; TensorRT-RTX has no plugins, and a
version-compatible plan that carries the library loads it itself), the engine is deserialized
and an execution context created. Each run checks the input shapes against the manifest's
optimization profiles, selects the first profile that holds them, sets the shapes on the
context, allocates inputs and outputs as torch CUDA tensors (an output the engine writes in place
into an input, ``get_aliased_input_tensor``, is bound to that input's buffer), and enqueues with
``execute_async_v3`` on a dedicated CUDA stream.

Everything (the runtime, deserialization, the context, the stream, each run) happens with the
session's GPU current, so that stages of a pipeline on different GPUs of one process each use
their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dsa_export.errors import DSAUserError
from dsa_export.manifest import Manifest
from dsa_export.runtime.session import Session

#: TensorRT DataType names -> torch dtype attribute names.
TORCH_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
                "INT8": "int8", "UINT8": "uint8", "BOOL": "bool", "FP8": "float8_e4m3fn"}
RTX_MODULES = ("tensorrt_rtx", "tensorrt_rtx_bindings")


def runtime_module(backend: str):
    """The Python module that deserializes engines of ``backend``."""
    import importlib

    from dsa_export.errors import require

    if backend == "tensorrt-rtx":
        for name in RTX_MODULES:
            try:
                return importlib.import_module(name)
            except ImportError:
                continue
        raise DSAUserError("Running a TensorRT-RTX engine needs TensorRT-RTX; run `pip install dsa-export[rtx]`.")
    return require("tensorrt", "Running a TensorRT engine")


def torch_dtype(torch, trt_dtype) -> object:
    name = getattr(trt_dtype, "name", str(trt_dtype).rsplit(".", 1)[-1])
    if name not in TORCH_DTYPES:
        raise DSAUserError(f"engine I/O of type {name} is not supported by the Python runtime.")
    return getattr(torch, TORCH_DTYPES[name])


def manifest_profiles(manifest: Manifest) -> list[dict[str, tuple[int, int, int]]]:
    """The ``{dim: (min, opt, max)}`` of each optimization profile, in engine order
    (:attr:`Manifest.profile_sets`), refusing a damaged ``profiles.all``: a profile index chosen
    from it must be the engine's."""
    every = (manifest.data.get("profiles") or {}).get("all")

    def valid(v) -> bool:
        return (isinstance(v, list) and len(v) == 3 and v[0] <= v[1] <= v[2]
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v))

    if every is not None and not (isinstance(every, list) and every and all(
            isinstance(dims, dict) and all(valid(v) for v in dims.values()) for dims in every)):
        raise DSAUserError(f"{manifest.path} has an invalid field profiles.all (not a list of "
                           "{dim: [min, opt, max]}); rebuild the folder with `dsa-export build`.")
    return manifest.profile_sets


def engine_aliases(engine, inputs: list[str], outputs: list[str]) -> dict[str, str]:
    """``{output: input}`` pairs ``engine`` writes in place (``ICudaEngine::getAliasedInputTensor``,
    in the Python API from TensorRT 10.15; an engine of an older one reports none), each bound to one
    address when the engine runs."""
    query = getattr(engine, "get_aliased_input_tensor", None)
    if query is None:
        return {}
    pairs = {name: query(name) for name in outputs}
    return {name: source for name, source in pairs.items() if source and source in inputs}


def _describe(dims: dict[str, tuple[int, int, int]]) -> str:
    return ", ".join(f"{name} {lo}..{hi}" for name, (lo, _opt, hi) in dims.items()) or "fixed shapes"


class EngineSession(Session):
    """Use :meth:`open`; the constructor takes already deserialized objects (tests pass fakes)."""

    def __init__(self, trt, engine, manifest: Manifest, device: int, torch, kind: str, notes: list[str]):
        super().__init__(kind=kind, inputs=manifest.inputs, outputs=manifest.outputs, manifest=manifest, notes=notes)
        self.trt = trt
        self.engine = engine
        self.torch = torch
        self.device_index = device
        self.device = torch.device("cuda", device)
        self.profiles = manifest_profiles(manifest)
        built = getattr(engine, "num_optimization_profiles", None)
        if isinstance(built, int) and built != len(self.profiles):
            raise DSAUserError(f"the engine has {built} optimization profile(s) but {manifest.path} records "
                               f"{len(self.profiles)}; rebuild the folder with `dsa-export build`.")
        with torch.cuda.device(device):
            self.context = engine.create_execution_context()
            if self.context is None:
                raise DSAUserError("TensorRT could not create an execution context (out of GPU memory?).")
            self.stream = torch.cuda.Stream(device=self.device)
        self.active_profile = 0  # a new context uses profile 0
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if n not in self.input_names]
        #: ``{output: input}`` the engine writes in place: both must be bound to one address.
        self.aliased = engine_aliases(engine, self.input_names, self.output_names)
        self._written_inputs = {source: name for name, source in self.aliased.items()}  # input -> its output

    @classmethod
    def open(cls, path: Path, manifest: Manifest, device: int = 0, probe=None) -> EngineSession:
        """``probe``: a :class:`~dsa_export.compat.engine_gate.GateProbe` shared by the engines of one
        session (None: the gate probes for this engine alone)."""
        from dsa_export.compat import gate_engine
        from dsa_export.errors import require

        requirements = gate_engine(path, probe, device=device, manifest_data=manifest.data)
        trt = runtime_module(requirements.backend)
        torch = require("torch", "Running a TensorRT engine from Python")
        if not torch.cuda.is_available():
            raise DSAUserError("Running an engine needs a CUDA build of torch that sees the GPU; install one.")
        notes = []
        logger = trt.Logger(trt.Logger.WARNING)
        with torch.cuda.device(device):
            if requirements.plugins_serialized:
                notes.append("plugin library serialized in the engine (loaded by TensorRT from the plan)")
            elif requirements.plugin_library_sha256:
                from dsa_export.plugins import load_into_tensorrt

                library = load_into_tensorrt(trt)  # the gate has matched its sha256 with the manifest
                notes.append(f"plugin library {library}")
            runtime = trt.Runtime(logger)
            if requirements.version_compatible:
                runtime.engine_host_code_allowed = True  # the lean runtime (and plugin libraries) embedded in the plan
            engine = runtime.deserialize_cuda_engine(path.read_bytes())
            if engine is None:
                raise DSAUserError(f"{trt.__name__} {trt.__version__} could not deserialize {path}; rebuild it here.")
            kind = f"{requirements.backend} {trt.__version__} engine ({path.name})"
            session = cls(trt, engine, manifest, device, torch, kind, notes)
        session._runtime = runtime  # keep alive as long as the engine
        session._logger = logger
        return session

    def check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Shapes inside any one of the optimization profiles pass (see :meth:`select_profile`)."""
        self.select_profile(shapes)

    def select_profile(self, shapes: dict[str, tuple[int, ...]]) -> int:
        """Index of the first optimization profile whose ranges hold ``shapes``; DSAUserError if none does."""
        from dsa_export.manifest import check_shapes

        if len(self.profiles) == 1:
            check_shapes(self.inputs, self.profiles[0], shapes, "the engine")
            return 0
        check_shapes(self.inputs, {}, shapes, "the engine")  # names, ranks, fixed sizes, shared dims
        for index, dims in enumerate(self.profiles):
            try:
                check_shapes(self.inputs, dims, shapes, "the engine")
            except DSAUserError:
                continue
            return index
        given = ", ".join(f"'{name}' {list(shape)}" for name, shape in shapes.items())
        profiles = "; ".join(f"profile {i}: {_describe(dims)}" for i, dims in enumerate(self.profiles))
        raise DSAUserError(f"the input shapes ({given}) fit none of the engine's {len(self.profiles)} optimization "
                           f"profiles ({profiles}); pass shapes within one of them or rebuild with a profile that "
                           "holds them.")

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.torch.cuda.device(self.device_index):
            return self._run_on_device(feeds)

    def run_resident(self, feeds: dict[str, Any], keep: set[str], alias: dict[str, str] | None = None
                     ) -> dict[str, Any]:
        """Run with inputs that may be torch tensors already on this GPU (the decode caches a
        pipeline stage keeps, :class:`~dsa_export.stages.session.LocalStage`); the outputs named in
        ``keep`` stay there as torch tensors, the others come back as numpy. Host inputs are
        checked as :meth:`run` checks them; device ones are the engine's own earlier outputs.

        ``alias`` ``{output: input}``: where the engine reports the same pair (:attr:`aliased`, from
        ``get_aliased_input_tensor``: the DSAPagedCacheWrite plugin of a build with the plugin
        library on TensorRT 10.3+, or TensorRT's IKVCacheUpdateLayer) the output is bound to the
        buffer fed as that input and written in place: a device tensor fed there holds the output
        afterwards, and the output returned is that tensor. A pair the engine does not report comes
        back in its own buffer (TensorRT's scatter layer copies the pool into it), as does
        everything on a TensorRT without ``get_aliased_input_tensor`` (before 10.15)."""
        from dsa_export.manifest import check_feeds

        host = {name: value for name, value in feeds.items() if not self.torch.is_tensor(value)}
        host = check_feeds([spec for spec in self.inputs if spec.name in host], host, "the model")
        with self.torch.cuda.device(self.device_index):
            return self._run_on_device({**feeds, **host}, keep, alias or {})

    def _use_profile(self, index: int) -> None:
        if index == self.active_profile:
            return
        try:
            switched = self.context.set_optimization_profile_async(index, self.stream.cuda_stream)
        except RuntimeError as exc:  # the bindings raise where the C++ API returns false
            switched, why = False, f" ({exc})"
        else:
            why = ""
        if not switched:
            raise DSAUserError(f"TensorRT could not switch the execution context to optimization profile {index}{why}; "
                               "see the log above.")
        self.active_profile = index

    def _run_on_device(self, feeds: dict[str, Any], resident: set[str] = frozenset(),
                       alias: dict[str, str] | None = None) -> dict[str, Any]:
        torch = self.torch
        engine, context = self.engine, self.context
        # The shape and address calls below apply to the profile selected here.
        self._use_profile(self.select_profile({name: tuple(value.shape) for name, value in feeds.items()}))
        bound = {}
        for name in self.input_names:
            value = feeds[name]
            tensor = (value if torch.is_tensor(value) else torch.from_numpy(np.ascontiguousarray(value))).to(
                self.device, torch_dtype(torch, engine.get_tensor_dtype(name)))
            written = self._written_inputs.get(name)
            if written is not None and torch.is_tensor(value) and tensor.data_ptr() == value.data_ptr() \
                    and (alias or {}).get(written) != name:
                tensor = tensor.clone()  # the engine writes this input: a device tensor fed unasked stays as it was
            bound[name] = tensor
            if not context.set_input_shape(name, tuple(tensor.shape)):
                raise DSAUserError(f"the engine rejected shape {tuple(tensor.shape)} for input '{name}'.")
            self._set_address(name, tensor)
        outputs = {}
        for name in self.output_names:
            shape = tuple(context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise DSAUserError(f"the shape of output '{name}' is not known after setting the inputs ({shape}).")
            if name in self.aliased:
                out = bound[self.aliased[name]]  # written in place into the input's buffer
                if tuple(out.shape) != shape:
                    raise DSAUserError(f"the engine writes output '{name}' {shape} into input '{self.aliased[name]}' "
                                       f"{tuple(out.shape)}, whose shape differs; rebuild the engine.")
            else:
                out = torch.empty(shape, dtype=torch_dtype(torch, engine.get_tensor_dtype(name)), device=self.device)
            self._set_address(name, out)
            outputs[name] = out
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # input copies finish first
        if not context.execute_async_v3(self.stream.cuda_stream):
            raise DSAUserError("TensorRT failed to enqueue the engine (see the log above).")
        self.stream.synchronize()
        del bound
        return {name: t if name in resident else (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy()
                for name, t in outputs.items()}

    def _set_address(self, name: str, tensor) -> None:
        if not self.context.set_tensor_address(name, tensor.data_ptr()):
            raise DSAUserError(f"TensorRT refused the device address of tensor '{name}' (not an I/O tensor of this "
                               "engine, or misaligned memory); see the log above.")


__all__ = ["EngineSession", "engine_aliases", "manifest_profiles", "runtime_module"]
