#include "common/dsaPluginCommon.h"

#include <cstdio>
#include <cstring>
#include <mutex>

#include <cuda_fp16.h>

namespace dsa
{
namespace plugin
{
namespace
{
std::mutex gLoggerMutex;
nvinfer1::ILoggerFinder* gLoggerFinder{nullptr};

void logMessage(nvinfer1::ILogger::Severity severity, std::string const& message) noexcept
{
    try
    {
        std::string const text = std::string("[dsa plugin] ") + message;
        nvinfer1::ILogger* logger = getPluginLogger();
        if (logger != nullptr)
        {
            logger->log(severity, text.c_str());
        }
        else if (severity <= nvinfer1::ILogger::Severity::kWARNING)
        {
            std::fprintf(stderr, "%s\n", text.c_str());
        }
    }
    catch (...)
    {
        // Logging must never throw into TensorRT.
    }
}
} // namespace

void setPluginLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept
{
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    if (gLoggerFinder == nullptr && finder != nullptr)
    {
        gLoggerFinder = finder;
    }
}

nvinfer1::ILogger* getPluginLogger() noexcept
{
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    return gLoggerFinder != nullptr ? gLoggerFinder->findLogger() : nullptr;
}

void logError(std::string const& message) noexcept
{
    logMessage(nvinfer1::ILogger::Severity::kERROR, message);
}

void logWarning(std::string const& message) noexcept
{
    logMessage(nvinfer1::ILogger::Severity::kWARNING, message);
}

void logVerbose(std::string const& message) noexcept
{
    logMessage(nvinfer1::ILogger::Severity::kVERBOSE, message);
}

bool toKernelDType(nvinfer1::DataType type, DType& out) noexcept
{
    switch (type)
    {
    case nvinfer1::DataType::kFLOAT: out = DType::kFLOAT32; return true;
    case nvinfer1::DataType::kHALF: out = DType::kFLOAT16; return true;
    case nvinfer1::DataType::kBF16: out = DType::kBFLOAT16; return true;
    default: return false;
    }
}

bool isFloatType(nvinfer1::DataType type) noexcept
{
    DType unused{};
    return toKernelDType(type, unused);
}

int64_t readIntField(nvinfer1::PluginField const& field)
{
    if (field.data == nullptr || field.length < 1)
    {
        throw PluginError(std::string("attribute '") + field.name + "' has no value");
    }
    switch (field.type)
    {
    case nvinfer1::PluginFieldType::kINT8: return *static_cast<int8_t const*>(field.data);
    case nvinfer1::PluginFieldType::kINT16: return *static_cast<int16_t const*>(field.data);
    case nvinfer1::PluginFieldType::kINT32: return *static_cast<int32_t const*>(field.data);
    case nvinfer1::PluginFieldType::kINT64: return *static_cast<int64_t const*>(field.data);
    default: throw PluginError(std::string("attribute '") + field.name + "' must be an integer");
    }
}

float readFloatField(nvinfer1::PluginField const& field)
{
    if (field.data == nullptr || field.length < 1)
    {
        throw PluginError(std::string("attribute '") + field.name + "' has no value");
    }
    switch (field.type)
    {
    case nvinfer1::PluginFieldType::kFLOAT32: return *static_cast<float const*>(field.data);
    case nvinfer1::PluginFieldType::kFLOAT64: return static_cast<float>(*static_cast<double const*>(field.data));
    case nvinfer1::PluginFieldType::kFLOAT16:
    {
        uint16_t bits = 0;
        std::memcpy(&bits, field.data, sizeof(bits));
        __half_raw raw;
        raw.x = bits;
        return __half2float(__half(raw));
    }
    case nvinfer1::PluginFieldType::kINT32: return static_cast<float>(*static_cast<int32_t const*>(field.data));
    case nvinfer1::PluginFieldType::kINT64: return static_cast<float>(*static_cast<int64_t const*>(field.data));
    default: throw PluginError(std::string("attribute '") + field.name + "' must be a float");
    }
}

std::string readStringField(nvinfer1::PluginField const& field)
{
    if (field.type != nvinfer1::PluginFieldType::kCHAR && field.type != nvinfer1::PluginFieldType::kUNKNOWN)
    {
        throw PluginError(std::string("attribute '") + field.name + "' must be a string");
    }
    if (field.data == nullptr || field.length < 1)
    {
        return std::string();
    }
    char const* chars = static_cast<char const*>(field.data);
    size_t n = static_cast<size_t>(field.length);
    while (n > 0 && chars[n - 1] == '\0')
    {
        --n;
    }
    return std::string(chars, n);
}

std::string dimsToString(nvinfer1::Dims const& d)
{
    std::string s = "[";
    for (int32_t i = 0; i < d.nbDims; ++i)
    {
        s += (i ? "," : "") + std::to_string(d.d[i]);
    }
    return s + "]";
}

void checkKernelStatus(int32_t status, char const* what)
{
    if (status != kSUCCESS)
    {
        throw PluginError(std::string(what) + " failed: " + lastError());
    }
}

} // namespace plugin
} // namespace dsa
