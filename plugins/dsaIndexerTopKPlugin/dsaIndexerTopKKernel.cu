/*
 * DSAIndexerTopK kernels: a logits kernel that writes the scores of a bounded block of query rows
 * into an fp32 workspace [rows, T], then a per-row radix select.
 *
 * Logits, tensor-core path (fp16/bf16, sm_80+, D % 16 == 0, H <= 256): one CTA of 8 warps per
 * (group of QB query rows of one batch row, slice of 2048 keys). The CTA stages Q for QB*Hp rows
 * (heads padded to Hp = ceil16(H) with zeros, QB*Hp <= 256) in shared memory once and streams key
 * tiles of 64 rows (cp.async, double-buffered). Each warp owns up to two 16-row m-tiles of
 * (query, head) rows and all 64 keys, computes q.k with mma.sync m16n8k16 (fp32 accumulation),
 * then applies ReLU(scale * .), multiplies by w[b,s,h] and sums the 16 head rows with warp
 * shuffles; the m-tiles of one query (ceil16(H) / 16 of them) leave their sums in shared memory
 * and are added in ascending order, so the scores are bitwise reproducible. Only keys a row may
 * select (t < allowed(b,s)) are written; CTAs whose key slice lies beyond every row's limit exit.
 * Generic path (fp32 and other shapes): one thread per (query, key), fp32 dot products.
 *
 * Top-k: one CTA (512 threads) per query row. Rows with allowed <= topk are filled directly
 * (0..n-1, then -1) and need no scores. Otherwise a 4-pass 8-bit radix select over the
 * order-preserving uint32 image of the fp32 scores finds the exact k-th largest value; a final
 * ordered pass writes every key above it and the lowest-index keys equal to it (ties break toward
 * the lower key index, as the CPU reference does), each at its block-wide rank in key order: the
 * keys above the k-th score in ascending key index, then the selected ties in ascending key index,
 * so the order of a row's indices depends only on the inputs. Histograms live in shared memory with
 * warp-aggregated atomics (__match_any_sync), so rows full of equal scores stay fast; warp 0 finds
 * the bin of the k-th key with a __shfl_up_sync prefix scan over the 256 bins (8 per lane).
 *
 * Workspace: rows * T * 4 bytes, rows = min(B*S, 256 MiB / (4T)) by default; the launcher walks
 * the (b, s) rows in chunks of whatever fits in the workspace it is given.
 */
#include "dsaIndexerTopKKernel.h"

