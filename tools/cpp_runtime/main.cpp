// dsa_runtime: run an engine built by `dsa-export build` from C++.
//
//   dsa_runtime BUILD_DIR [--plugins LIB] [--dim NAME=SIZE ...] [--iterations N]
//
// 1. reads BUILD_DIR/manifest.json (engine file, inputs with their named dynamic dims, the
//    optimization profile, whether the engine needs the DSA plugin library);
// 2. checks what the Python engine gate checks that C++ can see: the backend is TensorRT, and the
//    linked libnvinfer matches the version that built the engine (newer allowed when the engine is
//    version compatible);
// 3. loads the plugin library through IPluginRegistry::loadLibrary (getCreators), before
//    deserializing;
// 4. deserializes, sets every input shape (the profile's opt shape unless --dim says otherwise,
//    rejected when outside the profile), allocates device buffers and runs enqueueV3 on a stream;
// 5. prints each output's shape and statistics.
//
// The manifest is read with the small JSON reader below so the example needs nothing but TensorRT
// and the CUDA runtime.

#include <NvInfer.h>
#include <cuda_runtime_api.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace
{

// ---------------------------------------------------------------------------------------------
// A minimal JSON reader (objects, arrays, strings, numbers, true/false/null).

struct Json
{
    enum class Type { kNull, kBool, kNumber, kString, kArray, kObject } type{Type::kNull};
    bool boolean{false};
    double number{0.0};
    std::string string;
    std::vector<Json> array;
    std::map<std::string, Json> object;

    bool isNull() const { return type == Type::kNull; }
    Json const& operator[](std::string const& key) const
    {
        static Json const kNullValue;
        if (type != Type::kObject)
        {
            return kNullValue;
        }
        auto it = object.find(key);
        return it == object.end() ? kNullValue : it->second;
    }
};

class JsonParser
{
public:
    explicit JsonParser(std::string text) : mText(std::move(text)) {}

    Json parse()
    {
        Json value = parseValue();
        skipSpace();
        if (mPos != mText.size())
        {
            fail("trailing characters");
        }
        return value;
    }

private:
    [[noreturn]] void fail(std::string const& what) const
    {
        throw std::runtime_error("manifest.json is not valid JSON (" + what + " at offset " + std::to_string(mPos) + ")");
    }

    void skipSpace()
    {
        while (mPos < mText.size() && std::isspace(static_cast<unsigned char>(mText[mPos])))
        {
            ++mPos;
        }
    }

    bool consume(char const* word)
    {
        size_t const n = std::strlen(word);
        if (mText.compare(mPos, n, word) == 0)
        {
            mPos += n;
            return true;
        }
        return false;
    }

    Json parseValue()
    {
        skipSpace();
        if (mPos >= mText.size())
        {
            fail("unexpected end");
        }
        Json value;
        char const c = mText[mPos];
        if (c == '{')
        {
            value.type = Json::Type::kObject;
            ++mPos;
            skipSpace();
            if (mText[mPos] == '}')
            {
                ++mPos;
                return value;
            }
            while (true)
            {
                skipSpace();
                std::string key = parseString();
                skipSpace();
                if (mText[mPos++] != ':')
                {
                    fail("expected ':'");
                }
                value.object[key] = parseValue();
                skipSpace();
                char const next = mText[mPos++];
                if (next == '}')
                {
                    break;
                }
                if (next != ',')
                {
                    fail("expected ',' or '}'");
                }
            }
        }
        else if (c == '[')
        {
            value.type = Json::Type::kArray;
            ++mPos;
            skipSpace();
            if (mText[mPos] == ']')
            {
                ++mPos;
                return value;
            }
            while (true)
            {
                value.array.push_back(parseValue());
                skipSpace();
                char const next = mText[mPos++];
                if (next == ']')
                {
                    break;
                }
                if (next != ',')
                {
                    fail("expected ',' or ']'");
                }
            }
        }
        else if (c == '"')
        {
            value.type = Json::Type::kString;
            value.string = parseString();
        }
        else if (consume("true"))
        {
            value.type = Json::Type::kBool;
            value.boolean = true;
        }
        else if (consume("false"))
        {
            value.type = Json::Type::kBool;
        }
        else if (consume("null"))
        {
            value.type = Json::Type::kNull;
        }
        else
        {
            char* end = nullptr;
            value.number = std::strtod(mText.c_str() + mPos, &end);
            if (end == mText.c_str() + mPos)
            {
                fail("unexpected character");
            }
            value.type = Json::Type::kNumber;
            mPos = static_cast<size_t>(end - mText.c_str());
        }
        return value;
    }

    std::string parseString()
    {
        if (mText[mPos] != '"')
        {
            fail("expected a string");
        }
        ++mPos;
        std::string out;
        while (mPos < mText.size() && mText[mPos] != '"')
        {
            char c = mText[mPos++];
            if (c == '\\')
            {
                char const e = mText[mPos++];
                switch (e)
                {
                case 'n': c = '\n'; break;
                case 't': c = '\t'; break;
                case 'r': c = '\r'; break;
                case 'b': c = '\b'; break;
                case 'f': c = '\f'; break;
                case 'u':
                    // Manifests are ASCII apart from free-text notes; keep a placeholder for others.
                    mPos += 4;
                    c = '?';
                    break;
                default: c = e; break;
                }
            }
            out.push_back(c);
        }
        if (mPos >= mText.size())
        {
            fail("unterminated string");
        }
        ++mPos;
        return out;
    }

    std::string mText;
    size_t mPos{0};
};

std::string readText(std::string const& path)
{
    std::ifstream file(path, std::ios::binary);
    if (!file)
    {
        throw std::runtime_error(path + " cannot be opened");
    }
    std::stringstream buffer;
    buffer << file.rdbuf();
    return buffer.str();
}

// ---------------------------------------------------------------------------------------------
// TensorRT and CUDA helpers

class Logger : public nvinfer1::ILogger
{
public:
    void log(Severity severity, char const* msg) noexcept override
    {
        if (severity <= Severity::kWARNING)
        {
            std::cerr << "[TensorRT] " << msg << "\n";
        }
    }
};

void checkCuda(cudaError_t status, char const* what)
{
    if (status != cudaSuccess)
    {
        throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(status));
    }
}

