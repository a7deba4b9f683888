/*
 * DSAMoEExperts / DSAMoEExpertsFP8 kernels: routed experts as two grouped GEMMs over the tokens
 * sorted by expert.
 *
 * One pass over a block of tokens (as many as the workspace holds; S = tokens * K routing slots):
 *   1. route (3 small kernels, all on device): per-chunk expert histograms, one CTA that turns them
 *      into per-expert row offsets, per-chunk write cursors and per-expert tile offsets, and a
 *      stable scatter (one warp per chunk, __match_any_sync ranks) of the valid slots into
 *      expert-contiguous order: perm[row] = slot, rows of one expert in increasing slot order.
 *      Slots whose id is outside [0, E) are dropped here.
 *   2. gate_up GEMM fused with the activation: for the rows of expert e, act[row, j] =
 *      silu(x[tok] . gate_up[e, j]) * (x[tok] . gate_up[e, I + j]); one CTA computes 64 (tensor
 *      cores) or 32 (generic) columns j of both halves, so the SiLU * up product never leaves
 *      registers. act is kept in x's dtype (the down GEMM's MMA operand).
 *   3. down GEMM: slotOut[slot, n] = act[row] . down[e, n], fp32, written at the row's slot index.
 *   4. combine: out[t] = sum_k topk_weights[t, k] * slotOut[t*K + k] in k order, fp32, skipping
 *      invalid slots; a token without valid slots gets 0.
 *
 * Grouped GEMM scheduling: a 1-D grid covers the worst case, ceil(S/BM) + min(E, S) row tiles times
 * the column tiles; tileOff (written by the route scan) maps a row tile to its expert by binary
 * search, CTAs past the real tile count exit at once. Consecutive CTAs walk 8 row tiles of one
 * column tile before moving on (grouped rasterization), so a weight tile is read from DRAM about
 * once per 8 row tiles and the row tiles' activations stay in L2.
 *
 * Tensor-core path (fp16/bf16 x, sm_80+, H and I multiples of 8 (16 for FP8), 16-byte aligned
 * tensors): mma.sync.m16n8k16 with fp32 accumulation, 4-stage cp.async pipeline, ldmatrix from
 * padded shared rows. CTA tile BM x 128 columns with 4 column warps of 32 columns each:
 *   small  BM = 16  (1 x 4 warps, BK = 64)  decode, a few rows per expert  (81.1 / 67.1 KiB, FP8)
 *   medium BM = 64  (2 x 4 warps, BK = 32)                                 (60.3 / 50.3 KiB, FP8)
 *   large  BM = 128 (2 x 4 warps, BK = 32)  prefill                        (80.5 / 70.5 KiB, FP8)
 * (dynamic shared memory per CTA). The automatic choice takes the family by rows per expert; on a
 * device whose per-block shared memory cannot hold it, the family that fits with the least shared
 * memory, else the generic kernel (choosePath).
 * FP8 e4m3 weights: the tile arrives as fp8 through cp.async together with its block scales (one
 * 4-byte cp.async per row and 16 k), then each thread dequantizes 16 weights (hardware cvt on
 * sm_89+, emulated before) in fp32, multiplies by the block scale and rounds once to x's dtype into
 * a shared tile that the same MMA loop reads. So the FP8 path moves half the weight bytes and
 * reuses the 16-bit MMA; its only extra error is that rounding of fp8 * scale to bf16/fp16.
 *
 * Generic path (float32 x, and shapes/alignments the tensor-core path does not take): 64 x 64
 * tiles, 256 threads with 4 x 4 outputs each, operands converted to fp32 in shared memory.
 *
 * Determinism: no float atomics anywhere. Every output element of both GEMMs is computed by one
 * thread in a fixed k order, the combine sums the K slots in k order, and routing only uses integer
 * counts, so results are bitwise reproducible run to run; a token's result also does not depend on
 * which other tokens share the batch (the same k order on every tile configuration).
 *
 * Files: dsaMoEExpertsRouting.cu (route and combine kernels), dsaMoEExpertsGemm.cu (grouped
 * GEMMs), this file (workspace layout, argument checks, path choice, the passes).
 */
