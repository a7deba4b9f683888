// dsa_runtime PATH --generate N: greedy generation over a paged build (`dsa-export build HF_DIR
// --stages K --graph paged`, or one paged build folder).
//
// A paged stage takes input_ids (the first stage) or hidden_states, query_start [B],
// query_lengths [B], block_table [B, M] and per layer a cache pool past_*_pool_i [pages, page, W];
// it returns the pools with the call's tokens written (present_*_pool_i) and, from the last stage,
// logits [B, vocab] of each row's last new token (docs/hf.md, "The paged graph").
//
// Here: every pool is allocated once on its stage's GPU (pages = 1 + B * ceil((L + N) / page):
// page 0 is the graph's scratch page, row b owns pages 1 + b*M .. b*M + M) and stays there for the
// whole generation. When the engine reports a present pool as an alias of its past pool
// (ICudaEngine::getAliasedInputTensor: an in-place cache update layer or a plugin declaring it),
// both are bound to one buffer; otherwise (a scatter layer: TensorRT writes a new tensor) each pool
// has two buffers that swap roles after every call, so no cache is copied by this program. The
// prefill runs on optimization profile 0 (sequence = L), the decode steps on profile 1 (sequence
// = 1) through a second execution context; tokens go back to the host once per step (B ids) and
// the logits come to the host for the arg max (B x vocab values).

#include "engine_io.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <set>
#include <stdexcept>

namespace dsa
{

namespace
{

bool isPool(std::string const& name)
{
    return name.rfind("past_", 0) == 0 && name.find("_pool_") != std::string::npos;
}

//! The per-call inputs the generator writes itself (the rest are cache pools and links).
constexpr char const* kCONTROLS[] = {"input_ids", "query_start", "query_lengths", "block_table"};

bool isControl(std::string const& name)
{
    for (char const* control : kCONTROLS)
    {
        if (name == control)
        {
            return true;
        }
    }
    return false;
}

std::string presentOf(std::string const& past)
{
    return "present_" + past.substr(5);
}

//! One cache pool of a stage: one buffer when the engine writes it in place, else two that swap.
struct Pool
{
    std::string present;
    Shape shape;
    bool inPlace{false};
    DeviceBuffer buffers[2];
    int current{0};  //!< the buffer holding the cache now (fed as past_*)
};

//! A linked input read from another GPU: copied into this stage's buffer before each call.
struct Crossing
{
    Link const* link{nullptr};
    DeviceBuffer buffer;
};

struct StageGen
{
    StageRun* run{nullptr};
    std::unique_ptr<nvinfer1::IExecutionContext> decode;  //!< profile 1 (null: one profile)
    std::map<std::string, Pool> pools;                    //!< by past_* name
    std::map<std::string, DeviceBuffer> controls;         //!< input_ids, query_start, query_lengths, block_table
    std::map<std::string, DeviceBuffer> outputs;          //!< the other outputs, sized for the prefill
    std::map<std::string, Crossing> crossings;            //!< by input name
    std::vector<std::string> inputNames;
};

void require(bool ok, std::string const& message)
{
    if (!ok)
    {
        throw UserError(message);
    }
}

int64_t staticDim(TensorSpec const& spec, size_t axis)
{
    require(spec.shape.size() > axis && spec.shape[axis].name.empty() && spec.shape[axis].size > 0,
        "the cache pool '" + spec.name + "' has no static size on axis " + std::to_string(axis)
            + "; export the model again with --graph paged.");
    return spec.shape[axis].size;
}

int64_t profileMax(Stage const& stage, std::string const& dim, int64_t fallback)
{
    auto const it = stage.profile.find(dim);
    return it == stage.profile.end() ? fallback : it->second.max;
}

std::vector<int64_t> argmaxRows(std::vector<uint8_t> const& host, nvinfer1::DataType type, int64_t rows, int64_t vocab)
{
    std::vector<int64_t> chosen(static_cast<size_t>(rows), 0);
    for (int64_t b = 0; b < rows; ++b)
    {
        float best = -INFINITY;
        for (int64_t v = 0; v < vocab; ++v)
        {
            size_t const i = static_cast<size_t>(b * vocab + v);
            float x = 0.f;
            switch (type)
            {
            case nvinfer1::DataType::kFLOAT: x = reinterpret_cast<float const*>(host.data())[i]; break;
            case nvinfer1::DataType::kHALF: x = halfToFloat(reinterpret_cast<uint16_t const*>(host.data())[i]); break;
            case nvinfer1::DataType::kBF16: x = bf16ToFloat(reinterpret_cast<uint16_t const*>(host.data())[i]); break;
            default: throw UserError(std::string("the logits are ") + typeName(type) + ", which --generate does not read.");
            }
            if (x > best)  // ties to the lower id, as numpy's argmax
            {
                best = x;
                chosen[static_cast<size_t>(b)] = v;
            }
        }
    }
    return chosen;
}

//! Where one input of a call is bound: its buffer and its shape.
struct Binding
{
    void* address{nullptr};
    Shape shape;
};

//! One call of every stage: the prefill (profile 0) or a decode step (profile 1).
struct Call
{
    bool prefill;
    int64_t length;                     //!< new tokens per row
    std::vector<int32_t> starts;        //!< query_start per row
    std::vector<int32_t> counts;        //!< query_lengths per row
    std::vector<int64_t> const& ids;    //!< the call's input_ids, [B, length]
};

//! The execution context of ``gen`` for a prefill or a decode call (profile 0 when it has one profile).
nvinfer1::IExecutionContext& contextFor(StageGen const& gen, bool prefill)
{
    return (prefill || !gen.decode) ? *gen.run->context : *gen.decode;
}

//! Greedy generation over a paged build: checks the plan and the cache sizes, opens the stages,
//! allocates their pools once, then runs the prefill and the decode steps and prints the tokens.
class Generator : public PlanSession
{
public:
    explicit Generator(RunOptions const& options);

