/*
 * C ABI over the DSA launchers (see dsa_kernels.h). Every entry point validates its arguments,
 * never throws across the C boundary and records a message for dsa_last_error() on failure.
 */
#include "api/dsa_kernels.h"

#include "common/dsaKernelCommon.h"
#include "dsaBlockSparseAttentionPlugin/dsaBlockSparseAttentionKernel.h"
#include "dsaIndexerTopKPlugin/dsaIndexerTopKKernel.h"
#include "dsaMoEExpertsPlugin/dsaMoEExpertsKernel.h"
#include "dsaPagedCacheWritePlugin/dsaPagedCacheWriteKernel.h"
#include "dsaSampling/dsaSamplingKernel.h"
#include "dsaSparseAttentionPlugin/dsaSparseAttentionKernel.h"

#include <exception>
#include <string>

namespace
{
//! Runs the body of a C entry point: clears the last error and turns any C++ exception into
//! kINVALID_ARGUMENT with its message for dsa_last_error() (nothing is thrown across the C boundary).
template <typename Body>
int32_t guarded(char const* name, Body&& body) noexcept
{
    try
    {
        dsa::clearLastError();
        return body();
    }
    catch (std::exception const& e)
    {
        return dsa::setLastError(dsa::kINVALID_ARGUMENT, e.what());
    }
    catch (...)
    {
        return dsa::setLastError(dsa::kINVALID_ARGUMENT, std::string(name) + ": unknown exception");
    }
}
} // namespace

