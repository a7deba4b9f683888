// The runtime library (include/dsa_runtime.h): the scheduler (slots, pages, the calls' inputs;
// host only) over the paged engine (the stages on their GPUs), and the C interface.

#include "dsa_runtime.h"

#include "paged_engine.h"
#include "runner.h"
#include "scheduler.h"

#include <algorithm>
#include <exception>
#include <map>
#include <stdexcept>
#include <utility>

namespace dsa
{

namespace
{

RunOptions runOptions(std::string const& path, RuntimeOptions const& options)
{
    RunOptions run;
    run.path = path;
    run.plugins = options.plugins;
    run.device = options.device;
    run.kernels = options.kernels;
    return run;
}

PagedRequest pagedRequest(RuntimeOptions const& options)
{
    PagedRequest request;
    request.slots = options.slots;
    request.maxTokens = options.maxTokens;
    request.pages = options.pages;
    return request;
}

} // namespace

class Runtime::Impl
{
public:
    Impl(std::string const& path, RuntimeOptions const& options)
        : mOptions(runOptions(path, options))
        , mEngine(mOptions, pagedRequest(options), options.cudaGraphs)
        , mScheduler(mEngine.limits())
        , mKeepLogits(options.keepLogits)
        , mPrefillChunk(options.prefillChunk)
        , mStepTokens(options.stepTokens)
    {
        SchedulerLimits const& limits = mEngine.limits();
        mInfo.stages = mEngine.stages();
        mInfo.slots = limits.slots;
        mInfo.prefillBatch = limits.prefillBatch;
        mInfo.page = limits.page;
        mInfo.pages = limits.pages;
        mInfo.maxTokens = limits.maxTokens;
        mInfo.maxPrompt = limits.maxPrompt;
        mInfo.vocab = limits.vocab;
        mInfo.notes = mEngine.notes();
    }

    std::vector<int> submit(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths,
        std::vector<SamplingParams> const& sampling)
    {
        checkPromptSampling(lengths, sampling);
        std::vector<int> const slots = mScheduler.enqueue(ids, lengths);
        startSampling(slots, sampling);
        return slots;
    }

    std::vector<int> step()
    {
        CallInputs const call = mScheduler.stepCall(mPrefillChunk, mStepTokens);
        try
        {
            mEngine.run(call, samplingRows(call.slots, mSampling), mKeepLogits);
        }
        catch (...)
        {
            // The prompts this call fed are left half in the caches: their sequences end here.
            for (size_t row = 0; call.prefill && row < call.slots.size(); ++row)
            {
                int const slot = call.slots[row];
                if (slot >= 0 && mScheduler.next(slot) < 0)
                {
                    release(slot);
                }
            }
            throw;
        }
        finish(call);
        std::vector<int> slots;
        for (size_t row = 0; row < call.slots.size(); ++row)
        {
            if (call.slots[row] >= 0 && call.sampled[row] != 0)
            {
                slots.push_back(call.slots[row]);
            }
        }
        return slots;
    }

    std::vector<int> prefill(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths,
        std::vector<SamplingParams> const& sampling)
    {
        checkPromptSampling(lengths, sampling);
        std::vector<CallInputs> const calls = mScheduler.admit(ids, lengths, mPrefillChunk);
        CallInputs const& first = calls.front();  // every prompt has a row with tokens in the first call
        startSampling(first.slots, sampling);
        try
        {
            for (CallInputs const& call : calls)  // chunks of long prompts, in order
            {
                mEngine.run(call, samplingRows(call.slots, mSampling), mKeepLogits);
                finish(call);
            }
        }
        catch (...)
        {
            for (int slot : first.slots)
            {
                mSampling.erase(slot);
                mLogits.erase(slot);
            }
            mScheduler.abandon(first);
            throw;
        }
        return first.slots;
    }

    void setChunking(int64_t prefillChunk, int64_t stepTokens)
    {
        if (prefillChunk < 0 || stepTokens < 0)
        {
            throw std::invalid_argument("the prefill chunk and the step's token budget must be 0 (the default) or "
                "more tokens; got " + std::to_string(prefillChunk) + " and " + std::to_string(stepTokens) + ".");
        }
        mPrefillChunk = prefillChunk;
        mStepTokens = stepTokens;
    }

