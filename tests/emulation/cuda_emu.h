/*
 * CUDA built-ins for running the project's kernels on the CPU (force-included by the emulation
 * build: g++ -include cuda_emu.h). The kernel sources are compiled unchanged apart from the
 * rewrites done by preprocess.py: `k<<<cfg>>>(args)` becomes emu::launchKernel, `__shared__`
 * declarations become per-CTA storage, and `asm volatile(...)` becomes emu::ptxExec with the PTX
 * text and its operands, which emu_runtime.cpp decodes and executes with the PTX ISA's semantics.
 *
 * Every thread of a CTA is a fiber. Fibers switch only at the points below (barriers, warp
 * collectives, PTX instructions, atomics, __ldg): plain loads and stores between two such points run
 * without interruption, so a missing barrier shows as a read of NaN-poisoned shared memory or of
 * a value another thread has not yet written, depending on the scheduling order.
 */
#pragma once

#define DSA_CUDA_EMULATION 1

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#undef __launch_bounds__
#define __launch_bounds__(...)

namespace emu
{

//! The coordinates of the fiber that is running (set by the scheduler at every switch).
struct ThreadCoords
{
    uint3 threadIdx;
    uint3 blockIdx;
    dim3 blockDim;
    dim3 gridDim;
};
extern ThreadCoords* gCoords;

// ---- scheduling points ---------------------------------------------------------------------------
void syncThreads();
void syncWarp(uint32_t mask);
void maybeYield(); //!< a preemption point (scrambled orders only)

// ---- warp collectives (values travel as 64-bit words) -----------------------------------------
uint64_t shflXor(uint32_t mask, uint64_t v, int laneMask, int width);
uint64_t shflUp(uint32_t mask, uint64_t v, unsigned delta, int width);
uint64_t shflDown(uint32_t mask, uint64_t v, unsigned delta, int width);
uint64_t shflIdx(uint32_t mask, uint64_t v, int src, int width);
uint32_t ballot(uint32_t mask, bool pred);
uint32_t matchAny(uint32_t mask, uint64_t v);

// ---- memory --------------------------------------------------------------------------------------
//! Faults unless [p, p+bytes) lies inside one registered global allocation; returns p.
void const* checkGlobal(void const* p, size_t bytes, char const* what);
void* dynamicSmem();
void* staticSmem(int site, size_t bytes, size_t align);
uint32_t cvtaShared(void const* p);

// ---- PTX -----------------------------------------------------------------------------------------
struct PtxOperand
{
    void* ref;       //!< output or in/out: where the result goes
    uint64_t value;  //!< input value (bits)
    int bytes;       //!< size of the operand
    bool isOutput;
};
void ptxExec(char const* text, PtxOperand const* ops, int n);

template <typename T>
PtxOperand ptxOut(T& ref)
{
    static_assert(sizeof(T) <= 8, "PTX operand wider than 64 bits");
    uint64_t bits = 0;
    std::memcpy(&bits, &ref, sizeof(T));
    return PtxOperand{static_cast<void*>(&ref), bits, static_cast<int>(sizeof(T)), true};
}

template <typename T>
PtxOperand ptxIn(T const& v)
{
    uint64_t bits = 0;
    if constexpr (std::is_pointer_v<T>)
    {
        bits = reinterpret_cast<uint64_t>(v);
    }
    else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>)
    {
        bits = static_cast<uint64_t>(static_cast<int64_t>(v));
    }
    else
    {
        static_assert(sizeof(T) <= 8, "PTX operand wider than 64 bits");
        std::memcpy(&bits, &v, sizeof(T));
    }
    return PtxOperand{nullptr, bits, static_cast<int>(sizeof(T)), false};
}

void checkGlobalOrShared(void const* p, size_t bytes, char const* what);

// ---- atomics (a preemption point before each, so interleavings between CTAs can show) ----------
template <typename T>
T atomicRmwAdd(T* p, T v)
{
    maybeYield();
    checkGlobalOrShared(p, sizeof(T), "atomic");
    T const old = *p;
    *p = old + v;
    return old;
}

// ---- launches ------------------------------------------------------------------------------------
struct LaunchConfig
{
    dim3 grid;
    dim3 block;
    size_t smem;
    cudaStream_t stream;
    LaunchConfig(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr)
        : grid(g)
        , block(b)
        , smem(s)
        , stream(st)
    {
    }
};

using ThreadBody = void (*)(void* closure);
//! Runs body(closure) once per thread of every CTA of the grid; returns the launch's error.
cudaError_t launch(void const* kernel, LaunchConfig const& cfg, ThreadBody body, void* closure);

