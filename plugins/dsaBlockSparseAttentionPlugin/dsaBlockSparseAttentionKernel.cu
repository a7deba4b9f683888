/*
 * DSABlockSparseAttention kernels.
 *
 * Both paths run one CTA per (batch row b, query head h, query block i, slice of the block's query
 * rows). The CTA first makes its list of key blocks canonical in shared memory: a bitmap of the
 * ceil(T/bs) key blocks is filled from block_index[b,h,i,:] (ids outside [0, ceil(T/bs)) ignored,
 * a repeated id sets the same bit once, and when causal a block starting after the CTA's last
 * query position is dropped), then compacted into an ascending list (popcount scan). Only the
 * listed blocks are read.
 *
 * Tensor-core path (fp16/bf16, sm_80+, Dk % 16 == 0, Dk <= 256, Dv in {32, 64, 128, 256},
 * block_size % 16 == 0): the CTA holds BM = 16 * WM query rows of the block (WM warps, WM = 4, 2 or
 * 1, the largest whose BM divides block_size) with Q[BM, Dk] in shared memory, and walks its listed
 * key blocks in tiles of 32 keys: K and V tiles are copied into shared memory with cp.async
 * (double-buffered when shared memory allows; keys past the block end or past T are zero-filled)
 * and used by every warp. Each warp owns 16 query rows: S = Q K^T with mma.sync m16n8k16 (fp32
 * accumulation), element masks (key inside the block and < T; causal key <= query position), an
 * online softmax in fp32 (exp2 with log2(e) folded into the scale), and O += P V where P stays in
 * registers (the S accumulator fragments are the A fragments of the next mma). Tiles that hold no
 * key allowed to any row of the CTA (the future half of the causal diagonal block) are skipped.
 *
 * Generic path (fp32, and every shape the tensor-core path does not take): the CTA holds 8 query
 * rows (4 warps, 2 rows each); key/value tiles of the listed blocks are converted to fp32 in shared
 * memory, scores come from warp reductions, the online softmax and the accumulators are fp32.
 * Correct for any Dk, Dv, block_size; memory-bound and slower.
 *
 * Rows without an allowed key get 0 (their softmax sum stays 0).
 */
#include "dsaBlockSparseAttentionKernel.h"

#include "common/dsaMma.cuh"

#include <cmath>
#include <cstdint>
#include <string>

