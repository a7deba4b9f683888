/*
 * DSASparseAttention kernels.
 *
 * Tensor-core path (fp16/bf16, sm_80+, H/Hkv a multiple of 16, Dk % 16 == 0, Dv in {128, 256, 512}):
 *   one CTA per (query (b,s), kv head, block of HB = 16*WM query heads that share that kv head).
 *   The CTA keeps Q[HB, Dk] in shared memory and streams the K selected key/value rows in tiles of
 *   32: each selected K row and V row is copied into shared memory once (cp.async, double-buffered
 *   when shared memory allows) and reused by all HB heads, which is the MQA reuse FlashMLA relies on
 *   (with Hkv = 1 and H = 64 every head of the query shares one load; with H = 128 two CTAs share
 *   each row through L2). Invalid indices (-1 or outside [0, T)) are zero-filled and masked to -inf.
 *   Warps are arranged WM (head rows) x 2: for S = Q K^T the two warps of a head row split the 32
 *   keys (16 each, mma.sync m16n8k16 with fp32 accumulation); for O += P V they split Dv in halves,
 *   so each thread holds Dv/2 * 16 / 32 fp32 accumulators (128 for Dv = 512). The online softmax
 *   (running max and sum in fp32, exp2 with the log2(e) factor folded into the scale) exchanges the
 *   per-half row maxima through shared memory; P goes through shared memory in the input dtype.
 *
 * Generic path (fp32, and any shape the tensor-core path does not take): one CTA per
 * (query, kv head, chunk of up to 4 heads), one warp per head; selected K/V rows are converted to
 * fp32 in shared memory (tiles of up to 32 rows), scores by warp reductions, online softmax and the
 * output accumulator in fp32 shared memory. Correct for any Dk/Dv/H/Hkv, memory-bound and slower.
 *
 * Values from keys (p.valuesFromKeys: the values are the first Dv <= Dk channels of k's rows, the
 * contract's empty v): both paths load only the K tile and read the value operand from it, with
 * the K tile's row pitch; v is never dereferenced and each selected row crosses the memory bus
 * once (Dk elements instead of Dk + Dv). The arithmetic, its order and the fp32 accumulation are
 * the same as with a separate v holding those channels, so both forms give the same bits.
 *
 * Paged caches, FP8 latent and split-KV (ABI 5) generalise both kernels instead of copying them:
 *  - where a selected index's row lives: keyRow() turns a logical index into the row of the cache
 *    (the contiguous caches: the index itself; paged pools: page * pageSize + t % pageSize through the
 *    block table, -1 for an invalid index or table entry). Everything after the tile's index load
 *    (copies, masking) is the same code for both.
 *  - how a K tile is loaded: FP8 (a template parameter of the tensor-core kernel) copies the tile's
 *    uint8 codes into a staging area with cp.async, in the same pipeline group as the RoPE channels
 *    (copied straight into the K tile), and after the tile's wait each thread dequantizes chunks of 8
 *    codes times their block scale (read through the read-only cache) into the compute dtype in the
 *    K tile (a barrier before the ldmatrix reads). The generic kernel converts each element as it gathers it.
 *  - which indices a CTA takes: blockIdx.z is the split; a CTA attends to the indices
 *    [z*splitLen, min(K, (z+1)*splitLen)) and, when split, writes its normalized float32 output and
 *    log2-sum-exp to the workspace; sparseAttentionCombineKernel merges the splits. One split
 *    (splitLen = K, no workspace) is the contiguous entry point's unchanged behaviour.
 */
#include "dsaSparseAttentionKernel.h"

