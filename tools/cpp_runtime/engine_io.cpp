#include "engine_io.h"

#include "engine_gate.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>

namespace dsa
{

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

float elapsed(Event const& start, Event const& stop)
{
    float ms = 0.f;
    checkCuda(cudaEventElapsedTime(&ms, start.event, stop.event), "cudaEventElapsedTime");
    return ms;
}

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

void setInputShape(StageRun& run, std::string const& name, Shape const& shape, int profile,
    nvinfer1::IExecutionContext* context)
{
    Stage const& stage = *run.stage;
    nvinfer1::ICudaEngine const& engine = *run.engine;
    nvinfer1::Dims const lo = engine.getProfileShape(name.c_str(), profile, nvinfer1::OptProfileSelector::kMIN);
    nvinfer1::Dims const hi = engine.getProfileShape(name.c_str(), profile, nvinfer1::OptProfileSelector::kMAX);
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
    if (!(context ? context : run.context.get())->setInputShape(name.c_str(), dims))
    {
        throw UserError(stage.label + ": the engine rejected shape " + toString(shape) + " for input '" + name + "'.");
    }
    run.shapes[name] = shape;
}

PlanOptions planOptions(RunOptions const& options)
{
    int deviceCount = 0;
    cudaError_t const counted = cudaGetDeviceCount(&deviceCount);
    if (counted != cudaSuccess)
    {
        throw UserError(std::string("no CUDA GPU is usable here (cudaGetDeviceCount: ") + cudaGetErrorString(counted) + ").");
    }
    PlanOptions result;
    result.deviceCount = deviceCount;
    result.device = options.device;
    return result;
}

void checkStagesLoadable(Plan const& plan)
{
    std::vector<int> const linked = linkedVersion();
    for (Stage const& stage : plan.stages)
    {
        checkEngineVersion(stage, linked);
        cudaDeviceProp properties{};
        checkCuda(cudaGetDeviceProperties(&properties, stage.device), "cudaGetDeviceProperties");
        checkComputeCapability(stage, properties.major, properties.minor, properties.name);
    }
}

std::vector<std::unique_ptr<StageRun>> openStages(Plan const& plan, RunOptions const& options, Logger& logger,
    Streams& streams)
{
    std::vector<std::unique_ptr<StageRun>> runs;
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
    return runs;
}

PlanSession::PlanSession(RunOptions const& options)
    : mOptions(options)
    , mPlan(readPlan(options.path, planOptions(options)))
{
}

void PlanSession::loadStages()
{
    checkStagesLoadable(mPlan);
    mRuns = openStages(mPlan, mOptions, mLogger, mStreams);
}

std::vector<std::string> PlanSession::listTensors(StageRun& run)
{
    Stage const& stage = *run.stage;
    nvinfer1::ICudaEngine const& engine = *run.engine;
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
    return inputNames;
}

void PlanSession::enqueue(StageRun& run, nvinfer1::IExecutionContext& context)
{
    checkCuda(cudaEventRecord(run.start.event, run.stream), "cudaEventRecord");
    if (!context.enqueueV3(run.stream))
    {
        throw std::runtime_error(run.stage->label + ": enqueueV3 failed (see the TensorRT messages above)");
    }
    checkCuda(cudaEventRecord(run.stop.event, run.stream), "cudaEventRecord");
}

} // namespace dsa
