/*
 * DSAMoEExperts routing and combine kernels (see dsaMoEExpertsKernel.cu for the whole pass).
 *
 * Route: per-chunk expert histograms (shared-memory atomics on integers), one CTA that turns them
 * into per-expert row and tile offsets and per-chunk write cursors, then one warp per chunk that
 * writes perm[row] = slot in slot order (__match_any_sync ranks), so the rows of an expert are
 * sorted by slot and the permutation is the same on every run.
 * Combine: one CTA per token sums its K slot rows in k order in fp32 (no atomics).
 */
#include "dsaMoEExpertsInternal.h"

#include "common/dsaMma.cuh"

#include <cstdint>

namespace dsa
{
namespace moe
{
namespace
{

constexpr int32_t kROUTE_THREADS = 256;
constexpr int32_t kSCAN_THREADS = 1024;
constexpr int32_t kCOMBINE_THREADS = 256;

__global__ void __launch_bounds__(kROUTE_THREADS) moeRouteCountKernel(
    int32_t const* __restrict__ ids, int64_t S, int32_t E, int64_t chunk, int32_t* __restrict__ chunkCounts)
{
    extern __shared__ int32_t sHist[];
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x)
    {
        sHist[e] = 0;
    }
    __syncthreads();
    int64_t const begin = blockIdx.x * chunk;
    int64_t const end = begin + chunk < S ? begin + chunk : S;
    for (int64_t s = begin + threadIdx.x; s < end; s += blockDim.x)
    {
        int32_t const e = ids[s];
        if (e >= 0 && e < E)
        {
            atomicAdd(&sHist[e], 1);
        }
    }
    __syncthreads();
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x)
    {
        chunkCounts[static_cast<int64_t>(blockIdx.x) * E + e] = sHist[e];
    }
}

//! One CTA: chunk histograms -> absolute per-chunk write cursors, expert row offsets and expert
//! row-tile offsets (exclusive prefix sums; entry E holds the totals).
__global__ void __launch_bounds__(kSCAN_THREADS) moeRouteScanKernel(int32_t* __restrict__ chunkCounts,
    int32_t nChunks, int32_t E, int32_t bm, int32_t* __restrict__ expertOff, int32_t* __restrict__ tileOff)
{
    __shared__ int32_t sWarpRows[32];
    __shared__ int32_t sWarpTiles[32];
    __shared__ int32_t sCarryRows;
    __shared__ int32_t sCarryTiles;
    int32_t const tid = threadIdx.x;
    int32_t const lane = tid & 31;
    int32_t const warp = tid >> 5;
    int32_t const nWarps = blockDim.x >> 5;

    // Within each expert: chunk counts -> exclusive offsets inside the expert; totals to expertOff.
    for (int32_t e = tid; e < E; e += blockDim.x)
    {
        int32_t run = 0;
        for (int32_t c = 0; c < nChunks; ++c)
        {
            int32_t const v = chunkCounts[static_cast<int64_t>(c) * E + e];
            chunkCounts[static_cast<int64_t>(c) * E + e] = run;
            run += v;
        }
        expertOff[e] = run;
    }
    if (tid == 0)
    {
        sCarryRows = 0;
        sCarryTiles = 0;
    }
    __syncthreads();

    // Across experts: exclusive scans of rows and of row tiles, blockDim experts per round.
    for (int32_t base = 0; base < E; base += blockDim.x)
    {
        int32_t const e = base + tid;
        int32_t const rows = e < E ? expertOff[e] : 0;
        int32_t const tiles = (rows + bm - 1) / bm;
        int32_t incRows = rows;
        int32_t incTiles = tiles;
#pragma unroll
        for (int32_t off = 1; off < 32; off <<= 1)
        {
            int32_t const r = __shfl_up_sync(0xffffffffU, incRows, off);
            int32_t const t = __shfl_up_sync(0xffffffffU, incTiles, off);
            if (lane >= off)
            {
                incRows += r;
                incTiles += t;
            }
        }
        if (lane == 31)
        {
            sWarpRows[warp] = incRows;
            sWarpTiles[warp] = incTiles;
        }
        __syncthreads();
        if (warp == 0)
        {
            int32_t const vr = lane < nWarps ? sWarpRows[lane] : 0;
            int32_t const vt = lane < nWarps ? sWarpTiles[lane] : 0;
            int32_t ir = vr;
            int32_t it = vt;
#pragma unroll
            for (int32_t off = 1; off < 32; off <<= 1)
            {
                int32_t const r = __shfl_up_sync(0xffffffffU, ir, off);
                int32_t const t = __shfl_up_sync(0xffffffffU, it, off);
                if (lane >= off)
                {
                    ir += r;
                    it += t;
                }
            }
            if (lane < nWarps)
            {
                sWarpRows[lane] = ir - vr;
                sWarpTiles[lane] = it - vt;
            }
        }
        __syncthreads();
        int32_t const exRows = sCarryRows + sWarpRows[warp] + incRows - rows;
        int32_t const exTiles = sCarryTiles + sWarpTiles[warp] + incTiles - tiles;
        if (e < E)
        {
            expertOff[e] = exRows;
            tileOff[e] = exTiles;
        }
        __syncthreads(); // everyone has read the carry
        if (tid == static_cast<int32_t>(blockDim.x) - 1)
        {
            sCarryRows = exRows + rows;
            sCarryTiles = exTiles + tiles;
        }
        __syncthreads();
    }
    if (tid == 0)
    {
        expertOff[E] = sCarryRows;
        tileOff[E] = sCarryTiles;
    }

    // Absolute write cursor of every (chunk, expert).
    for (int32_t e = tid; e < E; e += blockDim.x)
    {
        int32_t const base = expertOff[e];
        for (int32_t c = 0; c < nChunks; ++c)
        {
            chunkCounts[static_cast<int64_t>(c) * E + e] += base;
        }
    }
}

//! One warp per chunk, slots in order: stable within each expert (rows sorted by slot index).
__global__ void __launch_bounds__(32) moeRouteScatterKernel(int32_t const* __restrict__ ids, int64_t S, int32_t E,
    int64_t chunk, int32_t const* __restrict__ chunkCursor, int32_t* __restrict__ perm)
{
    extern __shared__ int32_t sCursor[];
    int32_t const lane = threadIdx.x;
    for (int32_t e = lane; e < E; e += 32)
    {
        sCursor[e] = chunkCursor[static_cast<int64_t>(blockIdx.x) * E + e];
    }
    __syncwarp();
    int64_t const begin = blockIdx.x * chunk;
    int64_t const end = begin + chunk < S ? begin + chunk : S;
    for (int64_t s0 = begin; s0 < end; s0 += 32)
    {
        int64_t const s = s0 + lane;
        int32_t const e = s < end ? ids[s] : -1;
        bool const valid = e >= 0 && e < E;
        uint32_t const mask = __match_any_sync(0xffffffffU, valid ? e : -1);
        if (valid)
        {
            int32_t const rank = __popc(mask & ((1U << lane) - 1U));
            perm[sCursor[e] + rank] = static_cast<int32_t>(s);
        }
        __syncwarp();
        if (valid && lane == 31 - __clz(static_cast<int32_t>(mask)))
        {
            sCursor[e] += __popc(mask);
        }
        __syncwarp();
    }
}


template <typename T, typename WT>
__global__ void __launch_bounds__(kCOMBINE_THREADS) moeCombineKernel(float const* __restrict__ slotOut,
    int32_t const* __restrict__ ids, WT const* __restrict__ weights, T* __restrict__ out, int64_t K, int32_t E,
    int64_t H, int32_t vec4)
{
    int64_t const t = blockIdx.x;
    int32_t const* idt = ids + t * K;
    WT const* wt = weights + t * K;
    float const* src = slotOut + t * K * H;
    T* dst = out + t * H;
    if (vec4)
    {
        for (int64_t h = static_cast<int64_t>(threadIdx.x) * 4; h < H; h += static_cast<int64_t>(blockDim.x) * 4)
        {
            float4 accv = make_float4(0.F, 0.F, 0.F, 0.F);
            for (int64_t k = 0; k < K; ++k)
            {
                int32_t const e = __ldg(idt + k);
                if (e < 0 || e >= E)
                {
                    continue;
                }
                float const wk = toFloat(__ldg(wt + k));
                // A 16-byte read-only load through the __ldg intrinsic, not a float4 lvalue over the
                // float rows (a type pun); memcpy (loadAligned) here would lose the non-coherent
                // load, and nvcc 13.0 splits part of it into byte loads.
                float4 const v = __ldg(reinterpret_cast<float4 const*>(src + k * H + h));
                accv.x = fmaf(wk, v.x, accv.x);
                accv.y = fmaf(wk, v.y, accv.y);
                accv.z = fmaf(wk, v.z, accv.z);
                accv.w = fmaf(wk, v.w, accv.w);
            }
            dst[h] = fromFloat<T>(accv.x);
            dst[h + 1] = fromFloat<T>(accv.y);
            dst[h + 2] = fromFloat<T>(accv.z);
            dst[h + 3] = fromFloat<T>(accv.w);
        }
        return;
    }
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
    {
        float accs = 0.F;
        for (int64_t k = 0; k < K; ++k)
        {
            int32_t const e = __ldg(idt + k);
            if (e >= 0 && e < E)
            {
                accs = fmaf(toFloat(__ldg(wt + k)), __ldg(src + k * H + h), accs);
            }
        }
        dst[h] = fromFloat<T>(accs);
    }
}


bool aligned16(void const* ptr)
{
    return (reinterpret_cast<uintptr_t>(ptr) & 15U) == 0;
}

template <typename T, typename WT>
int32_t launchCombineTyped(float const* slotOut, int32_t const* ids, void const* weights, void* out, int64_t tokens,
    int64_t K, int64_t E, int64_t H, cudaStream_t stream)
{
    int32_t const vec4 = (H % 4 == 0 && aligned16(slotOut)) ? 1 : 0;
    moeCombineKernel<T, WT><<<static_cast<uint32_t>(tokens), kCOMBINE_THREADS, 0, stream>>>(slotOut, ids,
        static_cast<WT const*>(weights), static_cast<T*>(out), K, static_cast<int32_t>(E), H, vec4);
    return checkCuda(cudaGetLastError(), "moeCombineKernel launch");
}

} // namespace

