"""torch.library custom ops ``dsa::indexer_topk``, ``dsa::sparse_attention``, their paged-cache
forms ``dsa::indexer_topk_paged`` / ``dsa::sparse_attention_paged`` and their FP8-cache forms
``dsa::indexer_topk_paged_fp8`` / ``dsa::sparse_attention_paged_fp8``, ``dsa::moe_experts`` and
``dsa::moe_experts_fp8``.

The implementations are plain torch (they run on any device) and are both the reference of the
contract and the CPU deployment path, so they are written for speed as well as clarity: queries
are processed in chunks that bound memory, and the selected key/value rows are gathered once per
kv head and reused by every query head of that group. The routed experts sort the routing slots
by expert and run one GEMM pair per active expert over exactly its tokens (FP8 weights are
dequantized one expert at a time). The fake (meta) kernels give the exporter output shapes with
symbolic batch and sequence dims.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dsa_export.ops.contract import DOMAIN, check_activation
from dsa_export.ops.quant import dequantize_fp8_blocks

# Bytes of float32 scratch one chunk of queries may use; keeps long sequences within cache-friendly
# working sets on CPU and bounded on GPU.
_CHUNK_BYTES = 64 << 20


def _chunk_rows(total: int, bytes_per_row: int) -> int:
    return max(1, min(total, _CHUNK_BYTES // max(1, bytes_per_row)))


#: float32 values of one indexer logits tile ([rows * H_I, key block]): 1 M values (4 MiB) keeps
#: the tile cache-resident between its GEMM, the ReLU and the head reduction.
_INDEXER_TILE = 1 << 20
#: Keys per logits tile at least; the query rows of a chunk follow from it (256 rows with 4 heads,
#: enough to amortize the dozen small ops of each chunk's selection).
_KEY_BLOCK = 1024


def _tie_fill(scores: torch.Tensor, kk: int) -> torch.Tensor:
    """Positions ``[R, kk]`` (ascending) of the top ``kk`` of each row, ties at the k-th value taken
    in index order: what ONNX TopK and the op contract specify, and what torch.topk does not."""
    n = scores.shape[-1]
    threshold = scores.topk(kk, dim=-1, sorted=False).values.min(-1, keepdim=True).values
    above = scores > threshold
    tied = scores == threshold
    room = kk - above.sum(-1, keepdim=True)
    chosen = above | (tied & (tied.cumsum(-1) <= room))
    slot = torch.where(chosen, chosen.cumsum(-1) - 1, kk)
    fixed = torch.full((scores.shape[0], kk + 1), n, dtype=torch.int64, device=scores.device)
    fixed.scatter_(-1, slot, torch.arange(n, device=scores.device).expand_as(slot))
    return fixed[:, :kk]


def _exact_top_positions(scores: torch.Tensor, kk: int) -> torch.Tensor:
    """int64 ``[R, kk]`` positions of the ``kk`` best entries of each row (any order), ties at the
    k-th value in index order. Every row holds more than ``kk`` finite scores.

    One torch.topk of ``kk + 1`` finds the top set and tells whether it is ambiguous: a row whose
    ``kk``-th and ``kk + 1``-th values are equal has a tie at the boundary, and only those rows are
    redone with the index-ordered tie fill (rare with real scores, common in tiny models: ReLU
    gives exact zeros). The row with no tie drops its ``kk + 1``-th entry.
    """
    values, positions = scores.topk(kk + 1, dim=-1, sorted=False)  # sorting the top would cost more
    last_value, last = values.min(-1, keepdim=True)  # the (kk+1)-th best: dropped
    kth_value = values.scatter(1, last, float("inf")).min(-1).values
    keep = torch.ones_like(positions, dtype=torch.bool).scatter_(1, last, False)
    top = positions[keep].view(-1, kk)
    ambiguous = (kth_value == last_value.squeeze(1)).nonzero().squeeze(1)
    if ambiguous.numel():
        top = top.index_copy(0, ambiguous, _tie_fill(scores.index_select(0, ambiguous), kk))
    return top


#: A row is filtered before its top-k once it has this many times ``topk`` keys.
_FILTER_RATIO = 4
#: Sample stride of the filter's threshold estimate.
_SAMPLE_STRIDE = 16


def _top_positions(scores: torch.Tensor, kk: int) -> torch.Tensor:
    """int64 ``[R, kk]``: ascending positions of the ``kk`` best keys of each row of ``scores``.

    torch.topk costs several ns per key (its CPU kernel copies every row into (value, index)
    pairs), so long rows are filtered first, in time linear in the row: a threshold from the
    top of a strided sample of the row (about twice the keys needed pass it), one compare pass and
    ``nonzero`` keep the candidates in key order, and the exact top-k (ties in index order) runs on
    those only. The filter is exact: a row that kept fewer than ``kk`` candidates, which a
    sample cannot promise, takes the unfiltered path.
    """
    rows, n = scores.shape
    if n < _FILTER_RATIO * kk:
        return _ascending(_exact_top_positions(scores, kk), n)
    picks = max(1, (2 * kk) // _SAMPLE_STRIDE)
    threshold = scores[:, ::_SAMPLE_STRIDE].topk(picks, dim=-1, sorted=False).values.min(-1, keepdim=True).values
    row, col = (scores >= threshold).nonzero(as_tuple=True)
    counts = torch.bincount(row, minlength=rows)
    widest = int(counts.max())
    if widest * 2 > n:  # a flat row (many equal scores): filtering does not pay
        return _ascending(_exact_top_positions(scores, kk), n)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(row.numel(), device=scores.device) - starts.index_select(0, row)
    # Candidates packed to the left of each row, in key order (nonzero is row-major), -inf padded.
    packed = torch.full((rows, widest), float("-inf"), dtype=scores.dtype, device=scores.device)
    packed[row, rank] = scores[row, col]
    keys = torch.zeros((rows, widest), dtype=torch.int64, device=scores.device)
    keys[row, rank] = col
    enough = counts > kk  # > kk finite candidates: the top kk of the row are all among them
    if bool(enough.all()):
        # Packed columns are in key order, so the chosen ones in column order are ascending keys.
        return keys.gather(1, _ascending(_exact_top_positions(packed, kk), widest))
    result = torch.empty((rows, kk), dtype=torch.int64, device=scores.device)
    good = enough.nonzero().squeeze(1)
    if good.numel():
        sub = _ascending(_exact_top_positions(packed.index_select(0, good), kk), widest)
        result.index_copy_(0, good, keys.index_select(0, good).gather(1, sub))
    short = (~enough).nonzero().squeeze(1)
    result.index_copy_(0, short, _ascending(_exact_top_positions(scores.index_select(0, short), kk), n))
    return result


def _ascending(positions: torch.Tensor, n: int) -> torch.Tensor:
    """The ``[R, kk]`` distinct positions (< n) of each row in ascending order, without a sort."""
    rows, kk = positions.shape
    chosen = torch.zeros((rows, n), dtype=torch.bool, device=positions.device)
    chosen.scatter_(1, positions, True)
    return chosen.nonzero(as_tuple=True)[1].view(rows, kk)


def _index_scores(q_rows: torch.Tensor, keys: torch.Tensor, w_rows: torch.Tensor, out: torch.Tensor,
                  tile: torch.Tensor) -> None:
    """``out [c, n] = sum_h w[c,h] * ReLU(q[c,h] . keys[n])`` (q already scaled), tile by tile.

    One GEMM ``[c*H, D] @ [D, block]`` per key block (all heads of the chunk in one product, so it
    runs at GEMM speed), ReLU in place, then the head-weighted sum as a batched ``[1,H] @ [H,block]``
    product, all while the tile is cache-resident.
    """
    c, h, d = q_rows.shape
    queries = q_rows.reshape(c * h, d)
    weights = w_rows.unsqueeze(1)  # [c,1,H]
    n = keys.shape[0]
    block = max(1, tile.numel() // (c * h))
    for j0 in range(0, n, block):
        j1 = min(n, j0 + block)
        logits = torch.mm(queries, keys[j0:j1].t(), out=tile[: c * h * (j1 - j0)].view(c * h, j1 - j0))
        logits.clamp_min_(0.0)
        out[:, j0:j1] = torch.bmm(weights, logits.view(c, h, j1 - j0)).view(c, j1 - j0)


@torch.library.custom_op(f"{DOMAIN}::indexer_topk", mutates_args=())
def indexer_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    lengths: torch.Tensor | None,
    topk: int,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    b, s, h, d = q.shape
    t = k.shape[1]
    out = torch.full((b, s, topk), -1, dtype=torch.int32, device=q.device)
    if b * s == 0 or t == 0:
        return out
    queries = q.float() * scale  # [B,S,H,D]
    keys = k.float()
    weights = w.float()
    limits = [t] * b if lengths is None else lengths.clamp(0, t).tolist()
    # Query rows per chunk: a logits tile of _INDEXER_TILE values covers at least _KEY_BLOCK keys.
    rows = max(1, min(s, _INDEXER_TILE // (h * min(t, _KEY_BLOCK))))
    tile = torch.empty(max(_INDEXER_TILE, h * min(t, _KEY_BLOCK)), dtype=torch.float32, device=q.device)
    score_buffer = torch.empty(rows * t, dtype=torch.float32, device=q.device)
    slots = torch.arange(topk, device=q.device)
    for bi in range(b):
        limit = int(limits[bi])
        for start in range(0, s, rows):
            stop = min(s, start + rows)
            # Query r may select the key prefix [0, allowed[r]): causal and length limits are
            # ranges, so no mask is built and keys past the chunk's last allowed one are never scored.
            first_pos = t - s + start
            if causal:
                allowed = (torch.arange(first_pos + 1, first_pos + 1 + stop - start, device=q.device)
                           .clamp_(0, limit))
            else:
                allowed = torch.full((stop - start,), limit, device=q.device)
            n_keys = int(allowed[-1]) if causal else limit
            if n_keys == 0:
                continue
            # Rows with at most topk allowed keys select all of them, whatever their scores.
            scored = int((allowed <= topk).sum())
            if scored:
                few = allowed[:scored]
                out[bi, start:start + scored] = torch.where(slots < few[:, None], slots, -1).to(torch.int32)
            if scored == stop - start:
                continue
            lo = start + scored
            c = stop - lo
            scores = score_buffer[: c * n_keys].view(c, n_keys)
            _index_scores(queries[bi, lo:stop], keys[bi, :n_keys], weights[bi, lo:stop], scores, tile)
            if causal:
                # Only the last c keys can lie past a row's limit (the causal triangle of the chunk).
                tail = max(0, n_keys - c)
                past = torch.arange(tail, n_keys, device=q.device)[None, :] >= allowed[scored:, None]
                scores[:, tail:].masked_fill_(past, float("-inf"))
            out[bi, lo:stop] = _top_positions(scores, topk).to(torch.int32)
    return out


@indexer_topk.register_fake
def _indexer_topk_fake(q, k, w, lengths, topk, scale, causal):
    return q.new_empty((q.shape[0], q.shape[1], topk), dtype=torch.int32)


def values_from_keys(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``v`` is the contract's empty value tensor: the values are the first Dv channels of k."""
    return v.shape[1] == 0 and k.shape[1] > 0