#include "common/dsaMma.cuh"

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace dsa
{
namespace
{

constexpr float kLOG2E = 1.4426950408889634F;
constexpr int32_t kTC_BN = 32; // selected keys per tile in the tensor-core kernel

struct TcConfig
{
    int32_t wm{0};     // warps along the head dimension; HB = 16 * wm
    int32_t stages{0}; // 1 or 2 key/value buffers
    size_t smem{0};
};

//! Bytes per staged FP8 key row of the tensor-core kernel: its C codes.
int64_t fp8StageRowBytes(SparseAttentionParams const& p)
{
    return p.fp8 ? p.C : 0;
}

size_t tcSmemBytes(int32_t wm, int32_t stages, int64_t dk, int64_t dv, bool valuesFromKeys, int64_t fp8RowBytes = 0)
{
    int64_t const hb = 16 * wm;
    int64_t const vPitch = valuesFromKeys ? 0 : dv + 8; // values from keys have no V tile of their own
    int64_t const elems = hb * (dk + 8) + stages * kTC_BN * ((dk + 8) + vPitch) + hb * (kTC_BN + 8);
    return static_cast<size_t>(elems) * 2 + static_cast<size_t>(4 * hb) * sizeof(float)
        + static_cast<size_t>(stages * kTC_BN) * sizeof(int32_t)
        + static_cast<size_t>(stages * kTC_BN * fp8RowBytes); // FP8: the staged codes
}

//! The cache row that selected index t of batch row b names, or -1 when it names none. Contiguous
//! caches: t itself (the caller's base pointer holds row b, and checks t < T). Paged pools: the pool
//! row of logical position t through the block table, -1 when t is outside [0, M*page) or its table
//! entry outside [0, P) (so pages no row names are never read).
__device__ __forceinline__ int keyRow(SparseAttentionParams const& p, int64_t b, int t)
{
    if (p.blockTable == nullptr)
    {
        return t;
    }
    if (t < 0 || t >= p.M * p.page)
    {
        return -1;
    }
    int const entry = __ldg(p.blockTable + b * p.M + t / p.page);
    return entry >= 0 && entry < p.P ? entry * static_cast<int>(p.page) + t % static_cast<int>(p.page) : -1;
}

//! First row of batch row b's keys: b * T for contiguous caches, 0 for pools (rows come from keyRow).
__device__ __forceinline__ int64_t firstKeyRow(SparseAttentionParams const& p, int64_t b)
{
    return p.blockTable == nullptr ? b * p.T : 0;
}

//! Writes a CTA's result for head row h (of query bs): the output in T, or, when split, its
//! normalized float32 partial output and log2-sum-exp in the workspace (split z = blockIdx.z).
template <typename T>
__device__ __forceinline__ void storeResultPair(
    SparseAttentionParams const& p, int64_t bs, int64_t h, int64_t col, float v0, float v1)
{
    int64_t const row = bs * p.H + h;
    if (p.partial != nullptr)
    {
        float* dst = p.partial + (static_cast<int64_t>(blockIdx.z) * p.B * p.S * p.H + row) * p.Dv + col;
        dst[0] = v0;
        dst[1] = v1;
    }
    else
    {
        storeAligned(static_cast<T*>(p.out) + row * p.Dv + col, mma::packPair<T>(v0, v1));
    }
}

__device__ __forceinline__ void storeLse(SparseAttentionParams const& p, int64_t bs, int64_t h, float lse2)
{
    p.partialLse[static_cast<int64_t>(blockIdx.z) * p.B * p.S * p.H + bs * p.H + h] = lse2;
}

//! FP8 latent tile load (every thread; rows[r] is the pool row of tile row r or -1): the codes of
//! each row into the staging area, its RoPE channels straight into the K tile's columns [C, C+R).
//! Invalid rows are zero-filled (the scores are masked anyway). Part of the caller's cp.async group.
template <typename T>
__device__ __forceinline__ void loadFp8Tile(SparseAttentionParams const& p, int64_t kvh, int const* rows,
    uint8_t* codesS, T* kS)
{
    constexpr int BN = kTC_BN;
    int const nC = static_cast<int>(p.C);
    int const nR = static_cast<int>(p.R);
    int const ldk = static_cast<int>(p.Dk) + 8;
    uint8_t const* codes = static_cast<uint8_t const*>(p.k) + kvh * p.C;
    T const* rope = static_cast<T const*>(p.kRope) + kvh * p.R;
    int const codeChunks = nC / 16;
    for (int i = threadIdx.x; i < BN * codeChunks; i += blockDim.x)
    {
        int const r = i / codeChunks;
        int const cc = i - r * codeChunks;
        int const t = rows[r];
        uint8_t const* src = t >= 0 ? codes + static_cast<int64_t>(t) * p.Hkv * p.C + cc * 16 : codes;
        mma::cpAsync16(codesS + r * nC + cc * 16, src, t >= 0);
    }
    int const ropeChunks = nR / 8;
    for (int i = threadIdx.x; i < BN * ropeChunks; i += blockDim.x)
    {
        int const r = i / ropeChunks;
        int const cc = i - r * ropeChunks;
        int const t = rows[r];
        T const* src = t >= 0 ? rope + static_cast<int64_t>(t) * p.Hkv * p.R + cc * 8 : rope;
        mma::cpAsync16(kS + r * ldk + nC + cc * 8, src, t >= 0);
    }
}

//! Dequantizes a landed FP8 tile (every thread): K tile row r, columns [0, C) = decode(code) * the
//! scale of the code's scaleBlock channels, rounded once to T (8 codes per step; scaleBlock % 8 == 0).
//! The scales (C / scaleBlock floats per row) are read through the read-only cache as they are used.
template <typename T>
__device__ __forceinline__ void dequantizeFp8Tile(
    SparseAttentionParams const& p, int64_t kvh, int const* rows, uint8_t const* codesS, T* kS, int ldk)
{
    constexpr int BN = kTC_BN;
    int const nC = static_cast<int>(p.C);
    int const scaleBlock = static_cast<int>(p.scaleBlock);
    int const chunks = nC / 8;
    int const nScales = nC / scaleBlock;
    float const* scales = p.kScale + kvh * nScales;
    for (int i = threadIdx.x; i < BN * chunks; i += blockDim.x)
    {
        int const r = i / chunks;
        int const cc = i - r * chunks;
        int const t = rows[r];
        uint2 const words = loadAligned<uint2>(codesS + r * nC + cc * 8);
        float const scale = t >= 0 ? __ldg(scales + static_cast<int64_t>(t) * p.Hkv * nScales + (cc * 8) / scaleBlock) : 0.F;
        uint32_t packed[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
        {
            uint32_t const word = e < 2 ? words.x : words.y;
            auto const pair = static_cast<__nv_fp8x2_storage_t>((word >> (16 * (e & 1))) & 0xffffU);
            __half2 const h2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
            float2 const f = __half22float2(h2);
            packed[e] = mma::packPair<T>(f.x * scale, f.y * scale);
        }
        storeAligned(kS + r * ldk + cc * 8, make_uint4(packed[0], packed[1], packed[2], packed[3]));
    }
}

template <typename T, int WM, int NT, bool FP8>
__global__ void __launch_bounds__(WM * 64) sparseAttentionMmaKernel(SparseAttentionParams p, int32_t stages)
{
    constexpr int HB = WM * 16;
    constexpr int BN = kTC_BN;
    constexpr int NTHREADS = WM * 64;
    constexpr int DVH = NT * 8; // output columns per warp
    constexpr int DV = 2 * DVH;
    static_assert(NT % 2 == 0, "NT must be even");

    extern __shared__ __align__(16) unsigned char smemRaw[];
    bool const vFromK = p.valuesFromKeys;
    int const dk = static_cast<int>(p.Dk);
    int const ldq = dk + 8;
    int const ldk = dk + 8;
    // Values from keys read the value operand out of the K tile (its first DV columns).
    int const ldv = vFromK ? ldk : DV + 8;
    constexpr int ldp = BN + 8;
    T* sQ = reinterpret_cast<T*>(smemRaw);
    T* sK = sQ + HB * ldq;
    T* sV = sK + stages * BN * ldk; // own V tiles: none when values come from keys
    T* sP = sV + (vFromK ? 0 : stages * BN * ldv);
    float* sMax = reinterpret_cast<float*>(sP + HB * ldp); // [2][HB]
    float* sSum = sMax + 2 * HB;                           // [2][HB]
    int* sIdx = reinterpret_cast<int*>(sSum + 2 * HB);     // [stages][BN]
    // FP8: the staged codes [stages][BN][C].
    int const nC = static_cast<int>(p.C);
    uint8_t* sCodes = reinterpret_cast<uint8_t*>(sIdx + stages * BN);

    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    int const wm = warp % WM;
    int const half = warp / WM;
    int const g = lane >> 2;
    int const c = lane & 3;

    int64_t const bs = blockIdx.x; // b * S + s
    int64_t const b = bs / p.S;
    int64_t const groups = p.H / p.Hkv;
    int64_t const blocksPerKv = groups / HB;
    int64_t const kvh = blockIdx.y / blocksPerKv;
    int64_t const h0 = kvh * groups + (blockIdx.y % blocksPerKv) * HB;

    T const* q = static_cast<T const*>(p.q) + (bs * p.H + h0) * p.Dk;
    int32_t const* idx = p.indices + bs * p.K;
    int64_t const row0 = firstKeyRow(p, b);
    T const* kBase = static_cast<T const*>(p.k) + (row0 * p.Hkv + kvh) * p.Dk;
    T const* vBase = vFromK ? kBase : static_cast<T const*>(p.v) + (row0 * p.Hkv + kvh) * DV;
    int64_t const kRowStride = p.Hkv * p.Dk;
    // The indices of this CTA's split.
    int64_t const jBegin = static_cast<int64_t>(blockIdx.z) * p.splitLen;
    int64_t const jEnd = min(p.K, jBegin + p.splitLen);
    int64_t const vRowStride = p.Hkv * DV;
    int const kChunks = dk / 8;
    constexpr int vChunks = DV / 8;

    for (int i = threadIdx.x; i < HB * kChunks; i += NTHREADS)
    {
        int const r = i / kChunks;
        int const cc = i - r * kChunks;
        mma::cpAsync16(sQ + r * ldq + cc * 8, q + static_cast<int64_t>(r) * dk + cc * 8);
    }

    // Called by every thread (the conditions around each call are uniform), so it may hold a barrier.
    auto loadTile = [&](int64_t tile, int buf) {
        int64_t const j0 = jBegin + tile * BN;
        T* kS = sK + buf * BN * ldk;
        T* vS = sV + buf * BN * ldv;
        int* idxS = sIdx + buf * BN;
        // Each of the tile's indices is read from global memory once per CTA, checked once (-1 when
        // invalid) and kept in sIdx, where the K and V copies below and the masking of the scores
        // read it. (The copies used to __ldg it again for every 16-byte chunk of the K and V rows.)
        // The barrier publishes sIdx to the threads that copy other rows, and it keeps the copies into
        // buffer buf behind every warp's reads of it in the tile that used it last (write after read;
        // the iteration has no barrier of its own at its end). sIdx[buf] itself was last read for
        // the masking, before the barrier that follows the P store.
        for (int r = threadIdx.x; r < BN; r += NTHREADS)
        {
            int64_t const j = j0 + r;
            int const t = j < jEnd ? keyRow(p, b, __ldg(idx + j)) : -1;
            idxS[r] = (t >= 0 && t < p.T) ? t : -1;
        }
        __syncthreads();
        if constexpr (FP8)
        {
            loadFp8Tile(p, kvh, idxS, sCodes + buf * BN * nC, kS);
        }
        else
        {
            for (int i = threadIdx.x; i < BN * kChunks; i += NTHREADS)
            {
                int const r = i / kChunks;
                int const cc = i - r * kChunks;
                int const t = idxS[r];
                bool const valid = t >= 0;
                T const* src = valid ? kBase + static_cast<int64_t>(t) * kRowStride + cc * 8 : kBase;
                mma::cpAsync16(kS + r * ldk + cc * 8, src, valid);
            }
            for (int i = threadIdx.x; !vFromK && i < BN * vChunks; i += NTHREADS)
            {
                int const r = i / vChunks;
                int const cc = i - r * vChunks;
                int const t = idxS[r];
                bool const valid = t >= 0;
                T const* src = valid ? vBase + static_cast<int64_t>(t) * vRowStride + cc * 8 : vBase;
                mma::cpAsync16(vS + r * ldv + cc * 8, src, valid);
            }
        }
    };

    int64_t const nTiles = jEnd > jBegin ? (jEnd - jBegin + BN - 1) / BN : 0;
    if (nTiles > 0)
    {
        loadTile(0, 0);
    }
    mma::cpAsyncCommit();

    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
    {
        o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.F;
    }
    float mRow[2] = {-INFINITY, -INFINITY};
    float lRow[2] = {0.F, 0.F};
    float const scaleLog2 = p.scale * kLOG2E;
    int const rowBase = wm * 16;

    for (int64_t tile = 0; tile < nTiles; ++tile)
    {
        int const buf = stages == 2 ? static_cast<int>(tile & 1) : 0;
        if (stages == 2 && tile + 1 < nTiles)
        {
            loadTile(tile + 1, buf ^ 1);
            mma::cpAsyncCommit();
            mma::cpAsyncWait<1>();
        }
        else
        {
            mma::cpAsyncWait<0>();
        }
        __syncthreads();

        if constexpr (FP8)
        {
            // The codes and scales of this tile have landed: dequantize them into the K tile's first C
            // columns (the RoPE columns came by cp.async), then publish them to every warp's ldmatrix.
            dequantizeFp8Tile<T>(p, kvh, sIdx + buf * BN, sCodes + buf * BN * nC, sK + buf * BN * ldk, ldk);
            __syncthreads();
        }

        T const* kS = sK + buf * BN * ldk;
        T const* vS = vFromK ? kS : sV + buf * BN * ldv;
        int const* idxS = sIdx + buf * BN;

        // S = Q K^T for head rows [rowBase, rowBase + 16) and keys [half * 16, half * 16 + 16).
        float sacc[2][4] = {{0.F, 0.F, 0.F, 0.F}, {0.F, 0.F, 0.F, 0.F}};
        T const* aRow = sQ + (rowBase + (lane & 15)) * ldq + (lane >> 4) * 8;
        T const* bRow = kS + (half * 16 + (lane & 7) + ((lane >> 4) << 3)) * ldk + ((lane >> 3) & 1) * 8;
#pragma unroll 4
        for (int kk = 0; kk < dk; kk += 16)
        {
            uint32_t a[4];
            uint32_t bf[4];
            mma::ldmatrixX4(a, aRow + kk);
            mma::ldmatrixX4(bf, bRow + kk);
            mma::mma16816<T>(sacc[0], a, bf[0], bf[1]);
            mma::mma16816<T>(sacc[1], a, bf[2], bf[3]);
        }

        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
        {
#pragma unroll
            for (int e = 0; e < 4; ++e)
            {
                int const key = half * 16 + nt * 8 + 2 * c + (e & 1);
                float const s = idxS[key] >= 0 ? sacc[nt][e] * scaleLog2 : -INFINITY;
                sacc[nt][e] = s;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], s);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r)
        {
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffU, tmax[r], 1));
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffU, tmax[r], 2));
        }
        if (c == 0)
        {
            sMax[half * HB + rowBase + g] = tmax[0];
            sMax[half * HB + rowBase + g + 8] = tmax[1];
        }
        __syncthreads();

        float alpha[2];
        float mUse[2];
