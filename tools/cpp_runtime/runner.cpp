#include "runner.h"

#include "engine_gate.h"
#include "engine_io.h"

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

//! Runs a plan: opens every stage, sets its shapes and buffers, chooses how each link crosses
//! GPUs, runs the stages ``iterations`` times and prints the timings and the last stage's outputs.
class PlanRunner : public PlanSession
{
public:
    explicit PlanRunner(RunOptions const& options);

    //! The whole run; 0 on success (UserError and runtime_error for the rest, as runPlan).
    int run();

private:
    //! Shapes and buffers of one stage: a linked input takes the real shape of the output feeding
    //! it; the others the stage's sizes (profile opt values, --dim, dims set by links).
    void bindStage(StageRun& run);

    //! Input ``name`` of ``run``, fed by ``link``: its shape, and its buffer (the output's own on
    //! the same GPU, else one on this stage's GPU that the link copies into).
    void bindInputFromLink(StageRun& run, std::string const& name, Link const& link, Sizes& sizes,
        std::map<std::string, std::string>& bound);

    //! Input ``name`` of ``run`` that the caller feeds: --input file or random values, uploaded.
    void bindInputFromCaller(StageRun& run, std::string const& name, Sizes const& sizes);

    void bindOutputs(StageRun& run);

    void setAddresses(StageRun& run);

    //! Wait for the uploads on every GPU, and refuse an --input that fed nothing.
    void finishUploads();

    //! How each link crosses GPUs: peer to peer when the pair allows it (access enabled once per
    //! pair), else through pinned host memory.
    void connectLinks();

    void connectLink(LinkRun& copy);

    void enablePeerAccess(int device, int peer);

    //! One run of every stage in order; returns its host-clock time in ms.
    double runOnce();

    //! The copies of the links into ``run``'s stage, enqueued before it.
    void copyLinksInto(StageRun& run);

    void copyPeer(StageRun& run, StageRun& source, LinkRun& copy);

    void copyThroughHost(StageRun& run, StageRun& source, LinkRun& copy);

    //! Add the event times of the run just synchronized to each stage's and link's total.
    void addEventTimes();

    //! The last stage's outputs, then the time per stage, link and run.
    void report(double wallMs);

    std::vector<std::unique_ptr<LinkRun>> mLinks;
    std::map<std::string, HostTensor> mFeeds; //!< by input name: stages sharing an input get the same values
    std::set<std::string> mFilesUsed;
    std::set<std::pair<int, int>> mPeerEnabled;
    std::mt19937_64 mRng{0};
};

PlanRunner::PlanRunner(RunOptions const& options)
    : PlanSession(options)
{
}

int PlanRunner::run()
{
    checkShapes(mPlan, mOptions.dims);  // static shapes first: fail before any engine is opened
    loadStages();
    for (auto& runPtr : mRuns)
    {
        bindStage(*runPtr);
    }
    finishUploads();
    connectLinks();

    // Run: stage after stage; a stage's stream waits for the stages feeding it; every iteration
    // ends with all streams synchronized, so buffers are not overwritten while still read.
    double wallMs = 0.0;
    for (int iteration = 0; iteration < mOptions.iterations; ++iteration)
    {
        wallMs += runOnce();
    }
    report(wallMs);
    return 0;
}

void PlanRunner::bindStage(StageRun& run)
{
    Stage const& stage = *run.stage;
    Sizes sizes = stageSizes(stage, mOptions.dims);
    std::map<std::string, std::string> bound;
    std::vector<std::string> const inputNames = listTensors(run);
    // Linked inputs first, so the dims they set size the other inputs.
    for (std::string const& name : inputNames)
    {
        Link const* link = mPlan.linkInto(stage.index, name);
        if (link != nullptr)
        {
            bindInputFromLink(run, name, *link, sizes, bound);
        }
    }
    for (std::string const& name : inputNames)
    {
        if (mPlan.linkInto(stage.index, name) == nullptr)
        {
            bindInputFromCaller(run, name, sizes);
        }
    }
    bindOutputs(run);
    setAddresses(run);
}

