// Host tests of the runtime library: pages, slots, the calls' inputs, argument checks, the paged
// plan's checks and limits, logits reading, the host side of the device sampler. Plain C++17 with no test framework and no TensorRT or
// CUDA; tests/test_cpp_runtime_host.py builds and runs it (in CI).
//
//   dsa_runtime_host_test [PAGED_BUILD_FOLDER]   # the folder: a paged build's manifest.json to read

#include "host_math.h"
#include "paged_plan.h"
#include "scheduler.h"

#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace
{

int gFailures = 0;
int gChecks = 0;

void check(bool ok, std::string const& what, int line)
{
    ++gChecks;
    if (!ok)
    {
        ++gFailures;
        std::cerr << "FAILED (line " << line << "): " << what << "\n";
    }
}

#define CHECK(cond) check((cond), #cond, __LINE__)

//! ``body`` throws ``E`` whose message holds ``fragment``.
template <typename E>
void throws(std::function<void()> const& body, std::string const& fragment, int line)
{
    try
    {
        body();
        check(false, "no exception; expected one with '" + fragment + "'", line);
    }
    catch (E const& e)
    {
        check(std::string(e.what()).find(fragment) != std::string::npos,
            "message '" + std::string(e.what()) + "' lacks '" + fragment + "'", line);
    }
    catch (std::exception const& e)
    {
        check(false, std::string("wrong exception type: ") + e.what(), line);
    }
}

#define THROWS(E, body, fragment) throws<E>([&]() { body; }, fragment, __LINE__)

using Pages = std::vector<int32_t>;

dsa::SchedulerLimits smallLimits()
{
    dsa::SchedulerLimits limits;
    limits.slots = 3;
    limits.page = 4;
    limits.pages = 10;       // 9 pages to hand out
    limits.maxTokens = 12;   // 3 pages per sequence
    limits.maxPrompt = 8;
    limits.prefillBatch = 2;
    limits.vocab = 100;
    return limits;
}

// -- PageAllocator ------------------------------------------------------------------------------

void testPagesFollowPythonRules()
{
    dsa::PageAllocator pages(64, 0);
    pages.ensure(0, 130);  // 3 pages, page 0 is scratch
    CHECK((pages.pages(0) == Pages{1, 2, 3}));
    pages.ensure(1, 64);
    CHECK((pages.pages(1) == Pages{4}));
    pages.ensure(1, 64);   // already enough
    CHECK((pages.pages(1) == Pages{4}));
    pages.ensure(1, 65);
    CHECK((pages.pages(1) == Pages{4, 5}));
    pages.release(0);
    CHECK(pages.pagesInUse() == 2 && pages.pagesTouched() == 6);
    pages.ensure(2, 10);   // handed-back pages are reused lowest first
    CHECK((pages.pages(2) == Pages{1}));
    pages.ensure(3, 200);
    CHECK((pages.pages(3) == Pages{2, 3, 6, 7}));
    CHECK(pages.pages(42).empty());
    pages.release(42);     // nothing to hand back
    CHECK(pages.missing(3, 257) == 1 && pages.missing(3, 0) == 0);
}

void testPagesLimit()
{
    dsa::PageAllocator pages(4, 4);  // pages 1..3
    pages.ensure(0, 8);
    CHECK(pages.available() == 1);
    THROWS(dsa::UserError, pages.ensure(1, 5), "the cache pools hold 4 pages of 4 tokens and 1 are free, fewer than the 2");
    CHECK(pages.pages(1).empty() && pages.pagesInUse() == 2);  // refused: nothing taken
    pages.ensure(1, 4);
    CHECK((pages.pages(1) == Pages{3}) && pages.available() == 0);
    pages.release(0);
    CHECK(pages.available() == 2);
    THROWS(std::invalid_argument, dsa::PageAllocator(0, 0), "at least one token");
    THROWS(std::invalid_argument, dsa::PageAllocator(4, 1), "at least 2 pages");
}

// -- Scheduler ----------------------------------------------------------------------------------

void testAdmitBuildsThePrefillCall()
{
    dsa::Scheduler scheduler(smallLimits());
    dsa::CallInputs const call = scheduler.admit({5, 6, 7, 8, 9, 10, 11}, {5, 2}).front();
    CHECK(call.prefill && call.batch == 2 && call.length == 5 && call.width == 2);
    CHECK((call.ids == std::vector<int64_t>{5, 6, 7, 8, 9, 10, 11, 0, 0, 0}));
    CHECK((call.starts == std::vector<int32_t>{0, 0}) && (call.counts == std::vector<int32_t>{5, 2}));
    CHECK((call.table == std::vector<int32_t>{1, 2, 3, -1}));
    CHECK((call.slots == std::vector<int>{0, 1}));
    CHECK(scheduler.live(0) && scheduler.live(1) && !scheduler.live(2) && scheduler.freeSlots() == 1);
    CHECK(scheduler.next(0) == -1 && scheduler.cached(0) == 0);
    THROWS(std::invalid_argument, scheduler.decodeCall(), "no sequence to run");  // no prefill has finished
    scheduler.commit(call, {42, 43});
    CHECK(scheduler.cached(0) == 5 && scheduler.cached(1) == 2 && scheduler.next(0) == 42 && scheduler.next(1) == 43);
}

void testDecodeCallsGrowPagesAndBatches()
{
    dsa::Scheduler scheduler(smallLimits());
    dsa::CallInputs const prefill = scheduler.admit({1, 2, 3, 4, 5, 6, 7, 8}, {4, 4}).front();
    scheduler.commit(prefill, {11, 12});
    dsa::CallInputs const step = scheduler.decodeCall();  // token 5 of each row starts a second page
    CHECK(!step.prefill && step.batch == 2 && step.length == 1 && step.width == 3);
    CHECK((step.ids == std::vector<int64_t>{11, 12}) && (step.starts == std::vector<int32_t>{4, 4}));
    CHECK((step.counts == std::vector<int32_t>{1, 1}));
    CHECK((step.table == std::vector<int32_t>{1, 3, -1, 2, 4, -1}));
    scheduler.commit(step, {21, 22});
    CHECK(scheduler.cached(0) == 5 && scheduler.next(1) == 22);
    scheduler.release(0);
    dsa::CallInputs const alone = scheduler.decodeCall();  // slot 1 alone: a batch of 2, row 0 idle
    CHECK(alone.batch == 2 && (alone.slots == std::vector<int>{-1, 1}) && (alone.counts == std::vector<int32_t>{0, 1}));
    CHECK((alone.table == std::vector<int32_t>{-1, -1, -1, 2, 4, -1}) && alone.ids[0] == 0);
    dsa::CallInputs const again = scheduler.admit({9}, {1}).front();  // the freed slot and its pages come back first
    CHECK((again.slots == std::vector<int>{0}) && (again.table == std::vector<int32_t>{1}));
}

void testLongPromptsArePrefilledInChunks()
{
    dsa::Scheduler scheduler(smallLimits());  // 8 tokens per prefill call, 12 per sequence, pages of 4
    std::vector<int64_t> ids;
    for (int64_t i = 1; i <= 14; ++i)
    {
        ids.push_back(i);
    }
    // Prompt 0: 11 tokens (3 chunks of 4), prompt 1: 3 tokens (done in the first call).
    std::vector<dsa::CallInputs> const calls = scheduler.admit(ids, {11, 3}, 4);
    CHECK(calls.size() == 3);
    CHECK(scheduler.pages().pages(0).size() == 3 && scheduler.pages().pages(1).size() == 1);  // all taken at once
    CHECK(calls[0].length == 4 && calls[0].width == 3);
    CHECK((calls[0].ids == std::vector<int64_t>{1, 2, 3, 4, 12, 13, 14, 0}));
    CHECK((calls[0].starts == std::vector<int32_t>{0, 0}) && (calls[0].counts == std::vector<int32_t>{4, 3}));
    CHECK((calls[0].sampled == std::vector<uint8_t>{0, 1}) && (calls[0].slots == std::vector<int>{0, 1}));
    CHECK((calls[0].table == std::vector<int32_t>{1, 2, 3, 4, -1, -1}));
    CHECK((calls[1].ids == std::vector<int64_t>{5, 6, 7, 8, 0, 0, 0, 0}));
    CHECK((calls[1].starts == std::vector<int32_t>{4, 0}) && (calls[1].counts == std::vector<int32_t>{4, 0}));
    CHECK((calls[1].slots == std::vector<int>{0, -1}) && (calls[1].sampled == std::vector<uint8_t>{0, 0}));
    CHECK((calls[1].table == std::vector<int32_t>{1, 2, 3, -1, -1, -1}));
    CHECK(calls[2].length == 3 && (calls[2].ids == std::vector<int64_t>{9, 10, 11, 0, 0, 0}));
    CHECK((calls[2].starts == std::vector<int32_t>{8, 0}) && (calls[2].counts == std::vector<int32_t>{3, 0}));
    CHECK((calls[2].sampled == std::vector<uint8_t>{1, 0}));
    scheduler.commit(calls[0], {90, 91});  // row 0's token is no choice yet: its prompt goes on
    CHECK(scheduler.cached(0) == 4 && scheduler.next(0) == -1 && scheduler.cached(1) == 3 && scheduler.next(1) == 91);
    dsa::CallInputs const between = scheduler.decodeCall();  // slot 0 is still in its prefill: not decoded
    CHECK((between.slots == std::vector<int>{-1, 1}) && (between.counts == std::vector<int32_t>{0, 1}));
    scheduler.commit(calls[1], {92, 93});
    scheduler.commit(calls[2], {94, 95});
    CHECK(scheduler.cached(0) == 11 && scheduler.next(0) == 94 && scheduler.next(1) == 91);
    // Without a chunk the prefill profile's 8 tokens are the chunk; prompts that fit take one call.
    dsa::Scheduler other(smallLimits());
    std::vector<dsa::CallInputs> const two = other.admit(std::vector<int64_t>(12, 1), {12});
    CHECK(two.size() == 2 && two[0].length == 8 && two[1].length == 4 && two[1].starts[0] == 8);
    CHECK(other.admit({1, 2}, {2}).size() == 1);
    CHECK(other.admit({1}, {1}, 100).front().length == 1);  // a chunk above the profile's is the profile's
}

void testStepsMixPromptChunksWithDecodeRows()
{
    dsa::SchedulerLimits limits = smallLimits();  // pages of 4, 12 tokens a sequence, 8 per prefill call
    limits.prefillBatch = 3;
    dsa::Scheduler scheduler(limits);
    scheduler.commit(scheduler.admit({7, 8}, {2}).front(), {42});  // slot 0 decodes from token 42
    std::vector<int> const slots = scheduler.enqueue({1, 2, 3, 4, 5, 6, 9, 10}, {6, 2});
    CHECK((slots == std::vector<int>{1, 2}) && (scheduler.waitingSlots() == std::vector<int>{1, 2}));
    CHECK(scheduler.pages().pages(1).size() == 2 && scheduler.pages().pages(2).size() == 1);  // taken at enqueue
    dsa::CallInputs const first = scheduler.stepCall(4);
    CHECK(first.prefill && first.batch == 3 && first.length == 4 && first.width == 3);
    CHECK((first.ids == std::vector<int64_t>{42, 0, 0, 0, 1, 2, 3, 4, 9, 10, 0, 0}));
    CHECK((first.starts == std::vector<int32_t>{2, 0, 0}) && (first.counts == std::vector<int32_t>{1, 4, 2}));
    CHECK((first.sampled == std::vector<uint8_t>{1, 0, 1}) && (first.slots == std::vector<int>{0, 1, 2}));
    scheduler.commit(first, {50, 51, 52});
    CHECK(scheduler.next(0) == 50 && scheduler.cached(0) == 3);
    CHECK(scheduler.next(1) == -1 && scheduler.cached(1) == 4 && (scheduler.waitingSlots() == std::vector<int>{1}));
    CHECK(scheduler.next(2) == 52 && scheduler.cached(2) == 2);
    dsa::CallInputs const second = scheduler.stepCall(4);  // slot 1's last 2 tokens, two decode rows
    CHECK(second.prefill && second.length == 2 && (second.ids == std::vector<int64_t>{50, 0, 5, 6, 52, 0}));
    CHECK((second.starts == std::vector<int32_t>{3, 4, 2}) && (second.counts == std::vector<int32_t>{1, 2, 1}));
    CHECK((second.sampled == std::vector<uint8_t>{1, 1, 1}));
    scheduler.commit(second, {60, 61, 62});
    CHECK(scheduler.waitingSlots().empty() && scheduler.next(1) == 61 && scheduler.cached(1) == 6);
    dsa::CallInputs const third = scheduler.stepCall(4);  // nothing waits: a decode-profile call
    CHECK(!third.prefill && third.length == 1 && (third.ids == std::vector<int64_t>{60, 61, 62}));
    scheduler.release(1);
    CHECK(scheduler.waitingSlots().empty() && scheduler.freeSlots() == 1);
    // A slot released while its prompt waits takes its waiting tokens with it.
    std::vector<int> const again = scheduler.enqueue({3, 3, 3}, {3});
    CHECK((again == std::vector<int>{1}) && (scheduler.waitingSlots() == std::vector<int>{1}));
    scheduler.release(1);
    CHECK(scheduler.waitingSlots().empty());
    THROWS(std::invalid_argument, scheduler.stepCall(-1), "the prefill chunk must be 0");
}

void testAStepTokenBudgetShortensTheChunks()
{
    dsa::SchedulerLimits limits = smallLimits();  // pages of 4, 12 tokens a sequence, 8 per prefill call
    limits.prefillBatch = 3;
    dsa::Scheduler scheduler(limits);
    scheduler.commit(scheduler.admit({7, 8}, {2}).front(), {42});  // slot 0 decodes from token 42
    scheduler.enqueue({1, 2, 3, 4, 5, 6, 9, 10, 11}, {6, 3});
    // 3 rows x at most 2 tokens: the prompts move 2 tokens a step, the decode row keeps its one.
    dsa::CallInputs const first = scheduler.stepCall(4, 7);
    CHECK(first.prefill && first.batch == 3 && first.length == 2);
    CHECK((first.ids == std::vector<int64_t>{42, 0, 1, 2, 9, 10}) && (first.counts == std::vector<int32_t>{1, 2, 2}));
    CHECK((first.sampled == std::vector<uint8_t>{1, 0, 0}));
    scheduler.commit(first, {50, 51, 52});
    CHECK(scheduler.cached(1) == 2 && scheduler.cached(2) == 2 && scheduler.next(2) == -1);
    // A budget under the row count still moves every prompt by a token.
    dsa::CallInputs const second = scheduler.stepCall(4, 2);
    CHECK(second.length == 1 && (second.ids == std::vector<int64_t>{50, 3, 11}));
    CHECK((second.sampled == std::vector<uint8_t>{1, 0, 1}));
    scheduler.commit(second, {60, 61, 62});
    // No budget: the rest of slot 1's prompt (3 tokens) in one call.
    dsa::CallInputs const third = scheduler.stepCall(4, 0);
    CHECK(third.length == 3 && (third.counts == std::vector<int32_t>{1, 3, 1}) && third.sampled[1] == 1);
    THROWS(std::invalid_argument, scheduler.stepCall(4, -1), "token budget must be 0");
}

void testDecodeBatches()
{
    auto batches = [](int slots) {
        dsa::SchedulerLimits limits = smallLimits();
        limits.slots = slots;
        limits.pages = 0;
        return dsa::Scheduler(limits).decodeBatches();
    };
    CHECK((batches(1) == std::vector<int64_t>{1}));
    CHECK((batches(5) == std::vector<int64_t>{1, 2, 4, 5}));
    CHECK((batches(8) == std::vector<int64_t>{1, 2, 4, 8}));
}

void testArgumentChecksChangeNothing()
{
    dsa::Scheduler scheduler(smallLimits());
    THROWS(std::invalid_argument, scheduler.admit({}, {}), "at least one prompt");
    THROWS(std::invalid_argument, scheduler.admit({1}, {1, 0}), "prompt 1 is empty");
    THROWS(std::invalid_argument, scheduler.admit({1, 2}, {3}), "ids holds 2 tokens but lengths add up to 3");
    THROWS(std::invalid_argument, scheduler.admit({1, 2, 3}, {1, 1, 1}), "takes at most 2");
    THROWS(std::invalid_argument, scheduler.admit(std::vector<int64_t>(13, 1), {13}), "prompt 0 has 13 tokens; a sequence may hold at most 12");
    THROWS(std::invalid_argument, scheduler.admit({1}, {1}, -1), "the prefill chunk must be 0");
    THROWS(std::invalid_argument, scheduler.admit({1, 100}, {2}), "token id 100 (position 1 of ids)");
    THROWS(std::invalid_argument, scheduler.admit({-1}, {1}), "outside the vocabulary [0, 100)");
    THROWS(std::invalid_argument, scheduler.release(0), "slot 0 holds no sequence");
    THROWS(std::invalid_argument, scheduler.release(3), "slot 3 does not exist; the slots are 0 .. 2");
    THROWS(std::invalid_argument, scheduler.cached(-1), "does not exist");
    CHECK(scheduler.liveSlots().empty() && scheduler.pages().pagesInUse() == 0);
    scheduler.admit({1, 2}, {1, 1});
    THROWS(std::invalid_argument, scheduler.admit({1, 2}, {1, 1}), "only 1 of 3 slots are free");
    CHECK(scheduler.liveSlots().size() == 2);
}

void testFullPoolsAndFullSequences()
{
    dsa::SchedulerLimits limits = smallLimits();
    limits.pages = 4;  // 3 pages to hand out
    dsa::Scheduler scheduler(limits);
    dsa::CallInputs const first = scheduler.admit(std::vector<int64_t>(8, 1), {8}).front();  // 2 pages
    scheduler.commit(first, {7});
    THROWS(dsa::UserError, scheduler.admit(std::vector<int64_t>(5, 1), {5}), "1 are free, fewer than the 2 needed");
    CHECK(scheduler.liveSlots().size() == 1 && scheduler.pages().pagesInUse() == 2);
    dsa::CallInputs step = scheduler.decodeCall();  // token 9: the third page
    scheduler.commit(step, {8});
    for (int i = 0; i < 3; ++i)
    {
        step = scheduler.decodeCall();
        scheduler.commit(step, {9});
    }
    CHECK(scheduler.cached(0) == 12);
    THROWS(dsa::UserError, scheduler.decodeCall(), "slot 0 holds 12 tokens, the most a sequence may hold here");
    scheduler.release(0);
    CHECK(scheduler.pages().available() == 3);
    dsa::CallInputs const failed = scheduler.admit({3}, {1}).front();  // abandon: a prefill that failed on the GPU
    CHECK(scheduler.live(0) && scheduler.pages().available() == 2);
    scheduler.abandon(failed);
    CHECK(!scheduler.live(0) && scheduler.pages().pages(0).empty() && scheduler.pages().available() == 3);
}

// -- the paged plan -----------------------------------------------------------------------------

dsa::TensorSpec spec(std::string const& name, std::vector<dsa::Dim> shape)
{
    dsa::TensorSpec t;
    t.name = name;
    t.dtype = name == "input_ids" ? "int64" : "int32";
    t.shape = std::move(shape);
    return t;
}

dsa::Dim named(char const* name)
{
    return dsa::Dim{-1, name};
}

dsa::Dim fixed(int64_t size)
{
    return dsa::Dim{size, ""};
}

dsa::Plan pagedPlan(int stages = 1)
{
    dsa::Plan plan;
    for (int k = 0; k < stages; ++k)
    {
        dsa::Stage stage;
        stage.index = k;
        stage.label = "stage " + std::to_string(k);
        stage.inputs.push_back(k == 0 ? spec("input_ids", {named("batch"), named("sequence")})
                                      : spec("hidden_states", {named("batch"), named("sequence"), fixed(8)}));
        stage.inputs.push_back(spec("query_start", {named("batch")}));
        stage.inputs.push_back(spec("query_lengths", {named("batch")}));
        stage.inputs.push_back(spec("block_table", {named("batch"), named("max_pages")}));
        stage.inputs.push_back(spec("past_latent_pool_" + std::to_string(k), {named("pages"), fixed(64), fixed(576)}));
        stage.outputs.push_back(k + 1 == stages ? spec("logits", {named("batch"), fixed(1000)})
                                                : spec("hidden_states_out", {named("batch"), named("sequence"), fixed(8)}));
        stage.profile = {{"batch", {1, 2, 4}}, {"sequence", {1, 128, 256}}, {"max_pages", {1, 2, 4}}, {"pages", {1, 9, 17}}};
        plan.stages.push_back(stage);
        if (k > 0)
        {
            plan.links.push_back(dsa::Link{k - 1, k, "hidden_states_out", "hidden_states"});
        }
    }
    plan.pipeline = stages > 1;
    return plan;
}

void testPagedLimits()
{
    dsa::SchedulerLimits const limits = dsa::pagedLimits(pagedPlan(2), dsa::PagedRequest{});
    CHECK(limits.slots == 4 && limits.prefillBatch == 4 && limits.page == 64 && limits.maxTokens == 256);
    CHECK(limits.maxPrompt == 256 && limits.pages == 17 && limits.vocab == 1000 && limits.width() == 4);
    dsa::SchedulerLimits const asked = dsa::pagedLimits(pagedPlan(), dsa::PagedRequest{2, 100, 0});
    CHECK(asked.slots == 2 && asked.maxTokens == 100 && asked.maxPrompt == 100 && asked.pages == 5);
    THROWS(dsa::UserError, dsa::pagedLimits(pagedPlan(), dsa::PagedRequest{5, 0, 0}), "allows a batch of at most 4");
    THROWS(dsa::UserError, dsa::pagedLimits(pagedPlan(), dsa::PagedRequest{0, 300, 0}), "holds at most 256 tokens");
    THROWS(dsa::UserError, dsa::pagedLimits(pagedPlan(), dsa::PagedRequest{0, 0, 18}), "allows 17 cache pages");
    THROWS(dsa::UserError, dsa::pagedLimits(pagedPlan(), dsa::PagedRequest{0, 0, 1}), "at least 2 pages");
    THROWS(dsa::UserError, dsa::pagedLimits(pagedPlan(), dsa::PagedRequest{-1, 0, 0}), "must not be negative");
    dsa::Plan odd = pagedPlan(2);
    odd.stages[1].inputs[4].shape[1] = fixed(32);
    THROWS(dsa::UserError, dsa::pagedLimits(odd, dsa::PagedRequest{}), "disagree on their page size (64 and 32");
}

void testPagedPlanChecks()
{
    dsa::checkPagedPlan(pagedPlan(2));
    dsa::Plan flat = pagedPlan();
    flat.stages[0].inputs.erase(flat.stages[0].inputs.begin() + 3);  // no block_table
    THROWS(dsa::UserError, dsa::checkPagedPlan(flat), "stage 0 is not a paged graph");
    dsa::Plan extra = pagedPlan();
    extra.stages[0].inputs.push_back(spec("attention_mask", {named("batch"), named("sequence")}));
    THROWS(dsa::UserError, dsa::checkPagedPlan(extra), "takes the input 'attention_mask', which the runtime does not feed");
    dsa::Plan unlinked = pagedPlan(2);
    unlinked.links.clear();
    THROWS(dsa::UserError, dsa::checkPagedPlan(unlinked), "'hidden_states'");
    CHECK(dsa::isPool("past_index_key_pool_3") && !dsa::isPool("past_key_3") && dsa::isControl("block_table"));
    CHECK(dsa::presentOf("past_latent_pool_0") == "present_latent_pool_0");
}

void testReadsAPagedBuild(std::string const& folder)
{
    dsa::Plan const plan = dsa::readPlan(folder, dsa::PlanOptions{1, -1});
    dsa::checkPagedPlan(plan);
    dsa::SchedulerLimits const limits = dsa::pagedLimits(plan, dsa::PagedRequest{2, 0, 0});
    CHECK(limits.slots == 2 && limits.page == 64 && limits.maxTokens == 256 && limits.pages == 9);
    dsa::Scheduler scheduler(limits);
    dsa::CallInputs const call = scheduler.admit(std::vector<int64_t>(70, 3), {70}).front();
    CHECK((call.table == std::vector<int32_t>{1, 2}));
}

// -- logits -------------------------------------------------------------------------------------

void testLogits()
{
    float const f[] = {0.5f, 2.0f, 2.0f, -1.0f, NAN, -3.0f, -2.0f, -5.0f};
    CHECK((dsa::argmaxRows(f, dsa::LogitType::kFLOAT, 2, 4) == std::vector<int64_t>{1, 2}));
    uint16_t h[8];
    uint16_t b[8];
    for (int i = 0; i < 8; ++i)
    {
        h[i] = dsa::floatToHalf(f[i]);
        b[i] = dsa::floatToBf16(f[i]);
    }
    CHECK((dsa::argmaxRows(h, dsa::LogitType::kHALF, 2, 4) == std::vector<int64_t>{1, 2}));
    CHECK((dsa::argmaxRows(b, dsa::LogitType::kBF16, 4, 2) == std::vector<int64_t>{1, 0, 1, 0}));
    CHECK((dsa::logitRow(h, dsa::LogitType::kHALF, 0, 4) == std::vector<float>{0.5f, 2.0f, 2.0f, -1.0f}));
    CHECK(dsa::halfToFloat(dsa::floatToHalf(65504.0f)) == 65504.0f && dsa::bf16ToFloat(dsa::floatToBf16(-3.0f)) == -3.0f);
    CHECK(std::isinf(dsa::halfToFloat(dsa::floatToHalf(1e6f))));
}

} // namespace

