"""What an exported file was made from, as one typed record (stored in its metadata as JSON).

A :class:`ModelReference` names a built-in model, a user's ``file.py:factory`` or a Hugging Face
checkpoint directory plus the graph cut from it (prefill/decode, layers, embedding/head, FP8
handling). Paths are recorded relative to the folder of the file that stores the record, so an
exported model does not carry the exporting machine's absolute paths and still finds its checkpoint
when both move together; checkpoints are also named by the sha256 of their config.json and a
fingerprint of their safetensors headers, so ``validate`` can tell a different checkpoint at the
same path. This module is at the bottom of the package: the exporter, validation, calibration and
the build pipeline all read it, and it imports nothing of theirs.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dsa_export.errors import DSAUserError

#: ``module``: a torch module handed over in code (benchmarks, tests); it cannot be rebuilt from
#: the record, so validation needs ``--reference``.
KINDS = ("builtin", "factory", "hf", "module")
#: Format version of the JSON record.
VERSION = 1


@dataclass(frozen=True)
class ModelReference:
    """A model source and the graph taken from it.

    Attributes:
        kind: ``builtin``, ``factory``, ``hf`` or ``module``.
        name: the built-in model's name, the factory function's name, or a module's label.
        path: the factory's .py file or the checkpoint directory (POSIX separators); relative to
            the folder of the file recording it when ``relative`` is true.
        relative: whether ``path`` is relative to that folder.
        sha256: sha256 of the factory file, or of the checkpoint's config.json.
        weights_sha256: fingerprint of the checkpoint's safetensors headers (hf only).
        graph: ``prefill`` or ``decode`` (hf only).
        layers: decoder layers ``[A, B)`` of a slice or stage; None for the whole model.
        embed, head: whether the graph embeds token ids / applies the final norm and lm_head
            (hf only; None follows ``layers``: a whole model does both, a slice neither).
        fp8: ``keep`` or ``dequantize`` for FP8 checkpoints, empty otherwise.
        kv_cache: ``fp8`` for a paged graph whose cache pools store FP8 (hf only), empty for caches
            in the graph's dtype.
    """

    kind: str
    name: str = ""
    path: str = ""
    relative: bool = False
    sha256: str = ""
    weights_sha256: str = ""
    graph: str = "prefill"
    layers: tuple[int, int] | None = None
    embed: bool | None = None
    head: bool | None = None
    fp8: str = ""
    kv_cache: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"model reference kind must be one of {KINDS}, not {self.kind!r}")

    # -- text forms ----------------------------------------------------------------------------
    def describe(self) -> str:
        """Short human form: ``builtin:tiny``, ``model.py:make``, ``hf:DeepSeek-V3.2 (layers 3:4)``."""
        if self.kind == "builtin":
            return f"builtin:{self.name}"
        if self.kind == "factory":
            return f"{self.path}:{self.name}"
        if self.kind == "module":
            return self.name
        details = [self.graph] if self.graph != "prefill" else []
        if self.layers is not None:
            details.append(f"layers {self.layers[0]}:{self.layers[1]}")
        if self.embed and self.layers is not None:
            details.append("embedding")
        if self.head and self.layers is not None:
            details.append("head")
        if self.fp8:
            details.append(f"fp8 {self.fp8}")
        if self.kv_cache:
            details.append(f"{self.kv_cache} caches")
        label = Path(self.path).name or self.path
        return f"hf:{label}" + (f" ({', '.join(details)})" if details else "")

    def to_json(self) -> str:
        """Compact JSON: the format version plus every field that differs from its default."""
        defaults = ModelReference(self.kind)
        data = {key: value for key, value in asdict(self).items()
                if key == "kind" or value != getattr(defaults, key)}
        if self.layers is not None:
            data["layers"] = list(self.layers)
        return json.dumps({"version": VERSION, **data}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelReference:
        try:
            data = json.loads(text)
            data.pop("version", None)
            if data.get("layers") is not None:
                data["layers"] = tuple(int(v) for v in data["layers"])
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise DSAUserError(f"the recorded model reference is malformed ({exc}); pass --reference MODEL.") from exc

    # -- paths ---------------------------------------------------------------------------------
    def relative_to(self, folder: str | os.PathLike[str]) -> ModelReference:
        """The record with ``path`` made relative to ``folder`` (where the record will be stored)."""
        if not self.path or self.relative or self.kind == "builtin":
            return self
        target = Path(self.path)
        try:
            rel = os.path.relpath(target, Path(folder).resolve())
        except ValueError:  # e.g. another drive on Windows: keep it absolute
            return self
        return replace(self, path=Path(rel).as_posix(), relative=True)

    def absolute(self, folder: str | os.PathLike[str] | None) -> ModelReference:
        """The record with ``path`` resolved against ``folder`` (where the record was read from)."""
        if not self.relative:
            return self
        base = Path(folder) if folder is not None else Path.cwd()
        return replace(self, path=str((base / self.path).resolve()), relative=False)

    def with_path(self, path: str | os.PathLike[str]) -> ModelReference:
        return replace(self, path=str(Path(path).resolve()), relative=False)


def from_metadata(value: str | None, folder: str | os.PathLike[str] | None) -> ModelReference | None:
    """The reference recorded in a file's metadata (JSON; older files hold a spec string), with its
    path resolved against ``folder``, the directory of that file."""
    if not value:
        return None
    if value.lstrip().startswith("{"):
        return ModelReference.from_json(value).absolute(folder)
    return legacy_reference(value)


def legacy_reference(spec: str) -> ModelReference:
    """A reference from the spec strings files of dsa-export 0.1 recorded
    (``builtin:NAME``, ``/abs/file.py:factory``, ``hf:/abs/dir#graph=..,layers=A:B,fp8=1``)."""
    if spec.startswith("builtin:"):
        return ModelReference("builtin", name=spec.split(":", 1)[1])
    if spec.startswith("hf:"):
        path, _, options = spec[3:].partition("#")
        opts = dict(item.split("=", 1) for item in options.split(",") if "=" in item)
        layers = tuple(int(v) for v in opts["layers"].split(":")) if "layers" in opts else None
        return ModelReference("hf", path=path, graph=opts.get("graph", "prefill"), layers=layers,  # type: ignore[arg-type]
                              fp8="dequantize" if opts.get("fp8") == "1" else "")
    path, _, name = spec.rpartition(":")
    return ModelReference("factory", name=name, path=path)
