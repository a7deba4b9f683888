/*
 * Stand-in for libnvinfer, for the host smoke test of the static-registration library only: it
 * exports getPluginRegistry() with a registry that keys creators by (name, version, namespace) the
 * way TensorRT does, the namespace being the one passed to registerCreator (a V3 creator cannot be
 * told its namespace, so a creator registered under "" is not found under the namespace it reports).
 * Built as tests/fake_nvinfer/libnvinfer.so next to tests/libdsa_plugins_static_check.so, which links
 * against it; never installed, never used outside the smoke test.
 */
#include "NvInferRuntime.h"

#include <cstring>
#include <string>
#include <vector>

namespace
{
using namespace nvinfer1;

class RecordingRegistry : public IPluginRegistry
{
public:
    bool registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const pluginNamespace) noexcept override
    {
        if (std::strcmp(creator.getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") != 0)
        {
            return false; // the DSA library only has V3 creators
        }
        auto& v3 = static_cast<IPluginCreatorV3One&>(creator);
        Entry entry{&creator, v3.getPluginName(), v3.getPluginVersion(), pluginNamespace ? pluginNamespace : ""};
        if (find(entry.name.c_str(), entry.version.c_str(), entry.ns.c_str()) != nullptr)
        {
            return false; // TensorRT refuses a second creator of the same type
        }
        mEntries.push_back(entry);
        mCreators.push_back(&creator);
        return true;
    }

    IPluginCreatorInterface* getCreator(AsciiChar const* const pluginName, AsciiChar const* const pluginVersion,
        AsciiChar const* const pluginNamespace) noexcept override
    {
        return find(pluginName, pluginVersion, pluginNamespace ? pluginNamespace : "");
    }

    IPluginCreatorInterface* const* getAllCreators(int32_t* const numCreators) const noexcept override
    {
        *numCreators = static_cast<int32_t>(mCreators.size());
        return mCreators.empty() ? nullptr : mCreators.data();
    }

#if NV_TENSORRT_MAJOR > 10 || (NV_TENSORRT_MAJOR == 10 && NV_TENSORRT_MINOR >= 10)
    IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const numCreators) noexcept override
    {
        return getAllCreators(numCreators);
    }
#endif
#if NV_TENSORRT_MAJOR < 11
    // TensorRT 10's deprecated IPluginCreator (V2) interface, which a registry must still implement:
    // the DSA library registers only V3 creators, so none of these ever finds one.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    bool registerCreator(IPluginCreator& /*creator*/, AsciiChar const* const /*pluginNamespace*/) noexcept override
    {
        return false;
    }
    IPluginCreator* const* getPluginCreatorList(int32_t* const numCreators) const noexcept override
    {
        *numCreators = 0;
        return nullptr;
    }
    IPluginCreator* getPluginCreator(AsciiChar const* const /*pluginName*/, AsciiChar const* const /*pluginVersion*/,
        AsciiChar const* const /*pluginNamespace*/) noexcept override
    {
        return nullptr;
    }
    bool deregisterCreator(IPluginCreator const& /*creator*/) noexcept override
    {
        return false;
    }
#pragma GCC diagnostic pop
#endif

    bool deregisterCreator(IPluginCreatorInterface const& creator) noexcept override
    {
        for (size_t i = 0; i < mEntries.size(); ++i)
        {
            if (mEntries[i].creator == &creator)
            {
                mEntries.erase(mEntries.begin() + static_cast<std::ptrdiff_t>(i));
                mCreators.erase(mCreators.begin() + static_cast<std::ptrdiff_t>(i));
                return true;
            }
        }
        return false;
    }

    void setErrorRecorder(IErrorRecorder* const recorder) noexcept override
    {
        mRecorder = recorder;
    }
    IErrorRecorder* getErrorRecorder() const noexcept override
    {
        return mRecorder;
    }
    bool isParentSearchEnabled() const override
    {
        return false;
    }
    void setParentSearchEnabled(bool const /*enabled*/) override {}
    PluginLibraryHandle loadLibrary(AsciiChar const* /*pluginPath*/) noexcept override
    {
        return nullptr;
    }
    void deregisterLibrary(PluginLibraryHandle /*handle*/) noexcept override {}
    IPluginResource* acquirePluginResource(AsciiChar const* /*key*/, IPluginResource* /*resource*/) noexcept override
    {
        return nullptr;
    }
    int32_t releasePluginResource(AsciiChar const* /*key*/) noexcept override
    {
        return -1;
    }

private:
    struct Entry
    {
        IPluginCreatorInterface* creator;
        std::string name;
        std::string version;
        std::string ns;
    };

    IPluginCreatorInterface* find(char const* name, char const* version, char const* ns) const
    {
        for (Entry const& e : mEntries)
        {
            if (e.name == name && e.version == version && e.ns == ns)
            {
                return e.creator;
            }
        }
        return nullptr;
    }

    std::vector<Entry> mEntries;
    std::vector<IPluginCreatorInterface*> mCreators;
    IErrorRecorder* mRecorder{nullptr};
};
} // namespace

extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginRegistry* getPluginRegistry() noexcept
{
    static RecordingRegistry sRegistry;
    return &sRegistry;
}