#pragma unroll
        for (int r = 0; r < 2; ++r)
        {
            float const other = sMax[(half ^ 1) * HB + rowBase + g + 8 * r];
            float const mNew = fmaxf(mRow[r], fmaxf(tmax[r], other));
            mUse[r] = mNew == -INFINITY ? 0.F : mNew;
            alpha[r] = exp2f(mRow[r] - mUse[r]);
            mRow[r] = mNew;
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
        {
            float const p0 = exp2f(sacc[nt][0] - mUse[0]);
            float const p1 = exp2f(sacc[nt][1] - mUse[0]);
            float const p2 = exp2f(sacc[nt][2] - mUse[1]);
            float const p3 = exp2f(sacc[nt][3] - mUse[1]);
            if (nt == 0)
            {
                lRow[0] *= alpha[0];
                lRow[1] *= alpha[1];
            }
            lRow[0] += p0 + p1;
            lRow[1] += p2 + p3;
            int const col = half * 16 + nt * 8 + 2 * c;
            storeAligned(sP + (rowBase + g) * ldp + col, mma::packPair<T>(p0, p1));
            storeAligned(sP + (rowBase + g + 8) * ldp + col, mma::packPair<T>(p2, p3));
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
        {
            o[nt][0] *= alpha[0];
            o[nt][1] *= alpha[0];
            o[nt][2] *= alpha[1];
            o[nt][3] *= alpha[1];
        }
        __syncthreads();

        // O[rows, half * DVH : (half + 1) * DVH] += P[rows, 0:32] V[0:32, ...].
        T const* pRow = sP + (rowBase + (lane & 15)) * ldp + (lane >> 4) * 8;
        T const* vRow = vS + ((lane & 7) + ((lane >> 3) & 1) * 8) * ldv + half * DVH + (lane >> 4) * 8;
#pragma unroll
        for (int kk = 0; kk < BN; kk += 16)
        {
            uint32_t a[4];
            mma::ldmatrixX4(a, pRow + kk);
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2)
            {
                uint32_t bf[4];
                mma::ldmatrixX4Trans(bf, vRow + kk * ldv + nt * 8);
                mma::mma16816<T>(o[nt], a, bf[0], bf[1]);
                mma::mma16816<T>(o[nt + 1], a, bf[2], bf[3]);
            }
        }
        // No barrier here: the barrier inside loadTile (before its copies) is what keeps the next
        // refill of a K/V buffer behind every warp's last read of it, and a next iteration without a
        // refill starts with the barrier after its wait. sIdx, sMax and sP were last read before the
        // barrier that follows the P store. So a tile costs as many barriers as when every copy
        // loaded its own index.
        if (stages == 1 && tile + 1 < nTiles)
        {
            loadTile(tile + 1, 0);
            mma::cpAsyncCommit();
        }
    }
    mma::cpAsyncWait<0>();