namespace dsa
{
namespace
{

constexpr float kLOG2E = 1.4426950408889634F;
constexpr int32_t kTC_BN = 32;          // keys per tile in the tensor-core kernel
constexpr int32_t kGEN_WARPS = 4;       // warps per CTA in the generic kernel
constexpr int32_t kGEN_ROWS_PER_WARP = 2;
constexpr int32_t kGEN_ROWS = kGEN_WARPS * kGEN_ROWS_PER_WARP;
constexpr int64_t kNO_LIMIT = INT64_MAX;

__device__ __forceinline__ int64_t ceilDivDev(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

//! Shared memory of the canonical block list: bitmap words, the list, the scan of the thread counts.
size_t listSmemBytes(int64_t nkb, int64_t cap, int32_t threads)
{
    return static_cast<size_t>(ceilDiv(nkb, 32) + cap + threads + 1) * sizeof(int32_t);
}

//! Fills sList with the CTA's listed key blocks: ascending, each once, ids in [0, nkb), and
//! j * bs <= maxKey (the last key any row of the CTA may see). All threads must call it; returns
//! the list length (the same in every thread).
__device__ int32_t buildBlockList(int32_t const* ids, int64_t kb, int32_t nkb, int64_t bs, int64_t maxKey,
    uint32_t* sBits, int32_t* sList, int32_t* sScan)
{
    int32_t const words = (nkb + 31) / 32;
    int32_t const nThreads = static_cast<int32_t>(blockDim.x);
    int32_t const tid = static_cast<int32_t>(threadIdx.x);
    for (int32_t w = tid; w < words; w += nThreads)
    {
        sBits[w] = 0U;
    }
    __syncthreads();
    for (int64_t u = tid; u < kb; u += nThreads)
    {
        int32_t const j = __ldg(ids + u);
        if (j >= 0 && j < nkb && static_cast<int64_t>(j) * bs <= maxKey)
        {
            atomicOr(sBits + (j >> 5), 1U << (j & 31));
        }
    }
    __syncthreads();
    // Each thread compacts a contiguous range of words; an exclusive scan of their popcounts
    // places them, so the list comes out ascending.
    int32_t const per = (words + nThreads - 1) / nThreads;
    int32_t const w0 = min(words, tid * per);
    int32_t const w1 = min(words, w0 + per);
    int32_t count = 0;
    for (int32_t w = w0; w < w1; ++w)
    {
        count += __popc(sBits[w]);
    }
    sScan[tid] = count;
    __syncthreads();
    if (tid == 0)
    {
        int32_t run = 0;
        for (int32_t i = 0; i < nThreads; ++i)
        {
            int32_t const c = sScan[i];
            sScan[i] = run;
            run += c;
        }
        sScan[nThreads] = run;
    }
    __syncthreads();
    int32_t pos = sScan[tid];
    for (int32_t w = w0; w < w1; ++w)
    {
        uint32_t bits = sBits[w];
        while (bits != 0U)
        {
            int32_t const bit = __ffs(static_cast<int>(bits)) - 1;
            bits &= bits - 1U;
            sList[pos++] = w * 32 + bit;
        }
    }
    __syncthreads();
    return sScan[nThreads];
}

//! Keys of block j a CTA reads: [j*bs, end) with end cut at T, at the block end and (causal) past maxKey.
__device__ __forceinline__ int64_t blockKeyEnd(int64_t j, BlockSparseAttentionParams const& p, int64_t maxKey)
{
    int64_t end = min((j + 1) * p.blockSize, p.T);
    return min(end, maxKey == kNO_LIMIT ? end : maxKey + 1);
}

// ---------------------------------------------------------------------------------------------
// Tensor-core path.

struct TcConfig
{
    int32_t wm{0};     // warps; BM = 16 * wm query rows per CTA
    int32_t stages{0}; // 1 or 2 key/value buffers
    size_t smem{0};
};

size_t tcTileSmemBytes(int32_t wm, int32_t stages, int64_t dk, int64_t dv)
{
    int64_t const elems = 16 * wm * (dk + 8) + stages * kTC_BN * ((dk + 8) + (dv + 8));
    return static_cast<size_t>(elems) * 2;
}

template <typename T, int WM, int NT>
__global__ void __launch_bounds__(WM * 32) blockSparseAttentionMmaKernel(
    BlockSparseAttentionParams p, int32_t stages, int32_t nkb, int32_t cap)
{
    constexpr int BM = WM * 16;
    constexpr int BN = kTC_BN;
    constexpr int NTHREADS = WM * 32;
    constexpr int DV = NT * 8;
    constexpr int SN = BN / 8; // score n-tiles per warp
    static_assert(NT % 2 == 0, "NT must be even");

    extern __shared__ __align__(16) unsigned char smemRaw[];
    int const dk = static_cast<int>(p.Dk);
    int const ldq = dk + 8;
    int const ldk = dk + 8;
    constexpr int ldv = DV + 8;
    T* sQ = reinterpret_cast<T*>(smemRaw);
    T* sK = sQ + BM * ldq;
    T* sV = sK + stages * BN * ldk;
    uint32_t* sBits = reinterpret_cast<uint32_t*>(sV + stages * BN * ldv);
    int32_t* sList = reinterpret_cast<int32_t*>(sBits + (nkb + 31) / 32);
    int32_t* sScan = sList + cap;

    int64_t const nqb = ceilDivDev(p.S, p.blockSize);
    int64_t const bhi = blockIdx.x; // (b * H + h) * nqb + i
    int64_t const i = bhi % nqb;
    int64_t const bh = bhi / nqb;
    int64_t const h = bh % p.H;
    int64_t const b = bh / p.H;
    int64_t const kvh = h / (p.H / p.Hkv);
    int64_t const s0 = i * p.blockSize + static_cast<int64_t>(blockIdx.y) * BM; // first query row of the CTA
    if (s0 >= p.S)
    {
        return; // rows past the ragged last query block: nothing to write
    }
    int64_t const offset = p.T - p.S; // query s sits at absolute position T - S + s
    int64_t const sLast = min(s0 + BM, p.S) - 1;
    int64_t const maxKey = p.causal ? offset + sLast : kNO_LIMIT;
    int32_t const nList = buildBlockList(
        p.blockIndex + bhi * p.Kb, p.Kb, nkb, p.blockSize, maxKey, sBits, sList, sScan);

    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    int const g = lane >> 2;
    int const c = lane & 3;
    int const kChunks = dk / 8;
    constexpr int vChunks = DV / 8;

    T const* qBase = static_cast<T const*>(p.q);
    for (int idx = threadIdx.x; idx < BM * kChunks; idx += NTHREADS)
    {
        int const r = idx / kChunks;
        int const cc = idx - r * kChunks;
        int64_t const s = s0 + r;
        bool const valid = s < p.S;
        T const* src = valid ? qBase + ((b * p.S + s) * p.H + h) * p.Dk + cc * 8 : qBase;
        mma::cpAsync16(sQ + r * ldq + cc * 8, src, valid);
    }

    T const* kBase = static_cast<T const*>(p.k);
    T const* vBase = static_cast<T const*>(p.v);
    auto tilesOf = [&](int32_t listPos) -> int32_t {
        int64_t const j = sList[listPos];
        return static_cast<int32_t>(ceilDivDev(blockKeyEnd(j, p, maxKey) - j * p.blockSize, BN));
    };
    // Tile `tile` of listed block `listPos` into buffer buf: keys [j*bs + tile*BN, +BN) of the block.
    auto loadTile = [&](int32_t listPos, int32_t tile, int buf) {
        int64_t const j = sList[listPos];
        int64_t const key0 = j * p.blockSize + static_cast<int64_t>(tile) * BN;
        int64_t const keyEnd = min((j + 1) * p.blockSize, p.T);
        T* kS = sK + buf * BN * ldk;
        T* vS = sV + buf * BN * ldv;
        for (int idx = threadIdx.x; idx < BN * kChunks; idx += NTHREADS)
        {
            int const r = idx / kChunks;
            int const cc = idx - r * kChunks;
            int64_t const t = key0 + r;
            bool const valid = t < keyEnd;
            T const* src = valid ? kBase + ((b * p.T + t) * p.Hkv + kvh) * p.Dk + cc * 8 : kBase;
            mma::cpAsync16(kS + r * ldk + cc * 8, src, valid);
        }
        for (int idx = threadIdx.x; idx < BN * vChunks; idx += NTHREADS)
        {
            int const r = idx / vChunks;
            int const cc = idx - r * vChunks;
            int64_t const t = key0 + r;
            bool const valid = t < keyEnd;
            T const* src = valid ? vBase + ((b * p.T + t) * p.Hkv + kvh) * DV + cc * 8 : vBase;
            mma::cpAsync16(vS + r * ldv + cc * 8, src, valid);
        }
    };

    if (nList > 0)
    {
        loadTile(0, 0, 0);
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
    int const rowBase = warp * 16;
    // Absolute positions of this thread's two query rows (g and g + 8 of the warp's 16).
    int64_t const qPos0 = offset + s0 + rowBase + g;
    int64_t const qPos1 = qPos0 + 8;

    int32_t listPos = 0;
    int32_t tile = 0;
    int buf = 0;
    while (listPos < nList)
    {
        int32_t nextPos = listPos;
        int32_t nextTile = tile + 1;
        if (nextTile >= tilesOf(listPos))
        {
            ++nextPos;
            nextTile = 0;
        }
        bool const hasNext = nextPos < nList;
        if (stages == 2 && hasNext)
        {
            loadTile(nextPos, nextTile, buf ^ 1);
            mma::cpAsyncCommit();
            mma::cpAsyncWait<1>();
        }
        else
        {
            mma::cpAsyncWait<0>();
        }
        __syncthreads();

        T const* kS = sK + buf * BN * ldk;
        T const* vS = sV + buf * BN * ldv;
        int64_t const j = sList[listPos];
        int64_t const key0 = j * p.blockSize + static_cast<int64_t>(tile) * BN;
        int64_t const keyEnd = min((j + 1) * p.blockSize, p.T);

        // S = Q K^T for the warp's 16 rows and the tile's 32 keys.
        float sacc[SN][4];
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
        {
            sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.F;
        }
        T const* aRow = sQ + (rowBase + (lane & 15)) * ldq + (lane >> 4) * 8;
#pragma unroll 2
        for (int kk = 0; kk < dk; kk += 16)
        {
            uint32_t a[4];
            mma::ldmatrixX4(a, aRow + kk);
#pragma unroll
            for (int n16 = 0; n16 < BN / 16; ++n16)
            {
                uint32_t bf[4];
                T const* bRow = kS + (n16 * 16 + (lane & 7) + ((lane >> 4) << 3)) * ldk + ((lane >> 3) & 1) * 8;
                mma::ldmatrixX4(bf, bRow + kk);
                mma::mma16816<T>(sacc[2 * n16], a, bf[0], bf[1]);
                mma::mma16816<T>(sacc[2 * n16 + 1], a, bf[2], bf[3]);
            }
        }

        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
        {
#pragma unroll
            for (int e = 0; e < 4; ++e)
            {
                int64_t const t = key0 + nt * 8 + 2 * c + (e & 1);
                int64_t const qPos = (e >> 1) != 0 ? qPos1 : qPos0;
                bool const ok = t < keyEnd && (!p.causal || t <= qPos);
                float const s = ok ? sacc[nt][e] * scaleLog2 : -INFINITY;
                sacc[nt][e] = s;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], s);
            }
        }
        float alpha[2];
        float mUse[2];
#pragma unroll
        for (int r = 0; r < 2; ++r)
        {
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffU, tmax[r], 1));
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffU, tmax[r], 2));
            float const mNew = fmaxf(mRow[r], tmax[r]);
            mUse[r] = mNew == -INFINITY ? 0.F : mNew;
            alpha[r] = exp2f(mRow[r] - mUse[r]);
            mRow[r] = mNew;
            lRow[r] *= alpha[r];
        }
        // P = exp2(S - m), kept in registers as the A fragments of P V.
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
        {
            float const p0 = exp2f(sacc[nt][0] - mUse[0]);
            float const p1 = exp2f(sacc[nt][1] - mUse[0]);
            float const p2 = exp2f(sacc[nt][2] - mUse[1]);
            float const p3 = exp2f(sacc[nt][3] - mUse[1]);
            lRow[0] += p0 + p1;
            lRow[1] += p2 + p3;
            int const k16 = nt >> 1;
            int const hi = (nt & 1) * 2;
            pa[k16][hi] = mma::packPair<T>(p0, p1);
            pa[k16][hi + 1] = mma::packPair<T>(p2, p3);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
        {
            o[nt][0] *= alpha[0];
            o[nt][1] *= alpha[0];
            o[nt][2] *= alpha[1];
            o[nt][3] *= alpha[1];
        }
        // O[rows, 0:DV] += P[rows, 0:32] V[0:32, 0:DV].
        T const* vRow = vS + ((lane & 7) + ((lane >> 3) & 1) * 8) * ldv + (lane >> 4) * 8;
#pragma unroll
        for (int k16 = 0; k16 < BN / 16; ++k16)
        {
            // A fragment order: (row g, k 0..7), (row g+8, k 0..7), (row g, k 8..15), (row g+8, k 8..15).
            uint32_t const a[4] = {pa[k16][0], pa[k16][1], pa[k16][2], pa[k16][3]};
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2)
            {
                uint32_t bf[4];
                mma::ldmatrixX4Trans(bf, vRow + k16 * 16 * ldv + nt * 8);
                mma::mma16816<T>(o[nt], a, bf[0], bf[1]);
                mma::mma16816<T>(o[nt + 1], a, bf[2], bf[3]);
            }
        }
        __syncthreads();
        if (stages == 1 && hasNext)
        {
            loadTile(nextPos, nextTile, 0);
            mma::cpAsyncCommit();
        }
        listPos = nextPos;
        tile = nextTile;
        if (stages == 2)
        {
            buf ^= 1;
        }
    }
    mma::cpAsyncWait<0>();

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
    {
        lRow[r] += __shfl_xor_sync(0xffffffffU, lRow[r], 1);
        lRow[r] += __shfl_xor_sync(0xffffffffU, lRow[r], 2);
        inv[r] = lRow[r] > 0.F ? 1.F / lRow[r] : 0.F;
    }
    int64_t const row0 = s0 + rowBase + g;
    int64_t const row1 = row0 + 8;
    T* out = static_cast<T*>(p.out);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
    {
        int const col = nt * 8 + 2 * c;
        if (row0 < p.S)
        {
            storeAligned(out + ((b * p.S + row0) * p.H + h) * DV + col,
                mma::packPair<T>(o[nt][0] * inv[0], o[nt][1] * inv[0]));
        }
        if (row1 < p.S)
        {
            storeAligned(out + ((b * p.S + row1) * p.H + h) * DV + col,
                mma::packPair<T>(o[nt][2] * inv[1], o[nt][3] * inv[1]));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Generic path.

size_t genericTileSmemBytes(int64_t bn, int64_t dk, int64_t dv)
{
    return static_cast<size_t>(bn * (dk + dv) + kGEN_ROWS * (dk + dv)) * sizeof(float);
}

template <typename T>
__global__ void __launch_bounds__(kGEN_WARPS * 32) blockSparseAttentionGenericKernel(
    BlockSparseAttentionParams p, int32_t nkb, int32_t cap, int32_t bn)
{
    extern __shared__ __align__(16) unsigned char smemRaw[];
    int64_t const dk = p.Dk;
    int64_t const dv = p.Dv;
    float* sK = reinterpret_cast<float*>(smemRaw); // [bn][dk]
    float* sV = sK + bn * dk;                      // [bn][dv]
    float* sQ = sV + bn * dv;                      // [rows][dk]
    float* sAcc = sQ + kGEN_ROWS * dk;             // [rows][dv]
    uint32_t* sBits = reinterpret_cast<uint32_t*>(sAcc + kGEN_ROWS * dv);
    int32_t* sList = reinterpret_cast<int32_t*>(sBits + (nkb + 31) / 32);
    int32_t* sScan = sList + cap;

    int64_t const nqb = ceilDivDev(p.S, p.blockSize);
    int64_t const bhi = blockIdx.x;
    int64_t const i = bhi % nqb;
    int64_t const bh = bhi / nqb;
    int64_t const h = bh % p.H;
    int64_t const b = bh / p.H;
    int64_t const kvh = h / (p.H / p.Hkv);
    int64_t const r0 = static_cast<int64_t>(blockIdx.y) * kGEN_ROWS; // first row inside the block
    int64_t const s0 = i * p.blockSize + r0;
    int64_t const nRows = min(static_cast<int64_t>(kGEN_ROWS), min(p.blockSize - r0, p.S - s0));
    if (nRows <= 0)
    {
        return;
    }
    int64_t const offset = p.T - p.S;
    int64_t const maxKey = p.causal ? offset + s0 + nRows - 1 : kNO_LIMIT;
    int32_t const nList = buildBlockList(
        p.blockIndex + bhi * p.Kb, p.Kb, nkb, p.blockSize, maxKey, sBits, sList, sScan);

    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    int const nThreads = blockDim.x;
    T const* q = static_cast<T const*>(p.q);
    T const* kBase = static_cast<T const*>(p.k);
    T const* vBase = static_cast<T const*>(p.v);
    for (int64_t idx = threadIdx.x; idx < kGEN_ROWS * dk; idx += nThreads)
    {
        int64_t const r = idx / dk;
        int64_t const d = idx - r * dk;
        sQ[idx] = r < nRows ? toFloat(q[((b * p.S + s0 + r) * p.H + h) * dk + d]) : 0.F;
    }
    for (int64_t idx = threadIdx.x; idx < kGEN_ROWS * dv; idx += nThreads)
    {
        sAcc[idx] = 0.F;
    }
    float m[kGEN_ROWS_PER_WARP];
    float l[kGEN_ROWS_PER_WARP];
#pragma unroll
    for (int rr = 0; rr < kGEN_ROWS_PER_WARP; ++rr)
    {
        m[rr] = -INFINITY;
        l[rr] = 0.F;
    }
    for (int32_t listPos = 0; listPos < nList; ++listPos)
    {
        int64_t const j = sList[listPos];
        int64_t const keyStart = j * p.blockSize;
        int64_t const keyEnd = blockKeyEnd(j, p, maxKey);
        for (int64_t key0 = keyStart; key0 < keyEnd; key0 += bn)
        {
            int64_t const n = min(static_cast<int64_t>(bn), keyEnd - key0);
            __syncthreads(); // the previous tile is consumed (and sQ/sAcc are written before the first)
            for (int64_t idx = threadIdx.x; idx < n * dk; idx += nThreads)
            {
                int64_t const r = idx / dk;
                int64_t const d = idx - r * dk;
                sK[idx] = toFloat(kBase[((b * p.T + key0 + r) * p.Hkv + kvh) * dk + d]);
            }
            for (int64_t idx = threadIdx.x; idx < n * dv; idx += nThreads)
            {
                int64_t const r = idx / dv;
                int64_t const d = idx - r * dv;
                sV[idx] = toFloat(vBase[((b * p.T + key0 + r) * p.Hkv + kvh) * dv + d]);
            }
            __syncthreads();
#pragma unroll
            for (int rr = 0; rr < kGEN_ROWS_PER_WARP; ++rr)
            {
                int64_t const r = warp * kGEN_ROWS_PER_WARP + rr;
                if (r >= nRows)
                {
                    continue;
                }
                int64_t const qPos = offset + s0 + r;
                int64_t const last = p.causal ? min(n, qPos - key0 + 1) : n; // keys of the tile this row sees
                float const* qr = sQ + r * dk;
                float* acc = sAcc + r * dv;
                for (int64_t kk = 0; kk < last; ++kk)
                {
                    float dot = 0.F;
                    for (int64_t d = lane; d < dk; d += 32)
                    {
                        dot = fmaf(qr[d], sK[kk * dk + d], dot);
                    }
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1)
                    {
                        dot += __shfl_xor_sync(0xffffffffU, dot, off);
                    }
                    float const s = dot * p.scale;
                    float const mNew = fmaxf(m[rr], s);
                    float const alpha = expf(m[rr] - mNew); // m = -inf on the first key gives 0
                    float const pr = expf(s - mNew);
                    l[rr] = l[rr] * alpha + pr;
                    for (int64_t d = lane; d < dv; d += 32)
                    {
                        acc[d] = fmaf(pr, sV[kk * dv + d], acc[d] * alpha);
                    }
                    m[rr] = mNew;
                }
            }
        }
    }
    __syncthreads(); // sAcc rows are written by every thread when no block is listed
    T* out = static_cast<T*>(p.out);
#pragma unroll
    for (int rr = 0; rr < kGEN_ROWS_PER_WARP; ++rr)
    {
        int64_t const r = warp * kGEN_ROWS_PER_WARP + rr;
        if (r >= nRows)
        {
            continue;
        }
        float const inv = l[rr] > 0.F ? 1.F / l[rr] : 0.F;
        for (int64_t d = lane; d < dv; d += 32)
        {
            out[((b * p.S + s0 + r) * p.H + h) * dv + d] = fromFloat<T>(sAcc[r * dv + d] * inv);
        }
    }
}

template <typename T>
int32_t launchGeneric(BlockSparseAttentionParams const& p, DeviceInfo const& dev, int64_t nkb, int64_t cap,
    cudaStream_t stream)
{
    size_t const list = listSmemBytes(nkb, cap, kGEN_WARPS * 32);
    size_t const budget = dev.maxSmemOptin < 48 * 1024 ? dev.maxSmemOptin : 48 * 1024;
    int64_t bn = 32;
    while (bn > 1 && genericTileSmemBytes(bn, p.Dk, p.Dv) + list > budget)
    {
        bn /= 2;
    }
    size_t const smem = genericTileSmemBytes(bn, p.Dk, p.Dv) + list;
    if (smem > dev.maxSmemOptin)
    {
        return setLastError(kUNSUPPORTED,
            "DSABlockSparseAttention: Dk + Dv = " + std::to_string(p.Dk + p.Dv) + " with " + std::to_string(nkb)
                + " key blocks and Kb = " + std::to_string(p.Kb) + " does not fit in shared memory");
    }
    auto kernel = blockSparseAttentionGenericKernel<T>;
    if (smem > 48 * 1024)
    {
        int32_t const st = checkCuda(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
            "cudaFuncSetAttribute(blockSparseAttentionGenericKernel)");
        if (st != kSUCCESS)
        {
            return st;
        }
    }
    int64_t const nqb = ceilDiv(p.S, p.blockSize);
    dim3 const grid(static_cast<uint32_t>(p.B * p.H * nqb), static_cast<uint32_t>(ceilDiv(p.blockSize, kGEN_ROWS)));
    kernel<<<grid, kGEN_WARPS * 32, smem, stream>>>(
        p, static_cast<int32_t>(nkb), static_cast<int32_t>(cap), static_cast<int32_t>(bn));
    return checkCuda(cudaGetLastError(), "blockSparseAttentionGenericKernel launch");
}

template <typename T, int WM, int NT>
int32_t launchTcInstance(BlockSparseAttentionParams const& p, TcConfig const& cfg, int64_t nkb, int64_t cap,
    cudaStream_t stream)
{
    auto kernel = blockSparseAttentionMmaKernel<T, WM, NT>;
    int32_t const st = checkCuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(cfg.smem)),
        "cudaFuncSetAttribute(blockSparseAttentionMmaKernel)");
    if (st != kSUCCESS)
    {
        return st;
    }
    int64_t const nqb = ceilDiv(p.S, p.blockSize);
    dim3 const grid(static_cast<uint32_t>(p.B * p.H * nqb), static_cast<uint32_t>(p.blockSize / (16 * WM)));
    kernel<<<grid, WM * 32, cfg.smem, stream>>>(p, cfg.stages, static_cast<int32_t>(nkb), static_cast<int32_t>(cap));
    return checkCuda(cudaGetLastError(), "blockSparseAttentionMmaKernel launch");
}