    void setSampling(int slot, SamplingParams const& params)
    {
        if (!mScheduler.live(slot))
        {
            throw std::invalid_argument("slot " + std::to_string(slot) + " holds no sequence.");
        }
        checkSampling(params.temperature, params.topP);
        if (params.temperature > 0.F && !mEngine.deviceSampling())
        {
            throw UserError("sampling (a temperature above 0) needs the device sampler of libdsa_kernels.so.");
        }
        SlotSampling& state = mSampling[slot];
        state.temperature = params.temperature;
        state.topP = params.topP;
        state.seed = params.seed;
    }

    std::vector<int> decode()
    {
        CallInputs const call = mScheduler.decodeCall();
        mEngine.run(call, samplingRows(call.slots, mSampling), mKeepLogits);
        finish(call);
        std::vector<int> slots;
        for (size_t row = 0; row < call.slots.size(); ++row)
        {
            if (call.counts[row] > 0)
            {
                slots.push_back(call.slots[row]);
            }
        }
        return slots;
    }

    void release(int slot)
    {
        mScheduler.release(slot);
        mLogits.erase(slot);
        mSampling.erase(slot);
    }

    std::vector<float> logits(int slot) const
    {
        if (!mKeepLogits)
        {
            throw std::invalid_argument("logits are kept only when the runtime is opened with keepLogits.");
        }
        auto const it = mLogits.find(slot);
        if (it == mLogits.end())
        {
            throw std::invalid_argument("slot " + std::to_string(slot) + " has no logits; prefill a prompt into it first.");
        }
        return it->second;
    }

    Scheduler const& scheduler() const { return mScheduler; }
    RuntimeInfo const& info() const { return mInfo; }
    bool graphsActive() const { return mEngine.graphsActive(); }
    bool deviceSampling() const { return mEngine.deviceSampling(); }

private:
    //! One sampling setting per prompt (or none), each valid, and a device sampler for any temperature.
    void checkPromptSampling(std::vector<int64_t> const& lengths, std::vector<SamplingParams> const& sampling) const
    {
        if (!sampling.empty() && sampling.size() != lengths.size())
        {
            throw std::invalid_argument("the prompts take one sampling setting each (or none); got "
                + std::to_string(sampling.size()) + " for " + std::to_string(lengths.size()) + " prompts.");
        }
        bool sampled = false;
        for (SamplingParams const& params : sampling)
        {
            checkSampling(params.temperature, params.topP);
            sampled = sampled || params.temperature > 0.F;
        }
        if (sampled && !mEngine.deviceSampling())
        {
            throw UserError("sampling (a temperature above 0) needs the device sampler of libdsa_kernels.so; pass its "
                            "path (RuntimeOptions::kernels or $DSA_EXPORT_KERNELS_LIB) or build it with `dsa-export "
                            "plugins build`.");
        }
    }

    //! Prompt i's settings (greedy when ``sampling`` is empty) go to ``slots[i]``, its draws from 0.
    void startSampling(std::vector<int> const& slots, std::vector<SamplingParams> const& sampling)
    {
        for (size_t row = 0; row < slots.size(); ++row)
        {
            SlotSampling& slot = mSampling[slots[row]];
            slot = SlotSampling();
            if (!sampling.empty())
            {
                slot.temperature = sampling[row].temperature;
                slot.topP = sampling[row].topP;
                slot.seed = sampling[row].seed;
            }
        }
    }

    //! The call ran: each sampled row's token (and logits, when kept) go to its slot, whose draws count on.
    void finish(CallInputs const& call)
    {
        int64_t const vocab = mEngine.vocab();
        std::vector<int64_t> const& chosen = mEngine.tokens();
        for (size_t row = 0; row < call.slots.size(); ++row)
        {
            if (call.slots[row] >= 0 && call.sampled[row] != 0)
            {
                mSampling[call.slots[row]].step += 1;
            }
        }
        for (size_t row = 0; mKeepLogits && row < call.slots.size(); ++row)
        {
            if (call.slots[row] >= 0 && call.sampled[row] != 0)
            {
                mLogits[call.slots[row]] = logitRow(mEngine.logits(), mEngine.logitType(), int64_t(row), vocab);
            }
        }
        mScheduler.commit(call, chosen);
        mInfo.vocab = vocab;
        mInfo.notes = mEngine.notes();
    }

