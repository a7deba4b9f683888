// The host side of serving a paged build: which sequence owns which slot (row of the decode call)
// and which cache pages, and the control inputs of each call (input_ids, query_start,
// query_lengths, block_table; docs/hf.md, "The paged graph"). Plain C++17, no TensorRT or CUDA:
// tests/test_cpp_runtime_host.py builds and runs its tests (host_test.cpp) with g++.
//
// The page rules are dsa_export/runtime/paged.py's PageAllocator: page j of a sequence holds its
// positions j*page .. j*page+page-1; page 0 is the graph's scratch page (padding tokens are written
// there) and is never handed out; pages handed back are reused lowest first; one allocator serves
// every stage, so one block table serves the whole pipeline.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace dsa
{

//! Cache pages for sequences (one per pipeline), keyed by slot.
class PageAllocator
{
public:
    //! ``page`` tokens per page; ``limit`` pages per pool, the scratch page included (0: no limit).
    PageAllocator(int64_t page, int64_t limit);

    int64_t page() const { return mPage; }

    //! Pages ``owner`` lacks for its first ``tokens`` positions.
    int64_t missing(int owner, int64_t tokens) const;

    //! Pages that may still be handed out: the free ones and those never touched.
    int64_t available() const;

    //! UserError unless ``pages`` more pages may be handed out.
    void checkAvailable(int64_t pages) const;

    //! Give ``owner`` the pages for its first ``tokens`` positions; UserError, and no change, when
    //! the pools have too few pages left.
    void ensure(int owner, int64_t tokens);

    //! Hand the pages of ``owner`` back.
    void release(int owner);

    //! The pages of ``owner`` in logical order (empty when it has none).
    std::vector<int32_t> const& pages(int owner) const;

    int64_t pagesInUse() const;

    //! Pages ever handed out, the scratch page included.
    int64_t pagesTouched() const { return mNext; }

private:
    int32_t take();

    int64_t mPage;
    int64_t mLimit;
    std::map<int, std::vector<int32_t>> mTables;
    std::set<int32_t> mFree;  //!< handed back, reused lowest first
    int32_t mNext{1};         //!< page 0 is scratch
};

//! What the build (and the caller's options) allow; see pagedLimits (paged_plan.h).
struct SchedulerLimits
{
    int slots{1};          //!< sequences at once: the rows of a decode call
    int64_t page{64};      //!< tokens per cache page
    int64_t pages{0};      //!< pages per pool, the scratch page included (0: no limit)
    int64_t maxTokens{64}; //!< tokens per sequence, prompt and generated ones
    int64_t maxPrompt{64}; //!< tokens per row of one prefill call (the prefill profile's sequence max); longer prompts go in chunks
    int prefillBatch{1};   //!< prompts of one prefill call
    int64_t vocab{-1};     //!< token ids lie in [0, vocab) (-1: not checked)

    //! Block table width of a decode call: pages of a full sequence.
    int64_t width() const { return (maxTokens + page - 1) / page; }
};

//! The control inputs of one call of every stage.
struct CallInputs
{
    bool prefill{false};
    int64_t batch{0};             //!< rows
    int64_t length{0};            //!< tokens per row (right-padded)
    int64_t width{0};             //!< block table columns
    std::vector<int64_t> ids;     //!< input_ids [batch, length], 0 after a row's tokens
    std::vector<int32_t> starts;  //!< query_start [batch]: tokens the row has in the caches
    std::vector<int32_t> counts;  //!< query_lengths [batch]: 0 for an idle row
    std::vector<int32_t> table;   //!< block_table [batch, width], -1 after a row's pages
    std::vector<int> slots;       //!< each row's slot, -1 for an idle row
    std::vector<uint8_t> sampled; //!< 1: the call chooses the row's next token (a decode row, a prompt's last chunk)
};

//! Slots, pages and the calls of a paged build. Argument errors are std::invalid_argument, a full
//! cache or sequence UserError; a refused call changes nothing.
class Scheduler
{
public:
    explicit Scheduler(SchedulerLimits const& limits);

    SchedulerLimits const& limits() const { return mLimits; }

    //! Admit prompt i (``lengths[i]`` ids of ``ids``, in order) into the lowest free slots with the
    //! pages of the whole prompt; returns the prefill calls to run in order (row i: prompt i,
    //! ``slots[i]`` its slot). A prompt longer than ``chunk`` tokens (0 or more than maxPrompt:
    //! maxPrompt) is fed in chunks, call c holding tokens c*chunk .. c*chunk+chunk-1 of every prompt
    //! that long (the other rows idle); the call with a prompt's last token chooses its first
    //! generated one (CallInputs::sampled). A prompt may hold up to maxTokens tokens.
    std::vector<CallInputs> admit(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths,
        int64_t chunk = 0);

    //! Admit prompts as admit() does (slots and every page taken now) without building their calls:
    //! their tokens wait in their slots for stepCall(). Returns prompt i's slot at index i.
    std::vector<int> enqueue(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths);

    //! One call for every sequence with work (continuous batching): a token for each sequence with
    //! a next token, and the next chunk (at most ``chunk`` tokens, 0 or more than maxPrompt:
    //! maxPrompt) of each prompt waiting from enqueue(); rows are slots 0 .. the highest with work,
    //! other rows idle. A call with no waiting prompt is decodeCall() (a decode-profile call);
    //! otherwise a prefill-profile call whose decode rows hold one token each. A row chooses its
    //! next token (CallInputs::sampled) when it decodes or its prompt's last chunk runs.
    //! ``tokens`` (0: no limit) bounds the call's size, rows x tokens per row (the padded [batch,
    //! length] every layer computes), by shortening the chunks: length = max(1, min(chunk, tokens /
    //! rows)), so the generating sequences' next token waits for at most that much prefill work
    //! (vLLM's max_num_batched_tokens); every waiting prompt still moves by at least one token.
    CallInputs stepCall(int64_t chunk = 0, int64_t tokens = 0);

    //! Slots whose prompts still wait for stepCall() (in slot order).
    std::vector<int> waitingSlots() const;

    //! One token per sequence with a next token; the rows are slots 0 .. batch-1, batch the
    //! smallest of decodeBatches() holding the highest such slot (other rows idle). Takes the pages
    //! the new tokens need.
    CallInputs decodeCall();

    //! ``call`` ran: its rows' tokens are in the caches and ``chosen[row]`` is the next token of
    //! each row the call samples (the others keep none until their last chunk).
    void commit(CallInputs const& call, std::vector<int64_t> const& chosen);

    //! ``call`` (an admit's first call, which holds every admitted slot) failed, or a later chunk
    //! did: its slots and pages are handed back.
    void abandon(CallInputs const& call);

    //! End the sequence in ``slot`` and hand its pages back.
    void release(int slot);

    bool live(int slot) const;
    std::vector<int> liveSlots() const;
    int freeSlots() const;
    int64_t cached(int slot) const;  //!< tokens of ``slot`` in the caches
    int64_t next(int slot) const;    //!< the next input token of ``slot`` (-1 before its prefill ran)
    PageAllocator const& pages() const { return mPages; }

    //! The decode batch sizes: 1, 2, 4, ... and the slot count (one CUDA graph each).
    std::vector<int64_t> decodeBatches() const;

private:
    struct Slot
    {
        bool live{false};
        int64_t cached{0};
        int64_t next{-1};
        std::vector<int64_t> waiting;  //!< prompt tokens enqueue() admitted that no call has fed yet
    };

    //! Slots and pages for prompts (admit and enqueue); returns the slots.
    std::vector<int> take(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths);

    void checkPrompts(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths) const;
    int64_t checkedChunk(int64_t chunk) const;
    void checkSlot(int slot) const;
    void fillRow(CallInputs& call, int64_t row, int slot) const;
    CallInputs emptyCall(bool prefill, int64_t batch, int64_t length, int64_t width) const;

    SchedulerLimits mLimits;
    PageAllocator mPages;
    std::vector<Slot> mSlots;
};

} // namespace dsa
