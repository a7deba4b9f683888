// See paged_engine.h. Pools: pages = limits.pages (page 0 is the graph's scratch page). A pool
// whose present_* the engine reports as an alias of its past_* (getAliasedInputTensor, TensorRT
// 10.15 and newer: an in-place cache update) gets one buffer; otherwise two that swap roles after
// every call (the stage's parity), so no cache is ever copied. A decode step's graph is keyed by
// (batch, parity): the pools it reads and writes are fixed by the parity, the controls, outputs and
// crossings by the batch.

#include "paged_engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <sstream>
#include <stdexcept>

namespace dsa
{

namespace
{

void require(bool ok, std::string const& message)
{
    if (!ok)
    {
        throw UserError(message);
    }
}

//! The engine's alias of ``output`` (TensorRT 10.15+), or nullptr where the headers lack the call.
template <typename Engine>
auto aliasedInput(Engine const& engine, char const* output, int) -> decltype(engine.getAliasedInputTensor(output))
{
    return engine.getAliasedInputTensor(output);
}

template <typename Engine>
char const* aliasedInput(Engine const&, char const*, long)
{
    return nullptr;
}

//! Bytes of ``shape`` of ``type`` with its batch (axis 0) ``batch`` grown to ``most``.
size_t bytesFor(Shape const& shape, nvinfer1::DataType type, int64_t batch, int64_t most)
{
    int64_t const rows = shape.empty() || shape[0] != batch ? 1 : std::max(batch, most);
    int64_t const each = shape.empty() || shape[0] != batch ? volume(shape) : volume(shape) / std::max<int64_t>(batch, 1);
    return static_cast<size_t>(rows * each) * elementSize(type);
}

void hostAllocate(PinnedBuffer& buffer, size_t& size, size_t bytes)
{
    if (bytes <= size)
    {
        return;
    }
    if (buffer.ptr != nullptr)
    {
        cudaFreeHost(buffer.ptr);
        buffer.ptr = nullptr;
    }
    checkCuda(cudaHostAlloc(&buffer.ptr, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    size = bytes;
}

LogitType logitTypeOf(nvinfer1::DataType type)
{
    switch (type)
    {
    case nvinfer1::DataType::kFLOAT: return LogitType::kFLOAT;
    case nvinfer1::DataType::kHALF: return LogitType::kHALF;
    case nvinfer1::DataType::kBF16: return LogitType::kBF16;
    default: break;
    }
    throw UserError(std::string("the logits are ") + typeName(type) + ", which the runtime does not read.");
}

} // namespace

DeviceSampler::~DeviceSampler()
{
    if (mHandle != nullptr)
    {
        dlclose(mHandle);
    }
}

void DeviceSampler::open(std::vector<std::string> const& candidates, std::string& note)
{
    if (candidates.empty())
    {
        note = "no libdsa_kernels.so is known (RuntimeOptions::kernels, $DSA_EXPORT_KERNELS_LIB or beside the plugin "
               "library): tokens are the host's arg max of the logits (greedy only).";
        return;
    }
    for (std::string const& path : candidates)
    {
        void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr)
        {
            note = "could not load " + path + ": tokens are the host's arg max of the logits (greedy only).";
            continue;
        }
        using VersionFn = int32_t (*)();
        auto const version = reinterpret_cast<VersionFn>(dlsym(handle, "dsa_kernels_abi_version"));
        auto const sample = reinterpret_cast<SampleFn>(dlsym(handle, "dsa_sample_tokens"));
        auto const error = reinterpret_cast<ErrorFn>(dlsym(handle, "dsa_last_error"));
        if (version == nullptr || sample == nullptr || error == nullptr || version() < 5)
        {
            note = path + " has no device sampler (dsa_sample_tokens, C ABI 5); rebuild it with `dsa-export plugins "
                   "build`. Tokens are the host's arg max of the logits (greedy only).";
            dlclose(handle);
            continue;
        }
        mHandle = handle;
        mSample = sample;
        mLastError = error;
        note = "tokens are chosen on the device by dsa_sample_tokens of " + path + ".";
        return;
    }
}

void DeviceSampler::sample(void const* logits, int64_t rowStride, int32_t* out, float const* temperature,
    float const* topP, uint64_t const* seeds, int64_t const* offsets, int64_t rows, int64_t vocab, int32_t dtype,
    cudaStream_t stream) const
{
    int32_t const status = mSample(logits, rowStride, out, temperature, topP, seeds, offsets, rows, vocab, dtype, stream);
    if (status != 0)
    {
        throw UserError(std::string("the device sampler failed: ") + mLastError());
    }
}

GraphExec::~GraphExec()
{
    if (exec != nullptr)
    {
        cudaSetDevice(device);
        cudaGraphExecDestroy(exec);
    }
}

PagedEngine::PagedEngine(RunOptions const& options, PagedRequest const& request, bool graphs)
    : PlanSession(options)
    , mGraphs(graphs)
{
    checkPagedPlan(mPlan);
    mLimits = pagedLimits(mPlan, request);
    loadStages();
    mPaged.resize(mRuns.size());
    for (size_t k = 0; k < mRuns.size(); ++k)
    {
        mPaged[k].run = mRuns[k].get();
        prepareStage(mPaged[k]);
    }
    allocateStaging();
    mLogitType = logitTypeOf(mRuns.back()->engine->getTensorDataType("logits"));
    // The plugin library the stages use (loadPlugins' order), beside which the kernel library lies.
    std::string plugins = mOptions.plugins;
    if (plugins.empty() && std::getenv("DSA_EXPORT_PLUGIN_LIB") != nullptr)
    {
        plugins = std::getenv("DSA_EXPORT_PLUGIN_LIB");
    }
    for (size_t k = 0; plugins.empty() && k < mPlan.stages.size(); ++k)
    {
        plugins = mPlan.stages[k].engine.pluginLibrary;
    }
    std::string note;
    mSampler.open(kernelsLibraryCandidates(mOptions.kernels, std::getenv("DSA_EXPORT_KERNELS_LIB"), plugins), note);
    mNotes.push_back(note);
    allocateSampler();
}

void PagedEngine::allocateSampler()
{
    if (!mSampler.available())
    {
        return;
    }
    // Per row: temperature (4), top_p (4), seed (8), offset (8), id (4) bytes, for the largest call.
    int64_t const rows = std::max<int64_t>(mLimits.prefillBatch, mLimits.slots);
    size_t const bytes = static_cast<size_t>(rows) * 32;
    mSamplingDevice.allocate(mRuns.back()->stage->device, bytes);
    hostAllocate(mSamplingHost, mSamplingBytes, bytes);
}

PagedEngine::~PagedEngine()
{
    mPaged.clear();  // graphs, contexts and buffers before the stages
}

bool PagedEngine::graphsActive() const
{
    return mGraphs && std::none_of(mPaged.begin(), mPaged.end(), [](PagedStage const& s) { return s.graphsFailed; });
}

void PagedEngine::prepareStage(PagedStage& stage)
{
    StageRun& run = *stage.run;
    checkCuda(cudaSetDevice(run.stage->device), "cudaSetDevice");
    stage.calls[0].context = run.context.get();
    stage.calls[1].context = run.context.get();
    if (run.engine->getNbOptimizationProfiles() > 1)
    {
        stage.decodeContext.reset(run.engine->createExecutionContext());
        require(stage.decodeContext && stage.decodeContext->setOptimizationProfileAsync(1, run.stream),
            run.stage->label + ": cannot create the decode execution context on profile 1.");
        stage.calls[1].context = stage.decodeContext.get();
        stage.calls[1].profile = 1;
    }
    stage.inputNames = listTensors(run);
    allocatePools(stage);
    allocateControls(stage);
}

void PagedEngine::allocatePools(PagedStage& stage)
{
    StageRun& run = *stage.run;
    nvinfer1::ICudaEngine const& engine = *run.engine;
    for (std::string const& name : stage.inputNames)
    {
        if (!isPool(name) || mPlan.linkInto(run.stage->index, name) != nullptr)
        {
            continue;
        }
        PagedPool& pool = stage.pools[name];
        pool.present = presentOf(name);
        pool.shape = Shape{mLimits.pages, mLimits.page, run.stage->input(name)->shape[2].size};
        require(std::find(run.outputs.begin(), run.outputs.end(), pool.present) != run.outputs.end(),
            run.stage->label + " returns no '" + pool.present + "' for its cache pool '" + name + "'.");
        char const* aliased = aliasedInput(engine, pool.present.c_str(), 0);
        pool.inPlace = aliased != nullptr && name == aliased;
        size_t const bytes = static_cast<size_t>(volume(pool.shape)) * elementSize(engine.getTensorDataType(name.c_str()));
        for (int copy = 0; copy < (pool.inPlace ? 1 : 2); ++copy)
        {
            pool.buffers[copy].allocate(run.stage->device, bytes);
            checkCuda(cudaMemset(pool.buffers[copy].ptr, 0, bytes), "cudaMemset");
        }
        std::ostringstream note;
        note << run.stage->label << " pool " << name << " " << toString(pool.shape) << ": " << bytes << " bytes on GPU "
             << run.stage->device << (pool.inPlace ? ", written in place" : ", two buffers (the engine writes a new tensor)");
        mNotes.push_back(note.str());
    }
}

void PagedEngine::allocateControls(PagedStage& stage)
{
    StageRun& run = *stage.run;
    int64_t const rows = std::max<int64_t>(mLimits.prefillBatch, mLimits.slots);
    for (std::string const name : {"input_ids", "query_start", "query_lengths", "block_table"})
    {
        if (run.stage->input(name) == nullptr || mPlan.linkInto(run.stage->index, name) != nullptr)
        {
            continue;
        }
        nvinfer1::DataType const type = run.engine->getTensorDataType(name.c_str());
        bool const ids = name == "input_ids";
        require(type == (ids ? nvinfer1::DataType::kINT64 : nvinfer1::DataType::kINT32),
            run.stage->label + ": input '" + name + "' is " + typeName(type) + ", not " + (ids ? "int64" : "int32") + ".");
        int64_t const count = ids ? std::max<int64_t>(mLimits.prefillBatch * mLimits.maxPrompt, mLimits.slots)
            : name == "block_table" ? rows * mLimits.width() : rows;
        stage.controls[name].allocate(run.stage->device, static_cast<size_t>(count) * elementSize(type));
    }
}

void PagedEngine::allocateStaging()
{
    int64_t const rows = std::max<int64_t>(mLimits.prefillBatch, mLimits.slots);
    int64_t const ids = std::max<int64_t>(mLimits.prefillBatch * mLimits.maxPrompt, mLimits.slots);
    size_t const bytes = static_cast<size_t>(ids) * sizeof(int64_t)
        + static_cast<size_t>(rows * (2 + mLimits.width())) * sizeof(int32_t);
    hostAllocate(mControlsHost, mControlsBytes, bytes);
}

void PagedEngine::run(CallInputs const& call, SamplingRows const& sampling, bool keepLogits)
{
    require(sampling.temperature.size() == static_cast<size_t>(call.batch), "the sampling settings must have one row per "
        "row of the call.");
    if (sampling.anySampled && !mSampler.available())
    {
        throw UserError("sampling (a temperature above 0) needs the device sampler of libdsa_kernels.so; pass its "
                        "path (RuntimeOptions::kernels or $DSA_EXPORT_KERNELS_LIB) or build it with `dsa-export plugins build`.");
    }
    // The call's controls, staged once in pinned memory: ids, starts, counts, table.
    auto* host = static_cast<uint8_t*>(mControlsHost.ptr);
    std::memcpy(host, call.ids.data(), call.ids.size() * sizeof(int64_t));
    host += call.ids.size() * sizeof(int64_t);
    for (std::vector<int32_t> const* part : {&call.starts, &call.counts, &call.table})
    {
        std::memcpy(host, part->data(), part->size() * sizeof(int32_t));
        host += part->size() * sizeof(int32_t);
    }
    for (PagedStage& stage : mPaged)
    {
        callStage(stage, call);
    }
    mVocab = logitsShape(call)[1];
    if (mSampler.available())
    {
        sampleOnDevice(call, sampling);
        if (keepLogits)
        {
            copyLogits(call);
        }
        mStreams.synchronize();
        mTokens.assign(static_cast<size_t>(call.batch), 0);
        int32_t const* ids = reinterpret_cast<int32_t const*>(static_cast<uint8_t const*>(mSamplingHost.ptr)
            + static_cast<size_t>(call.batch) * 24);
        std::copy(ids, ids + call.batch, mTokens.begin());
        return;
    }
    copyLogits(call);
    mStreams.synchronize();
    mTokens = argmaxRows(mLogitsHost.ptr, mLogitType, call.batch, mVocab);
}

void PagedEngine::callStage(PagedStage& stage, CallInputs const& call)
{
    StageRun& run = *stage.run;
    checkCuda(cudaSetDevice(run.stage->device), "cudaSetDevice");
    uploadControls(stage, call);
    bindInputs(stage, call);
    bindOutputs(stage, call);
    if (call.prefill || !mGraphs || stage.graphsFailed)
    {
        enqueue(run, *stage.calls[call.prefill ? 0 : 1].context);
    }
    else
    {
        decodeStep(stage, call);
    }
    bool const swapped = std::any_of(stage.pools.begin(), stage.pools.end(), [](auto const& p) { return !p.second.inPlace; });
    stage.parity = swapped ? 1 - stage.parity : stage.parity;  // the written pools are the next call's past
}

void PagedEngine::uploadControls(PagedStage& stage, CallInputs const& call)
{
    auto const* host = static_cast<uint8_t const*>(mControlsHost.ptr);
    size_t const sizes[] = {call.ids.size() * sizeof(int64_t), call.starts.size() * sizeof(int32_t),
        call.counts.size() * sizeof(int32_t), call.table.size() * sizeof(int32_t)};
    char const* names[] = {"input_ids", "query_start", "query_lengths", "block_table"};
    for (int i = 0; i < 4; ++i)
    {
        auto const buffer = stage.controls.find(names[i]);
        if (buffer != stage.controls.end())
        {
            require(sizes[i] <= buffer->second.bytes, stage.run->stage->label + ": input '" + names[i] + "' outgrew its buffer.");
            checkCuda(cudaMemcpyAsync(buffer->second.ptr, host, sizes[i], cudaMemcpyHostToDevice, stage.run->stream),
                "cudaMemcpyAsync");
        }
        host += sizes[i];
    }
}

Shape PagedEngine::controlShape(std::string const& name, CallInputs const& call) const
{
    if (name == "input_ids")
    {
        return Shape{call.batch, call.length};
    }
    return name == "block_table" ? Shape{call.batch, call.width} : Shape{call.batch};
}

void PagedEngine::bindInputs(PagedStage& stage, CallInputs const& call)
{
    StageRun& run = *stage.run;
    CallBuffers& buffers = stage.calls[call.prefill ? 0 : 1];
    for (std::string const& name : stage.inputNames)
    {
        Link const* link = mPlan.linkInto(run.stage->index, name);
        void* address = nullptr;
        Shape shape;
        if (link != nullptr)
        {
            PagedStage& source = mPaged[static_cast<size_t>(link->from)];
            shape = toShape(source.calls[call.prefill ? 0 : 1].context->getTensorShape(link->output.c_str()));
            address = linkedInput(stage, name, *link, call);
        }
        else if (isPool(name))
        {
            PagedPool& pool = stage.pools.at(name);
            shape = pool.shape;
            address = pool.buffers[pool.inPlace ? 0 : stage.parity].ptr;
        }
        else
        {
            shape = controlShape(name, call);
            address = stage.controls.at(name).ptr;
        }
        setInputShape(run, name, shape, buffers.profile, buffers.context);
        require(buffers.context->setTensorAddress(name.c_str(), address),
            run.stage->label + ": setTensorAddress failed for '" + name + "'.");
    }
}

void* PagedEngine::linkedInput(PagedStage& stage, std::string const& name, Link const& link, CallInputs const& call)
{
    StageRun& run = *stage.run;
    int const mode = call.prefill ? 0 : 1;
    PagedStage& source = mPaged[static_cast<size_t>(link.from)];
    DeviceBuffer& produced = source.calls[mode].outputs.at(link.output);
    if (source.run->stage->device == run.stage->device)
    {
        return produced.ptr;  // same GPU, same stream: read in place
    }
    DeviceBuffer& crossing = stage.calls[mode].crossings[name];
    if (crossing.bytes < produced.bytes)
    {
        crossing.release();
        crossing.allocate(run.stage->device, produced.bytes);  // decode: sized for every slot once
    }
    Shape const shape = toShape(source.calls[mode].context->getTensorShape(link.output.c_str()));
    size_t const bytes = static_cast<size_t>(volume(shape)) * elementSize(run.engine->getTensorDataType(name.c_str()));
    checkCuda(cudaStreamWaitEvent(run.stream, source.run->stop.event, 0), "cudaStreamWaitEvent");
    checkCuda(cudaMemcpyPeerAsync(crossing.ptr, run.stage->device, produced.ptr, source.run->stage->device, bytes,
                  run.stream), "cudaMemcpyPeerAsync");
    return crossing.ptr;
}

void PagedEngine::bindOutputs(PagedStage& stage, CallInputs const& call)
{
    CallBuffers& buffers = stage.calls[call.prefill ? 0 : 1];
    for (std::string const& name : stage.run->outputs)
    {
        void* address = nullptr;
        auto const pool = std::find_if(
            stage.pools.begin(), stage.pools.end(), [&](auto const& item) { return item.second.present == name; });
        if (pool != stage.pools.end())
        {
            PagedPool& p = pool->second;
            address = p.buffers[p.inPlace ? 0 : 1 - stage.parity].ptr;
        }
        else
        {
            address = otherOutput(stage, name, call);
        }
        require(buffers.context->setTensorAddress(name.c_str(), address),
            stage.run->stage->label + ": setTensorAddress failed for '" + name + "'.");
    }
}

void* PagedEngine::otherOutput(PagedStage& stage, std::string const& name, CallInputs const& call)
{
    StageRun& run = *stage.run;
    CallBuffers& buffers = stage.calls[call.prefill ? 0 : 1];
    Shape const shape = toShape(buffers.context->getTensorShape(name.c_str()));
    require(std::all_of(shape.begin(), shape.end(), [](int64_t d) { return d >= 0; }),
        run.stage->label + ": output '" + name + "' has the data-dependent shape " + toString(shape) + ".");
    nvinfer1::DataType const type = run.engine->getTensorDataType(name.c_str());
    size_t const bytes = static_cast<size_t>(volume(shape)) * elementSize(type);
    DeviceBuffer& buffer = buffers.outputs[name];
    if (buffer.bytes < bytes)
    {
        require(call.prefill || buffer.ptr == nullptr, run.stage->label + ": output '" + name
            + "' outgrew the buffer its decode graphs use.");
        buffer.release();
        buffer.allocate(run.stage->device, call.prefill ? bytes : bytesFor(shape, type, call.batch, mLimits.slots));
    }
    return buffer.ptr;
}

void PagedEngine::decodeStep(PagedStage& stage, CallInputs const& call)
{
    StageRun& run = *stage.run;
    nvinfer1::IExecutionContext& context = *stage.calls[1].context;
    std::pair<int64_t, int> const key{call.batch, stage.parity};
    auto const found = stage.graphs.find(key);
    if (found == stage.graphs.end())
    {
        enqueue(run, context);  // the first step of this shape runs as is, then is captured
        capture(stage, context, key);
        return;
    }
    checkCuda(cudaEventRecord(run.start.event, run.stream), "cudaEventRecord");
    checkCuda(cudaGraphLaunch(found->second->exec, run.stream), "cudaGraphLaunch");
    checkCuda(cudaEventRecord(run.stop.event, run.stream), "cudaEventRecord");
}

void PagedEngine::capture(PagedStage& stage, nvinfer1::IExecutionContext& context, std::pair<int64_t, int> key)
{
    StageRun& run = *stage.run;
    cudaGraph_t graph = nullptr;
    bool ok = cudaStreamBeginCapture(run.stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (ok)
    {
        bool const enqueued = context.enqueueV3(run.stream);
        ok = cudaStreamEndCapture(run.stream, &graph) == cudaSuccess && enqueued && graph != nullptr;
    }
    auto exec = std::make_unique<GraphExec>();
    exec->device = run.stage->device;
    ok = ok && cudaGraphInstantiateWithFlags(&exec->exec, graph, 0) == cudaSuccess;
    if (graph != nullptr)
    {
        cudaGraphDestroy(graph);
    }
    if (!ok)
    {
        cudaGetLastError();  // clear the capture's error; this stage's steps run without graphs
        stage.graphsFailed = true;
        mNotes.push_back(run.stage->label + ": CUDA graph capture failed; its decode steps are enqueued as is.");
        return;
    }
    stage.graphs[key] = std::move(exec);
}

Shape PagedEngine::logitsShape(CallInputs const& call)
{
    PagedStage& last = mPaged.back();
    CallBuffers& buffers = last.calls[call.prefill ? 0 : 1];
    Shape const shape = toShape(buffers.context->getTensorShape("logits"));
    require(shape.size() == 2 && shape[0] == call.batch, "the logits are " + toString(shape)
        + ", not [batch, vocab]; export the model again with --graph paged.");
    return shape;
}

void PagedEngine::copyLogits(CallInputs const& call)
{
    PagedStage& last = mPaged.back();
    CallBuffers& buffers = last.calls[call.prefill ? 0 : 1];
    Shape const shape = logitsShape(call);
    size_t const bytes = static_cast<size_t>(volume(shape)) * elementSize(last.run->engine->getTensorDataType("logits"));
    hostAllocate(mLogitsHost, mLogitsBytes, bytes);
    checkCuda(cudaSetDevice(last.run->stage->device), "cudaSetDevice");
    checkCuda(cudaMemcpyAsync(mLogitsHost.ptr, buffers.outputs.at("logits").ptr, bytes, cudaMemcpyDeviceToHost,
                  last.run->stream), "cudaMemcpyAsync");
}

void PagedEngine::sampleOnDevice(CallInputs const& call, SamplingRows const& sampling)
{
    // One staging block, [temperature B x f32 | top_p B x f32 | seeds B x u64 | offsets B x i64 | ids B x i32],
    // one copy in, the sampler on the last stage's stream, one copy of the ids out.
    PagedStage& last = mPaged.back();
    CallBuffers& buffers = last.calls[call.prefill ? 0 : 1];
    size_t const rows = static_cast<size_t>(call.batch);
    auto* host = static_cast<uint8_t*>(mSamplingHost.ptr);
    std::memcpy(host, sampling.temperature.data(), rows * sizeof(float));
    std::memcpy(host + rows * 4, sampling.topP.data(), rows * sizeof(float));
    std::memcpy(host + rows * 8, sampling.seeds.data(), rows * sizeof(uint64_t));
    std::memcpy(host + rows * 16, sampling.offsets.data(), rows * sizeof(int64_t));
    auto* device = static_cast<uint8_t*>(mSamplingDevice.ptr);
    cudaStream_t const stream = last.run->stream;
    checkCuda(cudaSetDevice(last.run->stage->device), "cudaSetDevice");
    checkCuda(cudaMemcpyAsync(device, host, rows * 24, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    int32_t const dtype = mLogitType == LogitType::kFLOAT ? 0 : mLogitType == LogitType::kHALF ? 1 : 2;
    mSampler.sample(buffers.outputs.at("logits").ptr, mVocab, reinterpret_cast<int32_t*>(device + rows * 24),
        reinterpret_cast<float const*>(device), reinterpret_cast<float const*>(device + rows * 4),
        reinterpret_cast<uint64_t const*>(device + rows * 8), reinterpret_cast<int64_t const*>(device + rows * 16),
        call.batch, mVocab, dtype, stream);
    checkCuda(cudaMemcpyAsync(host + rows * 24, device + rows * 24, rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                  stream), "cudaMemcpyAsync");
}

} // namespace dsa
