// The run plan of dsa_runtime: which engines to open on which GPU and which tensors flow between
// them, read from a pipeline.json over per-stage build folders (or from one build's manifest.json)
// and checked before anything touches TensorRT or CUDA.
//
// Plain C++17, no TensorRT or CUDA: dsa_pipeline_check (check_pipeline.cpp) links only this,
// json.cpp and engine_gate.cpp, and tests/test_cpp_runtime.py runs it on pipeline.json fixtures.
//
// pipeline.json (dsa_export/stages/record.py, Pipeline): {"format": "dsa-export-pipeline", "version": 1,
// "stages": [{"index": K, "device": GPU, "build": "stage_KK", ...}], "links": [{"from", "to",
// "output", "input"}]}. "device" defaults to the stage index modulo the GPU count, "build" to
// "stage_KK"; each build folder holds manifest.json (dsa_export/manifest.py, Manifest) whose
// "engine" section names the engine file and how it was built.
#pragma once

#include "json.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dsa
{

using Shape = std::vector<int64_t>; //!< Concrete sizes; -1 where a size is not known (yet).
using Sizes = std::map<std::string, int64_t>; //!< Sizes of named dynamic dims ("batch", "sequence").

struct Dim
{
    int64_t size{-1};   //!< fixed size, or -1 when the dim is named
    std::string name;   //!< dynamic dim name, empty when fixed
};

//! One engine input or output as the manifest records it (manifest.py, TensorSpec).
struct TensorSpec
{
    std::string name;
    std::string dtype; //!< numpy dtype name: "float32", "float16", "bfloat16", "int64", ...
    std::vector<Dim> shape;
    bool hasValueRange{false};
    int64_t low{0};  //!< [low, high) of integer inputs such as token ids
    int64_t high{2};
};

struct DimRange
{
    int64_t min{0};
    int64_t opt{0};
    int64_t max{0};
};

//! The manifest's "engine" section (the keys engine_gate.EngineRequirements reads, plus the file).
struct EngineInfo
{
    std::string path;     //!< the engine file (checked to exist)
    std::string backend;  //!< "tensorrt" (others are refused when the plan is read)
    std::string trtVersion;
    bool versionCompatible{false};
    std::string hardwareCompatibility{"none"};
    std::vector<std::string> computeCapability;
    std::string pluginLibrarySha256; //!< empty: the engine has no plugin layers
    std::string pluginLibrary;       //!< where the build loaded it from (may be empty)
    //! The version-compatible plan carries the plugin library ("plugins_serialized"): TensorRT
    //! loads it from the plan, so the runner neither needs nor loads the file.
    bool pluginsSerialized{false};
};

struct Stage
{
    int index{0};
    int device{0};
    std::string label;     //!< "stage 1 (stage_01)", or "the engine" for a single build
    std::string folder;    //!< the stage's build folder
    std::string manifestPath;
    EngineInfo engine;
    std::vector<TensorSpec> inputs;
    std::vector<TensorSpec> outputs;
    std::map<std::string, DimRange> profile; //!< manifest "profiles"."dims"

    TensorSpec const* input(std::string const& name) const;
    TensorSpec const* output(std::string const& name) const;
};

//! ``output`` of stage ``from`` feeds ``input`` of stage ``to`` (dsa_export/stages/record.py, StageLink).
struct Link
{
    int from{0};
    int to{0};
    std::string output;
    std::string input;

    std::string label() const; //!< "0.hidden_states_out -> 1.hidden_states"
};

struct Plan
{
    std::string source;    //!< the pipeline.json or manifest.json read
    bool pipeline{false};  //!< false: one build folder (single-engine mode)
    std::vector<Stage> stages;
    std::vector<Link> links;

    //! The link feeding ``input`` of stage ``stage``, or nullptr when the caller feeds it.
    Link const* linkInto(int stage, std::string const& input) const;
};

struct PlanOptions
{
    int deviceCount{1};  //!< GPUs visible (cudaGetDeviceCount)
    int device{-1};      //!< single-engine mode: the GPU (default 0); ignored for pipelines
};

//! Read and check ``path``: a pipeline.json, a folder holding one, a manifest.json, a build folder
//! holding one, or an engine file with manifest.json beside it. UserError (one sentence) for a
//! missing stage build or engine, a device index past ``deviceCount``, a link naming an unknown
//! stage or tensor, tensors of different dtypes on a link, or a malformed field.
Plan readPlan(std::string const& path, PlanOptions const& options);

//! The sizes of the named dims for ``stage``: its profile's opt values, then ``overrides`` (--dim).
Sizes stageSizes(Stage const& stage, Sizes const& overrides);

//! ``spec``'s shape with named dims taken from ``sizes`` (-1 where ``sizes`` has no value).
Shape resolve(TensorSpec const& spec, Sizes const& sizes);

//! Check that ``given`` (the shape of the linked output) fits ``input`` of ``stage`` (rank, fixed
//! sizes, the profile range of named dims) and record the named dims it sets in ``sizes``.
//! ``bound`` remembers which link set a dim first, so two links disagreeing on it are refused.
//! UserError "shape mismatch on link ...".
void bindLinkedInput(Stage const& stage, TensorSpec const& input, Shape const& given, Link const& link, Sizes& sizes,
    std::map<std::string, std::string>& bound);

//! UserError when a concrete ``shape`` of ``spec`` (an input of ``stage``) has a named dim outside
//! the profile or an unknown size.
void checkInputShape(Stage const& stage, TensorSpec const& spec, Shape const& shape);

//! Static shape check of the whole plan: every stage's input shapes from its sizes and the shapes
//! its linked outputs resolve to (dims an output's spec leaves unknown are checked at run time
//! against the engine's real shapes). Returns each stage's sizes.
std::vector<Sizes> checkShapes(Plan const& plan, Sizes const& overrides);

//! UserError when TensorRT ``runtime`` (major, minor, patch) may not load ``stage``'s engine
//! (engine_gate.h, runtimeAccepts).
void checkEngineVersion(Stage const& stage, std::vector<int> const& runtime);

//! UserError when GPU ``gpuName`` of compute capability major.minor cannot run ``stage``'s engine.
void checkComputeCapability(Stage const& stage, int major, int minor, std::string const& gpuName);

//! Parse "NAME=SIZE" (--dim) into ``sizes``; std::invalid_argument (usage error) when malformed.
void parseDimOption(std::string const& item, Sizes& sizes);

std::string toString(Shape const& shape);

//! A few lines naming each stage, its GPU, engine and I/O shapes, and each link.
std::string describe(Plan const& plan, std::vector<Sizes> const& sizes);

} // namespace dsa
