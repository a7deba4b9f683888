"""torch.library custom op ``dsa::block_sparse_attention`` (the DSABlockSparseAttention contract).

Like :mod:`dsa_export.ops.torch_ops`, the implementation is plain torch and is both a reference
of the contract and the CPU deployment path, so it computes only the selected blocks:

1. The block lists are made canonical once per call (:func:`block_lists`): ids outside
   ``[0, ceil(T/bs))`` and, when causal, key blocks that lie wholly after the last query of their
   query block are dropped, a repeated id is kept once, and each list holds its edge blocks
   (see 3.) first, then the other valid ids ascending, then the pad id ``ceil(T/bs)`` (an
   all-zero block).
2. Per (batch, kv head, chunk of query blocks) the key and value blocks are gathered with one
   ``index_select`` each into reused buffers, the scores of all query heads of the group come
   from one batched GEMM, the softmax runs over the selected keys only and one more batched GEMM
   takes the values. When the heads of a group list (almost) the same blocks, the union of their
   lists is gathered once and shared by the whole group (each head masks the blocks it did not
   list); when they differ, each head gathers its own list, which costs less than computing the
   union for every head (:data:`GATHER_COST` sets the trade-off).
3. Only the blocks that need an element mask are masked element by element: the blocks on the
   causal diagonal and the ragged last key block. The canonical lists hold them first, so this is
   one broadcast fill per edge slot (one or two) of the chunk. Whole-block masking (pad slots,
   blocks a head did not list) is one broadcast fill, done only when a chunk has such slots.

Memory: the float32 copy of q, k and v of one batch row plus one chunk's gathered blocks and
scores (:data:`CHUNK_BYTES`); never ``[S, T]``.
"""

from __future__ import annotations

import torch

from dsa_export.ops.contract import DOMAIN, block_count

#: Bytes of float32 scratch (gathered key/value blocks, scores, probabilities) of one chunk of
#: query blocks (at least one). Half the 32 MiB L3 of the CPU measured on: 64 MiB chunks were
#: about 15% slower at L = 8192 (the scores fall out of cache between the GEMMs and the softmax).
CHUNK_BYTES = 16 << 20

#: Cost of gathering one key+value block relative to computing it for one query head (its two
#: GEMM tiles); measured on 2 CPU cores at bs = 64, D = 64 the gather is about a fifth. It decides
#: whether a group of query heads shares the union of its lists or each head gathers its own.
GATHER_COST = 0.25


