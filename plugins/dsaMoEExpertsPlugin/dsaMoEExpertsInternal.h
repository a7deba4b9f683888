/*
 * Pieces shared by the DSAMoEExperts translation units (routing and combine, grouped GEMMs,
 * launcher); not part of the launcher API in dsaMoEExpertsKernel.h.
 */
#pragma once

#include "dsaMoEExpertsKernel.h"

#include <cstdint>

namespace dsa
{
namespace moe
{

constexpr int64_t kROUTE_MIN_CHUNK = 256; //!< routing slots per chunk, at least
constexpr int64_t kROUTE_MAX_CHUNKS = 64; //!< routing chunks per pass, at most
constexpr int32_t kGEN_BM = 64;           //!< routed rows per tile of the generic GEMM

//! Routing chunks the workspace reserves histograms for (the launch may use fewer).
inline int64_t maxRouteChunks(int64_t S)
{
    int64_t const c = ceilDiv(S, kROUTE_MIN_CHUNK);
    return c < 1 ? 1 : (c > kROUTE_MAX_CHUNKS ? kROUTE_MAX_CHUNKS : c);
}

//! Routed rows per tile of a kernel path (the route scan counts tiles of this height).
inline int32_t pathRows(int32_t path)
{
    switch (path)
    {
    case kMOE_PATH_TC_SMALL: return 16;
    case kMOE_PATH_TC_MEDIUM: return 64;
    case kMOE_PATH_TC_LARGE: return 128;
    default: return kGEN_BM;
    }
}

//! One grouped GEMM over the expert-ordered rows of a pass.
struct GemmArgs
{
    void const* a{nullptr};           // gate_up: x of this pass [tokens][H]; down: act [S][I]
    void const* w{nullptr};           // [E][nW][kd]
    float const* scale{nullptr};      // FP8: [E][ceil(nW/bs)][ceil(kd/bs)]
    int32_t const* perm{nullptr};     // [S]
    int32_t const* expertOff{nullptr};
    int32_t const* tileOff{nullptr};
    void* act{nullptr};               // gate_up output [S][I]
    float* slotOut{nullptr};          // down output [S][H]
    int32_t K{1}, E{1}, kd{0}, nW{0}, I{0}, H{0}, bs{128}; // validated < 2^30 by the launcher
    int32_t nTilesN{1}, maxTilesM{0};
};

//! Route the S slots of a pass: expert histograms, offsets (rows and tiles of height bm) and the
//! stable expert-ordered permutation perm[row] = slot.
int32_t launchRoute(int32_t const* ids, int64_t S, int64_t E, int32_t bm, int32_t* chunkCounts, int32_t* expertOff,
    int32_t* tileOff, int32_t* perm, cudaStream_t stream);

//! out[t] = sum_k weights[t,k] * slotOut[t*K+k] over valid slots, for the `tokens` tokens of a pass.
int32_t launchCombine(float const* slotOut, int32_t const* ids, void const* weights, DType weightsDtype, void* out,
    DType dtype, int64_t tokens, int64_t K, int64_t E, int64_t H, cudaStream_t stream);

//! Dynamic shared memory of the tensor-core GEMM kernels of a tile path (kMOE_PATH_TC_*) with 16-bit
//! or FP8 weights (the same for gate_up and down); 0 for the generic path, which needs no dynamic
//! shared memory (its static tiles fit every sm_80+ device).
size_t tcGemmSmemBytes(int32_t path, bool fp8);

//! gate_up (fused SiLU * up, writes a.act) or down (writes a.slotOut) GEMM on the given kernel path.
int32_t launchGemm(GemmArgs const& a, DType dtype, bool fp8, bool gateUp, int32_t path, DeviceInfo const& dev,
    cudaStream_t stream);

} // namespace moe
} // namespace dsa
