#include "dsaIndexerTopKPlugin/dsaIndexerTopKPlugin.h"

#include "dsaIndexerTopKPlugin/dsaIndexerTopKKernel.h"

#include <cmath>

using namespace nvinfer1;

namespace dsa
{
namespace plugin
{
namespace
{
using Plugin = DSAIndexerTopKPlugin;
constexpr int32_t kIN_Q = Plugin::inputIndex("q");
constexpr int32_t kIN_K = Plugin::inputIndex("k");
constexpr int32_t kIN_W = Plugin::inputIndex("w");
constexpr int32_t kIN_LENGTHS = Plugin::inputIndex("lengths");
constexpr int32_t kTOPK = Plugin::attributeIndex("topk");
constexpr int32_t kSCALE = Plugin::attributeIndex("scale");
constexpr int32_t kCAUSAL = Plugin::attributeIndex("causal");
} // namespace

DSAIndexerTopKPlugin::DSAIndexerTopKPlugin(int32_t topk, float scale, int32_t causal)
    : DSAPlugin({topk, scale, causal != 0 ? 1 : 0})
{
    if (topk <= 0)
    {
        throw PluginError("DSAIndexerTopK: attribute 'topk' must be positive, got " + std::to_string(topk));
    }
    if (!std::isfinite(scale))
    {
        throw PluginError("DSAIndexerTopK: attribute 'scale' must be finite");
    }
}

DSAIndexerTopKPlugin* DSAIndexerTopKPlugin::create(PluginFieldReader const& fields)
{
    int64_t const topk = fields.getInt(kTOPK);
    float const scale = fields.getFloat(kSCALE);
    int64_t const causal = fields.getInt(kCAUSAL);
    if (topk <= 0 || topk > 0x7fffffff)
    {
        throw PluginError("attribute 'topk' must be in [1, 2^31), got " + std::to_string(topk));
    }
    return new DSAIndexerTopKPlugin(static_cast<int32_t>(topk), scale, causal != 0 ? 1 : 0);
}

void DSAIndexerTopKPlugin::checkInputs(Dims const* dims, int32_t nbInputs)
{
    Dims const& q = dims[kIN_Q];
    Dims const& k = dims[kIN_K];
    Dims const& w = dims[kIN_W];
    if (q.nbDims != 4 || k.nbDims != 3 || w.nbDims != 3)
    {
        throw PluginError("DSAIndexerTopK expects q [B,S,H,D], k [B,T,D], w [B,S,H]; got q " + dimsToString(q) + ", k "
            + dimsToString(k) + ", w " + dimsToString(w));
    }
    if (!sameOrUnknown(q.d[0], k.d[0]) || !sameOrUnknown(q.d[0], w.d[0]) || !sameOrUnknown(q.d[1], w.d[1])
        || !sameOrUnknown(q.d[2], w.d[2]) || !sameOrUnknown(q.d[3], k.d[2]))
    {
        throw PluginError("DSAIndexerTopK: inconsistent shapes q " + dimsToString(q) + ", k " + dimsToString(k)
            + ", w " + dimsToString(w));
    }
    if (nbInputs > kIN_LENGTHS && (dims[kIN_LENGTHS].nbDims != 1 || !sameOrUnknown(dims[kIN_LENGTHS].d[0], q.d[0])))
    {
        throw PluginError("DSAIndexerTopK: lengths must be [B], got " + dimsToString(dims[kIN_LENGTHS]));
    }
}

bool DSAIndexerTopKPlugin::inferOutputTypes(DataType* outputTypes, DataType const* /*inputTypes*/) const noexcept
{
    outputTypes[0] = DataType::kINT32;
    return true;
}

void DSAIndexerTopKPlugin::inferOutputShapes(DimsExprs const* inputs, DimsExprs* outputs, IExprBuilder& exprBuilder) const
{
    if (inputs[kIN_Q].nbDims != 4)
    {
        throw PluginError("q must be 4-D [B,S,H,D]");
    }
    outputs[0].nbDims = 3;
    outputs[0].d[0] = inputs[kIN_Q].d[0];
    outputs[0].d[1] = inputs[kIN_Q].d[1];
    outputs[0].d[2] = exprBuilder.constant(int32Attr(kTOPK));
}

bool DSAIndexerTopKPlugin::formatsNeedInputCount() const noexcept
{
    // Answers for any input count, so that a wrong count reaches configurePlugin's message.
    return false;
}

bool DSAIndexerTopKPlugin::supportsType(int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t /*nbInputs*/) const noexcept
{
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (pos == kIN_Q)
    {
        return isFloatType(desc.type);
    }
    DataType const qType = inOut[kIN_Q].desc.type;
    if (pos == kIN_K)
    {
        return desc.type == qType;
    }
    if (pos == kIN_W)
    {
        return desc.type == qType || desc.type == DataType::kFLOAT;
    }
    // lengths (when present) and the output indices.
    return desc.type == DataType::kINT32;
}

size_t DSAIndexerTopKPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    if (inputs == nullptr || nbInputs < kTABLE.nbRequiredInputs())
    {
        return 0;
    }
    Dims const& q = inputs[kIN_Q].max;
    Dims const& k = inputs[kIN_K].max;
    if (q.nbDims != 4 || k.nbDims != 3)
    {
        return 0;
    }
    return indexerTopKWorkspaceSize(q.d[0], q.d[1], k.d[1], q.d[2], q.d[3], int32Attr(kTOPK));
}

void DSAIndexerTopKPlugin::launch(PluginTensorDesc const* inputDesc, void const* const* inputs, void* const* outputs,
    void* workspace, cudaStream_t stream) const
{
    Dims const& q = inputDesc[kIN_Q].dims;
    Dims const& k = inputDesc[kIN_K].dims;
    DType dtype{};
    DType wDtype{};
    if (!toKernelDType(inputDesc[kIN_Q].type, dtype) || !toKernelDType(inputDesc[kIN_W].type, wDtype))
    {
        throw PluginError("unsupported input type");
    }
    IndexerTopKParams p;
    p.q = inputs[kIN_Q];
    p.k = inputs[kIN_K];
    p.w = inputs[kIN_W];
    p.lengths = hasInput(kIN_LENGTHS) ? static_cast<int32_t const*>(inputs[kIN_LENGTHS]) : nullptr;
    p.out = static_cast<int32_t*>(outputs[0]);
    p.B = q.d[0];
    p.S = q.d[1];
    p.H = q.d[2];
    p.D = q.d[3];
    p.T = k.d[1];
    p.topk = int32Attr(kTOPK);
    p.scale = float32Attr(kSCALE);
    p.causal = int32Attr(kCAUSAL);
    // getWorkspaceSize() was computed for the profile's maximum shapes and is monotone in them.
    size_t const wsBytes = indexerTopKWorkspaceSize(p.B, p.S, p.T, p.H, p.D, p.topk);
    checkKernelStatus(launchIndexerTopK(p, dtype, wDtype, workspace, wsBytes, stream), "DSAIndexerTopK kernel");
}

} // namespace plugin
} // namespace dsa
