/*
 * The one list of the plugins the library registers. Adding a plugin: include its header here and
 * add its class to DSAPlugins (and its glue source to DSA_GLUE_SOURCES in CMakeLists.txt).
 * getCreators (api/dsaPluginRegistration.cpp), the load-time registration
 * (api/dsaStaticRegistration.cpp) and the smoke test (tests/dsaPluginSmokeTest.cpp, which uses the
 * names only and links nothing of the library) all take the plugins from here.
 */
#pragma once

#include "common/dsaPluginBase.h"
#include "dsaBlockSparseAttentionPlugin/dsaBlockSparseAttentionPlugin.h"
#include "dsaIndexerTopKPagedPlugin/dsaIndexerTopKPagedPlugin.h"
#include "dsaIndexerTopKPlugin/dsaIndexerTopKPlugin.h"
#include "dsaMoEExpertsPlugin/dsaMoEExpertsPlugin.h"
#include "dsaPagedCacheWritePlugin/dsaPagedCacheWritePlugin.h"
#include "dsaSparseAttentionPagedPlugin/dsaSparseAttentionPagedPlugin.h"
#include "dsaSparseAttentionPlugin/dsaSparseAttentionPlugin.h"

#include <array>
#include <cstdint>

namespace dsa
{
namespace plugin
{

//! A list of plugin classes (each a DSAPlugin, whose creator is DSAPluginCreator<Plugin>).
template <class... Plugins>
struct PluginList
{
    static constexpr int32_t kSIZE = static_cast<int32_t>(sizeof...(Plugins));
    //! The plugin names (= creator names), in list order.
    static constexpr std::array<char const*, sizeof...(Plugins)> kNAMES{{Plugins::kTABLE.name...}};
};

//! Every plugin of the library, in registration order (the order getCreators reports them in).
using DSAPlugins = PluginList<DSAIndexerTopKPlugin, DSASparseAttentionPlugin, DSABlockSparseAttentionPlugin,
    DSAMoEExpertsPlugin, DSAMoEExpertsFP8Plugin, DSAIndexerTopKPagedPlugin, DSASparseAttentionPagedPlugin,
    DSAPagedCacheWritePlugin>;

//! The library's one creator of Plugin, made on first use.
template <class Plugin>
DSAPluginCreator<Plugin>& creatorOf()
{
    static DSAPluginCreator<Plugin> sCreator;
    return sCreator;
}

//! The creators of a list's plugins, in list order (kSIZE of them).
template <class... Plugins>
nvinfer1::IPluginCreatorInterface* const* creatorsOf(PluginList<Plugins...>)
{
    static nvinfer1::IPluginCreatorInterface* const sCreators[] = {&creatorOf<Plugins>()...};
    return sCreators;
}

} // namespace plugin
} // namespace dsa
