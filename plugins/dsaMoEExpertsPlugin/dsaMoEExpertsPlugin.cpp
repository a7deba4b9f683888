#include "dsaMoEExpertsPlugin/dsaMoEExpertsPlugin.h"

#include "dsaMoEExpertsPlugin/dsaMoEExpertsKernel.h"

#include <utility>
#include <vector>

using namespace nvinfer1;

namespace dsa
{
namespace plugin
{
namespace
{
constexpr char const* kPLUGIN_NAME = "DSAMoEExperts";
constexpr char const* kPLUGIN_NAME_FP8 = "DSAMoEExpertsFP8";
constexpr char const* kDEFAULT_ACTIVATION = "silu";
constexpr int32_t kDEFAULT_BLOCK_SIZE = 128;

constexpr int32_t kIN_X = 0;
constexpr int32_t kIN_IDS = 1;
constexpr int32_t kIN_WEIGHTS = 2;
constexpr int32_t kIN_GATE_UP = 3;
constexpr int32_t kIN_DOWN = 4;
constexpr int32_t kIN_GATE_UP_SCALE = 5;
constexpr int32_t kIN_DOWN_SCALE = 6;

int64_t ceilDivKnown(int64_t a, int64_t b)
{
    return a < 0 ? -1 : (a + b - 1) / b;
}
} // namespace

DSAMoEExpertsPlugin::DSAMoEExpertsPlugin(bool fp8, std::string activation, int32_t blockSize)
    : DSAPluginBase(fp8 ? kPLUGIN_NAME_FP8 : kPLUGIN_NAME)
    , mFp8(fp8)
    , mActivation(std::move(activation))
    , mBlockSize(fp8 ? blockSize : kDEFAULT_BLOCK_SIZE)
{
    if (mActivation != kDEFAULT_ACTIVATION)
    {
        throw PluginError(std::string(getPluginName()) + ": activation '" + mActivation
            + "' is not supported; only 'silu' is implemented");
    }
    if (mFp8 && (mBlockSize < 1 || mBlockSize > (1 << 30)))
    {
        throw PluginError(
            "DSAMoEExpertsFP8: attribute 'block_size' must be in [1, 2^30], got " + std::to_string(mBlockSize));
    }
    initFields();
}

DSAMoEExpertsPlugin::DSAMoEExpertsPlugin(DSAMoEExpertsPlugin const& other)
    : DSAPluginBase(other)
    , mFp8(other.mFp8)
    , mActivation(other.mActivation)
    , mBlockSize(other.mBlockSize)
{
    initFields();
}

void DSAMoEExpertsPlugin::initFields()
{
    mFields.clear();
    mFields.addString("activation", &mActivation);
    mDescription = "activation=" + mActivation;
    if (mFp8)
    {
        mFields.addInt32("block_size", &mBlockSize);
        mDescription += ";block_size=" + std::to_string(mBlockSize);
    }
}

DSAPluginBase* DSAMoEExpertsPlugin::cloneImpl() const
{
    return new DSAMoEExpertsPlugin(*this);
}

int32_t DSAMoEExpertsPlugin::nbInputs() const
{
    return mFp8 ? 7 : 5;
}

void DSAMoEExpertsPlugin::checkInputs(Dims const* dims, int32_t nbIn)
{
    std::string const name = getPluginName();
    if (nbIn != nbInputs())
    {
        throw PluginError(name + " takes " + std::to_string(nbInputs()) + " inputs (x, topk_ids, topk_weights, gate_up, down"
            + (mFp8 ? ", gate_up_scale, down_scale" : "") + "), got " + std::to_string(nbIn));
    }
    Dims const& x = dims[kIN_X];
    Dims const& ids = dims[kIN_IDS];
    Dims const& w = dims[kIN_WEIGHTS];
    Dims const& gu = dims[kIN_GATE_UP];
    Dims const& dn = dims[kIN_DOWN];
    std::string const shapes = "x " + dimsToString(x) + ", topk_ids " + dimsToString(ids) + ", topk_weights "
        + dimsToString(w) + ", gate_up " + dimsToString(gu) + ", down " + dimsToString(dn);
    if (x.nbDims != 2 || ids.nbDims != 2 || w.nbDims != 2 || gu.nbDims != 3 || dn.nbDims != 3)
    {
        throw PluginError(name + " expects x [N,H], topk_ids [N,K], topk_weights [N,K], gate_up [E,2I,H], down [E,H,I]; got "
            + shapes);
    }
    int64_t const twoI = gu.d[1];
    int64_t const I = dn.d[2];
    bool ok = sameOrUnknown(x.d[0], ids.d[0]) && sameOrUnknown(x.d[0], w.d[0]) && sameOrUnknown(ids.d[1], w.d[1])
        && sameOrUnknown(gu.d[0], dn.d[0]) && sameOrUnknown(gu.d[2], x.d[1]) && sameOrUnknown(dn.d[1], x.d[1])
        && (twoI < 0 || twoI % 2 == 0) && sameOrUnknown(twoI, I < 0 ? -1 : 2 * I);
    if (!ok)
    {
        throw PluginError(name + ": inconsistent shapes " + shapes + " (need the same N and K, gate_up [E,2I,H], down [E,H,I])");
    }
    if (gu.d[0] > kMOE_MAX_EXPERTS || gu.d[0] == 0)
    {
        throw PluginError(name + ": E = " + std::to_string(gu.d[0]) + " experts; the kernels take 1 to "
            + std::to_string(kMOE_MAX_EXPERTS));
    }
    if (!mFp8)
    {
        return;
    }
    Dims const& gs = dims[kIN_GATE_UP_SCALE];
    Dims const& ds = dims[kIN_DOWN_SCALE];
    int64_t const bs = mBlockSize;
    int64_t const H = x.d[1] >= 0 ? x.d[1] : gu.d[2];
    int64_t const twoIKnown = twoI >= 0 ? twoI : (I >= 0 ? 2 * I : -1);
    int64_t const IKnown = I >= 0 ? I : (twoI >= 0 ? twoI / 2 : -1);
    bool const scaleOk = gs.nbDims == 3 && ds.nbDims == 3 && sameOrUnknown(gs.d[0], gu.d[0])
        && sameOrUnknown(ds.d[0], gu.d[0]) && sameOrUnknown(gs.d[1], ceilDivKnown(twoIKnown, bs))
        && sameOrUnknown(gs.d[2], ceilDivKnown(H, bs)) && sameOrUnknown(ds.d[1], ceilDivKnown(H, bs))
        && sameOrUnknown(ds.d[2], ceilDivKnown(IKnown, bs));
    if (!scaleOk)
    {
        throw PluginError("DSAMoEExpertsFP8: block scales gate_up_scale " + dimsToString(gs) + ", down_scale "
            + dimsToString(ds) + " do not match " + shapes + " with block_size " + std::to_string(bs)
            + " (need [E, ceil(2I/bs), ceil(H/bs)] and [E, ceil(H/bs), ceil(I/bs)])");
    }
}

int32_t DSAMoEExpertsPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbIn) const noexcept
{
    if (outputTypes == nullptr || inputTypes == nullptr || nbOutputs != 1 || nbIn != nbInputs())
    {
        logError(std::string(getPluginName()) + " getOutputDataTypes: expected " + std::to_string(nbInputs())
            + " inputs and 1 output");
        return -1;
    }
    outputTypes[0] = inputTypes[kIN_X];
    return 0;
}

int32_t DSAMoEExpertsPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbIn, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& /*exprBuilder*/) noexcept
{
    return guard("getOutputShapes", -1, [&]() {
        if (inputs == nullptr || outputs == nullptr || nbOutputs != 1 || nbIn != nbInputs())
        {
            throw PluginError("expected " + std::to_string(nbInputs()) + " inputs and 1 output");
        }
        if (inputs[kIN_X].nbDims != 2)
        {
            throw PluginError("x must be 2-D [N,H]");
        }
        outputs[0].nbDims = 2;
        outputs[0].d[0] = inputs[kIN_X].d[0];
        outputs[0].d[1] = inputs[kIN_X].d[1];
        return 0;
    });
}

