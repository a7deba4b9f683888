// dsa_runtime: run what `dsa-export build` built, from C++.
//
//   dsa_runtime PATH [--plugins LIB] [--dim NAME=SIZE ...] [--input NAME=FILE ...]
//               [--iterations N] [--device GPU]
//               [--generate N [--temperature T] [--top-p P] [--seed S] [--kernels LIB] [--prefill-chunk N]]
//
// PATH is one build (a build folder, its manifest.json, or the engine file beside it) or a
// pipeline of stages (pipeline.json, or the folder holding it, whose stages are build folders).
//
// 1. reads and checks the plan without TensorRT (pipeline.{h,cpp}): each stage's manifest.json
//    (engine file, inputs with their named dynamic dims, the optimization profile, whether the
//    engine needs the DSA plugin library), its GPU ("device" in pipeline.json, default stage index
//    modulo the GPU count; --device for one build) and the links between stages;
// 2. checks what the Python engine gate checks that C++ can see (engine_gate.{h,cpp}): the backend
//    is TensorRT, the linked libnvinfer may load the engine (the same version, or a newer one for
//    version-compatible engines: same major, or TensorRT 10 -> 11 and the other documented pairs),
//    and the stage's GPU has a compute capability the engine was built for;
// 3. on each stage's GPU: creates the runtime, loads the plugin library (once per process,
//    IPluginRegistry::loadLibrary, before deserializing), deserializes and creates the context;
// 4. sets every input shape (linked inputs take the shape of the output feeding them; the others
//    the profile's opt shape unless --dim says otherwise; refused outside the profile), allocates
//    I/O on the stage's GPU, fills the inputs the caller feeds from --input files (raw bytes) or
//    random values, and runs the stages in order with enqueueV3, one stream per GPU; a link's
//    tensor is read in place on the same GPU, copied peer to peer where cudaDeviceCanAccessPeer
//    allows it, else staged through pinned host memory (runner.{h,cpp});
// 5. prints the last stage's outputs (shape, statistics) and the time per stage, link and run.
//
// With --generate N over a paged build (`build --stages K --graph paged`), it generates N tokens
// per row instead (greedy, or with --temperature / --top-p / --seed sampled on the last stage's GPU
// by dsa_sample_tokens of libdsa_kernels.so, --kernels or beside the plugin library), a demo of the runtime library (include/dsa_runtime.h, generate.cpp): a
// prompt of --dim batch=B x --dim sequence=L ids (--input input_ids=FILE or random), one prefill,
// decode steps on the decode profile replayed from CUDA graphs, the cache pools allocated once on
// each stage's GPU and kept there.

#include "host_math.h"
#include "runner.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

namespace
{

char const* const kUsage = "usage: dsa_runtime PATH [--plugins LIB] [--dim NAME=SIZE ...] [--input NAME=FILE ...] "
                           "[--iterations N] [--device GPU] [--generate N [--temperature T] [--top-p P] [--seed S] "
                           "[--kernels LIB] [--prefill-chunk N]]";

float toFloat(std::string const& arg, std::string const& value)
{
    char* end = nullptr;
    float const number = std::strtof(value.c_str(), &end);
    if (value.empty() || *end != '\0')
    {
        throw std::invalid_argument(arg + " takes a number (got '" + value + "')");
    }
    return number;
}

int toInt(std::string const& arg, std::string const& value)
{
    char* end = nullptr;
    long const number = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || number < 0 || number > (1L << 30))
    {
        throw std::invalid_argument(arg + " takes a non-negative integer (got '" + value + "')");
    }
    return static_cast<int>(number);
}

dsa::RunOptions parseArgs(int argc, char** argv)
{
    dsa::RunOptions options;
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
        if (arg == "--plugins")
        {
            options.plugins = next();
        }
        else if (arg == "--dim")
        {
            dsa::parseDimOption(next(), options.dims);
        }
        else if (arg == "--input")
        {
            std::string const item = next();
            auto const eq = item.find('=');
            if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
            {
                throw std::invalid_argument("--input takes NAME=FILE, e.g. input_ids=ids.bin (got '" + item + "')");
            }
            options.inputFiles[item.substr(0, eq)] = item.substr(eq + 1);
        }
        else if (arg == "--iterations")
        {
            options.iterations = std::max(1, toInt(arg, next()));
        }
        else if (arg == "--device")
        {
            options.device = toInt(arg, next());
        }
        else if (arg == "--generate")
        {
            options.generate = toInt(arg, next());
            if (options.generate < 1)
            {
                throw std::invalid_argument("--generate takes the number of tokens to generate, at least 1");
            }
        }
        else if (arg == "--temperature")
        {
            options.temperature = toFloat(arg, next());
        }
        else if (arg == "--top-p")
        {
            options.topP = toFloat(arg, next());
        }
        else if (arg == "--seed")
        {
            std::string const value = next();
            char* end = nullptr;
            options.seed = std::strtoull(value.c_str(), &end, 10);
            if (value.empty() || *end != '\0' || value[0] == '-')
            {
                throw std::invalid_argument("--seed takes a non-negative integer (got '" + value + "')");
            }
        }
        else if (arg == "--kernels")
        {
            options.kernels = next();
        }
        else if (arg == "--prefill-chunk")
        {
            options.prefillChunk = toInt(arg, next());
            if (options.prefillChunk < 1)
            {
                throw std::invalid_argument("--prefill-chunk takes the prompt tokens per prefill call, at least 1");
            }
        }
        else if (arg == "--help" || arg == "-h")
        {
            std::cout << kUsage << "\n";
            std::exit(0);
        }
        else if (options.path.empty() && arg.rfind("--", 0) != 0)
        {
            options.path = arg;
        }
        else
        {
            throw std::invalid_argument("unknown argument " + arg);
        }
    }
    if (options.path.empty())
    {
        throw std::invalid_argument(kUsage);
    }
    dsa::checkSampling(options.temperature, options.topP);
    return options;
}

} // namespace

int main(int argc, char** argv)
{
    try
    {
        dsa::RunOptions const options = parseArgs(argc, argv);
        return options.generate > 0 ? dsa::generatePlan(options) : dsa::runPlan(options);
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
