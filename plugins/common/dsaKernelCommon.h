/*
 * Shared host-side definitions of the DSA kernels: element types, status codes, error reporting
 * and device queries. Used by the launchers, the C ABI and the TensorRT plugin glue.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsa
{

//! Element types; values match dsa_dtype_t in dsa_kernels.h. kFP8_E4M3 is only a weight type
//! (DSAMoEExpertsFP8's expert matrices); activations are always one of the first three.
enum class DType : int32_t
{
    kFLOAT32 = 0,
    kFLOAT16 = 1,
    kBFLOAT16 = 2,
    kFP8_E4M3 = 3
};

//! Status codes; values match dsa_status_t in dsa_kernels.h.
enum Status : int32_t
{
    kSUCCESS = 0,
    kINVALID_ARGUMENT = 1,
    kUNSUPPORTED = 2,
    kWORKSPACE_TOO_SMALL = 3,
    kCUDA_ERROR = 4
};

//! An activation type: float32, float16 or bfloat16.
inline bool isValidDType(int32_t v)
{
    return v >= 0 && v <= 2;
}

//! An activation type or FP8 e4m3.
inline bool isValidWeightDType(int32_t v)
{
    return v >= 0 && v <= 3;
}

inline size_t dtypeSize(DType t)
{
    return t == DType::kFLOAT32 ? 4 : (t == DType::kFP8_E4M3 ? 1 : 2);
}

//! Records a message for dsa_last_error() on this host thread and returns status.
int32_t setLastError(int32_t status, std::string const& message);
//! The message of the last failure on this host thread.
char const* lastError();
//! Clears the message (called at the start of every entry point).
void clearLastError();
//! Turns a CUDA error into kCUDA_ERROR with a message naming the kernel; kSUCCESS otherwise.
int32_t checkCuda(cudaError_t err, char const* what);

//! Properties of the current device that pick a kernel configuration (cached per device).
struct DeviceInfo
{
    int32_t device{0};
    int32_t smMajor{0};
    int32_t smMinor{0};
    int32_t numSMs{1};
    size_t maxSmemOptin{48 * 1024};
};
//! Returns false (and sets the last error) when no device can be queried.
bool currentDeviceInfo(DeviceInfo& info);

inline int64_t ceilDiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

inline size_t alignUp(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

} // namespace dsa
