/*
 * Token sampling on the device: one CTA of kSAMPLE_THREADS threads per row of logits chooses that
 * row's next token, greedy (arg max, lowest index on ties) or sampled from softmax(logits / T)
 * restricted to the top-p nucleus, with a uniform draw from Philox4x32-10 keyed by the row's seed
 * at counter = the row's offset (see README.md in this folder for the rule and where float32 and
 * the float64 reference can differ).
 *
 * Passes over the row (the logits are read again by every pass; a row of DeepSeek's 129280 bf16
 * logits is 253 KiB, which stays in L2):
 *   1. arg max (value, index) with a block reduction; greedy rows stop here.
 *   2. each token's float32 e_i = exp((l_i - max) / T) in (0, 1], and its mass
 *      w_i = trunc(e_i * 2^40) as a 64-bit integer. Every sum below is an exact integer sum, so the
 *      result does not depend on the order of additions (no float atomics): the same inputs give
 *      the same token on every run and every schedule.
 *      Without a nucleus (top_p >= 1): Z = sum w_i (block reduction).
 *      With top_p < 1: a 4-pass 8-bit radix select over the bits of e_i (positive floats order as
 *      their bits) by mass: each pass histograms the masses of the tokens that share the prefix
 *      found so far and finds the bin in which the mass of the tokens above it (in descending order)
 *      crosses thr = ceil(top_p * Z). The result is the exact e* of the last token kept, the mass
 *      A* of the tokens above it and what is left of thr, need; the tokens equal to e* are kept in
 *      index order up to n = ceil(need / w*), as a stable descending sort keeps them. Kept mass
 *      K = A* + n * w*. No sort of the vocabulary.
 *   3. inverse CDF in index order: t = floor(u * K) (u = u53 / 2^53, exact 64-bit arithmetic);
 *      block-wide prefix sums of the kept masses (warp shuffle scans, warp totals in shared memory,
 *      running totals across chunks of 512 tokens) find the one token with C_before <= t < C_before
 *      + w_i. The pass stops at the chunk that holds it.
 */
