/*
 * Launchers of the DSABlockSparseAttention kernels (see README.md in this folder for the design).
 */
#pragma once

#include "common/dsaKernelCommon.h"

namespace dsa
{

struct BlockSparseAttentionParams
{
    void const* q{nullptr};             //!< [B,S,H,Dk]
    void const* k{nullptr};             //!< [B,T,Hkv,Dk]
    void const* v{nullptr};             //!< [B,T,Hkv,Dv]
    int32_t const* blockIndex{nullptr}; //!< [B,H,ceil(S/blockSize),Kb]; ids outside [0, ceil(T/blockSize)) ignored
    void* out{nullptr};                 //!< [B,S,H,Dv]
    int64_t B{0}, S{0}, T{0}, H{0}, Hkv{0}, Dk{0}, Dv{0}, Kb{0};
    int64_t blockSize{0};
    float scale{1.F};
    //! Query s (absolute position T - S + s) attends only to keys t <= T - S + s of its blocks.
    bool causal{true};
};

//! Which kernel family a launch with these arguments (and T, Kb > 0) takes on device dev:
//! 1 = tensor-core (mma.sync) path, 0 = generic path. The launcher decides with the same function,
//! so the two always agree. T and Kb size the canonical block list that shares the CTA's shared
//! memory with the tiles; `aligned`: q, k, v and out are 16-byte aligned.
int32_t blockSparseAttentionPath(int64_t Dk, int64_t Dv, int64_t blockSize, int64_t T, int64_t Kb, bool aligned,
    DType dtype, DeviceInfo const& dev);

//! Validates the parameters and enqueues the kernel on stream. Returns a Status. Needs no workspace.
int32_t launchBlockSparseAttention(BlockSparseAttentionParams const& p, DType dtype, cudaStream_t stream);

} // namespace dsa
