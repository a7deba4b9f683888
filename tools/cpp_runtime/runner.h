// Running a plan (pipeline.h) with TensorRT and the CUDA runtime: one execution context per stage
// on the stage's GPU, one CUDA stream per GPU, the plugin library loaded once per process, links
// copied peer to peer where the GPUs allow it and through pinned host memory otherwise.
#pragma once

#include "pipeline.h"

#include <map>
#include <string>

namespace dsa
{

struct RunOptions
{
    std::string path;     //!< pipeline.json, a build folder, its manifest.json, or an engine file
    std::string plugins;  //!< --plugins (else $DSA_EXPORT_PLUGIN_LIB, else the manifest's plugin_library)
    Sizes dims;           //!< --dim NAME=SIZE
    std::map<std::string, std::string> inputFiles; //!< --input NAME=FILE (raw little-endian bytes)
    int iterations{1};
    int device{-1};       //!< --device (single-engine mode)
    int generate{0};      //!< --generate N: greedy tokens per sequence over a paged build (0: run the plan)
};

//! Open every stage, run the plan ``iterations`` times, print timings and the outputs of the last
//! stage. Throws UserError (one sentence) for what the user can fix.
int runPlan(RunOptions const& options);

//! Greedy generation over a paged build (``--generate N``): prefill a prompt batch on profile 0,
//! then ``options.generate - 1`` decode steps on profile 1, the cache pools allocated once on each
//! stage's GPU and kept there (generate.cpp). Prints each row's tokens and the tokens/s.
int generatePlan(RunOptions const& options);

} // namespace dsa
