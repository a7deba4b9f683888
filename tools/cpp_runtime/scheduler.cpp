#include "scheduler.h"

#include "json.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace dsa
{

namespace
{

std::string str(int64_t value)
{
    return std::to_string(value);
}

void argument(bool ok, std::string const& message)
{
    if (!ok)
    {
        throw std::invalid_argument(message);
    }
}

} // namespace

// -- PageAllocator ----------------------------------------------------------------------------------

PageAllocator::PageAllocator(int64_t page, int64_t limit)
    : mPage(page)
    , mLimit(limit)
{
    argument(page >= 1, "a cache page must hold at least one token (got " + str(page) + ").");
    argument(limit == 0 || limit >= 2, "the cache pools need at least 2 pages, the scratch page and one more (got "
        + str(limit) + ").");
}

int64_t PageAllocator::missing(int owner, int64_t tokens) const
{
    int64_t const needed = (std::max<int64_t>(tokens, 0) + mPage - 1) / mPage;
    return std::max<int64_t>(0, needed - static_cast<int64_t>(pages(owner).size()));
}

int64_t PageAllocator::available() const
{
    if (mLimit == 0)
    {
        return std::numeric_limits<int64_t>::max();
    }
    return static_cast<int64_t>(mFree.size()) + (mLimit - mNext);
}

void PageAllocator::checkAvailable(int64_t pages) const
{
    if (pages > available())
    {
        throw UserError("the cache pools hold " + str(mLimit) + " pages of " + str(mPage) + " tokens and "
            + str(available()) + " are free, fewer than the " + str(pages) + " needed; release a sequence, run "
            "shorter ones, or give the caches more pages.");
    }
}

void PageAllocator::ensure(int owner, int64_t tokens)
{
    int64_t const lacking = missing(owner, tokens);
    checkAvailable(lacking);
    std::vector<int32_t>& table = mTables[owner];
    for (int64_t i = 0; i < lacking; ++i)
    {
        table.push_back(take());
    }
}

int32_t PageAllocator::take()
{
    if (!mFree.empty())
    {
        int32_t const page = *mFree.begin();
        mFree.erase(mFree.begin());
        return page;
    }
    return mNext++;
}

void PageAllocator::release(int owner)
{
    auto const it = mTables.find(owner);
    if (it != mTables.end())
    {
        mFree.insert(it->second.begin(), it->second.end());
        mTables.erase(it);
    }
}

std::vector<int32_t> const& PageAllocator::pages(int owner) const
{
    static std::vector<int32_t> const kNone;
    auto const it = mTables.find(owner);
    return it == mTables.end() ? kNone : it->second;
}

int64_t PageAllocator::pagesInUse() const
{
    int64_t total = 0;
    for (auto const& item : mTables)
    {
        total += static_cast<int64_t>(item.second.size());
    }
    return total;
}

// -- Scheduler --------------------------------------------------------------------------------------

Scheduler::Scheduler(SchedulerLimits const& limits)
    : mLimits(limits)
    , mPages(limits.page, limits.pages)
    , mSlots(static_cast<size_t>(std::max(limits.slots, 0)))
{
    argument(limits.slots >= 1, "the runtime needs at least one slot (got " + str(limits.slots) + ").");
    argument(limits.maxTokens >= 1 && limits.maxPrompt >= 1 && limits.prefillBatch >= 1,
        "the token limits and the prefill batch must be at least 1.");
}

void Scheduler::checkPrompts(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths) const
{
    size_t const n = lengths.size();
    argument(n >= 1, "prefill needs at least one prompt (lengths is empty).");
    argument(n <= static_cast<size_t>(mLimits.prefillBatch), "prefill got " + str(int64_t(n)) + " prompts; one "
        "prefill call of this build takes at most " + str(mLimits.prefillBatch) + ".");
    argument(n <= static_cast<size_t>(freeSlots()), "prefill got " + str(int64_t(n)) + " prompts but only "
        + str(freeSlots()) + " of " + str(mLimits.slots) + " slots are free; release a sequence first.");
    int64_t const total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
    for (size_t i = 0; i < n; ++i)
    {
        argument(lengths[i] >= 1, "prompt " + str(int64_t(i)) + " is empty; every prompt needs at least one token.");
        argument(lengths[i] <= mLimits.maxTokens, "prompt " + str(int64_t(i)) + " has " + str(lengths[i])
            + " tokens; a sequence may hold at most " + str(mLimits.maxTokens) + ".");
    }
    argument(total == static_cast<int64_t>(ids.size()), "ids holds " + str(int64_t(ids.size()))
        + " tokens but lengths add up to " + str(total) + ".");
    for (size_t i = 0; mLimits.vocab > 0 && i < ids.size(); ++i)
    {
        argument(ids[i] >= 0 && ids[i] < mLimits.vocab, "token id " + str(ids[i]) + " (position " + str(int64_t(i))
            + " of ids) is outside the vocabulary [0, " + str(mLimits.vocab) + ").");
    }
}

CallInputs Scheduler::emptyCall(bool prefill, int64_t batch, int64_t length, int64_t width) const
{
    CallInputs call;
    call.prefill = prefill;
    call.batch = batch;
    call.length = length;
    call.width = width;
    call.ids.assign(static_cast<size_t>(batch * length), 0);
    call.starts.assign(static_cast<size_t>(batch), 0);
    call.counts.assign(static_cast<size_t>(batch), 0);
    call.table.assign(static_cast<size_t>(batch * width), -1);
    call.slots.assign(static_cast<size_t>(batch), -1);
    call.sampled.assign(static_cast<size_t>(batch), 0);
    return call;
}

void Scheduler::fillRow(CallInputs& call, int64_t row, int slot) const
{
    std::vector<int32_t> const& pages = mPages.pages(slot);
    std::copy(pages.begin(), pages.end(), call.table.begin() + row * call.width);
    call.slots[static_cast<size_t>(row)] = slot;
}

int64_t Scheduler::checkedChunk(int64_t chunk) const
{
    argument(chunk >= 0, "the prefill chunk must be 0 (the prefill profile's " + str(mLimits.maxPrompt)
        + " tokens) or more tokens; got " + str(chunk) + ".");
    return chunk == 0 ? mLimits.maxPrompt : std::min(chunk, mLimits.maxPrompt);
}

std::vector<int> Scheduler::take(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths)
{
    checkPrompts(ids, lengths);
    int64_t needed = 0;
    std::vector<int> chosen;
    for (int s = 0; s < mLimits.slots && chosen.size() < lengths.size(); ++s)
    {
        if (!mSlots[static_cast<size_t>(s)].live)
        {
            needed += mPages.missing(s, lengths[chosen.size()]);
            chosen.push_back(s);
        }
    }
    mPages.checkAvailable(needed);
    for (size_t i = 0; i < chosen.size(); ++i)
    {
        mPages.ensure(chosen[i], lengths[i]);
        mSlots[static_cast<size_t>(chosen[i])] = Slot{true, 0, -1, {}};
    }
    return chosen;
}

std::vector<int> Scheduler::enqueue(std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths)
{
    std::vector<int> const chosen = take(ids, lengths);
    int64_t offset = 0;
    for (size_t i = 0; i < chosen.size(); ++i)
    {
        auto const from = ids.begin() + offset;
        mSlots[static_cast<size_t>(chosen[i])].waiting.assign(from, from + lengths[i]);
        offset += lengths[i];
    }
    return chosen;
}

std::vector<int> Scheduler::waitingSlots() const
{
    std::vector<int> slots;
    for (int s = 0; s < mLimits.slots; ++s)
    {
        if (mSlots[static_cast<size_t>(s)].live && !mSlots[static_cast<size_t>(s)].waiting.empty())
        {
            slots.push_back(s);
        }
    }
    return slots;
}

CallInputs Scheduler::stepCall(int64_t chunk, int64_t tokens)
{
    chunk = checkedChunk(chunk);
    argument(tokens >= 0, "the step's token budget must be 0 (no limit) or more tokens; got " + str(tokens) + ".");
    if (waitingSlots().empty())
    {
        return decodeCall();
    }
    int highest = -1;
    int64_t needed = 0;
    int64_t length = 1;
    for (int s = 0; s < mLimits.slots; ++s)
    {
        Slot const& slot = mSlots[static_cast<size_t>(s)];
        if (!slot.live)
        {
            continue;
        }
        if (!slot.waiting.empty())
        {
            length = std::max<int64_t>(length, std::min<int64_t>(chunk, static_cast<int64_t>(slot.waiting.size())));
            highest = s;
        }
        else if (slot.next >= 0)
        {
            if (slot.cached + 1 > mLimits.maxTokens)
            {
                throw UserError("the sequence in slot " + str(s) + " holds " + str(slot.cached) + " tokens, the most "
                    "a sequence may hold here; release it before the next step.");
            }
            needed += mPages.missing(s, slot.cached + 1);
            highest = s;
        }
    }
    mPages.checkAvailable(needed);
    if (tokens > 0)  // rows x length <= tokens where one token a row allows it
    {
        chunk = std::max<int64_t>(1, std::min<int64_t>(chunk, tokens / (int64_t{highest} + 1)));
        length = std::min(length, chunk);
    }
    if (highest + 1 > mLimits.prefillBatch)
    {
        throw UserError("a step over slots 0 .. " + str(highest) + " has more rows than the prefill profile's batch of "
            + str(mLimits.prefillBatch) + "; open the runtime with at most that many slots.");
    }
    CallInputs call = emptyCall(true, int64_t{highest} + 1, length, mLimits.width());
    for (int s = 0; s <= highest; ++s)
    {
        Slot const& slot = mSlots[static_cast<size_t>(s)];
        size_t const row = static_cast<size_t>(s);
        if (slot.live && !slot.waiting.empty())
        {
            int64_t const count = std::min<int64_t>(chunk, static_cast<int64_t>(slot.waiting.size()));
            std::copy(slot.waiting.begin(), slot.waiting.begin() + count, call.ids.begin() + int64_t{s} * length);
            call.counts[row] = static_cast<int32_t>(count);
            call.sampled[row] = count == static_cast<int64_t>(slot.waiting.size()) ? 1 : 0;
        }
        else if (slot.live && slot.next >= 0)
        {
            mPages.ensure(s, slot.cached + 1);
            call.ids[static_cast<size_t>(int64_t{s} * length)] = slot.next;
            call.counts[row] = 1;
            call.sampled[row] = 1;
        }
        else
        {
            continue;  // an idle row
        }
        call.starts[row] = static_cast<int32_t>(slot.cached);
        fillRow(call, s, s);
    }
    return call;
}

std::vector<CallInputs> Scheduler::admit(
    std::vector<int64_t> const& ids, std::vector<int64_t> const& lengths, int64_t chunk)
{
    chunk = checkedChunk(chunk);
    std::vector<int> const chosen = take(ids, lengths);
    int64_t const longest = *std::max_element(lengths.begin(), lengths.end());
    int64_t width = 1;
    std::vector<int64_t> offsets;  // each prompt's first id in ``ids``
    int64_t offset = 0;
    for (size_t i = 0; i < chosen.size(); ++i)
    {
        width = std::max<int64_t>(width, static_cast<int64_t>(mPages.pages(chosen[i]).size()));
        offsets.push_back(offset);
        offset += lengths[i];
    }
    std::vector<CallInputs> calls;
    for (int64_t first = 0; first < longest; first += chunk)
    {
        int64_t const length = std::min(chunk, longest - first);
        CallInputs call = emptyCall(true, static_cast<int64_t>(lengths.size()), length, width);
        for (size_t i = 0; i < chosen.size(); ++i)
        {
            int64_t const count = std::min(length, lengths[i] - first);
            if (count <= 0)
            {
                continue;  // this prompt is in the caches already: an idle row
            }
            auto const from = ids.begin() + offsets[i] + first;
            std::copy(from, from + count, call.ids.begin() + static_cast<int64_t>(i) * length);
            call.starts[i] = static_cast<int32_t>(first);
            call.counts[i] = static_cast<int32_t>(count);
            call.sampled[i] = first + count == lengths[i] ? 1 : 0;
            fillRow(call, static_cast<int64_t>(i), chosen[i]);
        }
        calls.push_back(std::move(call));
    }
    return calls;
}

std::vector<int64_t> Scheduler::decodeBatches() const
{
    std::vector<int64_t> sizes;
    for (int64_t b = 1; b < mLimits.slots; b *= 2)
    {
        sizes.push_back(b);
    }
    sizes.push_back(mLimits.slots);
    return sizes;
}

CallInputs Scheduler::decodeCall()
{
    int highest = -1;
    int64_t needed = 0;
    for (int s = 0; s < mLimits.slots; ++s)
    {
        Slot const& slot = mSlots[static_cast<size_t>(s)];
        if (slot.live && slot.next >= 0)
        {
            if (slot.cached + 1 > mLimits.maxTokens)
            {
                throw UserError("the sequence in slot " + str(s) + " holds " + str(slot.cached) + " tokens, the most "
                    "a sequence may hold here; release it before the next decode step.");
            }
            needed += mPages.missing(s, slot.cached + 1);
            highest = s;
        }
    }
    argument(highest >= 0, "decode has no sequence to run; prefill a prompt first.");
    mPages.checkAvailable(needed);
    std::vector<int64_t> const sizes = decodeBatches();
    int64_t const batch = *std::lower_bound(sizes.begin(), sizes.end(), int64_t{highest} + 1);
    CallInputs call = emptyCall(false, batch, 1, mLimits.width());
    for (int s = 0; s <= highest; ++s)
    {
        Slot const& slot = mSlots[static_cast<size_t>(s)];
        if (slot.live && slot.next >= 0)
        {
            mPages.ensure(s, slot.cached + 1);
            call.ids[static_cast<size_t>(s)] = slot.next;
            call.starts[static_cast<size_t>(s)] = static_cast<int32_t>(slot.cached);
            call.counts[static_cast<size_t>(s)] = 1;
            call.sampled[static_cast<size_t>(s)] = 1;
            fillRow(call, s, s);
        }
    }
    return call;
}

void Scheduler::commit(CallInputs const& call, std::vector<int64_t> const& chosen)
{
    argument(chosen.size() >= call.slots.size(), "commit needs one chosen token per row of the call.");
    for (size_t row = 0; row < call.slots.size(); ++row)
    {
        int const s = call.slots[row];
        if (s >= 0 && mSlots[static_cast<size_t>(s)].live)
        {
            Slot& slot = mSlots[static_cast<size_t>(s)];
            slot.cached += call.counts[row];
            if (!slot.waiting.empty())  // a stepCall() fed this many of its waiting prompt tokens
            {
                slot.waiting.erase(slot.waiting.begin(), slot.waiting.begin() + call.counts[row]);
            }
            if (call.sampled[row] != 0)
            {
                slot.next = chosen[row];
            }
        }
    }
}

void Scheduler::abandon(CallInputs const& call)
{
    for (int const s : call.slots)
    {
        if (s >= 0 && call.prefill)
        {
            release(s);
        }
    }
}

void Scheduler::checkSlot(int slot) const
{
    argument(slot >= 0 && slot < mLimits.slots, "slot " + str(slot) + " does not exist; the slots are 0 .. "
        + str(mLimits.slots - 1) + ".");
}

void Scheduler::release(int slot)
{
    checkSlot(slot);
    argument(mSlots[static_cast<size_t>(slot)].live, "slot " + str(slot) + " holds no sequence.");
    mSlots[static_cast<size_t>(slot)] = Slot{};
    mPages.release(slot);
}

bool Scheduler::live(int slot) const
{
    return slot >= 0 && slot < mLimits.slots && mSlots[static_cast<size_t>(slot)].live;
}

std::vector<int> Scheduler::liveSlots() const
{
    std::vector<int> slots;
    for (int s = 0; s < mLimits.slots; ++s)
    {
        if (mSlots[static_cast<size_t>(s)].live)
        {
            slots.push_back(s);
        }
    }
    return slots;
}

int Scheduler::freeSlots() const
{
    return mLimits.slots - static_cast<int>(liveSlots().size());
}

int64_t Scheduler::cached(int slot) const
{
    checkSlot(slot);
    return mSlots[static_cast<size_t>(slot)].cached;
}

int64_t Scheduler::next(int slot) const
{
    checkSlot(slot);
    return mSlots[static_cast<size_t>(slot)].next;
}

} // namespace dsa
