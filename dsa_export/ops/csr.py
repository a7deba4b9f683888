"""CSR form of block-sparse attention patterns, and what it saves over dense masks.

A pattern is the set of key blocks each (batch row, head, query block) attends to; the op takes it
as ``block_index [B,H,nqb,Kb]`` (-1 padded lists, see the DSABlockSparseAttention contract). The
CSR form here is that pattern as a sparse ``(B*H*nqb) x nkb`` boolean block mask:

* ``col_idx``: int32 ``[nnz]``, the key-block ids of every row, rows in ``(b, h, i)`` row-major
  order, ascending within a row, each id once; ids outside ``[0, nkb)`` (the -1 pads) are dropped.
* ``row_ptr``: int64 ``[B,H,nqb+1]``: row ``(b,h,i)`` is ``col_idx[row_ptr[b,h,i]:row_ptr[b,h,i+1]]``.
  Offsets are global into the one ``col_idx``, so ``row_ptr[b,h,nqb] == row_ptr[b,h+1,0]`` (and of
  the next batch row) and ``row_ptr[0,0,0] == 0``. One (b, h) is a CSR matrix of its own:
  ``col_idx[row_ptr[b,h,0]:row_ptr[b,h,-1]]`` with pointers ``row_ptr[b,h] - row_ptr[b,h,0]``; the
  standard single row-pointer array of all rows is :func:`flat_row_ptr`.

``csr_to_block_index(*block_index_to_csr(x), kb)`` gives ``x`` back exactly when ``x`` is canonical
(each list ascending, ids unique and in range, -1 pads at the end: :func:`canonical_block_index`);
any other ``x`` comes back as its canonical form, which the op treats the same way (a repeated id
counts once, pads and out-of-range ids are ignored). ``block_index_to_csr`` of that result is
``block_index_to_csr(x)`` again, so CSR -> block_index -> CSR is the identity.

:func:`csr_storage` counts bytes against the dense masks (see its docstring for what "4x less
storage" can mean).

Functions take NumPy arrays or torch tensors and return NumPy arrays.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


def _numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _sorted_unique_rows(block_index: np.ndarray, num_key_blocks: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(ids [R,Kb] ascending with the kept ids first, keep [R,Kb] bool) of the flattened rows."""
    rows = int(np.prod(block_index.shape[:-1]))
    ids = block_index.reshape(rows, block_index.shape[-1]).astype(np.int64)
    keep = ids >= 0
    if num_key_blocks is not None:
        keep &= ids < int(num_key_blocks)
    pad = np.iinfo(np.int64).max
    ids = np.sort(np.where(keep, ids, pad), axis=-1)
    keep = ids != pad
    keep[:, 1:] &= ids[:, 1:] != ids[:, :-1]  # a repeated id is kept once
    return ids, keep