#pragma unroll
    for (int r = 0; r < 2; ++r)
    {
        lRow[r] += __shfl_xor_sync(0xffffffffU, lRow[r], 1);
        lRow[r] += __shfl_xor_sync(0xffffffffU, lRow[r], 2);
    }
    if (c == 0)
    {
        sSum[half * HB + rowBase + g] = lRow[0];
        sSum[half * HB + rowBase + g + 8] = lRow[1];
    }
    __syncthreads();
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
    {
        float const total = lRow[r] + sSum[(half ^ 1) * HB + rowBase + g + 8 * r];
        inv[r] = total > 0.F ? 1.F / total : 0.F;
        if (p.partial != nullptr && half == 0 && c == 0)
        {
            storeLse(p, bs, h0 + rowBase + g + 8 * r, total > 0.F ? mRow[r] + log2f(total) : -INFINITY);
        }
    }
    int64_t const hRow = h0 + rowBase + g;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
    {
        int64_t const col = half * DVH + nt * 8 + 2 * c;
        storeResultPair<T>(p, bs, hRow, col, o[nt][0] * inv[0], o[nt][1] * inv[0]);
        storeResultPair<T>(p, bs, hRow + 8, col, o[nt][2] * inv[1], o[nt][3] * inv[1]);
    }
}

// ---------------------------------------------------------------------------------------------
// Generic path.

constexpr int32_t kGEN_MAX_HEADS = 4; // heads (warps) per CTA

size_t genericSmemBytes(int64_t bn, int64_t hc, int64_t dk, int64_t dv, bool valuesFromKeys)
{
    int64_t const rowElems = valuesFromKeys ? dk : dk + dv; // values from keys are read out of the K rows
    return static_cast<size_t>(bn * rowElems + hc * (dk + dv)) * sizeof(float) + static_cast<size_t>(bn) * sizeof(int);
}

//! Element d of key row `row` (pool row, or row of the batch row's contiguous cache) for kv head kvh,
//! as float: a T element, or for the FP8 latent float32(decode(code) * scale) for d < C and the RoPE
//! channel d - C (in ropeDtype) after them.
template <typename T>
__device__ __forceinline__ float keyElement(SparseAttentionParams const& p, T const* kBase, int64_t kvh, int64_t row,
    int64_t d)
{
    if (!p.fp8)
    {
        return toFloat(kBase[row * p.Hkv * p.Dk + d]);
    }
    int64_t const slot = row * p.Hkv + kvh;
    if (d < p.C)
    {
        uint8_t const code = static_cast<uint8_t const*>(p.k)[slot * p.C + d];
        __half_raw const h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
        int64_t const nScales = p.C / p.scaleBlock;
        return __half2float(__half(h)) * p.kScale[slot * nScales + d / p.scaleBlock];
    }
    int64_t const e = slot * p.R + (d - p.C);
    switch (p.ropeDtype)
    {
    case DType::kFLOAT16: return toFloat(static_cast<__half const*>(p.kRope)[e]);
    case DType::kBFLOAT16: return toFloat(static_cast<__nv_bfloat16 const*>(p.kRope)[e]);
    default: return static_cast<float const*>(p.kRope)[e];
    }
}