size_t elementSize(nvinfer1::DataType type)
{
    switch (type)
    {
    case nvinfer1::DataType::kINT64: return 8;
    case nvinfer1::DataType::kFLOAT:
    case nvinfer1::DataType::kINT32: return 4;
    case nvinfer1::DataType::kHALF:
    case nvinfer1::DataType::kBF16: return 2;
    case nvinfer1::DataType::kINT8:
    case nvinfer1::DataType::kUINT8:
    case nvinfer1::DataType::kBOOL:
    case nvinfer1::DataType::kFP8: return 1;
    default: throw std::runtime_error("unsupported engine I/O data type");
    }
}

int64_t volume(nvinfer1::Dims const& dims)
{
    int64_t v = 1;
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        v *= dims.d[i];
    }
    return v;
}

std::string toString(nvinfer1::Dims const& dims)
{
    std::string s = "[";
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        s += (i ? ", " : "") + std::to_string(dims.d[i]);
    }
    return s + "]";
}

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

std::vector<int> parseVersion(std::string const& text)
{
    std::vector<int> parts;
    std::stringstream stream(text);
    std::string item;
    while (std::getline(stream, item, '.'))
    {
        parts.push_back(std::atoi(item.c_str()));
    }
    return parts;
}

struct Options
{
    std::string buildDir;
    std::string plugins;
    std::map<std::string, int64_t> dims;
    int iterations{1};
};

Options parseArgs(int argc, char** argv)
{
    Options options;
    for (int i = 1; i < argc; ++i)
    {
        std::string const arg = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc)
            {
                throw std::invalid_argument(arg + " needs a value");
            }
            return argv[++i];
        };
        if (arg == "--plugins")
        {
            options.plugins = next();
        }
        else if (arg == "--dim")
        {
            std::string const item = next();
            auto const eq = item.find('=');
            if (eq == std::string::npos)
            {
                throw std::invalid_argument("--dim takes NAME=SIZE, e.g. sequence=256");
            }
            options.dims[item.substr(0, eq)] = std::atoll(item.c_str() + eq + 1);
        }
        else if (arg == "--iterations")
        {
            options.iterations = std::max(1, std::atoi(next().c_str()));
        }
        else if (options.buildDir.empty() && arg.rfind("--", 0) != 0)
        {
            options.buildDir = arg;
        }
        else
        {
            throw std::invalid_argument("unknown argument " + arg);
        }
    }
    if (options.buildDir.empty())
    {
        throw std::invalid_argument("usage: dsa_runtime BUILD_DIR [--plugins LIB] [--dim NAME=SIZE ...] [--iterations N]");
    }
    return options;
}

struct DeviceBuffer
{
    void* ptr{nullptr};
    size_t bytes{0};
    ~DeviceBuffer()
    {
        if (ptr)
        {
            cudaFree(ptr);
        }
    }
};