int32_t launchRoute(int32_t const* ids, int64_t S, int64_t E, int32_t bm, int32_t* chunkCounts, int32_t* expertOff,
    int32_t* tileOff, int32_t* perm, cudaStream_t stream)
{
    int64_t const chunks0 = maxRouteChunks(S);
    int64_t const chunk = ceilDiv(ceilDiv(S, chunks0), 32) * 32;
    int64_t const nChunks = ceilDiv(S, chunk);
    size_t const histBytes = static_cast<size_t>(E) * sizeof(int32_t);
    int32_t const e32 = static_cast<int32_t>(E);
    moeRouteCountKernel<<<static_cast<uint32_t>(nChunks), kROUTE_THREADS, histBytes, stream>>>(
        ids, S, e32, chunk, chunkCounts);
    int32_t st = checkCuda(cudaGetLastError(), "moeRouteCountKernel launch");
    if (st != kSUCCESS)
    {
        return st;
    }
    moeRouteScanKernel<<<1, kSCAN_THREADS, 0, stream>>>(
        chunkCounts, static_cast<int32_t>(nChunks), e32, bm, expertOff, tileOff);
    st = checkCuda(cudaGetLastError(), "moeRouteScanKernel launch");
    if (st != kSUCCESS)
    {
        return st;
    }
    moeRouteScatterKernel<<<static_cast<uint32_t>(nChunks), 32, histBytes, stream>>>(
        ids, S, e32, chunk, chunkCounts, perm);
    return checkCuda(cudaGetLastError(), "moeRouteScatterKernel launch");
}