    //! The whole generation; 0 on success (UserError and runtime_error for the rest, as generatePlan).
    int run();

private:
    //! Every stage is a paged graph, the first takes input_ids and the last returns logits.
    void checkPaged() const;

    //! The batch, the prompt length, the page size and the cache pages L + N tokens per row need.
    void sizeCache();

    //! UserError when a stage's profile cannot hold the tokens, pages or batch of this generation.
    void checkProfiles() const;

    //! The prompt (--input input_ids=FILE, int64 [B, L], or random ids in the vocabulary) and the
    //! block table (row b owns pages 1 + b*M .. b*M + M).
    void makePrompt();

    //! Decode context, I/O names, cache pools and control buffers of one stage, once.
    void prepareStage(StageGen& gen);

    void allocatePools(StageGen& gen);

    void allocateControls(StageGen& gen);

    //! The prefill, then the decode steps, timed; prints the tokens and the tokens/s.
    void generate();

    //! One call of every stage; returns each row's arg max of the last stage's logits.
    std::vector<int64_t> step(Call const& call);

    void callStage(StageGen& gen, Call const& call);

    void bindInput(StageGen& gen, std::string const& name, Call const& call, nvinfer1::IExecutionContext& context);

    //! A linked input: read in place on the same GPU, else copied peer to peer into this stage's buffer.
    Binding linkedInput(StageGen& gen, std::string const& name, Link const& link, bool prefill);

    //! input_ids, block_table, query_start or query_length, uploaded for this call.
    Binding controlInput(StageGen& gen, std::string const& name, Call const& call);

    void bindOutputs(StageGen& gen, nvinfer1::IExecutionContext& context);

    //! An output other than a pool: its buffer, sized by the prefill (the largest call of the run).
    void* otherOutput(StageGen& gen, std::string const& name, nvinfer1::IExecutionContext& context);

    //! The last stage's logits, copied to the host, and each row's arg max.
    std::vector<int64_t> readChoices();

    void printResults(std::vector<std::vector<int64_t>> const& generated, double prefillMs,
        std::vector<double>& stepMs) const;