bool DSAMoEExpertsPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbIn, int32_t nbOutputs) noexcept
{
    if (inOut == nullptr || nbIn != nbInputs() || nbOutputs != 1 || pos < 0 || pos >= nbIn + nbOutputs)
    {
        return false;
    }
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    if (pos == kIN_X)
    {
        return isFloatType(desc.type);
    }
    DataType const xType = inOut[kIN_X].desc.type;
    switch (pos)
    {
    case kIN_IDS: return desc.type == DataType::kINT32;
    case kIN_WEIGHTS: return desc.type == DataType::kFLOAT || desc.type == xType;
    case kIN_GATE_UP:
    case kIN_DOWN: return mFp8 ? desc.type == DataType::kFP8 : desc.type == xType;
    default: break;
    }
    if (pos == nbIn)
    {
        return desc.type == xType; // the output
    }
    return desc.type == DataType::kFLOAT; // FP8 block scales
}

size_t DSAMoEExpertsPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbIn,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    if (inputs == nullptr || nbIn != nbInputs())
    {
        return 0;
    }
    Dims const& x = inputs[kIN_X].max;
    Dims const& ids = inputs[kIN_IDS].max;
    Dims const& dn = inputs[kIN_DOWN].max;
    DType dtype{};
    if (x.nbDims != 2 || ids.nbDims != 2 || dn.nbDims != 3 || !toKernelDType(inputs[kIN_X].desc.type, dtype))
    {
        return 0;
    }
    return moeExpertsWorkspaceSize(x.d[0], ids.d[1], dn.d[0], x.d[1], dn.d[2], dtype);
}

