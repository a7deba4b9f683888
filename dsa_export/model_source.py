"""What an export starts from (:class:`ModelSource`): a torch module, its example inputs and the
reference it was resolved from, with the ways to make inputs of other shapes. Resolving what the
user typed into one is :mod:`dsa_export.sources` (built-ins, factories) and
:mod:`dsa_export.hf.source` (Hugging Face checkpoints); both build this record, which imports
neither.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsa_export.errors import DSAUserError
from dsa_export.model_ref import ModelReference


@dataclass
class ModelSource:
    reference: ModelReference  # what was resolved; stored in the exported file's metadata
    module: Any  # torch.nn.Module (on the meta device when ``weights`` supplies its tensors)
    example_inputs: dict[str, Any]
    output_names: list[str] = field(default_factory=lambda: ["logits"])
    config: dict | None = None
    file_sha256: str | None = None
    #: Inputs the module takes positionally, in this order (None: keyword arguments).
    input_names: list[str] | None = None
    #: ``{input: {axis: dim name}}``; None: axis 0 is "batch", axis 1 "sequence".
    dynamic_axes: dict[str, dict[int, str]] | None = None
    #: Loads the module validation compares against when it is not ``module`` itself (e.g. the
    #: transformers model). Called on first use only: exporting never pays for a second copy.
    reference_loader: Callable[[], Any] | None = None
    #: Makes inputs of another shape when the source is neither built-in nor a factory.
    make_inputs: Callable[[int, int, int], dict[str, Any]] | None = None
    #: The user's ``file.py:factory``, called again for inputs of other shapes.
    factory: Callable[..., Any] | None = None
    #: ``{initializer name: tensor source}`` for a module on the meta device: the exporter streams
    #: each tensor from here into the file (see :mod:`dsa_export.export.external`).
    weights: dict[str, Any] | None = None
    #: False when the module is already in the export's precision (mixed dtypes, FP8 weights), so
    #: the exporter must not cast it.
    cast: bool = True
    #: The export dtype the module was built in (None: fp32 unless the settings say otherwise).
    dtype: str | None = None
    #: The lowest standard opset the graph needs (blocked DequantizeLinear for FP8 weights: 21).
    min_opset: int | None = None
    #: Export Linear layers as Gemm(transB=1) on a 2-D view, so their weights keep the stored
    #: ``[out, in]`` layout: no transposed copy is made while exporting (or stored in the file).
    keep_weight_layout: bool = False
    #: Inputs whose example keeps its dtype whatever the export's (an FP8 cache's float32 scales
    #: and bf16 RoPE pools).
    fixed_dtype_inputs: tuple[str, ...] = ()
    #: Loads the module validation runs when it is neither ``module`` nor ``reference_module``
    #: (a meta-device module's weights materialized).
    module_loader: Callable[[], Any] | None = None

    @property
    def spec(self) -> str:
        """Human-readable form of :attr:`reference`."""
        return self.reference.describe()

    @functools.cached_property
    def runnable_module(self) -> Any:
        """``module`` with real weights (loaded now when it lives on the meta device)."""
        return self.module_loader() if self.module_loader is not None else self.module

    @functools.cached_property
    def reference_module(self) -> Any:
        """The independent reference (loaded now), or None when ``module`` is its own reference."""
        return self.reference_loader() if self.reference_loader is not None else None

    def inputs_for(self, batch: int, seq_len: int, seed: int = 0) -> dict[str, Any]:
        """Inputs of another shape: rebuilt for built-ins, by calling the factory again for files."""
        return _inputs_for(self, batch, seq_len, seed)


def call_factory(factory, batch: int | None, seq_len: int | None):
    params = inspect.signature(factory).parameters
    kwargs = {}
    if batch is not None and "batch" in params:
        kwargs["batch"] = batch
    if seq_len is not None and "seq_len" in params:
        kwargs["seq_len"] = seq_len
    try:
        result = factory(**kwargs)
    except Exception as exc:
        raise DSAUserError(f"the model factory raised {type(exc).__name__}: {exc}; fix the factory.") from exc
    if not (isinstance(result, tuple) and len(result) in (2, 3)):
        raise DSAUserError("the model factory must return (module, example_inputs[, output_names]).")
    module, inputs = result[0], result[1]
    names = list(result[2]) if len(result) == 3 else None
    if names is not None and (not names or not all(isinstance(n, str) and n for n in names)):
        raise DSAUserError("the model factory's output names must be a non-empty list of non-empty strings.")
    if names is not None and len(set(names)) != len(names):
        raise DSAUserError(f"the model factory names an output twice ({', '.join(names)}); give each output its own name.")
    import torch

    if not isinstance(module, torch.nn.Module):
        raise DSAUserError("the model factory must return a torch.nn.Module first.")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(inputs, (tuple, list)):
        arg_names = [p for p in inspect.signature(module.forward).parameters][: len(inputs)]
        inputs = dict(zip(arg_names, inputs))
    if not isinstance(inputs, dict) or not all(isinstance(v, torch.Tensor) for v in inputs.values()):
        raise DSAUserError("example_inputs must be a tensor, a tuple of tensors or a dict of tensors.")
    clash = sorted(set(names or ["logits"]) & set(inputs))
    if clash:
        raise DSAUserError(f"the model factory names an output '{clash[0]}' like one of its inputs; an ONNX graph needs "
                           "distinct input and output names, so rename the output.")
    return module.eval(), inputs, names


def _inputs_for(source: ModelSource, batch: int, seq_len: int, seed: int) -> dict[str, Any]:
    if source.make_inputs is not None:
        return source.make_inputs(batch, seq_len, seed)
    if source.reference.kind == "builtin":
        from dsa_export.nn import example_inputs

        return example_inputs(source.module.config, batch, seq_len, seed)
    factory = source.factory
    if factory is not None and {"batch", "seq_len"} & set(inspect.signature(factory).parameters):
        _, inputs, _ = call_factory(factory, batch, seq_len)
        return inputs
    raise DSAUserError(
        f"the factory of '{source.spec}' takes no batch/seq_len arguments, so inputs of other shapes "
        "cannot be made; add `batch` and `seq_len` parameters to it."
    )


__all__ = ["ModelSource", "call_factory"]
