#include "dsaIndexerTopKPagedPlugin/dsaIndexerTopKPagedPlugin.h"

#include "api/dsa_kernels.h"

using namespace nvinfer1;

namespace dsa
{
namespace plugin
{
namespace
{
using Plugin = DSAIndexerTopKPagedPlugin;
constexpr int32_t kIN_Q = Plugin::inputIndex("q");
constexpr int32_t kIN_K = Plugin::inputIndex("k_pool");
constexpr int32_t kIN_W = Plugin::inputIndex("w");
constexpr int32_t kIN_TABLE = Plugin::inputIndex("block_table");
constexpr int32_t kIN_START = Plugin::inputIndex("query_start");
constexpr int32_t kIN_LENGTHS = Plugin::inputIndex("lengths");
} // namespace

DSAIndexerTopKPagedPlugin::DSAIndexerTopKPagedPlugin(int32_t topk, float scale, int32_t causal)
    : DSAIndexerPlugin(topk, scale, causal)
{
}

void DSAIndexerTopKPagedPlugin::checkInputs(Dims const* dims, int32_t /*nbInputs*/)
{
    Dims const& q = dims[kIN_Q];
    Dims const& k = dims[kIN_K];
    Dims const& w = dims[kIN_W];
    Dims const& table = dims[kIN_TABLE];
    Dims const& start = dims[kIN_START];
    Dims const& lengths = dims[kIN_LENGTHS];
    if (q.nbDims != 4 || k.nbDims != 3 || w.nbDims != 3 || table.nbDims != 2 || start.nbDims != 1
        || lengths.nbDims != 1)
    {
        throw PluginError("DSAIndexerTopKPaged expects q [B,S,H,D], k_pool [P,page,D], w [B,S,H], block_table [B,M], "
                          "query_start [B], lengths [B]; got q "
            + dimsToString(q) + ", k_pool " + dimsToString(k) + ", w " + dimsToString(w) + ", block_table "
            + dimsToString(table) + ", query_start " + dimsToString(start) + ", lengths " + dimsToString(lengths));
    }
    if (!sameOrUnknown(q.d[0], w.d[0]) || !sameOrUnknown(q.d[1], w.d[1]) || !sameOrUnknown(q.d[2], w.d[2])
        || !sameOrUnknown(q.d[3], k.d[2]) || !sameOrUnknown(q.d[0], table.d[0]) || !sameOrUnknown(q.d[0], start.d[0])
        || !sameOrUnknown(q.d[0], lengths.d[0]))
    {
        throw PluginError("DSAIndexerTopKPaged: inconsistent shapes q " + dimsToString(q) + ", k_pool "
            + dimsToString(k) + ", w " + dimsToString(w) + ", block_table " + dimsToString(table) + ", query_start "
            + dimsToString(start) + ", lengths " + dimsToString(lengths));
    }
}

size_t DSAIndexerTopKPagedPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    if (inputs == nullptr || nbInputs != kTABLE.nbInputs)
    {
        return 0;
    }
    Dims const& q = inputs[kIN_Q].max;
    Dims const& k = inputs[kIN_K].max;
    Dims const& table = inputs[kIN_TABLE].max;
    if (q.nbDims != 4 || k.nbDims != 3 || table.nbDims != 2)
    {
        return 0;
    }
    // Monotone in every argument (dsa_kernels.h): the profile's largest shapes bound every call.
    return dsa_indexer_topk_paged_workspace_size(q.d[0], q.d[1], table.d[1], k.d[1], q.d[2], q.d[3], int32Attr(kTOPK));
}

void DSAIndexerTopKPagedPlugin::launch(PluginTensorDesc const* inputDesc, void const* const* inputs,
    void* const* outputs, void* workspace, cudaStream_t stream) const
{
    DType dtype{};
    DType wDtype{};
    if (!toKernelDType(inputDesc[kIN_Q].type, dtype) || !toKernelDType(inputDesc[kIN_W].type, wDtype))
    {
        throw PluginError("unsupported input type");
    }
    Dims const& q = inputDesc[kIN_Q].dims;
    Dims const& k = inputDesc[kIN_K].dims;
    Dims const& table = inputDesc[kIN_TABLE].dims;
    int32_t const topk = int32Attr(kTOPK);
    size_t const wsBytes = dsa_indexer_topk_paged_workspace_size(q.d[0], q.d[1], table.d[1], k.d[1], q.d[2], q.d[3], topk);
    checkKernelStatus(dsa_indexer_topk_paged(inputs[kIN_Q], inputs[kIN_K], inputs[kIN_W],
                          static_cast<int32_t const*>(inputs[kIN_TABLE]), static_cast<int32_t const*>(inputs[kIN_START]),
                          static_cast<int32_t const*>(inputs[kIN_LENGTHS]), static_cast<int32_t*>(outputs[0]), q.d[0],
                          q.d[1], k.d[0], k.d[1], table.d[1], q.d[2], q.d[3], topk, float32Attr(kSCALE),
                          int32Attr(kCAUSAL), static_cast<int32_t>(dtype), static_cast<int32_t>(wDtype), workspace,
                          wsBytes, stream),
        "DSAIndexerTopKPaged kernel");
}

} // namespace plugin
} // namespace dsa
