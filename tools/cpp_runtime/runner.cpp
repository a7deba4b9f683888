#include "runner.h"

#include "engine_gate.h"

#include <NvInfer.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

namespace dsa
{

namespace
{

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
    default: throw UserError("the engine has an I/O tensor of a packed data type (INT4/FP4/E8M0), which this example does not handle");
    }
}

char const* typeName(nvinfer1::DataType type)
{
    switch (type)
    {
    case nvinfer1::DataType::kFLOAT: return "float32";
    case nvinfer1::DataType::kHALF: return "float16";
    case nvinfer1::DataType::kBF16: return "bfloat16";
    case nvinfer1::DataType::kINT64: return "int64";
    case nvinfer1::DataType::kINT32: return "int32";
    case nvinfer1::DataType::kINT8: return "int8";
    case nvinfer1::DataType::kUINT8: return "uint8";
    case nvinfer1::DataType::kBOOL: return "bool";
    case nvinfer1::DataType::kFP8: return "float8_e4m3";
    default: return "packed";
    }
}

Shape toShape(nvinfer1::Dims const& dims)
{
    Shape shape;
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        shape.push_back(dims.d[i]);
    }
    return shape;
}

int64_t volume(Shape const& shape)
{
    int64_t v = 1;
    for (int64_t d : shape)
    {
        v *= d;
    }
    return v;
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

struct DeviceBuffer
{
    int device{0};
    void* ptr{nullptr};
    size_t bytes{0};

    DeviceBuffer() = default;
    DeviceBuffer(DeviceBuffer const&) = delete;
    DeviceBuffer& operator=(DeviceBuffer const&) = delete;
    void allocate(int onDevice, size_t size)
    {
        device = onDevice;
        bytes = size;
        checkCuda(cudaSetDevice(device), "cudaSetDevice");
        checkCuda(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)), "cudaMalloc");
    }
    ~DeviceBuffer()
    {
        if (ptr)
        {
            cudaSetDevice(device);
            cudaFree(ptr);
        }
    }
};

struct PinnedBuffer
{
    void* ptr{nullptr};
    PinnedBuffer() = default;
    PinnedBuffer(PinnedBuffer const&) = delete;
    PinnedBuffer& operator=(PinnedBuffer const&) = delete;
    ~PinnedBuffer()
    {
        if (ptr)
        {
            cudaFreeHost(ptr);
        }
    }
};

struct Event
{
    int device{0};
    cudaEvent_t event{nullptr};
    Event() = default;
    Event(Event const&) = delete;
    Event& operator=(Event const&) = delete;
    void create(int onDevice)
    {
        device = onDevice;
        checkCuda(cudaSetDevice(device), "cudaSetDevice");
        checkCuda(cudaEventCreate(&event), "cudaEventCreate");
    }
    ~Event()
    {
        if (event)
        {
            cudaSetDevice(device);
            cudaEventDestroy(event);
        }
    }
};

float elapsed(Event const& start, Event const& stop)
{
    float ms = 0.f;
    checkCuda(cudaEventElapsedTime(&ms, start.event, stop.event), "cudaEventElapsedTime");
    return ms;
}

//! The streams of the run, one per GPU (created on first use, destroyed last).
class Streams
{
public:
    Streams() = default;
    Streams(Streams const&) = delete;
    Streams& operator=(Streams const&) = delete;
    cudaStream_t get(int device)
    {
        auto it = mStreams.find(device);
        if (it != mStreams.end())
        {
            return it->second;
        }
        checkCuda(cudaSetDevice(device), "cudaSetDevice");
        cudaStream_t stream;
        checkCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        mStreams[device] = stream;
        return stream;
    }
    void synchronize()
    {
        for (auto const& [device, stream] : mStreams)
        {
            checkCuda(cudaSetDevice(device), "cudaSetDevice");
            checkCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        }
    }
    ~Streams()
    {
        for (auto const& [device, stream] : mStreams)
        {
            cudaSetDevice(device);
            cudaStreamDestroy(stream);
        }
    }

private:
    std::map<int, cudaStream_t> mStreams;
};

