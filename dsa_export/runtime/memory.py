"""How much memory running an exported graph on ONNX Runtime's CPU provider will take, before it runs.

ONNX Runtime runs the ``dsa`` nodes through their ONNX function bodies, and those bodies hold
score tensors whose size grows with batch x queries x keys (x heads): a request for 100 000 tokens
of a tiny model asks for one 149 GiB buffer and dies after minutes of work, or takes the machine's
memory with it. ``run`` and ``validate`` therefore estimate the requested shapes first
(:func:`estimate`) and refuse in one sentence when the estimate exceeds the memory this process can
have (:func:`available_memory`, :func:`require_fits`).

The estimate is deliberately simple and graph-based: the weights (every initializer, external data
included) plus the largest working set of one ``dsa`` node, computed by :func:`dsa_node_bytes` from
the node's input shapes (the graph's symbolic shapes with the requested sizes put in) and
attributes, plus the graph's inputs and outputs. Nodes run one after the other, so the largest node
is what counts. The op specs own the bodies' memory (``OpSpec.workspace_bytes``, formulas in
:mod:`dsa_export.ops.sizes`); when a body changes, change its formula there.
"""

from __future__ import annotations

import ast
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_export.errors import DSAUserError

F32 = 4
GiB = 2**30
#: Share of the available memory an estimate may take: the estimate leaves out ONNX Runtime's
#: arena rounding and the non-dsa nodes, so it refuses only what clearly cannot fit.
HEADROOM = 0.9

#: Standard-op intermediates counted as alive at the peak: the largest few values of the graph
#: (an attention layer's query chain: projected, rotated, concatenated, transposed). Measured against
#: the peak resident set of ONNX Runtime runs at three sizes (tests/runtime/test_memory_estimate.py).
LIVE_INTERMEDIATES = 4

_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2, 17: 1, 18: 1,
             19: 1, 20: 1, 21: 1, 22: 1}  # onnx.TensorProto data types -> bytes per element


def dsa_node_bytes(op_type: str, attrs: dict[str, Any], shapes: list[tuple[int, ...] | None]) -> int:
    """Peak working memory (bytes) of one ``dsa`` node's ONNX function body on ONNX Runtime: the op
    spec's ``workspace_bytes`` (the formulas are in :mod:`dsa_export.ops.sizes`); 0 for other ops
    (the standard ops around them are small next to these).

    ``shapes`` are the node's input shapes (None where unknown), ``attrs`` its attributes.
    """
    from dsa_export.ops.contract import OPS

    spec = OPS.get(op_type)
    return spec.workspace_bytes(shapes, attrs) if spec is not None and spec.workspace_bytes is not None else 0


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run needs: weights + the largest dsa node's working set + graph inputs/outputs."""

    weights: int
    activations: int
    io: int
    worst_node: str | None
    #: The largest standard-op intermediates alive next to the dsa node (see :data:`LIVE_INTERMEDIATES`).
    intermediates: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.activations + self.io + self.intermediates

    def describe(self) -> str:
        node = f" in {self.worst_node}" if self.worst_node else ""
        return (f"{self.total / GiB:.1f} GiB ({self.weights / GiB:.2f} GiB of weights, "
                f"{self.activations / GiB:.1f} GiB of attention scores{node}, "
                f"{(self.io + self.intermediates) / GiB:.1f} GiB of inputs, outputs and intermediates)")


@functools.lru_cache(maxsize=1024)
def _parse_dim(text: str) -> ast.Expression | None:
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return None


def _evaluate_dim(text: str, sizes: dict[str, int]) -> int | None:
    """A symbolic dim (``sequence``, ``past + sequence``) with ``sizes`` put in; None if unknown."""
    if text in sizes:
        return int(sizes[text])
    tree = _parse_dim(text)
    if tree is None:
        return None

    def value(node) -> int | None:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return sizes.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            left, right = value(node.left), value(node.right)
            if left is None or right is None:
                return None
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            return left // right if right else None
        return None

    return value(tree)




def _dims(value_type) -> tuple | None:
    """The dims of a value's type: sizes, symbolic names, None where unknown (None: no shape)."""
    tensor = value_type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)


def _resolve(dims: tuple | None, sizes: dict[str, int]) -> tuple[int, ...] | None:
    if dims is None:
        return None
    largest = max(sizes.values(), default=1)
    out = []
    for dim in dims:
        if isinstance(dim, int):
            out.append(dim)
        else:
            size = _evaluate_dim(dim, sizes) if dim else None
            out.append(largest if size is None else size)  # unknown: as large as the largest asked
    return tuple(out)


def _resolve_known(dims: tuple | None, sizes: dict[str, int]) -> tuple[int, ...] | None:
    """``dims`` with ``sizes`` put in, or None when a dim is unknown."""
    if dims is None:
        return None
    out = []
    for dim in dims:
        size = dim if isinstance(dim, int) else (_evaluate_dim(dim, sizes) if dim else None)
        if size is None:
            return None
        out.append(size)
    return tuple(out)


def _shape(value_type, sizes: dict[str, int]) -> tuple[int, ...] | None:
    return _resolve(_dims(value_type), sizes)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def weight_bytes(model) -> int:
    """Bytes of every initializer of an ONNX ModelProto (external data counted, not loaded)."""
    total = 0
    for tensor in model.graph.initializer:
        total += _numel(tensor.dims) * _ITEMSIZE.get(tensor.data_type, 4)
    return total


