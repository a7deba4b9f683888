#include "dsaIndexerTopKPlugin/dsaIndexerTopKPlugin.h"

#include "common/dsaPluginCommon.h"
#include "dsaIndexerTopKPlugin/dsaIndexerTopKKernel.h"

#include <cmath>
#include <cstring>
#include <exception>

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

std::string dimsToString(Dims const& d)
{
    std::string s = "[";
    for (int32_t i = 0; i < d.nbDims; ++i)
    {
        s += (i ? "," : "") + std::to_string(d.d[i]);
    }
    return s + "]";
}
} // namespace

DSAIndexerTopKPlugin::DSAIndexerTopKPlugin(int32_t topk, float scale, int32_t causal)
    : mTopK(topk)
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
    : IPluginV3(other)
    , IPluginV3OneCore(other)
    , IPluginV3OneBuild(other)
    , IPluginV3OneRuntime(other)
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
    mFields.emplace_back("topk", &mTopK, PluginFieldType::kINT32, 1);
    mFields.emplace_back("scale", &mScale, PluginFieldType::kFLOAT32, 1);
    mFields.emplace_back("causal", &mCausal, PluginFieldType::kINT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
    mDescription = "topk=" + std::to_string(mTopK) + ";scale=" + std::to_string(mScale)
        + ";causal=" + std::to_string(mCausal);
}

IPluginCapability* DSAIndexerTopKPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* DSAIndexerTopKPlugin::clone() noexcept
{
    try
    {
        return new DSAIndexerTopKPlugin(*this);
    }
    catch (std::exception const& e)
    {
        logError(std::string("DSAIndexerTopK clone: ") + e.what());
    }
    return nullptr;
}

char const* DSAIndexerTopKPlugin::getPluginName() const noexcept
{
    return kPLUGIN_NAME;
}

char const* DSAIndexerTopKPlugin::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* DSAIndexerTopKPlugin::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

int32_t DSAIndexerTopKPlugin::getNbOutputs() const noexcept
{
    return 1;
}

void DSAIndexerTopKPlugin::validateShapes(Dims const* dims, int32_t nbInputs) const
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
    auto known = [](int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; };
    if (!known(q.d[0], k.d[0]) || !known(q.d[0], w.d[0]) || !known(q.d[1], w.d[1]) || !known(q.d[2], w.d[2])
        || !known(q.d[3], k.d[2]))
    {
        throw PluginError("DSAIndexerTopK: inconsistent shapes q " + dimsToString(q) + ", k " + dimsToString(k)
            + ", w " + dimsToString(w));
    }
    if (nbInputs == 4 && (dims[kIN_LENGTHS].nbDims != 1 || !known(dims[kIN_LENGTHS].d[0], q.d[0])))
    {
        throw PluginError("DSAIndexerTopK: lengths must be [B], got " + dimsToString(dims[kIN_LENGTHS]));
    }
}

int32_t DSAIndexerTopKPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept
{
    try
    {
        if (in == nullptr || nbOutputs != 1)
        {
            throw PluginError("DSAIndexerTopK: expected 1 output");
        }
        std::vector<Dims> dims;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims.push_back(in[i].desc.dims);
        }
        validateShapes(dims.data(), nbInputs);
        mNbInputs = nbInputs;
        return 0;
    }
    catch (std::exception const& e)
    {
        logError(std::string("DSAIndexerTopK configurePlugin: ") + e.what());
    }
    return -1;
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
    try
    {
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
    }
    catch (std::exception const& e)
    {
        logError(std::string("DSAIndexerTopK getOutputShapes: ") + e.what());
    }
    return -1;
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

char const* DSAIndexerTopKPlugin::getTimingCacheID() noexcept
{
    return mDescription.c_str();
}

char const* DSAIndexerTopKPlugin::getMetadataString() noexcept
{
    return mDescription.c_str();
}

int32_t DSAIndexerTopKPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept
{
    try
    {
        if (in == nullptr || nbOutputs != 1)
        {
            throw PluginError("expected 1 output");
        }
        std::vector<Dims> dims;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims.push_back(in[i].dims);
        }
        validateShapes(dims.data(), nbInputs);
        mNbInputs = nbInputs;
        return 0;
    }
    catch (std::exception const& e)
    {
        logError(std::string("DSAIndexerTopK onShapeChange: ") + e.what());
    }
    return -1;
}

int32_t DSAIndexerTopKPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    try
    {
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
    }
    catch (std::exception const& e)
    {
        logError(std::string("DSAIndexerTopK enqueue: ") + e.what());
    }
    return -1;
}

IPluginV3* DSAIndexerTopKPlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

PluginFieldCollection const* DSAIndexerTopKPlugin::getFieldsToSerialize() noexcept
{
    return &mFieldCollection;
}

// ---------------------------------------------------------------------------------------------

DSAIndexerTopKPluginCreator::DSAIndexerTopKPluginCreator()
{
    mFieldNames.emplace_back("topk", nullptr, PluginFieldType::kINT32, 1);
    mFieldNames.emplace_back("scale", nullptr, PluginFieldType::kFLOAT32, 1);
    mFieldNames.emplace_back("causal", nullptr, PluginFieldType::kINT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
}

char const* DSAIndexerTopKPluginCreator::getPluginName() const noexcept
{
    return kPLUGIN_NAME;
}

char const* DSAIndexerTopKPluginCreator::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* DSAIndexerTopKPluginCreator::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

PluginFieldCollection const* DSAIndexerTopKPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

IPluginV3* DSAIndexerTopKPluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    try
    {
        if (fc == nullptr || (fc->nbFields > 0 && fc->fields == nullptr))
        {
            throw PluginError("no plugin fields");
        }
        bool haveTopK = false;
        bool haveScale = false;
        int64_t topk = 0;
        float scale = 0.F;
        int64_t causal = 1;
        for (int32_t i = 0; i < fc->nbFields; ++i)
        {
            PluginField const& f = fc->fields[i];
            if (f.name == nullptr)
            {
                continue;
            }
            if (std::strcmp(f.name, "topk") == 0)
            {
                topk = readIntField(f);
                haveTopK = true;
            }
            else if (std::strcmp(f.name, "scale") == 0)
            {
                scale = readFloatField(f);
                haveScale = true;
            }
            else if (std::strcmp(f.name, "causal") == 0)
            {
                causal = readIntField(f);
            }
            else
            {
                logVerbose(std::string("DSAIndexerTopK: ignoring attribute '") + f.name + "'");
            }
        }
        if (!haveTopK || !haveScale)
        {
            throw PluginError("attributes 'topk' and 'scale' are required");
        }
        if (topk <= 0 || topk > 0x7fffffff)
        {
            throw PluginError("attribute 'topk' must be in [1, 2^31), got " + std::to_string(topk));
        }
        return new DSAIndexerTopKPlugin(static_cast<int32_t>(topk), scale, causal != 0 ? 1 : 0);
    }
    catch (std::exception const& e)
    {
        logError(std::string("DSAIndexerTopK createPlugin(") + (name != nullptr ? name : "") + "): " + e.what());
    }
    return nullptr;
}

} // namespace plugin
} // namespace dsa
