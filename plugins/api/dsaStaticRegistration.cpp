/*
 * Load-time registration for libdsa_plugins_static.so: dlopen()ing the library registers all
 * creators of api/dsaCreators.h with the global plugin registry (what `polygraphy run --plugins`
 * relies on). Links libnvinfer for getPluginRegistry().
 *
 * The creators are registered explicitly under the namespace they report ("dsa"):
 * REGISTER_TENSORRT_PLUGIN registers under "", and a V3 creator cannot be told another namespace,
 * so TensorRT would not find ("DSAIndexerTopK", "1", "dsa"): the name, version and namespace the
 * ONNX nodes and the engines carry.
 */
#include "NvInferRuntime.h"

#include "api/dsaCreators.h"
#include "common/dsaPluginCommon.h"

#include <string>

namespace dsa
{
namespace plugin
{
namespace
{

//! Registers one creator under kPLUGIN_NAMESPACE; a failure is logged.
void registerUnderNamespace(nvinfer1::IPluginCreatorV3One& creator)
{
    nvinfer1::IPluginRegistry* registry = ::getPluginRegistry();
    if (registry == nullptr || !registry->registerCreator(creator, kPLUGIN_NAMESPACE))
    {
        logError(std::string("could not register the ") + creator.getPluginName()
            + " plugin creator under namespace \"" + kPLUGIN_NAMESPACE + "\" (already registered?)");
    }
}

//! Registers the creators of a plugin list, in its order, when the library is loaded.
template <class List>
class NamespacedRegistrar;

template <class... Plugins>
class NamespacedRegistrar<PluginList<Plugins...>>
{
public:
    NamespacedRegistrar()
    {
        (registerUnderNamespace(creatorOf<Plugins>()), ...);
    }
};

NamespacedRegistrar<DSAPlugins> gRegistrar;

} // namespace
} // namespace plugin
} // namespace dsa
