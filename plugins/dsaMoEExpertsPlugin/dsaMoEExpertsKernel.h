/*
 * Launchers of the DSAMoEExperts / DSAMoEExpertsFP8 kernels (see README.md in this folder).
 */
#pragma once

#include "common/dsaKernelCommon.h"

namespace dsa
{

//! Activation of the gate projection; values match dsa_activation_t in dsa_kernels.h.
enum class MoEActivation : int32_t
{
    kSILU = 0
};

//! Kernel families of the grouped GEMMs; values match dsa_moe_experts_path() in dsa_kernels.h.
enum MoEPath : int32_t
{
    kMOE_PATH_AUTO = -1,     //!< pick from dtype, shapes, alignment and rows per expert
    kMOE_PATH_GENERIC = 0,   //!< CUDA cores, fp32 math, any shape (the float32 path)
    kMOE_PATH_TC_SMALL = 1,  //!< mma.sync, 16 routed rows per tile (decode)
    kMOE_PATH_TC_MEDIUM = 2, //!< mma.sync, 64 routed rows per tile
    kMOE_PATH_TC_LARGE = 3   //!< mma.sync, 128 routed rows per tile (prefill)
};

struct MoEExpertsParams
{
    void const* x{nullptr};              //!< [N,H] dtype
    int32_t const* topkIds{nullptr};     //!< [N,K]; ids outside [0,E) are skipped
    void const* topkWeights{nullptr};    //!< [N,K] weightsDtype (float32 or dtype)
    void const* gateUp{nullptr};         //!< [E,2I,H] expertDtype: rows [0,I) gate, [I,2I) up
    void const* down{nullptr};           //!< [E,H,I] expertDtype
    float const* gateUpScale{nullptr};   //!< FP8: [E, ceil(2I/bs), ceil(H/bs)]
    float const* downScale{nullptr};     //!< FP8: [E, ceil(H/bs), ceil(I/bs)]
    void* out{nullptr};                  //!< [N,H] dtype
    int64_t N{0}, K{0}, E{0}, H{0}, I{0};
    int64_t blockSize{128};              //!< FP8 scale block (bs x bs)
    DType dtype{DType::kBFLOAT16};       //!< x and out
    DType weightsDtype{DType::kFLOAT32}; //!< topk_weights: float32 or dtype
    DType expertDtype{DType::kBFLOAT16}; //!< gate_up/down: dtype or kFP8_E4M3
    MoEActivation activation{MoEActivation::kSILU};
    int32_t path{kMOE_PATH_AUTO};        //!< force a kernel family (tests, benchmarks)
};

//! Upper bound of the workspace kept by default (larger token counts run in several passes).
constexpr size_t kMOE_WORKSPACE_BUDGET = size_t{1} << 30;
//! Largest expert count (the routing histograms live in shared memory).
constexpr int64_t kMOE_MAX_EXPERTS = 8192;

//! Workspace for N tokens: the bytes of one pass over all N tokens, capped at kMOE_WORKSPACE_BUDGET,
//! at least one token's worth. Monotone in every argument, so the size for a profile's maximum
//! shapes covers all smaller shapes.
size_t moeExpertsWorkspaceSize(int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, DType dtype);
//! The smallest workspace the launcher accepts (one token per pass).
size_t moeExpertsMinWorkspaceSize(int64_t K, int64_t E, int64_t H, int64_t I, DType dtype);

//! The kernel family an automatic launch with these arguments uses on device dev (a MoEPath value),
//! with the default workspace; `aligned`: x, gate_up and down are 16-byte aligned. The launcher
//! decides with the same function, so the two always agree. Negative on invalid arguments.
int32_t moeExpertsPath(int64_t N, int64_t K, int64_t E, int64_t H, int64_t I, DType dtype, DType expertDtype,
    int64_t blockSize, bool aligned, DeviceInfo const& dev);

//! Validates the parameters and enqueues routing, the two grouped GEMMs and the combine, in passes
//! of as many tokens as the workspace holds. Never synchronizes. Returns a Status.
int32_t launchMoEExperts(MoEExpertsParams const& p, void* workspace, size_t workspaceBytes, cudaStream_t stream);

} // namespace dsa
