/*
 * Launcher of the paged cache write (DSAPagedCacheWrite, api/dsa_kernels.h dsa_paged_cache_write):
 * the paged graph's ScatterND of each call's new tokens into a cache pool, in place.
 */
#pragma once

#include "common/dsaKernelCommon.h"

namespace dsa
{

struct PagedCacheWriteParams
{
    void* pool{nullptr};              //!< [P, page, W] (dtype), written in place
    int64_t const* indices{nullptr};  //!< [B, S, 2] int64: (page, offset) of each new token
    void const* updates{nullptr};     //!< [B, S, W] (dtype)
    int64_t B{0};
    int64_t S{0};
    int64_t P{0};
    int64_t page{0};                  //!< slots per page (64 in the paged graph)
    int64_t W{0};                     //!< elements per slot (576 latent, 128 index keys)
};

//! Rows (tokens) per CTA: one warp copies one row.
constexpr int32_t kCACHE_WRITE_ROWS_PER_CTA = 4;

//! Validates the parameters and enqueues the copy (one warp per row). Needs no workspace; with
//! B*S == 0 or P == 0 nothing runs.
int32_t launchPagedCacheWrite(PagedCacheWriteParams const& p, DType dtype, cudaStream_t stream);

} // namespace dsa