#include "dsaSamplingKernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace dsa
{
namespace
{

constexpr int kNW = kSAMPLE_THREADS / 32;
constexpr float kMASS_SCALE = 1099511627776.0F; // 2^40: e_i = 1 (the arg max) weighs 2^40
constexpr uint32_t kFULL = 0xffffffffU;

template <typename T>
__device__ __forceinline__ float loadLogit(T const* row, int64_t i);
template <>
__device__ __forceinline__ float loadLogit<float>(float const* row, int64_t i)
{
    return row[i];
}
template <>
__device__ __forceinline__ float loadLogit<__half>(__half const* row, int64_t i)
{
    return __half2float(row[i]);
}
template <>
__device__ __forceinline__ float loadLogit<__nv_bfloat16>(__nv_bfloat16 const* row, int64_t i)
{
    return __bfloat162float(row[i]);
}

//! High 64 bits of a * b.
__device__ __forceinline__ uint64_t mulHi64(uint64_t a, uint64_t b)
{
    uint64_t const aL = a & 0xffffffffULL;
    uint64_t const aH = a >> 32;
    uint64_t const bL = b & 0xffffffffULL;
    uint64_t const bH = b >> 32;
    uint64_t const ll = aL * bL;
    uint64_t const lh = aL * bH;
    uint64_t const hl = aH * bL;
    uint64_t const mid = (ll >> 32) + (lh & 0xffffffffULL) + (hl & 0xffffffffULL);
    return aH * bH + (lh >> 32) + (hl >> 32) + (mid >> 32);
}

//! Philox4x32-10 (Salmon et al., SC'11; Random123's philox4x32 with 10 rounds, as curand and torch
//! use): counter (offset low, offset high, 0, 0), key (seed low, seed high). The draw is the 53-bit
//! integer u53 = ((x1 << 32) | x0) >> 11, u = u53 / 2^53 in [0, 1).
__device__ __forceinline__ uint64_t philoxU53(uint64_t seed, uint64_t offset)
{
    uint32_t c0 = static_cast<uint32_t>(offset);
    uint32_t c1 = static_cast<uint32_t>(offset >> 32);
    uint32_t c2 = 0;
    uint32_t c3 = 0;
    uint32_t k0 = static_cast<uint32_t>(seed);
    uint32_t k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r)
    {
        uint64_t const p0 = static_cast<uint64_t>(0xD2511F53U) * c0;
        uint64_t const p1 = static_cast<uint64_t>(0xCD9E8D57U) * c2;
        uint32_t const n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
        uint32_t const n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
        c1 = static_cast<uint32_t>(p1);
        c3 = static_cast<uint32_t>(p0);
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9U;
        k1 += 0xBB67AE85U;
    }
    return ((static_cast<uint64_t>(c1) << 32) | c0) >> 11;
}

//! (v1, i1) before (v2, i2) in the arg max: larger value, then lower index. NaN never wins.
__device__ __forceinline__ bool argBetter(float v1, int32_t i1, float v2, int32_t i2)
{
    return v1 > v2 || (v1 == v2 && i1 < i2);
}

//! Block-wide arg max of each thread's (v, i); every thread gets the result.
__device__ __forceinline__ void blockArgMax(float& v, int32_t& i, float* sV, int32_t* sI)
{
    int const lane = threadIdx.x & 31;
    int const warp = threadIdx.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
    {
        float const ov = __shfl_xor_sync(kFULL, v, off);
        int32_t const oi = __shfl_xor_sync(kFULL, i, off);
        if (argBetter(ov, oi, v, i))
        {
            v = ov;
            i = oi;
        }
    }
    if (lane == 0)
    {
        sV[warp] = v;
        sI[warp] = i;
    }
    __syncthreads(); // the warps' partial results are in shared memory
    if (warp == 0)
    {
        v = lane < kNW ? sV[lane] : -INFINITY;
        i = lane < kNW ? sI[lane] : INT32_MAX;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
        {
            float const ov = __shfl_xor_sync(kFULL, v, off);
            int32_t const oi = __shfl_xor_sync(kFULL, i, off);
            if (argBetter(ov, oi, v, i))
            {
                v = ov;
                i = oi;
            }
        }
        if (lane == 0)
        {
            sV[kNW] = v;
            sI[kNW] = i;
        }
    }
    __syncthreads();
    v = sV[kNW];
    i = sI[kNW];
}

//! Block-wide sum; every thread gets the result.
__device__ __forceinline__ uint64_t blockSum(uint64_t x, uint64_t* sU)
{
    int const lane = threadIdx.x & 31;
    int const warp = threadIdx.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
    {
        x += __shfl_xor_sync(kFULL, x, off);
    }
    if (lane == 0)
    {
        sU[warp] = x;
    }
    __syncthreads(); // the warps' partial sums are in shared memory
    uint64_t total = 0;
    for (int w = 0; w < kNW; ++w)
    {
        total += sU[w];
    }
    __syncthreads(); // everyone has read them before sU is written again
    return total;
}

//! e_i = exp((l - max) / T) in [0, 1]; NaN logits (and a NaN from -inf / inf) weigh 0.
__device__ __forceinline__ float expWeight(float l, float lmax, float temperature)
{
    float const e = expf((l - lmax) / temperature);
    return e > 0.F ? (e < 1.F ? e : 1.F) : 0.F;
}

__device__ __forceinline__ uint64_t massOf(float e)
{
    return static_cast<uint64_t>(e * kMASS_SCALE); // exact scaling by 2^40, then truncation
}

template <typename T>
__global__ void __launch_bounds__(kSAMPLE_THREADS) sampleTokensKernel(SampleTokensParams p)
{
    __shared__ float sV[kNW + 1];
    __shared__ int32_t sI[kNW + 1];
    __shared__ uint64_t sU[kNW];
    __shared__ uint32_t sTie[kNW];
    __shared__ uint64_t sHist[256];
    __shared__ uint32_t sPrefix;
    __shared__ uint32_t sMask;
    __shared__ uint64_t sNeed;
    __shared__ uint64_t sAbove;
    __shared__ int32_t sFound;

    int const tid = threadIdx.x;
    int const lane = tid & 31;
    int const warp = tid >> 5;
    int64_t const b = blockIdx.x;
    int32_t const V = static_cast<int32_t>(p.V);
    T const* row = static_cast<T const*>(p.logits) + b * p.rowStride;

    if (tid == 0)
    {
        sPrefix = 0;
        sMask = 0;
        sNeed = 0;
        sAbove = 0;
        sFound = 0;
    }

    // 1. arg max (the first of the largest values); greedy rows are done.
    float best = -INFINITY;
    int32_t bestI = INT32_MAX;
    for (int32_t i = tid; i < V; i += kSAMPLE_THREADS)
    {
        float const l = loadLogit(row, i);
        if (argBetter(l, i, best, bestI))
        {
            best = l;
            bestI = i;
        }
    }
    blockArgMax(best, bestI, sV, sI);
    int32_t const argmax = bestI < V ? bestI : 0; // a row of NaN only: token 0
    float const temperature = p.temperature != nullptr ? p.temperature[b] : 0.F;
    if (!(temperature > 0.F) || !(best > -INFINITY && best < INFINITY))
    {
        // Greedy, or no finite largest logit (all -inf or NaN: token 0; a +inf: the first +inf,
        // the limit of the softmax).
        if (tid == 0)
        {
            p.out[b] = argmax;
        }
        return;
    }

    // 2. masses; the nucleus.
    float const topP = p.topP != nullptr ? p.topP[b] : 1.F;
    bool const nucleus = !(topP >= 1.F); // NaN or <= 0 keep only the most likely token
    uint32_t keyStar = 0;                // tokens with e above keyStar are kept ...
    uint64_t wStar = 0;                  // ... and the first nKeep equal to it, each weighing wStar
    uint64_t nKeep = 0;
    uint64_t kept = 0; // K, the kept mass
    if (!nucleus)
    {
        uint64_t z = 0;
        for (int32_t i = tid; i < V; i += kSAMPLE_THREADS)
        {
            z += massOf(expWeight(loadLogit(row, i), best, temperature));
        }
        kept = blockSum(z, sU);
    }
    else
    {
        for (int pass = 0; pass < 4; ++pass)
        {
            int const shift = 24 - 8 * pass;
            for (int i = tid; i < 256; i += kSAMPLE_THREADS)
            {
                sHist[i] = 0;
            }
            __syncthreads();
            uint32_t const prefix = sPrefix;
            uint32_t const mask = sMask;
            for (int32_t i = tid; i < V; i += kSAMPLE_THREADS)
            {
                float const e = expWeight(loadLogit(row, i), best, temperature);
                uint64_t const w = massOf(e);
                uint32_t const key = __float_as_uint(e);
                if (w != 0 && (key & mask) == prefix)
                {
                    atomicAdd(reinterpret_cast<unsigned long long*>(sHist + ((key >> shift) & 255U)),
                        static_cast<unsigned long long>(w));
                }
            }
            __syncthreads(); // the histogram is complete
            if (warp == 0)
            {
                // Lane l owns the 8 bins 255 - 8l down to 248 - 8l (descending e); an inclusive scan
                // of the lanes' totals gives the mass above each lane's first bin, and the lane that
                // holds the crossing (above < need <= above + mass) walks its bins.
                uint64_t need = sNeed; // read by every lane before the crossing lane rewrites it
                int const hi = 255 - 8 * lane;
                uint64_t cnt[8];
                uint64_t laneTotal = 0;
#pragma unroll
                for (int j = 0; j < 8; ++j)
                {
                    cnt[j] = sHist[hi - j];
                    laneTotal += cnt[j];
                }
                uint64_t inclusive = laneTotal;
#pragma unroll
                for (int off = 1; off < 32; off <<= 1)
                {
                    uint64_t const other = __shfl_up_sync(kFULL, inclusive, off);
                    inclusive += lane >= off ? other : 0ULL;
                }
                __syncwarp(); // every lane has read sNeed
                if (pass == 0)
                {
                    // thr = ceil(top_p * Z), at least 1 (the most likely token always stays).
                    uint64_t const z = __shfl_sync(kFULL, inclusive, 31);
                    double const x = static_cast<double>(topP) * static_cast<double>(z);
                    need = 1;
                    if (topP > 0.F && x > 1.0)
                    {
                        need = static_cast<uint64_t>(x);
                        need += static_cast<double>(need) < x ? 1 : 0;
                        need = need < z ? need : z;
                    }
                }
                uint64_t above = inclusive - laneTotal;
                if (above < need && need <= inclusive)
                {
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                    {
                        if (above < need && need <= above + cnt[j])
                        {
                            sPrefix = prefix | (static_cast<uint32_t>(hi - j) << shift);
                            sMask = mask | (255U << shift);
                            sNeed = need - above;
                            sAbove += above;
                        }
                        above += cnt[j];
                    }
                }
            }
            __syncthreads();
        }
        keyStar = sPrefix;
        wStar = massOf(__uint_as_float(keyStar));
        uint64_t const need = sNeed; // 1 <= need <= (tokens equal to e*) * wStar
        nKeep = wStar != 0 ? (need + wStar - 1) / wStar : 0; // wStar > 0: its bin had mass
        kept = sAbove + nKeep * wStar;
    }

    // 3. inverse CDF in index order.
    uint64_t const seed = p.seeds != nullptr ? p.seeds[b] : 0;
    uint64_t const offset = p.offsets != nullptr ? static_cast<uint64_t>(p.offsets[b]) : 0;
    uint64_t const target = mulHi64(philoxU53(seed, offset) << 11, kept); // floor(u * K) < K
    uint32_t const lanesBelow = (1U << lane) - 1U;
    uint64_t massBase = 0;
    uint32_t tieBase = 0;
    for (int32_t base = 0; base < V; base += kSAMPLE_THREADS)
    {
        int32_t const i = base + tid;
        uint32_t key = 0;
        uint64_t w = 0;
        if (i < V)
        {
            float const e = expWeight(loadLogit(row, i), best, temperature);
            key = __float_as_uint(e);
            w = massOf(e);
        }
        bool const tie = nucleus && i < V && key == keyStar;
        uint64_t const m = key > keyStar ? w : 0; // kept for sure (keyStar = 0 without a nucleus)
        uint32_t const tieBallot = __ballot_sync(kFULL, tie);
        uint64_t inclusive = m;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1)
        {
            uint64_t const other = __shfl_up_sync(kFULL, inclusive, off);
            inclusive += lane >= off ? other : 0ULL;
        }
        if (lane == 31)
        {
            sU[warp] = inclusive;
        }
        if (lane == 0)
        {
            sTie[warp] = static_cast<uint32_t>(__popc(tieBallot));
        }
        __syncthreads(); // the warps' totals are in shared memory
        uint64_t massBefore = 0;
        uint64_t massTotal = 0;
        uint32_t tieBefore = 0;
        uint32_t tieTotal = 0;
        for (int wi = 0; wi < kNW; ++wi)
        {
            uint64_t const mw = sU[wi];
            uint32_t const tw = sTie[wi];
            massBefore += wi < warp ? mw : 0ULL;
            tieBefore += wi < warp ? tw : 0U;
            massTotal += mw;
            tieTotal += tw;
        }
        uint32_t const tieRank = tieBase + tieBefore + static_cast<uint32_t>(__popc(tieBallot & lanesBelow));
        uint64_t const tiesKeptBefore = tieRank < nKeep ? tieRank : nKeep;
        uint64_t const cBefore = massBase + massBefore + (inclusive - m) + tiesKeptBefore * wStar;
        uint64_t const mine = m + (tie && tieRank < nKeep ? wStar : 0ULL);
        if (mine != 0 && cBefore <= target && target < cBefore + mine)
        {
            p.out[b] = i;
            sFound = 1;
        }
        massBase += massTotal;
        tieBase += tieTotal;
        __syncthreads(); // sFound is final; the totals may be overwritten
        if (sFound != 0)
        {
            return;
        }
    }
    if (tid == 0)
    {
        p.out[b] = argmax; // not reached: the kept masses add up to K > target exactly
    }
}