    int64_t mBatch{1};
    int64_t mPrompt{1};  //!< L: prompt tokens per row
    int64_t mSteps{0};   //!< N: tokens to generate per row
    int64_t mPage{0};    //!< tokens per cache page
    int64_t mBlocks{0};  //!< pages per row: ceil((L + N) / page)
    int64_t mPages{0};   //!< pages per pool: 1 + B * blocks
    std::vector<int64_t> mTokens; //!< the prompt, [B, L]
    std::vector<int32_t> mTable;  //!< block_table, [B, blocks]
    std::vector<StageGen> mGens;  //!< one per stage (released before the stages)
};

Generator::Generator(RunOptions const& options)
    : PlanSession(options)
{
}

int Generator::run()
{
    checkPaged();
    sizeCache();
    checkProfiles();
    loadStages();
    makePrompt();
    // Pools, decode contexts and control buffers, once.
    mGens.resize(mRuns.size());
    for (size_t k = 0; k < mRuns.size(); ++k)
    {
        mGens[k].run = mRuns[k].get();
        prepareStage(mGens[k]);
    }
    generate();
    return 0;
}

void Generator::checkPaged() const
{
    for (Stage const& stage : mPlan.stages)
    {
        bool const paged = stage.input("block_table") && stage.input("query_start") && stage.input("query_lengths");
        require(paged, stage.label + " is not a paged graph (no block_table / query_start / query_lengths input); "
            "--generate needs a paged build: `dsa-export build HF_DIR --stages N --graph paged`.");
    }
    for (Stage const& stage : mPlan.stages)
    {
        for (TensorSpec const& spec : stage.inputs)
        {
            require(isControl(spec.name) || isPool(spec.name) || mPlan.linkInto(stage.index, spec.name) != nullptr,
                stage.label + " takes the input '" + spec.name + "', which --generate does not feed (it feeds "
                    "input_ids, query_start, query_lengths, block_table, the past_*_pool_* caches and the links "
                    "between stages); rebuild the stages with `dsa-export build HF_DIR --stages N --graph paged`.");
        }
    }
    Stage const& first = mPlan.stages.front();
    require(first.input("input_ids") != nullptr, first.label + " takes no input_ids; --generate needs the first stage.");
    require(mPlan.stages.back().output("logits") != nullptr, "the last stage returns no logits; --generate needs them.");
}

void Generator::sizeCache()
{
    Stage const& first = mPlan.stages.front();
    Sizes const& dims = mOptions.dims;
    mBatch = dims.count("batch") ? dims.at("batch") : 1;
    auto const seq = first.profile.find("sequence");
    mPrompt = dims.count("sequence") ? dims.at("sequence") : (seq != first.profile.end() ? seq->second.opt : 16);
    mSteps = mOptions.generate;
    require(mBatch >= 1 && mPrompt >= 1, "--dim batch and --dim sequence (the prompt length) must be at least 1.");
    for (TensorSpec const& spec : first.inputs)
    {
        if (isPool(spec.name))
        {
            mPage = staticDim(spec, 1);
            break;
        }
    }
    require(mPage > 0, first.label + " has no cache pool input (past_*_pool_*); export it again with --graph paged.");
    mBlocks = (mPrompt + mSteps + mPage - 1) / mPage;
    mPages = 1 + mBatch * mBlocks;
}

void Generator::checkProfiles() const
{
    for (Stage const& stage : mPlan.stages)
    {
        int64_t const limit = profileMax(stage, "max_pages", mBlocks) * mPage;
        require(mBlocks * mPage <= limit, stage.label + " holds at most " + std::to_string(limit) + " tokens per sequence; "
            "a prompt of " + std::to_string(mPrompt) + " plus " + std::to_string(mSteps) + " new tokens needs "
            + std::to_string(mPrompt + mSteps) + " (build with a larger --max-seq, or ask for fewer).");
        require(mPages <= profileMax(stage, "pages", mPages), stage.label + "'s profile allows "
            + std::to_string(profileMax(stage, "pages", mPages)) + " cache pages; this batch needs "
            + std::to_string(mPages) + " (build with a larger --max-batch or --max-seq).");
        require(mBatch <= profileMax(stage, "batch", mBatch), stage.label + "'s profile allows a batch of at most "
            + std::to_string(profileMax(stage, "batch", mBatch)) + ".");
    }
}

void Generator::makePrompt()
{
    std::mt19937_64 rng(0);
    TensorSpec const& idsSpec = *mPlan.stages.front().input("input_ids");
    HostTensor const ids
        = makeInput(idsSpec, nvinfer1::DataType::kINT64, Shape{mBatch, mPrompt}, mOptions.inputFiles, rng);
    mTokens.resize(static_cast<size_t>(mBatch * mPrompt));
    std::memcpy(mTokens.data(), ids.bytes.data(), ids.bytes.size());
    mTable.resize(static_cast<size_t>(mBatch * mBlocks));
    for (int64_t b = 0; b < mBatch; ++b)
    {
        for (int64_t j = 0; j < mBlocks; ++j)
        {
            mTable[static_cast<size_t>(b * mBlocks + j)] = static_cast<int32_t>(1 + b * mBlocks + j);
        }
    }
}

void Generator::prepareStage(StageGen& gen)
{
    StageRun& run = *gen.run;
    Stage const& stage = *run.stage;
    nvinfer1::ICudaEngine& engine = *run.engine;
    checkCuda(cudaSetDevice(stage.device), "cudaSetDevice");
    if (engine.getNbOptimizationProfiles() > 1)
    {
        gen.decode.reset(engine.createExecutionContext());
        require(gen.decode && gen.decode->setOptimizationProfileAsync(1, run.stream),
            stage.label + ": cannot create the decode execution context on profile 1.");
    }
    gen.inputNames = listTensors(run);
    allocatePools(gen);
    allocateControls(gen);
}

void Generator::allocatePools(StageGen& gen)
{
    StageRun& run = *gen.run;
    Stage const& stage = *run.stage;
    nvinfer1::ICudaEngine& engine = *run.engine;
    for (std::string const& name : gen.inputNames)
    {
        if (!isPool(name))
        {
            continue;
        }
        TensorSpec const& spec = *stage.input(name);
        Pool& pool = gen.pools[name];
        pool.present = presentOf(name);
        pool.shape = Shape{mPages, mPage, staticDim(spec, 2)};
        require(std::find(run.outputs.begin(), run.outputs.end(), pool.present) != run.outputs.end(),
            stage.label + " returns no '" + pool.present + "' for its cache pool '" + name + "'.");
        char const* aliased = engine.getAliasedInputTensor(pool.present.c_str());
        pool.inPlace = aliased != nullptr && name == aliased;
        size_t const bytes
            = static_cast<size_t>(volume(pool.shape)) * elementSize(engine.getTensorDataType(name.c_str()));
        for (int copy = 0; copy < (pool.inPlace ? 1 : 2); ++copy)
        {
            pool.buffers[copy].allocate(stage.device, bytes);
            checkCuda(cudaMemset(pool.buffers[copy].ptr, 0, bytes), "cudaMemset");
        }
        std::cout << stage.label << " pool " << name << " " << toString(pool.shape) << ": " << bytes << " bytes on GPU "
                  << stage.device << (pool.inPlace ? ", written in place" : ", two buffers (the engine writes a new tensor)")
                  << "\n";
    }
}

void Generator::allocateControls(StageGen& gen)
{
    Stage const& stage = *gen.run->stage;
    for (char const* name : kCONTROLS)
    {
        if (stage.input(name) != nullptr && !mPlan.linkInto(stage.index, name))
        {
            size_t const count = std::string(name) == "input_ids" ? static_cast<size_t>(mBatch * mPrompt)
                : std::string(name) == "block_table"              ? static_cast<size_t>(mBatch * mBlocks)
                                                                  : static_cast<size_t>(mBatch);
            gen.controls[name].allocate(stage.device, count * elementSize(gen.run->engine->getTensorDataType(name)));
        }
    }
}

void Generator::generate()
{
    size_t const rows = static_cast<size_t>(mBatch);
    std::vector<std::vector<int64_t>> generated(rows);
    auto const began = std::chrono::steady_clock::now();
    std::vector<int64_t> chosen = step(Call{true, mPrompt, std::vector<int32_t>(rows, 0),
        std::vector<int32_t>(rows, static_cast<int32_t>(mPrompt)), mTokens});
    double const prefillMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
    std::vector<double> stepMs;
    for (int64_t i = 0; i < mSteps; ++i)
    {
        for (size_t b = 0; b < rows; ++b)
        {
            generated[b].push_back(chosen[b]);
        }
        if (i + 1 == mSteps)
        {
            break;
        }
        auto const t0 = std::chrono::steady_clock::now();
        chosen = step(Call{false, 1, std::vector<int32_t>(rows, static_cast<int32_t>(mPrompt + i)),
            std::vector<int32_t>(rows, 1), chosen});
        stepMs.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    printResults(generated, prefillMs, stepMs);
}

std::vector<int64_t> Generator::step(Call const& call)
{
    for (StageGen& gen : mGens)
    {
        callStage(gen, call);
    }
    mStreams.synchronize();
    return readChoices();
}

void Generator::callStage(StageGen& gen, Call const& call)
{
    StageRun& run = *gen.run;
    nvinfer1::IExecutionContext& context = contextFor(gen, call.prefill);
    checkCuda(cudaSetDevice(run.stage->device), "cudaSetDevice");
    for (std::string const& name : gen.inputNames)
    {
        bindInput(gen, name, call, context);
    }
    bindOutputs(gen, context);
    enqueue(run, context);
    for (auto& [name, pool] : gen.pools)
    {
        if (!pool.inPlace)
        {
            pool.current = 1 - pool.current;  // the written pool is the next call's past
        }
    }
}

void Generator::bindInput(StageGen& gen, std::string const& name, Call const& call, nvinfer1::IExecutionContext& context)
{
    StageRun& run = *gen.run;
    Stage const& stage = *run.stage;
    Link const* link = mPlan.linkInto(stage.index, name);
    Binding binding;
    if (link != nullptr)
    {
        binding = linkedInput(gen, name, *link, call.prefill);
    }
    else if (isPool(name))
    {
        Pool& pool = gen.pools.at(name);
        binding.shape = pool.shape;
        binding.address = pool.buffers[pool.current].ptr;
    }
    else
    {
        binding = controlInput(gen, name, call);
    }
    int const profile = (call.prefill || !gen.decode) ? 0 : 1;
    setInputShape(run, name, binding.shape, profile, &context);
    require(context.setTensorAddress(name.c_str(), binding.address),
        stage.label + ": setTensorAddress failed for '" + name + "'.");
}

Binding Generator::linkedInput(StageGen& gen, std::string const& name, Link const& link, bool prefill)
{
    StageRun& run = *gen.run;
    Stage const& stage = *run.stage;
    StageGen& source = mGens[static_cast<size_t>(link.from)];
    Binding binding;
    binding.shape = toShape(contextFor(source, prefill).getTensorShape(link.output.c_str()));
    DeviceBuffer& produced = source.outputs.at(link.output);
    if (source.run->stage->device == stage.device)
    {
        binding.address = produced.ptr;  // same GPU, same stream: read in place
        return binding;
    }
    Crossing& crossing = gen.crossings[name];
    if (crossing.buffer.ptr == nullptr)
    {
        crossing.buffer.allocate(stage.device, produced.bytes);
    }
    size_t const bytes
        = static_cast<size_t>(volume(binding.shape)) * elementSize(run.engine->getTensorDataType(name.c_str()));
    checkCuda(cudaStreamWaitEvent(run.stream, source.run->stop.event, 0), "cudaStreamWaitEvent");
    checkCuda(cudaMemcpyPeerAsync(
                  crossing.buffer.ptr, stage.device, produced.ptr, source.run->stage->device, bytes, run.stream),
        "cudaMemcpyPeerAsync");
    binding.address = crossing.buffer.ptr;
    return binding;
}

Binding Generator::controlInput(StageGen& gen, std::string const& name, Call const& call)
{
    Stage const& stage = *gen.run->stage;
    DeviceBuffer& buffer = gen.controls.at(name);
    Binding binding;
    void const* host = nullptr;
    size_t bytes = 0;
    if (name == "input_ids")
    {
        binding.shape = Shape{mBatch, call.length};
        host = call.ids.data();
        bytes = call.ids.size() * sizeof(int64_t);
        require(gen.run->engine->getTensorDataType("input_ids") == nvinfer1::DataType::kINT64,
            stage.label + ": input_ids is not int64.");
    }
    else if (name == "block_table")
    {
        binding.shape = Shape{mBatch, mBlocks};
        host = mTable.data();
        bytes = mTable.size() * sizeof(int32_t);
    }
    else
    {
        binding.shape = Shape{mBatch};
        host = name == "query_start" ? call.starts.data() : call.counts.data();
        bytes = static_cast<size_t>(mBatch) * sizeof(int32_t);
    }
    require(bytes <= buffer.bytes, stage.label + ": input '" + name + "' outgrew its buffer.");
    checkCuda(cudaMemcpy(buffer.ptr, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    binding.address = buffer.ptr;
    return binding;
}

void Generator::bindOutputs(StageGen& gen, nvinfer1::IExecutionContext& context)
{
    Stage const& stage = *gen.run->stage;
    for (std::string const& name : gen.run->outputs)
    {
        void* address = nullptr;
        auto pool = std::find_if(
            gen.pools.begin(), gen.pools.end(), [&](auto const& item) { return item.second.present == name; });
        if (pool != gen.pools.end())
        {
            Pool& p = pool->second;
            address = p.buffers[p.inPlace ? p.current : 1 - p.current].ptr;
        }
        else
        {
            address = otherOutput(gen, name, context);
        }
        require(context.setTensorAddress(name.c_str(), address),
            stage.label + ": setTensorAddress failed for '" + name + "'.");
    }
}

void* Generator::otherOutput(StageGen& gen, std::string const& name, nvinfer1::IExecutionContext& context)
{
    StageRun& run = *gen.run;
    Stage const& stage = *run.stage;
    Shape const shape = toShape(context.getTensorShape(name.c_str()));
    require(std::all_of(shape.begin(), shape.end(), [](int64_t d) { return d >= 0; }),
        stage.label + ": output '" + name + "' has the data-dependent shape " + toString(shape) + ".");
    size_t const bytes = static_cast<size_t>(volume(shape)) * elementSize(run.engine->getTensorDataType(name.c_str()));
    DeviceBuffer& buffer = gen.outputs[name];
    if (buffer.ptr == nullptr)
    {
        buffer.allocate(stage.device, bytes);  // the prefill's: the largest of the run
    }
    require(bytes <= buffer.bytes, stage.label + ": output '" + name + "' outgrew the prefill's buffer.");
    run.shapes[name] = shape;
    return buffer.ptr;
}

std::vector<int64_t> Generator::readChoices()
{
    StageGen& last = mGens.back();
    nvinfer1::DataType const type = last.run->engine->getTensorDataType("logits");
    Shape const shape = last.run->shapes.at("logits");
    require(shape.size() == 2 && shape[0] == mBatch, "the logits are " + toString(shape) + ", not [batch, vocab]; "
        "export the model again with --graph paged.");
    std::vector<uint8_t> host(static_cast<size_t>(volume(shape)) * elementSize(type));
    checkCuda(cudaSetDevice(last.run->stage->device), "cudaSetDevice");
    checkCuda(cudaMemcpy(host.data(), last.outputs.at("logits").ptr, host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return argmaxRows(host, type, mBatch, shape[1]);
}

void Generator::printResults(std::vector<std::vector<int64_t>> const& generated, double prefillMs,
    std::vector<double>& stepMs) const
{
    for (size_t b = 0; b < generated.size(); ++b)
    {
        std::cout << "row " << b << ":";
        for (int64_t t : generated[b])
        {
            std::cout << " " << t;
        }
        std::cout << "\n";
    }
    std::cout << std::fixed << std::setprecision(3) << "prefill: " << mBatch * mPrompt << " tokens in " << prefillMs
              << " ms (" << 1e3 * static_cast<double>(mBatch * mPrompt) / prefillMs << " tokens/s)\n";
    if (!stepMs.empty())
    {
        std::sort(stepMs.begin(), stepMs.end());
        double const median = stepMs[stepMs.size() / 2];
        std::cout << "decode: " << stepMs.size() << " steps, median " << median << " ms per step ("
                  << 1e3 * static_cast<double>(mBatch) / median << " tokens/s)\n";
    }
}

} // namespace

int generatePlan(RunOptions const& options)
{
    Generator generator(options);
    return generator.run();
}

} // namespace dsa
