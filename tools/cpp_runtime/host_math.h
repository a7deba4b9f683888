// Host-side numerics the runtime needs without TensorRT or CUDA: half and bfloat16 conversions,
// reading a [rows, vocab] block of logits (float32, float16 or bfloat16) into floats and its
// greedy ids, and the host side of the device sampler (dsa_sample_tokens of libdsa_kernels.so):
// each call's per-row settings, the checks of a sequence's settings, the Philox4x32-10 draw the
// device makes, and where the kernel library is looked for. Plain C++17
// (tests/test_cpp_runtime_host.py tests it with g++).
#pragma once

#include <cstddef>
#include <array>
#include <cstdint>
#include <map>
#include <string>
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

//! How one sequence chooses its tokens, and how many it has chosen (the Philox counter of the next).
struct SlotSampling
{
    float temperature{0.F};  //!< 0: greedy
    float topP{1.F};
    uint64_t seed{0};
    int64_t step{0};         //!< tokens chosen so far: 0 for the token of its prefill
};

//! Throws std::invalid_argument unless 0 <= temperature < inf and 0 < topP <= 1 (the Python
//! SamplingSettings' rules).
void checkSampling(float temperature, float topP);

//! The device sampler's per-row arguments of one call: row r is the sequence of ``rowSlots[r]``
//! (its settings and step from ``slots``); idle rows (slot -1, or a slot without settings) are
//! greedy with seed and offset 0.
struct SamplingRows
{
    std::vector<float> temperature;
    std::vector<float> topP;
    std::vector<uint64_t> seeds;
    std::vector<int64_t> offsets;
    bool anySampled{false};  //!< a row with temperature > 0
};
SamplingRows samplingRows(std::vector<int> const& rowSlots, std::map<int, SlotSampling> const& slots);

//! Philox4x32-10 (Random123's philox4x32 with 10 rounds) of ``counter`` under ``key``.
std::array<uint32_t, 4> philox4x32x10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

//! The device sampler's draw for ``seed`` at counter ``offset``: u53 = ((x1 << 32) | x0) >> 11 of
//! Philox4x32-10 with key (seed low, seed high) and counter (offset low, offset high, 0, 0);
//! u = u53 / 2^53 (dsa_export.runtime.philox.philox_u53 in Python).
uint64_t philoxU53(uint64_t seed, uint64_t offset);

//! Where libdsa_kernels.so (the device sampler) is looked for, in order: ``explicitPath``, else
//! ``envPath`` ($DSA_EXPORT_KERNELS_LIB; may be null), else libdsa_kernels.so in the folder of
//! ``pluginLibrary`` (the plugin build writes both there). Empty when none is known.
std::vector<std::string> kernelsLibraryCandidates(std::string const& explicitPath, char const* envPath,
    std::string const& pluginLibrary);

} // namespace dsa