#include "common/dsaMma.cuh"

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dsa
{
namespace
{

template <typename T>
constexpr DType dtypeOf()
{
    return std::is_same<T, float>::value ? DType::kFLOAT32
                                         : (std::is_same<T, __half>::value ? DType::kFLOAT16 : DType::kBFLOAT16);
}

constexpr int32_t kIX_BN = 64;          // keys per tile
constexpr int32_t kIX_THREADS = 256;    // logits CTA
constexpr int32_t kIX_TSPLIT = 2048;    // keys per logits CTA
constexpr int32_t kIX_MAX_ROWS = 256;   // (query, head) rows per logits CTA
constexpr int32_t kTOPK_THREADS = 512;  // top-k CTA
constexpr int32_t kGEN_THREADS = 256;   // generic logits CTA

struct Chunk
{
    int64_t b0{0};   // first batch row
    int64_t nb{1};   // batch rows in this chunk (gridDim.z)
    int64_t s0{0};   // first query row
    int64_t sc{0};   // query rows per batch row in this chunk
    float* ws{nullptr};
};

//! Number of keys query s of batch row b may select; rows that need no scores (<= topk) still
//! report their true count.
__device__ __forceinline__ int64_t allowedKeys(IndexerTopKParams const& p, int64_t b, int64_t s)
{
    int64_t lim = p.causal ? p.T - p.S + s + 1 : p.T;
    if (p.lengths != nullptr)
    {
        int64_t const len = p.lengths[b];
        lim = len < lim ? len : lim;
    }
    lim = lim < 0 ? 0 : lim;
    return lim > p.T ? p.T : lim;
}

//! Keys whose scores the logits kernel must produce for row (b, s): 0 when the row needs no select.
__device__ __forceinline__ int64_t scoredKeys(IndexerTopKParams const& p, int64_t b, int64_t s)
{
    int64_t const n = allowedKeys(p, b, s);
    return n > p.topk ? n : 0;
}

size_t logitsSmemBytes(int64_t qb, int64_t hp, int64_t d)
{
    int64_t const rows = qb * hp;
    int64_t const ldq = d + 8;
    // Q and two key tiles (16-bit), w per row, one partial score row of the tile per m-tile, limits.
    return static_cast<size_t>(rows * ldq + 2 * kIX_BN * ldq) * 2
        + static_cast<size_t>(rows + (rows / 16) * kIX_BN) * sizeof(float) + static_cast<size_t>(qb) * sizeof(int32_t);
}

template <typename T, typename TW>
__global__ void __launch_bounds__(kIX_THREADS) indexerLogitsMmaKernel(IndexerTopKParams p, Chunk ch, int32_t qb)
{
    constexpr int BN = kIX_BN;
    extern __shared__ __align__(16) unsigned char smemRaw[];
    int const d = static_cast<int>(p.D);
    int const ldq = d + 8;
    int const hp = static_cast<int>((p.H + 15) / 16 * 16);
    int const rows = qb * hp;
    int const mTiles = rows / 16;
    T* sQ = reinterpret_cast<T*>(smemRaw);
    T* sK = sQ + rows * ldq;
    float* sW = reinterpret_cast<float*>(sK + 2 * BN * ldq);
    float* sPart = sW + rows; // [mTiles][BN]: each m-tile's head sum of the tile's keys
    int* sLim = reinterpret_cast<int*>(sPart + mTiles * BN);

    int const tid = threadIdx.x;
    int const warp = tid >> 5;
    int const lane = tid & 31;
    int const g = lane >> 2;
    int const c = lane & 3;
    int64_t const b = ch.b0 + blockIdx.z;
    int64_t const sBase = ch.s0 + static_cast<int64_t>(blockIdx.x) * qb;
    int64_t const sEnd = ch.s0 + ch.sc;

    for (int qi = tid; qi < qb; qi += kIX_THREADS)
    {
        int64_t const s = sBase + qi;
        sLim[qi] = s < sEnd ? static_cast<int>(scoredKeys(p, b, s)) : 0;
    }
    __syncthreads();
    int maxLim = 0;
    for (int qi = 0; qi < qb; ++qi)
    {
        maxLim = max(maxLim, sLim[qi]);
    }
    int64_t const tBeg = static_cast<int64_t>(blockIdx.y) * kIX_TSPLIT;
    int64_t const tEnd = min(static_cast<int64_t>(maxLim), tBeg + kIX_TSPLIT);
    if (tBeg >= tEnd)
    {
        return;
    }

    T const* q = static_cast<T const*>(p.q);
    T const* k = static_cast<T const*>(p.k);
    TW const* w = static_cast<TW const*>(p.w);
    int const chunks = d / 8;
    // Rows of query slots without scores to compute (sLim == 0: past the chunk's last query row,
    // as in the QB - 1 empty slots at decode, or a row that needs no select) are not staged: their
    // m-tiles are skipped below, so nothing reads them. Padding heads (h >= H) of a live query are
    // zero-filled, since they share its m-tiles.
    for (int i = tid; i < rows * chunks; i += kIX_THREADS)
    {
        int const r = i / chunks;
        int const cc = i - r * chunks;
        int const qi = r / hp;
        int const h = r - qi * hp;
        if (sLim[qi] == 0)
        {
            continue;
        }
        bool const valid = h < p.H;
        T const* src = valid ? q + ((b * p.S + sBase + qi) * p.H + h) * p.D + cc * 8 : q;
        mma::cpAsync16(sQ + r * ldq + cc * 8, src, valid);
    }
    for (int r = tid; r < rows; r += kIX_THREADS)
    {
        int const qi = r / hp;
        int const h = r - qi * hp;
        if (sLim[qi] == 0)
        {
            continue;
        }
        sW[r] = h < p.H ? toFloat(w[(b * p.S + sBase + qi) * p.H + h]) : 0.F;
    }

    T const* kBatch = k + b * p.T * p.D;
    auto loadKeys = [&](int64_t t0, int buf) {
        T* dst = sK + buf * BN * ldq;
        for (int i = tid; i < BN * chunks; i += kIX_THREADS)
        {
            int const r = i / chunks;
            int const cc = i - r * chunks;
            int64_t const t = t0 + r;
            bool const valid = t < tEnd;
            mma::cpAsync16(dst + r * ldq + cc * 8, valid ? kBatch + t * p.D + cc * 8 : kBatch, valid);
        }
    };

    int64_t const nTiles = (tEnd - tBeg + BN - 1) / BN;
    loadKeys(tBeg, 0);
    mma::cpAsyncCommit();

    // Warp w owns m-tiles w and w + 8 and computes those whose query has scores to produce. An
    // m-tile never spans two queries (hp is a multiple of 16), so a query slot is skipped by whole
    // m-tiles and the fragments of the computed ones are unchanged. At decode (S = 1, one live
    // slot of QB) this computes ceil16(H) / 16 m-tiles instead of all QB * ceil16(H) / 16 (4 of 16
    // for 64 heads). mt0 is the first tile the warp computes (has0), mt1 the second (has1: both live).
    int const mtPerQuery = hp / 16;
    bool const live0 = warp < mTiles && sLim[warp / mtPerQuery] > 0;
    bool const live1 = warp + 8 < mTiles && sLim[(warp + 8) / mtPerQuery] > 0;
    bool const has0 = live0 || live1;
    bool const has1 = live0 && live1;
    int const mt0 = live0 ? warp : warp + 8;
    int const mt1 = warp + 8;
    float const scale = p.scale;

    for (int64_t tile = 0; tile < nTiles; ++tile)
    {
        int const buf = static_cast<int>(tile & 1);
        int64_t const t0 = tBeg + tile * BN;
        if (tile + 1 < nTiles)
        {
            loadKeys(t0 + BN, buf ^ 1);
            mma::cpAsyncCommit();
            mma::cpAsyncWait<1>();
        }
        else
        {
            mma::cpAsyncWait<0>();
        }
        __syncthreads();

        T const* kS = sK + buf * BN * ldq;
        float acc[2][8][4];
#pragma unroll
        for (int i = 0; i < 2; ++i)
        {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
            {
                acc[i][nt][0] = acc[i][nt][1] = acc[i][nt][2] = acc[i][nt][3] = 0.F;
            }
        }
        if (has0)
        {
            T const* a0Row = sQ + (mt0 * 16 + (lane & 15)) * ldq + (lane >> 4) * 8;
            T const* a1Row = sQ + (mt1 * 16 + (lane & 15)) * ldq + (lane >> 4) * 8;
            T const* bRow = kS + ((lane & 7) + ((lane >> 4) << 3)) * ldq + ((lane >> 3) & 1) * 8;
            for (int kk = 0; kk < d; kk += 16)
            {
                uint32_t a0[4];
                uint32_t a1[4];
                mma::ldmatrixX4(a0, a0Row + kk);
                if (has1)
                {
                    mma::ldmatrixX4(a1, a1Row + kk);
                }
#pragma unroll
                for (int np = 0; np < 4; ++np)
                {
                    uint32_t bf[4];
                    mma::ldmatrixX4(bf, bRow + np * 16 * ldq + kk);
                    mma::mma16816<T>(acc[0][2 * np], a0, bf[0], bf[1]);
                    mma::mma16816<T>(acc[0][2 * np + 1], a0, bf[2], bf[3]);
                    if (has1)
                    {
                        mma::mma16816<T>(acc[1][2 * np], a1, bf[0], bf[1]);
                        mma::mma16816<T>(acc[1][2 * np + 1], a1, bf[2], bf[3]);
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
        {
            bool const has = i == 0 ? has0 : has1;
            if (!has)
            {
                continue;
            }
            int const mt = i == 0 ? mt0 : mt1;
            int const r0 = mt * 16 + g;
            float const w0 = sW[r0];
            float const w1 = sW[r0 + 8];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
            {
                float cs0 = w0 * fmaxf(acc[i][nt][0] * scale, 0.F) + w1 * fmaxf(acc[i][nt][2] * scale, 0.F);
                float cs1 = w0 * fmaxf(acc[i][nt][1] * scale, 0.F) + w1 * fmaxf(acc[i][nt][3] * scale, 0.F);
#pragma unroll
                for (int off = 4; off < 32; off <<= 1)
                {
                    cs0 += __shfl_xor_sync(0xffffffffU, cs0, off);
                    cs1 += __shfl_xor_sync(0xffffffffU, cs1, off);
                }
                if (g == 0)
                {
                    // One writer per (m-tile, key): every entry is rewritten for every tile.
                    sPart[mt * BN + nt * 8 + 2 * c] = cs0;
                    sPart[mt * BN + nt * 8 + 2 * c + 1] = cs1;
                }
            }
        }
        __syncthreads();
        // A query's m-tiles (hp / 16 of them) are summed in ascending order, so its scores have the
        // same bits on every run (shared-memory float atomics would add them in arrival order).
        // Queries with sLim == 0 (whose m-tiles were skipped) read nothing here.
        for (int i = tid; i < qb * BN; i += kIX_THREADS)
        {
            int const qi = i / BN;
            int const col = i - qi * BN;
            int64_t const t = t0 + col;
            if (t < sLim[qi])
            {
                float const* part = sPart + qi * mtPerQuery * BN + col;
                float score = part[0];
                for (int m = 1; m < mtPerQuery; ++m)
                {
                    score += part[m * BN];
                }
                int64_t const row = static_cast<int64_t>(blockIdx.z) * ch.sc + (sBase + qi - ch.s0);
                ch.ws[row * p.T + t] = score;
            }
        }
    }
    mma::cpAsyncWait<0>();
}

template <typename T, typename TW>
__global__ void __launch_bounds__(kGEN_THREADS) indexerLogitsGenericKernel(IndexerTopKParams p, Chunk ch)
{
    int64_t const b = ch.b0 + blockIdx.z;
    int64_t const s = ch.s0 + blockIdx.x;
    int64_t const lim = scoredKeys(p, b, s);
    int64_t const t = static_cast<int64_t>(blockIdx.y) * kGEN_THREADS + threadIdx.x;
    if (t >= lim)
    {
        return;
    }
    T const* qRow = static_cast<T const*>(p.q) + (b * p.S + s) * p.H * p.D;
    T const* kRow = static_cast<T const*>(p.k) + (b * p.T + t) * p.D;
    TW const* wRow = static_cast<TW const*>(p.w) + (b * p.S + s) * p.H;
    float score = 0.F;
    for (int64_t h = 0; h < p.H; ++h)
    {
        float dot = 0.F;
        T const* qh = qRow + h * p.D;
        for (int64_t e = 0; e < p.D; ++e)
        {
            dot = fmaf(toFloat(qh[e]), toFloat(kRow[e]), dot);
        }
        score = fmaf(toFloat(wRow[h]), fmaxf(dot * p.scale, 0.F), score);
    }
    int64_t const row = static_cast<int64_t>(blockIdx.z) * ch.sc + blockIdx.x;
    ch.ws[row * p.T + t] = score;
}

//! Order-preserving map of fp32 bits to uint32 (larger float -> larger key; -0 maps like +0).
__device__ __forceinline__ uint32_t orderedKey(float v)
{
    // -0 and +0 compare equal in the reference; adding +0 turns -0 into +0 (not folded without fast-math).
    uint32_t const u = __float_as_uint(v + 0.0F);
    return (u & 0x80000000U) ? ~u : (u | 0x80000000U);
}

__global__ void __launch_bounds__(kTOPK_THREADS) indexerTopKSelectKernel(IndexerTopKParams p, Chunk ch)
{
    constexpr int NW = kTOPK_THREADS / 32;
    __shared__ uint32_t sHist[256];
    __shared__ uint32_t sPrefix;
    __shared__ uint32_t sMask;
    __shared__ int64_t sRemaining;
    __shared__ int32_t sWarpGt[NW];
    __shared__ int32_t sWarpEq[NW];

    int const tid = threadIdx.x;
    int const lane = tid & 31;
    int const warp = tid >> 5;
    int64_t const b = ch.b0 + blockIdx.y;
    int64_t const s = ch.s0 + blockIdx.x;
    int64_t const n = allowedKeys(p, b, s);
    int32_t* out = p.out + (b * p.S + s) * p.topk;

    if (n <= p.topk)
    {
        for (int64_t i = tid; i < p.topk; i += kTOPK_THREADS)
        {
            out[i] = i < n ? static_cast<int32_t>(i) : -1;
        }
        return;
    }

    float const* scores = ch.ws + (static_cast<int64_t>(blockIdx.y) * ch.sc + blockIdx.x) * p.T;
    if (tid == 0)
    {
        sPrefix = 0;
        sMask = 0;
        sRemaining = p.topk;
    }
    uint32_t prefix = 0;
    uint32_t mask = 0;
    for (int pass = 0; pass < 4; ++pass)
    {
        int const shift = 24 - 8 * pass;
        for (int i = tid; i < 256; i += kTOPK_THREADS)
        {
            sHist[i] = 0;
        }
        __syncthreads();
        prefix = sPrefix;
        mask = sMask;
        for (int64_t base = 0; base < n; base += kTOPK_THREADS)
        {
            int64_t const t = base + tid;
            uint32_t bin = 256; // "no bin"
            if (t < n)
            {
                uint32_t const key = orderedKey(scores[t]);
                if ((key & mask) == prefix)
                {
                    bin = (key >> shift) & 255U;
                }
            }
            uint32_t const peers = __match_any_sync(0xffffffffU, bin);
            if (bin < 256 && lane == __ffs(peers) - 1)
            {
                atomicAdd(sHist + bin, static_cast<uint32_t>(__popc(peers)));
            }
        }
        __syncthreads();
        if (warp == 0)
        {
            // The bin of the k-th largest key: scanning down from bin 255, the first bin whose count
            // brings the keys at or above it to `need`, i.e. the one bin with
            // above(bin) < need <= above(bin) + hist[bin], above(bin) = the keys in higher bins.
            // Warp 0 finds it in parallel: lane l owns the 8 bins 255 - 8l down to 248 - 8l, an
            // inclusive prefix sum of the lanes' totals (__shfl_up_sync, lanes in descending bin
            // order) gives each lane the keys above its first bin, and the lane holding the crossing
            // walks its 8 bins. Counts stay below n < 2^31 (checked by the launcher).
            uint32_t const need = static_cast<uint32_t>(sRemaining);
            int const hi = 255 - 8 * lane;
            uint32_t cnt[8];
            uint32_t laneTotal = 0;
#pragma unroll
            for (int i = 0; i < 8; ++i)
            {
                cnt[i] = sHist[hi - i];
                laneTotal += cnt[i];
            }
            uint32_t inclusive = laneTotal;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1)
            {
                uint32_t const other = __shfl_up_sync(0xffffffffU, inclusive, off);
                inclusive += lane >= off ? other : 0U;
            }
            uint32_t above = inclusive - laneTotal;
            if (above < need && need <= inclusive)
            {
#pragma unroll
                for (int i = 0; i < 8; ++i)
                {
                    if (above < need && need <= above + cnt[i])
                    {
                        sPrefix = prefix | (static_cast<uint32_t>(hi - i) << shift);
                        sMask = mask | (255U << shift);
                        sRemaining = need - above;
                    }
                    above += cnt[i];
                }
            }
        }
        __syncthreads();
    }
    uint32_t const kth = sPrefix;          // exact key of the k-th largest score
    int64_t const needEq = sRemaining;     // how many keys equal to kth are selected (>= 1)
    int64_t const countGt = p.topk - needEq; // exactly the number of keys above kth

    // Output pass in key order. Every key above kth and the first needEq keys equal to it are
    // placed by their rank in key order, counted block-wide (ballot + popc within a warp, the warp
    // totals of this step in shared memory, running totals across steps): slots [0, countGt) hold
    // the keys above kth in ascending key index, slots [countGt, topk) the selected ties in
    // ascending key index. The order depends only on the scores, never on thread timing.
    uint32_t const lanesBelow = (1U << lane) - 1U;
    int32_t gtBase = 0; // ranks are below n <= T < 2^31 (checked by the launcher)
    int32_t eqBase = 0;
    for (int64_t base = 0; base < n; base += kTOPK_THREADS)
    {
        int64_t const t = base + tid;
        uint32_t const key = t < n ? orderedKey(scores[t]) : 0U;
        bool const gt = t < n && key > kth;
        bool const eq = t < n && key == kth;
        uint32_t const ballotGt = __ballot_sync(0xffffffffU, gt);
        uint32_t const ballotEq = __ballot_sync(0xffffffffU, eq);
        if (lane == 0)
        {
            sWarpGt[warp] = __popc(ballotGt);
            sWarpEq[warp] = __popc(ballotEq);
        }
        __syncthreads();
        int32_t beforeGt = 0; // counts of one step: at most kTOPK_THREADS
        int32_t beforeEq = 0;
        int32_t totalGt = 0;
        int32_t totalEq = 0;
        for (int wi = 0; wi < NW; ++wi)
        {
            int const cntGt = sWarpGt[wi];
            int const cntEq = sWarpEq[wi];
            beforeGt += wi < warp ? cntGt : 0;
            beforeEq += wi < warp ? cntEq : 0;
            totalGt += cntGt;
            totalEq += cntEq;
        }
        if (gt)
        {
            out[gtBase + beforeGt + __popc(ballotGt & lanesBelow)] = static_cast<int32_t>(t);
        }
        if (eq)
        {
            int32_t const rank = eqBase + beforeEq + __popc(ballotEq & lanesBelow);
            if (rank < needEq)
            {
                out[countGt + rank] = static_cast<int32_t>(t);
            }
        }
        gtBase += totalGt;
        eqBase += totalEq;
        __syncthreads();
    }
}

bool tcShapeOk(int64_t H, int64_t D, DType dtype, int32_t smMajor)
{
    return dtype != DType::kFLOAT32 && smMajor >= 8 && D % 16 == 0 && D > 0 && H > 0 && (H + 15) / 16 * 16 <= kIX_MAX_ROWS;
}

bool aligned16(void const* ptr)
{
    return (reinterpret_cast<uintptr_t>(ptr) & 15U) == 0;
}

//! The logits kernel of a launch: tensor-core (with qb query rows per CTA and smem bytes of shared
//! memory) or generic.
struct LogitsPlan
{
    bool tc{false};
    int64_t qb{1};
    size_t smem{0};
};

//! The launcher's logits-kernel choice for these arguments on dev: the tensor-core kernel when the
//! dtype, shapes, architecture and alignment allow it and a CTA of at least one query row fits in
//! the device's shared memory, else the generic kernel. indexerTopKPath() reports the same decision.
LogitsPlan planLogits(int64_t H, int64_t D, DType dtype, bool aligned, DeviceInfo const& dev)
{
    LogitsPlan plan;
    if (!aligned || !tcShapeOk(H, D, dtype, dev.smMajor))
    {
        return plan;
    }
    int64_t const hp = (H + 15) / 16 * 16;
    int64_t qb = kIX_MAX_ROWS / hp;
    while (qb > 1 && logitsSmemBytes(qb, hp, D) > dev.maxSmemOptin)
    {
        qb /= 2;
    }
    size_t const smem = logitsSmemBytes(qb, hp, D);
    if (smem <= dev.maxSmemOptin)
    {
        plan.tc = true;
        plan.qb = qb;
        plan.smem = smem;
    }
    return plan;
}

//! Enqueues the tensor-core logits kernel; float inputs never take this path.
template <typename T, typename TW>
int32_t launchLogitsMma(IndexerTopKParams const& p, Chunk const& ch, int64_t qb, size_t smem, cudaStream_t stream)
{
    if constexpr (std::is_same<T, float>::value)
    {
        return setLastError(kUNSUPPORTED, "DSAIndexerTopK: no tensor-core kernel for float32");
    }
    else
    {
        dim3 const grid(static_cast<uint32_t>(ceilDiv(ch.sc, qb)), static_cast<uint32_t>(ceilDiv(p.T, kIX_TSPLIT)),
            static_cast<uint32_t>(ch.nb));
        indexerLogitsMmaKernel<T, TW><<<grid, kIX_THREADS, smem, stream>>>(p, ch, static_cast<int32_t>(qb));
        return checkCuda(cudaGetLastError(), "indexerLogitsMmaKernel launch");
    }
}

template <typename T, typename TW>
int32_t setLogitsMmaSmem(size_t smem)
{
    if constexpr (std::is_same<T, float>::value)
    {
        return setLastError(kUNSUPPORTED, "DSAIndexerTopK: no tensor-core kernel for float32");
    }
    else
    {
        return checkCuda(cudaFuncSetAttribute(indexerLogitsMmaKernel<T, TW>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
            "cudaFuncSetAttribute(indexerLogitsMmaKernel)");
    }
}

template <typename T, typename TW>
int32_t launchChunk(IndexerTopKParams const& p, Chunk const& ch, bool tc, int64_t qb, size_t smem, cudaStream_t stream)
{
    if (tc)
    {
        int32_t const st = launchLogitsMma<T, TW>(p, ch, qb, smem, stream);
        if (st != kSUCCESS)
        {
            return st;
        }
    }
    else
    {
        dim3 const grid(static_cast<uint32_t>(ch.sc), static_cast<uint32_t>(ceilDiv(p.T, kGEN_THREADS)),
            static_cast<uint32_t>(ch.nb));
        indexerLogitsGenericKernel<T, TW><<<grid, kGEN_THREADS, 0, stream>>>(p, ch);
        int32_t const st = checkCuda(cudaGetLastError(), "indexerLogitsGenericKernel launch");
        if (st != kSUCCESS)
        {
            return st;
        }
    }
    dim3 const grid(static_cast<uint32_t>(ch.sc), static_cast<uint32_t>(ch.nb));
    indexerTopKSelectKernel<<<grid, kTOPK_THREADS, 0, stream>>>(p, ch);
    return checkCuda(cudaGetLastError(), "indexerTopKSelectKernel launch");
}

template <typename T, typename TW>
int32_t launchTyped(IndexerTopKParams const& p, DeviceInfo const& dev, void* workspace, size_t workspaceBytes,
    cudaStream_t stream)
{
    LogitsPlan const plan = planLogits(p.H, p.D, dtypeOf<T>(), aligned16(p.q) && aligned16(p.k), dev);
    bool const tc = plan.tc;
    int64_t const qb = plan.qb;
    size_t const smem = plan.smem;
    if (tc)
    {
        int32_t const st = setLogitsMmaSmem<T, TW>(smem);
        if (st != kSUCCESS)
        {
            return st;
        }
    }
    int64_t const wsRows = static_cast<int64_t>(workspaceBytes / (static_cast<size_t>(p.T) * sizeof(float)));
    Chunk ch;
    ch.ws = static_cast<float*>(workspace);
    if (wsRows >= p.S)
    {
        int64_t const nbMax = wsRows / p.S < p.B ? wsRows / p.S : p.B;
        for (int64_t b0 = 0; b0 < p.B; b0 += nbMax)
        {
            ch.b0 = b0;
            ch.nb = p.B - b0 < nbMax ? p.B - b0 : nbMax;
            ch.s0 = 0;
            ch.sc = p.S;
            int32_t const st = launchChunk<T, TW>(p, ch, tc, qb, smem, stream);
            if (st != kSUCCESS)
            {
                return st;
            }
        }
        return kSUCCESS;
    }
    for (int64_t b0 = 0; b0 < p.B; ++b0)
    {
        for (int64_t s0 = 0; s0 < p.S; s0 += wsRows)
        {
            ch.b0 = b0;
            ch.nb = 1;
            ch.s0 = s0;
            ch.sc = p.S - s0 < wsRows ? p.S - s0 : wsRows;
            int32_t const st = launchChunk<T, TW>(p, ch, tc, qb, smem, stream);
            if (st != kSUCCESS)
            {
                return st;
            }
        }
    }
    return kSUCCESS;
}

} // namespace

size_t indexerTopKMinWorkspaceSize(int64_t T)
{
    return T <= 0 ? 0 : alignUp(static_cast<size_t>(T) * sizeof(float), 256);
}

size_t indexerTopKWorkspaceSize(int64_t B, int64_t S, int64_t T, int64_t /*H*/, int64_t /*D*/, int64_t /*topk*/)
{
    // min(all scores, budget), but at least one row. Monotone in B, S and T, so the size computed
    // for a profile's maximum shapes covers every smaller shape (the plugin relies on that).
    if (B <= 0 || S <= 0 || T <= 0)
    {
        return 0;
    }
    size_t const rowBytes = static_cast<size_t>(T) * sizeof(float);
    size_t const all = static_cast<size_t>(B) * static_cast<size_t>(S) * rowBytes;
    size_t bytes = all < kINDEXER_WORKSPACE_BUDGET ? all : kINDEXER_WORKSPACE_BUDGET;
    bytes = bytes < rowBytes ? rowBytes : bytes;
    return alignUp(bytes, 256);
}

int32_t indexerTopKPath(int64_t H, int64_t D, DType dtype, bool aligned, DeviceInfo const& dev)
{
    return planLogits(H, D, dtype, aligned, dev).tc ? 1 : 0;
}

int32_t launchIndexerTopK(IndexerTopKParams const& p, DType dtype, DType wDtype, void* workspace,
    size_t workspaceBytes, cudaStream_t stream)
{
    if (p.B < 0 || p.S < 0 || p.T < 0 || p.topk < 0 || p.H <= 0 || p.D <= 0)
    {
        return setLastError(kINVALID_ARGUMENT, "DSAIndexerTopK: H and D must be positive and B, S, T, topk >= 0");
    }
    if (!isValidDType(static_cast<int32_t>(dtype)))
    {
        return setLastError(kINVALID_ARGUMENT, "DSAIndexerTopK: q and k must be float32, float16 or bfloat16");
    }
    if (wDtype != dtype && wDtype != DType::kFLOAT32)
    {
        return setLastError(kINVALID_ARGUMENT, "DSAIndexerTopK: w must have the dtype of q or float32");
    }
    if (p.B * p.S == 0 || p.topk == 0)
    {
        return kSUCCESS;
    }
    if (p.out == nullptr || p.q == nullptr || p.w == nullptr || (p.T > 0 && p.k == nullptr))
    {
        return setLastError(kINVALID_ARGUMENT, "DSAIndexerTopK: a required pointer is null");
    }
    if (p.topk > 0x7fffffffLL || p.T > 0x7fffffffLL || p.S > 0x7fffffffLL || p.B > 65535)
    {
        return setLastError(kUNSUPPORTED, "DSAIndexerTopK: B, S, T or topk exceeds the kernel limits");
    }
    if (workspaceBytes < indexerTopKMinWorkspaceSize(p.T) || (p.T > 0 && workspace == nullptr))
    {
        return setLastError(kWORKSPACE_TOO_SMALL,
            "DSAIndexerTopK: the workspace must hold at least one row of T fp32 scores ("
                + std::to_string(indexerTopKMinWorkspaceSize(p.T)) + " bytes)");
    }
    DeviceInfo dev;
    if (!currentDeviceInfo(dev))
    {
        return kCUDA_ERROR;
    }
    if (p.T == 0)
    {
        // Nothing to score: every row is all -1; the select kernel fills it without reading scores.
        Chunk ch;
        ch.b0 = 0;
        ch.nb = p.B;
        ch.s0 = 0;
        ch.sc = p.S;
        dim3 const grid(static_cast<uint32_t>(p.S), static_cast<uint32_t>(p.B));
        indexerTopKSelectKernel<<<grid, kTOPK_THREADS, 0, stream>>>(p, ch);
        return checkCuda(cudaGetLastError(), "indexerTopKSelectKernel launch");
    }
    bool const wSame = wDtype == dtype;
    switch (dtype)
    {
    case DType::kFLOAT32: return launchTyped<float, float>(p, dev, workspace, workspaceBytes, stream);
    case DType::kFLOAT16:
        return wSame ? launchTyped<__half, __half>(p, dev, workspace, workspaceBytes, stream)
                     : launchTyped<__half, float>(p, dev, workspace, workspaceBytes, stream);
    case DType::kBFLOAT16:
        return wSame ? launchTyped<__nv_bfloat16, __nv_bfloat16>(p, dev, workspace, workspaceBytes, stream)
                     : launchTyped<__nv_bfloat16, float>(p, dev, workspace, workspaceBytes, stream);
    case DType::kFP8_E4M3: break; // rejected above
    }
    return setLastError(kINVALID_ARGUMENT, "DSAIndexerTopK: unknown dtype");
}

} // namespace dsa