int32_t DSAMoEExpertsPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    return guard("enqueue", -1, [&]() {
        if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
        {
            throw PluginError("null tensor descriptors or pointers");
        }
        MoEExpertsParams p;
        if (!toKernelDType(inputDesc[kIN_X].type, p.dtype) || !toKernelDType(inputDesc[kIN_WEIGHTS].type, p.weightsDtype))
        {
            throw PluginError("unsupported x or topk_weights type");
        }
        if (mFp8)
        {
            if (inputDesc[kIN_GATE_UP].type != DataType::kFP8 || inputDesc[kIN_DOWN].type != DataType::kFP8)
            {
                throw PluginError("gate_up and down must be FP8");
            }
            p.expertDtype = DType::kFP8_E4M3;
            p.gateUpScale = static_cast<float const*>(inputs[kIN_GATE_UP_SCALE]);
            p.downScale = static_cast<float const*>(inputs[kIN_DOWN_SCALE]);
        }
        else
        {
            p.expertDtype = p.dtype;
        }
        Dims const& x = inputDesc[kIN_X].dims;
        Dims const& ids = inputDesc[kIN_IDS].dims;
        Dims const& dn = inputDesc[kIN_DOWN].dims;
        p.x = inputs[kIN_X];
        p.topkIds = static_cast<int32_t const*>(inputs[kIN_IDS]);
        p.topkWeights = inputs[kIN_WEIGHTS];
        p.gateUp = inputs[kIN_GATE_UP];
        p.down = inputs[kIN_DOWN];
        p.out = outputs[0];
        p.N = x.d[0];
        p.H = x.d[1];
        p.K = ids.d[1];
        p.E = dn.d[0];
        p.I = dn.d[2];
        p.blockSize = mBlockSize;
        p.activation = MoEActivation::kSILU;
        // getWorkspaceSize() was computed for the profile's maximum shapes and is monotone in them.
        size_t const wsBytes = moeExpertsWorkspaceSize(p.N, p.K, p.E, p.H, p.I, p.dtype);
        checkKernelStatus(launchMoEExperts(p, workspace, wsBytes, stream), (std::string(getPluginName()) + " kernel").c_str());
        return 0;
    });
}

// ---------------------------------------------------------------------------------------------

DSAMoEExpertsPluginCreator::DSAMoEExpertsPluginCreator(bool fp8)
    : DSAPluginCreatorBase(fp8 ? kPLUGIN_NAME_FP8 : kPLUGIN_NAME,
        fp8 ? std::vector<PluginField>{PluginField("activation", nullptr, PluginFieldType::kCHAR, 0),
            PluginField("block_size", nullptr, PluginFieldType::kINT32, 1)}
            : std::vector<PluginField>{PluginField("activation", nullptr, PluginFieldType::kCHAR, 0)})
    , mFp8(fp8)
{
}

IPluginV3* DSAMoEExpertsPluginCreator::create(PluginFieldReader const& fields, TensorRTPhase /*phase*/)
{
    std::string const activation = fields.getString("activation", kDEFAULT_ACTIVATION);
    int64_t blockSize = kDEFAULT_BLOCK_SIZE;
    if (mFp8)
    {
        blockSize = fields.getInt("block_size", kDEFAULT_BLOCK_SIZE);
        if (blockSize < 1 || blockSize > (int64_t{1} << 30))
        {
            throw PluginError("attribute 'block_size' must be in [1, 2^30], got " + std::to_string(blockSize));
        }
    }
    return new DSAMoEExpertsPlugin(mFp8, activation, static_cast<int32_t>(blockSize));
}

DSAMoEExpertsFP8PluginCreator::DSAMoEExpertsFP8PluginCreator()
    : DSAMoEExpertsPluginCreator(true)
{
}

} // namespace plugin
} // namespace dsa
