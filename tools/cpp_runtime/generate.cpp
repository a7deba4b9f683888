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

} // namespace

int generatePlan(RunOptions const& options)
{
    Plan const plan = readPlan(options.path, planOptions(options));
    for (Stage const& stage : plan.stages)
    {
        bool const paged = stage.input("block_table") && stage.input("query_start") && stage.input("query_lengths");
        require(paged, stage.label + " is not a paged graph (no block_table / query_start / query_lengths input); "
            "--generate needs a paged build: `dsa-export build HF_DIR --stages N --graph paged`.");
    }
    Stage const& first = plan.stages.front();
    require(first.input("input_ids") != nullptr, first.label + " takes no input_ids; --generate needs the first stage.");
    require(plan.stages.back().output("logits") != nullptr, "the last stage returns no logits; --generate needs them.");

    int64_t const batch = options.dims.count("batch") ? options.dims.at("batch") : 1;
    auto const seq = first.profile.find("sequence");
    int64_t const prompt = options.dims.count("sequence") ? options.dims.at("sequence")
        : (seq != first.profile.end() ? seq->second.opt : 16);
    int64_t const steps = options.generate;
    require(batch >= 1 && prompt >= 1, "--dim batch and --dim sequence (the prompt length) must be at least 1.");
    int64_t page = 0;
    for (TensorSpec const& spec : first.inputs)
    {
        if (isPool(spec.name))
        {
            page = staticDim(spec, 1);
            break;
        }
    }
    require(page > 0, first.label + " has no cache pool input (past_*_pool_*); export it again with --graph paged.");
    int64_t const blocks = (prompt + steps + page - 1) / page;
    int64_t const pages = 1 + batch * blocks;
    for (Stage const& stage : plan.stages)
    {
        int64_t const limit = profileMax(stage, "max_pages", blocks) * page;
        require(blocks * page <= limit, stage.label + " holds at most " + std::to_string(limit) + " tokens per sequence; "
            "a prompt of " + std::to_string(prompt) + " plus " + std::to_string(steps) + " new tokens needs "
            + std::to_string(prompt + steps) + " (build with a larger --max-seq, or ask for fewer).");
        require(pages <= profileMax(stage, "pages", pages), stage.label + "'s profile allows "
            + std::to_string(profileMax(stage, "pages", pages)) + " cache pages; this batch needs "
            + std::to_string(pages) + " (build with a larger --max-batch or --max-seq).");
        require(batch <= profileMax(stage, "batch", batch), stage.label + "'s profile allows a batch of at most "
            + std::to_string(profileMax(stage, "batch", batch)) + ".");
    }
    checkStagesLoadable(plan);

    Logger logger;
    Streams streams;
    std::vector<std::unique_ptr<StageRun>> runs = openStages(plan, options, logger, streams);

    // The prompt: --input input_ids=FILE (int64 [B, L]) or random ids in the vocabulary.
    std::mt19937_64 rng(0);
    TensorSpec const& idsSpec = *first.input("input_ids");
    HostTensor const ids = makeInput(idsSpec, nvinfer1::DataType::kINT64, Shape{batch, prompt}, options.inputFiles, rng);
    std::vector<int64_t> tokens(static_cast<size_t>(batch * prompt));
    std::memcpy(tokens.data(), ids.bytes.data(), ids.bytes.size());
    std::vector<int32_t> table(static_cast<size_t>(batch * blocks));
    for (int64_t b = 0; b < batch; ++b)
    {
        for (int64_t j = 0; j < blocks; ++j)
        {
            table[static_cast<size_t>(b * blocks + j)] = static_cast<int32_t>(1 + b * blocks + j);
        }
    }

    // Pools, decode contexts and control buffers, once.
    std::vector<StageGen> gens(runs.size());
    for (size_t k = 0; k < runs.size(); ++k)
    {
        StageGen& gen = gens[k];
        gen.run = runs[k].get();
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
        for (int32_t i = 0; i < engine.getNbIOTensors(); ++i)
        {
            std::string const name = engine.getIOTensorName(i);
            if (engine.getTensorIOMode(name.c_str()) == nvinfer1::TensorIOMode::kINPUT)
            {
                gen.inputNames.push_back(name);
                require(stage.input(name) != nullptr, stage.label + ": the engine has the input '" + name + "', which "
                    + stage.manifestPath + " does not list; rebuild the stage with `dsa-export build`.");
            }
            else
            {
                run.outputs.push_back(name);
            }
        }
        for (std::string const& name : gen.inputNames)
        {
            if (!isPool(name))
            {
                continue;
            }
            TensorSpec const& spec = *stage.input(name);
            Pool& pool = gen.pools[name];
            pool.present = presentOf(name);
            pool.shape = Shape{pages, page, staticDim(spec, 2)};
            require(std::find(run.outputs.begin(), run.outputs.end(), pool.present) != run.outputs.end(),
                stage.label + " returns no '" + pool.present + "' for its cache pool '" + name + "'.");
            char const* aliased = engine.getAliasedInputTensor(pool.present.c_str());
            pool.inPlace = aliased != nullptr && name == aliased;
            size_t const bytes = static_cast<size_t>(volume(pool.shape)) * elementSize(engine.getTensorDataType(name.c_str()));
            for (int copy = 0; copy < (pool.inPlace ? 1 : 2); ++copy)
            {
                pool.buffers[copy].allocate(stage.device, bytes);
                checkCuda(cudaMemset(pool.buffers[copy].ptr, 0, bytes), "cudaMemset");
            }
            std::cout << stage.label << " pool " << name << " " << toString(pool.shape) << ": " << bytes << " bytes on GPU "
                      << stage.device << (pool.inPlace ? ", written in place" : ", two buffers (the engine writes a new tensor)")
                      << "\n";
        }
        for (char const* name : {"input_ids", "query_start", "query_lengths", "block_table"})
        {
            if (stage.input(name) != nullptr && !plan.linkInto(stage.index, name))
            {
                size_t const count = std::string(name) == "input_ids" ? static_cast<size_t>(batch * prompt)
                    : std::string(name) == "block_table" ? static_cast<size_t>(batch * blocks) : static_cast<size_t>(batch);
                gen.controls[name].allocate(stage.device, count * elementSize(engine.getTensorDataType(name)));
            }
        }
    }

    // One call of every stage: ``prefill`` (profile 0) or a decode step (profile 1).
    auto step = [&](bool prefill, int64_t length, std::vector<int32_t> const& starts, std::vector<int32_t> const& counts,
                    std::vector<int64_t> const& stepIds) -> std::vector<int64_t> {
        for (StageGen& gen : gens)
        {
            StageRun& run = *gen.run;
            Stage const& stage = *run.stage;
            nvinfer1::ICudaEngine& engine = *run.engine;
            nvinfer1::IExecutionContext* context = (prefill || !gen.decode) ? run.context.get() : gen.decode.get();
            int const profile = (prefill || !gen.decode) ? 0 : 1;
            checkCuda(cudaSetDevice(stage.device), "cudaSetDevice");
            for (std::string const& name : gen.inputNames)
            {
                Link const* link = plan.linkInto(stage.index, name);
                void* address = nullptr;
                Shape shape;
                if (link != nullptr)
                {
                    StageGen& source = gens[static_cast<size_t>(link->from)];
                    nvinfer1::IExecutionContext* sourceContext = (prefill || !source.decode) ? source.run->context.get()
                                                                                              : source.decode.get();
                    shape = toShape(sourceContext->getTensorShape(link->output.c_str()));
                    DeviceBuffer& produced = source.outputs.at(link->output);
                    if (source.run->stage->device == stage.device)
                    {
                        address = produced.ptr;  // same GPU, same stream: read in place
                    }
                    else
                    {
                        Crossing& crossing = gen.crossings[name];
                        if (crossing.buffer.ptr == nullptr)
                        {
                            crossing.buffer.allocate(stage.device, produced.bytes);
                        }
                        size_t const bytes = static_cast<size_t>(volume(shape)) * elementSize(engine.getTensorDataType(name.c_str()));
                        checkCuda(cudaStreamWaitEvent(run.stream, source.run->stop.event, 0), "cudaStreamWaitEvent");
                        checkCuda(cudaMemcpyPeerAsync(crossing.buffer.ptr, stage.device, produced.ptr,
                                      source.run->stage->device, bytes, run.stream), "cudaMemcpyPeerAsync");
                        address = crossing.buffer.ptr;
                    }
                }
                else if (isPool(name))
                {
                    Pool& pool = gen.pools.at(name);
                    shape = pool.shape;
                    address = pool.buffers[pool.current].ptr;
                }
                else
                {
                    DeviceBuffer& buffer = gen.controls.at(name);
                    void const* host = nullptr;
                    size_t bytes = 0;
                    if (name == "input_ids")
                    {
                        shape = Shape{batch, length};
                        host = stepIds.data();
                        bytes = stepIds.size() * sizeof(int64_t);
                        require(engine.getTensorDataType("input_ids") == nvinfer1::DataType::kINT64,
                            stage.label + ": input_ids is not int64.");
                    }
                    else if (name == "block_table")
                    {
                        shape = Shape{batch, blocks};
                        host = table.data();
                        bytes = table.size() * sizeof(int32_t);
                    }
                    else
                    {
                        shape = Shape{batch};
                        host = name == "query_start" ? starts.data() : counts.data();
                        bytes = static_cast<size_t>(batch) * sizeof(int32_t);
                    }
                    require(bytes <= buffer.bytes, stage.label + ": input '" + name + "' outgrew its buffer.");
                    checkCuda(cudaMemcpy(buffer.ptr, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
                    address = buffer.ptr;
                }
                setInputShape(run, name, shape, profile, context);
                require(context->setTensorAddress(name.c_str(), address), stage.label + ": setTensorAddress failed for '" + name + "'.");
            }
            for (std::string const& name : run.outputs)
            {
                void* address = nullptr;
                auto pool = std::find_if(gen.pools.begin(), gen.pools.end(),
                    [&](auto const& item) { return item.second.present == name; });
                if (pool != gen.pools.end())
                {
                    Pool& p = pool->second;
                    address = p.buffers[p.inPlace ? p.current : 1 - p.current].ptr;
                }
                else
                {
                    Shape const shape = toShape(context->getTensorShape(name.c_str()));
                    require(std::all_of(shape.begin(), shape.end(), [](int64_t d) { return d >= 0; }),
                        stage.label + ": output '" + name + "' has the data-dependent shape " + toString(shape) + ".");
                    size_t const bytes = static_cast<size_t>(volume(shape)) * elementSize(engine.getTensorDataType(name.c_str()));
                    DeviceBuffer& buffer = gen.outputs[name];
                    if (buffer.ptr == nullptr)
                    {
                        buffer.allocate(stage.device, bytes);  // the prefill's: the largest of the run
                    }
                    require(bytes <= buffer.bytes, stage.label + ": output '" + name + "' outgrew the prefill's buffer.");
                    address = buffer.ptr;
                    run.shapes[name] = shape;
                }
                require(context->setTensorAddress(name.c_str(), address), stage.label + ": setTensorAddress failed for '" + name + "'.");
            }
            checkCuda(cudaEventRecord(run.start.event, run.stream), "cudaEventRecord");
            if (!context->enqueueV3(run.stream))
            {
                throw std::runtime_error(stage.label + ": enqueueV3 failed (see the TensorRT messages above)");
            }
            checkCuda(cudaEventRecord(run.stop.event, run.stream), "cudaEventRecord");
            for (auto& [name, pool] : gen.pools)
            {
                if (!pool.inPlace)
                {
                    pool.current = 1 - pool.current;  // the written pool is the next call's past
                }
            }
        }
        streams.synchronize();
        StageGen& last = gens.back();
        nvinfer1::DataType const type = last.run->engine->getTensorDataType("logits");
        Shape const shape = last.run->shapes.at("logits");
        require(shape.size() == 2 && shape[0] == batch, "the logits are " + toString(shape) + ", not [batch, vocab]; "
            "export the model again with --graph paged.");
        std::vector<uint8_t> host(static_cast<size_t>(volume(shape)) * elementSize(type));
        checkCuda(cudaSetDevice(last.run->stage->device), "cudaSetDevice");
        checkCuda(cudaMemcpy(host.data(), last.outputs.at("logits").ptr, host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
        return argmaxRows(host, type, batch, shape[1]);
    };

    std::vector<std::vector<int64_t>> generated(static_cast<size_t>(batch));
    auto const began = std::chrono::steady_clock::now();
    std::vector<int64_t> chosen = step(true, prompt, std::vector<int32_t>(static_cast<size_t>(batch), 0),
        std::vector<int32_t>(static_cast<size_t>(batch), static_cast<int32_t>(prompt)), tokens);
    double const prefillMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
    std::vector<double> stepMs;
    for (int64_t i = 0; i < steps; ++i)
    {
        for (int64_t b = 0; b < batch; ++b)
        {
            generated[static_cast<size_t>(b)].push_back(chosen[static_cast<size_t>(b)]);
        }
        if (i + 1 == steps)
        {
            break;
        }
        auto const t0 = std::chrono::steady_clock::now();
        chosen = step(false, 1, std::vector<int32_t>(static_cast<size_t>(batch), static_cast<int32_t>(prompt + i)),
            std::vector<int32_t>(static_cast<size_t>(batch), 1), chosen);
        stepMs.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    for (int64_t b = 0; b < batch; ++b)
    {
        std::cout << "row " << b << ":";
        for (int64_t t : generated[static_cast<size_t>(b)])
        {
            std::cout << " " << t;
        }
        std::cout << "\n";
    }
    std::cout << std::fixed << std::setprecision(3) << "prefill: " << batch * prompt << " tokens in " << prefillMs
              << " ms (" << 1e3 * static_cast<double>(batch * prompt) / prefillMs << " tokens/s)\n";
    if (!stepMs.empty())
    {
        std::sort(stepMs.begin(), stepMs.end());
        double const median = stepMs[stepMs.size() / 2];
        std::cout << "decode: " << stepMs.size() << " steps, median " << median << " ms per step ("
                  << 1e3 * static_cast<double>(batch) / median << " tokens/s)\n";
    }
    return 0;
}

} // namespace dsa
