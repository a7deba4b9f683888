/*
 * Load-time registration for libdsa_plugins_static.so: dlopen()ing the library registers both
 * creators with the global plugin registry (what `polygraphy run --plugins` relies on). Links
 * libnvinfer for getPluginRegistry().
 */
#include "NvInferRuntime.h"

#include "dsaIndexerTopKPlugin/dsaIndexerTopKPlugin.h"
#include "dsaSparseAttentionPlugin/dsaSparseAttentionPlugin.h"

namespace dsa
{
namespace plugin
{
REGISTER_TENSORRT_PLUGIN(DSAIndexerTopKPluginCreator);
REGISTER_TENSORRT_PLUGIN(DSASparseAttentionPluginCreator);
} // namespace plugin
} // namespace dsa
