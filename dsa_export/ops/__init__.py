"""DSA ops: the contract, torch ops, NumPy references and the ONNX side (schemas, function bodies).

The Python entry points validate their arguments against the op contract and then call the
``torch.ops.dsa`` custom ops, which the ONNX exporter turns into ``dsa``-domain nodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsa_export.ops.contract import DOMAIN, INDEXER_TOPK, OPS, SPARSE_ATTENTION

if TYPE_CHECKING:
    import torch

__all__ = ["DOMAIN", "INDEXER_TOPK", "OPS", "SPARSE_ATTENTION", "dsa_indexer_topk", "dsa_sparse_attention"]

_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def dsa_indexer_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    topk: int,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """Select the ``topk`` keys of every query with the lightning indexer (see the op contract)."""
    import torch

    from dsa_export.ops import torch_ops

    _check(q.dim() == 4 and k.dim() == 3 and w.dim() == 3, "DSAIndexerTopK expects q [B,S,H,D], k [B,T,D], w [B,S,H].")
    _check(k.shape[0] == q.shape[0] and k.shape[2] == q.shape[3], f"k {tuple(k.shape)} does not match q {tuple(q.shape)}.")
    _check(tuple(w.shape) == tuple(q.shape[:3]), f"w {tuple(w.shape)} must be [B,S,H] of q {tuple(q.shape)}.")
    _check(str(q.dtype).split(".")[-1] in _FLOAT_DTYPES, f"unsupported dtype {q.dtype}.")
    _check(int(topk) >= 1, "topk must be at least 1.")
    if lengths is not None:
        _check(lengths.shape == (q.shape[0],), "lengths must be [B].")
        lengths = lengths.to(torch.int32)
    return torch_ops.indexer_topk(q, k, w, lengths, int(topk), float(scale), bool(causal))


def dsa_sparse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *, scale: float
) -> torch.Tensor:
    """Attend every query head over its query's selected keys (see the op contract)."""
    import torch

    from dsa_export.ops import torch_ops

    _check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and indices.dim() == 3,
           "DSASparseAttention expects q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,T,Hkv,Dv], indices [B,S,K].")
    _check(k.shape[3] == q.shape[3], f"k head dim {k.shape[3]} != q head dim {q.shape[3]}.")
    _check(tuple(k.shape[:3]) == tuple(v.shape[:3]), f"k {tuple(k.shape)} and v {tuple(v.shape)} differ.")
    _check(q.shape[2] % k.shape[2] == 0, f"H={q.shape[2]} is not a multiple of Hkv={k.shape[2]}.")
    _check(tuple(indices.shape[:2]) == tuple(q.shape[:2]), "indices must be [B,S,K] of q.")
    return torch_ops.sparse_attention(q, k, v, indices.to(torch.int32), float(scale))
