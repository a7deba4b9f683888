/*
 * Launcher of the token-sampling kernel (see README.md in this folder for the rule and the design).
 */
#pragma once

#include "common/dsaKernelCommon.h"

namespace dsa
{

struct SampleTokensParams
{
    void const* logits{nullptr};         //!< row b starts at logits + b * rowStride (elements of dtype)
    int32_t* out{nullptr};               //!< [B] chosen token ids
    float const* temperature{nullptr};   //!< [B] or null (every row greedy); <= 0 or NaN: greedy
    float const* topP{nullptr};          //!< [B] or null (1.0: no nucleus)
    uint64_t const* seeds{nullptr};      //!< [B] Philox keys, or null (0)
    int64_t const* offsets{nullptr};     //!< [B] Philox counters (the decode step), or null (0)
    int64_t B{0};
    int64_t V{0};
    int64_t rowStride{0};                //!< elements between rows (>= V)
};

//! Threads of the one CTA per row.
constexpr int32_t kSAMPLE_THREADS = 512;

//! Validates the parameters and enqueues one CTA per row. Needs no workspace.
int32_t launchSampleTokens(SampleTokensParams const& p, DType dtype, cudaStream_t stream);

} // namespace dsa