void testSamplingHostSide()
{
    // Philox4x32-10: Random123's known answers.
    CHECK((dsa::philox4x32x10({0u, 0u, 0u, 0u}, {0u, 0u}) == std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du,
        0xbc57ac4cu, 0x9b00dbd8u}));
    CHECK((dsa::philox4x32x10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu})
        == std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
    CHECK((dsa::philox4x32x10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u})
        == std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
    // The sampler's draws, as dsa_export.runtime.philox.philox_u53 gives them.
    CHECK(dsa::philoxU53(0, 0) == 0x1c2d38b1acc4fdULL);
    CHECK(dsa::philoxU53(123, 7) == 0xc133dce0611e9ULL);
    CHECK(dsa::philoxU53(9223372036854775813ULL, 1099511627779ULL) == 0x1d0a46356e6bd6ULL);
    CHECK(dsa::philoxU53(0xffffffffffffffffULL, 1) == 0x96cfc06833fdaULL);

    // Each row gets its slot's settings and step; idle rows and slots without settings are greedy.
    std::map<int, dsa::SlotSampling> slots;
    slots[0] = dsa::SlotSampling{0.7F, 0.9F, 42, 3};
    slots[2] = dsa::SlotSampling{0.F, 1.F, 7, 5};
    dsa::SamplingRows const rows = dsa::samplingRows({0, -1, 2, 3}, slots);
    CHECK(rows.temperature == (std::vector<float>{0.7F, 0.F, 0.F, 0.F}));
    CHECK(rows.topP == (std::vector<float>{0.9F, 1.F, 1.F, 1.F}));
    CHECK(rows.seeds == (std::vector<uint64_t>{42, 0, 7, 0}));
    CHECK(rows.offsets == (std::vector<int64_t>{3, 0, 5, 0}));
    CHECK(rows.anySampled);
    CHECK(!dsa::samplingRows({2, -1}, slots).anySampled);

    dsa::checkSampling(0.F, 1.F);
    dsa::checkSampling(1.5F, 0.01F);
    THROWS(std::invalid_argument, dsa::checkSampling(-0.1F, 1.F), "temperature");
    THROWS(std::invalid_argument, dsa::checkSampling(INFINITY, 1.F), "temperature");
    THROWS(std::invalid_argument, dsa::checkSampling(NAN, 1.F), "temperature");
    THROWS(std::invalid_argument, dsa::checkSampling(1.F, 0.F), "top_p");
    THROWS(std::invalid_argument, dsa::checkSampling(1.F, 1.5F), "top_p");

    // Where libdsa_kernels.so is looked for.
    CHECK(dsa::kernelsLibraryCandidates("/k/libdsa_kernels.so", "/env/k.so", "/p/libdsa_plugins.so")
        == std::vector<std::string>{"/k/libdsa_kernels.so"});
    CHECK(dsa::kernelsLibraryCandidates("", "/env/k.so", "/p/libdsa_plugins.so") == std::vector<std::string>{"/env/k.so"});
    CHECK(dsa::kernelsLibraryCandidates("", nullptr, "/p/build/libdsa_plugins.so")
        == std::vector<std::string>{"/p/build/libdsa_kernels.so"});
    CHECK(dsa::kernelsLibraryCandidates("", "", "libdsa_plugins.so") == std::vector<std::string>{"./libdsa_kernels.so"});
    CHECK(dsa::kernelsLibraryCandidates("", nullptr, "").empty());
}