def block_lists(block_index: torch.Tensor, *, block_size: int, q_len: int, k_len: int,
                causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Canonical block lists: (int64 ``[B,H,nqb,Kb]`` ids, int64 ``[B,H,nqb]`` number of valid
    ids, int64 ``[B,H,nqb]`` number of edge blocks).

    Ids outside ``[0, ceil(k_len/bs))`` are dropped, a repeated id is kept once and, when
    ``causal``, a key block starting after the last query of its query block (absolute position
    ``k_len - q_len + s``) is dropped: it holds no allowed key. Each list holds its edge blocks
    (:func:`edge_blocks`) first, then the other valid ids ascending, then the pad id
    ``ceil(k_len/bs)``.
    """
    bs = int(block_size)
    n_key_blocks = block_count(k_len, bs)
    ids = block_index.to(torch.int64)
    valid = (ids >= 0) & (ids < n_key_blocks)
    n_query_blocks = ids.shape[2]
    first_query = (k_len - q_len) + torch.arange(n_query_blocks, device=ids.device).view(1, 1, -1, 1) * bs
    if causal:
        last = (torch.arange(1, n_query_blocks + 1, device=ids.device) * bs).clamp_(max=q_len) - 1 + (k_len - q_len)
        valid &= ids * bs <= last.view(1, 1, -1, 1)
    ids = _dedupe_sorted(torch.where(valid, ids, n_key_blocks).sort(dim=-1).values, n_key_blocks)
    ids, edge = _edges_first(ids, first_query, bs=bs, n_kb=n_key_blocks, k_len=k_len, causal=causal)
    return ids, (ids < n_key_blocks).sum(-1), edge.sum(-1)


def edge_blocks(ids: torch.Tensor, first_query: torch.Tensor, *, bs: int, n_kb: int, k_len: int,
                causal: bool) -> torch.Tensor:
    """Which listed blocks need an element mask: when causal, those holding a key after the first
    query of their query block (absolute position ``first_query``, broadcast against ``ids``); the
    ragged last key block. Every other listed block is seen whole by every query of its block."""
    edge = torch.zeros_like(ids, dtype=torch.bool)
    if causal:
        edge |= ids * bs + (bs - 1) > first_query
    if k_len % bs:
        edge |= ids == n_kb - 1
    return edge & (ids < n_kb)


def _edges_first(ids, first_query, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` (ascending, pads last) with the edge blocks moved to the front, and their edge flags.

    The edges are the largest valid ids of a list (at most two: the causal diagonal blocks and the
    ragged last block), so after this each list's element masks fall on its first slots.
    """
    edge = edge_blocks(ids, first_query, **kwargs)
    if bool(edge.any()):
        order = (~edge).to(torch.int8).sort(dim=-1, stable=True).indices
        ids, edge = ids.gather(-1, order), edge.gather(-1, order)
    return ids, edge


def _dedupe_sorted(ids: torch.Tensor, pad: int) -> torch.Tensor:
    """Rows of ascending ids with repeats replaced by ``pad`` and moved to the end."""
    if ids.shape[-1] > 1:
        repeated = ids[..., 1:] == ids[..., :-1]
        if bool(repeated.any()):
            ids[..., 1:].masked_fill_(repeated, pad)
            ids = ids.sort(dim=-1).values
    return ids


class _Scratch:
    """float32 buffers reused across chunks (a fresh large tensor per chunk costs page faults)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, *shape: int) -> torch.Tensor:
        numel = 1
        for d in shape:
            numel *= d
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=torch.float32, device=self.device)
            self.buffers[name] = buf
        return buf[:numel].view(*shape)


def _group_unions(lists: torch.Tensor, hkv: int, first_query: torch.Tensor, **kwargs):
    """Per (batch row, kv head, query block): the union of the group's canonical lists (edge blocks
    first), its size and its number of edge blocks."""
    b, h, n_qb, kb = lists.shape
    n_kb = kwargs["n_kb"]
    ids = lists.view(b, hkv, h // hkv, n_qb, kb).permute(0, 1, 3, 2, 4).reshape(b, hkv, n_qb, -1)
    ids, edge = _edges_first(_dedupe_sorted(ids.sort(dim=-1).values, n_kb), first_query, **kwargs)
    return ids, (ids < n_kb).sum(-1), edge.sum(-1)


@torch.library.custom_op(f"{DOMAIN}::block_sparse_attention", mutates_args=())
def block_sparse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_index: torch.Tensor, block_size: int, scale: float,
    causal: bool,
) -> torch.Tensor:
    b, s, h, dk = q.shape
    t, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    bs = int(block_size)
    group = h // hkv
    n_qb, n_kb = block_count(s, bs), block_count(t, bs)
    if b * s == 0 or n_kb == 0 or block_index.shape[-1] == 0:
        return torch.zeros(b, s, h, dv, dtype=q.dtype, device=q.device)
    # Written whole, block by block (with the ragged last query block's padding rows when S is
    # not a multiple of bs, cut off at the end).
    out = torch.empty(b, n_qb * bs, h, dv, dtype=q.dtype, device=q.device)
    lists, counts, edges = block_lists(block_index, block_size=bs, q_len=s, k_len=t, causal=causal)
    offset = t - s  # query s sits at absolute position t - s + s
    edge_args = {"bs": bs, "n_kb": n_kb, "k_len": t, "causal": causal}
    first_query = offset + torch.arange(n_qb, device=q.device).view(1, 1, -1, 1) * bs
    # Per (batch row, kv head, query block), over the heads of the group: the longest and shortest
    # list, the most edge blocks and the fewest whole blocks; the same for the group's union.
    per_group = [x.view(b, hkv, group, n_qb) for x in (counts, edges, counts - edges)]
    longest, shortest = per_group[0].amax(2).tolist(), per_group[0].amin(2).tolist()
    most_edges, fewest_whole = per_group[1].amax(2).tolist(), per_group[2].amin(2).tolist()
    if group > 1:
        unions, union_counts, union_edges = _group_unions(lists, hkv, first_query, **edge_args)
        union_whole = (union_counts - union_edges).tolist()
        union_counts, union_edges = union_counts.tolist(), union_edges.tolist()
    cap = min(block_index.shape[-1], n_kb)  # valid ids per list at most
    # Query blocks per chunk: the per-head form's gathered blocks, scores and probabilities.
    per_block = group * cap * bs * (dk + dv + 2 * bs) * 4
    rows = max(1, min(n_qb, CHUNK_BYTES // max(1, per_block)))
    scratch = _Scratch(q.device)
    key_offsets = torch.arange(bs, device=q.device)
    query_pos = (first_query.view(n_qb, 1) + key_offsets).view(n_qb, 1, 1, bs, 1)  # [nqb,1,1,bs_q,1]
    for bi in range(b):
        # Key/value blocks of every kv head in float32, zeros past T and one zero block for the pad id.
        k_rows, v_rows = _key_blocks(k[bi], n_kb, bs), _key_blocks(v[bi], n_kb, bs)
        # Scaled queries as [Hkv, nqb, G, bs, Dk]: a chunk of one group is a contiguous slice.
        qb = torch.empty(hkv, n_qb, group, bs, dk, dtype=torch.float32, device=q.device)
        _fill_blocks(qb.permute(0, 1, 3, 2, 4), q[bi].view(s, hkv, group, dk), bs)
        qb.mul_(scale)
        ob = torch.empty(hkv, n_qb, group, bs, dv, dtype=torch.float32, device=q.device)
        for g in range(hkv):
            head_lists = lists[bi, g * group:(g + 1) * group]  # [G, nqb, Kb]
            for i0 in range(0, n_qb, rows):
                i1 = min(n_qb, i0 + rows)
                used = max(longest[bi][g][i0:i1])
                if used == 0:
                    ob[g, i0:i1] = 0.0
                    continue
                chunk = _Chunk(query_pos[i0:i1], n_edges=max(most_edges[bi][g][i0:i1]), lists=group, share=1)
                sel = head_lists[:, i0:i1, :used].transpose(0, 1)  # [c,G,used]
                if min(shortest[bi][g][i0:i1]) < used:
                    chunk.slot_ok = sel < n_kb
                chunk.rows_safe = min(fewest_whole[bi][g][i0:i1]) > 0
                if group > 1:
                    used_union = max(union_counts[bi][g][i0:i1])
                    if used_union * (group + GATHER_COST) <= used * group * (1 + GATHER_COST):
                        # One list per group, gathered once; each head masks the blocks it did not list.
                        listed = torch.zeros(i1 - i0, group, n_kb + 1, dtype=torch.bool, device=q.device)
                        listed.scatter_(2, head_lists[:, i0:i1].transpose(0, 1), True)
                        listed[..., n_kb] = False
                        sel = unions[bi, g, i0:i1, None, :used_union]  # [c,1,used]
                        listed = listed.gather(2, sel.expand(-1, group, -1))
                        everywhere = bool(listed.all())  # every head lists every block of the union
                        chunk = _Chunk(query_pos[i0:i1], n_edges=max(union_edges[bi][g][i0:i1]), lists=1,
                                       share=group, slot_ok=None if everywhere else listed)
                        chunk.rows_safe = everywhere and min(union_whole[bi][g][i0:i1]) > 0
                chunk.run(qb[g, i0:i1], sel, k_rows, v_rows, g * (n_kb + 1), ob[g, i0:i1], scratch,
                          key_offsets=key_offsets, bs=bs, n_kb=n_kb, t=t, causal=causal)
        out[bi].view(n_qb, bs, hkv, group, dv).copy_(ob.permute(1, 3, 0, 2, 4))
    return out if n_qb * bs == s else out[:, :s].contiguous()


def _fill_blocks(dst: torch.Tensor, src: torch.Tensor, bs: int) -> None:
    """``dst [Hkv,nqb,bs,G,D]`` (a view) = ``src [S,Hkv,G,D]`` cut into blocks, zeros past S."""
    s = src.shape[0]
    full = s // bs
    dst[:, :full] = src[:full * bs].view(full, bs, *src.shape[1:]).permute(2, 0, 1, 3, 4)
    if full < dst.shape[1]:
        dst[:, full, :s - full * bs] = src[full * bs:].transpose(0, 1)
        dst[:, full, s - full * bs:] = 0.0


def _key_blocks(x: torch.Tensor, n_kb: int, bs: int) -> torch.Tensor:
    """``x [T,Hkv,D]`` as float32 rows of one block of one kv head, ``[Hkv*(nkb+1), bs*D]``: zeros
    past T and one zero block per kv head at id ``nkb`` (the pad id)."""
    t, hkv, d = x.shape
    blocks = torch.empty(hkv, (n_kb + 1) * bs, d, dtype=torch.float32, device=x.device)
    blocks[:, t:] = 0.0
    blocks[:, :t] = x.transpose(0, 1)
    return blocks.view(hkv * (n_kb + 1), bs * d)


class _Chunk:
    """One chunk of ``c`` query blocks of one kv head's group of ``G`` query heads, as ``lists``
    lists (``G``: one per head, or 1: the group's union) each shared by ``share`` heads."""

    def __init__(self, query_pos, *, n_edges: int, lists: int, share: int, slot_ok=None):
        self.query_pos = query_pos  # [c,1,1,bs_q,1] absolute positions of the chunk's queries
        self.n_edges = n_edges  # edge blocks sit in the first n_edges slots of every list
        self.lists, self.share = lists, share
        #: [c, lists * share, used] slot holds a block its head listed; None: every slot does.
        self.slot_ok = slot_ok
        #: every head's list holds a whole block, so every query row sees a key
        self.rows_safe = slot_ok is None

    def run(self, q_chunk, sel, k_rows, v_rows, row_offset, out_chunk, scratch, *, key_offsets, bs, n_kb, t,
            causal) -> None:
        """Scores, masks, softmax and values of ``q_chunk [c,G,bs,Dk]`` (scaled) over the blocks
        ``sel [c,lists,used]``; writes ``out_chunk [c,G,bs,Dv]``."""
        c, n_lists, used = sel.shape
        n_share = self.share
        dk, dv = q_chunk.shape[-1], out_chunk.shape[-1]
        flat = (sel + row_offset).reshape(-1)
        n_sel = flat.numel()
        keys = torch.index_select(k_rows, 0, flat, out=scratch.take("k", n_sel, bs * dk))
        values = torch.index_select(v_rows, 0, flat, out=scratch.take("v", n_sel, bs * dv))
        keys, values = keys.view(c * n_lists, used * bs, dk), values.view(c * n_lists, used * bs, dv)
        queries = q_chunk.reshape(c * n_lists, n_share * bs, dk)
        scores = torch.bmm(queries, keys.transpose(1, 2), out=scratch.take("s", c * n_lists, n_share * bs, used * bs))
        grid = scores.view(c, n_lists, n_share, bs, used, bs)
        slot_ok = None if self.slot_ok is None else self.slot_ok.view(c, n_lists, n_share, used)
        if slot_ok is not None:
            grid.masked_fill_(~slot_ok[:, :, :, None, :, None], float("-inf"))
        # A query row sees a key when its list holds a whole valid block, or an allowed key of an
        # edge block; only lists of edge blocks alone (or none) need the check.
        rows_ok = None
        n_edges = min(self.n_edges, used)
        if not self.rows_safe:
            if slot_ok is None:
                slot_ok = (sel < n_kb)[:, :, None, :].expand(c, n_lists, n_share, used)
            rows_ok = slot_ok[..., n_edges:].any(-1, keepdim=True)  # [c,Gl,Gh,1]
        # Element masks of the edge blocks, which every list holds first (a list with fewer has
        # whole blocks or pads there, whose element masks allow everything or change nothing).
        for e in range(n_edges):
            key_pos = sel[:, :, e, None] * bs + key_offsets  # [c,Gl,bs_k]
            allowed = (key_pos < t)[:, :, None, None, :]  # [c,Gl,1,1,bs_k]
            if causal:
                allowed = allowed & (key_pos[:, :, None, None, :] <= self.query_pos)  # [c,Gl,1,bs_q,bs_k]
            grid[:, :, :, :, e, :].masked_fill_(~allowed, float("-inf"))
            if rows_ok is not None:
                rows_ok = rows_ok | (allowed.any(-1) & slot_ok[..., e, None])
        probs = torch.ops.aten._softmax.out(scores, -1, False, out=scratch.take("p", *scores.shape))
        result = out_chunk.view(c * n_lists, n_share * bs, dv)
        torch.bmm(probs, values, out=result)
        if rows_ok is not None:
            rows_ok = rows_ok.expand(c, n_lists, n_share, bs)
            if not bool(rows_ok.all()):
                result.view(c, n_lists, n_share, bs, dv).masked_fill_(~rows_ok[..., None], 0.0)  # rows with no key: 0


@block_sparse_attention.register_fake
def _block_sparse_attention_fake(q, k, v, block_index, block_size, scale, causal):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))