    RunOptions mOptions;  //!< outlives the engine, which keeps a reference
    PagedEngine mEngine;
    Scheduler mScheduler;
    bool mKeepLogits;
    int64_t mPrefillChunk;  //!< tokens per row of a prefill call (0: the prefill profile's max)
    int64_t mStepTokens;    //!< rows x tokens per row of a step() call (0: no limit)
    RuntimeInfo mInfo;
    std::map<int, std::vector<float>> mLogits;
    std::map<int, SlotSampling> mSampling;  //!< each live slot's settings and chosen-token count
};

Runtime::Runtime(std::string const& path, RuntimeOptions const& options)
    : mImpl(std::make_unique<Impl>(path, options))
{
}

Runtime::~Runtime() = default;
Runtime::Runtime(Runtime&&) noexcept = default;
Runtime& Runtime::operator=(Runtime&&) noexcept = default;

std::vector<int> Runtime::submit(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths,
    std::vector<SamplingParams> const& sampling)
{
    return mImpl->submit(ids, lengths, sampling);
}

std::vector<int> Runtime::step()
{
    return mImpl->step();
}

std::vector<int> Runtime::prefill(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths)
{
    return mImpl->prefill(ids, lengths, {});
}

std::vector<int> Runtime::prefill(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths,
    std::vector<SamplingParams> const& sampling)
{
    return mImpl->prefill(ids, lengths, sampling);
}

void Runtime::setSampling(int slot, SamplingParams const& sampling)
{
    mImpl->setSampling(slot, sampling);
}

void Runtime::setChunking(int64_t prefillChunk, int64_t stepTokens)
{
    mImpl->setChunking(prefillChunk, stepTokens);
}

bool Runtime::deviceSampling() const
{
    return mImpl->deviceSampling();
}

std::vector<int> Runtime::decode()
{
    return mImpl->decode();
}

void Runtime::release(int slot)
{
    mImpl->release(slot);
}

int64_t Runtime::token(int slot) const
{
    if (!mImpl->scheduler().live(slot))
    {
        throw std::invalid_argument("slot " + std::to_string(slot) + " holds no sequence.");
    }
    return mImpl->scheduler().next(slot);
}

std::vector<float> Runtime::logits(int slot) const
{
    return mImpl->logits(slot);
}

int64_t Runtime::length(int slot) const
{
    return mImpl->scheduler().cached(slot);
}

std::vector<int> Runtime::liveSlots() const
{
    return mImpl->scheduler().liveSlots();
}

RuntimeInfo const& Runtime::info() const
{
    return mImpl->info();
}

bool Runtime::graphsActive() const
{
    return mImpl->graphsActive();
}

} // namespace dsa

// -- the C interface ------------------------------------------------------------------------------

struct dsa_runtime
{
    std::unique_ptr<dsa::Runtime> runtime;
    std::string error;
};

namespace
{

thread_local std::string gOpenError;

//! Run ``body``; -1 with the exception's sentence kept in ``handle`` when it throws.
template <typename Body>
int guarded(dsa_runtime* handle, Body&& body)
{
    if (handle == nullptr)
    {
        gOpenError = "the runtime handle is null.";
        return -1;
    }
    try
    {
        body(*handle->runtime);
        handle->error.clear();
        return 0;
    }
    catch (std::exception const& e)
    {
        handle->error = e.what();
        return -1;
    }
}

} // namespace