int main(int argc, char** argv)
{
    std::vector<std::pair<char const*, std::function<void()>>> const tests = {
        {"pages follow the Python rules", testPagesFollowPythonRules},
        {"pages limit", testPagesLimit},
        {"admit builds the prefill call", testAdmitBuildsThePrefillCall},
        {"decode calls grow pages and batches", testDecodeCallsGrowPagesAndBatches},
        {"long prompts are prefilled in chunks", testLongPromptsArePrefilledInChunks},
        {"steps mix prompt chunks with decode rows", testStepsMixPromptChunksWithDecodeRows},
        {"a step token budget shortens the chunks", testAStepTokenBudgetShortensTheChunks},
        {"decode batches", testDecodeBatches},
        {"argument checks change nothing", testArgumentChecksChangeNothing},
        {"full pools and full sequences", testFullPoolsAndFullSequences},
        {"paged limits", testPagedLimits},
        {"paged plan checks", testPagedPlanChecks},
        {"logits", testLogits},
        {"sampling, host side", testSamplingHostSide},
    };
    for (auto const& [name, body] : tests)
    {
        int const before = gFailures;
        try
        {
            body();
        }
        catch (std::exception const& e)
        {
            check(false, std::string("uncaught: ") + e.what(), 0);
        }
        std::cout << (gFailures == before ? "ok   " : "FAIL ") << name << "\n";
    }
    if (argc > 1)
    {
        int const before = gFailures;
        try
        {
            testReadsAPagedBuild(argv[1]);
        }
        catch (std::exception const& e)
        {
            check(false, std::string("uncaught: ") + e.what(), 0);
        }
        std::cout << (gFailures == before ? "ok   " : "FAIL ") << "reads a paged build\n";
    }
    std::cout << gChecks << " checks, " << gFailures << " failed\n";
    return gFailures == 0 ? 0 : 1;
}
