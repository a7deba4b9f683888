#include "dsaIndexerTopKPlugin/dsaIndexerTopKPlugin.h"

#include "dsaIndexerTopKPlugin/dsaIndexerTopKKernel.h"

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
} // namespace

DSAIndexerTopKPlugin::DSAIndexerTopKPlugin(int32_t topk, float scale, int32_t causal)
    : DSAIndexerPlugin(topk, scale, causal)
{
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

bool DSAIndexerTopKPlugin::formatsNeedInputCount() const noexcept
{
    // Answers for any input count, so that a wrong count reaches configurePlugin's message.
    return false;
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
