#include "dsaPagedCacheWritePlugin/dsaPagedCacheWritePlugin.h"

#include "api/dsa_kernels.h"

#include <cuda_runtime_api.h>

using namespace nvinfer1;

namespace dsa
{
namespace plugin
{
namespace
{
using Plugin = DSAPagedCacheWritePlugin;
constexpr int32_t kIN_POOL = Plugin::inputIndex("pool");
constexpr int32_t kIN_INDICES = Plugin::inputIndex("indices");
constexpr int32_t kIN_UPDATES = Plugin::inputIndex("updates");
} // namespace

void DSAPagedCacheWritePlugin::checkInputs(Dims const* dims, int32_t /*nbInputs*/)
{
    Dims const& pool = dims[kIN_POOL];
    Dims const& idx = dims[kIN_INDICES];
    Dims const& upd = dims[kIN_UPDATES];
    bool const ranks = pool.nbDims == 3 && idx.nbDims == 3 && upd.nbDims == 3;
    if (!ranks || !sameOrUnknown(idx.d[2], 2) || !sameOrUnknown(idx.d[0], upd.d[0]) || !sameOrUnknown(idx.d[1], upd.d[1])
        || !sameOrUnknown(pool.d[2], upd.d[2]))
    {
        throw PluginError("DSAPagedCacheWrite expects pool [P,page,W], indices [B,S,2] and updates [B,S,W]; got pool "
            + dimsToString(pool) + ", indices " + dimsToString(idx) + ", updates " + dimsToString(upd));
    }
}

bool DSAPagedCacheWritePlugin::inferOutputTypes(DataType* outputTypes, DataType const* inputTypes) const noexcept
{
    if (inputTypes == nullptr)
    {
        return false;
    }
    outputTypes[0] = inputTypes[kIN_POOL];
    return true;
}

void DSAPagedCacheWritePlugin::inferOutputShapes(
    DimsExprs const* inputs, DimsExprs* outputs, IExprBuilder& /*exprBuilder*/) const
{
    if (inputs[kIN_POOL].nbDims != 3)
    {
        throw PluginError("pool must be 3-D [P,page,W]");
    }
    outputs[0] = inputs[kIN_POOL];
}

bool DSAPagedCacheWritePlugin::supportsType(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t /*nbInputs*/) const noexcept
{
    DataType const type = inOut[pos].desc.type;
    if (pos == kIN_POOL)
    {
        return isFloatType(type);
    }
    if (pos == kIN_INDICES)
    {
        return type == DataType::kINT64; // ONNX ScatterND's indices
    }
    return type == inOut[kIN_POOL].desc.type; // updates and the output
}

void DSAPagedCacheWritePlugin::launch(PluginTensorDesc const* inputDesc, void const* const* inputs,
    void* const* outputs, void* /*workspace*/, cudaStream_t stream) const
{
    DType dtype{};
    if (!toKernelDType(inputDesc[kIN_POOL].type, dtype))
    {
        throw PluginError("unsupported pool type");
    }
    Dims const& pool = inputDesc[kIN_POOL].dims;
    Dims const& idx = inputDesc[kIN_INDICES].dims;
    Dims const& upd = inputDesc[kIN_UPDATES].dims;
    if (idx.d[2] != 2 || idx.d[0] != upd.d[0] || idx.d[1] != upd.d[1] || pool.d[2] != upd.d[2])
    {
        throw PluginError("expects pool [P,page,W], indices [B,S,2] and updates [B,S,W]; got pool " + dimsToString(pool)
            + ", indices " + dimsToString(idx) + ", updates " + dimsToString(upd));
    }
    // The output is the pool's buffer when the engine aliases them: getAliasedInput(0) == 0 is honoured
    // with PreviewFeature::kALIASED_PLUGIN_IO_10_03 (TensorRT 10.3+), and TensorRT then hands the
    // same address for both, inserting copies outside the plugin where it needs them ("TensorRT may
    // insert copies to facilitate this capability", NvInferRuntime.h). Without the preview feature,
    // or from headers older than 10.3, TensorRT never asks and gives the output a buffer of its own:
    // the pool is copied into it first, which is ScatterND's cost and result.
    if (outputs[0] != inputs[kIN_POOL])
    {
        size_t const bytes = static_cast<size_t>(pool.d[0]) * static_cast<size_t>(pool.d[1])
            * static_cast<size_t>(pool.d[2]) * dtypeSize(dtype);
        checkKernelStatus(checkCuda(cudaMemcpyAsync(outputs[0], inputs[kIN_POOL], bytes, cudaMemcpyDeviceToDevice, stream),
                              "cudaMemcpyAsync"),
            "DSAPagedCacheWrite pool copy (the output is not aliased to the pool)");
    }
    checkKernelStatus(dsa_paged_cache_write(outputs[0], static_cast<int64_t const*>(inputs[kIN_INDICES]),
                          inputs[kIN_UPDATES], idx.d[0], idx.d[1], pool.d[0], pool.d[1], pool.d[2],
                          static_cast<int32_t>(dtype), stream),
        "DSAPagedCacheWrite kernel");
}

} // namespace plugin
} // namespace dsa
