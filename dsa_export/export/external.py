"""Initializers of an exported graph, streamed from their sources into ONNX external data.

A traced graph of a meta-device module has initializers without data. :func:`bind_sources` gives
each of them a lazy tensor backed by a source (a checkpoint tensor read in row blocks, see
:mod:`dsa_export.hf.weights`): the graph optimizer can still fold small ones, and nothing large is
read before it is written. :func:`write_external_data` then writes every large initializer, one
row block at a time, into ``<model>.onnx.data`` (each tensor 4 KiB aligned so runtimes may map it)
and points the initializer at it. Peak memory is one row block, whatever the model.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import onnx_ir as ir
import torch

#: Initializers smaller than this stay inside the .onnx file.
INLINE_BYTES = 1024
#: Offset alignment of each tensor in the data file.
ALIGNMENT = 4096


class TensorSource(Protocol):
    """Where one initializer's data comes from."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def chunks(self) -> Iterator[torch.Tensor]:
        """Contiguous tensors of ``dtype`` whose bytes, concatenated, are the initializer's."""
        ...

    def materialize(self) -> torch.Tensor:
        """The whole tensor."""
        ...


class InMemorySource:
    """A tensor already in memory (built-in models, computed buffers, folded constants)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor.detach().cpu().contiguous()
        self.shape, self.dtype = tuple(self.tensor.shape), self.tensor.dtype

    def chunks(self) -> Iterator[torch.Tensor]:
        yield self.tensor

    def materialize(self) -> torch.Tensor:
        return self.tensor


class SourceTensor(ir.LazyTensor):
    """An initializer's lazy value that remembers its source (so it is written without being
    materialized as a whole)."""

    def __init__(self, source: TensorSource, name: str):
        from torch.onnx._internal.exporter._core import TorchTensor, torch_dtype_to_onnx_dtype

        self.source = source
        super().__init__(lambda: TorchTensor(source.materialize(), name=name),
                         dtype=torch_dtype_to_onnx_dtype(source.dtype), shape=ir.Shape(source.shape), name=name)


def _raw_torch(value: Any) -> torch.Tensor | None:
    raw = getattr(value, "raw", None)
    return raw if isinstance(raw, torch.Tensor) else None


def bind_sources(model: ir.Model, sources: Mapping[str, TensorSource] | None) -> None:
    """Give every initializer without data (a meta tensor) its source; check shapes and dtypes."""
    from torch.onnx._internal.exporter._core import torch_dtype_to_onnx_dtype

    for name, value in model.graph.initializers.items():
        raw = _raw_torch(value.const_value)
        if raw is not None and raw.device.type != "meta":
            continue
        if sources is None or name not in sources:
            raise RuntimeError(f"initializer '{name}' has no data and no source to stream it from")
        source = sources[name]
        if tuple(source.shape) != tuple(value.shape.numpy()) or torch_dtype_to_onnx_dtype(source.dtype) != value.dtype:
            raise RuntimeError(f"source of '{name}' is {source.dtype}{list(source.shape)}, the graph expects "
                               f"{value.dtype}{list(value.shape.numpy())}")
        value.const_value = SourceTensor(source, name)


def initializer_bytes(model: ir.Model) -> int:
    total = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is not None:
            total += math.prod(tensor.shape.numpy()) * tensor.dtype.itemsize
    return int(total)


def _chunks_of(tensor: Any) -> Iterator[torch.Tensor | bytes]:
    if isinstance(tensor, SourceTensor):
        yield from tensor.source.chunks()
        return
    raw = _raw_torch(tensor)
    yield raw.contiguous() if raw is not None else tensor.tobytes()


class _HashingWriter:
    """A binary file that hashes what is written (the data file's sha256 costs no second read)."""

    def __init__(self, handle):
        import hashlib

        self.handle, self.digest = handle, hashlib.sha256()

    def write(self, data) -> None:
        self.handle.write(data)
        self.digest.update(data)

    def tell(self) -> int:
        return self.handle.tell()


def _write_chunk(handle, chunk: torch.Tensor | bytes) -> int:
    if isinstance(chunk, bytes):
        handle.write(chunk)
        return len(chunk)
    flat = chunk.reshape(-1)
    if flat.numel() == 0:
        return 0
    data = memoryview(flat.view(torch.uint8).numpy())
    handle.write(data)
    return data.nbytes


def write_external_data(model: ir.Model, data_path: Path, *, location: str, inline_bytes: int = INLINE_BYTES,
                        progress=None) -> tuple[int, str]:
    """Write every initializer of ``inline_bytes`` or more to ``data_path`` and point it there.

    Smaller initializers are materialized in place. Returns the bytes of tensor data written and
    the data file's sha256. ``progress(name, nbytes)`` is called after each tensor.
    """
    written = 0
    with open(data_path, "wb") as raw:
        handle = _HashingWriter(raw)
        for name, value in model.graph.initializers.items():
            tensor = value.const_value
            if tensor is None:
                continue
            nbytes = int(math.prod(tensor.shape.numpy()) * tensor.dtype.itemsize)
            if nbytes < inline_bytes:
                if isinstance(tensor, SourceTensor):
                    from torch.onnx._internal.exporter._core import TorchTensor

                    value.const_value = TorchTensor(tensor.source.materialize(), name=name)
                continue
            pad = (-handle.tell()) % ALIGNMENT
            if pad:
                handle.write(b"\0" * pad)
            offset = handle.tell()
            length = sum(_write_chunk(handle, chunk) for chunk in _chunks_of(tensor))
            if length != nbytes:
                raise RuntimeError(f"source of '{name}' produced {length} bytes, expected {nbytes}")
            value.const_value = ir.ExternalTensor(location, offset, length, tensor.dtype, shape=tensor.shape,
                                                  name=name, base_dir=str(data_path.parent))
            written += length
            if progress is not None:
                progress(name, length)
    return written, handle.digest.hexdigest()


def materialize_all(model: ir.Model) -> None:
    """Replace every lazy initializer by its data (small models kept in one .onnx file)."""
    from torch.onnx._internal.exporter._core import TorchTensor

    for name, value in model.graph.initializers.items():
        if isinstance(value.const_value, SourceTensor):
            value.const_value = TorchTensor(value.const_value.source.materialize(), name=name)
