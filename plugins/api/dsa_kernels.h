/*
 * C ABI over the DSA CUDA launchers.
 *
 * One shared library (libdsa_kernels.so) exports these functions so that the TensorRT plugin glue,
 * a ctypes/torch test harness and benchmarks all run the same kernels. All pointers are device
 * pointers to dense row-major tensors; `stream` is a cudaStream_t (NULL = legacy default stream).
 * Functions only enqueue work: they never synchronize and never allocate device memory.
 */
#ifndef DSA_KERNELS_H
#define DSA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define DSA_API __declspec(dllexport)
#else
#define DSA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C"
{
#endif

/* Element types; values are stable across releases. FP8 e4m3 is only a weight type (the expert
 * matrices of dsa_moe_experts); activations are one of the first three. */
typedef enum
{
    DSA_DTYPE_FLOAT32 = 0,
    DSA_DTYPE_FLOAT16 = 1,
    DSA_DTYPE_BFLOAT16 = 2,
    DSA_DTYPE_FP8_E4M3 = 3
} dsa_dtype_t;

/* Activations of dsa_moe_experts. */
typedef enum
{
    DSA_ACTIVATION_SILU = 0
} dsa_activation_t;

/* Status codes; 0 is success. */
typedef enum
{
    DSA_STATUS_SUCCESS = 0,
    DSA_STATUS_INVALID_ARGUMENT = 1,
    DSA_STATUS_UNSUPPORTED = 2,
    DSA_STATUS_WORKSPACE_TOO_SMALL = 3,
    DSA_STATUS_CUDA_ERROR = 4
} dsa_status_t;

/* Version of this ABI: bumped whenever entry points are added or changed, so that a binding can
 * tell whether the symbols it was written for are all there (version 2 added dsa_moe_experts*,
 * DSA_DTYPE_FP8_E4M3 and dsa_activation_t; the version-1 entry points are unchanged). Version 3:
 * dsa_sparse_attention takes v == NULL (with T > 0) as values from keys; every signature and every
 * call that was valid before are unchanged (v == NULL with T > 0 used to be an error). Version 4
 * added dsa_block_sparse_attention and dsa_block_sparse_attention_path; the version-3 entry points
 * are unchanged. Version 5 added the serving kernels (entry points listed below under "ABI 5"); the
 * version-4 entry points are unchanged. Version 6 added dsa_paged_cache_write; the version-5 entry
 * points are unchanged. */
#define DSA_KERNELS_ABI_VERSION 6
DSA_API int32_t dsa_kernels_abi_version(void);

/* Human-readable name of a status code. */
DSA_API char const* dsa_status_string(int32_t status);

/* Message of the last failed call on this host thread ("" if none). */
DSA_API char const* dsa_last_error(void);

/*
 * DSAIndexerTopK.
 *   q [B,S,H,D] (dtype), k [B,T,D] (dtype), w [B,S,H] (w_dtype: dtype or FLOAT32),
 *   lengths [B] int32 or NULL, out [B,S,topk] int32.
 *   score[b,s,t] = sum_h w[b,s,h] * relu(scale * q[b,s,h,:] . k[b,t,:]); query s sits at T - S + s;
 *   allowed keys t < min(causal ? T - S + s + 1 : T, lengths[b]); the top min(topk, allowed) key
 *   positions are written, remaining slots are -1; ties at the k-th score go to the lower key
 *   index. The order is deterministic (it depends only on the inputs): when every allowed key is
 *   selected, 0, 1, ..., allowed-1; otherwise the keys scoring above the k-th score in ascending
 *   key index, then the selected keys equal to it in ascending key index (the op contract itself
 *   does not fix the order).
 * The scores of a bounded block of query rows are kept in `workspace` (fp32, rows x T); more
 * workspace means fewer, larger launches. The minimum is one row (T * 4 bytes, 256-byte aligned).
 * Since ABI 5 dsa_indexer_topk_workspace_size() also holds the multi-block top-k's state for up to 8
 * rows: calls of at most 8 rows (B*S) over T >= 8192 keys given that much spread each row's top-k over
 * several CTAs, with the same indices in the same order (see dsa_indexer_topk_set_select_mode).
 */
DSA_API size_t dsa_indexer_topk_workspace_size(int64_t B, int64_t S, int64_t T, int64_t H, int64_t D, int64_t topk);
DSA_API size_t dsa_indexer_topk_min_workspace_size(int64_t T);
DSA_API int32_t dsa_indexer_topk(void const* q, void const* k, void const* w, int32_t const* lengths, int32_t* out,
    int64_t B, int64_t S, int64_t T, int64_t H, int64_t D, int64_t topk, float scale, int32_t causal, int32_t dtype,
    int32_t w_dtype, void* workspace, size_t workspace_bytes, void* stream);

/*
 * DSASparseAttention.
 *   q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,T,Hkv,Dv] (dtype), indices [B,S,K] int32, out [B,S,H,Dv] (dtype).
 *   out[b,s,h] = softmax_j(scale * q[b,s,h] . k[b,i_j,g(h)]) @ v[b,i_j,g(h)] over valid i_j in [0,T),
 *   g(h) = h / (H / Hkv); rows without a valid index are 0. Needs no workspace.
 * Values from keys (ABI 3): v == NULL means v[b,t,g] = k[b,t,g,0:Dv] (needs Dv <= Dk), the op
 *   contract's empty v [B,0,Hkv,Dv] (DeepSeek's absorbed MLA: Dk = 576 latent + rope channels, the
 *   first Dv = 512 are the values). Each selected row is then read once, Dk elements instead of
 *   Dk + Dv. The result has the same bits as passing a v that holds those channels. With T == 0
 *   or K == 0 no kernel runs (out is zeroed with cudaMemsetAsync): nothing is read, k and v may
 *   be NULL (indices too when K == 0).
 */
DSA_API size_t dsa_sparse_attention_workspace_size(
    int64_t B, int64_t S, int64_t T, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int64_t K);
DSA_API int32_t dsa_sparse_attention(void const* q, void const* k, void const* v, int32_t const* indices, void* out,
    int64_t B, int64_t S, int64_t T, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int64_t K, float scale,
    int32_t dtype, void* stream);

/*
 * DSABlockSparseAttention (ABI 4).
 *   q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,T,Hkv,Dv] (dtype), block_index [B,H,ceil(S/block_size),Kb] int32,
 *   out [B,S,H,Dv] (dtype). Query block i holds queries i*bs .. i*bs+bs-1, key block j keys
 *   j*bs .. min(T, j*bs+bs)-1 (bs = block_size); block_index[b,h,i,:] lists the key blocks head h of
 *   query block i attends to: ids outside [0, ceil(T/bs)) are ignored and a repeated id counts once.
 *   out[b,s,h] = softmax_t(scale * q[b,s,h] . k[b,t,g(h)]) @ v[b,t,g(h)] over the keys of the listed
 *   blocks, g(h) = h / (H / Hkv), and with causal != 0 only t <= T - S + s. Rows without an allowed
 *   key are 0. Needs no workspace. Limits: the canonical list of one query block (a bitmap of
 *   ceil(T/bs) bits plus min(Kb, ceil(T/bs)) ids) must fit in shared memory next to the tiles.
 */
DSA_API int32_t dsa_block_sparse_attention(void const* q, void const* k, void const* v, int32_t const* block_index,
    void* out, int64_t B, int64_t S, int64_t T, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int64_t Kb,
    int64_t block_size, float scale, int32_t causal, int32_t dtype, void* stream);

/*
 * DSAMoEExperts / DSAMoEExpertsFP8 (routed experts).
 *   x [N,H] (dtype), topk_ids [N,K] int32, topk_weights [N,K] (weights_dtype: FLOAT32 or dtype),
 *   gate_up [E,2I,H] and down [E,H,I] (expert_dtype: dtype, or FP8_E4M3 with the float32 block
 *   scales gate_up_scale [E,ceil(2I/bs),ceil(H/bs)] and down_scale [E,ceil(H/bs),ceil(I/bs)],
 *   bs = block_size; NULL otherwise), out [N,H] (dtype).
 *   out[n] = sum_k topk_weights[n,k] * down[e] @ (silu(gate_up[e,:I] @ x[n]) * (gate_up[e,I:] @ x[n])),
 *   e = topk_ids[n,k]; slots with e outside [0,E) are skipped; accumulation in float32.
 *   Deterministic: the same inputs give the same bits on every run, whatever the batch.
 * The workspace holds one pass of tokens (routing tables, the intermediate activation in dtype and
 * one float32 row of H per slot); dsa_moe_experts_workspace_size() is that for all N tokens, capped
 * at 1 GiB, and monotone in every argument. A smaller workspace (at least the minimum, one token)
 * makes the launcher run several passes. `path`: -1 picks the kernels (normal use); 0..3 force one
 * (see dsa_moe_experts_path) for tests and benchmarks and fail with DSA_STATUS_UNSUPPORTED when it
 * cannot take the arguments. Needs 1 <= E <= 8192.
 */
DSA_API size_t dsa_moe_experts_workspace_size(int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, int32_t dtype);
DSA_API size_t dsa_moe_experts_min_workspace_size(int64_t K, int64_t E, int64_t H, int64_t I, int32_t dtype);
DSA_API int32_t dsa_moe_experts(void const* x, int32_t const* topk_ids, void const* topk_weights,
    void const* gate_up, void const* down, float const* gate_up_scale, float const* down_scale, void* out,
    int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, int32_t dtype, int32_t weights_dtype,
    int32_t expert_dtype, int64_t block_size, int32_t activation, int32_t path, void* workspace,
    size_t workspace_bytes, void* stream);

/*
 * Which kernels a call with these arguments would use on the current device (for tests and
 * benchmarks), assuming 16-byte aligned tensors and the default workspace: 0 = generic CUDA-core
 * path, 1/2/3 = tensor-core path with 16/64/128 routed rows per tile. Negative on invalid arguments.
 * The answer is the launcher's own decision (the same function), shared memory limits included.
 */
DSA_API int32_t dsa_moe_experts_path(int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, int32_t dtype,
    int32_t expert_dtype, int64_t block_size);

/*
 * Which kernel a call with these arguments would use on the current device (for tests and
 * benchmarks): 0 = generic CUDA-core path, 1 = tensor-core path. Negative on invalid arguments.
 * Each answer is the launcher's own decision (the same function), the device's shared memory
 * limit included, for 16-byte aligned tensors (a misaligned tensor takes the generic path) and:
 *   dsa_sparse_attention_path: an explicit v (v == NULL, values from keys, needs less shared
 *     memory, so a 1 holds for both forms);
 *   dsa_indexer_topk_path: the logits kernel of a call with T > 0;
 *   dsa_block_sparse_attention_path: the smallest block list (one key block); the launcher sizes
 *     the list of the actual T and Kb (a bitmap of ceil(T/block_size) bits plus min(Kb,
 *     ceil(T/block_size)) ids), so tens of thousands of key blocks can leave no room for the
 *     tensor-core tiles and take the generic path where this says 1.
 * Attention calls with T == 0 (or K, Kb == 0) launch no kernel (the output is zeroed); an indexer
 * call with T == 0 runs only the kernel that writes the -1 rows.
 */
DSA_API int32_t dsa_sparse_attention_path(
    int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int32_t dtype);
DSA_API int32_t dsa_indexer_topk_path(int64_t H, int64_t D, int32_t dtype);
DSA_API int32_t dsa_block_sparse_attention_path(int64_t Dk, int64_t Dv, int64_t block_size, int32_t dtype);

/* ---- ABI 5: serving kernels ------------------------------------------------------------------ */

/* -- paged sparse attention (float pools, FP8 latent), split-KV decode -- */

/*
 * DSASparseAttentionPaged / DSASparseAttentionPagedFP8 (ABI 5): DSASparseAttention with the keys and
 * values read through a block table (docs/ops.md, "Paged caches" and "FP8 caches").
 *   q [B,S,H,Dk] (dtype), indices [B,S,K] int32 logical key positions, block_table [B,M] int32,
 *   out [B,S,H,Dv] (dtype). Logical key t of batch row b is pool row [block_table[b, t / page], t % page];
 *   an index < 0, >= M*page, or whose table entry is < 0 or >= P is skipped; rows without a valid
 *   index are 0; pages no row names are never read (they may hold NaN). float32 accumulation.
 * dsa_sparse_attention_paged: k_pool [P,page,Hkv,Dk], v_pool [P,page,Hkv,Dv] (dtype), or v_pool ==
 *   NULL: the values are the first Dv <= Dk channels of the key rows (the contract's v_pool without
 *   pages; each selected row is then read once).
 * dsa_sparse_attention_paged_fp8: FlashMLA's FP8 latent cache. k_pool [P,page,Hkv,C] uint8 float8
 *   e4m3fn codes (0x7F / 0xFF are NaN), k_scale_pool [P,page,Hkv,C/block_size] float32,
 *   k_rope_pool [P,page,Hkv,R] (rope_dtype, a float type of its own; may be NULL when R == 0);
 *   q [B,S,H,C+R]. The key row of a slot is concat(float32(decode(code) * scale of its block_size
 *   channels), rope), the values its first C channels: out [B,S,H,C]. The tensor-core kernel takes
 *   fp16/bf16 q with rope_dtype == dtype, C % 16 == 0, R % 8 == 0, block_size % 8 == 0 (FlashMLA:
 *   C = 512, R = 64, block_size = 128, bf16); it copies a tile's codes and scales into shared memory
 *   and dequantizes them there to q's dtype; other arguments take the generic kernel (fp32 math).
 * Split-KV (FlashMLA's scheme): the K indices of each query row are split across num_splits CTAs
 *   that write float32 partial outputs and log-sum-exps into `workspace`; a combine kernel merges
 *   them. num_splits == 0: the launcher chooses, on the host once per call, from the device's SM
 *   count (decode-sized calls, fewer CTAs than SMs, get enough splits for about two waves, at least
 *   256 indices per split and at most 64 splits; otherwise 1); num_splits > 0 forces (at most)
 *   that many (splits of 32 * ceil(K / num_splits / 32) indices); num_splits < 0 chooses as num_splits
 *   == 0 would on a GPU of -num_splits SMs, whatever the device has (a caller that sizes its
 *   workspace ahead of time, on another machine or GPU, gets the same schedule everywhere: the
 *   TensorRT plugin passes -132). The schedule depends only on the arguments and the device (not
 *   on it for num_splits < 0), and the combine sums the splits in order: the same inputs give the
 *   same bits. A single split needs no workspace and writes out directly.
 * dsa_sparse_attention_paged_num_splits: the number of splits a call with these arguments makes on
 *   the current device (1 = not split; for num_splits < 0 on any device, none needed); -1 on invalid
 *   arguments.
 * dsa_sparse_attention_paged_workspace_size: the bytes of workspace such a call needs (0 when it
 *   does not split); the same function serves both entry points (Dv = C for the FP8 cache). A call
 *   whose workspace is smaller (or not 16-byte aligned) fails with DSA_STATUS_WORKSPACE_TOO_SMALL.
 * With K == 0 or M == 0 no kernel runs (out is zeroed with cudaMemsetAsync).
 */
DSA_API int32_t dsa_sparse_attention_paged_num_splits(
    int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t K, int32_t num_splits);
DSA_API size_t dsa_sparse_attention_paged_workspace_size(
    int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dv, int64_t K, int32_t num_splits);
DSA_API int32_t dsa_sparse_attention_paged(void const* q, void const* k_pool, void const* v_pool,
    int32_t const* indices, int32_t const* block_table, void* out, int64_t B, int64_t S, int64_t H, int64_t Hkv,
    int64_t Dk, int64_t Dv, int64_t K, int64_t P, int64_t page, int64_t M, float scale, int32_t dtype,
    int32_t num_splits, void* workspace, size_t workspace_bytes, void* stream);
DSA_API int32_t dsa_sparse_attention_paged_fp8(void const* q, uint8_t const* k_pool, float const* k_scale_pool,
    void const* k_rope_pool, int32_t const* indices, int32_t const* block_table, void* out, int64_t B, int64_t S,
    int64_t H, int64_t Hkv, int64_t C, int64_t R, int64_t K, int64_t P, int64_t page, int64_t M,
    int64_t block_size, float scale, int32_t dtype, int32_t rope_dtype, int32_t num_splits, void* workspace,
    size_t workspace_bytes, void* stream);

/* -- paged indexer + top-k (float pools, FP8 keys) -- */

/*
 * DSAIndexerTopKPaged / DSAIndexerTopKPagedFP8 (ABI 5).
 *   q [B,S,H,D] (dtype), k_pool [P,page,D] (dtype; uint8 e4m3fn codes for _fp8, with k_scale_pool [P,page]
 *   float32, one scale per token: key = float32(decode(code) * scale)), w [B,S,H] (w_dtype: dtype or
 *   FLOAT32), block_table [B,M] int32, query_start [B] int32, lengths [B] int32, out [B,S,topk] int32.
 *   Logical key t (< M*page) of row b is pool row block_table[b, t/page] * page + t%page; query s of
 *   row b sits at logical position query_start[b] + s and selects among the keys t < min(lengths[b],
 *   M*page) whose page entry is valid (0 <= entry < P) and, with causal != 0, t <= query_start[b] + s.
 *   Score, -1 padding, ties (to the lower logical position) and the deterministic order as
 *   dsa_indexer_topk: the valid allowed keys in ascending order when they all fit, otherwise the keys
 *   above the k-th score in ascending position, then the selected ties in ascending position. Pages
 *   no row names, and keys past a query's limit, are never read (they may hold NaN). FP8: the scale is
 *   applied to each logit in float32 (scale_t * (q . decode(code_t)); decode is exact in fp16/bf16).
 * Workspace: dsa_indexer_topk_paged_workspace_size() (the fp32 scores of a block of query rows over the
 * M*page logical keys, plus the multi-block top-k's state for up to 8 rows); at least the minimum.
 * With B*S <= 8 rows and M*page >= 8192 keys the top-k runs over several CTAs per row (as
 * dsa_indexer_topk); dsa_indexer_topk_set_select_mode() forces either top-k for tests.
 */
DSA_API size_t dsa_indexer_topk_paged_workspace_size(int64_t B, int64_t S, int64_t M, int64_t page, int64_t H,
    int64_t D, int64_t topk);
DSA_API size_t dsa_indexer_topk_paged_min_workspace_size(int64_t M, int64_t page);
DSA_API int32_t dsa_indexer_topk_paged(void const* q, void const* k_pool, void const* w, int32_t const* block_table,
    int32_t const* query_start, int32_t const* lengths, int32_t* out, int64_t B, int64_t S, int64_t P, int64_t page,
    int64_t M, int64_t H, int64_t D, int64_t topk, float scale, int32_t causal, int32_t dtype, int32_t w_dtype,
    void* workspace, size_t workspace_bytes, void* stream);
DSA_API int32_t dsa_indexer_topk_paged_fp8(void const* q, uint8_t const* k_pool, float const* k_scale_pool,
    void const* w, int32_t const* block_table, int32_t const* query_start, int32_t const* lengths, int32_t* out,
    int64_t B, int64_t S, int64_t P, int64_t page, int64_t M, int64_t H, int64_t D, int64_t topk, float scale,
    int32_t causal, int32_t dtype, int32_t w_dtype, void* workspace, size_t workspace_bytes, void* stream);

/*
 * Which top-k every dsa_indexer_topk* call of this process runs (tests and benchmarks): 0 = the
 * launcher's choice, 1 = one CTA per row, 2 = multi-block (splits of 512 keys), 3 = multi-block with a
 * 64-entry shared candidate buffer (the overflow path). Modes 2/3 need B*S <= 8 and the full workspace
 * (else DSA_STATUS_UNSUPPORTED). Every mode gives the same indices in the same order. Returns the
 * previous mode, -1 for an unknown one. Not thread-safe.
 */
DSA_API int32_t dsa_indexer_topk_set_select_mode(int32_t mode);

/*
 * dsa_indexer_topk_paged_fp8's logits (process-wide, not thread-safe): 0 (default) = the MMA in q's
 * dtype on the decoded keys (q exact, the op contract's scores up to fp32 rounding); 1 = on sm_89+
 * with D % 32 == 0 and D <= 128, mma.sync m16n8k32 e4m3 on the key codes with q quantized to e4m3,
 * one power-of-two scale per (query, head) row (DeepGEMM's FP8 MQA logits; the scores then carry q's
 * quantization error). Returns the previous setting, -1 for an invalid one.
 */
DSA_API int32_t dsa_indexer_topk_set_fp8_mma(int32_t enable);

/* -- sampling -- */

/*
 * Token sampling (ABI 5): the next token of each of B rows of logits, chosen on the device.
 *   logits: row b is the V elements at logits + b * row_stride (dtype FLOAT32, FLOAT16 or BFLOAT16;
 *     row_stride >= V, in elements: pass V for [B,V], S*V with logits + (S-1)*V for the last
 *     position of [B,S,V]); out [B] int32. Per-row settings, each a device array [B] or NULL:
 *     temperature (NULL: every row greedy), top_p (NULL: 1), seeds (NULL: 0), offsets (NULL: 0).
 *   temperature[b] <= 0 (or NaN): greedy, the arg max with ties to the lowest index (top_p, seed
 *     and offset are not read for that row). Otherwise p = softmax(logits[b] / temperature[b]);
 *     with top_p[b] < 1 the nucleus keeps a token when the probability mass of the tokens before
 *     it in descending order (ties: lower index first) is below top_p (the most likely token
 *     always stays; top_p <= 0 keeps only it), renormalised; the token is the first in index order
 *     whose cumulative kept probability exceeds u, the uniform draw
 *     u = (((x1 << 32) | x0) >> 11) / 2^53 of Philox4x32-10 with key (seed low, seed high) and
 *     counter (offset low, offset high, 0, 0) (x0, x1: its first two output words), so a caller
 *     reproduces a draw on the host and a server passes each request's seed and its step.
 *   The device computes in float32 (e = exp((l - max) / T), masses as exact 64-bit integers
 *   trunc(e * 2^40), so the result does not depend on the order of additions and is the same on
 *   every run); it can differ from the float64 rule only where u, or top_p, lies within about 1e-5
 *   of a cumulative boundary. NaN logits are never chosen; a row whose largest logit is +inf (or
 *   that has no number) takes the greedy answer. One CTA per row, no workspace, no allocation;
 *   nothing is read from the host, so the call can be captured in a CUDA graph.
 */
DSA_API int32_t dsa_sample_tokens(void const* logits, int64_t row_stride, int32_t* out, float const* temperature,
    float const* top_p, uint64_t const* seeds, int64_t const* offsets, int64_t B, int64_t V, int32_t dtype,
    void* stream);

/* -- paged cache write (ABI 6) -- */

/*
 * DSAPagedCacheWrite (ABI 6): the paged graph's cache write (ScatterND of the call's new tokens into a
 * pool), in place.
 *   pool [P,page,W] (dtype FLOAT32, FLOAT16 or BFLOAT16), indices [B,S,2] int64 (page, offset) of
 *   each new token, updates [B,S,W] (dtype).
 *   pool[indices[b,s,0], indices[b,s,1], :] = updates[b,s,:] for every (b, s) whose page is in [0,P)
 *   and offset in [0,page); every other (b, s) is skipped: nothing outside the pool is ever written
 *   and the rest of the pool keeps its bytes. The bits are copied unchanged. Two tokens that name
 *   the same slot race and one of them wins (the paged graph sends only padding tokens to one slot,
 *   the scratch slot page 0 offset 0; real tokens never share a slot). One warp per token: 16-byte
 *   copies where the pool row and the update row are equally aligned modulo 16, element copies for
 *   the rest (the tail of a row that is not a multiple of 16 bytes). Needs no workspace; with
 *   B*S == 0 or P == 0 no kernel runs. Needs pool and updates aligned to their element size and
 *   indices to 8 bytes, B*S < 2^31.
 */
DSA_API int32_t dsa_paged_cache_write(void* pool, int64_t const* indices, void const* updates, int64_t B, int64_t S,
    int64_t P, int64_t page, int64_t W, int32_t dtype, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* DSA_KERNELS_H */
