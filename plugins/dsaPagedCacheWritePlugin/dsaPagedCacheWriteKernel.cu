/*
 * The paged cache write: pool[indices[r, 0], indices[r, 1], :] = updates[r, :] for each new token r
 * (r = b * S + s) whose page lies in [0, P) and offset in [0, page); any other row is skipped, so an
 * index never reaches memory outside the pool. This is the paged graph's ScatterND done in place:
 * the pool is the plugin's input and its output (TensorRT's aliased plugin I/O).
 *
 * One warp per row. The bits are copied unchanged (elements are moved as 16- or 32-bit words, never
 * converted). When the pool row and the update row sit at the same address modulo 16 the warp
 * copies the few elements up to the first 16-byte boundary one by one, the body in 16-byte words and
 * the remaining elements (the tail: widths whose rows are not a multiple of 16 bytes) one by one;
 * otherwise every element is copied one by one. Rows naming the same slot race and one of them wins:
 * the paged graph sends only padding tokens to one slot (the scratch slot, page 0 offset 0).
 */
#include "dsaPagedCacheWriteKernel.h"

#include <cstdint>

namespace dsa
{
namespace
{

constexpr int kWARPS = kCACHE_WRITE_ROWS_PER_CTA;

//! Elements [0, n) of src into dst, the warp's lanes striding by 32.
template <typename E>
__device__ __forceinline__ void copyElements(E* dst, E const* src, int64_t n, int lane)
{
    for (int64_t i = lane; i < n; i += 32)
    {
        dst[i] = src[i];
    }
}

//! E: an unsigned word of the element's size (uint32_t for float32, uint16_t for float16/bfloat16).
template <typename E>
__global__ void __launch_bounds__(kWARPS * 32) pagedCacheWriteKernel(PagedCacheWriteParams p)
{
    int const lane = static_cast<int>(threadIdx.x & 31U);
    int64_t const row = static_cast<int64_t>(blockIdx.x) * kWARPS + static_cast<int64_t>(threadIdx.x >> 5);
    if (row >= p.B * p.S)
    {
        return;
    }
    int64_t const page = __ldg(p.indices + 2 * row);
    int64_t const offset = __ldg(p.indices + 2 * row + 1);
    if (page < 0 || page >= p.P || offset < 0 || offset >= p.page)
    {
        return; // out of range: never written
    }
    E* dst = static_cast<E*>(p.pool) + (page * p.page + offset) * p.W;
    E const* src = static_cast<E const*>(p.updates) + row * p.W;
    uintptr_t const d = reinterpret_cast<uintptr_t>(dst);
    uintptr_t const s = reinterpret_cast<uintptr_t>(src);
    int64_t head = p.W; // elements before the 16-byte body (all of them when there is no body)
    int64_t words = 0;  // 16-byte words of the body
    if (((d ^ s) & 15U) == 0)
    {
        int64_t const lead = static_cast<int64_t>(((16U - (d & 15U)) & 15U) / sizeof(E));
        head = lead < p.W ? lead : p.W;
        words = (p.W - head) * static_cast<int64_t>(sizeof(E)) / 16;
    }
    copyElements(dst, src, head, lane);
    uint4* dstWords = reinterpret_cast<uint4*>(dst + head);
    uint4 const* srcWords = reinterpret_cast<uint4 const*>(src + head);
    for (int64_t i = lane; i < words; i += 32)
    {
        dstWords[i] = srcWords[i];
    }
    int64_t const done = head + words * (16 / static_cast<int64_t>(sizeof(E)));
    copyElements(dst + done, src + done, p.W - done, lane); // the tail
}

template <typename E>
int32_t launchTyped(PagedCacheWriteParams const& p, cudaStream_t stream)
{
    int64_t const rows = p.B * p.S;
    uint32_t const grid = static_cast<uint32_t>((rows + kWARPS - 1) / kWARPS);
    pagedCacheWriteKernel<E><<<grid, kWARPS * 32, 0, stream>>>(p);
    return checkCuda(cudaGetLastError(), "pagedCacheWriteKernel launch");
}

} // namespace

int32_t launchPagedCacheWrite(PagedCacheWriteParams const& p, DType dtype, cudaStream_t stream)
{
    if (p.B < 0 || p.S < 0 || p.P < 0 || p.page < 1 || p.W < 1)
    {
        return setLastError(
            kINVALID_ARGUMENT, "dsa_paged_cache_write: need B >= 0, S >= 0, P >= 0, page >= 1 and W >= 1");
    }
    if (p.B == 0 || p.S == 0 || p.P == 0)
    {
        return kSUCCESS; // no token, or an empty pool that no index can name
    }
    if (p.pool == nullptr || p.indices == nullptr || p.updates == nullptr)
    {
        return setLastError(kINVALID_ARGUMENT, "dsa_paged_cache_write: pool, indices and updates must not be null");
    }
    if (p.B > 0x7fffffffLL / p.S || p.P > INT64_MAX / p.page / p.W)
    {
        return setLastError(kUNSUPPORTED, "dsa_paged_cache_write: B * S must be below 2^31 and P * page * W below 2^63");
    }
    if (!isValidDType(static_cast<int32_t>(dtype)))
    {
        return setLastError(
            kINVALID_ARGUMENT, "dsa_paged_cache_write: pool and updates must be float32, float16 or bfloat16");
    }
    size_t const elem = dtypeSize(dtype);
    if ((reinterpret_cast<uintptr_t>(p.pool) | reinterpret_cast<uintptr_t>(p.updates)) % elem != 0
        || reinterpret_cast<uintptr_t>(p.indices) % 8 != 0)
    {
        return setLastError(kINVALID_ARGUMENT,
            "dsa_paged_cache_write: pool and updates must be aligned to their element size and indices to 8 bytes");
    }
    return elem == 4 ? launchTyped<uint32_t>(p, stream) : launchTyped<uint16_t>(p, stream);
}

} // namespace dsa
