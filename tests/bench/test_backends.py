"""The cuda backend's wiring, checked on the CPU with stand-in kernels that follow the C ABI binding."""

from __future__ import annotations

import torch

from dsa_export.bench import backends
from dsa_export.bench.block import make_blocks, make_input
from dsa_export.bench.settings import BenchSettings, BlockConfig
from dsa_export.ops import dsa_block_sparse_attention, dsa_indexer_topk, dsa_sparse_attention

CFG = BlockConfig(hidden=64, heads=4, kv_heads=1, head_dim=16, index_heads=16, index_head_dim=16, topk=8,
                  block_size=8, lsh_buckets=4)


class StandInKernels:
    """Same signatures as ``dsa_export.plugins.kernels.KernelLibrary``, computed by the torch ops."""

    path = "stand-in"

    def __init__(self):
        self.calls = []

    def indexer_topk(self, q, k, w, lengths=None, *, topk, scale, causal=True, workspace=None):
        # The binding wants k in q's dtype and w in q's dtype or float32.
        assert k.dtype == q.dtype and w.dtype == torch.float32
        self.calls.append("indexer_topk")
        return dsa_indexer_topk(q, k, w, lengths, topk=topk, scale=scale, causal=causal)

    def sparse_attention(self, q, k, v, indices, *, scale):
        assert indices.dtype == torch.int32 and q.shape[2] % k.shape[2] == 0
        self.calls.append("sparse_attention")
        return dsa_sparse_attention(q, k, v, indices, scale=scale)

    def block_sparse_attention(self, q, k, v, block_index, *, block_size, scale, causal=True):
        assert block_index.dim() == 4 and block_index.shape[:3] == (q.shape[0], q.shape[2], -(-q.shape[1] // block_size))
        self.calls.append("block_sparse_attention")
        return dsa_block_sparse_attention(q, k, v, block_index, block_size=block_size, scale=scale, causal=causal)


class CpuCudaBackend(backends.CudaBackend):
    device = "cpu"
    dtype = torch.float32

    @staticmethod
    def synchronize() -> None:
        pass


def test_the_cuda_backend_routes_the_dsa_layer_through_the_kernels(monkeypatch):
    kernels = StandInKernels()
    monkeypatch.setattr(backends, "load_cuda_kernels", lambda: kernels)
    backend = CpuCudaBackend(BenchSettings(seq_lens=(32,), backends=("cuda",), block=CFG, memory=False))
    out = backend.call("dsa", 32)()
    assert kernels.calls == ["indexer_topk", "sparse_attention"]
    with torch.inference_mode():
        reference = make_blocks(CFG)["dsa"](make_input(CFG, 32))
    torch.testing.assert_close(out, reference)
    assert backend.selected_indices().shape == (1, 32, CFG.topk)
    backend.call("dense", 32)()
    assert kernels.calls == ["indexer_topk", "sparse_attention"]  # dense attention is SDPA, no kernels
    blocks = make_blocks(CFG)
    for variant, kernel in (("block", "block_sparse_attention"), ("lsh", "sparse_attention")):
        kernels.calls.clear()
        out = backend.call(variant, 32)()
        assert kernels.calls == [kernel]  # the selection runs in torch, the attention in the kernel
        with torch.inference_mode():
            torch.testing.assert_close(out, blocks[variant](make_input(CFG, 32)))
        assert backend.selected_indices(variant) is not None


def test_differing_selections_are_told_near_ties_or_not():
    import numpy as np
    import torch

    from dsa_export.bench.backends import _near_ties

    # One query at position 3 over keys 0..3 with one head: scores = relu(q.k) * w = q.k.
    q = torch.tensor([[[[1.0]], [[1.0]], [[1.0]], [[1.0]]]], dtype=torch.float32)  # [1,4,1,1]
    k = torch.tensor([[[1.0], [0.5], [0.5 + 1e-7], [0.1]]])  # [1,4,1]
    w = torch.ones(1, 4, 1)
    recorded = {"call": ((q, k, w), {"scale": 1.0})}
    differs = np.zeros((1, 4), bool)
    differs[0, 3] = True
    near = np.array([[[0, 0], [0, 0], [0, 0], [0, 1]]])  # keys 0 and 1: 2 scores 5e-8 below 0+2
    far = np.array([[[0, 0], [0, 0], [0, 0], [0, 3]]])  # key 3 instead of key 2: 0.4 lower
    assert _near_ties(near, recorded, differs)[0] == 1
    count, gap = _near_ties(far, recorded, differs)
    assert count == 0 and gap == 0.0
