"""What each layer's selection skips, and what the block layer's block masks cost to store.

Measured sparsity is the share of causal (query, key) pairs a layer does not attend to, counted
from the selection its timed call made: valid indices for ``dsa`` (``[B,L,K]``) and ``lsh``
(``[B*H,L,K]``, one selection per head), the listed causal key blocks' pairs for ``block``
(``block_index [B,H,nqb,Kb]``, made canonical through its CSR form: a repeated id counts once).

The CSR storage figures are those of :func:`dsa_export.ops.csr.csr_storage` for the block
layer's actual selections at each L, at 32x32 and 64x64 blocks (each with as many keys per query
as the timed block layer), next to the dense block mask they replace.
"""

from __future__ import annotations

import numpy as np
import torch

from dsa_export.bench.flops import causal_pairs
from dsa_export.bench.settings import CSR_BLOCK_SIZES, BlockConfig
from dsa_export.ops.csr import block_index_to_csr, csr_storage


def block_selection_pairs(block_index, seq_len: int, block_size: int) -> int:
    """Causal (query, key) pairs a ``block_index [B,H,nqb,Kb]`` of a self-attention layer (queries
    = keys, L of each) attends to, summed over batch rows and heads."""
    n_blocks = -(-seq_len // block_size)
    row_ptr, col_idx = block_index_to_csr(block_index, n_blocks)
    counts = np.diff(row_ptr, axis=-1).reshape(-1)  # listed blocks of every (b, h, i) row
    query_block = np.repeat(np.tile(np.arange(n_blocks), counts.size // n_blocks), counts)
    key_block = col_idx.astype(np.int64)
    sizes = np.minimum(block_size, seq_len - np.arange(n_blocks) * block_size)  # positions per block
    n_q, n_k = sizes[query_block], sizes[key_block]
    pairs = np.where(key_block < query_block, n_q * n_k, np.where(key_block == query_block, n_q * (n_q + 1) // 2, 0))
    return int(pairs.sum())


def measured_sparsity(variant: str, selection: torch.Tensor | None, seq_len: int, cfg: BlockConfig) -> float | None:
    """1 - attended causal pairs / causal pairs of the selection of one call (None: no selection)."""
    if selection is None:
        return None
    if variant == "block":
        if selection.dim() != 4:
            return None
        rows = selection.shape[0] * selection.shape[1]
        attended = block_selection_pairs(selection, seq_len, cfg.block_size)
    else:
        if selection.dim() != 3 or selection.shape[1] != seq_len:
            return None
        rows = selection.shape[0]
        attended = int((selection >= 0).sum())
    return 1.0 - attended / (rows * causal_pairs(seq_len))


def csr_figures(block, x: torch.Tensor, block_sizes: tuple[int, ...] = CSR_BLOCK_SIZES) -> list[dict]:
    """CSR storage of the block layer's selections of ``x`` at each block size, next to the dense
    block mask (bool and bit-packed) and the element mask; ``block`` is the bench's block layer."""
    cfg: BlockConfig = block.cfg
    seq_len = x.shape[1]
    with torch.inference_mode():
        q, k, _ = block.qkv(x)
        rows = []
        for bs in block_sizes:
            kb = cfg.blocks_at(bs)
            index = block.select_blocks(q, k, bs, kb)
            n_blocks = -(-seq_len // bs)
            row_ptr, col_idx = block_index_to_csr(index, n_blocks)
            storage = csr_storage(row_ptr, col_idx, num_key_blocks=n_blocks, block_size=bs, q_len=seq_len,
                                  k_len=seq_len)
            narrow = csr_storage(row_ptr, col_idx, num_key_blocks=n_blocks, block_size=bs, q_len=seq_len,
                                 k_len=seq_len, index_bytes=None)
            rows.append({"seq_len": seq_len, "block_size": bs, "blocks_per_query_block": kb, **storage.as_dict(),
                         "narrowest_csr_bytes": narrow.csr_bytes,
                         "narrowest_saving_vs_dense_block": narrow.saving("dense_block")})
    return rows