void PlanRunner::bindInputFromLink(StageRun& run, std::string const& name, Link const& link, Sizes& sizes,
    std::map<std::string, std::string>& bound)
{
    Stage const& stage = *run.stage;
    StageRun& source = *mRuns[static_cast<size_t>(link.from)];
    if (source.shapes.count(link.output) == 0)
    {
        throw UserError(link.label() + ": " + source.stage->label + "'s engine has no output '" + link.output
            + "' (its manifest lists one); rebuild the stage with `dsa-export build`.");
    }
    nvinfer1::DataType const given = source.engine->getTensorDataType(link.output.c_str());
    nvinfer1::DataType const taken = run.engine->getTensorDataType(name.c_str());
    if (given != taken)
    {
        throw UserError("type mismatch on link " + link.label() + ": the output is " + typeName(given)
            + " but the input takes " + typeName(taken) + "; build all stages with one precision.");
    }
    Shape const& shape = source.shapes[link.output];
    bindLinkedInput(stage, *stage.input(name), shape, link, sizes, bound);
    setInputShape(run, name, shape);
    auto copy = std::make_unique<LinkRun>();
    copy->link = &link;
    copy->srcDevice = source.stage->device;
    copy->dstDevice = stage.device;
    copy->src = source.addresses.at(link.output);
    copy->bytes = static_cast<size_t>(volume(shape)) * elementSize(given);
    if (copy->srcDevice == copy->dstDevice)
    {
        copy->mode = CopyMode::kSameDevice;  // same GPU, same stream: the input reads the output's buffer
        run.addresses[name] = const_cast<void*>(copy->src);
    }
    else
    {
        // Another GPU: a copy (connectLink picks peer-to-peer or pinned host memory). Leaving the
        // mode at kSameDevice here skipped every cross-GPU copy and the next stage read a buffer
        // nothing had filled.
        copy->mode = CopyMode::kPeer;
        DeviceBuffer& buffer = run.buffers[name];
        buffer.allocate(stage.device, copy->bytes);
        run.addresses[name] = buffer.ptr;
        copy->dst = buffer.ptr;
    }
    mLinks.push_back(std::move(copy));
}

void PlanRunner::bindInputFromCaller(StageRun& run, std::string const& name, Sizes const& sizes)
{
    Stage const& stage = *run.stage;
    TensorSpec const& spec = *stage.input(name);
    Shape const shape = resolve(spec, sizes);
    checkInputShape(stage, spec, shape);
    setInputShape(run, name, shape);
    nvinfer1::DataType const type = run.engine->getTensorDataType(name.c_str());
    auto known = mFeeds.find(name);
    if (known == mFeeds.end() || known->second.type != type || known->second.shape != shape)
    {
        known = mFeeds.insert_or_assign(name, makeInput(spec, type, shape, mOptions.inputFiles, mRng)).first;
    }
    if (mOptions.inputFiles.count(name))
    {
        mFilesUsed.insert(name);
    }
    DeviceBuffer& buffer = run.buffers[name];
    buffer.allocate(stage.device, known->second.bytes.size());
    checkCuda(cudaMemcpy(buffer.ptr, known->second.bytes.data(), buffer.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    run.addresses[name] = buffer.ptr;
    std::cout << stage.label << " input " << name << " " << toString(shape) << " " << typeName(type)
              << (mOptions.inputFiles.count(name) ? " from " + mOptions.inputFiles.at(name) : std::string(" (random)"))
              << "\n";
}

void PlanRunner::bindOutputs(StageRun& run)
{
    Stage const& stage = *run.stage;
    for (std::string const& name : run.outputs)
    {
        Shape const shape = toShape(run.context->getTensorShape(name.c_str()));
        if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; }))
        {
            throw UserError(stage.label + ": output '" + name + "' has the data-dependent shape " + toString(shape)
                + ", which this example does not handle.");
        }
        DeviceBuffer& buffer = run.buffers[name];
        buffer.allocate(
            stage.device, static_cast<size_t>(volume(shape)) * elementSize(run.engine->getTensorDataType(name.c_str())));
        run.addresses[name] = buffer.ptr;
        run.shapes[name] = shape;
    }
}

