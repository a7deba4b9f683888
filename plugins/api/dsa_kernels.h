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
 * version-4 entry points are unchanged. */
#define DSA_KERNELS_ABI_VERSION 5
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

/* -- paged indexer + top-k (float pools, FP8 keys) -- */

/* -- sampling -- */

#ifdef __cplusplus
}
#endif

#endif /* DSA_KERNELS_H */
