#include "dsaKernelCommon.h"

#include <mutex>

namespace dsa
{
namespace
{
thread_local std::string tLastError;

constexpr int32_t kMAX_DEVICES = 64;
std::once_flag gDeviceOnce[kMAX_DEVICES];
DeviceInfo gDeviceInfo[kMAX_DEVICES];
bool gDeviceOk[kMAX_DEVICES];
} // namespace

int32_t setLastError(int32_t status, std::string const& message)
{
    tLastError = message;
    return status;
}

char const* lastError()
{
    return tLastError.c_str();
}

void clearLastError()
{
    tLastError.clear();
}

int32_t checkCuda(cudaError_t err, char const* what)
{
    if (err == cudaSuccess)
    {
        return kSUCCESS;
    }
    return setLastError(kCUDA_ERROR, std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

bool currentDeviceInfo(DeviceInfo& info)
{
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess || device < 0 || device >= kMAX_DEVICES)
    {
        setLastError(kCUDA_ERROR, std::string("cudaGetDevice failed: ") + cudaGetErrorString(err));
        return false;
    }
    std::call_once(gDeviceOnce[device], [device]() {
        DeviceInfo d;
        bool ok = true;
        d.device = device;
        int v = 0;
        ok = cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess;
        d.smMajor = v;
        ok = ok && cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
        d.smMinor = v;
        ok = ok && cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device) == cudaSuccess;
        d.numSMs = v > 0 ? v : 1;
        ok = ok && cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess;
        d.maxSmemOptin = static_cast<size_t>(v);
        gDeviceInfo[device] = d;
        gDeviceOk[device] = ok;
    });
    if (!gDeviceOk[device])
    {
        setLastError(kCUDA_ERROR, "querying the CUDA device attributes failed");
        return false;
    }
    info = gDeviceInfo[device];
    return true;
}

} // namespace dsa
