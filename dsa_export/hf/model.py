"""An export view of a transformers DeepSeek-V3.2 / GLM-5 model whose DSA layers run our ops.

:class:`DSAExportModel` reuses the transformers modules (and so their weights) for embeddings,
norms, MLP/MoE blocks, RoPE tables and the projections of attention and indexer, and replaces the
attention computation: the indexer goes through ``dsa::indexer_topk`` and the main attention
through ``dsa::sparse_attention`` in DeepSeek's absorbed MQA form (one latent key/value head, Dk =
kv_lora_rank + qk_rope_head_dim, Dv = kv_lora_rank). So the exported graph has one DSAIndexerTopK
per full indexer layer and one DSASparseAttention per layer.

Four graph shapes:

* ``prefill``: ``input_ids, attention_mask -> logits``;
* ``decode``: additionally the per-layer caches ``past_latent_i [B,P,kv_lora+rope]`` and
  ``past_index_keys_i [B,P,index_head_dim]`` in, ``present_*`` (``[B,P+S,...]``) out, with a
  dynamic past length P (0 for the first step). Each step copies every cache (Concat);
* ``paged``: the serving form (prefill, chunked prefill and decode in one graph, ragged rows).
  ``input_ids [B,S], query_start [B], query_lengths [B], block_table [B,M]`` and, per layer, a
  latent pool ``past_latent_pool_i [pages, PAGE_SIZE, kv_lora+rope]`` and (full indexer layers)
  an index-key pool ``past_index_key_pool_i [pages, PAGE_SIZE, index_head_dim]`` in;
  ``logits [B, vocab]`` (the last new token of each row) and ``present_*_pool_i`` (the same pools
  with this call's tokens written by ScatterND) out. Row ``b`` holds ``query_lengths[b]`` new
  tokens at logical positions ``query_start[b] + s``; logical position ``t`` lives in page
  ``block_table[b, t // PAGE_SIZE]``. Attention and indexer read the written pools through the
  block table (``DSASparseAttentionPaged``, ``DSAIndexerTopKPaged``). Page 0 is the scratch page:
  padding tokens (``s >= query_lengths[b]``) are written there, so a runtime never hands page 0
  to a sequence. A runtime that binds each ``present`` pool to its ``past`` buffer (ONNX Runtime
  IO binding) writes only the new tokens' rows; a full TensorRT build with the plugin library
  turns each float pool's ScatterND into the in-place ``DSAPagedCacheWrite`` plugin
  (:mod:`dsa_export.ops.paged_write_onnx`);
* a layer slice ``A:B``: ``hidden_states [B,S,hidden], attention_mask`` (+ ``prev_topk_indices``
  when layer A reuses an earlier layer's selection) ``-> hidden_states`` (+ ``topk_indices``).
  A pipeline stage is a slice that also embeds (``embed``: ``input_ids`` in, the first stage)
  and/or applies the final norm and ``lm_head`` (``head``: ``logits`` out, the last stage).

The transformers model may live on the meta device (weights streamed into the ONNX file by the
exporter, see :mod:`dsa_export.hf.weights`); only the modules of layers A..B (plus embedding and
head where the graph has them) are traced.

Padding of the prefill and decode graphs follows transformers' attention_mask convention with right
padding: key ``t`` of row ``b`` is valid when ``t < attention_mask[b].sum()``. Left-padded or ragged
decode batches are not representable by the op's ``lengths``: the paged graph is the ragged form.
"""

from __future__ import annotations

import torch
from torch import nn

from dsa_export.errors import DSAUsageError, DSAUserError
from dsa_export.hf.kv_quant import index_key_codes, latent_codes
from dsa_export.hf.weights import FP8Linear, linear_weight
from dsa_export.ops import (
    dsa_indexer_topk,
    dsa_indexer_topk_paged,
    dsa_indexer_topk_paged_fp8,
    dsa_sparse_attention,
    dsa_sparse_attention_paged,
    dsa_sparse_attention_paged_fp8,
)

#: Tokens per cache page of the paged graph (FlashMLA's and vLLM's MLA page).
PAGE_SIZE = 64
#: Inputs of the paged graph that say where each row's tokens go (besides input_ids / hidden_states).
PAGED_CONTROLS = ("query_start", "query_lengths", "block_table")
#: Prefixes of a paged graph's cache pools: fed in, and returned with the call's tokens written.
PAST, PRESENT = "past_", "present_"