template <typename T>
__global__ void sparseAttentionGenericKernel(SparseAttentionParams p, int32_t hc, int32_t bn)
{
    extern __shared__ __align__(16) unsigned char smemRaw[];
    int64_t const dk = p.Dk;
    int64_t const dv = p.Dv;
    bool const vFromK = p.valuesFromKeys;
    int64_t const ldv = vFromK ? dk : dv;                       // row pitch of the value rows in sV
    float* sK = reinterpret_cast<float*>(smemRaw);              // [bn][dk]
    float* sV = vFromK ? sK : sK + bn * dk;                     // [bn][ldv]: the K rows themselves, or [bn][dv]
    float* sQ = sK + bn * dk + (vFromK ? 0 : bn * dv);          // [hc][dk]
    float* sAcc = sQ + hc * dk;                    // [hc][dv]
    int* sValid = reinterpret_cast<int*>(sAcc + hc * dv);

    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    int const nThreads = blockDim.x;
    int64_t const bs = blockIdx.x;
    int64_t const b = bs / p.S;
    int64_t const groups = p.H / p.Hkv;
    int64_t const chunks = (groups + hc - 1) / hc;
    int64_t const kvh = blockIdx.y / chunks;
    int64_t const hInGroup0 = (blockIdx.y % chunks) * hc;
    int64_t const nHeads = min(static_cast<int64_t>(hc), groups - hInGroup0);
    int64_t const h0 = kvh * groups + hInGroup0;

    T const* q = static_cast<T const*>(p.q) + (bs * p.H + h0) * dk;
    int32_t const* idx = p.indices + bs * p.K;
    int64_t const row0 = firstKeyRow(p, b);
    // FP8: keyElement addresses the pools itself from the row (kBase unused).
    T const* kBase = static_cast<T const*>(p.k) + (p.fp8 ? 0 : (row0 * p.Hkv + kvh) * dk);
    T const* vBase = vFromK ? kBase : static_cast<T const*>(p.v) + (row0 * p.Hkv + kvh) * dv;
    int64_t const jBegin = static_cast<int64_t>(blockIdx.z) * p.splitLen;
    int64_t const jEnd = min(p.K, jBegin + p.splitLen);

    for (int64_t i = threadIdx.x; i < nHeads * dk; i += nThreads)
    {
        sQ[i] = toFloat(q[i]);
    }
    for (int64_t i = threadIdx.x; i < hc * dv; i += nThreads)
    {
        sAcc[i] = 0.F;
    }
    __syncthreads(); // sQ/sAcc are read by other warps even when K == 0 and the loop below never syncs
    bool const active = warp < nHeads;
    float m = -INFINITY;
    float l = 0.F;
    float* acc = sAcc + warp * dv;
    float const* qh = sQ + warp * dk;

    for (int64_t j0 = jBegin; j0 < jEnd; j0 += bn)
    {
        int64_t const rows = min(static_cast<int64_t>(bn), jEnd - j0);
        __syncthreads();
        for (int r = threadIdx.x; r < rows; r += nThreads)
        {
            int const t = keyRow(p, b, idx[j0 + r]);
            sValid[r] = (t >= 0 && t < p.T) ? t : -1;
        }
        __syncthreads();
        for (int64_t i = threadIdx.x; i < rows * dk; i += nThreads)
        {
            int64_t const r = i / dk;
            int64_t const d = i - r * dk;
            int const t = sValid[r];
            sK[i] = t >= 0 ? keyElement(p, kBase, kvh, t, d) : 0.F;
        }
        for (int64_t i = threadIdx.x; !vFromK && i < rows * dv; i += nThreads)
        {
            int64_t const r = i / dv;
            int64_t const d = i - r * dv;
            int const t = sValid[r];
            sV[i] = t >= 0 ? toFloat(vBase[static_cast<int64_t>(t) * p.Hkv * dv + d]) : 0.F;
        }
        __syncthreads();
        if (!active)
        {
            continue;
        }
        for (int64_t r = 0; r < rows; ++r)
        {
            if (sValid[r] < 0)
            {
                continue;
            }
            float dot = 0.F;
            for (int64_t d = lane; d < dk; d += 32)
            {
                dot = fmaf(qh[d], sK[r * dk + d], dot);
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
            {
                dot += __shfl_xor_sync(0xffffffffU, dot, off);
            }
            float const s = dot * p.scale;
            float const mNew = fmaxf(m, s);
            float const alpha = expf(m - mNew); // m = -inf on the first valid key gives 0
            float const pr = expf(s - mNew);
            l = l * alpha + pr;
            for (int64_t d = lane; d < dv; d += 32)
            {
                acc[d] = fmaf(pr, sV[r * ldv + d], acc[d] * alpha);
            }
            m = mNew;
        }
    }
    if (active)
    {
        float const inv = l > 0.F ? 1.F / l : 0.F;
        if (p.partial != nullptr)
        {
            float* part = p.partial + (static_cast<int64_t>(blockIdx.z) * p.B * p.S * p.H + bs * p.H + h0 + warp) * dv;
            for (int64_t d = lane; d < dv; d += 32)
            {
                part[d] = acc[d] * inv;
            }
            if (lane == 0)
            {
                storeLse(p, bs, h0 + warp, l > 0.F ? (m + logf(l)) * kLOG2E : -INFINITY);
            }
            return;
        }
        T* out = static_cast<T*>(p.out) + (bs * p.H + h0 + warp) * dv;
        for (int64_t d = lane; d < dv; d += 32)
        {
            out[d] = fromFloat<T>(acc[d] * inv);
        }
    }
}

template <typename T>
int32_t launchGeneric(SparseAttentionParams const& p, DeviceInfo const& dev, cudaStream_t stream)
{
    int64_t const groups = p.H / p.Hkv;
    int64_t const hc = groups < kGEN_MAX_HEADS ? groups : kGEN_MAX_HEADS;
    // About 16 KB of shared memory per warp keeps several CTAs resident per SM (the per-head form,
    // Hkv = H, runs one warp per CTA and is bound by gathering rows, so occupancy matters most).
    size_t const perCta = static_cast<size_t>(hc) * 16 * 1024;
    size_t const budget = dev.maxSmemOptin < perCta ? dev.maxSmemOptin : perCta;
    int64_t bn = 32;
    while (bn > 1 && genericSmemBytes(bn, hc, p.Dk, p.Dv, p.valuesFromKeys) > budget)
    {
        bn /= 2;
    }
    size_t const smem = genericSmemBytes(bn, hc, p.Dk, p.Dv, p.valuesFromKeys);
    if (smem > dev.maxSmemOptin)
    {
        return setLastError(kUNSUPPORTED,
            "DSASparseAttention: Dk + Dv = " + std::to_string(p.Dk + p.Dv) + " is too large for shared memory");
    }
    auto kernel = sparseAttentionGenericKernel<T>;
    if (smem > 48 * 1024)
    {
        int32_t const st = checkCuda(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
            "cudaFuncSetAttribute(sparseAttentionGenericKernel)");
        if (st != kSUCCESS)
        {
            return st;
        }
    }
    dim3 const grid(static_cast<uint32_t>(p.B * p.S), static_cast<uint32_t>(p.Hkv * ceilDiv(groups, hc)),
        static_cast<uint32_t>(p.numSplits));
    kernel<<<grid, static_cast<uint32_t>(32 * hc), smem, stream>>>(p, static_cast<int32_t>(hc), static_cast<int32_t>(bn));
    return checkCuda(cudaGetLastError(), "sparseAttentionGenericKernel launch");
}

template <typename T, int WM, int NT>
int32_t launchTcInstance(SparseAttentionParams const& p, TcConfig const& cfg, cudaStream_t stream)
{
    auto kernel = p.fp8 ? sparseAttentionMmaKernel<T, WM, NT, true> : sparseAttentionMmaKernel<T, WM, NT, false>;
    int32_t const st = checkCuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(cfg.smem)),
        "cudaFuncSetAttribute(sparseAttentionMmaKernel)");
    if (st != kSUCCESS)
    {
        return st;
    }
    int64_t const groups = p.H / p.Hkv;
    dim3 const grid(static_cast<uint32_t>(p.B * p.S), static_cast<uint32_t>(p.Hkv * (groups / (16 * WM))),
        static_cast<uint32_t>(p.numSplits));
    kernel<<<grid, WM * 64, cfg.smem, stream>>>(p, cfg.stages);
    return checkCuda(cudaGetLastError(), "sparseAttentionMmaKernel launch");
}

