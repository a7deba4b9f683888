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
 */
#include "dsaSparseAttentionKernel.h"

#include "common/dsaMma.cuh"

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

size_t tcSmemBytes(int32_t wm, int32_t stages, int64_t dk, int64_t dv, bool valuesFromKeys)
{
    int64_t const hb = 16 * wm;
    int64_t const vPitch = valuesFromKeys ? 0 : dv + 8; // values from keys have no V tile of their own
    int64_t const elems = hb * (dk + 8) + stages * kTC_BN * ((dk + 8) + vPitch) + hb * (kTC_BN + 8);
    return static_cast<size_t>(elems) * 2 + static_cast<size_t>(4 * hb) * sizeof(float)
        + static_cast<size_t>(stages * kTC_BN) * sizeof(int32_t);
}

template <typename T, int WM, int NT>
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
    T const* kBase = static_cast<T const*>(p.k) + (b * p.T * p.Hkv + kvh) * p.Dk;
    T const* vBase = vFromK ? kBase : static_cast<T const*>(p.v) + (b * p.T * p.Hkv + kvh) * DV;
    int64_t const kRowStride = p.Hkv * p.Dk;
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
        int64_t const j0 = tile * BN;
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
            int const t = j < p.K ? __ldg(idx + j) : -1;
            idxS[r] = (t >= 0 && t < p.T) ? t : -1;
        }
        __syncthreads();
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
    };

    int64_t const nTiles = (p.K + BN - 1) / BN;
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
    }
    T* out = static_cast<T*>(p.out) + (bs * p.H + h0 + rowBase) * DV + half * DVH;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
    {
        int const col = nt * 8 + 2 * c;
        storeAligned(out + g * DV + col, mma::packPair<T>(o[nt][0] * inv[0], o[nt][1] * inv[0]));
        storeAligned(out + (g + 8) * DV + col, mma::packPair<T>(o[nt][2] * inv[1], o[nt][3] * inv[1]));
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
    T const* kBase = static_cast<T const*>(p.k) + (b * p.T * p.Hkv + kvh) * dk;
    T const* vBase = vFromK ? kBase : static_cast<T const*>(p.v) + (b * p.T * p.Hkv + kvh) * dv;

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

    for (int64_t j0 = 0; j0 < p.K; j0 += bn)
    {
        int64_t const rows = min(static_cast<int64_t>(bn), p.K - j0);
        __syncthreads();
        for (int r = threadIdx.x; r < rows; r += nThreads)
        {
            int const t = idx[j0 + r];
            sValid[r] = (t >= 0 && t < p.T) ? t : -1;
        }
        __syncthreads();
        for (int64_t i = threadIdx.x; i < rows * dk; i += nThreads)
        {
            int64_t const r = i / dk;
            int64_t const d = i - r * dk;
            int const t = sValid[r];
            sK[i] = t >= 0 ? toFloat(kBase[static_cast<int64_t>(t) * p.Hkv * dk + d]) : 0.F;
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
    dim3 const grid(static_cast<uint32_t>(p.B * p.S), static_cast<uint32_t>(p.Hkv * ceilDiv(groups, hc)));
    kernel<<<grid, static_cast<uint32_t>(32 * hc), smem, stream>>>(p, static_cast<int32_t>(hc), static_cast<int32_t>(bn));
    return checkCuda(cudaGetLastError(), "sparseAttentionGenericKernel launch");
}

template <typename T, int WM, int NT>
int32_t launchTcInstance(SparseAttentionParams const& p, TcConfig const& cfg, cudaStream_t stream)
{
    auto kernel = sparseAttentionMmaKernel<T, WM, NT>;
    int32_t const st = checkCuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(cfg.smem)),
        "cudaFuncSetAttribute(sparseAttentionMmaKernel)");
    if (st != kSUCCESS)
    {
        return st;
    }
    int64_t const groups = p.H / p.Hkv;
    dim3 const grid(static_cast<uint32_t>(p.B * p.S), static_cast<uint32_t>(p.Hkv * (groups / (16 * WM))));
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

TcConfig pickTcConfig(int64_t groups, int64_t Dk, int64_t Dv, bool valuesFromKeys, size_t maxSmem)
{
    for (int32_t wm : {4, 2, 1})
    {
        if (groups % (16 * wm) != 0)
        {
            continue;
        }
        for (int32_t stages : {2, 1})
        {
            size_t const smem = tcSmemBytes(wm, stages, Dk, Dv, valuesFromKeys);
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

} // namespace

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
    if (cfg.wm != 0)
    {
        return dtype == DType::kFLOAT16 ? launchTc<__half>(p, cfg, stream) : launchTc<__nv_bfloat16>(p, cfg, stream);
    }
    switch (dtype)
    {
    case DType::kFLOAT32: return launchGeneric<float>(p, dev, stream);
    case DType::kFLOAT16: return launchGeneric<__half>(p, dev, stream);
    case DType::kBFLOAT16: return launchGeneric<__nv_bfloat16>(p, dev, stream);
    case DType::kFP8_E4M3: break; // rejected above
    }
    return setLastError(kINVALID_ARGUMENT, "DSASparseAttention: unknown dtype");
}

} // namespace dsa
