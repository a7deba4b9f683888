/*
 * Host-only smoke test of libdsa_plugins.so: dlopen it like TensorRT does, resolve getCreators and
 * setLoggerFinder, then exercise the creators and the build/runtime capabilities that need no GPU
 * and no libnvinfer (field parsing and serialization round trip, format combinations, output
 * types, workspace sizing, clone). Prints one line per check; exit code 0 when all pass.
 *
 *   dsa_plugin_smoke /path/to/libdsa_plugins.so
 */
#include "NvInferRuntime.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace
{
int gFailures = 0;

void check(bool ok, std::string const& what)
{
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    if (!ok)
    {
        ++gFailures;
    }
}

class CountingLogger : public ILogger
{
public:
    void log(Severity severity, AsciiChar const* msg) noexcept override
    {
        if (severity <= Severity::kERROR)
        {
            ++errors;
        }
        std::printf("  [log %d] %s\n", static_cast<int>(severity), msg);
    }
    int errors{0};
};

class Finder : public ILoggerFinder
{
public:
    explicit Finder(ILogger* logger)
        : mLogger(logger)
    {
    }
    ILogger* findLogger() override
    {
        return mLogger;
    }

private:
    ILogger* mLogger;
};

DynamicPluginTensorDesc makeDesc(std::vector<int64_t> const& dims, DataType type)
{
    DynamicPluginTensorDesc d{};
    d.desc.dims.nbDims = static_cast<int32_t>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i)
    {
        d.desc.dims.d[i] = dims[i];
    }
    d.desc.type = type;
    d.desc.format = TensorFormat::kLINEAR;
    d.min = d.desc.dims;
    d.max = d.desc.dims;
    d.opt = d.desc.dims;
    return d;
}

IPluginCreatorV3One* findCreator(IPluginCreatorInterface* const* creators, int32_t n, char const* name)
{
    for (int32_t i = 0; i < n; ++i)
    {
        auto* c = static_cast<IPluginCreatorV3One*>(creators[i]);
        if (std::strcmp(c->getPluginName(), name) == 0)
        {
            return c;
        }
    }
    return nullptr;
}
} // namespace

