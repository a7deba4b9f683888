#include "engine_gate.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <utility>

namespace dsa
{

namespace
{

// engine_gate.VERSION_COMPATIBLE_SINCE and CROSS_MAJOR_VERSION_COMPATIBLE, from the TensorRT 10.16.1
// Developer Guide (Version Compatibility) and the TensorRT 11.1.0 Engine Compatibility page.
std::vector<int> const kVersionCompatibleSince{8, 6};
std::set<std::pair<int, int>> const kCrossMajorVersionCompatible{{8, 9}, {8, 10}, {9, 10}, {10, 11}};

std::vector<int> head(std::vector<int> const& version, size_t length)
{
    return std::vector<int>(version.begin(), version.begin() + static_cast<std::ptrdiff_t>(std::min(length, version.size())));
}

} // namespace

std::vector<int> parseVersion(std::string const& text)
{
    std::vector<int> parts;
    size_t pos = 0;
    while (pos < text.size() && !std::isdigit(static_cast<unsigned char>(text[pos])))
    {
        ++pos;
    }
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])))
    {
        long value = 0;
        while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])))
        {
            value = std::min(value * 10 + (text[pos] - '0'), 1L << 30);
            ++pos;
        }
        parts.push_back(static_cast<int>(value));
        if (pos + 1 < text.size() && text[pos] == '.' && std::isdigit(static_cast<unsigned char>(text[pos + 1])))
        {
            ++pos;
            continue;
        }
        break;
    }
    return parts;
}

std::string formatVersion(std::vector<int> const& version)
{
    std::string text;
    for (size_t i = 0; i < version.size(); ++i)
    {
        text += (i ? "." : "") + std::to_string(version[i]);
    }
    return text;
}

bool runtimeAccepts(std::vector<int> const& engine, std::vector<int> const& runtime, bool versionCompatible,
    std::string const& backend)
{
    if (engine.empty() || runtime.empty())
    {
        return false;
    }
    std::vector<int> const built = head(engine, 3);
    std::vector<int> const here = head(runtime, 3);
    if (!versionCompatible)
    {
        return built == here;
    }
    if (backend == "tensorrt" && head(built, 2) < kVersionCompatibleSince)
    {
        return false;
    }
    if (built[0] == here[0])
    {
        return here >= built;
    }
    return backend == "tensorrt" && kCrossMajorVersionCompatible.count({built[0], here[0]}) != 0;
}

std::string computeCapabilityNeeds(std::vector<std::string> const& built, std::string const& hardwareCompatibility,
    int major, int minor)
{
    std::vector<int> const gpu{major, minor};
    if (built.empty())
    {
        return "";
    }
    if (hardwareCompatibility == "ampere_plus")
    {
        return gpu >= std::vector<int>{8, 0} ? "" : "compute capability 8.0 or newer (hardware compatibility ampere_plus)";
    }
    std::string listed;
    for (std::string const& cc : built)
    {
        if (head(parseVersion(cc), 2) == gpu)
        {
            return "";
        }
        listed += (listed.empty() ? "" : ", ") + cc;
    }
    return "compute capability " + listed;
}

} // namespace dsa
