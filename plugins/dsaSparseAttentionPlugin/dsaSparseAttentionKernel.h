/*
 * Launchers of the DSASparseAttention kernels (see README.md in this folder for the design).
 */
#pragma once

#include "common/dsaKernelCommon.h"

namespace dsa
{

struct SparseAttentionParams
{
    void const* q{nullptr};          //!< [B,S,H,Dk]
    void const* k{nullptr};          //!< [B,T,Hkv,Dk]
    void const* v{nullptr};          //!< [B,T,Hkv,Dv]; unused (may be null) when valuesFromKeys
    int32_t const* indices{nullptr}; //!< [B,S,K], -1 or out-of-range entries are skipped
    void* out{nullptr};              //!< [B,S,H,Dv]
    int64_t B{0}, S{0}, T{0}, H{0}, Hkv{0}, Dk{0}, Dv{0}, K{0};
    float scale{1.F};
    //! The values are the first Dv channels of k's rows (Dv <= Dk; DeepSeek's absorbed MLA, the
    //! contract's empty v [B,0,Hkv,Dv]): v is not read, and each selected row is loaded once.
    bool valuesFromKeys{false};
};

//! Which kernel family a launch with these arguments takes on device dev: 1 = tensor-core
//! (mma.sync) path, 0 = generic path. The launcher decides with the same function, so the two
//! always agree. `aligned`: q, k, v (when read) and out are 16-byte aligned.
int32_t sparseAttentionPath(int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, bool valuesFromKeys, bool aligned,
    DType dtype, DeviceInfo const& dev);

//! Validates the parameters and enqueues the kernel on stream (with T == 0 or K == 0 only a
//! memset of out: every row is 0). Returns a Status.
int32_t launchSparseAttention(SparseAttentionParams const& p, DType dtype, cudaStream_t stream);

} // namespace dsa
