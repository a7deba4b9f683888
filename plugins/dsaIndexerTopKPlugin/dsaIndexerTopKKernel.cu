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

#include <cuda_fp8.h>

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
// Multi-block top-k (few long rows): 2048-bin histograms of key splits, merged per row, then a gather
// of the keys above the boundary bin and of its candidates, and a radix select among the candidates.
constexpr int32_t kMB_BINS = 2048;
constexpr int64_t kMB_MAX_ROWS = 8;     // rows (B*S) the multi-block top-k takes in one launch
constexpr int64_t kMB_MIN_T = 8192;     // automatic choice: keys per row from which it pays off
constexpr int64_t kMB_MIN_SPLIT = 512;  // keys per histogram CTA at least (sizes the workspace)
constexpr int32_t kMB_CAND_SMEM = 4096; // boundary-bin candidates the final CTA stages in shared memory
constexpr int32_t kMB_META = 4;         // per row: boundary bin, keys above it, candidates, unused

//! Top-k mode forced for tests (indexerTopKSetSelectMode); 0 = the launcher's choice.
int32_t gSelectMode = 0;
//! FP8 keys: 1 = e4m3 MMA with q quantized (indexerTopKSetFp8Mma) where the device and shapes allow it.
int32_t gFp8Mma = 0;

struct Chunk
{
    int64_t b0{0};   // first batch row
    int64_t nb{1};   // batch rows in this chunk (gridDim.z)
    int64_t s0{0};   // first query row
    int64_t sc{0};   // query rows per batch row in this chunk
    float* ws{nullptr};
};

//! Multi-block top-k state of one launch (all B*S rows, at most kMB_MAX_ROWS), in the workspace after the
//! score rows. Per row: hist [nSplitMax][2048], meta [kMB_META], bases [nSplitMax][2] (exclusive
//! prefixes over splits of the keys above the boundary bin and of its candidates), gt [topk] (keys
//! above the boundary bin, ascending), g2 [topk] (candidates above the k-th key, ascending), cand [T]
//! (the boundary bin's keys, ascending).
struct MultiBlock
{
    uint32_t* hist{nullptr};
    int32_t* meta{nullptr};
    int32_t* bases{nullptr};
    int32_t* gt{nullptr};
    int32_t* g2{nullptr};
    int32_t* cand{nullptr};
    int64_t split{kMB_MIN_SPLIT}; // keys per histogram / gather CTA
    int64_t nSplitMax{1};         // ceil(T / kMB_MIN_SPLIT): hist and bases rows per row
    int32_t candCap{kMB_CAND_SMEM};
};

//! Logical position of query s of batch row b: query_start[b] + s (paged), T - S + s (contiguous).
__device__ __forceinline__ int64_t queryPosition(IndexerTopKParams const& p, int64_t b, int64_t s)
{
    return p.queryStart != nullptr ? static_cast<int64_t>(p.queryStart[b]) + s : p.T - p.S + s;
}

//! Pool row of logical key t of batch row b, -1 when its page entry is invalid (paged); b * T + t
//! for a contiguous k.
__device__ __forceinline__ int64_t keySlot(IndexerTopKParams const& p, int64_t b, int64_t t)
{
    if (p.blockTable == nullptr)
    {
        return b * p.T + t;
    }
    int64_t const page = p.blockTable[b * p.M + t / p.page];
    return page >= 0 && page < p.P ? page * p.page + t % p.page : -1;
}

//! Whether logical key t (< allowed) of row b may be selected: its page entry is valid.
__device__ __forceinline__ bool keyValid(IndexerTopKParams const& p, int64_t b, int64_t t)
{
    if (p.blockTable == nullptr)
    {
        return true;
    }
    int32_t const page = p.blockTable[b * p.M + t / p.page];
    return page >= 0 && page < p.P;
}