//! One stage opened on its GPU. Members are released in reverse order: buffers and events, the
//! context, the engine, then the runtime, each with the stage's GPU current.
struct StageRun
{
    Stage const* stage{nullptr};
    cudaStream_t stream{nullptr};
    std::unique_ptr<nvinfer1::IRuntime> runtime;
    std::unique_ptr<nvinfer1::ICudaEngine> engine;
    std::unique_ptr<nvinfer1::IExecutionContext> context;
    std::map<std::string, DeviceBuffer> buffers;   //!< tensors this stage allocated
    std::map<std::string, void*> addresses;        //!< every I/O tensor (aliases included)
    std::map<std::string, Shape> shapes;
    std::vector<std::string> outputs;
    Event start;
    Event stop;  //!< also what consumers on other streams wait for
    double totalMs{0.0};

    StageRun() = default;
    StageRun(StageRun const&) = delete;
    StageRun& operator=(StageRun const&) = delete;
    ~StageRun()
    {
        if (stage)
        {
            cudaSetDevice(stage->device);
        }
        context.reset();
        engine.reset();
        runtime.reset();
    }
};

enum class CopyMode { kSameDevice, kPeer, kHost };

struct LinkRun
{
    Link const* link{nullptr};
    CopyMode mode{CopyMode::kSameDevice};
    int srcDevice{0};
    int dstDevice{0};
    void const* src{nullptr};
    void* dst{nullptr};
    size_t bytes{0};
    PinnedBuffer pinned;
    Event d2hStart, d2hStop;  // kHost, on the source GPU
    Event start, stop;        // kPeer: the copy; kHost: the upload, on the target GPU
    double totalMs{0.0};

    LinkRun() = default;
    LinkRun(LinkRun const&) = delete;
    LinkRun& operator=(LinkRun const&) = delete;
};

struct HostTensor
{
    nvinfer1::DataType type{nvinfer1::DataType::kFLOAT};
    Shape shape;
    std::vector<uint8_t> bytes;
};

HostTensor makeInput(TensorSpec const& spec, nvinfer1::DataType type, Shape const& shape,
    std::map<std::string, std::string> const& files, std::mt19937_64& rng)
{
    HostTensor tensor;
    tensor.type = type;
    tensor.shape = shape;
    size_t const count = static_cast<size_t>(volume(shape));
    size_t const bytes = count * elementSize(type);
    auto const file = files.find(spec.name);
    if (file != files.end())
    {
        std::string const data = readText(file->second);
        if (data.size() != bytes)
        {
            throw UserError("--input " + spec.name + "=" + file->second + " holds " + std::to_string(data.size())
                + " bytes but the input is " + typeName(type) + " " + toString(shape) + " (" + std::to_string(bytes)
                + " bytes); write it as raw little-endian values of that shape.");
        }
        tensor.bytes.assign(data.begin(), data.end());
        return tensor;
    }
    tensor.bytes.resize(bytes);
    int64_t const low = spec.hasValueRange ? spec.low : 0;
    int64_t const high = spec.hasValueRange ? spec.high : 2;
    std::uniform_int_distribution<int64_t> ints(low, high - 1);
    std::normal_distribution<float> floats;
    uint8_t* data = tensor.bytes.data();
    for (size_t i = 0; i < count; ++i)
    {
        switch (type)
        {
        case nvinfer1::DataType::kINT64: reinterpret_cast<int64_t*>(data)[i] = ints(rng); break;
        case nvinfer1::DataType::kINT32: reinterpret_cast<int32_t*>(data)[i] = static_cast<int32_t>(ints(rng)); break;
        case nvinfer1::DataType::kINT8: reinterpret_cast<int8_t*>(data)[i] = static_cast<int8_t>(ints(rng)); break;
        case nvinfer1::DataType::kUINT8:
        case nvinfer1::DataType::kBOOL: data[i] = static_cast<uint8_t>(ints(rng) != 0); break;
        case nvinfer1::DataType::kFLOAT: reinterpret_cast<float*>(data)[i] = floats(rng); break;
        case nvinfer1::DataType::kHALF: reinterpret_cast<uint16_t*>(data)[i] = floatToHalf(floats(rng)); break;
        case nvinfer1::DataType::kBF16: reinterpret_cast<uint16_t*>(data)[i] = floatToBf16(floats(rng)); break;
        default:
            throw UserError("input '" + spec.name + "' is " + typeName(type)
                + ", for which this example makes no random values; pass it with --input " + spec.name + "=FILE.");
        }
    }
    return tensor;
}

