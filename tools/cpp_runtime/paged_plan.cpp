#include "paged_plan.h"

#include <algorithm>
#include <limits>

namespace dsa
{

namespace
{

constexpr char const* kCONTROLS[] = {"input_ids", "query_start", "query_lengths", "block_table"};
constexpr char const* kREBUILD = "rebuild it with `dsa-export build HF_DIR --stages N --graph paged`.";

void require(bool ok, std::string const& message)
{
    if (!ok)
    {
        throw UserError(message);
    }
}

std::string str(int64_t value)
{
    return std::to_string(value);
}

//! The smallest max of ``dim`` over the stages' profiles, and the stage holding it (0 when no stage has the dim).
std::pair<int64_t, Stage const*> profileMax(Plan const& plan, std::string const& dim)
{
    std::pair<int64_t, Stage const*> best{0, nullptr};
    for (Stage const& stage : plan.stages)
    {
        auto const it = stage.profile.find(dim);
        if (it != stage.profile.end() && (best.second == nullptr || it->second.max < best.first))
        {
            best = {it->second.max, &stage};
        }
    }
    return best;
}

//! Tokens per page: the static axis 1 of every pool, which all stages must agree on.
int64_t pageSize(Plan const& plan)
{
    int64_t page = 0;
    for (Stage const& stage : plan.stages)
    {
        for (TensorSpec const& spec : stage.inputs)
        {
            if (!isPool(spec.name))
            {
                continue;
            }
            bool const fixed = spec.shape.size() == 3 && spec.shape[1].name.empty() && spec.shape[1].size > 0;
            require(fixed, "the cache pool '" + spec.name + "' of " + stage.label + " has no static page size; "
                + kREBUILD);
            require(page == 0 || page == spec.shape[1].size, "the cache pools disagree on their page size ("
                + str(page) + " and " + str(spec.shape[1].size) + " tokens); " + kREBUILD);
            page = spec.shape[1].size;
        }
    }
    require(page > 0, plan.stages.front().label + " has no cache pool input (past_*_pool_*); " + kREBUILD);
    return page;
}

int64_t vocabulary(Plan const& plan)
{
    TensorSpec const* logits = plan.stages.back().output("logits");
    bool const fixed = logits != nullptr && logits->shape.size() == 2 && logits->shape[1].name.empty();
    return fixed ? logits->shape[1].size : -1;
}

void checkSlots(Plan const& plan, SchedulerLimits& limits, int requested)
{
    auto const [batch, stage] = profileMax(plan, "batch");
    limits.slots = requested > 0 ? requested : (stage ? static_cast<int>(batch) : 1);
    require(stage == nullptr || limits.slots <= batch, str(limits.slots) + " slots were asked for, but "
        + stage->label + "'s profile allows a batch of at most " + str(batch) + ".");
    limits.prefillBatch = stage ? static_cast<int>(batch) : limits.slots;
}

void checkTokens(Plan const& plan, SchedulerLimits& limits, int64_t requested)
{
    auto const [blocks, stage] = profileMax(plan, "max_pages");
    auto const [sequence, seqStage] = profileMax(plan, "sequence");
    int64_t const fallback = stage ? blocks * limits.page : (seqStage ? sequence : limits.page);
    limits.maxTokens = requested > 0 ? requested : fallback;
    require(stage == nullptr || limits.width() <= blocks, stage->label + " holds at most "
        + str(blocks * limits.page) + " tokens per sequence; " + str(limits.maxTokens) + " were asked for (build "
        "with a larger --max-seq, or ask for fewer).");
    limits.maxPrompt = seqStage ? std::min(sequence, limits.maxTokens) : limits.maxTokens;
}

void checkPages(Plan const& plan, SchedulerLimits& limits, int64_t requested)
{
    auto const [most, stage] = profileMax(plan, "pages");
    int64_t const filled = 1 + static_cast<int64_t>(limits.slots) * limits.width();
    limits.pages = requested > 0 ? requested : (stage ? std::min(most, filled) : filled);
    require(stage == nullptr || limits.pages <= most, stage->label + "'s profile allows " + str(most)
        + " cache pages; " + str(limits.pages) + " were asked for (build with a larger --max-batch or --max-seq).");
    require(limits.pages >= 2, "the cache pools need at least 2 pages, the scratch page and one more; "
        + str(limits.pages) + " were asked for.");
}

} // namespace

bool isPool(std::string const& name)
{
    return name.rfind("past_", 0) == 0 && name.find("_pool_") != std::string::npos;
}

bool isControl(std::string const& name)
{
    return std::any_of(std::begin(kCONTROLS), std::end(kCONTROLS), [&](char const* c) { return name == c; });
}

std::string presentOf(std::string const& past)
{
    return "present_" + past.substr(5);
}

void checkPagedPlan(Plan const& plan)
{
    require(!plan.stages.empty(), plan.source + " has no stages.");
    for (Stage const& stage : plan.stages)
    {
        bool const paged = stage.input("block_table") && stage.input("query_start") && stage.input("query_lengths");
        require(paged, stage.label + " is not a paged graph (no block_table / query_start / query_lengths input); "
            "the runtime library and --generate need a paged build: `dsa-export build HF_DIR --stages N --graph paged`.");
    }
    for (Stage const& stage : plan.stages)
    {
        for (TensorSpec const& spec : stage.inputs)
        {
            require(isControl(spec.name) || isPool(spec.name) || plan.linkInto(stage.index, spec.name) != nullptr,
                stage.label + " takes the input '" + spec.name + "', which the runtime does not feed (it feeds "
                    "input_ids, query_start, query_lengths, block_table, the past_*_pool_* caches and the links "
                    "between stages); " + kREBUILD);
        }
    }
    Stage const& first = plan.stages.front();
    require(first.input("input_ids") != nullptr, first.label + " takes no input_ids; the runtime needs the first stage.");
    require(plan.stages.back().output("logits") != nullptr, "the last stage returns no logits; the runtime needs them.");
}

SchedulerLimits pagedLimits(Plan const& plan, PagedRequest const& request)
{
    require(request.slots >= 0 && request.maxTokens >= 0 && request.pages >= 0,
        "slots, max tokens and pages must not be negative (0 means the build's limit).");
    SchedulerLimits limits;
    limits.page = pageSize(plan);
    limits.vocab = vocabulary(plan);
    checkSlots(plan, limits, request.slots);
    checkTokens(plan, limits, request.maxTokens);
    checkPages(plan, limits, request.pages);
    return limits;
}

} // namespace dsa
