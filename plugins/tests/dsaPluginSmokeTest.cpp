/*
 * Host-only smoke test of libdsa_plugins.so: dlopen it like TensorRT does, resolve getCreators and
 * setLoggerFinder, then exercise the creators and the build/runtime capabilities that need no GPU
 * and no libnvinfer (field parsing and serialization round trip, attribute validation, format
 * combinations, output types and shapes, shape validation, workspace sizing, clone). Prints one
 * line per check; exit code 0 when all pass.
 *
 * With a second argument, a static-registration library (libdsa_plugins_static.so, or the build's
 * tests/libdsa_plugins_static_check.so linked against the stand-in libnvinfer of
 * dsaFakeNvinfer.cpp), it also dlopens that library, whose load registers its creators, and looks
 * each one up in the plugin registry of the libnvinfer it links as ("DSA...", "1", "dsa").
 *
 * The plugin names and their count come from the library's one list, api/dsaCreators.h (only
 * compile-time constants of it are used: nothing of the library is linked).
 *
 *   dsa_plugin_smoke /path/to/libdsa_plugins.so [/path/to/static-registration library]
 */
#include "NvInferRuntime.h"

#include "api/dsaCreators.h"

#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
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
            lastError = msg;
        }
        std::printf("  [log %d] %s\n", static_cast<int>(severity), msg);
    }
    int errors{0};
    std::string lastError;
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

//! Stand-ins for TensorRT's dimension expressions: getOutputShapes only passes input expressions
//! through, so distinct objects whose identity is checked are enough (their methods are never called).
class FakeDimExpr : public IDimensionExpr
{
};

class FakeExprBuilder : public IExprBuilder
{
};

DimsExprs makeExprs(std::vector<FakeDimExpr> const& dims)
{
    DimsExprs e{};
    e.nbDims = static_cast<int32_t>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i)
    {
        e.d[i] = &dims[i];
    }
    return e;
}

PluginField const* findField(PluginFieldCollection const* fc, char const* name)
{
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
    {
        if (std::strcmp(fc->fields[i].name, name) == 0)
        {
            return &fc->fields[i];
        }
    }
    return nullptr;
}

bool allFormats(IPluginV3OneBuild* build, std::vector<DynamicPluginTensorDesc> const& io, int32_t nbInputs)
{
    bool all = true;
    for (int32_t pos = 0; pos < nbInputs + 1; ++pos)
    {
        all = all && build->supportsFormatCombination(pos, io.data(), nbInputs, 1);
    }
    return all;
}

//! The workspace formula of the plugin README, for one pass over `tokens` tokens.
size_t moeWorkspaceFormula(int64_t tokens, int64_t K, int64_t E, int64_t H, int64_t I, size_t actElem)
{
    auto up = [](size_t v) { return (v + 255) / 256 * 256; };
    int64_t const S = tokens * K;
    int64_t chunks = (S + 255) / 256;
    chunks = chunks < 1 ? 1 : (chunks > 64 ? 64 : chunks);
    size_t const pass = up(static_cast<size_t>(chunks * E) * 4) + 2 * up(static_cast<size_t>(E + 1) * 4)
        + up(static_cast<size_t>(S) * 4) + up(static_cast<size_t>(S * I) * actElem) + up(static_cast<size_t>(S * H) * 4)
        + 256;
    size_t const cap = size_t{1} << 30;
    return pass < cap ? pass : cap;
}

using dsa::plugin::DSAPlugins;

//! The paged plugins (DSAIndexerTopKPaged, DSASparseAttentionPaged): fields, formats, shapes,
//! workspace, serialization, and enqueue up to the launcher (no GPU: the launcher's device query
//! fails, with a logged error, after the glue's own checks).
void checkPagedPlugins(IPluginCreatorInterface* const* creators, int32_t n, CountingLogger& logger);

//! DSAPagedCacheWrite: no fields, formats, output type and shape (the pool's), the output aliased to
//! the pool (getAliasedInput(0) == 0 on build capability version 2; the other plugins keep version 1),
//! serialization, and enqueue: the pool is copied only when the output is not the pool's buffer.
void checkPagedCacheWritePlugin(IPluginCreatorInterface* const* creators, int32_t n, CountingLogger& logger);