void printSummary(std::string const& name, nvinfer1::DataType type, Shape const& shape, std::vector<uint8_t> const& host)
{
    double sum = 0.0, lo = INFINITY, hi = -INFINITY;
    size_t const count = static_cast<size_t>(volume(shape));
    uint8_t const* data = host.data();
    for (size_t i = 0; i < count; ++i)
    {
        double v = 0.0;
        switch (type)
        {
        case nvinfer1::DataType::kFLOAT: v = reinterpret_cast<float const*>(data)[i]; break;
        case nvinfer1::DataType::kHALF: v = halfToFloat(reinterpret_cast<uint16_t const*>(data)[i]); break;
        case nvinfer1::DataType::kBF16: v = bf16ToFloat(reinterpret_cast<uint16_t const*>(data)[i]); break;
        case nvinfer1::DataType::kINT32: v = reinterpret_cast<int32_t const*>(data)[i]; break;
        case nvinfer1::DataType::kINT64: v = static_cast<double>(reinterpret_cast<int64_t const*>(data)[i]); break;
        case nvinfer1::DataType::kINT8: v = reinterpret_cast<int8_t const*>(data)[i]; break;
        case nvinfer1::DataType::kUINT8:
        case nvinfer1::DataType::kBOOL: v = data[i]; break;
        default: v = 0.0; break;
        }
        sum += v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    std::cout << "output " << name << " " << toString(shape) << " " << typeName(type) << " min " << lo << " max " << hi
              << " mean " << (count ? sum / static_cast<double>(count) : 0.0) << "\n";
}

std::vector<int> linkedVersion()
{
    int32_t const v = getInferLibVersion();  // (MAJOR * 100 + MINOR) * 100 + PATCH
    return {v / 10000, (v / 100) % 100, v % 100};
}

//! Load the DSA plugin library into TensorRT's process-wide plugin registry (getPluginRegistry,
//! the registry the Python side uses too), once, before the first engine that needs it is
//! deserialized: deserialization looks the creators up there, and loadLibrary fails when the
//! library's creators are registered already (as plugins.library.load_plugin_library knows).
void loadPlugins(RunOptions const& options, Stage const& stage, std::string& loaded)
{
    if (stage.engine.pluginLibrarySha256.empty() || stage.engine.pluginsSerialized || !loaded.empty())
    {
        return;
    }
    std::string library = options.plugins;
    if (library.empty() && std::getenv("DSA_EXPORT_PLUGIN_LIB"))
    {
        library = std::getenv("DSA_EXPORT_PLUGIN_LIB");
    }
    if (library.empty())
    {
        library = stage.engine.pluginLibrary;
    }
    nvinfer1::IPluginRegistry* registry = getPluginRegistry();
    if (library.empty() || registry == nullptr)
    {
        throw UserError(stage.label + " needs the DSA plugin library and none is known; pass --plugins $(dsa-export plugins path).");
    }
    if (registry->loadLibrary(library.c_str()) == nullptr)
    {
        // Our creators may be registered already (the program linked or loaded the library itself).
        bool const registered = registry->getCreator("DSAIndexerTopK", "1", "dsa") != nullptr
            || registry->getCreator("DSASparseAttention", "1", "dsa") != nullptr;
        if (!registered)
        {
            throw UserError(stage.label + " needs the DSA plugin library and '" + library
                + "' could not be loaded; pass --plugins $(dsa-export plugins path), built against this TensorRT.");
        }
        std::cerr << "TensorRT did not load " << library << " because DSA plugin creators are already registered; using those.\n";
    }
    loaded = library;
    std::cout << "Loaded plugin library " << library << "\n";
}

void openStage(StageRun& run, Logger& logger, RunOptions const& options, std::string& pluginsLoaded)
{
    Stage const& stage = *run.stage;
    checkCuda(cudaSetDevice(stage.device), "cudaSetDevice");
    run.runtime.reset(nvinfer1::createInferRuntime(logger));
    if (!run.runtime)
    {
        throw std::runtime_error("createInferRuntime failed on GPU " + std::to_string(stage.device));
    }
    if (stage.engine.versionCompatible)
    {
        run.runtime->setEngineHostCodeAllowed(true);  // the lean runtime embedded in the plan
    }
    loadPlugins(options, stage, pluginsLoaded);
    std::string const plan = readText(stage.engine.path);
    run.engine.reset(run.runtime->deserializeCudaEngine(plan.data(), plan.size()));
    if (!run.engine)
    {
        throw UserError(stage.label + ": deserializeCudaEngine failed for " + stage.engine.path
            + " (see the TensorRT messages above); rebuild it here with `dsa-export build`.");
    }
    run.context.reset(run.engine->createExecutionContext());
    if (!run.context)
    {
        throw std::runtime_error(stage.label + ": createExecutionContext failed");
    }
}

void setInputShape(StageRun& run, std::string const& name, Shape const& shape)
{
    Stage const& stage = *run.stage;
    nvinfer1::ICudaEngine const& engine = *run.engine;
    nvinfer1::Dims const lo = engine.getProfileShape(name.c_str(), 0, nvinfer1::OptProfileSelector::kMIN);
    nvinfer1::Dims const hi = engine.getProfileShape(name.c_str(), 0, nvinfer1::OptProfileSelector::kMAX);
    bool inside = lo.nbDims == static_cast<int32_t>(shape.size()) && hi.nbDims == lo.nbDims;
    for (int32_t i = 0; inside && i < lo.nbDims; ++i)
    {
        inside = shape[static_cast<size_t>(i)] >= lo.d[i] && shape[static_cast<size_t>(i)] <= hi.d[i];
    }
    if (!inside)
    {
        throw UserError(stage.label + ": input '" + name + "' shape " + toString(shape) + " is outside the engine's profile "
            + toString(toShape(lo)) + " .. " + toString(toShape(hi)) + ".");
    }
    nvinfer1::Dims dims{};
    dims.nbDims = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i)
    {
        dims.d[i] = shape[i];
    }
    if (!run.context->setInputShape(name.c_str(), dims))
    {
        throw UserError(stage.label + ": the engine rejected shape " + toString(shape) + " for input '" + name + "'.");
    }
    run.shapes[name] = shape;
}

} // namespace