#include "dsaMoEExpertsKernel.h"

#include "dsaMoEExpertsInternal.h"
#include "common/dsaMma.cuh"

#include <cstdint>
#include <string>

namespace dsa
{
using namespace moe;

namespace
{

constexpr size_t kALIGN = 256;
constexpr int64_t kMAX_SLOTS_PER_PASS = int64_t{1} << 30;

// ---------------------------------------------------------------------------------------------
// Workspace layout of one pass of `tokens` tokens.

struct Layout
{
    size_t chunkCounts{0}; // int32 [routeChunks][E]: histograms, then write cursors
    size_t expertOff{0};   // int32 [E+1]: first row of each expert
    size_t tileOff{0};     // int32 [E+1]: first row tile of each expert
    size_t perm{0};        // int32 [S]: slot of each expert-ordered row
    size_t act{0};         // dtype [S][I]: silu(gate) * up
    size_t slotOut{0};     // fp32 [S][H]: down projection of each slot
    size_t total{0};       // bytes including the alignment slack of the base pointer
};

Layout layoutFor(int64_t tokens, int64_t K, int64_t E, int64_t H, int64_t I, size_t actElem)
{
    int64_t const S = tokens * K;
    Layout l;
    size_t off = 0;
    auto take = [&off](size_t bytes) {
        size_t const at = off;
        off += alignUp(bytes, kALIGN);
        return at;
    };
    l.chunkCounts = take(static_cast<size_t>(maxRouteChunks(S) * E) * sizeof(int32_t));
    l.expertOff = take(static_cast<size_t>(E + 1) * sizeof(int32_t));
    l.tileOff = take(static_cast<size_t>(E + 1) * sizeof(int32_t));
    l.perm = take(static_cast<size_t>(S) * sizeof(int32_t));
    l.act = take(static_cast<size_t>(S) * static_cast<size_t>(I) * actElem);
    l.slotOut = take(static_cast<size_t>(S) * static_cast<size_t>(H) * sizeof(float));
    l.total = off + kALIGN;
    return l;
}

//! Most tokens (<= N) whose pass fits in `bytes`; 0 when not even one does.
int64_t tokensThatFit(size_t bytes, int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, size_t actElem)
{
    if (N < 1 || layoutFor(1, K, E, H, I, actElem).total > bytes)
    {
        return 0;
    }
    int64_t lo = 1;
    int64_t hi = N < kMAX_SLOTS_PER_PASS / K ? N : kMAX_SLOTS_PER_PASS / K;
    if (hi < 1)
    {
        hi = 1;
    }
    while (lo < hi)
    {
        int64_t const mid = lo + (hi - lo + 1) / 2;
        if (layoutFor(mid, K, E, H, I, actElem).total <= bytes)
        {
            lo = mid;
        }
        else
        {
            hi = mid - 1;
        }
    }
    return lo;
}

bool aligned16(void const* ptr)
{
    return (reinterpret_cast<uintptr_t>(ptr) & 15U) == 0;
}

//! Whether the tensor-core kernels take these shapes and types (alignment is checked separately).
bool tcShapeOk(int64_t H, int64_t I, DType dtype, DType expertDtype, int64_t blockSize, int32_t smMajor)
{
    if (dtype == DType::kFLOAT32 || smMajor < 8)
    {
        return false;
    }
    if (expertDtype == DType::kFP8_E4M3)
    {
        return H % 16 == 0 && I % 16 == 0 && blockSize % 16 == 0;
    }
    return H % 8 == 0 && I % 8 == 0;
}

//! Tile family by routed rows per active expert (about S / min(E, S)).
int32_t pickTcPath(int64_t S, int64_t E)
{
    int64_t const active = E < S ? E : S;
    int64_t const rowsPerExpert = active > 0 ? S / active : 0;
    if (rowsPerExpert <= 16)
    {
        return kMOE_PATH_TC_SMALL;
    }
    return rowsPerExpert <= 64 ? kMOE_PATH_TC_MEDIUM : kMOE_PATH_TC_LARGE;
}

//! Whether the tensor-core GEMMs of a tile path fit in the device's shared memory.
bool tcPathFits(int32_t path, bool fp8, DeviceInfo const& dev)
{
    return tcGemmSmemBytes(path, fp8) <= dev.maxSmemOptin;
}

//! The launcher's kernel-path choice (moeExpertsPath() reports the same decision). tcOk: the
//! tensor-core kernels take the dtypes, shapes, architecture and alignment. Automatic (requested ==
//! kMOE_PATH_AUTO): the tile family by rows per expert of a pass of tokensPerPass tokens; when its
//! tiles do not fit in the device's shared memory, the tensor-core family that fits with the least
//! shared memory, else the generic kernel (the tensor-core families give the same bits, the generic
//! kernel differs by rounding only). A forced path is returned as is when it can run; otherwise
//! the result is -1 and why says what is missing.
int32_t choosePath(int32_t requested, int64_t tokensPerPass, int64_t K, int64_t E, bool tcOk, bool fp8,
    DeviceInfo const& dev, std::string& why)
{
    if (requested == kMOE_PATH_GENERIC)
    {
        return kMOE_PATH_GENERIC;
    }
    if (!tcOk)
    {
        if (requested == kMOE_PATH_AUTO)
        {
            return kMOE_PATH_GENERIC;
        }
        why = "the tensor-core kernels need fp16/bf16 x, sm_80+, H and I multiples of 8 (16 and block_size % 16 == 0 "
              "for FP8) and 16-byte aligned x, gate_up and down";
        return -1;
    }
    if (requested != kMOE_PATH_AUTO)
    {
        if (tcPathFits(requested, fp8, dev))
        {
            return requested;
        }
        why = "kernel path " + std::to_string(requested) + " needs " + std::to_string(tcGemmSmemBytes(requested, fp8))
            + " bytes of shared memory per block, the device allows " + std::to_string(dev.maxSmemOptin);
        return -1;
    }
    int32_t const preferred = pickTcPath(tokensPerPass * K, E);
    if (tcPathFits(preferred, fp8, dev))
    {
        return preferred;
    }
    int32_t chosen = kMOE_PATH_GENERIC;
    for (int32_t path : {kMOE_PATH_TC_SMALL, kMOE_PATH_TC_MEDIUM, kMOE_PATH_TC_LARGE})
    {
        if (tcPathFits(path, fp8, dev)
            && (chosen == kMOE_PATH_GENERIC || tcGemmSmemBytes(path, fp8) < tcGemmSmemBytes(chosen, fp8)))
        {
            chosen = path;
        }
    }
    return chosen;
}

//! Runs the passes: route, gate_up GEMM, down GEMM and combine for each block of tokens.
int32_t runPasses(MoEExpertsParams const& p, int32_t path, DeviceInfo const& dev, unsigned char* base,
    int64_t tokensPerPass, cudaStream_t stream)
{
    int32_t const bm = pathRows(path);
    size_t const actElem = dtypeSize(p.dtype);
    bool const fp8 = p.expertDtype == DType::kFP8_E4M3;
    size_t const xElem = dtypeSize(p.dtype);
    size_t const wElem = dtypeSize(p.weightsDtype);
    for (int64_t t0 = 0; t0 < p.N; t0 += tokensPerPass)
    {
        int64_t const tokens = p.N - t0 < tokensPerPass ? p.N - t0 : tokensPerPass;
        int64_t const S = tokens * p.K;
        Layout const l = layoutFor(tokens, p.K, p.E, p.H, p.I, actElem);
        auto* chunkCounts = reinterpret_cast<int32_t*>(base + l.chunkCounts);
        auto* expertOff = reinterpret_cast<int32_t*>(base + l.expertOff);
        auto* tileOff = reinterpret_cast<int32_t*>(base + l.tileOff);
        auto* perm = reinterpret_cast<int32_t*>(base + l.perm);
        void* act = base + l.act;
        auto* slotOut = reinterpret_cast<float*>(base + l.slotOut);
        int32_t const* ids = p.topkIds + t0 * p.K;

        int32_t st = launchRoute(ids, S, p.E, bm, chunkCounts, expertOff, tileOff, perm, stream);
        if (st != kSUCCESS)
        {
            return st;
        }
        int64_t const active = p.E < S ? p.E : S;
        GemmArgs g;
        g.perm = perm;
        g.expertOff = expertOff;
        g.tileOff = tileOff;
        g.act = act;
        g.slotOut = slotOut;
        g.K = static_cast<int32_t>(p.K);
        g.E = static_cast<int32_t>(p.E);
        g.I = static_cast<int32_t>(p.I);
        g.H = static_cast<int32_t>(p.H);
        g.bs = static_cast<int32_t>(p.blockSize);
        g.maxTilesM = static_cast<int32_t>(ceilDiv(S, bm) + active);

        GemmArgs up = g;
        up.a = static_cast<unsigned char const*>(p.x) + static_cast<size_t>(t0 * p.H) * xElem;
        up.w = p.gateUp;
        up.scale = p.gateUpScale;
        up.kd = static_cast<int32_t>(p.H);
        up.nW = static_cast<int32_t>(2 * p.I);
        st = launchGemm(up, p.dtype, fp8, true, path, dev, stream);
        if (st != kSUCCESS)
        {
            return st;
        }
        GemmArgs dn = g;
        dn.a = act;
        dn.w = p.down;
        dn.scale = p.downScale;
        dn.kd = static_cast<int32_t>(p.I);
        dn.nW = static_cast<int32_t>(p.H);
        st = launchGemm(dn, p.dtype, fp8, false, path, dev, stream);
        if (st != kSUCCESS)
        {
            return st;
        }
        void* out = static_cast<unsigned char*>(p.out) + static_cast<size_t>(t0 * p.H) * xElem;
        void const* weights = static_cast<unsigned char const*>(p.topkWeights) + static_cast<size_t>(t0 * p.K) * wElem;
        st = launchCombine(slotOut, ids, weights, p.weightsDtype, out, p.dtype, tokens, p.K, p.E, p.H, stream);
        if (st != kSUCCESS)
        {
            return st;
        }
    }
    return kSUCCESS;
}

//! The kernels index rows and columns with 32-bit integers.
constexpr int64_t kMAX_EXTENT = int64_t{1} << 30;

bool badDims(int64_t K, int64_t E, int64_t H, int64_t I)
{
    return K < 1 || E < 1 || H < 1 || I < 1 || E > kMOE_MAX_EXPERTS || K > kMAX_EXTENT || H > kMAX_EXTENT
        || I > kMAX_EXTENT;
}

} // namespace

size_t moeExpertsWorkspaceSize(int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, DType dtype)
{
    if (N < 0 || badDims(K, E, H, I))
    {
        return 0;
    }
    size_t const actElem = dtypeSize(dtype);
    size_t const one = layoutFor(1, K, E, H, I, actElem).total;
    size_t const all = layoutFor(N > 0 ? N : 1, K, E, H, I, actElem).total;
    size_t const capped = all < kMOE_WORKSPACE_BUDGET ? all : kMOE_WORKSPACE_BUDGET;
    return capped > one ? capped : one;
}

size_t moeExpertsMinWorkspaceSize(int64_t K, int64_t E, int64_t H, int64_t I, DType dtype)
{
    if (badDims(K, E, H, I))
    {
        return 0;
    }
    return layoutFor(1, K, E, H, I, dtypeSize(dtype)).total;
}

int32_t moeExpertsPath(int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, DType dtype, DType expertDtype,
    int64_t blockSize, bool aligned, DeviceInfo const& dev)
{
    if (N < 0 || badDims(K, E, H, I) || blockSize < 1 || blockSize > kMAX_EXTENT)
    {
        return -1;
    }
    bool const tcOk = aligned && tcShapeOk(H, I, dtype, expertDtype, blockSize, dev.smMajor);
    size_t const ws = moeExpertsWorkspaceSize(N, K, E, H, I, dtype);
    int64_t const tokens = tokensThatFit(ws, N > 0 ? N : 1, K, E, H, I, dtypeSize(dtype));
    std::string why;
    return choosePath(kMOE_PATH_AUTO, tokens, K, E, tcOk, expertDtype == DType::kFP8_E4M3, dev, why);
}

int32_t launchMoEExperts(MoEExpertsParams const& p, void* workspace, size_t workspaceBytes, cudaStream_t stream)
{
    if (p.N < 0 || badDims(p.K, p.E, p.H, p.I))
    {
        return setLastError(kINVALID_ARGUMENT,
            "DSAMoEExperts: need N >= 0, 1 <= K, H, I <= 2^30 and 1 <= E <= " + std::to_string(kMOE_MAX_EXPERTS)
                + " (got N="
                + std::to_string(p.N) + ", K=" + std::to_string(p.K) + ", E=" + std::to_string(p.E) + ", H="
                + std::to_string(p.H) + ", I=" + std::to_string(p.I) + ")");
    }
    if (p.activation != MoEActivation::kSILU)
    {
        return setLastError(kINVALID_ARGUMENT, "DSAMoEExperts: unknown activation (only silu is implemented)");
    }
    if (!isValidDType(static_cast<int32_t>(p.dtype)))
    {
        return setLastError(kINVALID_ARGUMENT, "DSAMoEExperts: x must be float32, float16 or bfloat16");
    }
    if (p.weightsDtype != DType::kFLOAT32 && p.weightsDtype != p.dtype)
    {
        return setLastError(kINVALID_ARGUMENT, "DSAMoEExperts: topk_weights must be float32 or x's dtype");
    }
    bool const fp8 = p.expertDtype == DType::kFP8_E4M3;
    if (!fp8 && p.expertDtype != p.dtype)
    {
        return setLastError(kINVALID_ARGUMENT, "DSAMoEExperts: gate_up/down must have x's dtype or be FP8 e4m3");
    }
    if (fp8 && (p.blockSize < 1 || p.blockSize > kMAX_EXTENT))
    {
        return setLastError(kINVALID_ARGUMENT,
            "DSAMoEExpertsFP8: block_size must be in [1, 2^30], got " + std::to_string(p.blockSize));
    }
    if (p.path < kMOE_PATH_AUTO || p.path > kMOE_PATH_TC_LARGE)
    {
        return setLastError(kINVALID_ARGUMENT, "DSAMoEExperts: unknown kernel path " + std::to_string(p.path));
    }
    if (p.N == 0)
    {
        return kSUCCESS;
    }
    if (p.x == nullptr || p.topkIds == nullptr || p.topkWeights == nullptr || p.gateUp == nullptr
        || p.down == nullptr || p.out == nullptr || (fp8 && (p.gateUpScale == nullptr || p.downScale == nullptr)))
    {
        return setLastError(kINVALID_ARGUMENT, "DSAMoEExperts: a required pointer is null");
    }
    if (workspace == nullptr)
    {
        return setLastError(kWORKSPACE_TOO_SMALL, "DSAMoEExperts: no workspace given");
    }
    auto* raw = static_cast<unsigned char*>(workspace);
    auto* base = reinterpret_cast<unsigned char*>(alignUp(reinterpret_cast<uintptr_t>(raw), kALIGN));
    size_t const actElem = dtypeSize(p.dtype);
    int64_t const tokensPerPass = tokensThatFit(workspaceBytes, p.N, p.K, p.E, p.H, p.I, actElem);
    if (tokensPerPass < 1)
    {
        return setLastError(kWORKSPACE_TOO_SMALL,
            "DSAMoEExperts: workspace of " + std::to_string(workspaceBytes) + " bytes is too small; one token needs "
                + std::to_string(layoutFor(1, p.K, p.E, p.H, p.I, actElem).total));
    }
    DeviceInfo dev;
    if (!currentDeviceInfo(dev))
    {
        return kCUDA_ERROR;
    }
    bool const tcOk = tcShapeOk(p.H, p.I, p.dtype, p.expertDtype, p.blockSize, dev.smMajor) && aligned16(p.x)
        && aligned16(p.gateUp) && aligned16(p.down);
    std::string why;
    int32_t const path = choosePath(p.path, tokensPerPass, p.K, p.E, tcOk, fp8, dev, why);
    if (path < 0)
    {
        return setLastError(kUNSUPPORTED, "DSAMoEExperts: " + why);
    }
    return runPasses(p, path, dev, base, tokensPerPass, stream);
}

} // namespace dsa