extern "C"
{

DSA_API int32_t dsa_kernels_abi_version(void)
{
    return DSA_KERNELS_ABI_VERSION;
}

DSA_API char const* dsa_status_string(int32_t status)
{
    switch (status)
    {
    case DSA_STATUS_SUCCESS: return "success";
    case DSA_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case DSA_STATUS_UNSUPPORTED: return "unsupported";
    case DSA_STATUS_WORKSPACE_TOO_SMALL: return "workspace too small";
    case DSA_STATUS_CUDA_ERROR: return "CUDA error";
    default: return "unknown status";
    }
}

DSA_API char const* dsa_last_error(void)
{
    return dsa::lastError();
}

DSA_API size_t dsa_indexer_topk_workspace_size(int64_t B, int64_t S, int64_t T, int64_t H, int64_t D, int64_t topk)
{
    return dsa::indexerTopKWorkspaceSize(B, S, T, H, D, topk);
}

DSA_API size_t dsa_indexer_topk_min_workspace_size(int64_t T)
{
    return dsa::indexerTopKMinWorkspaceSize(T);
}

DSA_API int32_t dsa_indexer_topk(void const* q, void const* k, void const* w, int32_t const* lengths, int32_t* out,
    int64_t B, int64_t S, int64_t T, int64_t H, int64_t D, int64_t topk, float scale, int32_t causal, int32_t dtype,
    int32_t w_dtype, void* workspace, size_t workspace_bytes, void* stream)
{
    return guarded("dsa_indexer_topk", [&]() -> int32_t {
        if (!dsa::isValidDType(dtype) || !dsa::isValidDType(w_dtype))
        {
            return dsa::setLastError(dsa::kINVALID_ARGUMENT, "dsa_indexer_topk: unknown dtype code");
        }
        dsa::IndexerTopKParams p;
        p.q = q;
        p.k = k;
        p.w = w;
        p.lengths = lengths;
        p.out = out;
        p.B = B;
        p.S = S;
        p.T = T;
        p.H = H;
        p.D = D;
        p.topk = topk;
        p.scale = scale;
        p.causal = causal != 0 ? 1 : 0;
        return dsa::launchIndexerTopK(p, static_cast<dsa::DType>(dtype), static_cast<dsa::DType>(w_dtype), workspace,
            workspace_bytes, static_cast<cudaStream_t>(stream));
    });
}

DSA_API size_t dsa_sparse_attention_workspace_size(int64_t /*B*/, int64_t /*S*/, int64_t /*T*/, int64_t /*H*/,
    int64_t /*Hkv*/, int64_t /*Dk*/, int64_t /*Dv*/, int64_t /*K*/)
{
    return 0;
}

DSA_API int32_t dsa_sparse_attention(void const* q, void const* k, void const* v, int32_t const* indices, void* out,
    int64_t B, int64_t S, int64_t T, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int64_t K, float scale,
    int32_t dtype, void* stream)
{
    return guarded("dsa_sparse_attention", [&]() -> int32_t {
        if (!dsa::isValidDType(dtype))
        {
            return dsa::setLastError(dsa::kINVALID_ARGUMENT, "dsa_sparse_attention: unknown dtype code");
        }
        dsa::SparseAttentionParams p;
        p.q = q;
        p.k = k;
        p.v = v;
        p.indices = indices;
        p.out = out;
        p.B = B;
        p.S = S;
        p.T = T;
        p.H = H;
        p.Hkv = Hkv;
        p.Dk = Dk;
        p.Dv = Dv;
        p.K = K;
        p.scale = scale;
        p.valuesFromKeys = v == nullptr && T > 0; // see dsa_kernels.h: NULL v = values from keys
        return dsa::launchSparseAttention(p, static_cast<dsa::DType>(dtype), static_cast<cudaStream_t>(stream));
    });
}

DSA_API int32_t dsa_sparse_attention_path(int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int32_t dtype)
{
    if (!dsa::isValidDType(dtype) || H <= 0 || Hkv <= 0 || H % Hkv != 0)
    {
        return -1;
    }
    dsa::DeviceInfo dev;
    if (!dsa::currentDeviceInfo(dev))
    {
        return -1;
    }
    // The launcher's own decision for aligned tensors and an explicit v (values from keys need less
    // shared memory, so a tensor-core answer holds for both forms).
    return dsa::sparseAttentionPath(H, Hkv, Dk, Dv, /*valuesFromKeys=*/false, /*aligned=*/true,
        static_cast<dsa::DType>(dtype), dev);
}

DSA_API int32_t dsa_block_sparse_attention(void const* q, void const* k, void const* v, int32_t const* block_index,
    void* out, int64_t B, int64_t S, int64_t T, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int64_t Kb,
    int64_t block_size, float scale, int32_t causal, int32_t dtype, void* stream)
{
    return guarded("dsa_block_sparse_attention", [&]() -> int32_t {
        if (!dsa::isValidDType(dtype))
        {
            return dsa::setLastError(dsa::kINVALID_ARGUMENT, "dsa_block_sparse_attention: unknown dtype code");
        }
        dsa::BlockSparseAttentionParams p;
        p.q = q;
        p.k = k;
        p.v = v;
        p.blockIndex = block_index;
        p.out = out;
        p.B = B;
        p.S = S;
        p.T = T;
        p.H = H;
        p.Hkv = Hkv;
        p.Dk = Dk;
        p.Dv = Dv;
        p.Kb = Kb;
        p.blockSize = block_size;
        p.scale = scale;
        p.causal = causal != 0;
        return dsa::launchBlockSparseAttention(p, static_cast<dsa::DType>(dtype), static_cast<cudaStream_t>(stream));
    });
}

DSA_API int32_t dsa_block_sparse_attention_path(int64_t Dk, int64_t Dv, int64_t block_size, int32_t dtype)
{
    if (!dsa::isValidDType(dtype) || Dk <= 0 || Dv <= 0 || block_size <= 0)
    {
        return -1;
    }
    dsa::DeviceInfo dev;
    if (!dsa::currentDeviceInfo(dev))
    {
        return -1;
    }
    // The launcher's own decision for aligned tensors and the smallest block list (T <= block_size,
    // Kb = 1); a list of very many key blocks takes shared memory from the tiles (see dsa_kernels.h).
    return dsa::blockSparseAttentionPath(Dk, Dv, block_size, /*T=*/block_size, /*Kb=*/1, /*aligned=*/true,
        static_cast<dsa::DType>(dtype), dev);
}

DSA_API int32_t dsa_indexer_topk_path(int64_t H, int64_t D, int32_t dtype)
{
    if (!dsa::isValidDType(dtype) || H <= 0 || D <= 0)
    {
        return -1;
    }
    dsa::DeviceInfo dev;
    if (!dsa::currentDeviceInfo(dev))
    {
        return -1;
    }
    return dsa::indexerTopKPath(H, D, static_cast<dsa::DType>(dtype), /*aligned=*/true, dev);
}

DSA_API size_t dsa_moe_experts_workspace_size(int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, int32_t dtype)
{
    if (!dsa::isValidDType(dtype))
    {
        return 0;
    }
    return dsa::moeExpertsWorkspaceSize(N, K, E, H, I, static_cast<dsa::DType>(dtype));
}

DSA_API size_t dsa_moe_experts_min_workspace_size(int64_t K, int64_t E, int64_t H, int64_t I, int32_t dtype)
{
    if (!dsa::isValidDType(dtype))
    {
        return 0;
    }
    return dsa::moeExpertsMinWorkspaceSize(K, E, H, I, static_cast<dsa::DType>(dtype));
}

DSA_API int32_t dsa_moe_experts(void const* x, int32_t const* topk_ids, void const* topk_weights,
    void const* gate_up, void const* down, float const* gate_up_scale, float const* down_scale, void* out,
    int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, int32_t dtype, int32_t weights_dtype,
    int32_t expert_dtype, int64_t block_size, int32_t activation, int32_t path, void* workspace,
    size_t workspace_bytes, void* stream)
{
    return guarded("dsa_moe_experts", [&]() -> int32_t {
        if (!dsa::isValidDType(dtype) || !dsa::isValidDType(weights_dtype) || !dsa::isValidWeightDType(expert_dtype))
        {
            return dsa::setLastError(dsa::kINVALID_ARGUMENT, "dsa_moe_experts: unknown dtype code");
        }
        if (activation != DSA_ACTIVATION_SILU)
        {
            return dsa::setLastError(dsa::kINVALID_ARGUMENT,
                "dsa_moe_experts: unknown activation code " + std::to_string(activation) + " (0 = silu)");
        }
        dsa::MoEExpertsParams p;
        p.x = x;
        p.topkIds = topk_ids;
        p.topkWeights = topk_weights;
        p.gateUp = gate_up;
        p.down = down;
        p.gateUpScale = gate_up_scale;
        p.downScale = down_scale;
        p.out = out;
        p.N = N;
        p.K = K;
        p.E = E;
        p.H = H;
        p.I = I;
        p.blockSize = block_size;
        p.dtype = static_cast<dsa::DType>(dtype);
        p.weightsDtype = static_cast<dsa::DType>(weights_dtype);
        p.expertDtype = static_cast<dsa::DType>(expert_dtype);
        p.activation = dsa::MoEActivation::kSILU;
        p.path = path;
        return dsa::launchMoEExperts(p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
    });
}

DSA_API int32_t dsa_moe_experts_path(int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, int32_t dtype,
    int32_t expert_dtype, int64_t block_size)
{
    if (!dsa::isValidDType(dtype) || !dsa::isValidWeightDType(expert_dtype)
        || (expert_dtype != dtype && expert_dtype != DSA_DTYPE_FP8_E4M3))
    {
        return -1;
    }
    dsa::DeviceInfo dev;
    if (!dsa::currentDeviceInfo(dev))
    {
        return -1;
    }
    return dsa::moeExpertsPath(N, K, E, H, I, static_cast<dsa::DType>(dtype), static_cast<dsa::DType>(expert_dtype),
        block_size, /*aligned=*/true, dev);
}

// ---- paged sparse attention (float pools, FP8 latent), split-KV decode (ABI 5) ----------------

DSA_API int32_t dsa_sparse_attention_paged_num_splits(
    int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t K, int32_t num_splits)
{
    dsa::DeviceInfo dev;
    // A negative num_splits plans for a GPU of -num_splits SMs: no device is needed.
    if (B < 0 || S < 0 || K < 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0 || (num_splits >= 0 && !dsa::currentDeviceInfo(dev)))
    {
        return -1;
    }
    return dsa::sparseAttentionSplits(B, S, H, Hkv, K, num_splits, dev, nullptr);
}

DSA_API size_t dsa_sparse_attention_paged_workspace_size(
    int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dv, int64_t K, int32_t num_splits)
{
    int32_t const splits = dsa_sparse_attention_paged_num_splits(B, S, H, Hkv, K, num_splits);
    return splits > 1 && Dv > 0 ? dsa::sparseAttentionSplitWorkspace(B, S, H, Dv, splits) : 0;
}

namespace
{
dsa::SparseAttentionParams pagedParams(void const* q, int32_t const* indices, int32_t const* block_table, void* out,
    int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, int64_t K, int64_t P, int64_t page,
    int64_t M, float scale)
{
    dsa::SparseAttentionParams p;
    p.q = q;
    p.indices = indices;
    p.blockTable = block_table;
    p.out = out;
    p.B = B;
    p.S = S;
    p.H = H;
    p.Hkv = Hkv;
    p.Dk = Dk;
    p.Dv = Dv;
    p.K = K;
    p.P = P;
    p.page = page;
    p.M = M;
    p.scale = scale;
    return p;
}
} // namespace

DSA_API int32_t dsa_sparse_attention_paged(void const* q, void const* k_pool, void const* v_pool,
    int32_t const* indices, int32_t const* block_table, void* out, int64_t B, int64_t S, int64_t H, int64_t Hkv,
    int64_t Dk, int64_t Dv, int64_t K, int64_t P, int64_t page, int64_t M, float scale, int32_t dtype,
    int32_t num_splits, void* workspace, size_t workspace_bytes, void* stream)
{
    return guarded("dsa_sparse_attention_paged", [&]() -> int32_t {
        if (!dsa::isValidDType(dtype))
        {
            return dsa::setLastError(dsa::kINVALID_ARGUMENT, "dsa_sparse_attention_paged: unknown dtype code");
        }
        dsa::SparseAttentionParams p
            = pagedParams(q, indices, block_table, out, B, S, H, Hkv, Dk, Dv, K, P, page, M, scale);
        p.k = k_pool;
        p.v = v_pool;
        p.valuesFromKeys = v_pool == nullptr; // see dsa_kernels.h: NULL v_pool = values from keys
        return dsa::launchSparseAttentionPaged(p, static_cast<dsa::DType>(dtype), num_splits, workspace,
            workspace_bytes, static_cast<cudaStream_t>(stream));
    });
}

DSA_API int32_t dsa_sparse_attention_paged_fp8(void const* q, uint8_t const* k_pool, float const* k_scale_pool,
    void const* k_rope_pool, int32_t const* indices, int32_t const* block_table, void* out, int64_t B, int64_t S,
    int64_t H, int64_t Hkv, int64_t C, int64_t R, int64_t K, int64_t P, int64_t page, int64_t M,
    int64_t block_size, float scale, int32_t dtype, int32_t rope_dtype, int32_t num_splits, void* workspace,
    size_t workspace_bytes, void* stream)
{
    return guarded("dsa_sparse_attention_paged_fp8", [&]() -> int32_t {
        if (!dsa::isValidDType(dtype) || !dsa::isValidDType(rope_dtype))
        {
            return dsa::setLastError(dsa::kINVALID_ARGUMENT, "dsa_sparse_attention_paged_fp8: unknown dtype code");
        }
        dsa::SparseAttentionParams p
            = pagedParams(q, indices, block_table, out, B, S, H, Hkv, C + R, C, K, P, page, M, scale);
        p.k = k_pool;
        p.fp8 = true;
        p.valuesFromKeys = true; // the values are the first C channels of the key rows
        p.kScale = k_scale_pool;
        p.kRope = k_rope_pool;
        p.C = C;
        p.R = R;
        p.scaleBlock = block_size;
        p.ropeDtype = static_cast<dsa::DType>(rope_dtype);
        return dsa::launchSparseAttentionPaged(p, static_cast<dsa::DType>(dtype), num_splits, workspace,
            workspace_bytes, static_cast<cudaStream_t>(stream));
    });
}

} // extern "C"

// ---- ABI 5: sampling ------------------------------------------------------------------------------
extern "C"
{

DSA_API int32_t dsa_sample_tokens(void const* logits, int64_t row_stride, int32_t* out, float const* temperature,
    float const* top_p, uint64_t const* seeds, int64_t const* offsets, int64_t B, int64_t V, int32_t dtype,
    void* stream)
{
    return guarded("dsa_sample_tokens", [&]() -> int32_t {
        if (!dsa::isValidDType(dtype))
        {
            return dsa::setLastError(dsa::kINVALID_ARGUMENT, "dsa_sample_tokens: unknown dtype code");
        }
        dsa::SampleTokensParams p;
        p.logits = logits;
        p.out = out;
        p.temperature = temperature;
        p.topP = top_p;
        p.seeds = seeds;
        p.offsets = offsets;
        p.B = B;
        p.V = V;
        p.rowStride = row_stride;
        return dsa::launchSampleTokens(p, static_cast<dsa::DType>(dtype), static_cast<cudaStream_t>(stream));
    });
}

} // extern "C"

// ---- ABI 5: paged indexer + top-k (float pools, FP8 keys) ----------------------------------------
namespace
{
int32_t indexerTopKPagedCall(char const* name, void const* q, void const* k_pool, float const* k_scale_pool,
    bool fp8, void const* w, int32_t const* block_table, int32_t const* query_start, int32_t const* lengths,
    int32_t* out, int64_t B, int64_t S, int64_t P, int64_t page, int64_t M, int64_t H, int64_t D, int64_t topk,
    float scale, int32_t causal, int32_t dtype, int32_t w_dtype, void* workspace, size_t workspace_bytes,
    void* stream)
{
    return guarded(name, [&]() -> int32_t {
        if (!dsa::isValidDType(dtype) || !dsa::isValidDType(w_dtype))
        {
            return dsa::setLastError(dsa::kINVALID_ARGUMENT, std::string(name) + ": unknown dtype code");
        }
        if (page < 1 || M < 0 || M > 0x7fffffffLL / page)
        {
            return dsa::setLastError(
                dsa::kINVALID_ARGUMENT, std::string(name) + ": needs page >= 1, M >= 0 and M * page < 2^31");
        }
        dsa::IndexerTopKParams p;
        p.q = q;
        p.k = k_pool;
        p.w = w;
        p.lengths = lengths;
        p.out = out;
        p.blockTable = block_table;
        p.queryStart = query_start;
        p.kScale = k_scale_pool;
        p.B = B;
        p.S = S;
        p.T = M * page;
        p.H = H;
        p.D = D;
        p.topk = topk;
        p.P = P;
        p.page = page;
        p.M = M;
        p.scale = scale;
        p.causal = causal != 0 ? 1 : 0;
        return dsa::launchIndexerTopKPaged(p, static_cast<dsa::DType>(dtype), static_cast<dsa::DType>(w_dtype), fp8,
            workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
    });
}
} // namespace

extern "C"
{

DSA_API size_t dsa_indexer_topk_paged_workspace_size(int64_t B, int64_t S, int64_t M, int64_t page, int64_t H,
    int64_t D, int64_t topk)
{
    return M < 0 || page < 0 ? 0 : dsa::indexerTopKWorkspaceSize(B, S, M * page, H, D, topk);
}

DSA_API size_t dsa_indexer_topk_paged_min_workspace_size(int64_t M, int64_t page)
{
    return M < 0 || page < 0 ? 0 : dsa::indexerTopKMinWorkspaceSize(M * page);
}

DSA_API int32_t dsa_indexer_topk_paged(void const* q, void const* k_pool, void const* w, int32_t const* block_table,
    int32_t const* query_start, int32_t const* lengths, int32_t* out, int64_t B, int64_t S, int64_t P, int64_t page,
    int64_t M, int64_t H, int64_t D, int64_t topk, float scale, int32_t causal, int32_t dtype, int32_t w_dtype,
    void* workspace, size_t workspace_bytes, void* stream)
{
    return indexerTopKPagedCall("dsa_indexer_topk_paged", q, k_pool, nullptr, false, w, block_table, query_start,
        lengths, out, B, S, P, page, M, H, D, topk, scale, causal, dtype, w_dtype, workspace, workspace_bytes, stream);
}

DSA_API int32_t dsa_indexer_topk_paged_fp8(void const* q, uint8_t const* k_pool, float const* k_scale_pool,
    void const* w, int32_t const* block_table, int32_t const* query_start, int32_t const* lengths, int32_t* out,
    int64_t B, int64_t S, int64_t P, int64_t page, int64_t M, int64_t H, int64_t D, int64_t topk, float scale,
    int32_t causal, int32_t dtype, int32_t w_dtype, void* workspace, size_t workspace_bytes, void* stream)
{
    return indexerTopKPagedCall("dsa_indexer_topk_paged_fp8", q, k_pool, k_scale_pool, true, w, block_table,
        query_start, lengths, out, B, S, P, page, M, H, D, topk, scale, causal, dtype, w_dtype, workspace,
        workspace_bytes, stream);
}

DSA_API int32_t dsa_indexer_topk_set_select_mode(int32_t mode)
{
    return dsa::indexerTopKSetSelectMode(mode);
}

DSA_API int32_t dsa_indexer_topk_set_fp8_mma(int32_t enable)
{
    return dsa::indexerTopKSetFp8Mma(enable);
}

} // extern "C"

// ---- ABI 6: paged cache write ---------------------------------------------------------------------
extern "C"
{

DSA_API int32_t dsa_paged_cache_write(void* pool, int64_t const* indices, void const* updates, int64_t B, int64_t S,
    int64_t P, int64_t page, int64_t W, int32_t dtype, void* stream)
{
    return guarded("dsa_paged_cache_write", [&]() -> int32_t {
        if (!dsa::isValidDType(dtype))
        {
            return dsa::setLastError(dsa::kINVALID_ARGUMENT, "dsa_paged_cache_write: unknown dtype code");
        }
        dsa::PagedCacheWriteParams p;
        p.pool = pool;
        p.indices = indices;
        p.updates = updates;
        p.B = B;
        p.S = S;
        p.P = P;
        p.page = page;
        p.W = W;
        return dsa::launchPagedCacheWrite(p, static_cast<dsa::DType>(dtype), static_cast<cudaStream_t>(stream));
    });
}

} // extern "C"
