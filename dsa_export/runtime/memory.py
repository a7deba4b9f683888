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
is what counts. :func:`dsa_node_bytes` is the one place that knows the bodies' memory; when a body
changes (e.g. query chunking, which bounds it to O(chunk x T)), change its formula there.
"""

from __future__ import annotations

import ast
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

_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2, 17: 1, 18: 1,
             19: 1, 20: 1, 21: 1, 22: 1}  # onnx.TensorProto data types -> bytes per element


def dsa_node_bytes(op_type: str, attrs: dict[str, Any], shapes: list[tuple[int, ...] | None]) -> int:
    """Peak working memory (bytes) of one ``dsa`` node's ONNX function body on ONNX Runtime.

    ``shapes`` are the node's input shapes (None where unknown), ``attrs`` its attributes. The
    formulas follow the current bodies (:mod:`dsa_export.ops.onnx_ops`, :mod:`dsa_export.ops.moe_onnx`),
    all intermediates in float32:

    - ``DSAIndexerTopK(q [B,S,H,D], k [B,T,D], w [B,S,H])``: ``q.k`` for every indexer head,
      ``[B,S,H,T]``, alive twice (MatMul, then the scaled/ReLU'd/weighted copies), then about six
      ``[B,S,T+topk]`` score, mask and padded tensors: ``2*B*S*H*T*4 + 6*B*S*(T+topk)*4``.
    - ``DSASparseAttention(q [B,S,H,Dk], k [B,T,Hkv,Dk], v, indices)``: a ``[B,S,T+1]`` mask
      scattered from the indices (float and bool, three copies), and logits ``[B,H,S,T]`` of which
      three are alive (MatMul, Where, Softmax): ``3*B*H*S*T*4 + 3*B*S*(T+1)*4``.
    - ``DSABlockSparseAttention(q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,T,Hkv,Dv], block_index
      [B,H,nqb,Kb])`` (attribute ``block_size`` bs): the body holds the scaled queries padded to
      ``nqb*bs`` rows and laid out in blocks (two copies), the keys and values as rows of one block
      (``B*Hkv*(nkb+1)`` blocks, two copies), one chunk of ``rows`` query blocks (gathered blocks,
      scores, masks and probabilities: ``B*H*Kb*(bs*(Dk+Dv+4bs)+Kb)`` values a query block, ``rows``
      as the body picks it from its ``CHUNK_ELEMENTS``) and the output twice (the loop's stacked
      chunks and their reordered copy): ``2*B*nqb*bs*H*Dk*4 + 2*B*Hkv*(nkb+1)*bs*(Dk+Dv)*4 +
      rows*per_block*4 + 2*B*nqb*bs*H*Dv*4``. It grows with the selected blocks, never with S x T.
    - ``DSAMoEExperts`` / ``DSAMoEExpertsFP8(x [N,H], ..., gate_up [E,2I,H], down [E,H,I])``: the
      bodies loop over experts and tiles of at most 128 rows: ``x`` and the accumulator in float32,
      one expert's weights in float32 (the FP8 ``stack`` body: all of them) and one tile:
      ``2*N*H*4 + 3*I*H*4 + 128*(H+2I)*4``.

    Other ops return 0 (the standard ops around them are small next to these).
    """
    def dims(i: int, rank: int) -> tuple[int, ...] | None:
        shape = shapes[i] if i < len(shapes) else None
        return shape if shape is not None and len(shape) == rank else None

    if op_type == "DSAIndexerTopK":
        q, k = dims(0, 4), dims(1, 3)
        if q is None or k is None:
            return 0
        b, s, h, _ = q
        t = k[1]
        topk = int(attrs.get("topk", 0))
        return 2 * b * s * h * t * F32 + 6 * b * s * (t + topk) * F32
    if op_type == "DSASparseAttention":
        q, k = dims(0, 4), dims(1, 4)
        if q is None or k is None:
            return 0
        b, s, h, _ = q
        t = k[1]
        return 3 * b * h * s * t * F32 + 3 * b * s * (t + 1) * F32
    if op_type == "DSABlockSparseAttention":
        q, k, v, index = dims(0, 4), dims(1, 4), dims(2, 4), dims(3, 4)
        if q is None or k is None or v is None:
            return 0
        from dsa_export.ops.block_onnx import CHUNK_ELEMENTS

        b, s, h, dk = q
        t, hkv, dv = k[1], k[2], v[3]
        bs = max(1, int(attrs.get("block_size", 1)))
        n_qb, n_kb = -(-s // bs), -(-t // bs)
        kb = max(1, index[3]) if index is not None else n_kb  # unknown list width: every key block
        per_block = b * h * kb * (bs * (dk + dv + 4 * bs) + kb)
        rows = max(1, min(n_qb, CHUNK_ELEMENTS // max(1, per_block)))
        return (2 * b * n_qb * bs * h * dk * F32 + 2 * b * hkv * (n_kb + 1) * bs * (dk + dv) * F32
                + rows * per_block * F32 + 2 * b * n_qb * bs * h * dv * F32)
    if op_type in ("DSAMoEExperts", "DSAMoEExpertsFP8"):
        x, gate_up = dims(0, 2), dims(3, 3)
        if x is None or gate_up is None:
            return 0
        n, hidden = x
        experts, two_i, _ = gate_up
        intermediate = two_i // 2
        return 2 * n * hidden * F32 + 3 * intermediate * hidden * F32 + 128 * (hidden + two_i) * F32
    return 0


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run needs: weights + the largest dsa node's working set + graph inputs/outputs."""

    weights: int
    activations: int
    io: int
    worst_node: str | None

    @property
    def total(self) -> int:
        return self.weights + self.activations + self.io

    def describe(self) -> str:
        node = f" in {self.worst_node}" if self.worst_node else ""
        return (f"{self.total / GiB:.1f} GiB ({self.weights / GiB:.2f} GiB of weights, "
                f"{self.activations / GiB:.1f} GiB of attention scores{node})")


