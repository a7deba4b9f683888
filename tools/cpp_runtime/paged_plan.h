// A paged build read as a plan (pipeline.h) and checked for serving: every stage is a paged graph
// (docs/hf.md, "The paged graph"), and the slots, tokens and cache pages asked for fit every
// stage's profile. Plain C++17, no TensorRT or CUDA (tested by host_test.cpp).
#pragma once

#include "pipeline.h"
#include "scheduler.h"

#include <string>

namespace dsa
{

//! A cache pool input: past_*_pool_*.
bool isPool(std::string const& name);

//! An input the runtime writes per call: input_ids, query_start, query_lengths, block_table.
bool isControl(std::string const& name);

//! present_*_pool_i for past_*_pool_i.
std::string presentOf(std::string const& past);

//! UserError unless every stage is a paged graph whose inputs the runtime can feed (controls,
//! pools, links), the first takes input_ids and the last returns logits.
void checkPagedPlan(Plan const& plan);

//! What the caller asks for; 0 means the build's own limit.
struct PagedRequest
{
    int slots{0};          //!< sequences at once (default: the profiles' batch max)
    int64_t maxTokens{0};  //!< tokens per sequence (default: max_pages x page)
    int64_t pages{0};      //!< pages per pool, scratch included (default: what the slots can fill, capped by the profile)
};

//! The limits of serving ``plan`` (checked with checkPagedPlan) as ``request`` asks; UserError
//! when the request exceeds a stage's profile or the stages' pools disagree on their page size.
SchedulerLimits pagedLimits(Plan const& plan, PagedRequest const& request);

} // namespace dsa
