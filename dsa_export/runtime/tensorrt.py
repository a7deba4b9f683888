"""A TensorRT (10/11) or TensorRT-RTX engine behind the :class:`Session` interface.

Order of work when opening: the engine gate reads ``manifest.json`` and compares it with this
machine (TensorRT version, GPU, plugin library hash) before anything is deserialized; then the
plugin library is registered (TensorRT only; TensorRT-RTX has no plugins), the engine is
deserialized and an execution context created. Each run checks the input shapes against the
manifest's optimization profile, sets them on the context, allocates inputs and outputs as torch
CUDA tensors, and enqueues with ``execute_async_v3`` on a dedicated CUDA stream.
"""

from __future__ import annotations

from pathlib import Path

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


class EngineSession(Session):
    """Use :meth:`open`; the constructor takes already deserialized objects (tests pass fakes)."""

    def __init__(self, trt, engine, manifest: Manifest, device: int, torch, kind: str, notes: list[str]):
        super().__init__(kind=kind, inputs=manifest.inputs, outputs=manifest.outputs, manifest=manifest, notes=notes)
        self.trt = trt
        self.engine = engine
        self.context = engine.create_execution_context()
        if self.context is None:
            raise DSAUserError("TensorRT could not create an execution context (out of GPU memory?).")
        self.torch = torch
        self.device = torch.device("cuda", device)
        self.stream = torch.cuda.Stream(device=self.device)
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if n not in self.input_names]

    @classmethod
    def open(cls, path: Path, manifest: Manifest, device: int = 0) -> EngineSession:
        from dsa_export.compat import gate_engine
        from dsa_export.errors import require

        requirements = gate_engine(path, device=device)
        trt = runtime_module(requirements.backend)
        torch = require("torch", "Running a TensorRT engine from Python")
        if not torch.cuda.is_available():
            raise DSAUserError("Running an engine needs a CUDA build of torch that sees the GPU; install one.")
        notes = []
        logger = trt.Logger(trt.Logger.WARNING)
        if requirements.plugin_library_sha256:
            from dsa_export.plugins import load_into_tensorrt

            library = load_into_tensorrt(trt)  # the gate has matched its sha256 with the manifest
            notes.append(f"plugin library {library}")
        runtime = trt.Runtime(logger)
        if requirements.version_compatible:
            runtime.engine_host_code_allowed = True  # the lean runtime embedded in the plan
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if engine is None:
            raise DSAUserError(f"{trt.__name__} {trt.__version__} could not deserialize {path}; rebuild it here.")
        kind = f"{requirements.backend} {trt.__version__} engine ({path.name})"
        session = cls(trt, engine, manifest, device, torch, kind, notes)
        session._runtime = runtime  # keep alive as long as the engine
        session._logger = logger
        return session

    def check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.manifest.check_shapes(shapes, "the engine")  # type: ignore[union-attr]

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        engine, context = self.engine, self.context
        keep = []
        for name in self.input_names:
            tensor = torch.from_numpy(np.ascontiguousarray(feeds[name])).to(self.device, torch_dtype(torch, engine.get_tensor_dtype(name)))
            keep.append(tensor)
            if not context.set_input_shape(name, tuple(tensor.shape)):
                raise DSAUserError(f"the engine rejected shape {tuple(tensor.shape)} for input '{name}'.")
            context.set_tensor_address(name, tensor.data_ptr())
        outputs = {}
        for name in self.output_names:
            shape = tuple(context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise DSAUserError(f"the shape of output '{name}' is not known after setting the inputs ({shape}).")
            out = torch.empty(shape, dtype=torch_dtype(torch, engine.get_tensor_dtype(name)), device=self.device)
            context.set_tensor_address(name, out.data_ptr())
            outputs[name] = out
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # input copies finish first
        if not context.execute_async_v3(self.stream.cuda_stream):
            raise DSAUserError("TensorRT failed to enqueue the engine (see the log above).")
        self.stream.synchronize()
        del keep
        return {name: (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy() for name, t in outputs.items()}


__all__ = ["EngineSession", "runtime_module"]