template <typename... P, typename... A>
void launchKernel(LaunchConfig const& cfg, void (*kernel)(P...), A&&... args)
{
    // CUDA copies the arguments into the parameter space once; every thread then reads them.
    struct Closure
    {
        void (*kernel)(P...);
        std::tuple<std::decay_t<P>...> params;
    } closure{kernel, std::tuple<std::decay_t<P>...>(static_cast<std::decay_t<P>>(std::forward<A>(args))...)};
    ThreadBody body = [](void* c) {
        auto* cl = static_cast<Closure*>(c);
        std::apply(cl->kernel, cl->params); // each thread gets its own copy of the by-value params
    };
    launch(reinterpret_cast<void const*>(kernel), cfg, body, &closure);
}

} // namespace emu

//! cuda_runtime.h's typed overload is compiled for nvcc only; the launchers pass kernel templates.
template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value)
{
    return ::cudaFuncSetAttribute(reinterpret_cast<void const*>(kernel), attr, value);
}

// ---- the CUDA names the kernels use -------------------------------------------------------------
#define threadIdx (::emu::gCoords->threadIdx)
#define blockIdx (::emu::gCoords->blockIdx)
#define blockDim (::emu::gCoords->blockDim)
#define gridDim (::emu::gCoords->gridDim)
#ifndef warpSize
#define warpSize 32
#endif

inline void __syncthreads()
{
    ::emu::syncThreads();
}
inline void __syncwarp(unsigned mask = 0xffffffffU)
{
    ::emu::syncWarp(mask);
}

namespace emu
{
template <typename T>
uint64_t toBits(T v)
{
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 64 bits");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T>
T fromBits(uint64_t b)
{
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}
} // namespace emu

template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32)
{
    return ::emu::fromBits<T>(::emu::shflXor(mask, ::emu::toBits(var), laneMask, width));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32)
{
    return ::emu::fromBits<T>(::emu::shflUp(mask, ::emu::toBits(var), delta, width));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32)
{
    return ::emu::fromBits<T>(::emu::shflDown(mask, ::emu::toBits(var), delta, width));
}
template <typename T>
T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32)
{
    return ::emu::fromBits<T>(::emu::shflIdx(mask, ::emu::toBits(var), srcLane, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred)
{
    return ::emu::ballot(mask, pred != 0);
}
inline int __any_sync(unsigned mask, int pred)
{
    return ::emu::ballot(mask, pred != 0) != 0;
}
inline int __all_sync(unsigned mask, int pred)
{
    return ::emu::ballot(mask, pred != 0) == (mask & ::emu::ballot(mask, true));
}
template <typename T>
unsigned __match_any_sync(unsigned mask, T value)
{
    static_assert(std::is_integral_v<T>, "__match_any_sync takes an integer");
    return ::emu::matchAny(mask, static_cast<uint64_t>(value));
}

template <typename T>
T __ldg(T const* p)
{
    ::emu::maybeYield();
    ::emu::checkGlobal(p, sizeof(T), "__ldg");
    return *p;
}

inline int __popc(unsigned v)
{
    return __builtin_popcount(v);
}
inline int __popcll(unsigned long long v)
{
    return __builtin_popcountll(v);
}
inline int __ffs(int v)
{
    return __builtin_ffs(v);
}
inline int __clz(int v)
{
    return v == 0 ? 32 : __builtin_clz(static_cast<unsigned>(v));
}
inline unsigned __float_as_uint(float v)
{
    unsigned u;
    std::memcpy(&u, &v, 4);
    return u;
}
inline float __uint_as_float(unsigned u)
{
    float v;
    std::memcpy(&v, &u, 4);
    return v;
}
inline int __float_as_int(float v)
{
    int u;
    std::memcpy(&u, &v, 4);
    return u;
}
inline float __int_as_float(int u)
{
    float v;
    std::memcpy(&v, &u, 4);
    return v;
}
inline float __expf(float v)
{
    return std::exp(v);
}
inline float __fdividef(float a, float b)
{
    return a / b;
}
inline size_t __cvta_generic_to_shared(void const* p)
{
    return ::emu::cvtaShared(p);
}

template <typename A, typename B>
inline auto min(A a, B b) -> std::common_type_t<A, B>
{
    using C = std::common_type_t<A, B>;
    return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
}
template <typename A, typename B>
inline auto max(A a, B b) -> std::common_type_t<A, B>
{
    using C = std::common_type_t<A, B>;
    return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}

inline float atomicAdd(float* p, float v)
{
    return ::emu::atomicRmwAdd(p, v);
}
inline int atomicAdd(int* p, int v)
{
    return ::emu::atomicRmwAdd(p, v);
}
inline unsigned atomicAdd(unsigned* p, unsigned v)
{
    return ::emu::atomicRmwAdd(p, v);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v)
{
    return ::emu::atomicRmwAdd(p, v);
}
inline unsigned atomicOr(unsigned* p, unsigned v)
{
    ::emu::maybeYield();
    ::emu::checkGlobalOrShared(p, 4, "atomicOr");
    unsigned const old = *p;
    *p = old | v;
    return old;
}
inline int atomicMax(int* p, int v)
{
    ::emu::maybeYield();
    ::emu::checkGlobalOrShared(p, 4, "atomicMax");
    int const old = *p;
    *p = old > v ? old : v;
    return old;
}