int main(int argc, char** argv)
{
    if (argc != 2)
    {
        std::fprintf(stderr, "usage: %s libdsa_plugins.so\n", argv[0]);
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    check(lib != nullptr, std::string("dlopen ") + argv[1] + (lib ? "" : std::string(": ") + dlerror()));
    if (lib == nullptr)
    {
        return 1;
    }
    using GetCreators = IPluginCreatorInterface* const* (*) (int32_t&);
    using SetLoggerFinder = void (*)(ILoggerFinder*);
    auto getCreators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
    auto setLoggerFinder = reinterpret_cast<SetLoggerFinder>(dlsym(lib, "setLoggerFinder"));
    check(getCreators != nullptr, "getCreators exported");
    check(setLoggerFinder != nullptr, "setLoggerFinder exported");
    if (getCreators == nullptr || setLoggerFinder == nullptr)
    {
        return 1;
    }
    CountingLogger logger;
    Finder finder(&logger);
    setLoggerFinder(&finder);

    int32_t n = 0;
    IPluginCreatorInterface* const* creators = getCreators(n);
    check(n == 2, "two creators");
    for (int32_t i = 0; i < n; ++i)
    {
        InterfaceInfo const info = creators[i]->getInterfaceInfo();
        check(std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") == 0, std::string("creator kind ") + info.kind);
        auto* c = static_cast<IPluginCreatorV3One*>(creators[i]);
        check(std::strcmp(c->getPluginNamespace(), "dsa") == 0 && std::strcmp(c->getPluginVersion(), "1") == 0,
            std::string(c->getPluginName()) + " namespace dsa, version 1");
    }

    // ---- DSAIndexerTopK ----
    IPluginCreatorV3One* ix = findCreator(creators, n, "DSAIndexerTopK");
    check(ix != nullptr, "DSAIndexerTopK creator");
    if (ix != nullptr)
    {
        int32_t topk = 2048;
        float scale = 0.088388F;
        int32_t causal = 1;
        char const ns[] = "dsa";
        std::vector<PluginField> fields{{"topk", &topk, PluginFieldType::kINT32, 1},
            {"scale", &scale, PluginFieldType::kFLOAT32, 1}, {"causal", &causal, PluginFieldType::kINT32, 1},
            {"unknown_extra", ns, PluginFieldType::kCHAR, 4}};
        PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.data()};
        IPluginV3* plugin = ix->createPlugin("ix", &fc, TensorRTPhase::kBUILD);
        check(plugin != nullptr, "DSAIndexerTopK createPlugin with an extra unknown field");
        if (plugin != nullptr)
        {
            auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
            auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
            auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
            check(core && build && rt, "DSAIndexerTopK exposes core/build/runtime");
            check(std::strcmp(core->getPluginName(), "DSAIndexerTopK") == 0, "DSAIndexerTopK plugin name");
            check(build->getNbOutputs() == 1, "DSAIndexerTopK one output");

            std::vector<DynamicPluginTensorDesc> io{makeDesc({2, 16, 64, 128}, DataType::kBF16),
                makeDesc({2, 4096, 128}, DataType::kBF16), makeDesc({2, 16, 64}, DataType::kFLOAT),
                makeDesc({2}, DataType::kINT32), makeDesc({2, 16, 2048}, DataType::kINT32)};
            bool all = true;
            for (int32_t pos = 0; pos < 5; ++pos)
            {
                all = all && build->supportsFormatCombination(pos, io.data(), 4, 1);
            }
            check(all, "DSAIndexerTopK accepts bf16 q/k, fp32 w, int32 lengths and output");
            io[1].desc.type = DataType::kHALF;
            check(!build->supportsFormatCombination(1, io.data(), 4, 1), "DSAIndexerTopK rejects k dtype != q dtype");
            io[1].desc.type = DataType::kBF16;
            io[4].desc.type = DataType::kFLOAT;
            check(!build->supportsFormatCombination(4, io.data(), 4, 1), "DSAIndexerTopK rejects float output");
            io[4].desc.type = DataType::kINT32;

            DataType inTypes[4] = {DataType::kBF16, DataType::kBF16, DataType::kFLOAT, DataType::kINT32};
            DataType outType = DataType::kFLOAT;
            check(build->getOutputDataTypes(&outType, 1, inTypes, 4) == 0 && outType == DataType::kINT32,
                "DSAIndexerTopK output type int32");
            check(build->configurePlugin(io.data(), 4, io.data() + 4, 1) == 0, "DSAIndexerTopK configurePlugin");
            size_t const ws = build->getWorkspaceSize(io.data(), 4, io.data() + 4, 1);
            check(ws == size_t{2} * 16 * 4096 * 4, "DSAIndexerTopK workspace = B*S*T*4 for small shapes (" + std::to_string(ws) + ")");
            std::vector<DynamicPluginTensorDesc> bad{makeDesc({2, 16, 64, 128}, DataType::kBF16),
                makeDesc({2, 4096, 64}, DataType::kBF16), makeDesc({2, 16, 64}, DataType::kFLOAT),
                makeDesc({2, 16, 2048}, DataType::kINT32)};
            int const errorsBefore = logger.errors;
            check(build->configurePlugin(bad.data(), 3, bad.data() + 3, 1) != 0 && logger.errors > errorsBefore,
                "DSAIndexerTopK configurePlugin rejects D mismatch with a logged error");

            PluginFieldCollection const* ser = rt->getFieldsToSerialize();
            IPluginV3* again = ix->createPlugin("ix2", ser, TensorRTPhase::kRUNTIME);
            check(again != nullptr, "DSAIndexerTopK round trip through getFieldsToSerialize");
            if (again != nullptr)
            {
                auto* b2 = static_cast<IPluginV3OneBuild*>(again->getCapabilityInterface(PluginCapabilityType::kBUILD));
                check(std::strcmp(b2->getMetadataString(), build->getMetadataString()) == 0,
                    std::string("DSAIndexerTopK attributes survive serialization: ") + b2->getMetadataString());
                delete again;
            }
            IPluginV3* cl = plugin->clone();
            check(cl != nullptr, "DSAIndexerTopK clone");
            delete cl;
            delete plugin;
        }
        std::vector<PluginField> missing{{"scale", &scale, PluginFieldType::kFLOAT32, 1}};
        PluginFieldCollection fcMissing{1, missing.data()};
        int const errorsBefore = logger.errors;
        check(ix->createPlugin("bad", &fcMissing, TensorRTPhase::kBUILD) == nullptr && logger.errors > errorsBefore,
            "DSAIndexerTopK createPlugin without topk fails with a logged error");
        int64_t topk64 = 16;
        double scale64 = 0.5;
        std::vector<PluginField> wide{{"topk", &topk64, PluginFieldType::kINT64, 1},
            {"scale", &scale64, PluginFieldType::kFLOAT64, 1}};
        PluginFieldCollection fcWide{2, wide.data()};
        IPluginV3* p64 = ix->createPlugin("wide", &fcWide, TensorRTPhase::kBUILD);
        check(p64 != nullptr, "DSAIndexerTopK accepts int64/float64 attributes");
        delete p64;
    }

    // ---- DSASparseAttention ----
    IPluginCreatorV3One* sa = findCreator(creators, n, "DSASparseAttention");
    check(sa != nullptr, "DSASparseAttention creator");
    if (sa != nullptr)
    {
        float scale = 0.0416667F;
        std::vector<PluginField> fields{{"scale", &scale, PluginFieldType::kFLOAT32, 1}};
        PluginFieldCollection fc{1, fields.data()};
        IPluginV3* plugin = sa->createPlugin("sa", &fc, TensorRTPhase::kBUILD);
        check(plugin != nullptr, "DSASparseAttention createPlugin");
        if (plugin != nullptr)
        {
            auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
            auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
            std::vector<DynamicPluginTensorDesc> io{makeDesc({1, 8, 128, 576}, DataType::kHALF),
                makeDesc({1, 4096, 1, 576}, DataType::kHALF), makeDesc({1, 4096, 1, 512}, DataType::kHALF),
                makeDesc({1, 8, 2048}, DataType::kINT32), makeDesc({1, 8, 128, 512}, DataType::kHALF)};
            bool all = true;
            for (int32_t pos = 0; pos < 5; ++pos)
            {
                all = all && build->supportsFormatCombination(pos, io.data(), 4, 1);
            }
            check(all, "DSASparseAttention accepts fp16 q/k/v/out and int32 indices");
            io[4].desc.type = DataType::kFLOAT;
            check(!build->supportsFormatCombination(4, io.data(), 4, 1), "DSASparseAttention rejects out dtype != q");
            io[4].desc.type = DataType::kHALF;
            DataType inTypes[4] = {DataType::kBF16, DataType::kBF16, DataType::kBF16, DataType::kINT32};
            DataType outType = DataType::kFLOAT;
            check(build->getOutputDataTypes(&outType, 1, inTypes, 4) == 0 && outType == DataType::kBF16,
                "DSASparseAttention output type follows q");
            check(build->configurePlugin(io.data(), 4, io.data() + 4, 1) == 0, "DSASparseAttention configurePlugin");
            check(build->getWorkspaceSize(io.data(), 4, io.data() + 4, 1) == 0, "DSASparseAttention needs no workspace");
            std::vector<DynamicPluginTensorDesc> bad{makeDesc({1, 8, 100, 576}, DataType::kHALF),
                makeDesc({1, 4096, 3, 576}, DataType::kHALF), makeDesc({1, 4096, 3, 512}, DataType::kHALF),
                makeDesc({1, 8, 2048}, DataType::kINT32), makeDesc({1, 8, 100, 512}, DataType::kHALF)};
            check(build->configurePlugin(bad.data(), 4, bad.data() + 4, 1) != 0,
                "DSASparseAttention rejects H not a multiple of Hkv");
            IPluginV3* again = sa->createPlugin("sa2", rt->getFieldsToSerialize(), TensorRTPhase::kRUNTIME);
            check(again != nullptr, "DSASparseAttention round trip through getFieldsToSerialize");
            if (again != nullptr)
            {
                auto* b2 = static_cast<IPluginV3OneBuild*>(again->getCapabilityInterface(PluginCapabilityType::kBUILD));
                check(std::strcmp(b2->getMetadataString(), build->getMetadataString()) == 0,
                    std::string("DSASparseAttention attributes survive serialization: ") + b2->getMetadataString());
                delete again;
            }
            delete plugin;
        }
    }
    std::printf("%s: %d failure(s)\n", gFailures == 0 ? "OK" : "FAILED", gFailures);
    return gFailures == 0 ? 0 : 1;
}