def block_index_to_csr(block_index: Any, num_key_blocks: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(row_ptr [B,H,nqb+1] int64, col_idx [nnz] int32)`` of ``block_index [B,H,nqb,Kb]``.

    Negative ids (pads) are dropped, and so are ids ``>= num_key_blocks`` when it is given.
    """
    x = _numpy(block_index)
    if x.ndim != 4:
        raise ValueError(f"block_index must be [B,H,nqb,Kb], got shape {x.shape}.")
    b, h, n_qb, _ = x.shape
    ids, keep = _sorted_unique_rows(x, num_key_blocks)
    counts = keep.sum(-1).reshape(b, h, n_qb)
    ends = np.cumsum(counts.reshape(-1)).reshape(b, h, n_qb)
    row_ptr = np.empty((b, h, n_qb + 1), dtype=np.int64)
    row_ptr[..., 1:] = ends
    per_head = counts.sum(-1).reshape(-1)
    row_ptr[..., 0] = (np.cumsum(per_head) - per_head).reshape(b, h)  # where each (b, h) starts
    col_idx = ids[keep].astype(np.int32)  # row-major: rows in (b, h, i) order, ascending within a row
    return row_ptr, col_idx


def flat_row_ptr(row_ptr: Any) -> np.ndarray:
    """The standard CSR row-pointer array ``[B*H*nqb + 1]`` of the ``[B,H,nqb+1]`` form."""
    rp = _numpy(row_ptr)
    total = rp[..., -1].reshape(-1)[-1:] if rp.size else np.zeros(1, np.int64)
    return np.concatenate([rp[..., :-1].reshape(-1), total]).astype(np.int64)


def csr_to_block_index(row_ptr: Any, col_idx: Any, kb: int | None = None) -> np.ndarray:
    """int32 ``[B,H,nqb,kb]`` block lists of a CSR pattern: each row's ids in CSR order, -1 padded.

    ``kb`` defaults to the longest row; a row longer than ``kb`` is an error (nothing is dropped).
    """
    rp, cols = _numpy(row_ptr).astype(np.int64), _numpy(col_idx)
    if rp.ndim != 3 or rp.shape[-1] < 1:
        raise ValueError(f"row_ptr must be [B,H,nqb+1], got shape {rp.shape}.")
    b, h, n_qb = rp.shape[0], rp.shape[1], rp.shape[2] - 1
    starts, counts = rp[..., :-1].reshape(-1), np.diff(rp, axis=-1).reshape(-1)
    if (counts < 0).any() or (rp.size and (rp.min() < 0 or rp.max() > cols.shape[0])):
        raise ValueError("row_ptr must be non-decreasing within each (b, h) and index into col_idx.")
    widest = int(counts.max()) if counts.size else 0
    kb = widest if kb is None else int(kb)
    if widest > kb:
        raise ValueError(f"a row lists {widest} key blocks, more than kb = {kb}.")
    out = np.full((b * h * n_qb, kb), -1, dtype=np.int32)
    slot = np.arange(kb)
    filled = slot[None, :] < counts[:, None]
    out[filled] = cols[(starts[:, None] + slot[None, :])[filled]]
    return out.reshape(b, h, n_qb, kb)


def canonical_block_index(block_index: Any, num_key_blocks: int | None = None, kb: int | None = None) -> np.ndarray:
    """``block_index`` with each list ascending, ids unique and in range, -1 pads at the end.

    The op computes the same output for a pattern and its canonical form. ``kb`` defaults to the
    input's list length.
    """
    x = _numpy(block_index)
    return csr_to_block_index(*block_index_to_csr(x, num_key_blocks), x.shape[-1] if kb is None else kb)


def _int_bytes(largest: int) -> int:
    """Bytes of the narrowest unsigned integer (1, 2, 4, 8) holding ``largest``."""
    for width in (1, 2, 4, 8):
        if largest < 1 << (8 * width):
            return width
    raise ValueError(f"{largest} does not fit 8 bytes")


@dataclass(frozen=True)
class CSRStorage:
    """Bytes of one block pattern in CSR and in the dense masks it replaces."""

    rows: int  #: B*H*nqb block rows
    num_key_blocks: int  #: nkb block columns
    nnz: int  #: listed (row, key block) pairs
    block_size: int
    element_cells: int  #: B*H*S*T query-key pairs
    col_bytes: int  #: bytes per col_idx entry
    ptr_bytes: int  #: bytes per row pointer

    @property
    def density(self) -> float:
        """Share of the block grid that is listed (1 - sparsity)."""
        cells = self.rows * self.num_key_blocks
        return self.nnz / cells if cells else 0.0

    @property
    def csr_bytes(self) -> int:
        """Standard CSR: ``rows + 1`` row pointers and ``nnz`` column ids (no values: a boolean mask)."""
        return (self.rows + 1) * self.ptr_bytes + self.nnz * self.col_bytes

    @property
    def dense_block_bytes(self) -> int:
        """Dense block mask, one byte (a bool) per block."""
        return self.rows * self.num_key_blocks

    @property
    def dense_block_bit_bytes(self) -> int:
        """Dense block mask packed to one bit per block (rows padded to whole bytes)."""
        return self.rows * -(-self.num_key_blocks // 8)

    @property
    def element_mask_bytes(self) -> int:
        """Dense element mask: one byte per (query, key) pair, as a boolean attention mask holds it."""
        return self.element_cells

    def saving(self, against: str) -> float:
        """How many times fewer bytes CSR takes than ``against`` (``dense_block``, ``dense_block_bit``,
        ``element_mask``); below 1 CSR is larger."""
        dense = {"dense_block": self.dense_block_bytes, "dense_block_bit": self.dense_block_bit_bytes,
                 "element_mask": self.element_mask_bytes}[against]
        return dense / self.csr_bytes if self.csr_bytes else float("inf")

    def as_dict(self) -> dict:
        data = asdict(self)
        data.update(density=self.density, csr_bytes=self.csr_bytes, dense_block_bytes=self.dense_block_bytes,
                    dense_block_bit_bytes=self.dense_block_bit_bytes, element_mask_bytes=self.element_mask_bytes,
                    saving_vs_dense_block=self.saving("dense_block"),
                    saving_vs_dense_block_bit=self.saving("dense_block_bit"),
                    saving_vs_element_mask=self.saving("element_mask"))
        return data


def csr_storage(row_ptr: Any, col_idx: Any, *, num_key_blocks: int, block_size: int, q_len: int | None = None,
                k_len: int | None = None, index_bytes: int | None = 4) -> CSRStorage:
    """Storage of a CSR block pattern next to the dense block mask (bool or bits) and the element mask.

    ``index_bytes`` is the width of both CSR arrays (4: int32, as cuSPARSE and most kernels take
    them); ``None`` picks the narrowest width each array's values fit. ``q_len`` / ``k_len`` (S, T)
    default to whole blocks.

    What "4x less storage" can mean: CSR stores ``index_bytes`` per listed block where the dense
    bool block mask stores one byte per block, so (row pointers aside) CSR is ``1 / (index_bytes *
    density)`` times smaller: 4x at a density of 1/16 with int32 ids, 1/8 with int16 ids; at the
    articles' 10% density it is 2.5x (int32) or 5x (int16). Against a bit-packed block mask CSR is
    smaller only below a density of ``1 / (8 * index_bytes)`` (3.1% with int32). Against the element
    mask any block form saves about ``block_size**2`` (1024x at 32x32) before CSR adds its share.
    """
    rp = _numpy(row_ptr)
    if rp.ndim != 3:
        raise ValueError(f"row_ptr must be [B,H,nqb+1], got shape {rp.shape}.")
    b, h, n_qb = rp.shape[0], rp.shape[1], rp.shape[2] - 1
    nnz = int(_numpy(col_idx).shape[0])
    s = n_qb * block_size if q_len is None else int(q_len)
    t = num_key_blocks * block_size if k_len is None else int(k_len)
    if index_bytes is None:
        col_bytes, ptr_bytes = _int_bytes(max(0, num_key_blocks - 1)), _int_bytes(nnz)
    else:
        col_bytes = ptr_bytes = int(index_bytes)
    return CSRStorage(rows=b * h * n_qb, num_key_blocks=int(num_key_blocks), nnz=nnz, block_size=int(block_size),
                      element_cells=b * h * s * t, col_bytes=col_bytes, ptr_bytes=ptr_bytes)
