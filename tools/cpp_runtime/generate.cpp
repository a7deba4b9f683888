// dsa_runtime PATH --generate N: generation over a paged build (`dsa-export build HF_DIR
// --stages K --graph paged`, or one paged build folder), a demo of the runtime library
// (include/dsa_runtime.h): B prompts of L ids (--dim batch=B, --dim sequence=L; --input
// input_ids=FILE, int64 [B, L], or random ids below the input's value_range), one prefill, N - 1
// decode steps, then each row's tokens and the prefill and decode tokens/s. Greedy, or sampled on
// the device with --temperature, --top-p and --seed (row b draws with seed + b).

#include "dsa_runtime.h"
#include "pipeline.h"
#include "runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <random>
#include <stdexcept>

namespace dsa
{

namespace
{

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point began)
{
    return std::chrono::duration<double, std::milli>(Clock::now() - began).count();
}

//! The prompt, [B, L]: --input input_ids=FILE (raw int64) or random ids in the input's value_range.
std::vector<int64_t> makePrompt(RunOptions const& options, TensorSpec const& spec, int64_t batch, int64_t length)
{
    size_t const count = static_cast<size_t>(batch * length);
    std::vector<int64_t> ids(count);
    auto const file = options.inputFiles.find("input_ids");
    if (file != options.inputFiles.end())
    {
        std::string const data = readText(file->second);
        if (data.size() != count * sizeof(int64_t))
        {
            throw UserError("--input input_ids=" + file->second + " holds " + std::to_string(data.size())
                + " bytes but the prompt is int64 [" + std::to_string(batch) + ", " + std::to_string(length) + "] ("
                + std::to_string(count * sizeof(int64_t)) + " bytes); write it as raw little-endian values of that shape.");
        }
        std::memcpy(ids.data(), data.data(), data.size());
        return ids;
    }
    std::mt19937_64 rng(0);
    std::uniform_int_distribution<int64_t> pick(spec.hasValueRange ? spec.low : 0, (spec.hasValueRange ? spec.high : 2) - 1);
    std::generate(ids.begin(), ids.end(), [&]() { return pick(rng); });
    return ids;
}

void printResults(std::vector<std::vector<int64_t>> const& generated, int64_t promptTokens, double prefillMs,
    std::vector<double>& stepMs, int64_t batch)
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
    std::cout << std::fixed << std::setprecision(3) << "prefill: " << promptTokens << " tokens in " << prefillMs
              << " ms (" << 1e3 * static_cast<double>(promptTokens) / prefillMs << " tokens/s)\n";
    if (!stepMs.empty())
    {
        std::sort(stepMs.begin(), stepMs.end());
        double const median = stepMs[stepMs.size() / 2];
        std::cout << "decode: " << stepMs.size() << " steps, median " << median << " ms per step ("
                  << 1e3 * static_cast<double>(batch) / median << " tokens/s)\n";
    }
}

} // namespace

namespace
{

int generateWith(RunOptions const& options)
{
    // The prompt's size and ids come from the plan (host only); the runtime checks the rest.
    Plan const plan = readPlan(options.path, PlanOptions{1 << 16, options.device});
    Stage const& first = plan.stages.front();
    auto const seq = first.profile.find("sequence");
    int64_t const batch = options.dims.count("batch") ? options.dims.at("batch") : 1;
    int64_t const length = options.dims.count("sequence") ? options.dims.at("sequence")
                                                          : (seq != first.profile.end() ? seq->second.opt : 16);
    if (batch < 1 || length < 1)
    {
        throw UserError("--dim batch and --dim sequence (the prompt length) must be at least 1.");
    }
    RuntimeOptions runtimeOptions;
    runtimeOptions.plugins = options.plugins;
    runtimeOptions.device = options.device;
    runtimeOptions.slots = static_cast<int>(batch);
    runtimeOptions.maxTokens = length + options.generate;
    runtimeOptions.kernels = options.kernels;
    runtimeOptions.prefillChunk = options.prefillChunk;
    Runtime runtime(options.path, runtimeOptions);
    for (std::string const& note : runtime.info().notes)
    {
        std::cout << note << "\n";
    }
    TensorSpec const* idsSpec = first.input("input_ids");
    std::vector<int64_t> const prompt = makePrompt(options, idsSpec ? *idsSpec : TensorSpec{}, batch, length);
    auto const began = Clock::now();
    std::vector<SamplingParams> sampling(static_cast<size_t>(batch));
    for (size_t b = 0; b < sampling.size(); ++b)
    {
        sampling[b].temperature = options.temperature;
        sampling[b].topP = options.topP;
        sampling[b].seed = options.seed + b;
    }
    std::vector<int> const slots
        = runtime.prefill(prompt, std::vector<int64_t>(static_cast<size_t>(batch), length), sampling);
    double const prefillMs = msSince(began);
    std::vector<std::vector<int64_t>> generated(slots.size());
    std::vector<double> stepMs;
    for (int i = 0; i < options.generate; ++i)
    {
        if (i > 0)
        {
            auto const t0 = Clock::now();
            runtime.decode();
            stepMs.push_back(msSince(t0));
        }
        for (size_t b = 0; b < slots.size(); ++b)
        {
            generated[b].push_back(runtime.token(slots[b]));
        }
    }
    printResults(generated, batch * length, prefillMs, stepMs, batch);
    return 0;
}

} // namespace

int generatePlan(RunOptions const& options)
{
    try
    {
        return generateWith(options);
    }
    catch (std::invalid_argument const& e)  // the library's argument errors are the user's here: exit 1
    {
        throw UserError(e.what());
    }
}

} // namespace dsa
