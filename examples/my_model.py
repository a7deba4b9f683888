"""A user model for `dsa-export export examples/my_model.py:make` (see the README)."""

import torch
from dsa_export.ops import dsa_indexer_topk, dsa_sparse_attention


class MyDSAModel(torch.nn.Module):
    """One residual block: a lightning indexer picks 16 keys per query, attention reads only those."""

    def __init__(self, hidden=256, heads=4, head_dim=64, index_heads=4, index_dim=32, topk=16):
        super().__init__()
        self.heads, self.head_dim, self.index_heads, self.index_dim, self.topk = heads, head_dim, index_heads, index_dim, topk
        self.qkv = torch.nn.Linear(hidden, 3 * heads * head_dim)
        self.index_q = torch.nn.Linear(hidden, index_heads * index_dim)
        self.index_k = torch.nn.Linear(hidden, index_dim)
        self.index_w = torch.nn.Linear(hidden, index_heads)
        self.out = torch.nn.Linear(heads * head_dim, hidden)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).unbind(2)
        iq = self.index_q(x).view(b, s, self.index_heads, self.index_dim)
        keys = dsa_indexer_topk(iq, self.index_k(x), self.index_w(x), topk=self.topk, scale=self.index_dim**-0.5)
        attended = dsa_sparse_attention(q, k, v, keys, scale=self.head_dim**-0.5)
        return x + self.out(attended.reshape(b, s, -1))


def make(batch=2, seq_len=64):  # batch/seq_len are optional keywords
    torch.manual_seed(0)
    return MyDSAModel().eval(), (torch.randn(batch, seq_len, 256),), ["hidden"]  # module, inputs[, output names]