//! Loads a static-registration library and finds its creators in the registry of its libnvinfer
//! under namespace "dsa" (and not under "", where REGISTER_TENSORRT_PLUGIN would have put them).
void checkStaticRegistration(char const* path)
{
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    check(lib != nullptr, std::string("dlopen ") + path + (lib ? "" : std::string(": ") + dlerror()));
    if (lib == nullptr)
    {
        return;
    }
    // dlsym on the handle searches the library, then its dependencies: getPluginRegistry is the one
    // of the libnvinfer the library was linked against (the stand-in one in the CPU build).
    using GetRegistry = IPluginRegistry* (*) ();
    auto getRegistry = reinterpret_cast<GetRegistry>(dlsym(lib, "getPluginRegistry"));
    check(getRegistry != nullptr, "static library: getPluginRegistry resolves through its libnvinfer");
    IPluginRegistry* registry = getRegistry != nullptr ? getRegistry() : nullptr;
    if (registry == nullptr)
    {
        return;
    }
    for (char const* name : DSAPlugins::kNAMES)
    {
        IPluginCreatorInterface* found = registry->getCreator(name, "1", "dsa");
        bool ok = found != nullptr && std::strcmp(found->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0;
        if (ok)
        {
            auto* c = static_cast<IPluginCreatorV3One*>(found);
            ok = std::strcmp(c->getPluginName(), name) == 0 && std::strcmp(c->getPluginVersion(), "1") == 0
                && std::strcmp(c->getPluginNamespace(), "dsa") == 0 && c->getFieldNames() != nullptr;
        }
        check(ok, std::string("static registration: (") + name + ", 1, dsa) is found and reports namespace dsa");
        check(registry->getCreator(name, "1", "") == nullptr,
            std::string("static registration: ") + name + " is not registered under the empty namespace");
    }
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
    if (argc != 2 && argc != 3)
    {
        std::fprintf(stderr, "usage: %s libdsa_plugins.so [static-registration library]\n", argv[0]);
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
    check(n == DSAPlugins::kSIZE,
        "getCreators reports the " + std::to_string(DSAPlugins::kSIZE) + " creators of api/dsaCreators.h");
    for (char const* name : DSAPlugins::kNAMES)
    {
        check(findCreator(creators, n, name) != nullptr, std::string("getCreators has ") + name);
    }
    for (int32_t i = 0; i < n; ++i)
    {
        InterfaceInfo const info = creators[i]->getInterfaceInfo();
        check(std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") == 0, std::string("creator kind ") + info.kind);
        auto* c = static_cast<IPluginCreatorV3One*>(creators[i]);
        check(std::strcmp(c->getPluginNamespace(), "dsa") == 0 && std::strcmp(c->getPluginVersion(), "1") == 0,
            std::string(c->getPluginName()) + " namespace dsa, version 1");
    }
    if (argc == 3)
    {
        checkStaticRegistration(argv[2]);
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
            // The scores of every row (B*S*T*4 bytes for small shapes), or the multi-block top-k's
            // state for min(B*S, 8) rows when that is more (dsaIndexerTopKKernel.cu).
            check(ws >= size_t{2} * 16 * 4096 * 4 && ws <= size_t{2} * 16 * 4096 * 4 + (size_t{1} << 20),
                "DSAIndexerTopK workspace = max(B*S*T*4, the multi-block state) for small shapes (" + std::to_string(ws)
                    + ")");
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
            // Values from keys: v [B,0,Hkv,Dv] (DeepSeek's absorbed MLA, Dk = 576, Dv = 512).
            std::vector<DynamicPluginTensorDesc> vfk{makeDesc({1, 8, 128, 576}, DataType::kBF16),
                makeDesc({1, 4096, 1, 576}, DataType::kBF16), makeDesc({1, 0, 1, 512}, DataType::kBF16),
                makeDesc({1, 8, 2048}, DataType::kINT32), makeDesc({1, 8, 128, 512}, DataType::kBF16)};
            check(allFormats(build, vfk, 4), "DSASparseAttention accepts an empty bf16 v (values from keys)");
            check(build->configurePlugin(vfk.data(), 4, vfk.data() + 4, 1) == 0,
                "DSASparseAttention configurePlugin takes v [1,0,1,512] with k [1,4096,1,576]");
            {
                std::vector<PluginTensorDesc> rtDesc;
                for (DynamicPluginTensorDesc const& d : vfk)
                {
                    rtDesc.push_back(d.desc);
                }
                check(rt->onShapeChange(rtDesc.data(), 4, rtDesc.data() + 4, 1) == 0,
                    "DSASparseAttention onShapeChange takes the empty v");
            }
            std::vector<DynamicPluginTensorDesc> vfkDyn = vfk;
            vfkDyn[0].desc.dims.d[1] = -1;
            vfkDyn[1].desc.dims.d[1] = -1;
            vfkDyn[3].desc.dims.d[1] = -1;
            vfkDyn[4].desc.dims.d[1] = -1;
            check(build->configurePlugin(vfkDyn.data(), 4, vfkDyn.data() + 4, 1) == 0,
                "DSASparseAttention configurePlugin takes the empty v with dynamic S and T");
            {
                std::vector<FakeDimExpr> qd(4), kd(4), vd(4), id(3);
                DimsExprs ins[4] = {makeExprs(qd), makeExprs(kd), makeExprs(vd), makeExprs(id)};
                DimsExprs outs[1]{};
                FakeExprBuilder exprBuilder;
                check(build->getOutputShapes(ins, 4, nullptr, 0, outs, 1, exprBuilder) == 0 && outs[0].nbDims == 4
                        && outs[0].d[0] == &qd[0] && outs[0].d[1] == &qd[1] && outs[0].d[2] == &qd[2]
                        && outs[0].d[3] == &vd[3],
                    "DSASparseAttention output shape is [B,S,H] of q and Dv of v (also of an empty v)");
            }
            std::vector<DynamicPluginTensorDesc> wide = vfk;
            wide[2] = makeDesc({1, 0, 1, 640}, DataType::kBF16);
            wide[4] = makeDesc({1, 8, 128, 640}, DataType::kBF16);
            int errorsBefore = logger.errors;
            check(build->configurePlugin(wide.data(), 4, wide.data() + 4, 1) != 0 && logger.errors > errorsBefore
                    && logger.lastError.find("Dv <= Dk") != std::string::npos,
                "DSASparseAttention rejects an empty v with Dv = 640 > Dk = 576 with a logged error");
            std::vector<DynamicPluginTensorDesc> partial = vfk;
            partial[2] = makeDesc({1, 100, 1, 512}, DataType::kBF16);
            errorsBefore = logger.errors;
            check(build->configurePlugin(partial.data(), 4, partial.data() + 4, 1) != 0 && logger.errors > errorsBefore
                    && logger.lastError.find("0 rows") != std::string::npos,
                "DSASparseAttention rejects v with 0 < Tv < T rows (only the function body takes it)");
            std::vector<DynamicPluginTensorDesc> noKeys = wide;
            noKeys[1] = makeDesc({1, 0, 1, 576}, DataType::kBF16);
            check(build->configurePlugin(noKeys.data(), 4, noKeys.data() + 4, 1) == 0,
                "DSASparseAttention takes T = 0 with an empty v of any Dv (nothing is read)");
            {
                // enqueue of the empty-v form with a null v address (TensorRT may bind an empty
                // input to nullptr): the launcher must accept it and fail only at a later check that
                // needs no GPU (Hkv * H over the grid limit), not at "a required pointer is null".
                std::vector<PluginTensorDesc> big;
                for (DynamicPluginTensorDesc const& d : vfk)
                {
                    big.push_back(d.desc);
                }
                big[0].dims.d[2] = 1024;
                big[1].dims.d[2] = 128;
                big[2].dims.d[2] = 128;
                big[4].dims.d[2] = 1024;
                alignas(16) static unsigned char fake[64];
                void const* ins[4] = {fake, fake, nullptr, fake};
                void* outs[1] = {fake};
                errorsBefore = logger.errors;
                int32_t const st = rt->enqueue(big.data(), big.data() + 4, ins, outs, nullptr, nullptr);
                check(st != 0 && logger.errors > errorsBefore && logger.lastError.find("grid limits") != std::string::npos,
                    "DSASparseAttention enqueue passes a null v address as values from keys (" + logger.lastError + ")");
                big[2].dims.d[3] = 640;
                errorsBefore = logger.errors;
                check(rt->enqueue(big.data(), big.data() + 4, ins, outs, nullptr, nullptr) != 0
                        && logger.lastError.find("Dv <= Dk") != std::string::npos,
                    "DSASparseAttention enqueue refuses values from keys with Dv > Dk before any launch");
                big[2].dims.d[1] = 7;
                check(rt->enqueue(big.data(), big.data() + 4, ins, outs, nullptr, nullptr) != 0
                        && logger.lastError.find("rows") != std::string::npos,
                    "DSASparseAttention enqueue refuses v with 0 < Tv < T rows");
            }

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
        float nan = std::nanf("");
        std::vector<PluginField> nanFields{{"scale", &nan, PluginFieldType::kFLOAT32, 1}};
        PluginFieldCollection fcNan{1, nanFields.data()};
        int const errorsBefore = logger.errors;
        check(sa->createPlugin("nan", &fcNan, TensorRTPhase::kBUILD) == nullptr && logger.errors > errorsBefore,
            "DSASparseAttention createPlugin rejects a scale that is not finite with a logged error");
    }

    // ---- DSABlockSparseAttention ----
    IPluginCreatorV3One* bsa = findCreator(creators, n, "DSABlockSparseAttention");
    check(bsa != nullptr, "DSABlockSparseAttention creator");
    if (bsa != nullptr)
    {
        PluginFieldCollection const* names = bsa->getFieldNames();
        check(names != nullptr && names->nbFields == 3 && findField(names, "block_size") != nullptr
                && findField(names, "scale") != nullptr && findField(names, "causal") != nullptr,
            "DSABlockSparseAttention declares 'block_size', 'scale' and 'causal'");
        int32_t blockSize = 64;
        float scale = 0.125F;
        int32_t causal = 1;
        std::vector<PluginField> fields{{"block_size", &blockSize, PluginFieldType::kINT32, 1},
            {"scale", &scale, PluginFieldType::kFLOAT32, 1}, {"causal", &causal, PluginFieldType::kINT32, 1}};
        PluginFieldCollection fc{3, fields.data()};
        IPluginV3* plugin = bsa->createPlugin("bsa", &fc, TensorRTPhase::kBUILD);
        check(plugin != nullptr, "DSABlockSparseAttention createPlugin");
        if (plugin != nullptr)
        {
            auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
            auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
            auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
            check(core && build && rt, "DSABlockSparseAttention exposes core/build/runtime");
            check(std::strcmp(core->getPluginName(), "DSABlockSparseAttention") == 0
                    && std::strcmp(core->getPluginNamespace(), "dsa") == 0 && std::strcmp(core->getPluginVersion(), "1") == 0,
                "DSABlockSparseAttention plugin name, namespace dsa, version 1");
            check(build->getNbOutputs() == 1, "DSABlockSparseAttention one output");
            check(std::strcmp(build->getMetadataString(), "block_size=64;scale=0.125000;causal=1") == 0,
                std::string("DSABlockSparseAttention metadata: ") + build->getMetadataString());

            // 4096 queries over 4096 keys in blocks of 64 (64 query blocks), 16 heads sharing one kv
            // head, 8 key blocks per query block.
            std::vector<DynamicPluginTensorDesc> io{makeDesc({1, 4096, 16, 128}, DataType::kBF16),
                makeDesc({1, 4096, 1, 128}, DataType::kBF16), makeDesc({1, 4096, 1, 128}, DataType::kBF16),
                makeDesc({1, 16, 64, 8}, DataType::kINT32), makeDesc({1, 4096, 16, 128}, DataType::kBF16)};
            check(allFormats(build, io, 4), "DSABlockSparseAttention accepts bf16 q/k/v/out and int32 block_index");
            io[4].desc.type = DataType::kFLOAT;
            check(!build->supportsFormatCombination(4, io.data(), 4, 1), "DSABlockSparseAttention rejects out dtype != q");
            io[4].desc.type = DataType::kBF16;
            io[1].desc.type = DataType::kHALF;
            check(!build->supportsFormatCombination(1, io.data(), 4, 1), "DSABlockSparseAttention rejects k dtype != q");
            io[1].desc.type = DataType::kBF16;
            io[3].desc.type = DataType::kINT64;
            check(!build->supportsFormatCombination(3, io.data(), 4, 1), "DSABlockSparseAttention rejects int64 block_index");
            io[3].desc.type = DataType::kINT32;
            io[0].desc.format = TensorFormat::kHWC8;
            check(!build->supportsFormatCombination(0, io.data(), 4, 1), "DSABlockSparseAttention rejects non-linear formats");
            io[0].desc.format = TensorFormat::kLINEAR;
            std::vector<DynamicPluginTensorDesc> f32{makeDesc({2, 100, 4, 40}, DataType::kFLOAT),
                makeDesc({2, 130, 2, 40}, DataType::kFLOAT), makeDesc({2, 130, 2, 24}, DataType::kFLOAT),
                makeDesc({2, 4, 2, 3}, DataType::kINT32), makeDesc({2, 100, 4, 24}, DataType::kFLOAT)};
            check(allFormats(build, f32, 4), "DSABlockSparseAttention accepts an all-float32 combination");
            check(!build->supportsFormatCombination(0, io.data(), 3, 1), "DSABlockSparseAttention rejects 3 inputs");

            DataType inTypes[4] = {DataType::kHALF, DataType::kHALF, DataType::kHALF, DataType::kINT32};
            DataType outType = DataType::kFLOAT;
            check(build->getOutputDataTypes(&outType, 1, inTypes, 4) == 0 && outType == DataType::kHALF,
                "DSABlockSparseAttention output type follows q");
            {
                std::vector<FakeDimExpr> qd(4), kd(4), vd(4), bd(4);
                DimsExprs ins[4] = {makeExprs(qd), makeExprs(kd), makeExprs(vd), makeExprs(bd)};
                DimsExprs outs[1]{};
                FakeExprBuilder exprBuilder;
                check(build->getOutputShapes(ins, 4, nullptr, 0, outs, 1, exprBuilder) == 0 && outs[0].nbDims == 4
                        && outs[0].d[0] == &qd[0] && outs[0].d[1] == &qd[1] && outs[0].d[2] == &qd[2]
                        && outs[0].d[3] == &vd[3],
                    "DSABlockSparseAttention output shape is [B,S,H] of q and Dv of v");
            }
            check(build->configurePlugin(io.data(), 4, io.data() + 4, 1) == 0, "DSABlockSparseAttention configurePlugin");
            check(build->configurePlugin(f32.data(), 4, f32.data() + 4, 1) == 0,
                "DSABlockSparseAttention configurePlugin takes S = 100, T = 130: 2 query blocks of 64, the last ragged");
            std::vector<DynamicPluginTensorDesc> dyn = io;
            dyn[0].desc.dims.d[1] = -1;
            dyn[1].desc.dims.d[1] = -1;
            dyn[2].desc.dims.d[1] = -1;
            dyn[3].desc.dims.d[2] = -1;
            dyn[4].desc.dims.d[1] = -1;
            check(build->configurePlugin(dyn.data(), 4, dyn.data() + 4, 1) == 0,
                "DSABlockSparseAttention configurePlugin with dynamic S, T and query blocks");
            check(build->getWorkspaceSize(io.data(), 4, io.data() + 4, 1) == 0, "DSABlockSparseAttention needs no workspace");
            std::vector<DynamicPluginTensorDesc> bad = io;
            bad[3] = makeDesc({1, 16, 63, 8}, DataType::kINT32);
            int errorsBefore = logger.errors;
            check(build->configurePlugin(bad.data(), 4, bad.data() + 4, 1) != 0 && logger.errors > errorsBefore
                    && logger.lastError.find("query blocks") != std::string::npos,
                "DSABlockSparseAttention rejects block_index with 63 query blocks for S = 4096, bs = 64");
            bad = io;
            bad[1] = makeDesc({1, 4096, 3, 128}, DataType::kBF16);
            bad[2] = makeDesc({1, 4096, 3, 128}, DataType::kBF16);
            check(build->configurePlugin(bad.data(), 4, bad.data() + 4, 1) != 0,
                "DSABlockSparseAttention rejects H = 16 with Hkv = 3");
            bad = io;
            bad[3] = makeDesc({1, 8, 64, 8}, DataType::kINT32);
            check(build->configurePlugin(bad.data(), 4, bad.data() + 4, 1) != 0,
                "DSABlockSparseAttention rejects block_index with 8 heads for H = 16");
            bad = io;
            bad[2] = makeDesc({1, 4000, 1, 128}, DataType::kBF16);
            check(build->configurePlugin(bad.data(), 4, bad.data() + 4, 1) != 0,
                "DSABlockSparseAttention rejects v with T != k's T");
            bad = io;
            bad[3] = makeDesc({1, 16, 64}, DataType::kINT32);
            check(build->configurePlugin(bad.data(), 4, bad.data() + 4, 1) != 0,
                "DSABlockSparseAttention rejects a 3-D block_index");
            {
                std::vector<PluginTensorDesc> rtDesc;
                for (DynamicPluginTensorDesc const& d : io)
                {
                    rtDesc.push_back(d.desc);
                }
                check(rt->onShapeChange(rtDesc.data(), 4, rtDesc.data() + 4, 1) == 0,
                    "DSABlockSparseAttention onShapeChange");
                // enqueue fails at a launcher check that needs no GPU: B*H*ceil(S/bs) over the grid limit.
                std::vector<PluginTensorDesc> big = rtDesc;
                int64_t const s = int64_t{64} << 26;
                big[0].dims.d[1] = s;
                big[4].dims.d[1] = s;
                big[3].dims.d[2] = int64_t{1} << 26;
                big[0].dims.d[2] = 64;
                big[3].dims.d[1] = 64;
                big[4].dims.d[2] = 64;
                alignas(16) static unsigned char fake[64];
                void const* ins[4] = {fake, fake, fake, fake};
                void* outs[1] = {fake};
                errorsBefore = logger.errors;
                check(rt->enqueue(big.data(), big.data() + 4, ins, outs, nullptr, nullptr) != 0
                        && logger.errors > errorsBefore && logger.lastError.find("grid limits") != std::string::npos,
                    "DSABlockSparseAttention enqueue reaches the launcher (" + logger.lastError + ")");
                big[3].dims.d[2] = 7;
                check(rt->enqueue(big.data(), big.data() + 4, ins, outs, nullptr, nullptr) != 0
                        && logger.lastError.find("query blocks") != std::string::npos,
                    "DSABlockSparseAttention enqueue refuses block_index with the wrong number of query blocks");
            }

            PluginFieldCollection const* ser = rt->getFieldsToSerialize();
            PluginField const* bsField = findField(ser, "block_size");
            PluginField const* causalField = findField(ser, "causal");
            check(ser != nullptr && ser->nbFields == 3 && bsField != nullptr && bsField->type == PluginFieldType::kINT32
                    && *static_cast<int32_t const*>(bsField->data) == 64 && causalField != nullptr
                    && causalField->type == PluginFieldType::kINT32,
                "DSABlockSparseAttention serializes block_size and causal as int32, scale as float32");
            IPluginV3* again = bsa->createPlugin("bsa2", ser, TensorRTPhase::kRUNTIME);
            check(again != nullptr, "DSABlockSparseAttention round trip through getFieldsToSerialize");
            if (again != nullptr)
            {
                auto* b2 = static_cast<IPluginV3OneBuild*>(again->getCapabilityInterface(PluginCapabilityType::kBUILD));
                check(std::strcmp(b2->getMetadataString(), build->getMetadataString()) == 0,
                    std::string("DSABlockSparseAttention attributes survive serialization: ") + b2->getMetadataString());
                delete again;
            }
            IPluginV3* cl = plugin->clone();
            check(cl != nullptr, "DSABlockSparseAttention clone");
            if (cl != nullptr)
            {
                auto* r2 = static_cast<IPluginV3OneRuntime*>(cl->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
                PluginField const* bs2 = findField(r2->getFieldsToSerialize(), "block_size");
                check(bs2 != nullptr && bs2->data != bsField->data && *static_cast<int32_t const*>(bs2->data) == 64,
                    "DSABlockSparseAttention clone serializes its own copy of the fields");
                delete cl;
            }
            delete plugin;
        }
        std::vector<PluginField> noBlock{{"scale", &scale, PluginFieldType::kFLOAT32, 1}};
        PluginFieldCollection fcNoBlock{1, noBlock.data()};
        int errorsBefore = logger.errors;
        check(bsa->createPlugin("bad", &fcNoBlock, TensorRTPhase::kBUILD) == nullptr && logger.errors > errorsBefore,
            "DSABlockSparseAttention createPlugin without block_size fails with a logged error");
        int32_t zero = 0;
        std::vector<PluginField> zeroBs{{"block_size", &zero, PluginFieldType::kINT32, 1},
            {"scale", &scale, PluginFieldType::kFLOAT32, 1}};
        PluginFieldCollection fcZero{2, zeroBs.data()};
        check(bsa->createPlugin("zero", &fcZero, TensorRTPhase::kBUILD) == nullptr,
            "DSABlockSparseAttention rejects block_size 0");
        int32_t two = 2;
        std::vector<PluginField> badCausal{{"block_size", &blockSize, PluginFieldType::kINT32, 1},
            {"scale", &scale, PluginFieldType::kFLOAT32, 1}, {"causal", &two, PluginFieldType::kINT32, 1}};
        PluginFieldCollection fcCausal{3, badCausal.data()};
        check(bsa->createPlugin("causal2", &fcCausal, TensorRTPhase::kBUILD) == nullptr,
            "DSABlockSparseAttention rejects causal = 2");
        int64_t bs64 = 32;
        double scale64 = 0.25;
        std::vector<PluginField> wide{{"block_size", &bs64, PluginFieldType::kINT64, 1},
            {"scale", &scale64, PluginFieldType::kFLOAT64, 1}};
        PluginFieldCollection fcWide{2, wide.data()};
        IPluginV3* p64 = bsa->createPlugin("wide", &fcWide, TensorRTPhase::kBUILD);
        check(p64 != nullptr, "DSABlockSparseAttention accepts int64/float64 attributes and defaults causal");
        if (p64 != nullptr)
        {
            auto* b64 = static_cast<IPluginV3OneBuild*>(p64->getCapabilityInterface(PluginCapabilityType::kBUILD));
            check(std::strcmp(b64->getMetadataString(), "block_size=32;scale=0.250000;causal=1") == 0,
                std::string("DSABlockSparseAttention defaults: ") + b64->getMetadataString());
            delete p64;
        }
    }

    // ---- DSAMoEExperts ----
    IPluginCreatorV3One* moe = findCreator(creators, n, "DSAMoEExperts");
    check(moe != nullptr, "DSAMoEExperts creator");
    if (moe != nullptr)
    {
        PluginFieldCollection const* names = moe->getFieldNames();
        check(names != nullptr && names->nbFields == 1 && findField(names, "activation") != nullptr
                && findField(names, "activation")->type == PluginFieldType::kCHAR,
            "DSAMoEExperts declares one string field 'activation'");
        char const silu[] = "silu";
        int32_t extra = 5;
        std::vector<PluginField> fields{{"activation", silu, PluginFieldType::kCHAR, 4},
            {"block_size", &extra, PluginFieldType::kINT32, 1}};
        PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.data()};
        IPluginV3* plugin = moe->createPlugin("moe", &fc, TensorRTPhase::kBUILD);
        check(plugin != nullptr, "DSAMoEExperts createPlugin (block_size is not its attribute and is ignored)");
        if (plugin != nullptr)
        {
            auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
            auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
            auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
            check(core && build && rt, "DSAMoEExperts exposes core/build/runtime");
            check(std::strcmp(core->getPluginName(), "DSAMoEExperts") == 0
                    && std::strcmp(core->getPluginNamespace(), "dsa") == 0 && std::strcmp(core->getPluginVersion(), "1") == 0,
                "DSAMoEExperts plugin name, namespace dsa, version 1");
            check(build->getNbOutputs() == 1, "DSAMoEExperts one output");
            check(std::strcmp(build->getMetadataString(), "activation=silu") == 0,
                std::string("DSAMoEExperts metadata: ") + build->getMetadataString());

            // DeepSeek-V3.2 widths: H = 7168, I = 2048, 256 experts, top-8.
            std::vector<DynamicPluginTensorDesc> io{makeDesc({64, 7168}, DataType::kBF16),
                makeDesc({64, 8}, DataType::kINT32), makeDesc({64, 8}, DataType::kFLOAT),
                makeDesc({256, 4096, 7168}, DataType::kBF16), makeDesc({256, 7168, 2048}, DataType::kBF16),
                makeDesc({64, 7168}, DataType::kBF16)};
            check(allFormats(build, io, 5), "DSAMoEExperts accepts bf16 x/experts/out, int32 ids, fp32 weights");
            io[2].desc.type = DataType::kBF16;
            check(build->supportsFormatCombination(2, io.data(), 5, 1), "DSAMoEExperts accepts weights in x's dtype");
            io[2].desc.type = DataType::kHALF;
            check(!build->supportsFormatCombination(2, io.data(), 5, 1), "DSAMoEExperts rejects fp16 weights with bf16 x");
            io[2].desc.type = DataType::kFLOAT;
            io[3].desc.type = DataType::kFP8;
            check(!build->supportsFormatCombination(3, io.data(), 5, 1), "DSAMoEExperts rejects FP8 experts (that is DSAMoEExpertsFP8)");
            io[3].desc.type = DataType::kBF16;
            io[1].desc.type = DataType::kINT64;
            check(!build->supportsFormatCombination(1, io.data(), 5, 1), "DSAMoEExperts rejects int64 topk_ids");
            io[1].desc.type = DataType::kINT32;
            io[5].desc.type = DataType::kFLOAT;
            check(!build->supportsFormatCombination(5, io.data(), 5, 1), "DSAMoEExperts rejects out dtype != x");
            io[5].desc.type = DataType::kBF16;
            io[0].desc.type = DataType::kINT8;
            check(!build->supportsFormatCombination(0, io.data(), 5, 1), "DSAMoEExperts rejects int8 x");
            io[0].desc.type = DataType::kBF16;
            io[0].desc.format = TensorFormat::kHWC8;
            check(!build->supportsFormatCombination(0, io.data(), 5, 1), "DSAMoEExperts rejects non-linear formats");
            io[0].desc.format = TensorFormat::kLINEAR;
            std::vector<DynamicPluginTensorDesc> f32{makeDesc({3, 64}, DataType::kFLOAT), makeDesc({3, 2}, DataType::kINT32),
                makeDesc({3, 2}, DataType::kFLOAT), makeDesc({4, 64, 64}, DataType::kFLOAT),
                makeDesc({4, 64, 32}, DataType::kFLOAT), makeDesc({3, 64}, DataType::kFLOAT)};
            check(allFormats(build, f32, 5), "DSAMoEExperts accepts an all-float32 combination");
            check(!build->supportsFormatCombination(0, io.data(), 7, 1), "DSAMoEExperts rejects 7 inputs");

            DataType inTypes[5] = {DataType::kHALF, DataType::kINT32, DataType::kFLOAT, DataType::kHALF, DataType::kHALF};
            DataType outType = DataType::kFLOAT;
            check(build->getOutputDataTypes(&outType, 1, inTypes, 5) == 0 && outType == DataType::kHALF,
                "DSAMoEExperts output type follows x");

            std::vector<FakeDimExpr> xd(2), idd(2), wd(2), gud(3), dnd(3);
            DimsExprs ins[5] = {makeExprs(xd), makeExprs(idd), makeExprs(wd), makeExprs(gud), makeExprs(dnd)};
            DimsExprs outs[1]{};
            FakeExprBuilder exprBuilder;
            check(build->getOutputShapes(ins, 5, nullptr, 0, outs, 1, exprBuilder) == 0 && outs[0].nbDims == 2
                    && outs[0].d[0] == &xd[0] && outs[0].d[1] == &xd[1],
                "DSAMoEExperts output shape is x's [N, H] (symbolic dims passed through)");
            int errorsBefore = logger.errors;
            DimsExprs bad3[5] = {makeExprs(gud), makeExprs(idd), makeExprs(wd), makeExprs(gud), makeExprs(dnd)};
            check(build->getOutputShapes(bad3, 5, nullptr, 0, outs, 1, exprBuilder) != 0 && logger.errors > errorsBefore,
                "DSAMoEExperts getOutputShapes rejects a 3-D x with a logged error");

            check(build->configurePlugin(io.data(), 5, io.data() + 5, 1) == 0, "DSAMoEExperts configurePlugin");
            std::vector<DynamicPluginTensorDesc> dyn = io;
            dyn[0].desc.dims.d[0] = -1;
            dyn[1].desc.dims.d[0] = -1;
            dyn[2].desc.dims.d[0] = -1;
            dyn[5].desc.dims.d[0] = -1;
            check(build->configurePlugin(dyn.data(), 5, dyn.data() + 5, 1) == 0,
                "DSAMoEExperts configurePlugin with a dynamic token dim");
            std::vector<DynamicPluginTensorDesc> bad = io;
            bad[4] = makeDesc({256, 7168, 1024}, DataType::kBF16);
            errorsBefore = logger.errors;
            check(build->configurePlugin(bad.data(), 5, bad.data() + 5, 1) != 0 && logger.errors > errorsBefore,
                "DSAMoEExperts configurePlugin rejects gate_up 2I != 2 * down's I with a logged error");
            bad = io;
            bad[2] = makeDesc({64, 6}, DataType::kFLOAT);
            check(build->configurePlugin(bad.data(), 5, bad.data() + 5, 1) != 0,
                "DSAMoEExperts configurePlugin rejects topk_weights K != topk_ids K");
            bad = io;
            bad[3] = makeDesc({9000, 4096, 7168}, DataType::kBF16);
            bad[4] = makeDesc({9000, 7168, 2048}, DataType::kBF16);
            check(build->configurePlugin(bad.data(), 5, bad.data() + 5, 1) != 0,
                "DSAMoEExperts configurePlugin rejects more than 8192 experts");
            check(build->configurePlugin(io.data(), 4, io.data() + 4, 1) != 0, "DSAMoEExperts configurePlugin rejects 4 inputs");

            std::vector<DynamicPluginTensorDesc> small{makeDesc({4, 64}, DataType::kBF16), makeDesc({4, 2}, DataType::kINT32),
                makeDesc({4, 2}, DataType::kFLOAT), makeDesc({4, 64, 64}, DataType::kBF16),
                makeDesc({4, 64, 32}, DataType::kBF16), makeDesc({4, 64}, DataType::kBF16)};
            size_t const wsSmall = build->getWorkspaceSize(small.data(), 5, small.data() + 5, 1);
            check(wsSmall == moeWorkspaceFormula(4, 2, 4, 64, 32, 2) && wsSmall == 3840,
                "DSAMoEExperts workspace follows the README formula for small shapes (" + std::to_string(wsSmall) + ")");
            small[0].max.d[0] = 1000;
            size_t const wsMax = build->getWorkspaceSize(small.data(), 5, small.data() + 5, 1);
            check(wsMax == moeWorkspaceFormula(1000, 2, 4, 64, 32, 2) && wsMax > wsSmall,
                "DSAMoEExperts workspace is sized from the profile maximum (" + std::to_string(wsMax) + ")");
            size_t const wsDecode = build->getWorkspaceSize(io.data(), 5, io.data() + 5, 1);
            io[0].max.d[0] = 16384;
            size_t const wsPrefill = build->getWorkspaceSize(io.data(), 5, io.data() + 5, 1);
            io[0].max.d[0] = 64;
            check(wsDecode == moeWorkspaceFormula(64, 8, 256, 7168, 2048, 2) && wsPrefill == (size_t{1} << 30),
                "DSAMoEExperts workspace at DeepSeek width: " + std::to_string(wsDecode) + " bytes for 64 tokens, capped at "
                    + std::to_string(wsPrefill) + " for 16K tokens");

            PluginFieldCollection const* ser = rt->getFieldsToSerialize();
            PluginField const* act = findField(ser, "activation");
            check(ser != nullptr && ser->nbFields == 1 && act != nullptr && act->type == PluginFieldType::kCHAR
                    && act->length == 4 && std::strncmp(static_cast<char const*>(act->data), "silu", 4) == 0,
                "DSAMoEExperts serializes activation as a 4-character string");
            IPluginV3* again = moe->createPlugin("moe2", ser, TensorRTPhase::kRUNTIME);
            check(again != nullptr, "DSAMoEExperts round trip through getFieldsToSerialize");
            if (again != nullptr)
            {
                auto* b2 = static_cast<IPluginV3OneBuild*>(again->getCapabilityInterface(PluginCapabilityType::kBUILD));
                check(std::strcmp(b2->getMetadataString(), build->getMetadataString()) == 0,
                    std::string("DSAMoEExperts attributes survive serialization: ") + b2->getMetadataString());
                delete again;
            }
            IPluginV3* cl = plugin->clone();
            check(cl != nullptr, "DSAMoEExperts clone");
            if (cl != nullptr)
            {
                auto* r2 = static_cast<IPluginV3OneRuntime*>(cl->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
                PluginField const* a2 = findField(r2->getFieldsToSerialize(), "activation");
                check(a2 != nullptr && a2->data != act->data && std::strncmp(static_cast<char const*>(a2->data), "silu", 4) == 0,
                    "DSAMoEExperts clone serializes its own copy of the fields");
                delete cl;
            }
            delete plugin;
        }
        char const gelu[] = "gelu";
        std::vector<PluginField> badAct{{"activation", gelu, PluginFieldType::kCHAR, 4}};
        PluginFieldCollection fcBad{1, badAct.data()};
        int const errorsBefore = logger.errors;
        check(moe->createPlugin("bad", &fcBad, TensorRTPhase::kBUILD) == nullptr && logger.errors > errorsBefore,
            "DSAMoEExperts rejects activation 'gelu' with a logged error");
        char const siluNul[] = "silu";
        std::vector<PluginField> withNul{{"activation", siluNul, PluginFieldType::kCHAR, 5}};
        PluginFieldCollection fcNul{1, withNul.data()};
        IPluginV3* pNul = moe->createPlugin("nul", &fcNul, TensorRTPhase::kBUILD);
        check(pNul != nullptr, "DSAMoEExperts accepts a string length that counts the terminating NUL");
        delete pNul;
        int32_t notAString = 1;
        std::vector<PluginField> wrongType{{"activation", &notAString, PluginFieldType::kINT32, 1}};
        PluginFieldCollection fcWrong{1, wrongType.data()};
        check(moe->createPlugin("wrong", &fcWrong, TensorRTPhase::kBUILD) == nullptr,
            "DSAMoEExperts rejects an integer 'activation'");
        PluginFieldCollection empty{0, nullptr};
        IPluginV3* pDefault = moe->createPlugin("default", &empty, TensorRTPhase::kBUILD);
        check(pDefault != nullptr, "DSAMoEExperts defaults activation to silu");
        delete pDefault;
    }

    // ---- DSAMoEExpertsFP8 ----
    IPluginCreatorV3One* fp8 = findCreator(creators, n, "DSAMoEExpertsFP8");
    check(fp8 != nullptr, "DSAMoEExpertsFP8 creator");
    if (fp8 != nullptr)
    {
        PluginFieldCollection const* names = fp8->getFieldNames();
        check(names != nullptr && names->nbFields == 2 && findField(names, "activation") != nullptr
                && findField(names, "block_size") != nullptr,
            "DSAMoEExpertsFP8 declares 'activation' and 'block_size'");
        char const silu[] = "silu";
        int32_t blockSize = 128;
        std::vector<PluginField> fields{{"activation", silu, PluginFieldType::kCHAR, 4},
            {"block_size", &blockSize, PluginFieldType::kINT32, 1}};
        PluginFieldCollection fc{2, fields.data()};
        IPluginV3* plugin = fp8->createPlugin("fp8", &fc, TensorRTPhase::kBUILD);
        check(plugin != nullptr, "DSAMoEExpertsFP8 createPlugin");
        if (plugin != nullptr)
        {
            auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
            auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
            auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
            check(std::strcmp(core->getPluginName(), "DSAMoEExpertsFP8") == 0, "DSAMoEExpertsFP8 plugin name");
            check(std::strcmp(build->getMetadataString(), "activation=silu;block_size=128") == 0,
                std::string("DSAMoEExpertsFP8 metadata: ") + build->getMetadataString());
            std::vector<DynamicPluginTensorDesc> io{makeDesc({16, 7168}, DataType::kBF16),
                makeDesc({16, 8}, DataType::kINT32), makeDesc({16, 8}, DataType::kFLOAT),
                makeDesc({256, 4096, 7168}, DataType::kFP8), makeDesc({256, 7168, 2048}, DataType::kFP8),
                makeDesc({256, 32, 56}, DataType::kFLOAT), makeDesc({256, 56, 16}, DataType::kFLOAT),
                makeDesc({16, 7168}, DataType::kBF16)};
            check(allFormats(build, io, 7), "DSAMoEExpertsFP8 accepts bf16 x/out, FP8 experts, fp32 block scales");
            io[0].desc.type = DataType::kHALF;
            io[7].desc.type = DataType::kHALF;
            check(allFormats(build, io, 7), "DSAMoEExpertsFP8 accepts fp16 x/out with FP8 experts");
            io[0].desc.type = DataType::kBF16;
            io[7].desc.type = DataType::kBF16;
            io[3].desc.type = DataType::kBF16;
            check(!build->supportsFormatCombination(3, io.data(), 7, 1), "DSAMoEExpertsFP8 rejects bf16 gate_up");
            io[3].desc.type = DataType::kFP8;
            io[6].desc.type = DataType::kHALF;
            check(!build->supportsFormatCombination(6, io.data(), 7, 1), "DSAMoEExpertsFP8 rejects fp16 block scales");
            io[6].desc.type = DataType::kFLOAT;
            check(!build->supportsFormatCombination(0, io.data(), 5, 1), "DSAMoEExpertsFP8 rejects 5 inputs");
            DataType inTypes[7] = {DataType::kBF16, DataType::kINT32, DataType::kBF16, DataType::kFP8, DataType::kFP8,
                DataType::kFLOAT, DataType::kFLOAT};
            DataType outType = DataType::kFLOAT;
            check(build->getOutputDataTypes(&outType, 1, inTypes, 7) == 0 && outType == DataType::kBF16,
                "DSAMoEExpertsFP8 output type follows x");
            check(build->configurePlugin(io.data(), 7, io.data() + 7, 1) == 0, "DSAMoEExpertsFP8 configurePlugin");
            std::vector<DynamicPluginTensorDesc> bad = io;
            bad[5] = makeDesc({256, 32, 57}, DataType::kFLOAT);
            int errorsBefore = logger.errors;
            check(build->configurePlugin(bad.data(), 7, bad.data() + 7, 1) != 0 && logger.errors > errorsBefore,
                "DSAMoEExpertsFP8 configurePlugin rejects gate_up_scale [E, 2I/bs, H/bs + 1] with a logged error");
            bad = io;
            bad[6] = makeDesc({256, 16, 56}, DataType::kFLOAT);
            check(build->configurePlugin(bad.data(), 7, bad.data() + 7, 1) != 0,
                "DSAMoEExpertsFP8 configurePlugin rejects a transposed down_scale");
            check(build->getWorkspaceSize(io.data(), 7, io.data() + 7, 1) == moeWorkspaceFormula(16, 8, 256, 7168, 2048, 2),
                "DSAMoEExpertsFP8 workspace matches the 16-bit op's (activations are in x's dtype)");

            PluginFieldCollection const* ser = rt->getFieldsToSerialize();
            PluginField const* bsField = findField(ser, "block_size");
            check(ser->nbFields == 2 && bsField != nullptr && bsField->type == PluginFieldType::kINT32
                    && *static_cast<int32_t const*>(bsField->data) == 128,
                "DSAMoEExpertsFP8 serializes block_size as int32");
            IPluginV3* again = fp8->createPlugin("fp8b", ser, TensorRTPhase::kRUNTIME);
            check(again != nullptr, "DSAMoEExpertsFP8 round trip through getFieldsToSerialize");
            if (again != nullptr)
            {
                auto* b2 = static_cast<IPluginV3OneBuild*>(again->getCapabilityInterface(PluginCapabilityType::kBUILD));
                check(std::strcmp(b2->getMetadataString(), build->getMetadataString()) == 0,
                    std::string("DSAMoEExpertsFP8 attributes survive serialization: ") + b2->getMetadataString());
                delete again;
            }
            delete plugin;
        }
        int64_t bs64 = 64;
        std::vector<PluginField> wide{{"block_size", &bs64, PluginFieldType::kINT64, 1}};
        PluginFieldCollection fcWide{1, wide.data()};
        IPluginV3* p64 = fp8->createPlugin("wide", &fcWide, TensorRTPhase::kBUILD);
        check(p64 != nullptr, "DSAMoEExpertsFP8 accepts an int64 block_size and defaults activation");
        if (p64 != nullptr)
        {
            auto* b64 = static_cast<IPluginV3OneBuild*>(p64->getCapabilityInterface(PluginCapabilityType::kBUILD));
            check(std::strcmp(b64->getMetadataString(), "activation=silu;block_size=64") == 0,
                std::string("DSAMoEExpertsFP8 block_size 64: ") + b64->getMetadataString());
            delete p64;
        }
        PluginFieldCollection empty{0, nullptr};
        IPluginV3* pDefault = fp8->createPlugin("default", &empty, TensorRTPhase::kBUILD);
        check(pDefault != nullptr, "DSAMoEExpertsFP8 defaults block_size to 128");
        if (pDefault != nullptr)
        {
            auto* bd = static_cast<IPluginV3OneBuild*>(pDefault->getCapabilityInterface(PluginCapabilityType::kBUILD));
            check(std::strcmp(bd->getMetadataString(), "activation=silu;block_size=128") == 0, "DSAMoEExpertsFP8 default metadata");
            delete pDefault;
        }
        int32_t zero = 0;
        std::vector<PluginField> zeroBs{{"block_size", &zero, PluginFieldType::kINT32, 1}};
        PluginFieldCollection fcZero{1, zeroBs.data()};
        int const errorsBefore = logger.errors;
        check(fp8->createPlugin("zero", &fcZero, TensorRTPhase::kBUILD) == nullptr && logger.errors > errorsBefore,
            "DSAMoEExpertsFP8 rejects block_size 0 with a logged error");
        char const relu[] = "relu";
        std::vector<PluginField> badAct{{"activation", relu, PluginFieldType::kCHAR, 4}};
        PluginFieldCollection fcBad{1, badAct.data()};
        check(fp8->createPlugin("relu", &fcBad, TensorRTPhase::kBUILD) == nullptr, "DSAMoEExpertsFP8 rejects activation 'relu'");
    }
    checkPagedPlugins(creators, n, logger);
    checkPagedCacheWritePlugin(creators, n, logger);
    std::printf("%s: %d failure(s)\n", gFailures == 0 ? "OK" : "FAILED", gFailures);
    return gFailures == 0 ? 0 : 1;
}

namespace
{
void checkPagedPlugins(IPluginCreatorInterface* const* creators, int32_t n, CountingLogger& logger)
{
    // ---- DSAIndexerTopKPaged ----
    IPluginCreatorV3One* ix = findCreator(creators, n, "DSAIndexerTopKPaged");
    check(ix != nullptr, "DSAIndexerTopKPaged creator");
    if (ix != nullptr)
    {
        PluginFieldCollection const* names = ix->getFieldNames();
        check(names != nullptr && names->nbFields == 3 && findField(names, "topk") != nullptr
                && findField(names, "scale") != nullptr && findField(names, "causal") != nullptr,
            "DSAIndexerTopKPaged fields topk, scale, causal");
        int32_t topk = 2048;
        float scale = 0.088388F;
        std::vector<PluginField> fields{{"topk", &topk, PluginFieldType::kINT32, 1},
            {"scale", &scale, PluginFieldType::kFLOAT32, 1}};
        PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.data()};
        IPluginV3* plugin = ix->createPlugin("ixp", &fc, TensorRTPhase::kBUILD);
        check(plugin != nullptr, "DSAIndexerTopKPaged createPlugin (causal defaults to 1)");
        if (plugin != nullptr)
        {
            auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
            auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
            std::string const meta = build->getMetadataString();
            check(meta.rfind("topk=2048;scale=", 0) == 0 && meta.size() > 9 && meta.substr(meta.size() - 9) == ";causal=1",
                "DSAIndexerTopKPaged metadata: " + meta);
            // DeepSeek-V3.2 decode: 4 rows, 64 index heads of 128, pages of 64, 512 table columns.
            std::vector<DynamicPluginTensorDesc> io{makeDesc({4, 1, 64, 128}, DataType::kBF16),
                makeDesc({2048, 64, 128}, DataType::kBF16), makeDesc({4, 1, 64}, DataType::kFLOAT),
                makeDesc({4, 512}, DataType::kINT32), makeDesc({4}, DataType::kINT32), makeDesc({4}, DataType::kINT32),
                makeDesc({4, 1, 2048}, DataType::kINT32)};
            bool all = true;
            for (int32_t pos = 0; pos < 7; ++pos)
            {
                all = all && build->supportsFormatCombination(pos, io.data(), 6, 1);
            }
            check(all, "DSAIndexerTopKPaged accepts bf16 q/k_pool, fp32 w, int32 table/starts/lengths/output");
            io[1].desc.type = DataType::kHALF;
            check(!build->supportsFormatCombination(1, io.data(), 6, 1), "DSAIndexerTopKPaged rejects k_pool dtype != q");
            io[1].desc.type = DataType::kBF16;
            io[3].desc.type = DataType::kFLOAT;
            check(!build->supportsFormatCombination(3, io.data(), 6, 1), "DSAIndexerTopKPaged rejects a float block table");
            io[3].desc.type = DataType::kINT32;
            DataType inTypes[6] = {DataType::kBF16, DataType::kBF16, DataType::kFLOAT, DataType::kINT32,
                DataType::kINT32, DataType::kINT32};
            DataType outType = DataType::kFLOAT;
            check(build->getOutputDataTypes(&outType, 1, inTypes, 6) == 0 && outType == DataType::kINT32,
                "DSAIndexerTopKPaged output type int32");
            check(build->configurePlugin(io.data(), 6, io.data() + 6, 1) == 0, "DSAIndexerTopKPaged configurePlugin");
            check(build->getWorkspaceSize(io.data(), 6, io.data() + 6, 1) > 0,
                "DSAIndexerTopKPaged asks for a workspace (the scores of a block of rows over M*page keys)");
            std::vector<DynamicPluginTensorDesc> bad = io;
            bad[1] = makeDesc({2048, 64, 64}, DataType::kBF16);
            int errorsBefore = logger.errors;
            check(build->configurePlugin(bad.data(), 6, bad.data() + 6, 1) != 0 && logger.errors > errorsBefore,
                "DSAIndexerTopKPaged configurePlugin rejects a D mismatch with a logged error");
            bad = io;
            bad[4] = makeDesc({3}, DataType::kINT32);
            errorsBefore = logger.errors;
            check(build->configurePlugin(bad.data(), 6, bad.data() + 6, 1) != 0 && logger.errors > errorsBefore,
                "DSAIndexerTopKPaged configurePlugin rejects query_start of another batch");
            check(build->configurePlugin(io.data(), 5, io.data() + 5, 1) != 0,
                "DSAIndexerTopKPaged configurePlugin needs all six inputs");
            {
                std::vector<PluginTensorDesc> descs;
                for (DynamicPluginTensorDesc const& d : io)
                {
                    descs.push_back(d.desc);
                }
                alignas(16) static unsigned char fake[64];
                void const* ins[6] = {fake, fake, fake, fake, fake, fake};
                void* outs[1] = {fake};
                errorsBefore = logger.errors;
                bool const failed = rt->enqueue(descs.data(), descs.data() + 6, ins, outs, fake, nullptr) != 0;
                check(failed && logger.errors > errorsBefore
                        && logger.lastError.find("DSAIndexerTopKPaged kernel") != std::string::npos,
                    "DSAIndexerTopKPaged enqueue reaches the launcher and, without a GPU, fails with a logged error ("
                        + logger.lastError + ")");
            }
            IPluginV3* again = ix->createPlugin("ixp2", rt->getFieldsToSerialize(), TensorRTPhase::kRUNTIME);
            check(again != nullptr, "DSAIndexerTopKPaged round trip through getFieldsToSerialize");
            if (again != nullptr)
            {
                auto* b2 = static_cast<IPluginV3OneBuild*>(again->getCapabilityInterface(PluginCapabilityType::kBUILD));
                check(std::strcmp(b2->getMetadataString(), build->getMetadataString()) == 0,
                    std::string("DSAIndexerTopKPaged attributes survive serialization: ") + b2->getMetadataString());
                delete again;
            }
            delete plugin;
        }
        int32_t zero = 0;
        std::vector<PluginField> zeroTopk{{"topk", &zero, PluginFieldType::kINT32, 1}, {"scale", &scale,
            PluginFieldType::kFLOAT32, 1}};
        PluginFieldCollection fcZero{2, zeroTopk.data()};
        int const errorsBefore = logger.errors;
        check(ix->createPlugin("zero", &fcZero, TensorRTPhase::kBUILD) == nullptr && logger.errors > errorsBefore,
            "DSAIndexerTopKPaged rejects topk 0 with a logged error");
    }

    // ---- DSASparseAttentionPaged ----
    IPluginCreatorV3One* sa = findCreator(creators, n, "DSASparseAttentionPaged");
    check(sa != nullptr, "DSASparseAttentionPaged creator");
    if (sa != nullptr)
    {
        float scale = 0.0625F;
        std::vector<PluginField> fields{{"scale", &scale, PluginFieldType::kFLOAT32, 1}};
        PluginFieldCollection fc{1, fields.data()};
        IPluginV3* plugin = sa->createPlugin("sap", &fc, TensorRTPhase::kBUILD);
        check(plugin != nullptr, "DSASparseAttentionPaged createPlugin");
        float inf = std::numeric_limits<float>::infinity();
        std::vector<PluginField> infFields{{"scale", &inf, PluginFieldType::kFLOAT32, 1}};
        PluginFieldCollection fcInf{1, infFields.data()};
        check(sa->createPlugin("inf", &fcInf, TensorRTPhase::kBUILD) == nullptr,
            "DSASparseAttentionPaged createPlugin rejects an infinite scale");
        if (plugin != nullptr)
        {
            auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
            auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
            // DeepSeek's absorbed MLA over a paged latent: 128 heads of 576, values from keys (Dv 512).
            std::vector<DynamicPluginTensorDesc> io{makeDesc({4, 1, 128, 576}, DataType::kBF16),
                makeDesc({2048, 64, 1, 576}, DataType::kBF16), makeDesc({0, 64, 1, 512}, DataType::kBF16),
                makeDesc({4, 1, 2048}, DataType::kINT32), makeDesc({4, 512}, DataType::kINT32),
                makeDesc({4, 1, 128, 512}, DataType::kBF16)};
            bool all = true;
            for (int32_t pos = 0; pos < 6; ++pos)
            {
                all = all && build->supportsFormatCombination(pos, io.data(), 5, 1);
            }
            check(all, "DSASparseAttentionPaged accepts bf16 q/pools/out with int32 indices and block table");
            io[4].desc.type = DataType::kBF16;
            check(!build->supportsFormatCombination(4, io.data(), 5, 1),
                "DSASparseAttentionPaged rejects a block table that is not int32");
            io[4].desc.type = DataType::kINT32;
            io[5].desc.type = DataType::kHALF;
            check(!build->supportsFormatCombination(5, io.data(), 5, 1), "DSASparseAttentionPaged rejects out dtype != q");
            io[5].desc.type = DataType::kBF16;
            DataType inTypes[5] = {DataType::kBF16, DataType::kBF16, DataType::kBF16, DataType::kINT32, DataType::kINT32};
            DataType outType = DataType::kFLOAT;
            check(build->getOutputDataTypes(&outType, 1, inTypes, 5) == 0 && outType == DataType::kBF16,
                "DSASparseAttentionPaged output type follows q");
            check(build->configurePlugin(io.data(), 5, io.data() + 5, 1) == 0,
                "DSASparseAttentionPaged configurePlugin takes a v_pool without pages (values from keys)");
            // Batch-4 decode at DeepSeek width on the 132-SM schedule: 8 CTAs split 8 ways (K / 256),
            // float32 partials [8, 4, 128, 512] + log-sum-exps [8, 4, 128].
            size_t const wsDecode = build->getWorkspaceSize(io.data(), 5, io.data() + 5, 1);
            check(wsDecode == size_t{8} * 4 * 128 * 512 * 4 + size_t{8} * 4 * 128 * 4,
                "DSASparseAttentionPaged workspace of a batch-4 decode: 8 splits' partials ("
                    + std::to_string(wsDecode) + " bytes, 8404992 expected)");
            io[0].min.d[1] = 512;  // every call of this profile has 2048 rows or more: no call splits
            io[0].max.d[1] = 512;
            size_t const wsPrefill = build->getWorkspaceSize(io.data(), 5, io.data() + 5, 1);
            io[0].min.d[1] = 1;
            io[0].max.d[1] = 1;
            check(wsPrefill == 0, "DSASparseAttentionPaged needs no workspace when no call of the profile splits ("
                    + std::to_string(wsPrefill) + ")");
            std::vector<FakeDimExpr> qd(4);
            std::vector<FakeDimExpr> kd(4);
            std::vector<FakeDimExpr> vd(4);
            std::vector<FakeDimExpr> id(3);
            std::vector<FakeDimExpr> td(2);
            DimsExprs inputs[5] = {makeExprs(qd), makeExprs(kd), makeExprs(vd), makeExprs(id), makeExprs(td)};
            DimsExprs outShape{};
            FakeExprBuilder exprs;
            check(build->getOutputShapes(inputs, 5, nullptr, 0, &outShape, 1, exprs) == 0 && outShape.nbDims == 4
                    && outShape.d[0] == &qd[0] && outShape.d[1] == &qd[1] && outShape.d[2] == &qd[2]
                    && outShape.d[3] == &vd[3],
                "DSASparseAttentionPaged output shape is q's [B,S,H] and v_pool's Dv");
            std::vector<DynamicPluginTensorDesc> bad = io;
            bad[2] = makeDesc({0, 64, 1, 640}, DataType::kBF16);
            int errorsBefore = logger.errors;
            check(build->configurePlugin(bad.data(), 5, bad.data() + 5, 1) != 0 && logger.errors > errorsBefore
                    && logger.lastError.find("Dv <= Dk") != std::string::npos,
                "DSASparseAttentionPaged rejects values from keys with Dv > Dk");
            bad = io;
            bad[2] = makeDesc({1000, 64, 1, 512}, DataType::kBF16);
            check(build->configurePlugin(bad.data(), 5, bad.data() + 5, 1) != 0
                    && logger.lastError.find("pages") != std::string::npos,
                "DSASparseAttentionPaged rejects a v_pool with other pages than k_pool");
            bad = io;
            bad[0] = makeDesc({4, 1, 100, 576}, DataType::kBF16);
            bad[1] = makeDesc({2048, 64, 3, 576}, DataType::kBF16);
            bad[2] = makeDesc({0, 64, 3, 512}, DataType::kBF16);
            check(build->configurePlugin(bad.data(), 5, bad.data() + 5, 1) != 0,
                "DSASparseAttentionPaged rejects H not a multiple of Hkv");
            {
                std::vector<PluginTensorDesc> descs;
                for (DynamicPluginTensorDesc const& d : io)
                {
                    descs.push_back(d.desc);
                }
                alignas(16) static unsigned char fake[64];
                void const* ins[5] = {fake, fake, nullptr, fake, fake};
                void* outs[1] = {fake};
                errorsBefore = logger.errors;
                bool const failed = rt->enqueue(descs.data(), descs.data() + 5, ins, outs, fake, nullptr) != 0;
                check(failed && logger.errors > errorsBefore
                        && logger.lastError.find("DSASparseAttentionPaged kernel") != std::string::npos
                        && logger.lastError.find("null") == std::string::npos,
                    "DSASparseAttentionPaged enqueue passes a null v_pool as values from keys and reaches the launcher ("
                        + logger.lastError + ")");
            }
            IPluginV3* again = sa->createPlugin("sap2", rt->getFieldsToSerialize(), TensorRTPhase::kRUNTIME);
            check(again != nullptr, "DSASparseAttentionPaged round trip through getFieldsToSerialize");
            if (again != nullptr)
            {
                auto* b2 = static_cast<IPluginV3OneBuild*>(again->getCapabilityInterface(PluginCapabilityType::kBUILD));
                check(std::strcmp(b2->getMetadataString(), build->getMetadataString()) == 0,
                    std::string("DSASparseAttentionPaged attributes survive serialization: ") + b2->getMetadataString());
                delete again;
            }
            IPluginV3* cl = plugin->clone();
            check(cl != nullptr, "DSASparseAttentionPaged clone");
            delete cl;
            delete plugin;
        }
    }
}

void checkPagedCacheWritePlugin(IPluginCreatorInterface* const* creators, int32_t n, CountingLogger& logger)
{
    // ---- DSAPagedCacheWrite ----
    IPluginCreatorV3One* cw = findCreator(creators, n, "DSAPagedCacheWrite");
    check(cw != nullptr, "DSAPagedCacheWrite creator");
    if (cw == nullptr)
    {
        return;
    }
    PluginFieldCollection const* names = cw->getFieldNames();
    check(names != nullptr && names->nbFields == 0, "DSAPagedCacheWrite has no fields");
    PluginFieldCollection none{0, nullptr};
    IPluginV3* plugin = cw->createPlugin("pcw", &none, TensorRTPhase::kBUILD);
    check(plugin != nullptr, "DSAPagedCacheWrite createPlugin");
    if (plugin == nullptr)
    {
        return;
    }
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    check(build->getNbOutputs() == 1, "DSAPagedCacheWrite one output");
    auto aliasOf = [](IPluginV3* p, int32_t output) -> int32_t {
#if DSA_PLUGIN_ALIASED_IO
        auto* b = static_cast<IPluginV3OneBuild*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
        InterfaceInfo const info = b->getInterfaceInfo();
        if (std::strcmp(info.kind, "PLUGIN_V3ONE_BUILD") != 0 || info.major != 2 || info.minor != 0)
        {
            return -2; // TensorRT would not ask this plugin getAliasedInput
        }
        return static_cast<IPluginV3OneBuildV2*>(b)->getAliasedInput(output);
#else
        (void) p;
        (void) output;
        return -3;
#endif
    };
#if DSA_PLUGIN_ALIASED_IO
    check(aliasOf(plugin, 0) == 0 && aliasOf(plugin, 1) == -1,
        "DSAPagedCacheWrite reports build capability 2.0 (IPluginV3OneBuildV2) and getAliasedInput(0) == 0");
    float scale = 0.0625F;
    std::vector<PluginField> saFields{{"scale", &scale, PluginFieldType::kFLOAT32, 1}};
    PluginFieldCollection saFc{1, saFields.data()};
    IPluginCreatorV3One* sa = findCreator(creators, n, "DSASparseAttentionPaged");
    IPluginV3* other = sa != nullptr ? sa->createPlugin("sa", &saFc, TensorRTPhase::kBUILD) : nullptr;
    if (other != nullptr)
    {
        InterfaceInfo const info
            = static_cast<IPluginV3OneBuild*>(other->getCapabilityInterface(PluginCapabilityType::kBUILD))
                  ->getInterfaceInfo();
        check(info.major == 1 && aliasOf(other, 0) == -2,
            "the plugins without an aliased output keep build capability 1.0 (TensorRT never asks them)");
        delete other;
    }
#else
    check(aliasOf(plugin, 0) == -3, "headers before TensorRT 10.3: no IPluginV3OneBuildV2 (enqueue copies the pool)");
#endif
    // DeepSeek-V3.2's latent pool: 2048 pages of 64 slots of 576, a batch-4 decode.
    std::vector<DynamicPluginTensorDesc> io{makeDesc({2048, 64, 576}, DataType::kBF16), makeDesc({4, 1, 2}, DataType::kINT64),
        makeDesc({4, 1, 576}, DataType::kBF16), makeDesc({2048, 64, 576}, DataType::kBF16)};
    check(allFormats(build, io, 3), "DSAPagedCacheWrite accepts a bf16 pool/updates/output with int64 indices");
    for (DataType t : {DataType::kFLOAT, DataType::kHALF})
    {
        std::vector<DynamicPluginTensorDesc> typed = io;
        typed[0].desc.type = typed[2].desc.type = typed[3].desc.type = t;
        check(allFormats(build, typed, 3), "DSAPagedCacheWrite accepts float32 and float16 pools");
    }
    io[1].desc.type = DataType::kINT32;
    check(!build->supportsFormatCombination(1, io.data(), 3, 1), "DSAPagedCacheWrite rejects int32 indices");
    io[1].desc.type = DataType::kINT64;
    io[2].desc.type = DataType::kHALF;
    check(!build->supportsFormatCombination(2, io.data(), 3, 1), "DSAPagedCacheWrite rejects updates dtype != pool");
    io[2].desc.type = DataType::kBF16;
    io[3].desc.type = DataType::kFLOAT;
    check(!build->supportsFormatCombination(3, io.data(), 3, 1), "DSAPagedCacheWrite rejects an output dtype != pool");
    io[3].desc.type = DataType::kBF16;
    io[0].desc.type = DataType::kINT8;
    check(!build->supportsFormatCombination(0, io.data(), 3, 1), "DSAPagedCacheWrite rejects a code (int8) pool");
    io[0].desc.type = DataType::kBF16;
    DataType inTypes[3] = {DataType::kHALF, DataType::kINT64, DataType::kHALF};
    DataType outType = DataType::kFLOAT;
    check(build->getOutputDataTypes(&outType, 1, inTypes, 3) == 0 && outType == DataType::kHALF,
        "DSAPagedCacheWrite output type is the pool's");
    {
        std::vector<FakeDimExpr> pd(3), id(3), ud(3);
        DimsExprs ins[3] = {makeExprs(pd), makeExprs(id), makeExprs(ud)};
        DimsExprs out{};
        FakeExprBuilder exprs;
        check(build->getOutputShapes(ins, 3, nullptr, 0, &out, 1, exprs) == 0 && out.nbDims == 3 && out.d[0] == &pd[0]
                && out.d[1] == &pd[1] && out.d[2] == &pd[2],
            "DSAPagedCacheWrite output shape is the pool's");
    }
    check(build->configurePlugin(io.data(), 3, io.data() + 3, 1) == 0, "DSAPagedCacheWrite configurePlugin");
    std::vector<DynamicPluginTensorDesc> dyn = io;
    dyn[1].desc.dims.d[0] = dyn[1].desc.dims.d[1] = dyn[2].desc.dims.d[0] = dyn[2].desc.dims.d[1] = -1;
    check(build->configurePlugin(dyn.data(), 3, dyn.data() + 3, 1) == 0,
        "DSAPagedCacheWrite configurePlugin takes a dynamic batch and length");
    check(build->getWorkspaceSize(io.data(), 3, io.data() + 3, 1) == 0, "DSAPagedCacheWrite needs no workspace");
    std::vector<DynamicPluginTensorDesc> bad = io;
    bad[2] = makeDesc({4, 1, 512}, DataType::kBF16);
    int errorsBefore = logger.errors;
    check(build->configurePlugin(bad.data(), 3, bad.data() + 3, 1) != 0 && logger.errors > errorsBefore
            && logger.lastError.find("updates [B,S,W]") != std::string::npos,
        "DSAPagedCacheWrite rejects updates of another width with a logged error");
    bad = io;
    bad[1] = makeDesc({4, 1, 3}, DataType::kINT64);
    check(build->configurePlugin(bad.data(), 3, bad.data() + 3, 1) != 0, "DSAPagedCacheWrite rejects indices [B,S,3]");
    bad = io;
    bad[0] = makeDesc({2048, 64, 1, 576}, DataType::kBF16);
    check(build->configurePlugin(bad.data(), 3, bad.data() + 3, 1) != 0, "DSAPagedCacheWrite rejects a 4-D pool");
    {
        std::vector<PluginTensorDesc> descs;
        for (DynamicPluginTensorDesc const& d : io)
        {
            descs.push_back(d.desc);
        }
        alignas(16) static unsigned char pool[64];
        alignas(16) static unsigned char other[64];
        alignas(16) static unsigned char small[64];
        void const* ins[3] = {pool, small, small};
        void* same[1] = {pool};
        errorsBefore = logger.errors;
        bool failed = rt->enqueue(descs.data(), descs.data() + 3, ins, same, nullptr, nullptr) != 0;
        check(failed && logger.errors > errorsBefore && logger.lastError.find("DSAPagedCacheWrite kernel") != std::string::npos
                && logger.lastError.find("pool copy") == std::string::npos,
            "DSAPagedCacheWrite enqueue with the output aliased to the pool copies nothing and reaches the kernel ("
                + logger.lastError + ")");
        void* apart[1] = {other};
        errorsBefore = logger.errors;
        failed = rt->enqueue(descs.data(), descs.data() + 3, ins, apart, nullptr, nullptr) != 0;
        check(failed && logger.errors > errorsBefore && logger.lastError.find("pool copy") != std::string::npos,
            "DSAPagedCacheWrite enqueue with an output buffer of its own copies the pool first ("
                + logger.lastError + ")");
    }
    IPluginV3* again = cw->createPlugin("pcw2", rt->getFieldsToSerialize(), TensorRTPhase::kRUNTIME);
    check(again != nullptr && rt->getFieldsToSerialize()->nbFields == 0,
        "DSAPagedCacheWrite round trip through getFieldsToSerialize (no fields)");
    if (again != nullptr)
    {
        auto* b2 = static_cast<IPluginV3OneBuild*>(again->getCapabilityInterface(PluginCapabilityType::kBUILD));
        check(std::strcmp(b2->getMetadataString(), build->getMetadataString()) == 0 && b2->getNbOutputs() == 1,
            "DSAPagedCacheWrite survives serialization");
#if DSA_PLUGIN_ALIASED_IO
        check(aliasOf(again, 0) == 0, "DSAPagedCacheWrite deserialized keeps its output aliased to the pool");
#endif
        delete again;
    }
    IPluginV3* cl = plugin->clone();
    check(cl != nullptr, "DSAPagedCacheWrite clone");
#if DSA_PLUGIN_ALIASED_IO
    check(cl != nullptr && aliasOf(cl, 0) == 0, "DSAPagedCacheWrite clone keeps its output aliased to the pool");
#endif
    delete cl;
    delete plugin;
}
} // namespace