template <typename T, int WM>
int32_t launchTcDv(SparseAttentionParams const& p, TcConfig const& cfg, cudaStream_t stream)
{
    switch (p.Dv)
    {
    case 128: return launchTcInstance<T, WM, 8>(p, cfg, stream);
    case 256: return launchTcInstance<T, WM, 16>(p, cfg, stream);
    case 512: return launchTcInstance<T, WM, 32>(p, cfg, stream);
    default: return setLastError(kUNSUPPORTED, "DSASparseAttention: no tensor-core kernel for this Dv");
    }
}

template <typename T>
int32_t launchTc(SparseAttentionParams const& p, TcConfig const& cfg, cudaStream_t stream)
{
    switch (cfg.wm)
    {
    case 4: return launchTcDv<T, 4>(p, cfg, stream);
    case 2: return launchTcDv<T, 2>(p, cfg, stream);
    default: return launchTcDv<T, 1>(p, cfg, stream);
    }
}

bool tcShapeOk(int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, DType dtype, int32_t smMajor)
{
    return dtype != DType::kFLOAT32 && smMajor >= 8 && Hkv > 0 && H % Hkv == 0 && (H / Hkv) % 16 == 0
        && Dk % 16 == 0 && Dk > 0 && (Dv == 128 || Dv == 256 || Dv == 512);
}

TcConfig pickTcConfig(int64_t groups, int64_t Dk, int64_t Dv, bool valuesFromKeys, size_t maxSmem,
    int64_t fp8RowBytes = 0)
{
    for (int32_t wm : {4, 2, 1})
    {
        if (groups % (16 * wm) != 0)
        {
            continue;
        }
        for (int32_t stages : {2, 1})
        {
            size_t const smem = tcSmemBytes(wm, stages, Dk, Dv, valuesFromKeys, fp8RowBytes);
            if (smem <= maxSmem)
            {
                return TcConfig{wm, stages, smem};
            }
        }
    }
    return TcConfig{};
}

bool aligned16(void const* ptr)
{
    return (reinterpret_cast<uintptr_t>(ptr) & 15U) == 0;
}

//! The launcher's kernel choice: the tensor-core configuration for these arguments on dev, or
//! TcConfig{} (wm == 0) for the generic kernel when the shapes, the dtype, the architecture, the
//! alignment or the shared memory of every configuration rule the tensor-core kernel out.
//! sparseAttentionPath() reports the same decision.
TcConfig planTc(int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, bool valuesFromKeys, bool aligned, DType dtype,
    DeviceInfo const& dev)
{
    if (!aligned || !tcShapeOk(H, Hkv, Dk, Dv, dtype, dev.smMajor))
    {
        return TcConfig{};
    }
    return pickTcConfig(H / Hkv, Dk, Dv, valuesFromKeys, dev.maxSmemOptin);
}

//! planTc for a paged call: the FP8 latent additionally needs 16-byte code rows, 8-channel RoPE
//! chunks in q's dtype and scale blocks of whole 8-code chunks, and its staging area in shared memory.
TcConfig planTcPaged(SparseAttentionParams const& p, bool aligned, DType dtype, DeviceInfo const& dev)
{
    if (!p.fp8)
    {
        return planTc(p.H, p.Hkv, p.Dk, p.Dv, p.valuesFromKeys, aligned, dtype, dev);
    }
    bool const fp8Ok = p.C % 16 == 0 && p.R % 8 == 0 && p.scaleBlock % 8 == 0 && p.ropeDtype == dtype;
    if (!aligned || !fp8Ok || !tcShapeOk(p.H, p.Hkv, p.Dk, p.Dv, dtype, dev.smMajor))
    {
        return TcConfig{};
    }
    return pickTcConfig(p.H / p.Hkv, p.Dk, p.Dv, true, dev.maxSmemOptin, fp8StageRowBytes(p));
}

//! Merges the splits of each output row (one CTA per row (b, s, h)): out = sum_z w_z o_z / sum_z w_z
//! with w_z = 2^(lse_z - max lse), splits without a valid key (lse = -inf) weigh 0, rows without any
//! are 0. The order of the sum is the split order: the same bits on every run.
template <typename T>
__global__ void sparseAttentionCombineKernel(SparseAttentionParams p)
{
    int64_t const row = blockIdx.x; // (b * S + s) * H + h
    int64_t const rows = p.B * p.S * p.H;
    float lseMax = -INFINITY;
    for (int32_t z = 0; z < p.numSplits; ++z)
    {
        lseMax = fmaxf(lseMax, p.partialLse[z * rows + row]);
    }
    T* out = static_cast<T*>(p.out) + row * p.Dv;
    for (int64_t d = threadIdx.x; d < p.Dv; d += blockDim.x)
    {
        float num = 0.F;
        float den = 0.F;
        for (int32_t z = 0; lseMax != -INFINITY && z < p.numSplits; ++z)
        {
            float const w = exp2f(p.partialLse[z * rows + row] - lseMax);
            den += w;
            num = fmaf(w, p.partial[(z * rows + row) * p.Dv + d], num);
        }
        out[d] = fromFloat<T>(den > 0.F ? num / den : 0.F);
    }
}

