"""Resolve what the user calls MODEL into a torch module, example inputs and a model reference.

MODEL is a built-in name (``tiny``), ``builtin:tiny``, ``path/to/file.py:factory`` where the
factory returns ``(module, example_inputs)`` and may accept ``batch`` / ``seq_len`` keywords, or a
Hugging Face directory (see :mod:`dsa_export.hf.source`). What was resolved is recorded as a
:class:`~dsa_export.model_ref.ModelReference` in the exported file's metadata so ``validate``
can rebuild the reference.

A factory is code, and dsa-export runs code only when the user names it on the command line: a
reference *recorded in a file* (an .onnx's metadata, a manifest, a pipeline) may rebuild a built-in
model or a Hugging Face checkpoint (read as data: config.json and safetensors, never pickles or
remote code), but a recorded ``file.py:factory`` is refused with the ``--reference`` to pass
(:func:`resolve_reference`), so a file cannot make dsa-export import a Python file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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


def _builtin(name: str, batch: int, seq_len: int, seed: int) -> ModelSource:
    from dsa_export.nn import BUILTIN_CONFIGS, build_builtin, example_inputs

    if name not in BUILTIN_CONFIGS:
        raise DSAUserError(
            f"'{name}' is neither a built-in model ({', '.join(BUILTIN_CONFIGS)}) nor a "
            "path/file.py:factory; pass one of those."
        )
    module = build_builtin(name)
    return ModelSource(
        reference=ModelReference("builtin", name=name),
        module=module,
        example_inputs=example_inputs(module.config, batch, seq_len, seed),
        config=module.config.to_dict(),
    )


def _load_factory(path: Path, attr: str):
    if path.is_dir():
        raise DSAUserError(f"model file '{path}' is a folder; pass path/file.py:factory.")
    if not path.is_file():
        raise DSAUserError(f"model file '{path}' does not exist; pass an existing path/file.py:factory.")
    module_name = "dsa_export_user_model_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise DSAUserError(f"cannot import '{path}' as Python; pass a .py file.")
    user_module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = user_module
    try:
        spec.loader.exec_module(user_module)
    except Exception as exc:
        raise DSAUserError(f"importing '{path}' failed with {type(exc).__name__}: {exc}; fix the file.") from exc
    factory = getattr(user_module, attr, None)
    if not callable(factory):
        raise DSAUserError(f"'{path}' has no callable '{attr}'; name a function returning (module, inputs).")
    return factory


def _call_factory(factory, batch: int | None, seq_len: int | None):
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


def resolve(spec: str | ModelReference | None, *, batch: int = 2, seq_len: int = 64, seed: int = 0,
            dtype: str | None = None) -> ModelSource:
    """Turn a MODEL argument (or a recorded reference) into a :class:`ModelSource`.

    A string is what the user typed, so a ``file.py:factory`` in it is imported and called; a
    :class:`ModelReference` is a recorded one and goes through :func:`resolve_reference`, which runs
    no factory. ``dtype`` (fp32/fp16/bf16) matters for Hugging Face checkpoints only, whose modules are built
    in the export's precision (None: the checkpoint's own dtype).
    """
    from dsa_export.nn import DEFAULT_MODEL

    if isinstance(spec, ModelReference):
        return resolve_reference(spec, batch=batch, seq_len=seq_len, seed=seed, dtype=dtype)
    spec = spec or DEFAULT_MODEL
    if spec.startswith("builtin:"):
        return _builtin(spec.split(":", 1)[1], batch, seq_len, seed)
    if ".py:" in spec or spec.endswith(".py"):
        path_text, _, attr = spec.rpartition(":") if ".py:" in spec else (spec, ":", "")
        if not attr:
            raise DSAUserError(f"'{spec}' names no factory; use path/file.py:factory.")
        path = Path(path_text).expanduser()
        factory = _load_factory(path, attr)
        module, inputs, names = _call_factory(factory, batch, seq_len)
        from dsa_export.fileio import sha256_file

        sha = sha256_file(path)
        return ModelSource(
            reference=ModelReference("factory", name=attr, path=str(path.resolve()), sha256=sha),
            module=module, example_inputs=inputs, output_names=names or ["logits"], file_sha256=sha, factory=factory,
        )
    if Path(spec).is_dir():
        from dsa_export.hf.source import hf_reference, hf_source

        return hf_source(hf_reference(spec), batch=batch, seq_len=seq_len, seed=seed, dtype=dtype)
    return _builtin(spec, batch, seq_len, seed)


def resolve_reference(reference: ModelReference, *, batch: int = 2, seq_len: int = 64, seed: int = 0,
                      dtype: str | None = None, trusted: bool = False) -> ModelSource:
    """Rebuild the :class:`ModelSource` a recorded reference names (paths already absolute).

    A ``factory`` reference is code: it runs only when ``trusted`` (the user named that factory);
    otherwise it is refused with the ``--reference`` to pass. ``module`` references cannot be
    rebuilt at all.
    """
    if reference.kind == "builtin":
        return _builtin(reference.name, batch, seq_len, seed)
    if reference.kind == "factory":
        if not trusted:
            raise UntrustedFactoryError(reference)
        return resolve(f"{reference.path}:{reference.name}", batch=batch, seq_len=seq_len, seed=seed)
    if reference.kind == "module":
        raise DSAUserError(f"the recorded reference '{reference.name}' is a torch module handed over in code, which "
                           "cannot be rebuilt from the file; pass one with --reference MODEL.")
    from dsa_export.hf.source import hf_source

    return hf_source(reference, batch=batch, seq_len=seq_len, seed=seed, dtype=dtype)


class UntrustedFactoryError(DSAUserError):
    """A file names a Python factory as its reference; dsa-export does not run code a file names."""

    def __init__(self, reference: ModelReference):
        self.reference = reference
        super().__init__(
            f"the file's recorded reference is the Python factory {reference.path}:{reference.name}, and dsa-export "
            "runs no code that a file names; if you trust that file, pass it yourself with "
            f"--reference {reference.path}:{reference.name}."
        )


def _inputs_for(source: ModelSource, batch: int, seq_len: int, seed: int) -> dict[str, Any]:
    if source.make_inputs is not None:
        return source.make_inputs(batch, seq_len, seed)
    if source.reference.kind == "builtin":
        from dsa_export.nn import example_inputs

        return example_inputs(source.module.config, batch, seq_len, seed)
    factory = source.factory
    if factory is not None and {"batch", "seq_len"} & set(inspect.signature(factory).parameters):
        _, inputs, _ = _call_factory(factory, batch, seq_len)
        return inputs
    raise DSAUserError(
        f"the factory of '{source.spec}' takes no batch/seq_len arguments, so inputs of other shapes "
        "cannot be made; add `batch` and `seq_len` parameters to it."
    )