def route_experts(hf_model) -> None:
    """Route the MoE blocks through our routed-experts op when it is available, else through
    transformers' ``batched_mm`` experts (the default ``grouped_mm`` has no ONNX translation)."""
    try:
        from dsa_export.nn.moe import replace_moe_blocks
    except ImportError:
        replace_moe_blocks = None
    if replace_moe_blocks is not None:
        replace_moe_blocks(hf_model)
    elif hasattr(hf_model, "set_experts_implementation"):
        hf_model.set_experts_implementation("batched_mm")


class DSAExportModel(nn.Module):
    def __init__(self, hf_model, *, graph: str = "prefill", layers: tuple[int, int] | None = None,
                 embed: bool | None = None, head: bool | None = None, kv_cache: str = ""):
        super().__init__()
        cfg = hf_model.config
        self.hf = hf_model
        self.model_type = cfg.model_type
        self.graph = graph
        self.kv_cache = check_kv_cache(kv_cache, graph)
        self.latent_block = latent_block(cfg.kv_lora_rank)
        n = cfg.num_hidden_layers
        self.start, self.stop = layers if layers is not None else (0, n)
        if not 0 <= self.start < self.stop <= n:
            raise ValueError(f"layer slice {self.start}:{self.stop} is outside 0:{n}")
        whole = (self.start, self.stop) == (0, n)
        # A plain --layers slice takes and returns hidden states; a pipeline stage embeds when it is
        # first and applies the head when it is last.
        self.embed = whole if embed is None else embed
        self.head = whole if head is None else head
        if (self.embed and self.start != 0) or (self.head and self.stop != n):
            raise ValueError("only a slice starting at layer 0 can embed and only one ending at the last layer "
                             "can apply the head")
        self.is_slice = not (self.embed and self.head)
        self.indexer_types = list(getattr(cfg, "indexer_types", None) or ["full"] * n)
        # GLM-5 applies interleaved RoPE in its indexer, DeepSeek-V3.2 the half-split layout; a config
        # may say so explicitly.
        default = self.model_type == "glm_moe_dsa"
        self.indexer_interleave = bool(getattr(cfg, "indexer_rope_interleave", default))
        # transformers' own RoPE helpers (the same for both model types), so the rotation is bit-equal.
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            apply_rotary_pos_emb,
            apply_rotary_pos_emb_interleave,
        )

        self.apply_rope, self.apply_rope_interleave = apply_rotary_pos_emb, apply_rotary_pos_emb_interleave
        self.needs_prev_indices = self.indexer_types[self.start] == "shared"
        # A slice hands its last selection on when the next layer reuses it.
        self.emits_indices = self.stop < n and self.indexer_types[self.stop] == "shared"
        route_experts(hf_model)

    # -- naming helpers used by the exporter and the runtimes --------------------------------------
    @property
    def layer_ids(self) -> list[int]:
        return list(range(self.start, self.stop))

    def input_names(self) -> list[str]:
        first = "input_ids" if self.embed else "hidden_states"
        names = [first, *PAGED_CONTROLS] if self.graph == "paged" else [first, "attention_mask"]
        if self.needs_prev_indices:
            names.append("prev_topk_indices")
        if self.graph == "paged":
            names += [PAST + pool for pool in self.pool_names()]
        elif self.graph == "decode":
            for i in self.layer_ids:
                names.append(f"past_latent_{i}")
                if self.indexer_types[i] == "full":
                    names.append(f"past_index_keys_{i}")
        return names

    def output_names(self) -> list[str]:
        names = ["logits" if self.head else "hidden_states_out"]
        if self.emits_indices:
            names.append("topk_indices")
        if self.graph == "paged":
            names += [PRESENT + pool for pool in self.pool_names()]
        elif self.graph == "decode":
            for i in self.layer_ids:
                names.append(f"present_latent_{i}")
                if self.indexer_types[i] == "full":
                    names.append(f"present_index_keys_{i}")
        return names

    def pool_names(self) -> list[str]:
        """The paged graph's cache pools, without the ``past_`` / ``present_`` prefix, in order: per
        layer the latent pool (+ its scale and RoPE pools with FP8 caches) and, for full indexer
        layers, the index-key pool (+ its scale pool)."""
        latent = ("latent_pool", "latent_scale_pool", "latent_rope_pool") if self.kv_cache == "fp8" else ("latent_pool",)
        keys = ("index_key_pool", "index_key_scale_pool") if self.kv_cache == "fp8" else ("index_key_pool",)
        names = []
        for i in self.layer_ids:
            names += [f"{name}_{i}" for name in latent]
            if self.indexer_types[i] == "full":
                names += [f"{name}_{i}" for name in keys]
        return names

    def pool_shapes(self, pages: int) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        """Each pool's ``[pages, PAGE_SIZE, width]`` and dtype (None: the graph's dtype)."""
        cfg = self.hf.config
        c, rope, d = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.index_head_dim
        widths = {"latent_pool": (c, torch.uint8) if self.kv_cache == "fp8" else (c + rope, None),
                  "latent_scale_pool": (c // self.latent_block, torch.float32),
                  "latent_rope_pool": (rope, None),
                  "index_key_pool": (d, torch.uint8 if self.kv_cache == "fp8" else None),
                  "index_key_scale_pool": (1, torch.float32)}
        shapes = {}
        for name in self.pool_names():
            width, dtype = widths[name.rsplit("_", 1)[0]]
            shapes[name] = ((pages, PAGE_SIZE, width), dtype)
        return shapes

    # -- the computation -------------------------------------------------------------------------
    def _indexer(self, indexer, x, q_resid, cos, sin, past_keys, lengths, paged=None):
        b, s, _ = x.shape
        cfg = self.hf.config
        q = indexer.wq_b(q_resid).view(b, s, indexer.n_heads, indexer.head_dim)
        rope = cfg.qk_rope_head_dim
        q_rot, q_pass = q.split([rope, indexer.head_dim - rope], dim=-1)
        k = indexer.k_norm(indexer.wk(x)).unsqueeze(2)  # [B,S,1,D]
        k_rot, k_pass = k.split([rope, indexer.head_dim - rope], dim=-1)
        apply = self.apply_rope_interleave if self.indexer_interleave else self.apply_rope
        q_rot, k_rot = apply(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], dim=-1)
        k_new = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)  # [B,S,D]
        # transformers keeps weights_proj in float32 and computes the head weights there.
        wp_dtype = torch.float32 if isinstance(indexer.weights_proj, FP8Linear) else indexer.weights_proj.weight.dtype
        w = indexer.weights_proj(x.to(wp_dtype)).float() * indexer.n_heads**-0.5
        if paged is not None and self.kv_cache == "fp8":
            codes, key_scale = index_key_codes(k_new)
            pools = (paged.write(past_keys[0], codes), paged.write(past_keys[1], key_scale))
            indices = dsa_indexer_topk_paged_fp8(q, *pools, w, paged.block_table, paged.query_start, paged.lengths,
                                                 topk=indexer.index_topk, scale=indexer.softmax_scale)
            return indices, pools
        if paged is not None:
            pool = paged.write(past_keys, k_new)
            indices = dsa_indexer_topk_paged(q, pool, w, paged.block_table, paged.query_start, paged.lengths,
                                             topk=indexer.index_topk, scale=indexer.softmax_scale)
            return indices, (pool,)
        keys = k_new if past_keys is None else torch.cat([past_keys, k_new], dim=1)
        indices = dsa_indexer_topk(q, keys, w, lengths, topk=indexer.index_topk, scale=indexer.softmax_scale)
        return indices, k_new

    def _attention(self, attn, x, cos, sin, past_latent, past_index_keys, lengths, prev_indices, paged=None):
        b, s, _ = x.shape
        h, nope, rope, v_dim, c = (attn.num_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim,
                                   attn.v_head_dim, attn.kv_lora_rank)
        q_resid = attn.q_a_layernorm(attn.q_a_proj(x))
        q = attn.q_b_proj(q_resid).view(b, s, h, nope + rope)
        q_nope, q_rot = q.split([nope, rope], dim=-1)
        kv_pass, k_rot = attn.kv_a_proj_with_mqa(x).split([c, rope], dim=-1)
        kv_pass = attn.kv_a_layernorm(kv_pass)
        q_rot, k_rot = self.apply_rope_interleave(q_rot, k_rot.unsqueeze(2), cos, sin, unsqueeze_dim=2)
        latent_new = torch.cat([kv_pass, k_rot.squeeze(2)], dim=-1)  # [B,S,C+rope]: what the cache holds
        if paged is not None and self.kv_cache == "fp8":
            # FlashMLA's FP8 token: codes, a scale per block of channels, RoPE (bf16 in a bf16
            # graph), each in its pool.
            parts = latent_codes(latent_new, rope, self.latent_block)
            latent = tuple(paged.write(pool, part) for pool, part in zip(past_latent, parts))
        elif paged is not None:
            latent = (paged.write(past_latent, latent_new),)  # the pool with this call's tokens
        else:
            latent = latent_new if past_latent is None else torch.cat([past_latent, latent_new], dim=1)

        index_keys_new = None
        if attn.indexer is not None:
            indices, index_keys_new = self._indexer(attn.indexer, x, q_resid, cos, sin, past_index_keys, lengths,
                                                    paged)
        else:
            indices = prev_indices

        # Absorb W_UK into the queries and W_UV into the output (DeepSeek's MQA serving form).
        w_kv = linear_weight(attn.kv_b_proj).to(x.dtype).view(h, nope + v_dim, c)
        w_uk, w_uv = w_kv[:, :nope], w_kv[:, nope:]
        q_lat = _per_head(q_nope, w_uk)  # [B,S,H,C]
        q_full = torch.cat([q_lat, q_rot], dim=-1)
        # The values are the first kv_lora_rank channels of the latent keys: gathered once.
        if paged is not None and self.kv_cache == "fp8":
            codes, latent_scale, rope_part = (pool[:, :, None] for pool in latent)
            out = dsa_sparse_attention_paged_fp8(q_full, codes, latent_scale, rope_part, indices, paged.block_table,
                                                 scale=attn.scaling, block_size=self.latent_block)
        elif paged is not None:
            out = dsa_sparse_attention_paged(q_full, latent[0][:, :, None], None, indices, paged.block_table,
                                             scale=attn.scaling, v_head_dim=c)
        else:
            out = dsa_sparse_attention(q_full, latent[:, :, None], None, indices, scale=attn.scaling, v_head_dim=c)
        out = _per_head(out, w_uv.transpose(1, 2))  # [B,S,H,v]
        return attn.o_proj(out.reshape(b, s, h * v_dim)), indices, latent, index_keys_new

    def forward(self, *args: torch.Tensor):
        names = self.input_names()
        if len(args) != len(names):
            raise TypeError(f"expected inputs {names}, got {len(args)} tensors")
        feed = dict(zip(names, args))
        model = self.hf.model
        x = model.embed_tokens(feed["input_ids"]) if self.embed else feed["hidden_states"]
        b, s = x.shape[:2]
        paged = None
        if self.graph == "paged":
            paged = PagedStep(feed["query_start"], feed["query_lengths"], feed["block_table"], s,
                              feed[f"past_latent_pool_{self.start}"].shape[0])
            lengths, position_ids = paged.lengths, paged.positions
        else:
            mask = feed["attention_mask"]
            lengths = mask.sum(-1).to(torch.int32)  # valid keys per row (right padding)
            past = feed.get(f"past_latent_{self.start}")
            past_len = 0 if past is None else past.shape[1]
            position_ids = (torch.arange(s, device=x.device) + past_len).unsqueeze(0).expand(b, -1)
        cos, sin = model.rotary_emb(x, position_ids=position_ids)

        prev = feed.get("prev_topk_indices")
        presents = []
        for i in self.layer_ids:
            layer = model.layers[i]
            if paged is not None:
                past_latent = self._pools(feed, ("latent_pool", "latent_scale_pool", "latent_rope_pool"), i)
                past_keys = self._pools(feed, ("index_key_pool", "index_key_scale_pool"), i)
            else:
                past_latent, past_keys = feed.get(f"past_latent_{i}"), feed.get(f"past_index_keys_{i}")
            attn_out, prev, latent, index_keys = self._attention(
                layer.self_attn, layer.input_layernorm(x), cos, sin, past_latent, past_keys, lengths, prev, paged,
            )
            x = x + attn_out
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if paged is not None:
                presents.extend(latent)
                if index_keys is not None:
                    presents.extend(index_keys)
            elif self.graph == "decode":
                presents.append(latent)
                if index_keys is not None:  # shared layers keep no indexer cache of their own
                    presents.append(index_keys if past_keys is None else torch.cat([past_keys, index_keys], dim=1))
        if self.head:
            if paged is not None:  # only the last new token of each row: [B, vocab]
                last = (feed["query_lengths"].long() - 1).clamp(min=0)
                x = x.gather(1, last[:, None, None].expand(-1, 1, x.shape[-1])).squeeze(1)
            outputs = [self.hf.lm_head(model.norm(x))]
        else:
            outputs = [x]
        if self.emits_indices:
            outputs.append(prev)
        return tuple(outputs + presents)


    def _pools(self, feed: dict[str, torch.Tensor], names: tuple[str, ...], layer: int):
        """Layer ``layer``'s past pools of kind ``names`` (the first alone without FP8 caches; None
        when the layer has none)."""
        pools = tuple(feed[PAST + f"{name}_{layer}"] for name in names if PAST + f"{name}_{layer}" in feed)
        if not pools:
            return None
        return pools if self.kv_cache == "fp8" else pools[0]