template <typename T, int WM>
int32_t launchTcDv(BlockSparseAttentionParams const& p, TcConfig const& cfg, int64_t nkb, int64_t cap,
    cudaStream_t stream)
{
    switch (p.Dv)
    {
    case 32: return launchTcInstance<T, WM, 4>(p, cfg, nkb, cap, stream);
    case 64: return launchTcInstance<T, WM, 8>(p, cfg, nkb, cap, stream);
    case 128: return launchTcInstance<T, WM, 16>(p, cfg, nkb, cap, stream);
    case 256: return launchTcInstance<T, WM, 32>(p, cfg, nkb, cap, stream);
    default: return setLastError(kUNSUPPORTED, "DSABlockSparseAttention: no tensor-core kernel for this Dv");
    }
}

template <typename T>
int32_t launchTc(BlockSparseAttentionParams const& p, TcConfig const& cfg, int64_t nkb, int64_t cap,
    cudaStream_t stream)
{
    switch (cfg.wm)
    {
    case 4: return launchTcDv<T, 4>(p, cfg, nkb, cap, stream);
    case 2: return launchTcDv<T, 2>(p, cfg, nkb, cap, stream);
    default: return launchTcDv<T, 1>(p, cfg, nkb, cap, stream);
    }
}

bool tcShapeOk(int64_t Dk, int64_t Dv, int64_t blockSize, DType dtype, int32_t smMajor)
{
    return dtype != DType::kFLOAT32 && smMajor >= 8 && Dk > 0 && Dk % 16 == 0 && Dk <= 256
        && (Dv == 32 || Dv == 64 || Dv == 128 || Dv == 256) && blockSize > 0 && blockSize % 16 == 0;
}