template <typename T>
int32_t launchCombine(SparseAttentionParams const& p, cudaStream_t stream)
{
    sparseAttentionCombineKernel<T><<<static_cast<uint32_t>(p.B * p.S * p.H), 128, 0, stream>>>(p);
    return checkCuda(cudaGetLastError(), "sparseAttentionCombineKernel launch");
}

//! Enqueues the attention kernels for validated parameters (p.splitLen and, when split, the partial
//! buffers set): the tensor-core kernel when `cfg` holds one, else the generic kernel, then the combine.
int32_t launchPlanned(SparseAttentionParams const& p, TcConfig const& cfg, DType dtype, DeviceInfo const& dev,
    cudaStream_t stream)
{
    int32_t st = kSUCCESS;
    if (cfg.wm != 0)
    {
        st = dtype == DType::kFLOAT16 ? launchTc<__half>(p, cfg, stream) : launchTc<__nv_bfloat16>(p, cfg, stream);
    }
    else
    {
        switch (dtype)
        {
        case DType::kFLOAT32: st = launchGeneric<float>(p, dev, stream); break;
        case DType::kFLOAT16: st = launchGeneric<__half>(p, dev, stream); break;
        case DType::kBFLOAT16: st = launchGeneric<__nv_bfloat16>(p, dev, stream); break;
        case DType::kFP8_E4M3: return setLastError(kINVALID_ARGUMENT, "DSASparseAttention: unknown dtype");
        }
    }
    if (st != kSUCCESS || p.partial == nullptr)
    {
        return st;
    }
    switch (dtype)
    {
    case DType::kFLOAT32: return launchCombine<float>(p, stream);
    case DType::kFLOAT16: return launchCombine<__half>(p, stream);
    default: return launchCombine<__nv_bfloat16>(p, stream);
    }
}

constexpr int64_t kSplitMinIndices = 256; // fewest indices per split the automatic schedule makes
constexpr int32_t kMaxSplits = 64;

} // namespace

int32_t sparseAttentionSplits(int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t K, int32_t requested,
    DeviceInfo const& dev, int64_t* splitLen)
{
    int64_t n = 1;
    // requested < 0: the schedule the launcher would choose on a GPU of -requested SMs, whatever
    // this device has (a caller that sized its workspace in advance, e.g. a TensorRT plugin).
    int64_t const sms = requested < 0 ? -static_cast<int64_t>(requested) : static_cast<int64_t>(dev.numSMs);
    if (requested > 0)
    {
        n = requested;
    }
    else if (Hkv > 0 && H % Hkv == 0)
    {
        // CTAs of one split: one per (query, kv head, block of up to 64 heads of the group).
        int64_t const ctas = B * S * Hkv * ceilDiv(H / Hkv, 64);
        if (ctas > 0 && ctas < sms)
        {
            n = std::min<int64_t>(std::min<int64_t>(ceilDiv(2 * sms, ctas), K / kSplitMinIndices), kMaxSplits);
        }
    }
    n = std::max<int64_t>(1, std::min<int64_t>(n, ceilDiv(K, kTC_BN)));
    // Whole 32-index tiles per split (the generic kernel's tiles, at most 32 and a power of two, divide them).
    int64_t const len = n > 1 ? ceilDiv(ceilDiv(K, n), kTC_BN) * kTC_BN : K;
    if (splitLen != nullptr)
    {
        *splitLen = len;
    }
    return n > 1 ? static_cast<int32_t>(ceilDiv(K, len)) : 1;
}

size_t sparseAttentionSplitWorkspace(int64_t B, int64_t S, int64_t H, int64_t Dv, int32_t splits)
{
    if (splits <= 1)
    {
        return 0;
    }
    size_t const rows = static_cast<size_t>(splits) * static_cast<size_t>(B * S * H);
    return alignUp(rows * static_cast<size_t>(Dv) * sizeof(float), 256) + alignUp(rows * sizeof(float), 256);
}

int32_t sparseAttentionPath(int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, bool valuesFromKeys, bool aligned,
    DType dtype, DeviceInfo const& dev)
{
    return planTc(H, Hkv, Dk, Dv, valuesFromKeys, aligned, dtype, dev).wm != 0 ? 1 : 0;
}

int32_t launchSparseAttention(SparseAttentionParams const& p, DType dtype, cudaStream_t stream)
{
    if (!isValidDType(static_cast<int32_t>(dtype)))
    {
        return setLastError(kINVALID_ARGUMENT, "DSASparseAttention: q, k and v must be float32, float16 or bfloat16");
    }
    if (p.B < 0 || p.S < 0 || p.T < 0 || p.K < 0 || p.H <= 0 || p.Hkv <= 0 || p.Dk <= 0 || p.Dv <= 0)
    {
        return setLastError(kINVALID_ARGUMENT, "DSASparseAttention: dimensions must be positive (B, S, T, K >= 0)");
    }
    if (p.H % p.Hkv != 0)
    {
        return setLastError(kINVALID_ARGUMENT,
            "DSASparseAttention: H = " + std::to_string(p.H) + " is not a multiple of Hkv = " + std::to_string(p.Hkv));
    }
    if (p.B * p.S == 0)
    {
        return kSUCCESS;
    }
    if (p.valuesFromKeys && p.Dv > p.Dk)
    {
        return setLastError(kINVALID_ARGUMENT,
            "DSASparseAttention: values from keys need Dv <= Dk, got Dv = " + std::to_string(p.Dv)
                + " and Dk = " + std::to_string(p.Dk));
    }
    if (p.q == nullptr || p.out == nullptr || (p.K > 0 && p.indices == nullptr)
        || (p.T > 0 && (p.k == nullptr || (!p.valuesFromKeys && p.v == nullptr))))
    {
        return setLastError(kINVALID_ARGUMENT, "DSASparseAttention: a required pointer is null");
    }
    if (p.B * p.S > 0x7fffffffLL || p.Hkv * p.H > 65535)
    {
        return setLastError(kUNSUPPORTED, "DSASparseAttention: B*S or H exceeds the grid limits");
    }
    if (p.T == 0 || p.K == 0)
    {
        // No index can be valid: every row is 0 (what the kernels would write). Nothing is launched,
        // so k, v and indices, which TensorRT may pass as null for empty tensors, are never used as
        // copy sources (the kernels' zero-filling cp.async still takes a source address).
        return checkCuda(
            cudaMemsetAsync(p.out, 0, static_cast<size_t>(p.B * p.S * p.H * p.Dv) * dtypeSize(dtype), stream),
            "cudaMemsetAsync(DSASparseAttention out)");
    }
    DeviceInfo dev;
    if (!currentDeviceInfo(dev))
    {
        return kCUDA_ERROR;
    }
    bool const aligned = aligned16(p.q) && aligned16(p.k) && (p.valuesFromKeys || aligned16(p.v)) && aligned16(p.out);
    TcConfig const cfg = planTc(p.H, p.Hkv, p.Dk, p.Dv, p.valuesFromKeys, aligned, dtype, dev);
    SparseAttentionParams one = p; // the contiguous entry point never splits
    one.numSplits = 1;
    one.splitLen = p.K;
    one.partial = nullptr;
    one.partialLse = nullptr;
    return launchPlanned(one, cfg, dtype, dev, stream);
}

