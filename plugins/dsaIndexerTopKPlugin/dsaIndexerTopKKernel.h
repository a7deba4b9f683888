/*
 * Launchers of the DSAIndexerTopK kernels (see README.md in this folder for the design).
 */
#pragma once

#include "common/dsaKernelCommon.h"

namespace dsa
{

struct IndexerTopKParams
{
    void const* q{nullptr};          //!< [B,S,H,D]
    void const* k{nullptr};          //!< [B,T,D]
    void const* w{nullptr};          //!< [B,S,H], dtype of q or float32
    int32_t const* lengths{nullptr}; //!< [B] or null
    int32_t* out{nullptr};           //!< [B,S,topk]
    int64_t B{0}, S{0}, T{0}, H{0}, D{0}, topk{0};
    float scale{1.F};
    int32_t causal{1};
    // Paged index-key cache (dsa_indexer_topk_paged[_fp8]); blockTable == nullptr: k is contiguous [B,T,D].
    int32_t const* blockTable{nullptr}; //!< [B,M]: logical key t of row b is pool row blockTable[b,t/page]*page + t%page
    int32_t const* queryStart{nullptr}; //!< [B]: query s of row b sits at queryStart[b] + s (paged only)
    float const* kScale{nullptr};       //!< [P,page] float32, one scale per token (FP8 keys only)
    int64_t P{0}, page{0}, M{0};        //!< pool pages, tokens per page, table columns (T = M * page)
};

//! Score rows kept in the workspace by default (256 MiB of fp32 scores at most).
constexpr size_t kINDEXER_WORKSPACE_BUDGET = size_t{256} << 20;

//! Workspace for these shapes: min(4*B*S*T, budget) bytes, at least one row of T fp32 scores.
//! Monotone in B, S, T: the size for a profile's maximum shapes covers all smaller shapes.
size_t indexerTopKWorkspaceSize(int64_t B, int64_t S, int64_t T, int64_t H, int64_t D, int64_t topk);
//! The smallest workspace the launcher accepts (one row of scores).
size_t indexerTopKMinWorkspaceSize(int64_t T);

//! The logits kernel a launch with these arguments (and T > 0) takes on device dev: 1 = tensor-core,
//! 0 = generic. The launcher decides with the same function, so the two always agree. `aligned`:
//! q and k are 16-byte aligned.
int32_t indexerTopKPath(int64_t H, int64_t D, DType dtype, bool aligned, DeviceInfo const& dev);

//! Validates the parameters and enqueues logits + top-k kernels, chunked to fit the workspace.
int32_t launchIndexerTopK(IndexerTopKParams const& p, DType dtype, DType wDtype, void* workspace,
    size_t workspaceBytes, cudaStream_t stream);

//! The paged form: p.k is the key pool [P,page,D] (dtype, or uint8 e4m3fn codes with p.kScale when
//! fp8Keys), p.T must be M * page; blockTable and queryStart are required.
int32_t launchIndexerTopKPaged(IndexerTopKParams const& p, DType dtype, DType wDtype, bool fp8Keys, void* workspace,
    size_t workspaceBytes, cudaStream_t stream);

//! Which top-k the launcher runs: 0 = its own choice (multi-block for few long rows), 1 = one CTA per
//! row, 2 = multi-block (splits of 512 keys), 3 = multi-block with a 64-entry shared candidate buffer
//! (exercises the overflow path). For tests and benchmarks; returns the previous mode (-1: invalid).
int32_t indexerTopKSetSelectMode(int32_t mode);

//! FP8 keys (dsa_indexer_topk_paged_fp8): 1 = on sm_89+ with D % 32 == 0 and D <= 128, the logits MMA is
//! m16n8k32 e4m3 with q quantized to e4m3 (one power-of-two scale per (query, head) row, i.e. per 128
//! values at D = 128), DeepGEMM's FP8 logits; 0 (default) = the MMA in q's dtype on decoded keys,
//! which keeps q exact. Returns the previous setting (-1: invalid).
int32_t indexerTopKSetFp8Mma(int32_t enable);

} // namespace dsa
