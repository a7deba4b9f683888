/*
 * Load-time registration for libdsa_plugins_static.so: dlopen()ing the library registers all
 * creators with the global plugin registry (what `polygraphy run --plugins` relies on). Links
 * libnvinfer for getPluginRegistry().
 *
 * The creators are registered explicitly under the namespace they report ("dsa"):
 * REGISTER_TENSORRT_PLUGIN registers under "", and a V3 creator cannot be told another namespace,
 * so TensorRT would not find ("DSAIndexerTopK", "1", "dsa"): the name, version and namespace the
 * ONNX nodes and the engines carry.
 */
#include "NvInferRuntime.h"

#include "common/dsaPluginCommon.h"
#include "dsaBlockSparseAttentionPlugin/dsaBlockSparseAttentionPlugin.h"
#include "dsaIndexerTopKPlugin/dsaIndexerTopKPlugin.h"
#include "dsaMoEExpertsPlugin/dsaMoEExpertsPlugin.h"
#include "dsaSparseAttentionPlugin/dsaSparseAttentionPlugin.h"

#include <string>

namespace dsa
{
namespace plugin
{
namespace
{

//! Owns one creator and registers it under kPLUGIN_NAMESPACE when the library is loaded.
template <typename Creator>
class NamespacedRegistrar
{
public:
    NamespacedRegistrar()
    {
        nvinfer1::IPluginRegistry* registry = ::getPluginRegistry();
        if (registry == nullptr || !registry->registerCreator(mCreator, kPLUGIN_NAMESPACE))
        {
            logError(std::string("could not register the ") + mCreator.getPluginName()
                + " plugin creator under namespace \"" + kPLUGIN_NAMESPACE + "\" (already registered?)");
        }
    }

private:
    Creator mCreator{};
};

NamespacedRegistrar<DSAIndexerTopKPluginCreator> gIndexerRegistrar;
NamespacedRegistrar<DSASparseAttentionPluginCreator> gAttentionRegistrar;
NamespacedRegistrar<DSABlockSparseAttentionPluginCreator> gBlockAttentionRegistrar;
NamespacedRegistrar<DSAMoEExpertsPluginCreator> gMoERegistrar;
NamespacedRegistrar<DSAMoEExpertsFP8PluginCreator> gMoEFP8Registrar;

} // namespace
} // namespace plugin
} // namespace dsa
