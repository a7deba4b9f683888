/*
 * Entry points of libdsa_plugins.so for IPluginRegistry::loadLibrary and trtexec --dynamicPlugins.
 * Nothing here resolves against libnvinfer: TensorRT calls in, the library never calls out. The
 * creators are those of api/dsaCreators.h.
 */
#include "NvInferRuntime.h"

#include "api/dsaCreators.h"
#include "common/dsaPluginCommon.h"

// TENSORRTAPI expands to nothing outside TensorRT's own build, and this library is compiled with
// hidden visibility, so the entry points say explicitly that they are exported.
#define DSA_PLUGIN_EXPORT __attribute__((visibility("default")))

extern "C" DSA_PLUGIN_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    dsa::plugin::setPluginLoggerFinder(finder);
}

extern "C" DSA_PLUGIN_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    nbCreators = dsa::plugin::DSAPlugins::kSIZE;
    return dsa::plugin::creatorsOf(dsa::plugin::DSAPlugins{});
}
