#include "dsaBlockSparseAttentionPlugin/dsaBlockSparseAttentionPlugin.h"

#include "dsaBlockSparseAttentionPlugin/dsaBlockSparseAttentionKernel.h"

#include <cmath>
#include <limits>
#include <string>

using namespace nvinfer1;

namespace dsa
{
namespace plugin
{
namespace
{
constexpr char const* kPLUGIN_NAME = "DSABlockSparseAttention";
constexpr int32_t kIN_Q = 0;
constexpr int32_t kIN_K = 1;
constexpr int32_t kIN_V = 2;
constexpr int32_t kIN_BLOCK_INDEX = 3;
constexpr int32_t kNB_INPUTS = 4;

int32_t checkedInt32(int64_t value, char const* name)
{
    if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max())
    {
        throw PluginError(std::string("DSABlockSparseAttention: attribute '") + name + "' does not fit int32");
    }
    return static_cast<int32_t>(value);
}
} // namespace

DSABlockSparseAttentionPlugin::DSABlockSparseAttentionPlugin(int32_t blockSize, float scale, int32_t causal)
    : DSAPluginBase(kPLUGIN_NAME)
    , mBlockSize(blockSize)
    , mScale(scale)
    , mCausal(causal)
{
    if (mBlockSize < 1)
    {
        throw PluginError("DSABlockSparseAttention: attribute 'block_size' must be at least 1, got "
            + std::to_string(mBlockSize));
    }
    if (!std::isfinite(mScale))
    {
        throw PluginError("DSABlockSparseAttention: attribute 'scale' must be finite");
    }
    if (mCausal != 0 && mCausal != 1)
    {
        throw PluginError("DSABlockSparseAttention: attribute 'causal' must be 0 or 1, got " + std::to_string(mCausal));
    }
    initFields();
}

DSABlockSparseAttentionPlugin::DSABlockSparseAttentionPlugin(DSABlockSparseAttentionPlugin const& other)
    : DSAPluginBase(other)
    , mBlockSize(other.mBlockSize)
    , mScale(other.mScale)
    , mCausal(other.mCausal)
{
    initFields();
}

void DSABlockSparseAttentionPlugin::initFields()
{
    mFields.clear();
    mFields.addInt32("block_size", &mBlockSize);
    mFields.addFloat32("scale", &mScale);
    mFields.addInt32("causal", &mCausal);
    mDescription = "block_size=" + std::to_string(mBlockSize) + ";scale=" + std::to_string(mScale)
        + ";causal=" + std::to_string(mCausal);
}

DSAPluginBase* DSABlockSparseAttentionPlugin::cloneImpl() const
{
    return new DSABlockSparseAttentionPlugin(*this);
}

void DSABlockSparseAttentionPlugin::checkInputs(Dims const* dims, int32_t nbInputs)
{
    if (nbInputs != kNB_INPUTS)
    {
        throw PluginError(
            "DSABlockSparseAttention takes 4 inputs (q, k, v, block_index), got " + std::to_string(nbInputs));
    }
    Dims const& q = dims[kIN_Q];
    Dims const& k = dims[kIN_K];
    Dims const& v = dims[kIN_V];
    Dims const& bi = dims[kIN_BLOCK_INDEX];
    if (q.nbDims != 4 || k.nbDims != 4 || v.nbDims != 4 || bi.nbDims != 4)
    {
        throw PluginError("DSABlockSparseAttention expects q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,T,Hkv,Dv], "
                          "block_index [B,H,ceil(S/block_size),Kb]; got q "
            + dimsToString(q) + ", k " + dimsToString(k) + ", v " + dimsToString(v) + ", block_index "
            + dimsToString(bi));
    }
    bool ok = sameOrUnknown(q.d[0], k.d[0]) && sameOrUnknown(q.d[0], v.d[0]) && sameOrUnknown(q.d[0], bi.d[0])
        && sameOrUnknown(k.d[1], v.d[1]) && sameOrUnknown(k.d[2], v.d[2]) && sameOrUnknown(q.d[3], k.d[3])
        && sameOrUnknown(q.d[2], bi.d[1]);
    if (ok && q.d[2] > 0 && k.d[2] > 0)
    {
        ok = q.d[2] % k.d[2] == 0;
    }
    if (!ok)
    {
        throw PluginError("DSABlockSparseAttention: inconsistent shapes q " + dimsToString(q) + ", k "
            + dimsToString(k) + ", v " + dimsToString(v) + ", block_index " + dimsToString(bi)
            + " (H must be a multiple of Hkv; block_index has q's B and H)");
    }
    if (q.d[1] >= 0 && bi.d[2] >= 0 && bi.d[2] != (q.d[1] + mBlockSize - 1) / mBlockSize)
    {
        throw PluginError("DSABlockSparseAttention: block_index " + dimsToString(bi) + " must have ceil(S/"
            + std::to_string(mBlockSize) + ") = " + std::to_string((q.d[1] + mBlockSize - 1) / mBlockSize)
            + " query blocks for q " + dimsToString(q));
    }
}

int32_t DSABlockSparseAttentionPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (outputTypes == nullptr || inputTypes == nullptr || nbOutputs != 1 || nbInputs != kNB_INPUTS)
    {
        logError("DSABlockSparseAttention getOutputDataTypes: expected 4 inputs and 1 output");
        return -1;
    }
    outputTypes[0] = inputTypes[kIN_Q];
    return 0;
}

int32_t DSABlockSparseAttentionPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /*shapeInputs*/, int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs,
    IExprBuilder& /*exprBuilder*/) noexcept
{
    return guard("getOutputShapes", -1, [&]() {
        if (inputs == nullptr || outputs == nullptr || nbOutputs != 1 || nbInputs != kNB_INPUTS)
        {
            throw PluginError("expected 4 inputs and 1 output");
        }
        if (inputs[kIN_Q].nbDims != 4 || inputs[kIN_V].nbDims != 4)
        {
            throw PluginError("q and v must be 4-D");
        }
        outputs[0].nbDims = 4;
        outputs[0].d[0] = inputs[kIN_Q].d[0];
        outputs[0].d[1] = inputs[kIN_Q].d[1];
        outputs[0].d[2] = inputs[kIN_Q].d[2];
        outputs[0].d[3] = inputs[kIN_V].d[3];
        return 0;
    });
}

bool DSABlockSparseAttentionPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (inOut == nullptr || nbInputs != kNB_INPUTS || nbOutputs != 1 || pos < 0 || pos >= nbInputs + nbOutputs)
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
    if (pos == kIN_BLOCK_INDEX)
    {
        return desc.type == DataType::kINT32;
    }
    // k, v and the output share q's type.
    return desc.type == inOut[kIN_Q].desc.type;
}

size_t DSABlockSparseAttentionPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/,
    int32_t /*nbInputs*/, DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return 0;
}

int32_t DSABlockSparseAttentionPlugin::enqueue(PluginTensorDesc const* inputDesc,
    PluginTensorDesc const* /*outputDesc*/, void const* const* inputs, void* const* outputs, void* /*workspace*/,
    cudaStream_t stream) noexcept
{
    return guard("enqueue", -1, [&]() {
        if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
        {
            throw PluginError("null tensor descriptors or pointers");
        }
        DType dtype{};
        if (!toKernelDType(inputDesc[kIN_Q].type, dtype))
        {
            throw PluginError("unsupported input type");
        }
        Dims const& q = inputDesc[kIN_Q].dims;
        Dims const& k = inputDesc[kIN_K].dims;
        Dims const& v = inputDesc[kIN_V].dims;
        Dims const& bi = inputDesc[kIN_BLOCK_INDEX].dims;
        if (bi.d[2] != (q.d[1] + mBlockSize - 1) / mBlockSize || v.d[1] != k.d[1])
        {
            throw PluginError("block_index " + dimsToString(bi) + " must have ceil(S/block_size) query blocks and v "
                + dimsToString(v) + " k's T rows, for q " + dimsToString(q) + " and k " + dimsToString(k));
        }
        BlockSparseAttentionParams p;
        p.q = inputs[kIN_Q];
        p.k = inputs[kIN_K];
        p.v = inputs[kIN_V];
        p.blockIndex = static_cast<int32_t const*>(inputs[kIN_BLOCK_INDEX]);
        p.out = outputs[0];
        p.B = q.d[0];
        p.S = q.d[1];
        p.H = q.d[2];
        p.Dk = q.d[3];
        p.T = k.d[1];
        p.Hkv = k.d[2];
        p.Dv = v.d[3];
        p.Kb = bi.d[3];
        p.blockSize = mBlockSize;
        p.scale = mScale;
        p.causal = mCausal != 0;
        checkKernelStatus(launchBlockSparseAttention(p, dtype, stream), "DSABlockSparseAttention kernel");
        return 0;
    });
}

// ---------------------------------------------------------------------------------------------

DSABlockSparseAttentionPluginCreator::DSABlockSparseAttentionPluginCreator()
    : DSAPluginCreatorBase(kPLUGIN_NAME,
        {PluginField("block_size", nullptr, PluginFieldType::kINT32, 1),
            PluginField("scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("causal", nullptr, PluginFieldType::kINT32, 1)})
{
}

IPluginV3* DSABlockSparseAttentionPluginCreator::create(PluginFieldReader const& fields, TensorRTPhase /*phase*/)
{
    return new DSABlockSparseAttentionPlugin(checkedInt32(fields.requireInt("block_size"), "block_size"),
        fields.requireFloat("scale"), checkedInt32(fields.getInt("causal", 1), "causal"));
}

} // namespace plugin
} // namespace dsa