TcConfig pickTcConfig(int64_t Dk, int64_t Dv, int64_t blockSize, int64_t nkb, int64_t cap, size_t maxSmem)
{
    for (int32_t wm : {4, 2, 1})
    {
        if (blockSize % (16 * wm) != 0)
        {
            continue;
        }
        size_t const list = listSmemBytes(nkb, cap, 32 * wm);
        for (int32_t stages : {2, 1})
        {
            size_t const smem = tcTileSmemBytes(wm, stages, Dk, Dv) + list;
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

//! The launcher's kernel choice: the tensor-core configuration for these arguments on dev (nkb key
//! blocks, at most cap listed), or TcConfig{} (wm == 0) for the generic kernel when the shapes, the
//! dtype, the architecture, the alignment or the shared memory of every configuration (tiles plus
//! the canonical block list) rule the tensor-core kernel out. blockSparseAttentionPath() reports
//! the same decision.
TcConfig planTc(int64_t Dk, int64_t Dv, int64_t blockSize, int64_t nkb, int64_t cap, bool aligned, DType dtype,
    DeviceInfo const& dev)
{
    if (!aligned || !tcShapeOk(Dk, Dv, blockSize, dtype, dev.smMajor))
    {
        return TcConfig{};
    }
    return pickTcConfig(Dk, Dv, blockSize, nkb, cap, dev.maxSmemOptin);
}

} // namespace

int32_t blockSparseAttentionPath(int64_t Dk, int64_t Dv, int64_t blockSize, int64_t T, int64_t Kb, bool aligned,
    DType dtype, DeviceInfo const& dev)
{
    // The launcher only plans for T, Kb > 0 (otherwise it writes zeros without a kernel).
    int64_t const nkb = ceilDiv(T > 1 ? T : 1, blockSize);
    int64_t const cap = Kb < 1 ? 1 : (Kb < nkb ? Kb : nkb);
    return planTc(Dk, Dv, blockSize, nkb, cap, aligned, dtype, dev).wm != 0 ? 1 : 0;
}

int32_t launchBlockSparseAttention(BlockSparseAttentionParams const& p, DType dtype, cudaStream_t stream)
{
    if (!isValidDType(static_cast<int32_t>(dtype)))
    {
        return setLastError(
            kINVALID_ARGUMENT, "DSABlockSparseAttention: q, k and v must be float32, float16 or bfloat16");
    }
    if (p.B < 0 || p.S < 0 || p.T < 0 || p.Kb < 0 || p.H <= 0 || p.Hkv <= 0 || p.Dk <= 0 || p.Dv <= 0
        || p.blockSize <= 0)
    {
        return setLastError(kINVALID_ARGUMENT,
            "DSABlockSparseAttention: dimensions and block_size must be positive (B, S, T, Kb >= 0)");
    }
    if (p.H % p.Hkv != 0)
    {
        return setLastError(kINVALID_ARGUMENT,
            "DSABlockSparseAttention: H = " + std::to_string(p.H) + " is not a multiple of Hkv = "
                + std::to_string(p.Hkv));
    }
    if (p.B * p.S == 0)
    {
        return kSUCCESS;
    }
    if (p.q == nullptr || p.out == nullptr || (p.Kb > 0 && p.blockIndex == nullptr)
        || (p.T > 0 && (p.k == nullptr || p.v == nullptr)))
    {
        return setLastError(kINVALID_ARGUMENT, "DSABlockSparseAttention: a required pointer is null");
    }
    int64_t const nqb = ceilDiv(p.S, p.blockSize);
    int64_t const nkb = ceilDiv(p.T, p.blockSize);
    if (p.B * p.H * nqb > 0x7fffffffLL || p.blockSize > 65535LL * kGEN_ROWS || nkb > 0x7fffffffLL - 31)
    {
        return setLastError(kUNSUPPORTED, "DSABlockSparseAttention: B*H*ceil(S/block_size) exceeds the grid limits");
    }
    if (p.T == 0 || p.Kb == 0)
    {
        // No key can be listed: every row is 0.
        return checkCuda(cudaMemsetAsync(p.out, 0, static_cast<size_t>(p.B * p.S * p.H * p.Dv) * dtypeSize(dtype), stream),
            "cudaMemsetAsync(DSABlockSparseAttention out)");
    }
    DeviceInfo dev;
    if (!currentDeviceInfo(dev))
    {
        return kCUDA_ERROR;
    }
    int64_t const cap = p.Kb < nkb ? p.Kb : nkb; // distinct listed blocks at most
    bool const aligned = aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.out);
    TcConfig const cfg = planTc(p.Dk, p.Dv, p.blockSize, nkb, cap, aligned, dtype, dev);
    if (cfg.wm != 0)
    {
        return dtype == DType::kFLOAT16 ? launchTc<__half>(p, cfg, nkb, cap, stream)
                                        : launchTc<__nv_bfloat16>(p, cfg, nkb, cap, stream);
    }
    switch (dtype)
    {
    case DType::kFLOAT32: return launchGeneric<float>(p, dev, nkb, cap, stream);
    case DType::kFLOAT16: return launchGeneric<__half>(p, dev, nkb, cap, stream);
    case DType::kBFLOAT16: return launchGeneric<__nv_bfloat16>(p, dev, nkb, cap, stream);
    case DType::kFP8_E4M3: break; // rejected above
    }
    return setLastError(kINVALID_ARGUMENT, "DSABlockSparseAttention: unknown dtype");
}

} // namespace dsa
