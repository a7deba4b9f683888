#include "dsaMoEExpertsPlugin/dsaMoEExpertsPlugin.h"

#include "dsaMoEExpertsPlugin/dsaMoEExpertsKernel.h"

#include <stdexcept>
#include <utility>
#include <vector>

using namespace nvinfer1;

namespace dsa
{
namespace plugin
{
namespace
{
//! Position of an input both ops have: the same in both tables, or this does not compile.
constexpr int32_t sharedInput(char const* name)
{
    return DSAMoEExpertsPlugin::inputIndex(name) == DSAMoEExpertsFP8Plugin::inputIndex(name)
        ? DSAMoEExpertsPlugin::inputIndex(name)
        : throw std::logic_error("DSAMoEExperts and DSAMoEExpertsFP8 disagree on an input position");
}

constexpr int32_t kIN_X = sharedInput("x");
constexpr int32_t kIN_IDS = sharedInput("topk_ids");
constexpr int32_t kIN_WEIGHTS = sharedInput("topk_weights");
constexpr int32_t kIN_GATE_UP = sharedInput("gate_up");
constexpr int32_t kIN_DOWN = sharedInput("down");
constexpr int32_t kIN_GATE_UP_SCALE = DSAMoEExpertsFP8Plugin::inputIndex("gate_up_scale");
constexpr int32_t kIN_DOWN_SCALE = DSAMoEExpertsFP8Plugin::inputIndex("down_scale");

constexpr int32_t kACTIVATION = DSAMoEExpertsPlugin::attributeIndex("activation");
static_assert(kACTIVATION == DSAMoEExpertsFP8Plugin::attributeIndex("activation"), "both ops start with activation");
constexpr int32_t kBLOCK_SIZE = DSAMoEExpertsFP8Plugin::attributeIndex("block_size");
constexpr int32_t kDEFAULT_BLOCK_SIZE = DSAMoEExpertsFP8Plugin::kTABLE.attributes[kBLOCK_SIZE].intDefault;
constexpr char const* kSILU = "silu";

int64_t ceilDivKnown(int64_t a, int64_t b)
{
    return a < 0 ? -1 : (a + b - 1) / b;
}

//! The attribute values in table order: activation, then (FP8) block_size.
std::vector<AttributeValue> moeAttributes(bool fp8, std::string activation, int32_t blockSize)
{
    std::vector<AttributeValue> values{AttributeValue(std::move(activation))};
    if (fp8)
    {
        values.emplace_back(blockSize);
    }
    return values;
}
} // namespace

template <bool kFP8>
DSAMoEExpertsPluginT<kFP8>::DSAMoEExpertsPluginT(std::string activation, int32_t blockSize)
    : Base(moeAttributes(kFP8, std::move(activation), blockSize))
{
    if (this->stringAttr(kACTIVATION) != kSILU)
    {
        throw PluginError(std::string(this->getPluginName()) + ": activation '" + this->stringAttr(kACTIVATION)
            + "' is not supported; only 'silu' is implemented");
    }
    if (kFP8 && (blockSize < 1 || blockSize > (1 << 30)))
    {
        throw PluginError(
            "DSAMoEExpertsFP8: attribute 'block_size' must be in [1, 2^30], got " + std::to_string(blockSize));
    }
}

template <bool kFP8>
DSAMoEExpertsPluginT<kFP8>* DSAMoEExpertsPluginT<kFP8>::create(PluginFieldReader const& fields)
{
    std::string const activation = fields.getString(kACTIVATION);
    int64_t blockSize = kDEFAULT_BLOCK_SIZE;
    if constexpr (kFP8)
    {
        blockSize = fields.getInt(kBLOCK_SIZE);
        if (blockSize < 1 || blockSize > (int64_t{1} << 30))
        {
            throw PluginError("attribute 'block_size' must be in [1, 2^30], got " + std::to_string(blockSize));
        }
    }
    return new DSAMoEExpertsPluginT(activation, static_cast<int32_t>(blockSize));
}

template <bool kFP8>
int32_t DSAMoEExpertsPluginT<kFP8>::blockSize() const
{
    if constexpr (kFP8)
    {
        return this->int32Attr(kBLOCK_SIZE);
    }
    return kDEFAULT_BLOCK_SIZE;
}

template <bool kFP8>
void DSAMoEExpertsPluginT<kFP8>::checkInputs(Dims const* dims, int32_t /*nbInputs*/)
{
    std::string const name = this->getPluginName();
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
    if (!kFP8)
    {
        return;
    }
    Dims const& gs = dims[kIN_GATE_UP_SCALE];
    Dims const& ds = dims[kIN_DOWN_SCALE];
    int64_t const bs = blockSize();
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

template <bool kFP8>
bool DSAMoEExpertsPluginT<kFP8>::inferOutputTypes(DataType* outputTypes, DataType const* inputTypes) const noexcept
{
    if (inputTypes == nullptr)
    {
        return false;
    }
    outputTypes[0] = inputTypes[kIN_X];
    return true;
}

template <bool kFP8>
void DSAMoEExpertsPluginT<kFP8>::inferOutputShapes(
    DimsExprs const* inputs, DimsExprs* outputs, IExprBuilder& /*exprBuilder*/) const
{
    if (inputs[kIN_X].nbDims != 2)
    {
        throw PluginError("x must be 2-D [N,H]");
    }
    outputs[0].nbDims = 2;
    outputs[0].d[0] = inputs[kIN_X].d[0];
    outputs[0].d[1] = inputs[kIN_X].d[1];
}

template <bool kFP8>
bool DSAMoEExpertsPluginT<kFP8>::supportsType(int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbIn) const noexcept
{
    PluginTensorDesc const& desc = inOut[pos].desc;
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
    case kIN_DOWN: return kFP8 ? desc.type == DataType::kFP8 : desc.type == xType;
    default: break;
    }
    if (pos == nbIn)
    {
        return desc.type == xType; // the output
    }
    return desc.type == DataType::kFLOAT; // FP8 block scales
}

template <bool kFP8>
size_t DSAMoEExpertsPluginT<kFP8>::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbIn,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    if (inputs == nullptr || !Base::kTABLE.acceptsInputCount(nbIn))
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

template <bool kFP8>
void DSAMoEExpertsPluginT<kFP8>::launch(PluginTensorDesc const* inputDesc, void const* const* inputs,
    void* const* outputs, void* workspace, cudaStream_t stream) const
{
    MoEExpertsParams p;
    if (!toKernelDType(inputDesc[kIN_X].type, p.dtype) || !toKernelDType(inputDesc[kIN_WEIGHTS].type, p.weightsDtype))
    {
        throw PluginError("unsupported x or topk_weights type");
    }
    if (kFP8)
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
    p.blockSize = blockSize();
    p.activation = MoEActivation::kSILU;
    // getWorkspaceSize() was computed for the profile's maximum shapes and is monotone in them.
    size_t const wsBytes = moeExpertsWorkspaceSize(p.N, p.K, p.E, p.H, p.I, p.dtype);
    checkKernelStatus(
        launchMoEExperts(p, workspace, wsBytes, stream), (std::string(this->getPluginName()) + " kernel").c_str());
}

template class DSAMoEExpertsPluginT<false>;
template class DSAMoEExpertsPluginT<true>;

} // namespace plugin
} // namespace dsa
