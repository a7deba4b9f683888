#include "dsaSparseAttentionPlugin/dsaSparseAttentionPlugin.h"

#include "dsaSparseAttentionPlugin/dsaSparseAttentionKernel.h"

#include <cmath>

using namespace nvinfer1;

namespace dsa
{
namespace plugin
{
namespace
{
using Plugin = DSASparseAttentionPlugin;
constexpr int32_t kIN_Q = Plugin::inputIndex("q");
constexpr int32_t kIN_K = Plugin::inputIndex("k");
constexpr int32_t kIN_V = Plugin::inputIndex("v");
constexpr int32_t kIN_INDICES = Plugin::inputIndex("indices");
constexpr int32_t kSCALE = Plugin::attributeIndex("scale");

//! v with no rows and keys present: the values are the first Dv channels of k's rows (the op
//! contract's values-from-keys form). With T == 0 both forms read nothing and agree.
bool valuesFromKeys(Dims const& k, Dims const& v)
{
    return v.d[1] == 0 && k.d[1] != 0;
}
} // namespace

void DSASparseAttentionPlugin::checkInputs(Dims const* dims, int32_t /*nbInputs*/)
{
    Dims const& q = dims[kIN_Q];
    Dims const& k = dims[kIN_K];
    Dims const& v = dims[kIN_V];
    Dims const& idx = dims[kIN_INDICES];
    if (q.nbDims != 4 || k.nbDims != 4 || v.nbDims != 4 || idx.nbDims != 3)
    {
        throw PluginError("DSASparseAttention expects q [B,S,H,Dk], k [B,T,Hkv,Dk], v [B,T,Hkv,Dv] or [B,0,Hkv,Dv] "
                          "(values from keys), indices [B,S,K]; got q "
            + dimsToString(q) + ", k " + dimsToString(k) + ", v " + dimsToString(v) + ", indices " + dimsToString(idx));
    }
    // v has T rows (the values) or none (values from keys). The function body's third form, v with
    // 0 < Tv < T rows followed by key prefixes, has no kernel.
    if (v.d[1] > 0 && !sameOrUnknown(k.d[1], v.d[1]))
    {
        throw PluginError("DSASparseAttention: v has " + std::to_string(v.d[1]) + " rows and k has "
            + std::to_string(k.d[1]) + "; the plugin takes v with T rows (the values) or 0 rows (values from keys, "
              "the first Dv <= Dk channels of k); v " + dimsToString(v) + ", k " + dimsToString(k));
    }
    if (valuesFromKeys(k, v) && v.d[3] >= 0 && k.d[3] >= 0 && v.d[3] > k.d[3])
    {
        throw PluginError("DSASparseAttention: an empty v " + dimsToString(v)
            + " takes the values from the keys and needs Dv <= Dk, got Dv = " + std::to_string(v.d[3])
            + " and k " + dimsToString(k));
    }
    bool ok = sameOrUnknown(q.d[0], k.d[0]) && sameOrUnknown(q.d[0], v.d[0]) && sameOrUnknown(q.d[0], idx.d[0])
        && sameOrUnknown(q.d[1], idx.d[1]) && sameOrUnknown(k.d[2], v.d[2]) && sameOrUnknown(q.d[3], k.d[3]);
    if (ok && q.d[2] > 0 && k.d[2] > 0)
    {
        ok = q.d[2] % k.d[2] == 0;
    }
    if (!ok)
    {
        throw PluginError("DSASparseAttention: inconsistent shapes q " + dimsToString(q) + ", k " + dimsToString(k)
            + ", v " + dimsToString(v) + ", indices " + dimsToString(idx) + " (H must be a multiple of Hkv)");
    }
}

void DSASparseAttentionPlugin::launch(PluginTensorDesc const* inputDesc, void const* const* inputs, void* const* outputs,
    void* /*workspace*/, cudaStream_t stream) const
{
    DType dtype{};
    if (!toKernelDType(inputDesc[kIN_Q].type, dtype))
    {
        throw PluginError("unsupported input type");
    }
    Dims const& q = inputDesc[kIN_Q].dims;
    Dims const& k = inputDesc[kIN_K].dims;
    Dims const& v = inputDesc[kIN_V].dims;
    Dims const& idx = inputDesc[kIN_INDICES].dims;
    if (v.d[1] != 0 && v.d[1] != k.d[1])
    {
        throw PluginError(
            "v must have k's T rows or none (values from keys), got v " + dimsToString(v) + ", k " + dimsToString(k));
    }
    SparseAttentionParams p;
    p.q = inputs[kIN_Q];
    p.k = inputs[kIN_K];
    // An empty input may be bound to a null address (TensorRT allows nullptr only for empty
    // inputs), so the values-from-keys form never touches inputs[kIN_V].
    p.valuesFromKeys = valuesFromKeys(k, v);
    p.v = p.valuesFromKeys ? nullptr : inputs[kIN_V];
    p.indices = static_cast<int32_t const*>(inputs[kIN_INDICES]);
    p.out = outputs[0];
    p.B = q.d[0];
    p.S = q.d[1];
    p.H = q.d[2];
    p.Dk = q.d[3];
    p.T = k.d[1];
    p.Hkv = k.d[2];
    p.Dv = v.d[3];
    p.K = idx.d[2];
    p.scale = float32Attr(kSCALE);
    checkKernelStatus(launchSparseAttention(p, dtype, stream), "DSASparseAttention kernel");
}

} // namespace plugin
} // namespace dsa
