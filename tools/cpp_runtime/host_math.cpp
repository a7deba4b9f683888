#include "host_math.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace dsa
{

float halfToFloat(uint16_t h)
{
    uint32_t const sign = (h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1f;
    uint32_t mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0)
    {
        if (mantissa == 0)
        {
            bits = sign;
        }
        else
        {
            exponent = 127 - 15 + 1;
            while ((mantissa & 0x400u) == 0)
            {
                mantissa <<= 1;
                --exponent;
            }
            bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
        }
    }
    else if (exponent == 31)
    {
        bits = sign | 0x7f800000u | (mantissa << 13);
    }
    else
    {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
}

//! Round to nearest even; the random inputs are normal samples, far from the subnormal range.
uint16_t floatToHalf(float f)
{
    uint32_t x;
    std::memcpy(&x, &f, sizeof(x));
    uint32_t const sign = (x >> 16) & 0x8000u;
    int32_t const exponent = static_cast<int32_t>((x >> 23) & 0xffu) - 127 + 15;
    uint32_t const mantissa = x & 0x7fffffu;
    if ((x & 0x7fffffffu) > 0x7f800000u)
    {
        return static_cast<uint16_t>(sign | 0x7e00u);
    }
    if (exponent >= 31)
    {
        return static_cast<uint16_t>(sign | 0x7c00u);
    }
    if (exponent <= 0)
    {
        return static_cast<uint16_t>(sign);  // flush the tiny values to zero
    }
    uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
    uint32_t const rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
    {
        ++half;
    }
    return static_cast<uint16_t>(sign | half);
}

float bf16ToFloat(uint16_t b)
{
    uint32_t const bits = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
}

uint16_t floatToBf16(float f)
{
    uint32_t x;
    std::memcpy(&x, &f, sizeof(x));
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

namespace
{

float valueAt(void const* data, LogitType type, size_t i)
{
    switch (type)
    {
    case LogitType::kHALF: return halfToFloat(static_cast<uint16_t const*>(data)[i]);
    case LogitType::kBF16: return bf16ToFloat(static_cast<uint16_t const*>(data)[i]);
    case LogitType::kFLOAT: break;
    }
    return static_cast<float const*>(data)[i];
}

} // namespace

std::vector<float> logitRow(void const* data, LogitType type, int64_t row, int64_t vocab)
{
    std::vector<float> values(static_cast<size_t>(vocab));
    size_t const base = static_cast<size_t>(row * vocab);
    for (size_t v = 0; v < values.size(); ++v)
    {
        values[v] = valueAt(data, type, base + v);
    }
    return values;
}

std::vector<int64_t> argmaxRows(void const* data, LogitType type, int64_t rows, int64_t vocab)
{
    std::vector<int64_t> chosen(static_cast<size_t>(rows), 0);
    for (int64_t b = 0; b < rows; ++b)
    {
        float best = -INFINITY;
        for (int64_t v = 0; v < vocab; ++v)
        {
            float const x = valueAt(data, type, static_cast<size_t>(b * vocab + v));
            if (x > best)  // ties to the lower id
            {
                best = x;
                chosen[static_cast<size_t>(b)] = v;
            }
        }
    }
    return chosen;
}

void checkSampling(float temperature, float topP)
{
    if (!(temperature >= 0.F) || std::isinf(temperature))
    {
        throw std::invalid_argument("a temperature must be 0 (greedy) or positive and finite; got "
            + std::to_string(temperature) + ".");
    }
    if (!(topP > 0.F && topP <= 1.F))
    {
        throw std::invalid_argument("top_p must be in (0, 1]; got " + std::to_string(topP) + ".");
    }
}

SamplingRows samplingRows(std::vector<int> const& rowSlots, std::map<int, SlotSampling> const& slots)
{
    SamplingRows rows;
    size_t const n = rowSlots.size();
    rows.temperature.assign(n, 0.F);
    rows.topP.assign(n, 1.F);
    rows.seeds.assign(n, 0);
    rows.offsets.assign(n, 0);
    for (size_t r = 0; r < n; ++r)
    {
        auto const it = rowSlots[r] >= 0 ? slots.find(rowSlots[r]) : slots.end();
        if (it == slots.end())
        {
            continue;
        }
        rows.temperature[r] = it->second.temperature;
        rows.topP[r] = it->second.topP;
        rows.seeds[r] = it->second.seed;
        rows.offsets[r] = it->second.step;
        rows.anySampled = rows.anySampled || it->second.temperature > 0.F;
    }
    return rows;
}

std::array<uint32_t, 4> philox4x32x10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k)
{
    for (int r = 0; r < 10; ++r)
    {
        uint64_t const p0 = uint64_t{0xD2511F53u} * c[0];
        uint64_t const p1 = uint64_t{0xCD9E8D57u} * c[2];
        c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
            static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
        k[0] += 0x9E3779B9u;
        k[1] += 0xBB67AE85u;
    }
    return c;
}

uint64_t philoxU53(uint64_t seed, uint64_t offset)
{
    std::array<uint32_t, 4> const x = philox4x32x10(
        {static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), 0u, 0u},
        {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    return ((uint64_t{x[1]} << 32) | x[0]) >> 11;
}

std::vector<std::string> kernelsLibraryCandidates(std::string const& explicitPath, char const* envPath,
    std::string const& pluginLibrary)
{
    if (!explicitPath.empty())
    {
        return {explicitPath};
    }
    if (envPath != nullptr && envPath[0] != '\0')
    {
        return {envPath};
    }
    if (pluginLibrary.empty())
    {
        return {};
    }
    size_t const slash = pluginLibrary.find_last_of('/');
    std::string const folder = slash == std::string::npos ? std::string(".") : pluginLibrary.substr(0, slash);
    return {folder + "/libdsa_kernels.so"};
}

} // namespace dsa
