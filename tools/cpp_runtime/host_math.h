// Host-side numerics the runtime needs without TensorRT or CUDA: half and bfloat16 conversions,
// and reading a [rows, vocab] block of logits (float32, float16 or bfloat16) into floats and its
// greedy ids. Plain C++17 (tests/test_cpp_runtime_host.py tests it with g++).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsa
{

float halfToFloat(uint16_t h);

//! Round to nearest even; the random inputs are normal samples, far from the subnormal range.
uint16_t floatToHalf(float f);

float bf16ToFloat(uint16_t b);

uint16_t floatToBf16(float f);

//! The logits' element types the runtime reads.
enum class LogitType
{
    kFLOAT,
    kHALF,
    kBF16
};

//! Row ``row`` of a [rows, vocab] block of ``type`` values at ``data``, as floats.
std::vector<float> logitRow(void const* data, LogitType type, int64_t row, int64_t vocab);

//! Each row's arg max of a [rows, vocab] block (ties to the lower id, as numpy's argmax; NaN never wins).
std::vector<int64_t> argmaxRows(void const* data, LogitType type, int64_t rows, int64_t vocab);

} // namespace dsa