@torch.library.custom_op(f"{DOMAIN}::sparse_attention", mutates_args=())
def sparse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, scale: float
) -> torch.Tensor:
    b, s, h, dk = q.shape
    t, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    n_sel = indices.shape[2]
    group = h // hkv
    out = torch.empty(b, s, h, dv, dtype=q.dtype, device=q.device)
    if b * s == 0:
        return out
    if t == 0 or n_sel == 0:
        return out.zero_()
    from_keys = values_from_keys(k, v)
    # Rows of all kv heads of a token, keys then values, so that one index_select fetches a
    # selected token for every head; with values from keys the values are a view of the keys.
    if from_keys:
        kv_rows = k.float().reshape(b * t, hkv * dk)
    else:
        kv_rows = torch.cat((k.float().reshape(b * t, hkv * dk), v.float().reshape(b * t, hkv * dv)), dim=1)
    v_offset = hkv * dk
    width = kv_rows.shape[1]
    batch_offset = (torch.arange(b, device=q.device) * t).view(b, 1, 1)
    rows = _chunk_rows(s, b * n_sel * (width + 3 * h) * 4)
    # One buffer for the gathered rows of every chunk: a fresh tensor of that size per chunk is
    # a fresh mapping whose page faults cost more than the gather itself (measured 7x on CPU).
    gathered = torch.empty(b * rows * n_sel * width, dtype=torch.float32, device=q.device)
    for start in range(0, s, rows):
        stop = min(s, start + rows)
        c = stop - start
        idx = indices[:, start:stop].long()
        valid = (idx >= 0) & (idx < t)  # [B,c,K]
        # Slots past the last valid one of every row of the chunk hold no key: early queries of
        # a prefill have fewer than K allowed keys and the indexer pads them with -1 at the end.
        used = int(valid.reshape(-1, n_sel).any(0).nonzero().max()) + 1 if bool(valid.any()) else 0
        if used == 0:
            out[:, start:stop] = 0
            continue
        idx, valid = idx[..., :used], valid[..., :used]
        flat = (torch.where(valid, idx, 0) + batch_offset).reshape(-1)
        sel = torch.index_select(kv_rows, 0, flat, out=gathered[: flat.numel() * width].view(-1, width))
        sel = sel.view(b, c, used, width)
        # Each selected token is read once and serves every query head of every group.
        k_sel = sel[..., : hkv * dk].unflatten(-1, (hkv, dk)).transpose(2, 3)  # [B,c,Hkv,K,Dk]
        if from_keys:
            v_sel = k_sel[..., :dv]
        else:
            v_sel = sel[..., v_offset:].unflatten(-1, (hkv, dv)).transpose(2, 3)  # [B,c,Hkv,K,Dv]
        # The scale goes on the (small) queries; logits come out [.., G, K] so softmax runs along
        # contiguous memory.
        qg = (q[:, start:stop].float() * scale).reshape(b, c, hkv, group, dk)
        logits = torch.matmul(qg, k_sel.transpose(-1, -2))  # [B,c,Hkv,G,K]
        complete = bool(valid.all())
        if not complete:
            logits.masked_fill_(~valid[:, :, None, None, :], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if not complete:
            probs.nan_to_num_(0.0)  # rows without a valid key -> 0
        res = torch.matmul(probs, v_sel)  # [B,c,Hkv,G,Dv]
        out[:, start:stop] = res.reshape(b, c, h, dv).to(q.dtype)
    return out


@sparse_attention.register_fake
def _sparse_attention_fake(q, k, v, indices, scale):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


def _paged_rows(block_table: torch.Tensor, n_pages: int, page: int, n_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 pages ``[n_keys]`` (clamped into the pool) and bool validity of a row's first ``n_keys``
    logical keys, read from its block-table row ``block_table [M]``."""
    blocks = -(-n_keys // page)
    pages = block_table[:blocks].long()
    ok = (pages >= 0) & (pages < n_pages)
    return torch.where(ok, pages, 0), ok.repeat_interleave(page)[:n_keys]


@torch.library.custom_op(f"{DOMAIN}::indexer_topk_paged", mutates_args=())
def indexer_topk_paged(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    w: torch.Tensor,
    block_table: torch.Tensor,
    query_start: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    """DSAIndexerTopK over a paged key cache: each row's keys are gathered once through its block
    table (only the pages its queries may read), then scored chunk by chunk like the contiguous op.
    Keys of invalid pages score -inf; rows with at most ``topk`` allowed keys take all of them."""
    d = q.shape[3]
    return _indexer_paged(q, k_pool.shape[0], k_pool.shape[1], w, block_table, query_start, lengths, topk, scale,
                          causal, lambda pages, n: k_pool.index_select(0, pages).reshape(-1, d)[:n].float())


def _indexer_paged(
    q: torch.Tensor,
    n_pages: int,
    page: int,
    w: torch.Tensor,
    block_table: torch.Tensor,
    query_start: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    scale: float,
    causal: bool,
    read_keys: Callable[[torch.Tensor, int], torch.Tensor],
) -> torch.Tensor:
    """The paged indexer with ``read_keys(pages [n], n_keys) -> float32 [n_keys, D]``: the first
    ``n_keys`` keys stored in ``pages`` (the row's pages, in logical order), as float32."""
    b, s, h, d = q.shape
    capacity = block_table.shape[1] * page
    out = torch.full((b, s, topk), -1, dtype=torch.int32, device=q.device)
    if b * s == 0 or capacity == 0 or n_pages == 0:
        return out
    queries = q.float() * scale
    weights = w.float()
    limits = lengths.clamp(0, capacity).tolist()
    starts = query_start.tolist()
    slots = torch.arange(topk, device=q.device)
    for bi in range(b):
        limit, first = int(limits[bi]), int(starts[bi])
        # The keys any query of the row may select: a prefix of the logical positions.
        n_max = min(limit, max(0, first + s)) if causal else limit
        if n_max <= 0:
            continue
        pages, key_ok = _paged_rows(block_table[bi], n_pages, page, n_max)
        keys = read_keys(pages, n_max)  # [n_max, D] float32, the row's keys only
        all_ok = bool(key_ok.all())
        # A query with at most topk allowed keys takes all of them: the first valid positions.
        ok_positions = key_ok.nonzero().squeeze(1)[:topk]
        first_valid = torch.full((topk,), -1, dtype=torch.int64, device=q.device)
        first_valid[: ok_positions.numel()] = ok_positions
        counted = torch.cat((torch.zeros(1, dtype=torch.int64, device=q.device), key_ok.long().cumsum(0)))  # [n+1]
        rows = max(1, min(s, _INDEXER_TILE // (h * min(n_max, _KEY_BLOCK))))
        tile = torch.empty(max(_INDEXER_TILE, h * min(n_max, _KEY_BLOCK)), dtype=torch.float32, device=q.device)
        score_buffer = torch.empty(rows * n_max, dtype=torch.float32, device=q.device)
        for start in range(0, s, rows):
            stop = min(s, start + rows)
            # Query r may select among the logical prefix [0, allowed[r]) (minus invalid pages).
            if causal:
                allowed = torch.arange(first + start + 1, first + stop + 1, device=q.device).clamp_(0, n_max)
            else:
                allowed = torch.full((stop - start,), n_max, device=q.device)
            n_keys = int(allowed[-1])
            if n_keys == 0:
                continue
            valid = counted[allowed]  # allowed keys per query, non-decreasing along the chunk
            scored = int((valid <= topk).sum())
            if scored:
                out[bi, start:start + scored] = torch.where(slots < valid[:scored, None], first_valid, -1).to(torch.int32)
            if scored == stop - start:
                continue
            lo = start + scored
            c = stop - lo
            scores = score_buffer[: c * n_keys].view(c, n_keys)
            _index_scores(queries[bi, lo:stop], keys[:n_keys], weights[bi, lo:stop], scores, tile)
            if not all_ok:
                scores.masked_fill_(~key_ok[None, :n_keys], float("-inf"))
            if causal:
                tail = max(0, n_keys - c)
                past = torch.arange(tail, n_keys, device=q.device)[None, :] >= allowed[scored:, None]
                scores[:, tail:].masked_fill_(past, float("-inf"))
            out[bi, lo:stop] = _top_positions(scores, topk).to(torch.int32)
    return out


@indexer_topk_paged.register_fake
def _indexer_topk_paged_fake(q, k_pool, w, block_table, query_start, lengths, topk, scale, causal):
    return q.new_empty((q.shape[0], q.shape[1], topk), dtype=torch.int32)


@torch.library.custom_op(f"{DOMAIN}::sparse_attention_paged", mutates_args=())
def sparse_attention_paged(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, indices: torch.Tensor, block_table: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """DSASparseAttention over paged caches: each chunk's logical indices are turned into pool rows
    through the block table and only those rows are gathered (in the pools' dtype, then float32),
    once per kv head; nothing of the pool is copied whole."""
    n_pages, page, hkv, dk = k_pool.shape
    dv = v_pool.shape[3]
    k_rows = k_pool.reshape(n_pages * page, hkv * dk)  # views of the pools: nothing copied
    v_rows = None if v_pool.shape[0] == 0 else v_pool.reshape(n_pages * page, hkv * dv)
    return _attention_paged(q, n_pages, page, hkv, dv, indices, block_table, scale,
                            lambda flat: k_rows.index_select(0, flat).float(),
                            None if v_rows is None else lambda flat: v_rows.index_select(0, flat).float())


def _attention_paged(
    q: torch.Tensor,
    n_pages: int,
    page: int,
    hkv: int,
    dv: int,
    indices: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    read_keys: Callable[[torch.Tensor], torch.Tensor],
    read_values: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """The paged sparse attention with ``read_keys(flat pool rows [N]) -> float32 [N, Hkv*Dk]`` and
    ``read_values`` likewise ``[N, Hkv*Dv]`` (None: the values are the keys' first Dv channels)."""
    b, s, h, dk = q.shape
    n_sel = indices.shape[2]
    capacity = block_table.shape[1] * page
    group = h // hkv
    out = torch.empty(b, s, h, dv, dtype=q.dtype, device=q.device)
    if b * s == 0:
        return out
    if n_pages == 0 or capacity == 0 or n_sel == 0:
        return out.zero_()
    from_keys = read_values is None
    pages_of = block_table.long()
    rows = _chunk_rows(s, b * n_sel * (hkv * (dk + dv) + 3 * h) * 4)
    for start in range(0, s, rows):
        stop = min(s, start + rows)
        c = stop - start
        idx = indices[:, start:stop].long()  # [B,c,K] logical positions
        in_range = (idx >= 0) & (idx < capacity)
        logical = torch.where(in_range, idx, 0)
        page_id = pages_of.gather(1, (logical // page).reshape(b, -1)).view(b, c, n_sel)
        valid = in_range & (page_id >= 0) & (page_id < n_pages)
        if not bool(valid.any()):
            out[:, start:stop] = 0
            continue
        used = int(valid.reshape(-1, n_sel).any(0).nonzero().max()) + 1
        valid = valid[..., :used]
        flat = torch.where(valid, page_id[..., :used] * page + logical[..., :used] % page, 0).reshape(-1)
        k_sel = read_keys(flat).view(b, c, used, hkv, dk).transpose(2, 3)  # [B,c,Hkv,K,Dk]
        if from_keys:
            v_sel = k_sel[..., :dv]
        else:
            v_sel = read_values(flat).view(b, c, used, hkv, dv).transpose(2, 3)
        qg = (q[:, start:stop].float() * scale).reshape(b, c, hkv, group, dk)
        logits = torch.matmul(qg, k_sel.transpose(-1, -2))  # [B,c,Hkv,G,K]
        complete = bool(valid.all())
        if not complete:
            logits.masked_fill_(~valid[:, :, None, None, :], float("-inf"))
            # Skipped slots read pool row 0, which may hold anything (NaN included): 0 * NaN is NaN.
            v_sel = v_sel.masked_fill(~valid[:, :, None, :, None], 0.0)
        probs = torch.softmax(logits, dim=-1)
        if not complete:
            probs.nan_to_num_(0.0)  # rows without a valid key -> 0
        res = torch.matmul(probs, v_sel)  # [B,c,Hkv,G,Dv]
        out[:, start:stop] = res.reshape(b, c, h, dv).to(q.dtype)
    return out


@sparse_attention_paged.register_fake
def _sparse_attention_paged_fake(q, k_pool, v_pool, indices, block_table, scale):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v_pool.shape[3]))



def decode_fp8(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of uint8 float8 e4m3fn bit patterns (0x7F / 0xFF: NaN)."""
    return codes.view(torch.float8_e4m3fn).float()


@torch.library.custom_op(f"{DOMAIN}::indexer_topk_paged_fp8", mutates_args=())
def indexer_topk_paged_fp8(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    k_scale_pool: torch.Tensor,
    w: torch.Tensor,
    block_table: torch.Tensor,
    query_start: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    """DSAIndexerTopKPaged over an FP8 index-key cache (uint8 e4m3fn codes, one float32 scale per
    token): the row's pages are gathered and decoded (decode(code) * scale, float32), nothing of
    the pool is decoded whole; the selection is then the paged indexer's."""
    d = q.shape[3]
    n_pages, page = k_pool.shape[0], k_pool.shape[1]

    def read_keys(pages: torch.Tensor, n: int) -> torch.Tensor:
        codes = k_pool.index_select(0, pages).reshape(-1, d)[:n]
        return decode_fp8(codes) * k_scale_pool.index_select(0, pages).reshape(-1, 1)[:n].float()

    return _indexer_paged(q, n_pages, page, w, block_table, query_start, lengths, topk, scale, causal, read_keys)


@indexer_topk_paged_fp8.register_fake
def _indexer_topk_paged_fp8_fake(q, k_pool, k_scale_pool, w, block_table, query_start, lengths, topk, scale, causal):
    return q.new_empty((q.shape[0], q.shape[1], topk), dtype=torch.int32)


@torch.library.custom_op(f"{DOMAIN}::sparse_attention_paged_fp8", mutates_args=())
def sparse_attention_paged_fp8(
    q: torch.Tensor, k_pool: torch.Tensor, k_scale_pool: torch.Tensor, k_rope_pool: torch.Tensor,
    indices: torch.Tensor, block_table: torch.Tensor, scale: float, block_size: int = 128,
) -> torch.Tensor:
    """DSASparseAttentionPaged over an FP8 latent cache: only the selected pool rows' codes, block
    scales and RoPE channels are gathered, decoded into ``C+R``-wide float32 key rows; the values
    are their first C channels."""
    n_pages, page, hkv, c = k_pool.shape
    r = k_rope_pool.shape[3]
    n_blocks = c // block_size
    code_rows = k_pool.reshape(n_pages * page, hkv * c)  # views of the pools: nothing copied
    scale_rows = k_scale_pool.reshape(n_pages * page, hkv * n_blocks)
    rope_rows = k_rope_pool.reshape(n_pages * page, hkv * r)

    def read_keys(flat: torch.Tensor) -> torch.Tensor:
        n = flat.numel()
        nope = decode_fp8(code_rows.index_select(0, flat)).view(n, hkv, n_blocks, block_size)
        nope = nope * scale_rows.index_select(0, flat).float().view(n, hkv, n_blocks, 1)
        rope = rope_rows.index_select(0, flat).float().view(n, hkv, r)
        return torch.cat((nope.view(n, hkv, c), rope), dim=2).view(n, hkv * (c + r))

    return _attention_paged(q, n_pages, page, hkv, c, indices, block_table, scale, read_keys, None)


@sparse_attention_paged_fp8.register_fake
def _sparse_attention_paged_fp8_fake(q, k_pool, k_scale_pool, k_rope_pool, indices, block_table, scale,
                                     block_size=128):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], k_pool.shape[3]))




def routed_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    n_experts: int,
    expert_weights: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """The routed-experts sum with ``expert_weights(e) -> (gate_up [2I,H], down [H,I])`` in float32.

    The slots are sorted by expert once (a stable argsort; skipped slots sort last) so each active
    expert sees exactly its tokens, in one GEMM pair per chunk of rows: memory is the float32
    output plus one chunk's ``[rows, 2I]`` activations and one expert's weights.
    """
    n, hidden = x.shape
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    key = torch.where((flat >= 0) & (flat < n_experts), flat, n_experts)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=n_experts + 1).tolist()
    tokens = order // k
    slot_weight = topk_weights.reshape(-1).float().index_select(0, order)
    out = torch.zeros(n, hidden, dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts[:n_experts]):
        if count == 0:
            continue
        gate_up, down = expert_weights(expert)
        inter = down.shape[1]
        rows = _chunk_rows(count, (2 * inter + hidden) * 4)
        for lo in range(start, start + count, rows):
            hi = min(start + count, lo + rows)
            token = tokens[lo:hi]
            proj = torch.matmul(x.index_select(0, token).float(), gate_up.t())  # [rows, 2I]
            gate, up = proj[:, :inter], proj[:, inter:]
            hidden_states = torch.nn.functional.silu(gate, inplace=True).mul_(up)
            y = torch.matmul(hidden_states, down.t()).mul_(slot_weight[lo:hi, None])
            out.index_add_(0, token, y)
        start += count
    return out.to(x.dtype)


@torch.library.custom_op(f"{DOMAIN}::moe_experts", mutates_args=())
def moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    check_activation(activation)
    return routed_experts(x, topk_ids, topk_weights, gate_up.shape[0],
                          lambda e: (gate_up[e].float(), down[e].float()))


@moe_experts.register_fake
def _moe_experts_fake(x, topk_ids, topk_weights, gate_up, down, activation="silu"):
    return x.new_empty(x.shape)


@torch.library.custom_op(f"{DOMAIN}::moe_experts_fp8", mutates_args=())
def moe_experts_fp8(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down_scale: torch.Tensor,
    block_size: int = 128,
    activation: str = "silu",
) -> torch.Tensor:
    check_activation(activation)
    return routed_experts(
        x, topk_ids, topk_weights, gate_up.shape[0],
        lambda e: (dequantize_fp8_blocks(gate_up[e], gate_up_scale[e], block_size),
                   dequantize_fp8_blocks(down[e], down_scale[e], block_size)),
    )


@moe_experts_fp8.register_fake
def _moe_experts_fp8_fake(x, topk_ids, topk_weights, gate_up, down, gate_up_scale, down_scale, block_size=128,
                          activation="silu"):
    return x.new_empty(x.shape)
