/*
 * Load-time registration for libdsa_plugins_static.so: dlopen()ing the library registers all
 * creators with the global plugin registry (what `polygraphy run --plugins` relies on). Links
 * libnvinfer for getPluginRegistry().
 */
#include "NvInferRuntime.h"

#include "dsaBlockSparseAttentionPlugin/dsaBlockSparseAttentionPlugin.h"
#include "dsaIndexerTopKPlugin/dsaIndexerTopKPlugin.h"
#include "dsaMoEExpertsPlugin/dsaMoEExpertsPlugin.h"
#include "dsaSparseAttentionPlugin/dsaSparseAttentionPlugin.h"

namespace dsa
{
namespace plugin
{
REGISTER_TENSORRT_PLUGIN(DSAIndexerTopKPluginCreator);
REGISTER_TENSORRT_PLUGIN(DSASparseAttentionPluginCreator);
REGISTER_TENSORRT_PLUGIN(DSABlockSparseAttentionPluginCreator);
REGISTER_TENSORRT_PLUGIN(DSAMoEExpertsPluginCreator);
REGISTER_TENSORRT_PLUGIN(DSAMoEExpertsFP8PluginCreator);
} // namespace plugin
} // namespace dsa