int32_t launchSparseAttentionPaged(SparseAttentionParams p, DType dtype, int32_t numSplits, void* workspace,
    size_t workspaceBytes, cudaStream_t stream)
{
    std::string const op = p.fp8 ? "DSASparseAttentionPagedFP8" : "DSASparseAttentionPaged";
    if (dtype != DType::kFLOAT32 && dtype != DType::kFLOAT16 && dtype != DType::kBFLOAT16)
    {
        return setLastError(kINVALID_ARGUMENT, op + ": q must be float32, float16 or bfloat16");
    }
    if (p.fp8 && p.ropeDtype != DType::kFLOAT32 && p.ropeDtype != DType::kFLOAT16 && p.ropeDtype != DType::kBFLOAT16)
    {
        return setLastError(kINVALID_ARGUMENT, op + ": k_rope_pool must be float32, float16 or bfloat16");
    }
    if (p.B < 0 || p.S < 0 || p.K < 0 || p.M < 0 || p.P <= 0 || p.page <= 0 || p.H <= 0 || p.Hkv <= 0
        || p.Dk <= 0 || p.Dv <= 0)
    {
        return setLastError(kINVALID_ARGUMENT,
            op + ": dimensions must be positive (B, S, K, M >= 0; P, page >= 1)");
    }
    if (p.fp8 && (p.C <= 0 || p.R < 0 || p.scaleBlock <= 0 || p.C % p.scaleBlock != 0))
    {
        return setLastError(kINVALID_ARGUMENT,
            op + ": C = " + std::to_string(p.C) + " must be a positive multiple of block_size = "
                + std::to_string(p.scaleBlock));
    }
    if (p.H % p.Hkv != 0)
    {
        return setLastError(kINVALID_ARGUMENT,
            op + ": H = " + std::to_string(p.H) + " is not a multiple of Hkv = " + std::to_string(p.Hkv));
    }
    if (p.valuesFromKeys && p.Dv > p.Dk)
    {
        return setLastError(kINVALID_ARGUMENT, op + ": values from keys need Dv <= Dk");
    }
    if (p.B * p.S == 0)
    {
        return kSUCCESS;
    }
    if (p.q == nullptr || p.out == nullptr || p.k == nullptr || (p.K > 0 && (p.indices == nullptr))
        || (p.M > 0 && p.blockTable == nullptr) || (!p.fp8 && !p.valuesFromKeys && p.v == nullptr)
        || (p.fp8 && (p.kScale == nullptr || (p.R > 0 && p.kRope == nullptr))))
    {
        return setLastError(kINVALID_ARGUMENT, op + ": a required pointer is null");
    }
    if (p.B * p.S > 0x7fffffffLL || p.Hkv * p.H > 65535 || p.P * p.page > 0x7fffffffLL
        || p.M * p.page > 0x7fffffffLL)
    {
        return setLastError(kUNSUPPORTED, op + ": B*S, H, P*page or M*page exceeds the kernels' limits");
    }
    if (p.K == 0 || p.M == 0)
    {
        return checkCuda(
            cudaMemsetAsync(p.out, 0, static_cast<size_t>(p.B * p.S * p.H * p.Dv) * dtypeSize(dtype), stream),
            (op + " out memset").c_str());
    }
    DeviceInfo dev;
    if (!currentDeviceInfo(dev))
    {
        return kCUDA_ERROR;
    }
    p.T = p.P * p.page; // rows of the pools: the kernels check a translated row against it
    p.numSplits = sparseAttentionSplits(p.B, p.S, p.H, p.Hkv, p.K, numSplits, dev, &p.splitLen);
    p.partial = nullptr;
    p.partialLse = nullptr;
    if (p.numSplits > 1)
    {
        size_t const need = sparseAttentionSplitWorkspace(p.B, p.S, p.H, p.Dv, p.numSplits);
        if (workspace == nullptr || workspaceBytes < need || !aligned16(workspace))
        {
            return setLastError(kWORKSPACE_TOO_SMALL,
                op + ": " + std::to_string(p.numSplits) + " splits need a 16-byte aligned workspace of "
                    + std::to_string(need) + " bytes, got " + std::to_string(workspaceBytes));
        }
        size_t const rows = static_cast<size_t>(p.numSplits) * static_cast<size_t>(p.B * p.S * p.H);
        p.partial = static_cast<float*>(workspace);
        p.partialLse = reinterpret_cast<float*>(
            static_cast<unsigned char*>(workspace) + alignUp(rows * static_cast<size_t>(p.Dv) * sizeof(float), 256));
    }
    bool const aligned = aligned16(p.q) && aligned16(p.k) && aligned16(p.out)
        && (p.fp8 ? (p.R == 0 || aligned16(p.kRope)) : (p.valuesFromKeys || aligned16(p.v)));
    TcConfig const cfg = planTcPaged(p, aligned, dtype, dev);
    return launchPlanned(p, cfg, dtype, dev, stream);
}

} // namespace dsa