//! Number of keys query s of batch row b may select (a prefix [0, n) of the logical keys, of which the
//! paged form skips those of invalid pages); rows that need no scores (<= topk) still report it.
__device__ __forceinline__ int64_t allowedKeys(IndexerTopKParams const& p, int64_t b, int64_t s)
{
    int64_t lim = p.causal ? queryPosition(p, b, s) + 1 : p.T;
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

size_t logitsSmemBytes(int64_t qb, int64_t hp, int64_t d, bool fp8Keys = false, bool q8 = false)
{
    int64_t const rows = qb * hp;
    int64_t const elemBytes = q8 ? 1 : 2;
    int64_t const ldq = d + 16 / elemBytes;
    // Q and two key tiles (16-bit, or e4m3 codes for the FP8 MMA), w per row, one partial score row of
    // the tile per m-tile, limits; FP8 keys add the two tiles' per-token scales, the FP8 MMA the
    // (query, head) rows' scales.
    return static_cast<size_t>(rows * ldq + 2 * kIX_BN * ldq) * static_cast<size_t>(elemBytes)
        + static_cast<size_t>(rows + (rows / 16) * kIX_BN) * sizeof(float) + static_cast<size_t>(qb) * sizeof(int32_t)
        + (fp8Keys ? static_cast<size_t>(2 * kIX_BN) * sizeof(float) : 0)
        + (q8 ? static_cast<size_t>(rows) * sizeof(float) : 0);
}

//! Power-of-two scale of a block of q values with largest magnitude amax: the smallest 2^e with
//! amax / 2^e <= 448 (e4m3's largest finite value) when amax / 448 is not a power of two, twice that
//! when it is (frexp's convention); 1 for an all-zero block.
__device__ __forceinline__ float q8Scale(float amax)
{
    if (!(amax > 0.F))
    {
        return 1.F;
    }
    int e = 0;
    (void) frexpf(amax / 448.F, &e);
    return ldexpf(1.F, e);
}

//! One k-step of the logits MMA: m16n8k16 in T, or m16n8k32 on e4m3 codes (sm_89+).
template <typename T, bool kQ8>
__device__ __forceinline__ void mmaStep(float (&c)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    if constexpr (kQ8)
    {
#if defined(DSA_CUDA_EMULATION) || !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
        __trap(); // the launcher takes this path on sm_89+ only
#endif
    }
    else
    {
        mma::mma16816<T>(c, a, b0, b1);
    }
}

//! float value of an e4m3fn code.
__device__ __forceinline__ float fp8ToFloat(uint8_t v)
{
    __half_raw const h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
    return __half2float(__half(h));
}

//! Key element e of pool row `slot` as float: the element itself, or decode(code) * the token's scale.
template <typename TK>
__device__ __forceinline__ float keyElement(IndexerTopKParams const& p, TK const* kRow, int64_t slot, int64_t e)
{
    if constexpr (std::is_same<TK, uint8_t>::value)
    {
        return fp8ToFloat(kRow[e]) * p.kScale[slot];
    }
    else
    {
        return toFloat(kRow[e]);
    }
}

// TK: the key pool's element type, T (float pools, contiguous k) or uint8_t (e4m3fn codes with one
// float32 scale per token, kept out of the MMA: logit = scale_t * (q . decode(code_t)), applied in
// the fp32 epilogue; decode(code) is exact in fp16 and bf16).
// kQ8 (FP8 keys, sm_89+, D <= 128): q is quantized to e4m3 with one power-of-two scale per (query,
// head) row (DeepGEMM's FP8 MQA logits), the key codes are copied as they are, and the MMA is
// m16n8k32 on e4m3; logit = scale_q * scale_t * (code_q . code_t) in the fp32 epilogue. Operand
// addressing is the same in bytes as for 16-bit T (16 bytes per ldmatrix row, 32 bytes per k-step).
template <typename T, typename TW, typename TK, bool kQ8 = false>
__global__ void __launch_bounds__(kIX_THREADS) indexerLogitsMmaKernel(IndexerTopKParams p, Chunk ch, int32_t qb)
{
    constexpr int BN = kIX_BN;
    constexpr bool kFP8 = std::is_same<TK, uint8_t>::value;
    using TS = typename std::conditional<kQ8, uint8_t, T>::type; // shared-memory operand type
    constexpr int kVec = 16 / static_cast<int>(sizeof(TS));      // operand elements per 16 bytes
    extern __shared__ __align__(16) unsigned char smemRaw[];
    int const d = static_cast<int>(p.D);
    int const ldq = d + kVec;
    int const hp = static_cast<int>((p.H + 15) / 16 * 16);
    int const rows = qb * hp;
    int const mTiles = rows / 16;
    TS* sQ = reinterpret_cast<TS*>(smemRaw);
    TS* sK = sQ + rows * ldq;
    float* sW = reinterpret_cast<float*>(sK + 2 * BN * ldq);
    float* sPart = sW + rows; // [mTiles][BN]: each m-tile's head sum of the tile's keys
    int* sLim = reinterpret_cast<int*>(sPart + mTiles * BN);
    float* sKs = reinterpret_cast<float*>(sLim + qb); // [2][BN] per-token key scales (FP8 keys only)
    float* sQs = sKs + 2 * BN;                        // [rows] q scales (kQ8 only)

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
    TW const* w = static_cast<TW const*>(p.w);
    int const chunks = d / 8;
    // Rows of query slots without scores to compute (sLim == 0: past the chunk's last query row,
    // as in the QB - 1 empty slots at decode, or a row that needs no select) are not staged: their
    // m-tiles are skipped below, so nothing reads them. Padding heads (h >= H) of a live query are
    // zero-filled, since they share its m-tiles.
    if constexpr (kQ8)
    {
        // One thread per (query, head) row: its scale from the row's largest magnitude, then its codes
        // (q / 2^e rounded to nearest e4m3, exact division; padding heads are zero codes).
        for (int r = tid; r < rows; r += kIX_THREADS)
        {
            int const qi = r / hp;
            int const h = r - qi * hp;
            if (sLim[qi] == 0)
            {
                continue;
            }
            TS* dst = sQ + r * ldq;
            if (h >= p.H)
            {
                for (int e = 0; e < d; ++e)
                {
                    dst[e] = 0;
                }
                sQs[r] = 0.F;
                continue;
            }
            T const* src = q + ((b * p.S + sBase + qi) * p.H + h) * p.D;
            float amax = 0.F;
            for (int e = 0; e < d; ++e)
            {
                amax = fmaxf(amax, fabsf(toFloat(src[e])));
            }
            float const qs = q8Scale(amax);
            float const inv = 1.F / qs; // a power of two: exact
            for (int e = 0; e < d; ++e)
            {
                dst[e] = static_cast<TS>(__nv_cvt_float_to_fp8(toFloat(src[e]) * inv, __NV_SATFINITE, __NV_E4M3));
            }
            sQs[r] = qs;
        }
    }
    else
    {
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

    TK const* kPool = static_cast<TK const*>(p.k);
    // Keys past the CTA's range or of an invalid page are zero-filled, never read (a page no row names
    // may hold NaN). Float keys travel by cp.async; FP8 codes are loaded 16 at a time, decoded into T
    // in registers and stored to shared memory, with their tokens' scales (the barrier at the top of
    // the tile loop publishes both, as it publishes the cp.async copies).
    auto loadKeys = [&](int64_t t0, int buf) {
        TS* dst = sK + buf * BN * ldq;
        if constexpr (kQ8)
        {
            int const chunks16 = d / 16;
            for (int i = tid; i < BN * chunks16; i += kIX_THREADS)
            {
                int const r = i / chunks16;
                int const cc = i - r * chunks16;
                int64_t const t = t0 + r;
                int64_t const slot = t < tEnd ? keySlot(p, b, t) : -1;
                bool const valid = slot >= 0;
                mma::cpAsync16(dst + r * ldq + cc * 16, valid ? kPool + slot * p.D + cc * 16 : kPool, valid);
                if (cc == 0)
                {
                    sKs[buf * BN + r] = valid ? p.kScale[slot] : 0.F;
                }
            }
        }
        else if constexpr (kFP8)
        {
            int const chunks16 = d / 16;
            for (int i = tid; i < BN * chunks16; i += kIX_THREADS)
            {
                int const r = i / chunks16;
                int const cc = i - r * chunks16;
                int64_t const t = t0 + r;
                int64_t const slot = t < tEnd ? keySlot(p, b, t) : -1;
                uint4 raw = make_uint4(0U, 0U, 0U, 0U);
                if (slot >= 0)
                {
                    raw = *reinterpret_cast<uint4 const*>(kPool + slot * p.D + cc * 16);
                }
                uint32_t const words[4] = {raw.x, raw.y, raw.z, raw.w};
                uint32_t packed[8];
#pragma unroll
                for (int j = 0; j < 8; ++j)
                {
                    uint32_t const pair = (words[j >> 1] >> (16 * (j & 1))) & 0xffffU;
                    packed[j] = mma::packPair<T>(fp8ToFloat(static_cast<uint8_t>(pair & 0xffU)),
                        fp8ToFloat(static_cast<uint8_t>(pair >> 8)));
                }
                T* row = dst + r * ldq + cc * 16;
                *reinterpret_cast<uint4*>(row) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
                *reinterpret_cast<uint4*>(row + 8) = make_uint4(packed[4], packed[5], packed[6], packed[7]);
                if (cc == 0)
                {
                    sKs[buf * BN + r] = slot >= 0 ? p.kScale[slot] : 0.F;
                }
            }
        }
        else
        {
            for (int i = tid; i < BN * chunks; i += kIX_THREADS)
            {
                int const r = i / chunks;
                int const cc = i - r * chunks;
                int64_t const t = t0 + r;
                int64_t const slot = t < tEnd ? keySlot(p, b, t) : -1;
                bool const valid = slot >= 0;
                mma::cpAsync16(dst + r * ldq + cc * 8, valid ? kPool + slot * p.D + cc * 8 : kPool, valid);
            }
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

        TS const* kS = sK + buf * BN * ldq;
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
            TS const* a0Row = sQ + (mt0 * 16 + (lane & 15)) * ldq + (lane >> 4) * kVec;
            TS const* a1Row = sQ + (mt1 * 16 + (lane & 15)) * ldq + (lane >> 4) * kVec;
            TS const* bRow = kS + ((lane & 7) + ((lane >> 4) << 3)) * ldq + ((lane >> 3) & 1) * kVec;
            for (int kk = 0; kk < d; kk += 2 * kVec)
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
                    mmaStep<T, kQ8>(acc[0][2 * np], a0, bf[0], bf[1]);
                    mmaStep<T, kQ8>(acc[0][2 * np + 1], a0, bf[2], bf[3]);
                    if (has1)
                    {
                        mmaStep<T, kQ8>(acc[1][2 * np], a1, bf[0], bf[1]);
                        mmaStep<T, kQ8>(acc[1][2 * np + 1], a1, bf[2], bf[3]);
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
                float sc0 = scale;
                float sc1 = scale;
                if constexpr (kFP8)
                {
                    sc0 = scale * sKs[buf * BN + nt * 8 + 2 * c];
                    sc1 = scale * sKs[buf * BN + nt * 8 + 2 * c + 1];
                }
                if constexpr (kQ8)
                {
                    // the rows' q scales (rows r0 and r0 + 8 of the m-tile)
                    acc[i][nt][0] *= sQs[r0];
                    acc[i][nt][1] *= sQs[r0];
                    acc[i][nt][2] *= sQs[r0 + 8];
                    acc[i][nt][3] *= sQs[r0 + 8];
                }
                float cs0 = w0 * fmaxf(acc[i][nt][0] * sc0, 0.F) + w1 * fmaxf(acc[i][nt][2] * sc0, 0.F);
                float cs1 = w0 * fmaxf(acc[i][nt][1] * sc1, 0.F) + w1 * fmaxf(acc[i][nt][3] * sc1, 0.F);
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

template <typename T, typename TW, typename TK>
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
    int64_t const slot = keySlot(p, b, t);
    if (slot < 0)
    {
        return; // a key of an invalid page: never read, never selected (the top-k skips it)
    }
    T const* qRow = static_cast<T const*>(p.q) + (b * p.S + s) * p.H * p.D;
    TK const* kRow = static_cast<TK const*>(p.k) + slot * p.D;
    TW const* wRow = static_cast<TW const*>(p.w) + (b * p.S + s) * p.H;
    float score = 0.F;
    for (int64_t h = 0; h < p.H; ++h)
    {
        float dot = 0.F;
        T const* qh = qRow + h * p.D;
        for (int64_t e = 0; e < p.D; ++e)
        {
            dot = fmaf(toFloat(qh[e]), keyElement(p, kRow, slot, e), dot);
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

constexpr int kTOPK_WARPS = kTOPK_THREADS / 32;

//! Exact ordered key of the need-th largest element among the elements i < count for which
//! keyOf(i, key) is true (1 <= need <= their number), by a 4-pass 8-bit radix select. On return (after
//! a barrier) sPrefix holds that key and sRemaining how many elements equal to it are selected (>= 1).
template <typename KeyOf>
__device__ void radixSelectKth(int64_t const n, int64_t const need0, KeyOf keyOf, uint32_t* sHist,
    uint32_t& sPrefix, uint32_t& sMask, int64_t& sRemaining)
{
    int const tid = threadIdx.x;
    int const lane = tid & 31;
    int const warp = tid >> 5;
    if (tid == 0)
    {
        sPrefix = 0;
        sMask = 0;
        sRemaining = need0;
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
            uint32_t key = 0;
            if (t < n && keyOf(t, key))
            {
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
}

//! One ordered pass over the elements i < n: classify(i, gt, eq) marks each; every gt element is
//! handed to emitGt(rank, i) and the first needEq eq elements to emitEq(rank, i), rank = the
//! element's block-wide rank in index order among its class (ballot + popc within a warp, the warp
//! totals of this step in shared memory, running totals across steps), so the result depends only on
//! the inputs, never on thread timing. Ranks stay below n < 2^31 (checked by the launcher).
template <typename Classify, typename EmitGt, typename EmitEq>
__device__ void rankedPass(int64_t const n, int64_t const needEq, Classify classify, EmitGt emitGt, EmitEq emitEq,
    int32_t* sWarpGt, int32_t* sWarpEq)
{
    int const tid = threadIdx.x;
    int const lane = tid & 31;
    int const warp = tid >> 5;
    uint32_t const lanesBelow = (1U << lane) - 1U;
    int32_t gtBase = 0;
    int32_t eqBase = 0;
    for (int64_t base = 0; base < n; base += kTOPK_THREADS)
    {
        int64_t const t = base + tid;
        bool gt = false;
        bool eq = false;
        if (t < n)
        {
            classify(t, gt, eq);
        }
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
        for (int wi = 0; wi < kTOPK_WARPS; ++wi)
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
            emitGt(gtBase + beforeGt + __popc(ballotGt & lanesBelow), t);
        }
        if (eq)
        {
            int32_t const rank = eqBase + beforeEq + __popc(ballotEq & lanesBelow);
            if (rank < needEq)
            {
                emitEq(rank, t);
            }
        }
        gtBase += totalGt;
        eqBase += totalEq;
        __syncthreads();
    }
}

//! Rows whose selectable keys all fit in topk (valid = the n allowed keys, less those of invalid pages
//! in the paged form): the valid keys in ascending order, then -1. Returns false (no output) when the
//! row needs a select. Contiguous rows with n <= topk read nothing; paged rows count their valid keys
//! from the block table (never from the scores).
__device__ bool writeRowWithoutSelect(IndexerTopKParams const& p, int64_t b, int64_t n, int32_t* out,
    uint32_t& sCount, int32_t* sWarpGt, int32_t* sWarpEq)
{
    int const tid = threadIdx.x;
    if (p.blockTable == nullptr)
    {
        if (n > p.topk)
        {
            return false;
        }
        for (int64_t i = tid; i < p.topk; i += kTOPK_THREADS)
        {
            out[i] = i < n ? static_cast<int32_t>(i) : -1;
        }
        return true;
    }
    if (tid == 0)
    {
        sCount = 0;
    }
    __syncthreads();
    uint32_t local = 0;
    for (int64_t j = tid; j * p.page < n; j += kTOPK_THREADS)
    {
        if (keyValid(p, b, j * p.page))
        {
            int64_t const left = n - j * p.page;
            local += static_cast<uint32_t>(left < p.page ? left : p.page);
        }
    }
    if (local > 0)
    {
        atomicAdd(&sCount, local);
    }
    __syncthreads();
    int64_t const nValid = sCount;
    __syncthreads(); // sCount is reused by the next row's caller only after every thread has read it
    if (nValid > p.topk)
    {
        return false;
    }
    rankedPass(
        n, 0, [&](int64_t t, bool& gt, bool& eq) { gt = keyValid(p, b, t); eq = false; },
        [&](int32_t rank, int64_t t) { out[rank] = static_cast<int32_t>(t); }, [](int32_t, int64_t) {}, sWarpGt,
        sWarpEq);
    for (int64_t i = nValid + tid; i < p.topk; i += kTOPK_THREADS)
    {
        out[i] = -1;
    }
    return true;
}

__global__ void __launch_bounds__(kTOPK_THREADS) indexerTopKSelectKernel(IndexerTopKParams p, Chunk ch)
{
    __shared__ uint32_t sHist[256];
    __shared__ uint32_t sPrefix;
    __shared__ uint32_t sMask;
    __shared__ int64_t sRemaining;
    __shared__ int32_t sWarpGt[kTOPK_WARPS];
    __shared__ int32_t sWarpEq[kTOPK_WARPS];
    __shared__ uint32_t sCount;

    int64_t const b = ch.b0 + blockIdx.y;
    int64_t const s = ch.s0 + blockIdx.x;
    int64_t const n = allowedKeys(p, b, s);
    int32_t* out = p.out + (b * p.S + s) * p.topk;

    if (writeRowWithoutSelect(p, b, n, out, sCount, sWarpGt, sWarpEq))
    {
        return;
    }

    float const* scores = ch.ws + (static_cast<int64_t>(blockIdx.y) * ch.sc + blockIdx.x) * p.T;
    radixSelectKth(
        n, p.topk,
        [&](int64_t t, uint32_t& key) {
            if (!keyValid(p, b, t))
            {
                return false;
            }
            key = orderedKey(scores[t]);
            return true;
        },
        sHist, sPrefix, sMask, sRemaining);
    uint32_t const kth = sPrefix;            // exact key of the k-th largest score
    int64_t const needEq = sRemaining;       // how many keys equal to kth are selected (>= 1)
    int64_t const countGt = p.topk - needEq; // exactly the number of keys above kth

    // Output pass in key order: slots [0, countGt) hold the keys above kth in ascending key index,
    // slots [countGt, topk) the selected ties (the lowest-index keys equal to kth) in ascending key index.
    rankedPass(
        n, needEq,
        [&](int64_t t, bool& gt, bool& eq) {
            if (keyValid(p, b, t))
            {
                uint32_t const key = orderedKey(scores[t]);
                gt = key > kth;
                eq = key == kth;
            }
        },
        [&](int32_t rank, int64_t t) { out[rank] = static_cast<int32_t>(t); },
        [&](int32_t rank, int64_t t) { out[countGt + rank] = static_cast<int32_t>(t); }, sWarpGt, sWarpEq);
}

// ---- multi-block top-k (few long rows) ------------------------------------------------------------
// TensorRT-LLM's radix design: (1) each CTA of a row's key splits histograms its keys into 2048 bins
// of a coarse monotone image of the score (the top 11 bits of the order-preserving image of its
// fp16 rounding), (2) one CTA per row sums the splits' histograms and finds the boundary bin holding
// the k-th key, with each split's output offsets, (3) each split writes its keys above the boundary
// bin and the bin's candidates in key order, (4) one CTA per row selects the exact k-th key among the
// candidates (staged in shared memory when they fit) by the same radix select as the one-CTA top-k
// and merges the two ascending lists by rank: the same selection and the same order as the one-CTA
// top-k (the keys above the k-th in ascending index, then the lowest-index ties).

//! Coarse bin of a score: monotone non-decreasing in orderedKey(v) (NaNs with the sign bit clear above
//! +inf, with it set below -inf, as orderedKey orders them).
__device__ __forceinline__ uint32_t coarseBin(float v)
{
    uint32_t const u = __float_as_uint(v + 0.0F);
    if ((u & 0x7fffffffU) > 0x7f800000U)
    {
        return (u & 0x80000000U) ? 0U : static_cast<uint32_t>(kMB_BINS - 1);
    }
    uint32_t const h = __half_as_ushort(__float2half_rn(v + 0.0F));
    uint32_t const o = (h & 0x8000U) ? (~h & 0xffffU) : (h | 0x8000U);
    return o >> 5;
}

//! Row r of a multi-block launch (every row of the call: b0 = s0 = 0).
__device__ __forceinline__ void mbRow(IndexerTopKParams const& p, int64_t r, int64_t& b, int64_t& s)
{
    b = r / p.S;
    s = r - b * p.S;
}

__global__ void __launch_bounds__(kTOPK_THREADS) topkSplitHistogramKernel(IndexerTopKParams p, Chunk ch, MultiBlock mb)
{
    __shared__ uint32_t sBins[kMB_BINS];
    int const tid = threadIdx.x;
    int const lane = tid & 31;
    int64_t const r = blockIdx.y;
    int64_t b = 0;
    int64_t s = 0;
    mbRow(p, r, b, s);
    int64_t const n = allowedKeys(p, b, s);
    int64_t const t0 = static_cast<int64_t>(blockIdx.x) * mb.split;
    if (n <= p.topk || t0 >= n)
    {
        return;
    }
    int64_t const t1 = n < t0 + mb.split ? n : t0 + mb.split;
    for (int i = tid; i < kMB_BINS; i += kTOPK_THREADS)
    {
        sBins[i] = 0;
    }
    __syncthreads();
    float const* scores = ch.ws + r * p.T;
    for (int64_t base = t0; base < t1; base += kTOPK_THREADS)
    {
        int64_t const t = base + tid;
        uint32_t bin = kMB_BINS; // "no bin"
        if (t < t1 && keyValid(p, b, t))
        {
            bin = coarseBin(scores[t]);
        }
        uint32_t const peers = __match_any_sync(0xffffffffU, bin);
        if (bin < kMB_BINS && lane == __ffs(peers) - 1)
        {
            atomicAdd(sBins + bin, static_cast<uint32_t>(__popc(peers)));
        }
    }
    __syncthreads();
    uint32_t* dst = mb.hist + r * mb.nSplitMax * kMB_BINS + static_cast<int64_t>(blockIdx.x) * kMB_BINS;
    for (int i = tid; i < kMB_BINS; i += kTOPK_THREADS)
    {
        dst[i] = sBins[i];
    }
}

__global__ void __launch_bounds__(kTOPK_THREADS) topkMergeHistogramsKernel(IndexerTopKParams p, MultiBlock mb)
{
    constexpr int kPER = kMB_BINS / kTOPK_THREADS; // bins per thread
    __shared__ uint32_t sWarpSum[kTOPK_WARPS];
    __shared__ int32_t sBin;
    __shared__ uint32_t sAbove;
    __shared__ uint32_t sInBin;
    int const tid = threadIdx.x;
    int const lane = tid & 31;
    int const warp = tid >> 5;
    int64_t const r = blockIdx.x;
    int64_t b = 0;
    int64_t s = 0;
    mbRow(p, r, b, s);
    int64_t const n = allowedKeys(p, b, s);
    if (n <= p.topk)
    {
        return;
    }
    int64_t const nSplit = (n + mb.split - 1) / mb.split;
    uint32_t const* hist = mb.hist + r * mb.nSplitMax * kMB_BINS;
    // Thread i owns the bins 2047 - kPER*i down to 2048 - kPER*(i+1): threads in descending bin order.
    int const hi = kMB_BINS - 1 - kPER * tid;
    uint32_t cnt[kPER];
    uint32_t total = 0;
#pragma unroll
    for (int i = 0; i < kPER; ++i)
    {
        uint32_t c = 0;
        for (int64_t sp = 0; sp < nSplit; ++sp)
        {
            c += hist[sp * kMB_BINS + hi - i];
        }
        cnt[i] = c;
        total += c;
    }
    uint32_t inclusive = total;
#pragma unroll
    for (int off = 1; off <= 16; off *= 2)
    {
        uint32_t const other = __shfl_up_sync(0xffffffffU, inclusive, off);
        inclusive += lane >= off ? other : 0U;
    }
    if (lane == 31)
    {
        sWarpSum[warp] = inclusive;
    }
    if (tid == 0)
    {
        sBin = -1;
        sAbove = 0;
        sInBin = 0;
    }
    __syncthreads();
    uint32_t valid = 0; // the row's selectable keys (allowed, valid page)
    uint32_t warpBase = 0;
    for (int wi = 0; wi < kTOPK_WARPS; ++wi)
    {
        valid += sWarpSum[wi];
        warpBase += wi < warp ? sWarpSum[wi] : 0U;
    }
    uint32_t const need = static_cast<uint32_t>(p.topk);
    uint32_t above = warpBase + inclusive - total; // keys in bins above this thread's first bin
    if (valid > need && above < need && need <= above + total)
    {
#pragma unroll
        for (int i = 0; i < kPER; ++i)
        {
            if (above < need && need <= above + cnt[i])
            {
                sBin = hi - i;
                sAbove = above;
                sInBin = cnt[i];
            }
            above += cnt[i];
        }
    }
    __syncthreads();
    // No boundary bin (bin -1) when every selectable key is selected: all of them count as "above".
    int32_t const bin = sBin;
    int32_t* meta = mb.meta + r * kMB_META;
    if (tid == 0)
    {
        meta[0] = bin;
        meta[1] = static_cast<int32_t>(bin < 0 ? valid : sAbove);
        meta[2] = static_cast<int32_t>(bin < 0 ? 0U : sInBin);
        meta[3] = 0;
    }
    // Each split's keys above the boundary bin and in it (a warp per split), then their exclusive
    // prefixes in split order: where each split writes its part of the two ascending lists.
    int32_t* bases = mb.bases + r * 2 * mb.nSplitMax;
    for (int64_t j = warp; j < nSplit; j += kTOPK_WARPS)
    {
        uint32_t const* h = hist + j * kMB_BINS;
        uint32_t g = 0;
        for (int k = bin + 1 + lane; k < kMB_BINS; k += 32)
        {
            g += h[k];
        }
        for (int off = 16; off > 0; off >>= 1)
        {
            g += __shfl_xor_sync(0xffffffffU, g, off);
        }
        if (lane == 0)
        {
            bases[2 * j] = static_cast<int32_t>(g);
            bases[2 * j + 1] = bin >= 0 ? static_cast<int32_t>(h[bin]) : 0;
        }
    }
    __syncthreads();
    if (tid == 0)
    {
        int32_t gtRun = 0;
        int32_t candRun = 0;
        for (int64_t j = 0; j < nSplit; ++j)
        {
            int32_t const g = bases[2 * j];
            int32_t const c = bases[2 * j + 1];
            bases[2 * j] = gtRun;
            bases[2 * j + 1] = candRun;
            gtRun += g;
            candRun += c;
        }
    }
}

__global__ void __launch_bounds__(kTOPK_THREADS) topkSplitGatherKernel(IndexerTopKParams p, Chunk ch, MultiBlock mb)
{
    __shared__ int32_t sWarpGt[kTOPK_WARPS];
    __shared__ int32_t sWarpEq[kTOPK_WARPS];
    int64_t const r = blockIdx.y;
    int64_t b = 0;
    int64_t s = 0;
    mbRow(p, r, b, s);
    int64_t const n = allowedKeys(p, b, s);
    int64_t const t0 = static_cast<int64_t>(blockIdx.x) * mb.split;
    if (n <= p.topk || t0 >= n)
    {
        return;
    }
    int64_t const t1 = n < t0 + mb.split ? n : t0 + mb.split;
    int32_t const bin = mb.meta[r * kMB_META];
    int32_t const* bases = mb.bases + r * 2 * mb.nSplitMax + 2 * static_cast<int64_t>(blockIdx.x);
    int32_t* gt = mb.gt + r * p.topk + bases[0];
    int32_t* cand = mb.cand + r * p.T + bases[1];
    float const* scores = ch.ws + r * p.T;
    rankedPass(
        t1 - t0, p.T,
        [&](int64_t i, bool& isGt, bool& isEq) {
            int64_t const t = t0 + i;
            if (keyValid(p, b, t))
            {
                int32_t const kb = static_cast<int32_t>(coarseBin(scores[t]));
                isGt = kb > bin;
                isEq = kb == bin;
            }
        },
        [&](int32_t rank, int64_t i) { gt[rank] = static_cast<int32_t>(t0 + i); },
        [&](int32_t rank, int64_t i) { cand[rank] = static_cast<int32_t>(t0 + i); }, sWarpGt, sWarpEq);
}

//! Number of entries of the ascending list a[0, len) below v.
__device__ __forceinline__ int32_t lowerBound(int32_t const* a, int32_t len, int32_t v)
{
    int32_t lo = 0;
    int32_t hi = len;
    while (lo < hi)
    {
        int32_t const mid = (lo + hi) >> 1;
        if (a[mid] < v)
        {
            lo = mid + 1;
        }
        else
        {
            hi = mid;
        }
    }
    return lo;
}

__global__ void __launch_bounds__(kTOPK_THREADS) topkFinalSelectKernel(IndexerTopKParams p, Chunk ch, MultiBlock mb)
{
    extern __shared__ __align__(16) unsigned char candSmem[]; // [candCap] keys, then [candCap] indices
    __shared__ uint32_t sHist[256];
    __shared__ uint32_t sPrefix;
    __shared__ uint32_t sMask;
    __shared__ int64_t sRemaining;
    __shared__ int32_t sWarpGt[kTOPK_WARPS];
    __shared__ int32_t sWarpEq[kTOPK_WARPS];
    __shared__ uint32_t sCount;
    int const tid = threadIdx.x;
    int64_t const r = blockIdx.x;
    int64_t b = 0;
    int64_t s = 0;
    mbRow(p, r, b, s);
    int64_t const n = allowedKeys(p, b, s);
    int32_t* out = p.out + r * p.topk;
    if (n <= p.topk)
    {
        writeRowWithoutSelect(p, b, n, out, sCount, sWarpGt, sWarpEq);
        return;
    }
    int32_t const* meta = mb.meta + r * kMB_META;
    int32_t const bin = meta[0];
    int32_t const countAbove = meta[1];
    int32_t const candCount = meta[2];
    int32_t const* gt = mb.gt + r * p.topk;
    int32_t* g2 = mb.g2 + r * p.topk;
    int32_t const* cand = mb.cand + r * p.T;
    if (bin < 0)
    {
        for (int64_t i = tid; i < p.topk; i += kTOPK_THREADS)
        {
            out[i] = i < countAbove ? gt[i] : -1;
        }
        return;
    }
    float const* scores = ch.ws + r * p.T;
    uint32_t* sKey = reinterpret_cast<uint32_t*>(candSmem);
    int32_t* sIdx = reinterpret_cast<int32_t*>(sKey + mb.candCap);
    bool const staged = candCount <= mb.candCap;
    if (staged)
    {
        for (int32_t i = tid; i < candCount; i += kTOPK_THREADS)
        {
            int32_t const t = cand[i];
            sIdx[i] = t;
            sKey[i] = orderedKey(scores[t]);
        }
        __syncthreads();
    }
    auto candKey = [&](int64_t i) { return staged ? sKey[i] : orderedKey(scores[cand[i]]); };
    auto candIdx = [&](int64_t i) { return staged ? sIdx[i] : cand[i]; };
    int64_t const need = p.topk - countAbove; // >= 1: the k-th key lies in the boundary bin
    radixSelectKth(
        candCount, need,
        [&](int64_t i, uint32_t& key) {
            key = candKey(i);
            return true;
        },
        sHist, sPrefix, sMask, sRemaining);
    uint32_t const kth = sPrefix;
    int64_t const needEq = sRemaining;
    int32_t const candGt = static_cast<int32_t>(need - needEq); // candidates above the k-th key
    int64_t const countGt = countAbove + candGt;
    rankedPass(
        candCount, needEq,
        [&](int64_t i, bool& isGt, bool& isEq) {
            uint32_t const key = candKey(i);
            isGt = key > kth;
            isEq = key == kth;
        },
        [&](int32_t rank, int64_t i) { g2[rank] = candIdx(i); },
        [&](int32_t rank, int64_t i) { out[countGt + rank] = candIdx(i); }, sWarpGt, sWarpEq);
    // The keys above the k-th: the merge of the two ascending lists, each entry at its rank.
    for (int32_t i = tid; i < countAbove; i += kTOPK_THREADS)
    {
        int32_t const v = gt[i];
        out[i + lowerBound(g2, candGt, v)] = v;
    }
    for (int32_t i = tid; i < candGt; i += kTOPK_THREADS)
    {
        int32_t const v = g2[i];
        out[i + lowerBound(gt, countAbove, v)] = v;
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
    bool q8{false}; // FP8 MMA (q quantized to e4m3)
    int64_t qb{1};
    size_t smem{0};
};

//! The launcher's logits-kernel choice for these arguments on dev: the tensor-core kernel when the
//! dtype, shapes, architecture and alignment allow it and a CTA of at least one query row fits in
//! the device's shared memory, else the generic kernel. indexerTopKPath() reports the same decision.
LogitsPlan planLogits(int64_t H, int64_t D, DType dtype, bool aligned, DeviceInfo const& dev, bool fp8Keys = false)
{
    LogitsPlan plan;
    if (!aligned || !tcShapeOk(H, D, dtype, dev.smMajor))
    {
        return plan;
    }
    int64_t const hp = (H + 15) / 16 * 16;
    bool const q8 = fp8Keys && gFp8Mma != 0 && dev.smMajor * 10 + dev.smMinor >= 89 && D % 32 == 0 && D <= 128;
    int64_t qb = kIX_MAX_ROWS / hp;
    while (qb > 1 && logitsSmemBytes(qb, hp, D, fp8Keys, q8) > dev.maxSmemOptin)
    {
        qb /= 2;
    }
    size_t const smem = logitsSmemBytes(qb, hp, D, fp8Keys, q8);
    if (smem <= dev.maxSmemOptin)
    {
        plan.tc = true;
        plan.q8 = q8;
        plan.qb = qb;
        plan.smem = smem;
    }
    return plan;
}

//! Enqueues the tensor-core logits kernel; float inputs never take this path.
template <typename T, typename TW, typename TK>
int32_t launchLogitsMma(IndexerTopKParams const& p, Chunk const& ch, bool q8, int64_t qb, size_t smem,
    cudaStream_t stream)
{
    if constexpr (std::is_same<T, float>::value)
    {
        return setLastError(kUNSUPPORTED, "DSAIndexerTopK: no tensor-core kernel for float32");
    }
    else
    {
        dim3 const grid(static_cast<uint32_t>(ceilDiv(ch.sc, qb)), static_cast<uint32_t>(ceilDiv(p.T, kIX_TSPLIT)),
            static_cast<uint32_t>(ch.nb));
        if (q8)
        {
            if constexpr (std::is_same<TK, uint8_t>::value)
            {
                indexerLogitsMmaKernel<T, TW, TK, true>
                    <<<grid, kIX_THREADS, smem, stream>>>(p, ch, static_cast<int32_t>(qb));
            }
        }
        else
        {
            indexerLogitsMmaKernel<T, TW, TK><<<grid, kIX_THREADS, smem, stream>>>(p, ch, static_cast<int32_t>(qb));
        }
        return checkCuda(cudaGetLastError(), "indexerLogitsMmaKernel launch");
    }
}

template <typename T, typename TW, typename TK>
int32_t setLogitsMmaSmem(size_t smem, bool q8)
{
    if constexpr (std::is_same<T, float>::value)
    {
        return setLastError(kUNSUPPORTED, "DSAIndexerTopK: no tensor-core kernel for float32");
    }
    else
    {
        if constexpr (std::is_same<TK, uint8_t>::value)
        {
            if (q8)
            {
                return checkCuda(cudaFuncSetAttribute(indexerLogitsMmaKernel<T, TW, TK, true>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                    "cudaFuncSetAttribute(indexerLogitsMmaKernel)");
            }
        }
        return checkCuda(cudaFuncSetAttribute(indexerLogitsMmaKernel<T, TW, TK>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
            "cudaFuncSetAttribute(indexerLogitsMmaKernel)");
    }
}

template <typename T, typename TW, typename TK>
int32_t launchLogits(IndexerTopKParams const& p, Chunk const& ch, LogitsPlan const& plan, cudaStream_t stream)
{
    if (plan.tc)
    {
        return launchLogitsMma<T, TW, TK>(p, ch, plan.q8, plan.qb, plan.smem, stream);
    }
    dim3 const grid(static_cast<uint32_t>(ch.sc), static_cast<uint32_t>(ceilDiv(p.T, kGEN_THREADS)),
        static_cast<uint32_t>(ch.nb));
    indexerLogitsGenericKernel<T, TW, TK><<<grid, kGEN_THREADS, 0, stream>>>(p, ch);
    return checkCuda(cudaGetLastError(), "indexerLogitsGenericKernel launch");
}

template <typename T, typename TW, typename TK>
int32_t launchChunk(IndexerTopKParams const& p, Chunk const& ch, LogitsPlan const& plan, cudaStream_t stream)
{
    int32_t const st = launchLogits<T, TW, TK>(p, ch, plan, stream);
    if (st != kSUCCESS)
    {
        return st;
    }
    dim3 const grid(static_cast<uint32_t>(ch.sc), static_cast<uint32_t>(ch.nb));
    indexerTopKSelectKernel<<<grid, kTOPK_THREADS, 0, stream>>>(p, ch);
    return checkCuda(cudaGetLastError(), "indexerTopKSelectKernel launch");
}

//! Workspace of the multi-block top-k for `rows` rows of T keys, after the rows' scores.
size_t multiBlockAuxBytes(int64_t rows, int64_t T, int64_t topk)
{
    int64_t const nSplitMax = (T + kMB_MIN_SPLIT - 1) / kMB_MIN_SPLIT;
    int64_t const perRow = nSplitMax * kMB_BINS + kMB_META + 2 * nSplitMax + 2 * topk + T;
    return alignUp(static_cast<size_t>(rows * perRow) * sizeof(int32_t), 256);
}

size_t scoreRowsBytes(int64_t rows, int64_t T)
{
    return alignUp(static_cast<size_t>(rows) * static_cast<size_t>(T) * sizeof(float), 256);
}

//! Multi-block top-k of every row of the call (b0 = s0 = 0, all B*S rows, scores in ch.ws).
int32_t launchSelectMultiBlock(IndexerTopKParams const& p, Chunk const& ch, int32_t mode, DeviceInfo const& dev,
    cudaStream_t stream)
{
    int64_t const rows = p.B * p.S;
    MultiBlock mb;
    mb.nSplitMax = (p.T + kMB_MIN_SPLIT - 1) / kMB_MIN_SPLIT;
    if (mode == 0)
    {
        // About two CTAs per SM over all rows, at least 2048 keys per CTA (the merge reads every
        // split's 2048 bins), at most 16384.
        int64_t const target = ceilDiv(p.T * rows, 2 * static_cast<int64_t>(dev.numSMs > 0 ? dev.numSMs : 1));
        int64_t split = alignUp(static_cast<size_t>(target), kMB_MIN_SPLIT);
        split = split < 2048 ? 2048 : (split > 16384 ? 16384 : split);
        mb.split = split;
    }
    mb.candCap = mode == 3 ? 64 : kMB_CAND_SMEM;
    auto* base = reinterpret_cast<unsigned char*>(ch.ws) + scoreRowsBytes(rows, p.T);
    auto* words = reinterpret_cast<int32_t*>(base);
    mb.hist = reinterpret_cast<uint32_t*>(words);
    words += rows * mb.nSplitMax * kMB_BINS;
    mb.meta = words;
    words += rows * kMB_META;
    mb.bases = words;
    words += rows * 2 * mb.nSplitMax;
    mb.gt = words;
    words += rows * p.topk;
    mb.g2 = words;
    words += rows * p.topk;
    mb.cand = words;
    dim3 const splitGrid(static_cast<uint32_t>(ceilDiv(p.T, mb.split)), static_cast<uint32_t>(rows));
    topkSplitHistogramKernel<<<splitGrid, kTOPK_THREADS, 0, stream>>>(p, ch, mb);
    int32_t st = checkCuda(cudaGetLastError(), "topkSplitHistogramKernel launch");
    if (st != kSUCCESS)
    {
        return st;
    }
    topkMergeHistogramsKernel<<<static_cast<uint32_t>(rows), kTOPK_THREADS, 0, stream>>>(p, mb);
    st = checkCuda(cudaGetLastError(), "topkMergeHistogramsKernel launch");
    if (st != kSUCCESS)
    {
        return st;
    }
    topkSplitGatherKernel<<<splitGrid, kTOPK_THREADS, 0, stream>>>(p, ch, mb);
    st = checkCuda(cudaGetLastError(), "topkSplitGatherKernel launch");
    if (st != kSUCCESS)
    {
        return st;
    }
    size_t const smem = static_cast<size_t>(mb.candCap) * 2 * sizeof(int32_t);
    topkFinalSelectKernel<<<static_cast<uint32_t>(rows), kTOPK_THREADS, smem, stream>>>(p, ch, mb);
    return checkCuda(cudaGetLastError(), "topkFinalSelectKernel launch");
}

template <typename T, typename TW, typename TK>
int32_t launchTyped(IndexerTopKParams const& p, DeviceInfo const& dev, void* workspace, size_t workspaceBytes,
    cudaStream_t stream)
{
    constexpr bool kFP8 = std::is_same<TK, uint8_t>::value;
    LogitsPlan const plan = planLogits(p.H, p.D, dtypeOf<T>(), aligned16(p.q) && aligned16(p.k), dev, kFP8);
    if (plan.tc)
    {
        int32_t const st = setLogitsMmaSmem<T, TW, TK>(plan.smem, plan.q8);
        if (st != kSUCCESS)
        {
            return st;
        }
    }
    Chunk ch;
    ch.ws = static_cast<float*>(workspace);
    // Few long rows (decode at tens of thousands of keys): one launch of all rows with the multi-block
    // top-k when the workspace holds their scores and its state; forced modes must get it.
    int32_t const mode = gSelectMode;
    int64_t const rows = p.B * p.S;
    bool const mbFits = rows <= kMB_MAX_ROWS
        && workspaceBytes >= scoreRowsBytes(rows, p.T) + multiBlockAuxBytes(rows, p.T, p.topk);
    if (mode >= 2 && !mbFits)
    {
        return setLastError(kUNSUPPORTED,
            "DSAIndexerTopK: the multi-block top-k needs B*S <= " + std::to_string(kMB_MAX_ROWS)
                + " and a workspace of dsa_indexer_topk_workspace_size() bytes");
    }
    if (mbFits && (mode >= 2 || (mode == 0 && p.T >= kMB_MIN_T)))
    {
        ch.b0 = 0;
        ch.nb = p.B;
        ch.s0 = 0;
        ch.sc = p.S;
        int32_t const st = launchLogits<T, TW, TK>(p, ch, plan, stream);
        if (st != kSUCCESS)
        {
            return st;
        }
        return launchSelectMultiBlock(p, ch, mode, dev, stream);
    }
    int64_t const wsRows = static_cast<int64_t>(workspaceBytes / (static_cast<size_t>(p.T) * sizeof(float)));
    if (wsRows >= p.S)
    {
        int64_t const nbMax = wsRows / p.S < p.B ? wsRows / p.S : p.B;
        for (int64_t b0 = 0; b0 < p.B; b0 += nbMax)
        {
            ch.b0 = b0;
            ch.nb = p.B - b0 < nbMax ? p.B - b0 : nbMax;
            ch.s0 = 0;
            ch.sc = p.S;
            int32_t const st = launchChunk<T, TW, TK>(p, ch, plan, stream);
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
            int32_t const st = launchChunk<T, TW, TK>(p, ch, plan, stream);
            if (st != kSUCCESS)
            {
                return st;
            }
        }
    }
    return kSUCCESS;
}

//! Checks shared by both forms, then the launch (keys of type TK: the dtype's or FP8 codes).
int32_t launchIndexerAny(IndexerTopKParams const& p, DType dtype, DType wDtype, bool fp8Keys, void* workspace,
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
    case DType::kFLOAT32:
        return fp8Keys ? launchTyped<float, float, uint8_t>(p, dev, workspace, workspaceBytes, stream)
                       : launchTyped<float, float, float>(p, dev, workspace, workspaceBytes, stream);
    case DType::kFLOAT16:
        if (fp8Keys)
        {
            return wSame ? launchTyped<__half, __half, uint8_t>(p, dev, workspace, workspaceBytes, stream)
                         : launchTyped<__half, float, uint8_t>(p, dev, workspace, workspaceBytes, stream);
        }
        return wSame ? launchTyped<__half, __half, __half>(p, dev, workspace, workspaceBytes, stream)
                     : launchTyped<__half, float, __half>(p, dev, workspace, workspaceBytes, stream);
    case DType::kBFLOAT16:
        if (fp8Keys)
        {
            return wSame ? launchTyped<__nv_bfloat16, __nv_bfloat16, uint8_t>(p, dev, workspace, workspaceBytes, stream)
                         : launchTyped<__nv_bfloat16, float, uint8_t>(p, dev, workspace, workspaceBytes, stream);
        }
        return wSame ? launchTyped<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>(p, dev, workspace, workspaceBytes, stream)
                     : launchTyped<__nv_bfloat16, float, __nv_bfloat16>(p, dev, workspace, workspaceBytes, stream);
    case DType::kFP8_E4M3: break; // rejected above
    }
    return setLastError(kINVALID_ARGUMENT, "DSAIndexerTopK: unknown dtype");
}

} // namespace

size_t indexerTopKMinWorkspaceSize(int64_t T)
{
    return T <= 0 ? 0 : alignUp(static_cast<size_t>(T) * sizeof(float), 256);
}

size_t indexerTopKWorkspaceSize(int64_t B, int64_t S, int64_t T, int64_t /*H*/, int64_t /*D*/, int64_t topk)
{
    // min(all scores, budget), but at least one row, plus the multi-block top-k's state for
    // min(B*S, kMB_MAX_ROWS) rows. Monotone in B, S, T and topk, so the size computed for a
    // profile's maximum shapes covers every smaller shape (the plugin relies on that).
    if (B <= 0 || S <= 0 || T <= 0)
    {
        return 0;
    }
    size_t const rowBytes = static_cast<size_t>(T) * sizeof(float);
    size_t const all = static_cast<size_t>(B) * static_cast<size_t>(S) * rowBytes;
    size_t bytes = all < kINDEXER_WORKSPACE_BUDGET ? all : kINDEXER_WORKSPACE_BUDGET;
    bytes = bytes < rowBytes ? rowBytes : bytes;
    int64_t const mbRows = B * S < kMB_MAX_ROWS ? B * S : kMB_MAX_ROWS;
    size_t const mb = scoreRowsBytes(mbRows, T) + multiBlockAuxBytes(mbRows, T, topk < 0 ? 0 : topk);
    bytes = alignUp(bytes, 256);
    return bytes > mb ? bytes : mb;
}

int32_t indexerTopKPath(int64_t H, int64_t D, DType dtype, bool aligned, DeviceInfo const& dev)
{
    return planLogits(H, D, dtype, aligned, dev).tc ? 1 : 0;
}

int32_t indexerTopKSetFp8Mma(int32_t enable)
{
    if (enable != 0 && enable != 1)
    {
        return -1;
    }
    int32_t const previous = gFp8Mma;
    gFp8Mma = enable;
    return previous;
}

int32_t indexerTopKSetSelectMode(int32_t mode)
{
    if (mode < 0 || mode > 3)
    {
        return -1;
    }
    int32_t const previous = gSelectMode;
    gSelectMode = mode;
    return previous;
}

int32_t launchIndexerTopK(IndexerTopKParams const& p, DType dtype, DType wDtype, void* workspace,
    size_t workspaceBytes, cudaStream_t stream)
{
    IndexerTopKParams c = p;
    c.blockTable = nullptr;
    c.queryStart = nullptr;
    c.kScale = nullptr;
    return launchIndexerAny(c, dtype, wDtype, /*fp8Keys=*/false, workspace, workspaceBytes, stream);
}

int32_t launchIndexerTopKPaged(IndexerTopKParams const& p, DType dtype, DType wDtype, bool fp8Keys, void* workspace,
    size_t workspaceBytes, cudaStream_t stream)
{
    if (p.P < 1 || p.page < 1 || p.M < 0 || p.M > 0x7fffffffLL / p.page || p.T != p.M * p.page)
    {
        return setLastError(kINVALID_ARGUMENT,
            "DSAIndexerTopKPaged: needs P >= 1, page >= 1, M >= 0 and M * page < 2^31 logical keys");
    }
    if (p.B * p.S > 0 && p.topk > 0
        && (p.blockTable == nullptr || p.queryStart == nullptr || p.lengths == nullptr || (fp8Keys && p.kScale == nullptr)))
    {
        return setLastError(kINVALID_ARGUMENT,
            "DSAIndexerTopKPaged: block_table, query_start, lengths (and the FP8 keys' scales) are required");
    }
    return launchIndexerAny(p, dtype, wDtype, fp8Keys, workspace, workspaceBytes, stream);
}

} // namespace dsa
