/*
 * DSAMoEExperts grouped GEMMs (see dsaMoEExpertsKernel.cu for the whole pass):
 *   tensor-core kernel (fp16/bf16 x, 16-bit or FP8 e4m3 weights; mma.sync m16n8k16, 4-stage
 *   cp.async pipeline, three tile heights) and a generic CUDA-core kernel (fp32 math, any shape),
 *   each as the gate_up GEMM fused with SiLU * up or the down GEMM writing fp32 slot rows.
 */
#include "dsaMoEExpertsInternal.h"

#include "common/dsaMma.cuh"

#include <cuda_fp8.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace dsa
{
namespace moe
{
namespace
{

constexpr int32_t kGROUP_M = 8;           // row tiles walked per column tile (rasterization)
constexpr int32_t kSTAGES = 4;            // cp.async pipeline depth of the tensor-core kernel
constexpr int32_t kGEN_THREADS = 256;
constexpr int32_t kGEN_BN = 64;           // weight rows per generic tile (32 gate + 32 up for gate_up)
constexpr int32_t kGEN_BK = 16;

__device__ __forceinline__ float siluFast(float g)
{
    return g / (1.F + __expf(-g));
}

__device__ __forceinline__ float fp8ToFloat(uint8_t v)
{
    __half_raw const h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
    return __half2float(__half(h));
}

//! Maps this CTA to (expert, rows [rowStart, rowEnd), column tile); false when it has no tile.
__device__ __forceinline__ bool decodeTile(
    GemmArgs const& a, int32_t bm, int32_t& e, int32_t& rowStart, int32_t& rowEnd, int32_t& nTile)
{
    int64_t const per = static_cast<int64_t>(kGROUP_M) * a.nTilesN;
    int64_t const pid = blockIdx.x;
    int64_t const gid = pid / per;
    int64_t const firstM = gid * kGROUP_M;
    int64_t const left = a.maxTilesM - firstM;
    int64_t const gsz = left < kGROUP_M ? left : kGROUP_M;
    int64_t const local = pid - gid * per;
    int32_t const mTile = static_cast<int32_t>(firstM + local % gsz);
    nTile = static_cast<int32_t>(local / gsz);
    int32_t const E = static_cast<int32_t>(a.E);
    if (mTile >= a.tileOff[E])
    {
        return false;
    }
    int32_t lo = 0;
    int32_t hi = E - 1;
    while (lo < hi)
    {
        int32_t const mid = (lo + hi + 1) >> 1;
        if (a.tileOff[mid] <= mTile)
        {
            lo = mid;
        }
        else
        {
            hi = mid - 1;
        }
    }
    e = lo;
    rowStart = a.expertOff[e] + (mTile - a.tileOff[e]) * bm;
    int32_t const expertEnd = a.expertOff[e + 1];
    rowEnd = rowStart + bm < expertEnd ? rowStart + bm : expertEnd;
    return true;
}

//! Weight row of local column l of column tile nTile (BNW weight rows per tile), or -1. For
//! gate_up the first half of the tile holds gate rows j, the second half the up rows I + j.
template <bool GATE_UP, int BNW>
__device__ __forceinline__ int32_t weightRow(GemmArgs const& a, int32_t nTile, int32_t l)
{
    if (GATE_UP)
    {
        constexpr int32_t HALF = BNW / 2;
        bool const up = l >= HALF;
        int32_t const j = nTile * HALF + (up ? l - HALF : l);
        if (j >= a.I)
        {
            return -1;
        }
        return up ? a.I + j : j;
    }
    int32_t const n = nTile * BNW + l;
    return n < a.H ? n : -1;
}

template <int WARPS_M, int MT, int BK>
struct TcShape
{
    static constexpr int32_t kWarpsN = 4;
    static constexpr int32_t kThreads = WARPS_M * kWarpsN * 32;
    static constexpr int32_t kBM = WARPS_M * MT * 16;
    static constexpr int32_t kBN = kWarpsN * 32;
    static constexpr int32_t kLD = BK + 8;   // padded row (16-bit elements): conflict-free ldmatrix
    static constexpr int32_t kAStage = kBM * kLD;
    static constexpr int32_t kBStage = kBN * kLD;
    static constexpr int32_t kQ = BK / 16;   // 16-byte fp8 chunks per weight row and stage

    static size_t smemBytes(bool fp8)
    {
        size_t s = static_cast<size_t>(kSTAGES) * kAStage * 2;
        if (fp8)
        {
            s += static_cast<size_t>(kSTAGES) * kBN * BK + static_cast<size_t>(kSTAGES) * kBN * kQ * sizeof(float)
                + static_cast<size_t>(kBStage) * 2;
        }
        else
        {
            s += static_cast<size_t>(kSTAGES) * kBStage * 2;
        }
        return s + static_cast<size_t>(kBM) * sizeof(int32_t);
    }
};

template <typename T, bool FP8, int WARPS_M, int MT, int BK, bool GATE_UP>
__global__ void __launch_bounds__(TcShape<WARPS_M, MT, BK>::kThreads) moeGemmMmaKernel(GemmArgs a)
{
    using Shape = TcShape<WARPS_M, MT, BK>;
    constexpr int32_t THREADS = Shape::kThreads;
    constexpr int32_t BM = Shape::kBM;
    constexpr int32_t BN = Shape::kBN;
    constexpr int32_t LD = Shape::kLD;
    constexpr int32_t KCH = BK / 8;
    constexpr int32_t QCH = Shape::kQ;
    constexpr int32_t HALF = BN / 2;
    static_assert(BK % 16 == 0, "BK must be a multiple of 16");

    extern __shared__ __align__(16) unsigned char smemRaw[];
    T* sA = reinterpret_cast<T*>(smemRaw);
    unsigned char* cursor = smemRaw + static_cast<size_t>(kSTAGES) * Shape::kAStage * sizeof(T);
    T* sB = nullptr;
    uint8_t* sB8 = nullptr;
    float* sScale = nullptr;
    T* sConv = nullptr;
    if constexpr (FP8)
    {
        sB8 = cursor;
        cursor += static_cast<size_t>(kSTAGES) * BN * BK;
        sScale = reinterpret_cast<float*>(cursor);
        cursor += static_cast<size_t>(kSTAGES) * BN * QCH * sizeof(float);
        sConv = reinterpret_cast<T*>(cursor);
        cursor += static_cast<size_t>(Shape::kBStage) * sizeof(T);
    }
    else
    {
        sB = reinterpret_cast<T*>(cursor);
        cursor += static_cast<size_t>(kSTAGES) * Shape::kBStage * sizeof(T);
    }
    int32_t* sRow = reinterpret_cast<int32_t*>(cursor); // [BM]: token (gate_up) or slot (down); -1 = padding

    int32_t e = 0;
    int32_t rowStart = 0;
    int32_t rowEnd = 0;
    int32_t nTile = 0;
    if (!decodeTile(a, BM, e, rowStart, rowEnd, nTile))
    {
        return;
    }
    int32_t const tid = threadIdx.x;
    int32_t const warp = tid >> 5;
    int32_t const lane = tid & 31;
    int32_t const wn = warp % Shape::kWarpsN;
    int32_t const wm = warp / Shape::kWarpsN;

    for (int32_t i = tid; i < BM; i += THREADS)
    {
        int32_t const r = rowStart + i;
        int32_t const slot = r < rowEnd ? a.perm[r] : -1;
        sRow[i] = slot < 0 ? -1 : (GATE_UP ? slot / a.K : slot);
    }
    __syncthreads();

    // Every thread copies the same (row, 16-byte chunk) pairs in every stage: resolve their source
    // rows once. A: ITER_A chunks of 8 elements; B: ITER_B chunks of 8 elements (16-bit weights)
    // or ITER_Q chunks of 16 fp8 weights plus their block scales.
    constexpr int32_t ITER_A = BM * KCH / THREADS;
    constexpr int32_t ITER_B = BN * KCH / THREADS;
    constexpr int32_t ITER_Q = BN * QCH / THREADS;
    static_assert(BM * KCH % THREADS == 0 && BN * KCH % THREADS == 0 && BN * QCH % THREADS == 0, "tile split");
    int32_t const kd = a.kd;
    T const* A = static_cast<T const*>(a.a);
    T const* aSrc[ITER_A];
    int32_t aK[ITER_A];
#pragma unroll
    for (int32_t i = 0; i < ITER_A; ++i)
    {
        int32_t const q = tid + i * THREADS;
        int32_t const r = q / KCH;
        int32_t const src = sRow[r];
        int64_t const row = GATE_UP ? static_cast<int64_t>(src) : static_cast<int64_t>(rowStart + r);
        aK[i] = (q - r * KCH) * 8;
        aSrc[i] = src >= 0 ? A + row * kd + aK[i] : nullptr;
    }
    int64_t const wBase = static_cast<int64_t>(e) * a.nW * kd;
    constexpr int32_t ITER_W = FP8 ? ITER_Q : ITER_B;
    constexpr int32_t W_CHUNK = FP8 ? 16 : 8; // weights per 16-byte chunk
    constexpr int32_t W_PER_ROW = FP8 ? QCH : KCH;
    using WStore = typename std::conditional<FP8, uint8_t, T>::type;
    WStore const* W = static_cast<WStore const*>(a.w) + wBase;
    WStore const* wSrc[ITER_W];
    float const* sSrc[ITER_W];
    int32_t wK[ITER_W];
    int32_t const nKb = FP8 ? (kd + a.bs - 1) / a.bs : 1;
    float const* scaleE = a.scale;
    if constexpr (FP8)
    {
        int32_t const nRb = (a.nW + a.bs - 1) / a.bs;
        scaleE = a.scale + static_cast<int64_t>(e) * nRb * nKb;
    }
#pragma unroll
    for (int32_t i = 0; i < ITER_W; ++i)
    {
        int32_t const q = tid + i * THREADS;
        int32_t const r = q / W_PER_ROW;
        int32_t const wr = weightRow<GATE_UP, BN>(a, nTile, r);
        wK[i] = (q - r * W_PER_ROW) * W_CHUNK;
        wSrc[i] = wr >= 0 ? W + static_cast<int64_t>(wr) * kd + wK[i] : nullptr;
        sSrc[i] = (FP8 && wr >= 0) ? scaleE + static_cast<int64_t>(wr / a.bs) * nKb : nullptr;
    }

    auto loadStage = [&](int32_t kt, int32_t buf) {
        int32_t const k0 = kt * BK;
        T* dA = sA + buf * Shape::kAStage;
#pragma unroll
        for (int32_t i = 0; i < ITER_A; ++i)
        {
            int32_t const q = tid + i * THREADS;
            bool const ok = aSrc[i] != nullptr && k0 + aK[i] < kd;
            mma::cpAsync16(dA + (q / KCH) * LD + aK[i], ok ? aSrc[i] + k0 : A, ok);
        }
#pragma unroll
        for (int32_t i = 0; i < ITER_W; ++i)
        {
            int32_t const q = tid + i * THREADS;
            int32_t const r = q / W_PER_ROW;
            bool const ok = wSrc[i] != nullptr && k0 + wK[i] < kd;
            if constexpr (FP8)
            {
                mma::cpAsync16(sB8 + buf * BN * BK + r * BK + wK[i], ok ? wSrc[i] + k0 : W, ok);
                mma::cpAsync4(sScale + buf * BN * QCH + r * QCH + wK[i] / 16,
                    ok ? sSrc[i] + (k0 + wK[i]) / a.bs : a.scale, ok);
            }
            else
            {
                mma::cpAsync16(sB + buf * Shape::kBStage + r * LD + wK[i], ok ? wSrc[i] + k0 : W, ok);
            }
        }
    };

    int32_t const numK = static_cast<int32_t>((kd + BK - 1) / BK);
#pragma unroll
    for (int32_t s = 0; s < kSTAGES - 1; ++s)
    {
        if (s < numK)
        {
            loadStage(s, s);
        }
        mma::cpAsyncCommit();
    }

    float acc[MT][4][4];
#pragma unroll
    for (int32_t mt = 0; mt < MT; ++mt)
    {
#pragma unroll
        for (int32_t f = 0; f < 4; ++f)
        {
            acc[mt][f][0] = acc[mt][f][1] = acc[mt][f][2] = acc[mt][f][3] = 0.F;
        }
    }
    int32_t const aRowBase = wm * MT * 16;
    // Two 16-row groups of weight rows per warp: gate/up pairs for gate_up, 32 adjacent rows for down.
    int32_t const bRow0 = GATE_UP ? wn * 16 : wn * 32;
    int32_t const bRow1 = GATE_UP ? HALF + wn * 16 : wn * 32 + 16;

    for (int32_t kt = 0; kt < numK; ++kt)
    {
        mma::cpAsyncWait<kSTAGES - 2>();
        __syncthreads(); // stage kt landed for every thread; everyone is done with stage kt - 1
        {
            int32_t const nk = kt + kSTAGES - 1;
            if (nk < numK)
            {
                loadStage(nk, nk % kSTAGES);
            }
            mma::cpAsyncCommit();
        }
        int32_t const buf = kt % kSTAGES;
        T const* tA = sA + buf * Shape::kAStage;
        T const* tB = nullptr;
        if constexpr (FP8)
        {
            uint8_t const* src8 = sB8 + buf * BN * BK;
            float const* srcS = sScale + buf * BN * QCH;
            for (int32_t q = tid; q < BN * QCH; q += THREADS)
            {
                int32_t const r = q / QCH;
                int32_t const c = q - r * QCH;
                uint4 const raw = loadAligned<uint4>(src8 + r * BK + c * 16);
                float const s = srcS[r * QCH + c];
                uint32_t const words[4] = {raw.x, raw.y, raw.z, raw.w};
                uint32_t packed[8];
#pragma unroll
                for (int32_t wi = 0; wi < 4; ++wi)
                {
#pragma unroll
                    for (int32_t hi = 0; hi < 2; ++hi)
                    {
                        auto const pair = static_cast<__nv_fp8x2_storage_t>((words[wi] >> (16 * hi)) & 0xffffU);
                        __half2 const h2 = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
                        float2 const f = __half22float2(h2);
                        packed[wi * 2 + hi] = mma::packPair<T>(f.x * s, f.y * s);
                    }
                }
                T* dst = sConv + r * LD + c * 16;
                storeAligned(dst, make_uint4(packed[0], packed[1], packed[2], packed[3]));
                storeAligned(dst + 8, make_uint4(packed[4], packed[5], packed[6], packed[7]));
            }
            __syncthreads();
            tB = sConv;
        }
        else
        {
            tB = sB + buf * Shape::kBStage;
        }

#pragma unroll
        for (int32_t kk = 0; kk < BK; kk += 16)
        {
            uint32_t af[MT][4];
#pragma unroll
            for (int32_t mt = 0; mt < MT; ++mt)
            {
                mma::ldmatrixX4(af[mt], tA + (aRowBase + mt * 16 + (lane & 15)) * LD + kk + (lane >> 4) * 8);
            }
#pragma unroll
            for (int32_t ch = 0; ch < 2; ++ch)
            {
                uint32_t bf[4];
                int32_t const br = (ch == 0 ? bRow0 : bRow1) + (lane & 7) + ((lane >> 4) << 3);
                mma::ldmatrixX4(bf, tB + br * LD + kk + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int32_t mt = 0; mt < MT; ++mt)
                {
                    mma::mma16816<T>(acc[mt][2 * ch], af[mt], bf[0], bf[1]);
                    mma::mma16816<T>(acc[mt][2 * ch + 1], af[mt], bf[2], bf[3]);
                }
            }
        }
    }
    mma::cpAsyncWait<0>();

    int32_t const g = lane >> 2;
    int32_t const c4 = lane & 3;
    if constexpr (GATE_UP)
    {
        T* act = static_cast<T*>(a.act);
        int64_t const j0 = static_cast<int64_t>(nTile) * HALF;
#pragma unroll
        for (int32_t mt = 0; mt < MT; ++mt)
        {
#pragma unroll
            for (int32_t hh = 0; hh < 2; ++hh)
            {
                int32_t const r = rowStart + aRowBase + mt * 16 + g + hh * 8;
                if (r >= rowEnd)
                {
                    continue;
                }
#pragma unroll
                for (int32_t f = 0; f < 2; ++f)
                {
                    int64_t const j = j0 + wn * 16 + f * 8 + 2 * c4;
                    if (j >= a.I)
                    {
                        continue;
                    }
                    float const v0 = siluFast(acc[mt][f][2 * hh]) * acc[mt][f + 2][2 * hh];
                    float const v1 = siluFast(acc[mt][f][2 * hh + 1]) * acc[mt][f + 2][2 * hh + 1];
                    storeAligned(act + static_cast<int64_t>(r) * a.I + j, mma::packPair<T>(v0, v1));
                }
            }
        }
    }
    else
    {
        int64_t const n0 = static_cast<int64_t>(nTile) * BN;
#pragma unroll
        for (int32_t mt = 0; mt < MT; ++mt)
        {
#pragma unroll
            for (int32_t hh = 0; hh < 2; ++hh)
            {
                int32_t const rl = aRowBase + mt * 16 + g + hh * 8;
                if (rowStart + rl >= rowEnd)
                {
                    continue;
                }
                float* dst = a.slotOut + static_cast<int64_t>(sRow[rl]) * a.H;
#pragma unroll
                for (int32_t f = 0; f < 4; ++f)
                {
                    int64_t const n = n0 + wn * 32 + f * 8 + 2 * c4;
                    if (n < a.H)
                    {
                        storeAligned(dst + n, make_float2(acc[mt][f][2 * hh], acc[mt][f][2 * hh + 1]));
                    }
                }
            }
        }
    }
}

template <typename T, bool FP8, bool GATE_UP>
__global__ void __launch_bounds__(kGEN_THREADS) moeGemmGenericKernel(GemmArgs a)
{
    constexpr int32_t BM = kGEN_BM;
    constexpr int32_t BNW = kGEN_BN;
    constexpr int32_t BK = kGEN_BK;
    constexpr int32_t HALF = BNW / 2;
    static_assert(BM == BNW, "one loader loop fills both tiles");
    __shared__ __align__(16) float sA[BK][BM + 4];
    __shared__ __align__(16) float sB[BK][BNW + 4];
    __shared__ int32_t sRow[BM];
    __shared__ int32_t sWRow[BNW];
    __shared__ int64_t sWScale[BNW]; // FP8: offset of the weight row's block-scale row

    int32_t e = 0;
    int32_t rowStart = 0;
    int32_t rowEnd = 0;
    int32_t nTile = 0;
    if (!decodeTile(a, BM, e, rowStart, rowEnd, nTile))
    {
        return;
    }
    int32_t const tid = threadIdx.x;
    int32_t const kd = a.kd;
    int32_t const nKb = FP8 ? (kd + a.bs - 1) / a.bs : 1;
    if (tid < BM)
    {
        int32_t const r = rowStart + tid;
        int32_t const slot = r < rowEnd ? a.perm[r] : -1;
        sRow[tid] = slot < 0 ? -1 : (GATE_UP ? slot / a.K : slot);
    }
    if (tid < BNW)
    {
        int32_t const wr = weightRow<GATE_UP, BNW>(a, nTile, tid);
        sWRow[tid] = wr;
        sWScale[tid] = wr >= 0 ? static_cast<int64_t>(wr / a.bs) * nKb : 0;
    }
    __syncthreads();

    using WT = typename std::conditional<FP8, uint8_t, T>::type;
    T const* A = static_cast<T const*>(a.a);
    WT const* W = static_cast<WT const*>(a.w) + static_cast<int64_t>(e) * a.nW * kd;
    float const* scaleE = a.scale;
    if constexpr (FP8)
    {
        int32_t const nRb = (a.nW + a.bs - 1) / a.bs;
        scaleE = a.scale + static_cast<int64_t>(e) * nRb * nKb;
    }

    int32_t const ty = tid / 16;
    int32_t const tx = tid % 16;
    float acc[4][4];
#pragma unroll
    for (int32_t i = 0; i < 4; ++i)
    {
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.F;
    }
    for (int32_t k0 = 0; k0 < kd; k0 += BK)
    {
        for (int32_t q = tid; q < BM * BK; q += kGEN_THREADS)
        {
            int32_t const r = q / BK;
            int32_t const kk = q - r * BK;
            int32_t const k = k0 + kk;
            int32_t const src = sRow[r];
            float av = 0.F;
            if (src >= 0 && k < kd)
            {
                int64_t const row = GATE_UP ? static_cast<int64_t>(src) : static_cast<int64_t>(rowStart + r);
                av = toFloat(A[row * kd + k]);
            }
            sA[kk][r] = av;
            int32_t const wr = sWRow[r];
            float bv = 0.F;
            if (wr >= 0 && k < kd)
            {
                if constexpr (FP8)
                {
                    bv = fp8ToFloat(W[static_cast<int64_t>(wr) * kd + k]) * scaleE[sWScale[r] + k / a.bs];
                }
                else
                {
                    bv = toFloat(W[static_cast<int64_t>(wr) * kd + k]);
                }
            }
            sB[kk][r] = bv;
        }
        __syncthreads();
#pragma unroll
        for (int32_t kk = 0; kk < BK; ++kk)
        {
            float4 const av = loadAligned<float4>(&sA[kk][ty * 4]);
            float2 const b01 = loadAligned<float2>(&sB[kk][2 * tx]);
            float2 const b23 = loadAligned<float2>(&sB[kk][HALF + 2 * tx]);
            float const as[4] = {av.x, av.y, av.z, av.w};
            float const bs[4] = {b01.x, b01.y, b23.x, b23.y};
#pragma unroll
            for (int32_t i = 0; i < 4; ++i)
            {
#pragma unroll
                for (int32_t j = 0; j < 4; ++j)
                {
                    acc[i][j] = fmaf(as[i], bs[j], acc[i][j]);
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int32_t i = 0; i < 4; ++i)
    {
        int32_t const rl = ty * 4 + i;
        int32_t const r = rowStart + rl;
        if (r >= rowEnd)
        {
            continue;
        }
        if constexpr (GATE_UP)
        {
            T* act = static_cast<T*>(a.act);
#pragma unroll
            for (int32_t u = 0; u < 2; ++u)
            {
                int64_t const j = static_cast<int64_t>(nTile) * HALF + 2 * tx + u;
                if (j < a.I)
                {
                    float const gv = acc[i][u];
                    act[static_cast<int64_t>(r) * a.I + j] = fromFloat<T>(gv / (1.F + expf(-gv)) * acc[i][2 + u]);
                }
            }
        }
        else
        {
            float* dst = a.slotOut + static_cast<int64_t>(sRow[rl]) * a.H;
            int32_t const cols[4] = {2 * tx, 2 * tx + 1, HALF + 2 * tx, HALF + 2 * tx + 1};
#pragma unroll
            for (int32_t j = 0; j < 4; ++j)
            {
                int64_t const n = static_cast<int64_t>(nTile) * BNW + cols[j];
                if (n < a.H)
                {
                    dst[n] = acc[i][j];
                }
            }
        }
    }
}


template <typename T, bool FP8, int WARPS_M, int MT, int BK, bool GATE_UP>
int32_t launchTcGemm(GemmArgs a, DeviceInfo const& dev, cudaStream_t stream)
{
    using Shape = TcShape<WARPS_M, MT, BK>;
    a.nTilesN = static_cast<int32_t>(GATE_UP ? ceilDiv(a.I, Shape::kBN / 2) : ceilDiv(a.H, Shape::kBN));
    size_t const smem = Shape::smemBytes(FP8);
    if (smem > dev.maxSmemOptin)
    {
        // The launcher's path choice (choosePath in dsaMoEExpertsKernel.cu) never gets here.
        return setLastError(kUNSUPPORTED, "DSAMoEExperts: the tensor-core tile needs " + std::to_string(smem)
                + " bytes of shared memory, the device allows " + std::to_string(dev.maxSmemOptin));
    }
    auto kernel = moeGemmMmaKernel<T, FP8, WARPS_M, MT, BK, GATE_UP>;
    int32_t const st = checkCuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "cudaFuncSetAttribute(moeGemmMmaKernel)");
    if (st != kSUCCESS)
    {
        return st;
    }
    int64_t const grid = static_cast<int64_t>(a.maxTilesM) * a.nTilesN;
    if (grid > 0x7fffffffLL)
    {
        return setLastError(kUNSUPPORTED, "DSAMoEExperts: too many tiles for one launch");
    }
    kernel<<<static_cast<uint32_t>(grid), Shape::kThreads, smem, stream>>>(a);
    return checkCuda(cudaGetLastError(), GATE_UP ? "moeGemmMmaKernel(gate_up) launch" : "moeGemmMmaKernel(down) launch");
}

template <typename T, bool FP8, bool GATE_UP>
int32_t launchGenericGemm(GemmArgs a, cudaStream_t stream)
{
    a.nTilesN = static_cast<int32_t>(GATE_UP ? ceilDiv(a.I, kGEN_BN / 2) : ceilDiv(a.H, kGEN_BN));
    int64_t const grid = static_cast<int64_t>(a.maxTilesM) * a.nTilesN;
    if (grid > 0x7fffffffLL)
    {
        return setLastError(kUNSUPPORTED, "DSAMoEExperts: too many tiles for one launch");
    }
    moeGemmGenericKernel<T, FP8, GATE_UP><<<static_cast<uint32_t>(grid), kGEN_THREADS, 0, stream>>>(a);
    return checkCuda(
        cudaGetLastError(), GATE_UP ? "moeGemmGenericKernel(gate_up) launch" : "moeGemmGenericKernel(down) launch");
}

template <typename T, bool FP8, bool GATE_UP>
int32_t launchGemm(GemmArgs const& a, int32_t path, DeviceInfo const& dev, cudaStream_t stream)
{
    if constexpr (std::is_same<T, float>::value)
    {
        (void) path;
        (void) dev;
        return launchGenericGemm<T, FP8, GATE_UP>(a, stream);
    }
    else
    {
        switch (path)
        {
        case kMOE_PATH_TC_SMALL: return launchTcGemm<T, FP8, 1, 1, 64, GATE_UP>(a, dev, stream);
        case kMOE_PATH_TC_MEDIUM: return launchTcGemm<T, FP8, 2, 2, 32, GATE_UP>(a, dev, stream);
        case kMOE_PATH_TC_LARGE: return launchTcGemm<T, FP8, 2, 4, 32, GATE_UP>(a, dev, stream);
        default: return launchGenericGemm<T, FP8, GATE_UP>(a, stream);
        }
    }
}

template <typename T>
int32_t launchGemmTyped(GemmArgs const& a, bool fp8, bool gateUp, int32_t path, DeviceInfo const& dev,
    cudaStream_t stream)
{
    if (fp8)
    {
        return gateUp ? launchGemm<T, true, true>(a, path, dev, stream) : launchGemm<T, true, false>(a, path, dev, stream);
    }
    return gateUp ? launchGemm<T, false, true>(a, path, dev, stream) : launchGemm<T, false, false>(a, path, dev, stream);
}

} // namespace

size_t tcGemmSmemBytes(int32_t path, bool fp8)
{
    // The tile shapes of launchGemm's switch below.
    switch (path)
    {
    case kMOE_PATH_TC_SMALL: return TcShape<1, 1, 64>::smemBytes(fp8);
    case kMOE_PATH_TC_MEDIUM: return TcShape<2, 2, 32>::smemBytes(fp8);
    case kMOE_PATH_TC_LARGE: return TcShape<2, 4, 32>::smemBytes(fp8);
    default: return 0;
    }
}

int32_t launchGemm(GemmArgs const& a, DType dtype, bool fp8, bool gateUp, int32_t path, DeviceInfo const& dev,
    cudaStream_t stream)
{
    switch (dtype)
    {
    case DType::kFLOAT32: return launchGemmTyped<float>(a, fp8, gateUp, path, dev, stream);
    case DType::kFLOAT16: return launchGemmTyped<__half>(a, fp8, gateUp, path, dev, stream);
    case DType::kBFLOAT16: return launchGemmTyped<__nv_bfloat16>(a, fp8, gateUp, path, dev, stream);
    case DType::kFP8_E4M3: break;
    }
    return setLastError(kINVALID_ARGUMENT, "DSAMoEExperts: unknown dtype");
}

} // namespace moe
} // namespace dsa
