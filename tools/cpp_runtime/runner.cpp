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

} // namespace

int runPlan(RunOptions const& options)
{
    Plan const plan = readPlan(options.path, planOptions(options));
    checkShapes(plan, options.dims);  // static shapes first: fail before any engine is opened
    checkStagesLoadable(plan);

    Logger logger;  // outlives every runtime (declared first, destroyed last)
    Streams streams;
    std::vector<std::unique_ptr<StageRun>> runs = openStages(plan, options, logger, streams);
    std::vector<std::unique_ptr<LinkRun>> links;

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