extern "C" {

dsa_runtime* dsa_runtime_open(char const* path, int slots, char const* plugins)
{
    try
    {
        dsa::RuntimeOptions options;
        options.slots = slots;
        options.plugins = plugins != nullptr ? plugins : "";
        auto handle = std::make_unique<dsa_runtime>();
        handle->runtime = std::make_unique<dsa::Runtime>(path != nullptr ? path : "", options);
        gOpenError.clear();
        return handle.release();
    }
    catch (std::exception const& e)
    {
        gOpenError = e.what();
        return nullptr;
    }
}

void dsa_runtime_close(dsa_runtime* runtime)
{
    delete runtime;
}

namespace
{
//! ``count`` prompts of a C call as (ids, lengths); ``what`` names the function in the error.
std::pair<std::vector<int64_t>, std::vector<int64_t>> cPrompts(
    char const* what, int64_t const* ids, int64_t const* lengths, int count, int const* slots)
{
    if (count < 0 || ids == nullptr || lengths == nullptr || slots == nullptr)
    {
        throw std::invalid_argument(std::string(what) + " needs ids, lengths, slots and a count of at least 0.");
    }
    std::vector<int64_t> sizes(lengths, lengths + count);
    int64_t total = 0;
    for (int64_t size : sizes)
    {
        total += size > 0 ? size : 0;
    }
    return {std::vector<int64_t>(ids, ids + total), std::move(sizes)};
}
} // namespace

int dsa_runtime_prefill(dsa_runtime* runtime, int64_t const* ids, int64_t const* lengths, int count, int* slots)
{
    return guarded(runtime, [&](dsa::Runtime& r) {
        auto const [all, sizes] = cPrompts("dsa_runtime_prefill", ids, lengths, count, slots);
        std::vector<int> const got = r.prefill(all, sizes);
        std::copy(got.begin(), got.end(), slots);
    });
}

int dsa_runtime_submit(dsa_runtime* runtime, int64_t const* ids, int64_t const* lengths, int count, int* slots)
{
    return guarded(runtime, [&](dsa::Runtime& r) {
        auto const [all, sizes] = cPrompts("dsa_runtime_submit", ids, lengths, count, slots);
        std::vector<int> const got = r.submit(all, sizes);
        std::copy(got.begin(), got.end(), slots);
    });
}

int dsa_runtime_step(dsa_runtime* runtime, int* slots, int capacity, int* count)
{
    return guarded(runtime, [&](dsa::Runtime& r) {
        if (slots == nullptr || count == nullptr || capacity < r.info().slots)
        {
            throw std::invalid_argument("dsa_runtime_step needs room for every slot and a count.");
        }
        std::vector<int> const got = r.step();
        std::copy(got.begin(), got.end(), slots);
        *count = static_cast<int>(got.size());
    });
}

int dsa_runtime_set_chunking(dsa_runtime* runtime, int64_t prefill_chunk, int64_t step_tokens)
{
    return guarded(runtime, [&](dsa::Runtime& r) { r.setChunking(prefill_chunk, step_tokens); });
}

int dsa_runtime_prefill_sampled(dsa_runtime* runtime, int64_t const* ids, int64_t const* lengths, int count,
    float const* temperature, float const* top_p, uint64_t const* seeds, int* slots)
{
    return guarded(runtime, [&](dsa::Runtime& r) {
        auto const [all, sizes] = cPrompts("dsa_runtime_prefill_sampled", ids, lengths, count, slots);
        std::vector<dsa::SamplingParams> sampling(static_cast<size_t>(count));
        for (int i = 0; i < count; ++i)
        {
            sampling[static_cast<size_t>(i)].temperature = temperature != nullptr ? temperature[i] : 0.F;
            sampling[static_cast<size_t>(i)].topP = top_p != nullptr ? top_p[i] : 1.F;
            sampling[static_cast<size_t>(i)].seed = seeds != nullptr ? seeds[i] : 0;
        }
        std::vector<int> const got = r.prefill(all, sizes, sampling);
        std::copy(got.begin(), got.end(), slots);
    });
}

int dsa_runtime_set_sampling(dsa_runtime* runtime, int slot, float temperature, float top_p, uint64_t seed)
{
    return guarded(runtime, [&](dsa::Runtime& r) {
        dsa::SamplingParams params;
        params.temperature = temperature;
        params.topP = top_p;
        params.seed = seed;
        r.setSampling(slot, params);
    });
}

int dsa_runtime_decode(dsa_runtime* runtime, int* slots, int capacity, int* count)
{
    return guarded(runtime, [&](dsa::Runtime& r) {
        if (slots == nullptr || count == nullptr || capacity < r.info().slots)
        {
            throw std::invalid_argument("dsa_runtime_decode needs room for every slot and a count.");
        }
        std::vector<int> const got = r.decode();
        std::copy(got.begin(), got.end(), slots);
        *count = static_cast<int>(got.size());
    });
}

int dsa_runtime_release(dsa_runtime* runtime, int slot)
{
    return guarded(runtime, [&](dsa::Runtime& r) { r.release(slot); });
}

int dsa_runtime_token(dsa_runtime const* runtime, int slot, int64_t* token)
{
    return guarded(const_cast<dsa_runtime*>(runtime), [&](dsa::Runtime& r) {
        if (token == nullptr)
        {
            throw std::invalid_argument("dsa_runtime_token needs somewhere to write the token.");
        }
        *token = r.token(slot);
    });
}

char const* dsa_runtime_error(dsa_runtime const* runtime)
{
    return runtime != nullptr ? runtime->error.c_str() : gOpenError.c_str();
}

} // extern "C"
