// Running a plan (pipeline.h) with TensorRT and the CUDA runtime: one execution context per stage
// on the stage's GPU, one CUDA stream per GPU, the plugin library loaded once per process, links
// copied peer to peer where the GPUs allow it and through pinned host memory otherwise.
#pragma once

#include "pipeline.h"

#include <cstdint>
#include <map>
#include <string>

namespace dsa
{

struct RunOptions
{
    std::string path;     //!< pipeline.json, a build folder, its manifest.json, or an engine file
    std::string plugins;  //!< --plugins (else $DSA_EXPORT_PLUGIN_LIB, else the manifest's plugin_library)
    std::string kernels;  //!< libdsa_kernels.so, the device sampler (else $DSA_EXPORT_KERNELS_LIB, else beside the plugin library)
    Sizes dims;           //!< --dim NAME=SIZE
    std::map<std::string, std::string> inputFiles; //!< --input NAME=FILE (raw little-endian bytes)
    int iterations{1};
    int device{-1};       //!< --device (single-engine mode)
    int generate{0};      //!< --generate N: tokens per sequence over a paged build (0: run the plan)
    float temperature{0.F};  //!< --temperature (with --generate): 0 greedy, else sampled on the device
    float topP{1.F};      //!< --top-p (with --generate)
    uint64_t seed{0};     //!< --seed (with --generate): row b's sequence draws with seed + b
    int prefillChunk{0};  //!< --prefill-chunk (with --generate): prompt tokens per prefill call (0: the profile's max)
};

//! Open every stage, run the plan ``iterations`` times, print timings and the outputs of the last
//! stage. Throws UserError (one sentence) for what the user can fix.
int runPlan(RunOptions const& options);

//! Generation over a paged build (``--generate N``; greedy, or sampled with --temperature/--top-p/--seed): prefill a prompt batch on profile 0,
//! then ``options.generate - 1`` decode steps on profile 1, the cache pools allocated once on each
//! stage's GPU and kept there (generate.cpp). Prints each row's tokens and the tokens/s.
int generatePlan(RunOptions const& options);

} // namespace dsa