template <typename T>
int32_t launchTyped(SampleTokensParams const& p, cudaStream_t stream)
{
    sampleTokensKernel<T><<<static_cast<uint32_t>(p.B), kSAMPLE_THREADS, 0, stream>>>(p);
    return checkCuda(cudaGetLastError(), "sampleTokensKernel launch");
}

} // namespace

int32_t launchSampleTokens(SampleTokensParams const& p, DType dtype, cudaStream_t stream)
{
    if (p.B < 0 || p.V < 0 || p.rowStride < p.V)
    {
        return setLastError(kINVALID_ARGUMENT, "dsa_sample_tokens: need B >= 0, V >= 0 and row_stride >= V");
    }
    if (p.B == 0)
    {
        return kSUCCESS;
    }
    if (p.V == 0)
    {
        return setLastError(kINVALID_ARGUMENT, "dsa_sample_tokens: V must be positive when B > 0");
    }
    if (p.logits == nullptr || p.out == nullptr)
    {
        return setLastError(kINVALID_ARGUMENT, "dsa_sample_tokens: logits and out must not be null");
    }
    if (p.V > 0x7fffffffLL || p.B > 0x7fffffffLL)
    {
        return setLastError(kUNSUPPORTED, "dsa_sample_tokens: B and V must be below 2^31");
    }
    switch (dtype)
    {
    case DType::kFLOAT32: return launchTyped<float>(p, stream);
    case DType::kFLOAT16: return launchTyped<__half>(p, stream);
    case DType::kBFLOAT16: return launchTyped<__nv_bfloat16>(p, stream);
    default: return setLastError(kINVALID_ARGUMENT, "dsa_sample_tokens: logits must be float32, float16 or bfloat16");
    }
}

} // namespace dsa
