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

} // namespace dsa
