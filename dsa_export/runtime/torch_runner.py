"""A Polygraphy runner for a torch module, on CPU or CUDA.

Polygraphy's own ``PytRunner`` moves every input to CUDA, so it cannot serve as the reference on a
CPU-only machine; this runner keeps the module's device and dtype and otherwise behaves like any
Polygraphy runner (``activate`` / ``infer`` / ``deactivate``, usable by ``Comparator.run``).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.datatype import DataType


class TorchRunner(BaseRunner):
    def __init__(self, module, input_metadata: TensorMetadata, output_names: list[str], name: str | None = None,
                 input_order: list[str] | None = None, release_on_deactivate: bool = False):
        """
        Args:
            module: a callable ``torch.nn.Module`` taking the inputs as keyword arguments.
            input_metadata: names, dtypes and shapes of the inputs (as in the ONNX file).
            output_names: names given to the module's outputs, in order.
            input_order: pass the inputs positionally in this order instead of by keyword.
            release_on_deactivate: drop the module when the runner is deactivated (after
                ``Comparator.run`` has run it on every input), so its memory is free for the
                runners after it; the runner cannot be activated again.
        """
        super().__init__(name=name, prefix="torch-runner")
        self.module = module
        self.input_order = input_order
        self.input_metadata = input_metadata
        self.output_names = list(output_names)
        self.release_on_deactivate = release_on_deactivate

    def activate_impl(self) -> None:
        self.module.eval()

    def get_input_metadata_impl(self) -> TensorMetadata:
        return self.input_metadata

    def infer_impl(self, feed_dict):
        import torch

        # Modules loaded for a few layers keep the rest of the model on the meta device.
        param = next((p for p in self.module.parameters() if p.device.type != "meta"), None)
        device = param.device if param is not None else torch.device("cpu")
        float_dtype = param.dtype if param is not None else torch.float32
        kwargs = {}
        for name, value in feed_dict.items():
            tensor = torch.from_numpy(np.ascontiguousarray(value)).to(device)
            kwargs[name] = tensor.to(float_dtype) if tensor.is_floating_point() else tensor
        start = time.perf_counter()
        with torch.no_grad():
            if self.input_order is not None:
                outputs = self.module(*(kwargs[n] for n in self.input_order))
            else:
                outputs = self.module(**kwargs)
        self.inference_time = time.perf_counter() - start
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        elif isinstance(outputs, dict):
            outputs = tuple(outputs.values())
        elif hasattr(outputs, "logits"):  # a transformers ModelOutput
            outputs = (outputs.logits,)
        result = OrderedDict()
        for name, out in zip(self.output_names, outputs):
            out = out.detach().cpu()
            result[name] = (out.float() if out.dtype == torch.bfloat16 else out).numpy()
        return result

    def deactivate_impl(self) -> None:
        if self.release_on_deactivate:
            release = getattr(self.module, "release", None)
            if release is not None:
                release()
            self.module = None
            import gc

            gc.collect()


def metadata_from_onnx(model) -> TensorMetadata:
    """Polygraphy input metadata of an ONNX ModelProto's graph inputs."""
    from onnx import helper

    meta = TensorMetadata()
    initializers = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        np_dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        shape = [d.dim_param or d.dim_value for d in tensor_type.shape.dim]
        meta.add(value.name, dtype=DataType.from_dtype(np_dtype), shape=shape)
    return meta