KV_CACHE_DTYPES = ("auto", "fp8")


def latent_block(kv_lora_rank: int) -> int:
    """Channels per scale of an FP8 latent cache: FlashMLA's 128, or the whole latent when it is
    narrower (test models)."""
    return 128 if kv_lora_rank % 128 == 0 else kv_lora_rank


def check_kv_cache(kv_cache: str | None, graph: str | None, *, fix: str = "add --graph paged") -> str:
    """``"fp8"`` or ``""`` (caches in the graph's dtype, also for ``"auto"``); refuses FP8 caches
    outside paged graphs (a usage error: the options contradict each other; ``fix`` says what to add)."""
    if kv_cache in ("", "auto", None):
        return ""
    if kv_cache not in KV_CACHE_DTYPES:
        raise DSAUsageError(f"kv cache dtype '{kv_cache}' is unknown; use one of auto, {', '.join(KV_CACHE_DTYPES)}.")
    if graph != "paged":
        raise DSAUsageError(f"FP8 caches (--kv-cache-dtype fp8) are stored in the paged graph's pools; {fix}.")
    return kv_cache


def _per_head(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [B,S,H,K] @ w [H,K,N] -> [B,S,H,N]``, one product per head over all ``B*S`` tokens.

    Written as ``w^T [H,N,K] @ x^T [H,K,B*S]``: each head's weight is read once per call, as the
    product's left operand, which ONNX Runtime's CPU GEMM reads in place (it copies the right
    operand into its packed layout: here the small activations). The broadcast form ``[B,H,S,K]
    @ [H,K,N]`` ran ``B*H`` products of ``S`` rows, re-reading and re-packing every head's weight
    once per batch row at decode (S = 1): at batch 4, 8 heads, K x N = 128 x 512, ONNX Runtime on
    one core read those weights at 12 GB/s against its Gemms' 17 (docs/bench.md). Only
    activations are transposed."""
    b, s, h, k = x.shape
    xt = x.permute(2, 3, 0, 1).reshape(h, k, b * s)  # [H, K, B*S]
    y = torch.matmul(w.transpose(1, 2), xt)  # [H, N, B*S]
    return y.reshape(h, w.shape[-1], b, s).permute(2, 3, 0, 1)


class PagedStep:
    """Where one call of the paged graph reads and writes: per-row logical positions of the new
    tokens, the rows' key counts after the call, and each new token's (page, offset) in the pools
    (padding tokens go to the scratch page 0)."""

    def __init__(self, query_start: torch.Tensor, query_lengths: torch.Tensor, block_table: torch.Tensor, s: int,
                 pages: int):
        start = query_start.long()
        count = query_lengths.long()
        steps = torch.arange(s, device=start.device)
        self.positions = start[:, None] + steps[None, :]  # [B,S] logical positions (RoPE too)
        self.query_start = query_start.to(torch.int32)
        self.lengths = (start + count).to(torch.int32)
        self.block_table = block_table.to(torch.int32)
        blocks = block_table.shape[1]
        block = torch.clamp(torch.div(self.positions, PAGE_SIZE, rounding_mode="floor"), max=blocks - 1)
        page = block_table.long().gather(1, block)
        real = (steps[None, :] < count[:, None]) & (page >= 0) & (page < pages)
        self.pages = torch.where(real, page, torch.zeros_like(page))
        self.offsets = torch.where(real, self.positions % PAGE_SIZE, torch.zeros_like(page))

    def write(self, pool: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """``pool [pages, PAGE_SIZE, W]`` with the new tokens ``[B,S,W]`` written (ScatterND)."""
        return pool.index_put((self.pages, self.offsets), new.to(pool.dtype))