int run(Options const& options)
{
    std::string const dir = options.buildDir;
    Json const manifest = JsonParser(readText(dir + "/manifest.json")).parse();
    Json const& engineInfo = manifest["engine"];
    if (engineInfo.isNull())
    {
        throw std::runtime_error(dir + " holds no engine (only the ONNX Runtime artifact); rebuild with --backend tensorrt");
    }
    if (engineInfo["backend"].string != "tensorrt")
    {
        throw std::runtime_error("the engine was built for " + engineInfo["backend"].string
            + "; this example links TensorRT (build it against TensorRT-RTX's headers and library for RTX engines)");
    }

    // The version check of the engine gate: exact match unless version compatible.
    std::vector<int> const built = parseVersion(engineInfo["trt_version"].string);
    int32_t const linked = getInferLibVersion();
    std::vector<int> const here{linked / 10000, (linked / 100) % 100, linked % 100};
    bool const versionCompatible = engineInfo["version_compatible"].boolean;
    bool const sameMajor = !built.empty() && built[0] == here[0];
    bool const exact = built.size() >= 3 && built[0] == here[0] && built[1] == here[1] && built[2] == here[2];
    bool const newer = built.size() >= 3 && here >= std::vector<int>(built.begin(), built.begin() + 3);
    if (!(exact || (versionCompatible && sameMajor && newer)))
    {
        throw std::runtime_error("refusing to load: the engine was built with TensorRT " + engineInfo["trt_version"].string
            + " and this program links TensorRT " + std::to_string(here[0]) + "." + std::to_string(here[1]) + "."
            + std::to_string(here[2]));
    }

    Logger logger;
    std::unique_ptr<nvinfer1::IRuntime> runtime{nvinfer1::createInferRuntime(logger)};
    if (!runtime)
    {
        throw std::runtime_error("createInferRuntime failed");
    }
    if (versionCompatible)
    {
        runtime->setEngineHostCodeAllowed(true);
    }

    // Plugins first: deserialization looks the DSA creators up in the registry.
    if (!engineInfo["plugin_library_sha256"].isNull())
    {
        std::string library = options.plugins;
        if (library.empty() && std::getenv("DSA_EXPORT_PLUGIN_LIB"))
        {
            library = std::getenv("DSA_EXPORT_PLUGIN_LIB");
        }
        if (library.empty())
        {
            library = engineInfo["plugin_library"].string;
        }
        if (library.empty() || runtime->getPluginRegistry().loadLibrary(library.c_str()) == nullptr)
        {
            throw std::runtime_error("the engine needs the DSA plugin library and '" + library
                + "' could not be loaded; pass --plugins $(dsa-export plugins path)");
        }
        std::cout << "Loaded plugin library " << library << "\n";
    }

    std::string const planText = readText(dir + "/" + engineInfo["file"].string);
    std::unique_ptr<nvinfer1::ICudaEngine> engine{runtime->deserializeCudaEngine(planText.data(), planText.size())};
    if (!engine)
    {
        throw std::runtime_error("deserializeCudaEngine failed (see the TensorRT messages above)");
    }
    std::unique_ptr<nvinfer1::IExecutionContext> context{engine->createExecutionContext()};
    if (!context)
    {
        throw std::runtime_error("createExecutionContext failed");
    }

    // Sizes of the named dynamic dims: the profile's opt values, then --dim.
    std::map<std::string, int64_t> sizes;
    for (auto const& [name, range] : manifest["profiles"]["dims"].object)
    {
        sizes[name] = static_cast<int64_t>(range.array.at(1).number);
    }
    for (auto const& [name, size] : options.dims)
    {
        sizes[name] = size;
    }

    cudaStream_t stream;
    checkCuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    std::map<std::string, DeviceBuffer> buffers;
    std::mt19937_64 rng(0);
    for (Json const& input : manifest["inputs"].array)
    {
        std::string const& name = input["name"].string;
        nvinfer1::Dims dims{};
        dims.nbDims = static_cast<int32_t>(input["shape"].array.size());
        for (int32_t i = 0; i < dims.nbDims; ++i)
        {
            Json const& dim = input["shape"].array[i];
            dims.d[i] = dim.type == Json::Type::kString ? sizes.at(dim.string) : static_cast<int64_t>(dim.number);
        }
        nvinfer1::Dims const lo = engine->getProfileShape(name.c_str(), 0, nvinfer1::OptProfileSelector::kMIN);
        nvinfer1::Dims const hi = engine->getProfileShape(name.c_str(), 0, nvinfer1::OptProfileSelector::kMAX);
        for (int32_t i = 0; i < dims.nbDims; ++i)
        {
            if (dims.d[i] < lo.d[i] || dims.d[i] > hi.d[i])
            {
                throw std::runtime_error("input '" + name + "' shape " + toString(dims) + " is outside the engine's profile "
                    + toString(lo) + " .. " + toString(hi));
            }
        }
        if (!context->setInputShape(name.c_str(), dims))
        {
            throw std::runtime_error("setInputShape rejected " + toString(dims) + " for '" + name + "'");
        }
        nvinfer1::DataType const type = engine->getTensorDataType(name.c_str());
        size_t const count = static_cast<size_t>(volume(dims));
        std::vector<uint8_t> host(count * elementSize(type));
        int64_t const low = input["value_range"].isNull() ? 0 : static_cast<int64_t>(input["value_range"].array.at(0).number);
        int64_t const high = input["value_range"].isNull() ? 2 : static_cast<int64_t>(input["value_range"].array.at(1).number);
        std::uniform_int_distribution<int64_t> ints(low, high - 1);
        std::normal_distribution<float> floats;
        for (size_t i = 0; i < count; ++i)
        {
            switch (type)
            {
            case nvinfer1::DataType::kINT64: reinterpret_cast<int64_t*>(host.data())[i] = ints(rng); break;
            case nvinfer1::DataType::kINT32: reinterpret_cast<int32_t*>(host.data())[i] = static_cast<int32_t>(ints(rng)); break;
            case nvinfer1::DataType::kFLOAT: reinterpret_cast<float*>(host.data())[i] = floats(rng); break;
            default: throw std::runtime_error("input '" + name + "': this example generates int32/int64/float32 inputs only");
            }
        }
        DeviceBuffer& buffer = buffers[name];
        buffer.bytes = host.size();
        checkCuda(cudaMalloc(&buffer.ptr, std::max<size_t>(buffer.bytes, 1)), "cudaMalloc");
        checkCuda(cudaMemcpyAsync(buffer.ptr, host.data(), host.size(), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
        context->setTensorAddress(name.c_str(), buffer.ptr);
        std::cout << "input  " << name << " " << toString(dims) << "\n";
    }

    std::vector<std::string> outputs;
    for (int32_t i = 0; i < engine->getNbIOTensors(); ++i)
    {
        char const* name = engine->getIOTensorName(i);
        if (engine->getTensorIOMode(name) != nvinfer1::TensorIOMode::kOUTPUT)
        {
            continue;
        }
        nvinfer1::Dims const dims = context->getTensorShape(name);
        DeviceBuffer& buffer = buffers[name];
        buffer.bytes = static_cast<size_t>(volume(dims)) * elementSize(engine->getTensorDataType(name));
        checkCuda(cudaMalloc(&buffer.ptr, std::max<size_t>(buffer.bytes, 1)), "cudaMalloc");
        context->setTensorAddress(name, buffer.ptr);
        outputs.emplace_back(name);
    }

    cudaEvent_t start, stop;
    checkCuda(cudaEventCreate(&start), "cudaEventCreate");
    checkCuda(cudaEventCreate(&stop), "cudaEventCreate");
    checkCuda(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < options.iterations; ++i)
    {
        if (!context->enqueueV3(stream))
        {
            throw std::runtime_error("enqueueV3 failed (see the TensorRT messages above)");
        }
    }
    checkCuda(cudaEventRecord(stop, stream), "cudaEventRecord");
    checkCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    float ms = 0.f;
    checkCuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");

    for (std::string const& name : outputs)
    {
        nvinfer1::Dims const dims = context->getTensorShape(name.c_str());
        nvinfer1::DataType const type = engine->getTensorDataType(name.c_str());
        std::vector<uint8_t> host(buffers[name].bytes);
        checkCuda(cudaMemcpy(host.data(), buffers[name].ptr, host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
        double sum = 0.0, lo = INFINITY, hi = -INFINITY;
        size_t const count = static_cast<size_t>(volume(dims));
        for (size_t i = 0; i < count; ++i)
        {
            double v = 0.0;
            switch (type)
            {
            case nvinfer1::DataType::kFLOAT: v = reinterpret_cast<float const*>(host.data())[i]; break;
            case nvinfer1::DataType::kHALF: v = halfToFloat(reinterpret_cast<uint16_t const*>(host.data())[i]); break;
            case nvinfer1::DataType::kINT32: v = reinterpret_cast<int32_t const*>(host.data())[i]; break;
            case nvinfer1::DataType::kINT64: v = static_cast<double>(reinterpret_cast<int64_t const*>(host.data())[i]); break;
            default: v = 0.0; break;
            }
            sum += v;
            lo = std::min(lo, v);
            hi = std::max(hi, v);
        }
        std::cout << "output " << name << " " << toString(dims) << " min " << lo << " max " << hi << " mean "
                  << (count ? sum / static_cast<double>(count) : 0.0) << "\n";
    }
    std::cout << "enqueueV3: " << ms / static_cast<float>(options.iterations) << " ms per run over " << options.iterations
              << " run(s)\n";
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaStreamDestroy(stream);
    return 0;
}

} // namespace

int main(int argc, char** argv)
{
    try
    {
        return run(parseArgs(argc, argv));
    }
    catch (std::invalid_argument const& e)
    {
        std::cerr << "Error: " << e.what() << "\n";
        return 2;
    }
    catch (std::exception const& e)
    {
        std::cerr << "Error: " << e.what() << "\n";
        return 1;
    }
}
