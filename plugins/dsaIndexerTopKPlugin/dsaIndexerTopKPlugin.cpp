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
constexpr char const* kPLUGIN_NAME = "DSAIndexerTopK";
constexpr int32_t kIN_Q = 0;
constexpr int32_t kIN_K = 1;
constexpr int32_t kIN_W = 2;
constexpr int32_t kIN_LENGTHS = 3;
} // namespace

DSAIndexerTopKPlugin::DSAIndexerTopKPlugin(int32_t topk, float scale, int32_t causal)
    : DSAPluginBase(kPLUGIN_NAME)
    , mTopK(topk)
    , mScale(scale)
    , mCausal(causal != 0 ? 1 : 0)
{
    if (mTopK <= 0)
    {
        throw PluginError("DSAIndexerTopK: attribute 'topk' must be positive, got " + std::to_string(mTopK));
    }
    if (!std::isfinite(mScale))
    {
        throw PluginError("DSAIndexerTopK: attribute 'scale' must be finite");
    }
    initFields();
}

DSAIndexerTopKPlugin::DSAIndexerTopKPlugin(DSAIndexerTopKPlugin const& other)
    : DSAPluginBase(other)
    , mTopK(other.mTopK)
    , mScale(other.mScale)
    , mCausal(other.mCausal)
    , mNbInputs(other.mNbInputs)
{
    initFields();
}

void DSAIndexerTopKPlugin::initFields()
{
    mFields.clear();
    mFields.addInt32("topk", &mTopK);
    mFields.addFloat32("scale", &mScale);
    mFields.addInt32("causal", &mCausal);
    mDescription = "topk=" + std::to_string(mTopK) + ";scale=" + std::to_string(mScale)
        + ";causal=" + std::to_string(mCausal);
}

DSAPluginBase* DSAIndexerTopKPlugin::cloneImpl() const
{
    return new DSAIndexerTopKPlugin(*this);
}

void DSAIndexerTopKPlugin::checkInputs(Dims const* dims, int32_t nbInputs)
{
    if (nbInputs != 3 && nbInputs != 4)
    {
        throw PluginError("DSAIndexerTopK takes 3 or 4 inputs (q, k, w[, lengths]), got " + std::to_string(nbInputs));
    }
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
    if (nbInputs == 4 && (dims[kIN_LENGTHS].nbDims != 1 || !sameOrUnknown(dims[kIN_LENGTHS].d[0], q.d[0])))
    {
        throw PluginError("DSAIndexerTopK: lengths must be [B], got " + dimsToString(dims[kIN_LENGTHS]));
    }
    mNbInputs = nbInputs;
}

int32_t DSAIndexerTopKPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* /*inputTypes*/, int32_t nbInputs) const noexcept
{
    if (outputTypes == nullptr || nbOutputs != 1 || (nbInputs != 3 && nbInputs != 4))
    {
        logError("DSAIndexerTopK getOutputDataTypes: expected 3 or 4 inputs and 1 output");
        return -1;
    }
    outputTypes[0] = DataType::kINT32;
    return 0;
}

int32_t DSAIndexerTopKPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /*shapeInputs*/, int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs,
    IExprBuilder& exprBuilder) noexcept
{
    return guard("getOutputShapes", -1, [&]() {
        if (inputs == nullptr || outputs == nullptr || nbOutputs != 1 || (nbInputs != 3 && nbInputs != 4))
        {
            throw PluginError("expected 3 or 4 inputs and 1 output");
        }
        if (inputs[kIN_Q].nbDims != 4)
        {
            throw PluginError("q must be 4-D [B,S,H,D]");
        }
        outputs[0].nbDims = 3;
        outputs[0].d[0] = inputs[kIN_Q].d[0];
        outputs[0].d[1] = inputs[kIN_Q].d[1];
        outputs[0].d[2] = exprBuilder.constant(mTopK);
        return 0;
    });
}

bool DSAIndexerTopKPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (inOut == nullptr || pos < 0 || pos >= nbInputs + nbOutputs || nbOutputs != 1)
    {
        return false;
    }
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
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
    if (inputs == nullptr || nbInputs < 3)
    {
        return 0;
    }
    Dims const& q = inputs[kIN_Q].max;
    Dims const& k = inputs[kIN_K].max;
    if (q.nbDims != 4 || k.nbDims != 3)
    {
        return 0;
    }
    return indexerTopKWorkspaceSize(q.d[0], q.d[1], k.d[1], q.d[2], q.d[3], mTopK);
}

int32_t DSAIndexerTopKPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    return guard("enqueue", -1, [&]() {
        if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
        {
            throw PluginError("null tensor descriptors or pointers");
        }
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
        p.lengths = mNbInputs == 4 ? static_cast<int32_t const*>(inputs[kIN_LENGTHS]) : nullptr;
        p.out = static_cast<int32_t*>(outputs[0]);
        p.B = q.d[0];
        p.S = q.d[1];
        p.H = q.d[2];
        p.D = q.d[3];
        p.T = k.d[1];
        p.topk = mTopK;
        p.scale = mScale;
        p.causal = mCausal;
        // getWorkspaceSize() was computed for the profile's maximum shapes and is monotone in them.
        size_t const wsBytes = indexerTopKWorkspaceSize(p.B, p.S, p.T, p.H, p.D, p.topk);
        checkKernelStatus(launchIndexerTopK(p, dtype, wDtype, workspace, wsBytes, stream), "DSAIndexerTopK kernel");
        return 0;
    });
}

// ---------------------------------------------------------------------------------------------

DSAIndexerTopKPluginCreator::DSAIndexerTopKPluginCreator()
    : DSAPluginCreatorBase(kPLUGIN_NAME,
        {PluginField("topk", nullptr, PluginFieldType::kINT32, 1), PluginField("scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("causal", nullptr, PluginFieldType::kINT32, 1)})
{
}

IPluginV3* DSAIndexerTopKPluginCreator::create(PluginFieldReader const& fields, TensorRTPhase /*phase*/)
{
    int64_t const topk = fields.requireInt("topk");
    float const scale = fields.requireFloat("scale");
    int64_t const causal = fields.getInt("causal", 1);
    if (topk <= 0 || topk > 0x7fffffff)
    {
        throw PluginError("attribute 'topk' must be in [1, 2^31), got " + std::to_string(topk));
    }
    return new DSAIndexerTopKPlugin(static_cast<int32_t>(topk), scale, causal != 0 ? 1 : 0);
}

} // namespace plugin
} // namespace dsa
