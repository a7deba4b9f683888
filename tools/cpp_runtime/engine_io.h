// What the runner and the generator share: TensorRT and CUDA helpers, one opened stage
// (StageRun), random or file inputs, output summaries, plugin loading, and the plan with its
// stages opened (PlanSession, the base of PlanRunner and Generator). Needs TensorRT and the CUDA
// runtime (runner.cpp, generate.cpp).
#pragma once

#include "host_math.h"
#include "pipeline.h"
#include "runner.h"

#include <NvInfer.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace dsa
{

//! runtime_error naming ``what`` unless ``status`` is cudaSuccess.
void checkCuda(cudaError_t status, char const* what);

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
    //! Free the buffer (allocate() may then give it another size).
    void release()
    {
        if (ptr)
        {
            cudaSetDevice(device);
            cudaFree(ptr);
            ptr = nullptr;
            bytes = 0;
        }
    }
    ~DeviceBuffer()
    {
        release();
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

struct HostTensor
{
    nvinfer1::DataType type{nvinfer1::DataType::kFLOAT};
    Shape shape;
    std::vector<uint8_t> bytes;
};

size_t elementSize(nvinfer1::DataType type);

char const* typeName(nvinfer1::DataType type);

Shape toShape(nvinfer1::Dims const& dims);

int64_t volume(Shape const& shape);

float elapsed(Event const& start, Event const& stop);

HostTensor makeInput(TensorSpec const& spec, nvinfer1::DataType type, Shape const& shape,
    std::map<std::string, std::string> const& files, std::mt19937_64& rng);

void printSummary(std::string const& name, nvinfer1::DataType type, Shape const& shape, std::vector<uint8_t> const& host);

std::vector<int> linkedVersion();

//! Load the DSA plugin library into TensorRT's process-wide plugin registry (getPluginRegistry,
//! the registry the Python side uses too), once, before the first engine that needs it is
//! deserialized: deserialization looks the creators up there, and loadLibrary fails when the
//! library's creators are registered already (as plugins.library.load_plugin_library knows).
void loadPlugins(RunOptions const& options, Stage const& stage, std::string& loaded);

void openStage(StageRun& run, Logger& logger, RunOptions const& options, std::string& pluginsLoaded);

//! Set ``name``'s shape on ``context`` (default: ``run``'s), refused outside optimization profile ``profile``.
void setInputShape(StageRun& run, std::string const& name, Shape const& shape, int profile = 0,
    nvinfer1::IExecutionContext* context = nullptr);

//! The plan options of this machine: its GPU count (cudaGetDeviceCount; UserError when no GPU is
//! usable) and --device.
PlanOptions planOptions(RunOptions const& options);

//! The engine gate's checks that C++ can see, for every stage, before any deserialization: the
//! linked TensorRT may load the engine, and the stage's GPU has a compute capability it was built for.
void checkStagesLoadable(Plan const& plan);

//! Every stage opened on its GPU (runtime, plugins, engine, one execution context on profile 0),
//! with its stream and start/stop events.
std::vector<std::unique_ptr<StageRun>> openStages(Plan const& plan, RunOptions const& options, Logger& logger,
    Streams& streams);

//! What running a plan (runner.cpp, PlanRunner) and generating from it (generate.cpp, Generator)
//! share: the plan, read and checked before TensorRT or CUDA is touched, and its stages opened on
//! their GPUs. Members are released in reverse order: what a derived class holds (buffers, extra
//! contexts), then the stages, the streams and last the logger.
class PlanSession
{
public:
    PlanSession(PlanSession const&) = delete;
    PlanSession& operator=(PlanSession const&) = delete;

protected:
    //! Read and check ``options.path`` (readPlan, with this machine's GPU count and --device).
    explicit PlanSession(RunOptions const& options);
    ~PlanSession() = default;

    //! The engine gate for every stage (checkStagesLoadable), then every stage opened on its GPU
    //! (openStages). Call it once the derived class has checked the plan for its own needs.
    void loadStages();

    //! The names of ``run``'s engine inputs, in engine order; its outputs are appended to
    //! ``run.outputs``. UserError for an input the stage's manifest does not list.
    static std::vector<std::string> listTensors(StageRun& run);

    //! Enqueue ``context`` on ``run``'s stream between ``run``'s start and stop events.
    static void enqueue(StageRun& run, nvinfer1::IExecutionContext& context);

    RunOptions const& mOptions;
    Plan const mPlan;
    Logger mLogger;   //!< outlives every runtime (declared before them, destroyed after)
    Streams mStreams;
    std::vector<std::unique_ptr<StageRun>> mRuns; //!< one per stage, in plan order (empty until loadStages)
};

} // namespace dsa
