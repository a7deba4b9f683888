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

/* Element types; values are stable across releases. */
typedef enum
{
    DSA_DTYPE_FLOAT32 = 0,
    DSA_DTYPE_FLOAT16 = 1,
    DSA_DTYPE_BFLOAT16 = 2
} dsa_dtype_t;

/* Status codes; 0 is success. */
typedef enum
{
    DSA_STATUS_SUCCESS = 0,
    DSA_STATUS_INVALID_ARGUMENT = 1,
    DSA_STATUS_UNSUPPORTED = 2,
    DSA_STATUS_WORKSPACE_TOO_SMALL = 3,
    DSA_STATUS_CUDA_ERROR = 4
} dsa_status_t;

/* Version of this ABI (bumped on any incompatible change). */
#define DSA_KERNELS_ABI_VERSION 1
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
 *   positions are written in unspecified order, remaining slots are -1.
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
 */
DSA_API size_t dsa_sparse_attention_workspace_size(
    int64_t B, int64_t S, int64_t T, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int64_t K);
DSA_API int32_t dsa_sparse_attention(void const* q, void const* k, void const* v, int32_t const* indices, void* out,
    int64_t B, int64_t S, int64_t T, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int64_t K, float scale,
    int32_t dtype, void* stream);

/*
 * Which kernel a call with these arguments would use on the current device (for tests and
 * benchmarks): 0 = generic CUDA-core path, 1 = tensor-core path. Negative on invalid arguments.
 */
DSA_API int32_t dsa_sparse_attention_path(
    int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int32_t dtype);
DSA_API int32_t dsa_indexer_topk_path(int64_t H, int64_t D, int32_t dtype);

#ifdef __cplusplus
}
#endif

#endif /* DSA_KERNELS_H */
