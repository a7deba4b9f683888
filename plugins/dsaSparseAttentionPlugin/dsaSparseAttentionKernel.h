/*
 * Launchers of the DSASparseAttention kernels (see README.md in this folder for the design).
 */
#pragma once

#include "common/dsaKernelCommon.h"

namespace dsa
{

struct SparseAttentionParams
{
    void const* q{nullptr};          //!< [B,S,H,Dk]
    void const* k{nullptr};          //!< [B,T,Hkv,Dk]
    void const* v{nullptr};          //!< [B,T,Hkv,Dv]; unused (may be null) when valuesFromKeys
    int32_t const* indices{nullptr}; //!< [B,S,K], -1 or out-of-range entries are skipped
    void* out{nullptr};              //!< [B,S,H,Dv]
    int64_t B{0}, S{0}, T{0}, H{0}, Hkv{0}, Dk{0}, Dv{0}, K{0};
    float scale{1.F};
    //! The values are the first Dv channels of k's rows (Dv <= Dk; DeepSeek's absorbed MLA, the
    //! contract's empty v [B,0,Hkv,Dv]): v is not read, and each selected row is loaded once.
    bool valuesFromKeys{false};

    // Paged caches (ABI 5). With blockTable set, k / v (or the FP8 pools below) are pools
    // [P,page,Hkv,...] and an index t is a logical position: row pool[blockTable[b, t/page], t%page],
    // skipped when t is outside [0, M*page) or its table entry outside [0, P). T is then the number
    // of pool rows (P*page): the kernels check the translated row against it like a contiguous index.
    int32_t const* blockTable{nullptr}; //!< [B,M] int32
    int64_t P{0}, page{0}, M{0};
    //! FlashMLA's FP8 latent cache: k holds the uint8 e4m3fn codes [P,page,Hkv,C], kScale the float32
    //! scales [P,page,Hkv,C/scaleBlock], kRope the RoPE channels [P,page,Hkv,R] in ropeDtype; a key row is
    //! concat(decode(code) * scale, rope) (Dk = C + R) and the values its first C channels (Dv = C,
    //! valuesFromKeys). Requires blockTable.
    bool fp8{false};
    float const* kScale{nullptr};
    void const* kRope{nullptr};
    int64_t C{0}, R{0}, scaleBlock{0};
    DType ropeDtype{DType::kFLOAT32};
    //! Split-KV: blockIdx.z = split takes the indices [z*splitLen, min(K, (z+1)*splitLen)); with
    //! partial set every CTA writes its normalized float32 output [numSplits,B*S,H,Dv] and log2-sum-exp
    //! [numSplits,B*S,H] there instead of out, and a combine kernel writes out.
    int32_t numSplits{1};
    int64_t splitLen{0}; //!< 0: K (one split)
    float* partial{nullptr};
    float* partialLse{nullptr};
};

//! The split-KV schedule of a paged call, decided on the host once per call (deterministic for a
//! device): requested > 0 forces ceil(K / splitLen) splits with splitLen = 32 * ceil(K / requested / 32);
//! requested == 0 splits decode-sized calls (fewer CTAs than SMs) into enough CTAs for about two
//! waves with at least kSplitMinIndices indices each (at most 64 splits); requested < 0 does the same
//! for a GPU of -requested SMs instead of dev's (device-independent). Returns the number of splits.
int32_t sparseAttentionSplits(int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t K, int32_t requested,
    DeviceInfo const& dev, int64_t* splitLen);
//! Workspace bytes of a call with `splits` splits (0 when splits <= 1).
size_t sparseAttentionSplitWorkspace(int64_t B, int64_t S, int64_t H, int64_t Dv, int32_t splits);

//! Which kernel family a launch with these arguments takes on device dev: 1 = tensor-core
//! (mma.sync) path, 0 = generic path. The launcher decides with the same function, so the two
//! always agree. `aligned`: q, k, v (when read) and out are 16-byte aligned.
int32_t sparseAttentionPath(int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv, bool valuesFromKeys, bool aligned,
    DType dtype, DeviceInfo const& dev);

//! Validates the parameters and enqueues the kernel on stream (with T == 0 or K == 0 only a
//! memset of out: every row is 0). Returns a Status.
int32_t launchSparseAttention(SparseAttentionParams const& p, DType dtype, cudaStream_t stream);

//! The paged entry points (float pools and the FP8 latent cache, p.blockTable set): validates them,
//! plans the split-KV schedule (numSplits as sparseAttentionSplits' `requested`) and enqueues the
//! attention kernel and, when split, the combine kernel. Returns a Status.
int32_t launchSparseAttentionPaged(SparseAttentionParams p, DType dtype, int32_t numSplits, void* workspace,
    size_t workspaceBytes, cudaStream_t stream);

} // namespace dsa