def _evaluate_dim(text: str, sizes: dict[str, int]) -> int | None:
    """A symbolic dim (``sequence``, ``past + sequence``) with ``sizes`` put in; None if unknown."""
    if text in sizes:
        return int(sizes[text])
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
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


def _shape(value_type, sizes: dict[str, int]) -> tuple[int, ...] | None:
    tensor = value_type.tensor_type
    if not tensor.HasField("shape"):
        return None
    out = []
    largest = max(sizes.values(), default=1)
    for dim in tensor.shape.dim:
        if dim.HasField("dim_value"):
            out.append(int(dim.dim_value))
        elif dim.dim_param:
            size = _evaluate_dim(dim.dim_param, sizes)
            out.append(largest if size is None else size)  # unknown: as large as the largest asked
        else:
            out.append(largest)
    return tuple(out)


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


def dims_of(model, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """``{dim name: size}`` from concrete input shapes matched against the graph's symbolic inputs."""
    sizes: dict[str, int] = {}
    for value in model.graph.input:
        shape = shapes.get(value.name)
        if shape is None:
            continue
        for dim, size in zip(value.type.tensor_type.shape.dim, shape):
            if dim.dim_param:
                sizes.setdefault(dim.dim_param, int(size))
    return sizes


def estimate(model, sizes: dict[str, int]) -> MemoryEstimate:
    """The memory ONNX Runtime's CPU provider needs to run ``model`` (a ModelProto, external data not
    loaded) with its symbolic dims set to ``sizes``."""
    from onnx import helper

    types = {v.name: v.type for v in (*model.graph.input, *model.graph.value_info, *model.graph.output)}
    worst, worst_node = 0, None
    for node in model.graph.node:
        if node.domain != "dsa":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        shapes = [_shape(types[name], sizes) if name in types else None for name in node.input]
        need = dsa_node_bytes(node.op_type, attrs, shapes)
        if need > worst:
            worst, worst_node = need, f"{node.op_type} '{node.name}'" if node.name else node.op_type
    io = 0
    initializers = {t.name for t in model.graph.initializer}
    for value in (*model.graph.input, *model.graph.output):
        if value.name in initializers:
            continue
        shape = _shape(value.type, sizes)
        if shape is not None:
            io += _numel(shape) * _ITEMSIZE.get(value.type.tensor_type.elem_type, 4)
    return MemoryEstimate(weight_bytes(model), worst, io, worst_node)


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


__all__ = ["MemoryEstimate", "available_memory", "dims_of", "dsa_node_bytes", "estimate", "require_fits",
           "weight_bytes"]