@dataclass(frozen=True)
class GraphMemory:
    """What :meth:`estimate` needs from a graph, read once (a runtime keeps it for every call
    instead of parsing the model again)."""

    weights: int
    #: (input name, dims) of the graph inputs that are not initializers.
    inputs: tuple[tuple[str, tuple | None], ...]
    #: (op type, label, attributes, input dims) of every dsa node.
    nodes: tuple[tuple[str, str, dict[str, Any], tuple[tuple | None, ...]], ...]
    #: (dims, bytes per element) of the graph inputs and outputs.
    io: tuple[tuple[tuple | None, int], ...]
    #: (dims, bytes per element) of the graph's other intermediate values (value_info).
    values: tuple[tuple[tuple | None, int], ...] = ()

    @classmethod
    def of(cls, model) -> GraphMemory:
        """From an ONNX ModelProto (external data need not be loaded)."""
        from onnx import helper

        types = {v.name: v.type for v in (*model.graph.input, *model.graph.value_info, *model.graph.output)}
        nodes = []
        for node in model.graph.node:
            if node.domain != "dsa":
                continue
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            label = f"{node.op_type} '{node.name}'" if node.name else node.op_type
            nodes.append((node.op_type, label, attrs,
                          tuple(_dims(types[name]) if name in types else None for name in node.input)))
        initializers = {t.name for t in model.graph.initializer}
        inputs = tuple((v.name, _dims(v.type)) for v in model.graph.input if v.name not in initializers)
        io = tuple((_dims(v.type), _ITEMSIZE.get(v.type.tensor_type.elem_type, 4))
                   for v in (*model.graph.input, *model.graph.output) if v.name not in initializers)
        values = tuple((_dims(v.type), _ITEMSIZE.get(v.type.tensor_type.elem_type, 4)) for v in model.graph.value_info)
        return cls(weight_bytes(model), inputs, tuple(nodes), io, values)

    def sizes(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
        """``{dim name: size}`` from concrete input shapes matched against the symbolic inputs."""
        sizes: dict[str, int] = {}
        for name, dims in self.inputs:
            shape = shapes.get(name)
            if shape is None or dims is None:
                continue
            for dim, size in zip(dims, shape):
                if isinstance(dim, str):
                    sizes.setdefault(dim, int(size))
        return sizes

    def estimate(self, sizes: dict[str, int]) -> MemoryEstimate:
        worst, worst_node = 0, None
        for op_type, label, attrs, dims in self.nodes:
            need = dsa_node_bytes(op_type, attrs, [_resolve(d, sizes) for d in dims])
            if need > worst:
                worst, worst_node = need, label
        io = sum(_numel(shape) * itemsize for dims, itemsize in self.io
                 if (shape := _resolve(dims, sizes)) is not None)
        # Only values whose every dim is known: an unknown one would be guessed as the largest size.
        largest = sorted((_numel(shape) * itemsize for dims, itemsize in self.values
                          if (shape := _resolve_known(dims, sizes)) is not None), reverse=True)
        return MemoryEstimate(self.weights, worst, io, worst_node, sum(largest[:LIVE_INTERMEDIATES]))


def dims_of(model, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """``{dim name: size}`` from concrete input shapes matched against the graph's symbolic inputs."""
    return GraphMemory.of(model).sizes(shapes)


def estimate(model, sizes: dict[str, int]) -> MemoryEstimate:
    """The memory ONNX Runtime's CPU provider needs to run ``model`` (a ModelProto, external data not
    loaded) with its symbolic dims set to ``sizes``."""
    return GraphMemory.of(model).estimate(sizes)


def available_memory() -> tuple[int, str]:
    """(bytes this process can still allocate, where that number comes from).

    The smaller of the kernel's ``MemAvailable`` (/proc/meminfo: free memory plus caches that can
    be dropped) and the room left under a cgroup memory limit (containers: cgroup v2
    ``memory.max - memory.current``, or v1 ``memory.limit_in_bytes - memory.usage_in_bytes``).
    Elsewhere: free physical pages (``sysconf``).
    """
    candidates: list[tuple[int, str]] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                candidates.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
                break
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file, label in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "the cgroup v2 memory limit"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
         "the cgroup v1 memory limit"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            candidates.append((max(0, int(limit) - usage), label))
    if not candidates:
        try:
            candidates.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical pages"))
        except (OSError, ValueError, AttributeError):
            return 1 << 62, "unknown"
    return min(candidates)


def require_fits(need: MemoryEstimate, what: str, *, fix: str) -> None:
    """Refuse ``what`` (e.g. "running sequence 100000") when ``need`` exceeds the available memory."""
    available, source = available_memory()
    if need.total > available * HEADROOM:
        raise DSAUserError(
            f"{what} needs about {need.describe()} but only {available / GiB:.1f} GiB of memory are available "
            f"({source}); {fix}."
        )


__all__ = ["GraphMemory", "MemoryEstimate", "available_memory", "dims_of", "dsa_node_bytes", "estimate", "require_fits",
           "weight_bytes"]
