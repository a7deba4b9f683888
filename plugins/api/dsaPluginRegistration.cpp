/*
 * Entry points of libdsa_plugins.so for IPluginRegistry::loadLibrary and trtexec --dynamicPlugins.
 * Nothing here resolves against libnvinfer: TensorRT calls in, the library never calls out.
 */
#include "NvInferRuntime.h"

#include "common/dsaPluginCommon.h"
#include "dsaBlockSparseAttentionPlugin/dsaBlockSparseAttentionPlugin.h"
#include "dsaIndexerTopKPlugin/dsaIndexerTopKPlugin.h"
#include "dsaMoEExpertsPlugin/dsaMoEExpertsPlugin.h"
#include "dsaSparseAttentionPlugin/dsaSparseAttentionPlugin.h"

// TENSORRTAPI expands to nothing outside TensorRT's own build, and this library is compiled with
// hidden visibility, so the entry points say explicitly that they are exported.
#define DSA_PLUGIN_EXPORT __attribute__((visibility("default")))

extern "C" DSA_PLUGIN_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    dsa::plugin::setPluginLoggerFinder(finder);
}

extern "C" DSA_PLUGIN_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static dsa::plugin::DSAIndexerTopKPluginCreator sIndexerCreator;
    static dsa::plugin::DSASparseAttentionPluginCreator sAttentionCreator;
    static dsa::plugin::DSABlockSparseAttentionPluginCreator sBlockAttentionCreator;
    static dsa::plugin::DSAMoEExpertsPluginCreator sMoECreator;
    static dsa::plugin::DSAMoEExpertsFP8PluginCreator sMoEFP8Creator;
    static nvinfer1::IPluginCreatorInterface* const sCreators[]
        = {&sIndexerCreator, &sAttentionCreator, &sBlockAttentionCreator, &sMoECreator, &sMoEFP8Creator};
    nbCreators = static_cast<int32_t>(sizeof(sCreators) / sizeof(sCreators[0]));
    return sCreators;
}
