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
using Plugin = DSABlockSparseAttentionPlugin;
constexpr int32_t kIN_Q = Plugin::inputIndex("q");
constexpr int32_t kIN_K = Plugin::inputIndex("k");
constexpr int32_t kIN_V = Plugin::inputIndex("v");
constexpr int32_t kIN_BLOCK_INDEX = Plugin::inputIndex("block_index");
constexpr int32_t kBLOCK_SIZE = Plugin::attributeIndex("block_size");
constexpr int32_t kSCALE = Plugin::attributeIndex("scale");
constexpr int32_t kCAUSAL = Plugin::attributeIndex("causal");

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
    : DSAAttentionPlugin({blockSize, scale, causal})
{
    if (blockSize < 1)
    {
        throw PluginError(
            "DSABlockSparseAttention: attribute 'block_size' must be at least 1, got " + std::to_string(blockSize));
    }
    if (!std::isfinite(scale))
    {
        throw PluginError("DSABlockSparseAttention: attribute 'scale' must be finite");
    }
    if (causal != 0 && causal != 1)
    {
        throw PluginError("DSABlockSparseAttention: attribute 'causal' must be 0 or 1, got " + std::to_string(causal));
    }
}

DSABlockSparseAttentionPlugin* DSABlockSparseAttentionPlugin::create(PluginFieldReader const& fields)
{
    int32_t const blockSize = checkedInt32(fields.getInt(kBLOCK_SIZE), "block_size");
    float const scale = fields.getFloat(kSCALE);
    int32_t const causal = checkedInt32(fields.getInt(kCAUSAL), "causal");
    return new DSABlockSparseAttentionPlugin(blockSize, scale, causal);
}

void DSABlockSparseAttentionPlugin::checkInputs(Dims const* dims, int32_t /*nbInputs*/)
{
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
    int32_t const blockSize = int32Attr(kBLOCK_SIZE);
    if (q.d[1] >= 0 && bi.d[2] >= 0 && bi.d[2] != (q.d[1] + blockSize - 1) / blockSize)
    {
        throw PluginError("DSABlockSparseAttention: block_index " + dimsToString(bi) + " must have ceil(S/"
            + std::to_string(blockSize) + ") = " + std::to_string((q.d[1] + blockSize - 1) / blockSize)
            + " query blocks for q " + dimsToString(q));
    }
}

void DSABlockSparseAttentionPlugin::launch(PluginTensorDesc const* inputDesc, void const* const* inputs,
    void* const* outputs, void* /*workspace*/, cudaStream_t stream) const
{
    DType dtype{};
    if (!toKernelDType(inputDesc[kIN_Q].type, dtype))
    {
        throw PluginError("unsupported input type");
    }
    Dims const& q = inputDesc[kIN_Q].dims;
    Dims const& k = inputDesc[kIN_K].dims;
    Dims const& v = inputDesc[kIN_V].dims;
    Dims const& bi = inputDesc[kIN_BLOCK_INDEX].dims;
    int32_t const blockSize = int32Attr(kBLOCK_SIZE);
    if (bi.d[2] != (q.d[1] + blockSize - 1) / blockSize || v.d[1] != k.d[1])
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
    p.blockSize = blockSize;
    p.scale = float32Attr(kSCALE);
    p.causal = int32Attr(kCAUSAL) != 0;
    checkKernelStatus(launchBlockSparseAttention(p, dtype, stream), "DSABlockSparseAttention kernel");
}

} // namespace plugin
} // namespace dsa