void PlanRunner::setAddresses(StageRun& run)
{
    for (auto const& [name, address] : run.addresses)
    {
        if (!run.context->setTensorAddress(name.c_str(), address))
        {
            throw std::runtime_error(run.stage->label + ": setTensorAddress failed for '" + name + "'");
        }
    }
}

void PlanRunner::finishUploads()
{
    // The uploads went through cudaMemcpy from pageable memory, which may return before the data
    // has landed; the streams are non-blocking, so wait for every GPU before the first run.
    for (auto& runPtr : mRuns)
    {
        checkCuda(cudaSetDevice(runPtr->stage->device), "cudaSetDevice");
        checkCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    for (auto const& [name, file] : mOptions.inputFiles)
    {
        if (!mFilesUsed.count(name))
        {
            throw UserError("--input names '" + name
                + "', which is no input the caller feeds (not an engine input, or one a link feeds).");
        }
    }
}

void PlanRunner::connectLinks()
{
    for (auto& copy : mLinks)
    {
        if (copy->mode == CopyMode::kSameDevice)
        {
            std::cout << "link " << copy->link->label() << ": GPU " << copy->srcDevice << ", no copy\n";
            continue;
        }
        connectLink(*copy);
        std::cout << "link " << copy->link->label() << ": GPU " << copy->srcDevice << " -> GPU " << copy->dstDevice
                  << ", " << copy->bytes << " bytes "
                  << (copy->mode == CopyMode::kPeer ? "peer to peer" : "through pinned host memory") << "\n";
    }
}

void PlanRunner::connectLink(LinkRun& copy)
{
    int canAccess = 0;
    checkCuda(cudaDeviceCanAccessPeer(&canAccess, copy.dstDevice, copy.srcDevice), "cudaDeviceCanAccessPeer");
    if (canAccess)
    {
        enablePeerAccess(copy.dstDevice, copy.srcDevice);
        copy.mode = CopyMode::kPeer;
    }
    else
    {
        copy.mode = CopyMode::kHost;
        checkCuda(cudaHostAlloc(&copy.pinned.ptr, std::max<size_t>(copy.bytes, 1), cudaHostAllocPortable),
            "cudaHostAlloc");
        copy.d2hStart.create(copy.srcDevice);
        copy.d2hStop.create(copy.srcDevice);
    }
    copy.start.create(copy.dstDevice);
    copy.stop.create(copy.dstDevice);
}

void PlanRunner::enablePeerAccess(int device, int peer)
{
    if (!mPeerEnabled.insert({device, peer}).second)
    {
        return;
    }
    checkCuda(cudaSetDevice(device), "cudaSetDevice");
    cudaError_t const status = cudaDeviceEnablePeerAccess(peer, 0);
    if (status == cudaErrorPeerAccessAlreadyEnabled)
    {
        cudaGetLastError();  // clear it: access is on, which is what we asked for
    }
    else
    {
        checkCuda(status, "cudaDeviceEnablePeerAccess");
    }
}

double PlanRunner::runOnce()
{
    auto const began = std::chrono::steady_clock::now();
    for (auto& runPtr : mRuns)
    {
        StageRun& run = *runPtr;
        copyLinksInto(run);
        checkCuda(cudaSetDevice(run.stage->device), "cudaSetDevice");
        enqueue(run, *run.context);
    }
    mStreams.synchronize();
    double const wallMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
    addEventTimes();
    return wallMs;
}

void PlanRunner::copyLinksInto(StageRun& run)
{
    for (auto& copy : mLinks)
    {
        if (copy->link->to != run.stage->index || copy->mode == CopyMode::kSameDevice)
        {
            continue;
        }
        StageRun& source = *mRuns[static_cast<size_t>(copy->link->from)];
        if (copy->mode == CopyMode::kPeer)
        {
            copyPeer(run, source, *copy);
        }
        else
        {
            copyThroughHost(run, source, *copy);
        }
    }
}

void PlanRunner::copyPeer(StageRun& run, StageRun& source, LinkRun& copy)
{
    int const device = run.stage->device;
    checkCuda(cudaSetDevice(device), "cudaSetDevice");
    checkCuda(cudaStreamWaitEvent(run.stream, source.stop.event, 0), "cudaStreamWaitEvent");
    checkCuda(cudaEventRecord(copy.start.event, run.stream), "cudaEventRecord");
    checkCuda(cudaMemcpyPeerAsync(copy.dst, device, copy.src, copy.srcDevice, copy.bytes, run.stream),
        "cudaMemcpyPeerAsync");
    checkCuda(cudaEventRecord(copy.stop.event, run.stream), "cudaEventRecord");
}

void PlanRunner::copyThroughHost(StageRun& run, StageRun& source, LinkRun& copy)
{
    checkCuda(cudaSetDevice(copy.srcDevice), "cudaSetDevice");
    checkCuda(cudaEventRecord(copy.d2hStart.event, source.stream), "cudaEventRecord");
    checkCuda(cudaMemcpyAsync(copy.pinned.ptr, copy.src, copy.bytes, cudaMemcpyDeviceToHost, source.stream),
        "cudaMemcpyAsync");
    checkCuda(cudaEventRecord(copy.d2hStop.event, source.stream), "cudaEventRecord");
    checkCuda(cudaSetDevice(run.stage->device), "cudaSetDevice");
    checkCuda(cudaStreamWaitEvent(run.stream, copy.d2hStop.event, 0), "cudaStreamWaitEvent");
    checkCuda(cudaEventRecord(copy.start.event, run.stream), "cudaEventRecord");
    checkCuda(cudaMemcpyAsync(copy.dst, copy.pinned.ptr, copy.bytes, cudaMemcpyHostToDevice, run.stream),
        "cudaMemcpyAsync");
    checkCuda(cudaEventRecord(copy.stop.event, run.stream), "cudaEventRecord");
}

void PlanRunner::addEventTimes()
{
    for (auto& runPtr : mRuns)
    {
        runPtr->totalMs += elapsed(runPtr->start, runPtr->stop);
    }
    for (auto& copy : mLinks)
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

void PlanRunner::report(double wallMs)
{
    StageRun& last = *mRuns.back();
    checkCuda(cudaSetDevice(last.stage->device), "cudaSetDevice");
    for (std::string const& name : last.outputs)
    {
        DeviceBuffer const& buffer = last.buffers.at(name);
        std::vector<uint8_t> host(buffer.bytes);
        checkCuda(cudaMemcpy(host.data(), buffer.ptr, host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
        printSummary(name, last.engine->getTensorDataType(name.c_str()), last.shapes.at(name), host);
    }
    double const n = static_cast<double>(mOptions.iterations);
    std::cout << std::fixed << std::setprecision(3);
    if (!mPlan.pipeline)
    {
        std::cout << "enqueueV3: " << last.totalMs / n << " ms per run over " << mOptions.iterations << " run(s)\n";
        return;
    }
    for (auto& runPtr : mRuns)
    {
        std::cout << runPtr->stage->label << " on GPU " << runPtr->stage->device << ": enqueueV3 "
                  << runPtr->totalMs / n << " ms per run\n";
    }
    for (auto& copy : mLinks)
    {
        if (copy->mode != CopyMode::kSameDevice)
        {
            std::cout << "link " << copy->link->label() << ": copy " << copy->totalMs / n << " ms per run\n";
        }
    }
    std::cout << "pipeline: " << wallMs / n << " ms per run (host clock, stages, copies and synchronization) over "
              << mOptions.iterations << " run(s)\n";
}

} // namespace

int runPlan(RunOptions const& options)
{
    PlanRunner runner(options);
    return runner.run();
}

} // namespace dsa