int32_t launchCombine(float const* slotOut, int32_t const* ids, void const* weights, DType weightsDtype, void* out,
    DType dtype, int64_t tokens, int64_t K, int64_t E, int64_t H, cudaStream_t stream)
{
    bool const wf32 = weightsDtype == DType::kFLOAT32;
    switch (dtype)
    {
    case DType::kFLOAT32:
        return launchCombineTyped<float, float>(slotOut, ids, weights, out, tokens, K, E, H, stream);
    case DType::kFLOAT16:
        return wf32 ? launchCombineTyped<__half, float>(slotOut, ids, weights, out, tokens, K, E, H, stream)
                    : launchCombineTyped<__half, __half>(slotOut, ids, weights, out, tokens, K, E, H, stream);
    case DType::kBFLOAT16:
        return wf32 ? launchCombineTyped<__nv_bfloat16, float>(slotOut, ids, weights, out, tokens, K, E, H, stream)
                    : launchCombineTyped<__nv_bfloat16, __nv_bfloat16>(
                        slotOut, ids, weights, out, tokens, K, E, H, stream);
    case DType::kFP8_E4M3: break;
    }
    return setLastError(kINVALID_ARGUMENT, "DSAMoEExperts: unknown dtype");
}

} // namespace moe
} // namespace dsa