int runPlan(RunOptions const& options)
{
    int deviceCount = 0;
    cudaError_t const counted = cudaGetDeviceCount(&deviceCount);
    if (counted != cudaSuccess)
    {
        throw UserError(std::string("no CUDA GPU is usable here (cudaGetDeviceCount: ") + cudaGetErrorString(counted) + ").");
    }
    PlanOptions planOptions;
    planOptions.deviceCount = deviceCount;
    planOptions.device = options.device;
    Plan const plan = readPlan(options.path, planOptions);
    checkShapes(plan, options.dims);  // static shapes first: fail before any engine is opened

    // The engine gate's checks that C++ can see, for every stage, before any deserialization.
    std::vector<int> const linked = linkedVersion();
    for (Stage const& stage : plan.stages)
    {
        checkEngineVersion(stage, linked);
        cudaDeviceProp properties{};
        checkCuda(cudaGetDeviceProperties(&properties, stage.device), "cudaGetDeviceProperties");
        checkComputeCapability(stage, properties.major, properties.minor, properties.name);
    }

    Logger logger;  // outlives every runtime (declared first, destroyed last)
    Streams streams;
    std::vector<std::unique_ptr<StageRun>> runs;
    std::vector<std::unique_ptr<LinkRun>> links;
    std::string pluginsLoaded;
    for (Stage const& stage : plan.stages)
    {
        auto run = std::make_unique<StageRun>();
        run->stage = &stage;
        run->stream = streams.get(stage.device);
        openStage(*run, logger, options, pluginsLoaded);
        run->start.create(stage.device);
        run->stop.create(stage.device);
        runs.push_back(std::move(run));
    }

    // Shapes and buffers, stage after stage: a linked input takes the real shape of the output
    // feeding it; the others the stage's sizes (profile opt values, --dim, dims set by links).
    std::map<std::string, HostTensor> feeds;  // by input name: stages sharing an input get the same values
    std::set<std::string> filesUsed;
    std::mt19937_64 rng(0);
    for (auto& runPtr : runs)
    {
        StageRun& run = *runPtr;
        Stage const& stage = *run.stage;
        nvinfer1::ICudaEngine& engine = *run.engine;
        Sizes sizes = stageSizes(stage, options.dims);
        std::map<std::string, std::string> bound;
        std::vector<std::string> inputNames;
        for (int32_t i = 0; i < engine.getNbIOTensors(); ++i)
        {
            char const* name = engine.getIOTensorName(i);
            if (engine.getTensorIOMode(name) == nvinfer1::TensorIOMode::kINPUT)
            {
                inputNames.emplace_back(name);
                if (stage.input(name) == nullptr)
                {
                    throw UserError(stage.label + ": the engine has the input '" + std::string(name)
                        + "', which " + stage.manifestPath + " does not list; rebuild the stage with `dsa-export build`.");
                }
            }
            else
            {
                run.outputs.emplace_back(name);
            }
        }
        // Linked inputs first, so the dims they set size the other inputs.
        for (std::string const& name : inputNames)
        {
            Link const* link = plan.linkInto(stage.index, name);
            if (link == nullptr)
            {
                continue;
            }
            StageRun& source = *runs[static_cast<size_t>(link->from)];
            if (source.shapes.count(link->output) == 0)
            {
                throw UserError(link->label() + ": " + source.stage->label + "'s engine has no output '" + link->output
                    + "' (its manifest lists one); rebuild the stage with `dsa-export build`.");
            }
            nvinfer1::DataType const given = source.engine->getTensorDataType(link->output.c_str());
            nvinfer1::DataType const taken = engine.getTensorDataType(name.c_str());
            if (given != taken)
            {
                throw UserError("type mismatch on link " + link->label() + ": the output is " + typeName(given)
                    + " but the input takes " + typeName(taken) + "; build all stages with one precision.");
            }
            Shape const& shape = source.shapes[link->output];
            bindLinkedInput(stage, *stage.input(name), shape, *link, sizes, bound);
            setInputShape(run, name, shape);
            auto copy = std::make_unique<LinkRun>();
            copy->link = link;
            copy->srcDevice = source.stage->device;
            copy->dstDevice = stage.device;
            copy->src = source.addresses.at(link->output);
            copy->bytes = static_cast<size_t>(volume(shape)) * elementSize(given);
            if (copy->srcDevice == copy->dstDevice)
            {
                copy->mode = CopyMode::kSameDevice;  // same GPU, same stream: the input reads the output's buffer
                run.addresses[name] = const_cast<void*>(copy->src);
            }
            else
            {
                DeviceBuffer& buffer = run.buffers[name];
                buffer.allocate(stage.device, copy->bytes);
                run.addresses[name] = buffer.ptr;
                copy->dst = buffer.ptr;
            }
            links.push_back(std::move(copy));
        }
        for (std::string const& name : inputNames)
        {
            if (plan.linkInto(stage.index, name) != nullptr)
            {
                continue;
            }
            TensorSpec const& spec = *stage.input(name);
            Shape const shape = resolve(spec, sizes);
            checkInputShape(stage, spec, shape);
            setInputShape(run, name, shape);
            nvinfer1::DataType const type = engine.getTensorDataType(name.c_str());
            auto known = feeds.find(name);
            if (known == feeds.end() || known->second.type != type || known->second.shape != shape)
            {
                known = feeds.insert_or_assign(name, makeInput(spec, type, shape, options.inputFiles, rng)).first;
            }
            if (options.inputFiles.count(name))
            {
                filesUsed.insert(name);
            }
            DeviceBuffer& buffer = run.buffers[name];
            buffer.allocate(stage.device, known->second.bytes.size());
            checkCuda(cudaMemcpy(buffer.ptr, known->second.bytes.data(), buffer.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
            run.addresses[name] = buffer.ptr;
            std::cout << stage.label << " input " << name << " " << toString(shape) << " " << typeName(type)
                      << (options.inputFiles.count(name) ? " from " + options.inputFiles.at(name) : std::string(" (random)"))
                      << "\n";
        }
        for (std::string const& name : run.outputs)
        {
            Shape const shape = toShape(run.context->getTensorShape(name.c_str()));
            if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; }))
            {
                throw UserError(stage.label + ": output '" + name + "' has the data-dependent shape " + toString(shape)
                    + ", which this example does not handle.");
            }
            DeviceBuffer& buffer = run.buffers[name];
            buffer.allocate(stage.device, static_cast<size_t>(volume(shape)) * elementSize(engine.getTensorDataType(name.c_str())));
            run.addresses[name] = buffer.ptr;
            run.shapes[name] = shape;
        }
        for (auto const& [name, address] : run.addresses)
        {
            if (!run.context->setTensorAddress(name.c_str(), address))
            {
                throw std::runtime_error(stage.label + ": setTensorAddress failed for '" + name + "'");
            }
        }
    }
    // The uploads went through cudaMemcpy from pageable memory, which may return before the data
    // has landed; the streams are non-blocking, so wait for every GPU before the first run.
    for (auto& runPtr : runs)
    {
        checkCuda(cudaSetDevice(runPtr->stage->device), "cudaSetDevice");
        checkCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    for (auto const& [name, file] : options.inputFiles)
    {
        if (!filesUsed.count(name))
        {
            throw UserError("--input names '" + name + "', which is no input the caller feeds (not an engine input, or one a link feeds).");
        }
    }

    // How each link crosses GPUs: peer to peer when the pair allows it (access enabled once per
    // pair), else through pinned host memory.
    std::set<std::pair<int, int>> enabled;
    for (auto& copy : links)
    {
        if (copy->mode == CopyMode::kSameDevice)
        {
            std::cout << "link " << copy->link->label() << ": GPU " << copy->srcDevice << ", no copy\n";
            continue;
        }
        int canAccess = 0;
        checkCuda(cudaDeviceCanAccessPeer(&canAccess, copy->dstDevice, copy->srcDevice), "cudaDeviceCanAccessPeer");
        if (canAccess)
        {
            if (enabled.insert({copy->dstDevice, copy->srcDevice}).second)
            {
                checkCuda(cudaSetDevice(copy->dstDevice), "cudaSetDevice");
                cudaError_t const status = cudaDeviceEnablePeerAccess(copy->srcDevice, 0);
                if (status == cudaErrorPeerAccessAlreadyEnabled)
                {
                    cudaGetLastError();  // clear it: access is on, which is what we asked for
                }
                else
                {
                    checkCuda(status, "cudaDeviceEnablePeerAccess");
                }
            }
            copy->mode = CopyMode::kPeer;
        }
        else
        {
            copy->mode = CopyMode::kHost;
            checkCuda(cudaHostAlloc(&copy->pinned.ptr, std::max<size_t>(copy->bytes, 1), cudaHostAllocPortable), "cudaHostAlloc");
            copy->d2hStart.create(copy->srcDevice);
            copy->d2hStop.create(copy->srcDevice);
        }
        copy->start.create(copy->dstDevice);
        copy->stop.create(copy->dstDevice);
        std::cout << "link " << copy->link->label() << ": GPU " << copy->srcDevice << " -> GPU " << copy->dstDevice << ", "
                  << copy->bytes << " bytes " << (copy->mode == CopyMode::kPeer ? "peer to peer" : "through pinned host memory")
                  << "\n";
    }

    // Run: stage after stage; a stage's stream waits for the stages feeding it; every iteration
    // ends with all streams synchronized, so buffers are not overwritten while still read.
    double wallMs = 0.0;
    for (int iteration = 0; iteration < options.iterations; ++iteration)
    {
        auto const began = std::chrono::steady_clock::now();
        for (auto& runPtr : runs)
        {
            StageRun& run = *runPtr;
            int const device = run.stage->device;
            for (auto& copy : links)
            {
                if (copy->link->to != run.stage->index || copy->mode == CopyMode::kSameDevice)
                {
                    continue;
                }
                StageRun& source = *runs[static_cast<size_t>(copy->link->from)];
                if (copy->mode == CopyMode::kPeer)
                {
                    checkCuda(cudaSetDevice(device), "cudaSetDevice");
                    checkCuda(cudaStreamWaitEvent(run.stream, source.stop.event, 0), "cudaStreamWaitEvent");
                    checkCuda(cudaEventRecord(copy->start.event, run.stream), "cudaEventRecord");
                    checkCuda(cudaMemcpyPeerAsync(copy->dst, device, copy->src, copy->srcDevice, copy->bytes, run.stream),
                        "cudaMemcpyPeerAsync");
                    checkCuda(cudaEventRecord(copy->stop.event, run.stream), "cudaEventRecord");
                }
                else
                {
                    checkCuda(cudaSetDevice(copy->srcDevice), "cudaSetDevice");
                    checkCuda(cudaEventRecord(copy->d2hStart.event, source.stream), "cudaEventRecord");
                    checkCuda(cudaMemcpyAsync(copy->pinned.ptr, copy->src, copy->bytes, cudaMemcpyDeviceToHost, source.stream),
                        "cudaMemcpyAsync");
                    checkCuda(cudaEventRecord(copy->d2hStop.event, source.stream), "cudaEventRecord");
                    checkCuda(cudaSetDevice(device), "cudaSetDevice");
                    checkCuda(cudaStreamWaitEvent(run.stream, copy->d2hStop.event, 0), "cudaStreamWaitEvent");
                    checkCuda(cudaEventRecord(copy->start.event, run.stream), "cudaEventRecord");
                    checkCuda(cudaMemcpyAsync(copy->dst, copy->pinned.ptr, copy->bytes, cudaMemcpyHostToDevice, run.stream),
                        "cudaMemcpyAsync");
                    checkCuda(cudaEventRecord(copy->stop.event, run.stream), "cudaEventRecord");
                }
            }
            checkCuda(cudaSetDevice(device), "cudaSetDevice");
            checkCuda(cudaEventRecord(run.start.event, run.stream), "cudaEventRecord");
            if (!run.context->enqueueV3(run.stream))
            {
                throw std::runtime_error(run.stage->label + ": enqueueV3 failed (see the TensorRT messages above)");
            }
            checkCuda(cudaEventRecord(run.stop.event, run.stream), "cudaEventRecord");
        }
        streams.synchronize();
        wallMs += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
        for (auto& runPtr : runs)
        {
            runPtr->totalMs += elapsed(runPtr->start, runPtr->stop);
        }
        for (auto& copy : links)
        {
            if (copy->mode == CopyMode::kPeer)
            {
                copy->totalMs += elapsed(copy->start, copy->stop);
            }
            else if (copy->mode == CopyMode::kHost)
            {
                copy->totalMs += elapsed(copy->d2hStart, copy->d2hStop) + elapsed(copy->start, copy->stop);
            }
        }
    }

    // The outputs of the last stage.
    StageRun& last = *runs.back();
    checkCuda(cudaSetDevice(last.stage->device), "cudaSetDevice");
    for (std::string const& name : last.outputs)
    {
        DeviceBuffer const& buffer = last.buffers.at(name);
        std::vector<uint8_t> host(buffer.bytes);
        checkCuda(cudaMemcpy(host.data(), buffer.ptr, host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
        printSummary(name, last.engine->getTensorDataType(name.c_str()), last.shapes.at(name), host);
    }
    double const n = static_cast<double>(options.iterations);
    std::cout << std::fixed << std::setprecision(3);
    if (!plan.pipeline)
    {
        std::cout << "enqueueV3: " << last.totalMs / n << " ms per run over " << options.iterations << " run(s)\n";
        return 0;
    }
    for (auto& runPtr : runs)
    {
        std::cout << runPtr->stage->label << " on GPU " << runPtr->stage->device << ": enqueueV3 " << runPtr->totalMs / n
                  << " ms per run\n";
    }
    for (auto& copy : links)
    {
        if (copy->mode != CopyMode::kSameDevice)
        {
            std::cout << "link " << copy->link->label() << ": copy " << copy->totalMs / n << " ms per run\n";
        }
    }
    std::cout << "pipeline: " << wallMs / n << " ms per run (host clock, stages, copies and synchronization) over "
              << options.iterations << " run(s)\n";
    return 0;
}

} // namespace dsa
