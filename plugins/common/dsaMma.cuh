/*
 * Warp-level tensor-core and async-copy helpers shared by the DSA kernels (sm_80 and newer).
 *
 * Fragment layouts follow the PTX ISA for mma.sync.m16n8k16 (row.col), with g = lane / 4 and
 * c = lane % 4:
 *   A (16x16): a0 = (row g,   k 2c..2c+1), a1 = (row g+8, k 2c..), a2 = (row g, k 8+2c..), a3 = (row g+8, k 8+2c..)
 *   B (16x8):  b0 = (k 2c..2c+1, col g),   b1 = (k 8+2c.., col g)
 *   C (16x8):  c0,c1 = (row g, cols 2c, 2c+1), c2,c3 = (row g+8, cols 2c, 2c+1)
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace dsa
{

//! The bytes of v as a To (what std::bit_cast does; usable in device code). Reading an object
//! through a pointer cast to another type is undefined behaviour (strict aliasing); a memcpy of a
//! register-sized value compiles to nothing or a register move.
template <typename To, typename From>
__device__ __forceinline__ To bitCast(From const& v)
{
    static_assert(sizeof(To) == sizeof(From), "bitCast needs types of the same size");
    To r;
    memcpy(&r, &v, sizeof(To));
    return r;
}

//! Loads a V (a 4/8/16-byte vector such as uint32_t, float2, float4, uint4) from p, which must be
//! aligned to sizeof(V): a vector access of T elements without a pointer-cast type pun. The memcpy
//! compiles to one ld of that width because the alignment is stated; note that nvcc needs
//! __builtin_assume_aligned's result cast back to the element pointer type (a void* result, or a
//! void* argument, loses the alignment and the copy is split into byte accesses).
template <typename V, typename P>
__device__ __forceinline__ V loadAligned(P const* p)
{
    P const* const a = static_cast<P const*>(__builtin_assume_aligned(p, sizeof(V)));
    V v;
    memcpy(&v, a, sizeof(V));
    return v;
}

//! Stores a V at p (aligned to sizeof(V)); the counterpart of loadAligned.
template <typename V, typename P>
__device__ __forceinline__ void storeAligned(P* p, V const& v)
{
    P* const a = static_cast<P*>(__builtin_assume_aligned(p, sizeof(V)));
    memcpy(a, &v, sizeof(V));
}

namespace mma
{

__device__ __forceinline__ uint32_t smemAddr(void const* ptr)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

//! 16-byte global->shared copy that bypasses L1; when valid is false the destination is zero-filled
//! and nothing is read (src must still be a mapped address, callers pass the tensor base).
__device__ __forceinline__ void cpAsync16(void* smem, void const* gmem, bool valid = true)
{
    int const srcBytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smemAddr(smem)), "l"(gmem), "r"(srcBytes)
                 : "memory");
}

//! 4-byte global->shared copy through L1 (small, reused data such as block scales); zero-fills
//! when valid is false, like cpAsync16.
__device__ __forceinline__ void cpAsync4(void* smem, void const* gmem, bool valid = true)
{
    int const srcBytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smemAddr(smem)), "l"(gmem), "r"(srcBytes)
                 : "memory");
}

__device__ __forceinline__ void cpAsyncCommit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cpAsyncWait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrixX4(uint32_t (&r)[4], void const* smem)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smemAddr(smem)));
}

__device__ __forceinline__ void ldmatrixX4Trans(uint32_t (&r)[4], void const* smem)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smemAddr(smem)));
}

template <typename T>
struct Mma16816;

template <>
struct Mma16816<__nv_bfloat16>
{
    __device__ __forceinline__ static void run(float (&c)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <>
struct Mma16816<__half>
{
    __device__ __forceinline__ static void run(float (&c)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    Mma16816<T>::run(c, a, b0, b1);
}

//! Two floats packed into one 32-bit register of T pairs (low half = first element), each rounded
//! to nearest even.
template <typename T>
__device__ __forceinline__ uint32_t packPair(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t packPair<__nv_bfloat16>(float lo, float hi)
{
    return bitCast<uint32_t>(__floats2bfloat162_rn(lo, hi));
}

template <>
__device__ __forceinline__ uint32_t packPair<__half>(float lo, float hi)
{
    return bitCast<uint32_t>(__floats2half2_rn(lo, hi));
}

} // namespace mma

template <typename T>
__device__ __forceinline__ float toFloat(T v);
template <>
__device__ __forceinline__ float toFloat<float>(float v)
{
    return v;
}
template <>
__device__ __forceinline__ float toFloat<__half>(__half v)
{
    return __half2float(v);
}
template <>
__device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v)
{
    return v;
}
template <>
__device__ __forceinline__ __half fromFloat<__half>(float v)
{
    return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}

} // namespace dsa
