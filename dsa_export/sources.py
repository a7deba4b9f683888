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

import hashlib
import importlib.util
import sys
from pathlib import Path

from dsa_export.errors import DSAUserError
from dsa_export.model_ref import ModelReference
from dsa_export.model_source import ModelSource, call_factory


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
        module, inputs, names = call_factory(factory, batch, seq_len)
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


