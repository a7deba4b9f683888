/*
 * Shared pieces of the DSA TensorRT plugin glue: logging through the TensorRT logger finder,
 * tolerant plugin-field parsing, dtype mapping and shape helpers. Uses only inline/virtual
 * TensorRT API, so the getCreators library links without libnvinfer. The IPluginV3 base classes
 * built on these are in dsaPluginBase.h.
 */
#pragma once

#include "NvInferRuntime.h"
#include "common/dsaKernelCommon.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace dsa
{
namespace plugin
{

constexpr char const* kPLUGIN_NAMESPACE = "dsa";
constexpr char const* kPLUGIN_VERSION = "1";

//! Remembers the logger finder handed over by TensorRT (first non-null one wins).
void setPluginLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;
//! The TensorRT logger, or nullptr when none was provided (messages then go to stderr).
nvinfer1::ILogger* getPluginLogger() noexcept;

void logError(std::string const& message) noexcept;
void logWarning(std::string const& message) noexcept;
void logVerbose(std::string const& message) noexcept;

//! Thrown inside the glue for invalid attributes or shapes; always caught before returning to TensorRT.
class PluginError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

//! Maps a TensorRT type to the kernel dtype; false for types the kernels do not take.
bool toKernelDType(nvinfer1::DataType type, DType& out) noexcept;
//! True for kFLOAT, kHALF and kBF16.
bool isFloatType(nvinfer1::DataType type) noexcept;

//! Reads an integer attribute stored as any integer field type (the ONNX parser narrows INT to int32).
int64_t readIntField(nvinfer1::PluginField const& field);
//! Reads a float attribute stored as float32/float64/float16 (or an integer type).
float readFloatField(nvinfer1::PluginField const& field);
//! Reads a string attribute (kCHAR); a terminating NUL inside `length` is dropped.
std::string readStringField(nvinfer1::PluginField const& field);

//! "[d0,d1,...]" for error messages.
std::string dimsToString(nvinfer1::Dims const& d);
//! Two extents agree, or one of them is not known yet (-1 at build time).
inline bool sameOrUnknown(int64_t a, int64_t b)
{
    return a < 0 || b < 0 || a == b;
}

//! Checks a kernel Status and throws PluginError with the kernel's message when it failed.
void checkKernelStatus(int32_t status, char const* what);

} // namespace plugin
} // namespace dsa
