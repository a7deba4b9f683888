// dsa_pipeline_check: read and check what dsa_runtime would run, without TensorRT, CUDA or a GPU.
//
//   dsa_pipeline_check PATH [--devices N] [--device D] [--dim NAME=SIZE ...]
//                      [--runtime-version X.Y.Z] [--compute-capability X.Y]
//
// PATH is what dsa_runtime takes (a pipeline.json, a build folder, a manifest.json or an engine
// file). It prints the stages, their GPUs and shapes, and the links, or one "Error: ..." line and
// exits 1. --devices stands in for the GPU count (default 1); --runtime-version checks each
// engine against a TensorRT version as dsa_runtime checks it against the linked libnvinfer;
// --compute-capability checks every stage's GPU as having that compute capability.

#include "engine_gate.h"
#include "pipeline.h"

#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

namespace
{

int run(int argc, char** argv)
{
    std::string path;
    dsa::PlanOptions options;
    dsa::Sizes dims;
    std::string runtimeVersion;
    std::string computeCapability;
    for (int i = 1; i < argc; ++i)
    {
        std::string const arg = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc)
            {
                throw std::invalid_argument(arg + " needs a value");
            }
            return argv[++i];
        };
        if (arg == "--devices")
        {
            options.deviceCount = std::atoi(next().c_str());
        }
        else if (arg == "--device")
        {
            options.device = std::atoi(next().c_str());
        }
        else if (arg == "--dim")
        {
            dsa::parseDimOption(next(), dims);
        }
        else if (arg == "--runtime-version")
        {
            runtimeVersion = next();
        }
        else if (arg == "--compute-capability")
        {
            computeCapability = next();
        }
        else if (path.empty() && arg.rfind("--", 0) != 0)
        {
            path = arg;
        }
        else
        {
            throw std::invalid_argument("unknown argument " + arg);
        }
    }
    if (path.empty())
    {
        throw std::invalid_argument("usage: dsa_pipeline_check PATH [--devices N] [--device D] [--dim NAME=SIZE ...] "
                                    "[--runtime-version X.Y.Z] [--compute-capability X.Y]");
    }
    dsa::Plan const plan = dsa::readPlan(path, options);
    std::vector<dsa::Sizes> const sizes = dsa::checkShapes(plan, dims);
    for (dsa::Stage const& stage : plan.stages)
    {
        if (!runtimeVersion.empty())
        {
            dsa::checkEngineVersion(stage, dsa::parseVersion(runtimeVersion));
        }
        if (!computeCapability.empty())
        {
            std::vector<int> const cc = dsa::parseVersion(computeCapability);
            if (cc.size() < 2)
            {
                throw std::invalid_argument("--compute-capability takes MAJOR.MINOR, e.g. 9.0");
            }
            dsa::checkComputeCapability(stage, cc[0], cc[1], "as given by --compute-capability");
        }
    }
    std::cout << dsa::describe(plan, sizes) << "OK\n";
    return 0;
}

} // namespace

int main(int argc, char** argv)
{
    try
    {
        return run(argc, argv);
    }
    catch (std::invalid_argument const& e)
    {
        std::cerr << "Error: " << e.what() << "\n";
        return 2;
    }
    catch (std::exception const& e)
    {
        std::cerr << "Error: " << e.what() << "\n";
        return 1;
    }
}
