#include "dsaSparseAttentionPagedPlugin/dsaSparseAttentionPagedPlugin.h"

#include "api/dsa_kernels.h"

#include <algorithm>
#include <cmath>

using namespace nvinfer1;

namespace dsa
{
namespace plugin
{
namespace
{
using Plugin = DSASparseAttentionPagedPlugin;
constexpr int32_t kIN_Q = Plugin::inputIndex("q");
constexpr int32_t kIN_K = Plugin::inputIndex("k_pool");
constexpr int32_t kIN_V = Plugin::inputIndex("v_pool");
constexpr int32_t kIN_INDICES = Plugin::inputIndex("indices");
constexpr int32_t kIN_TABLE = Plugin::inputIndex("block_table");
constexpr int32_t kSCALE = Plugin::attributeIndex("scale");

//! The split-KV schedule the plugin asks for: the one the launcher chooses on a GPU of 132 SMs
//! (H100 / H200), on whatever GPU the engine runs (num_splits = -132, see api/dsa_kernels.h). The
//! workspace TensorRT reserves at build time then holds what any run asks for, on any GPU; another
//! SM count only makes the split count a little off its optimum.
constexpr int32_t kSPLIT_SCHEDULE = -132;
//! Row counts the workspace bound visits at most (splitting stops far earlier: a call splits only
//! while it has fewer CTAs than 132; the loop ends at the first row count that needs nothing).
constexpr int64_t kMAX_SPLIT_ROWS = int64_t{1} << 16;
} // namespace

void DSASparseAttentionPagedPlugin::checkInputs(Dims const* dims, int32_t /*nbInputs*/)
{
    Dims const& q = dims[kIN_Q];
    Dims const& k = dims[kIN_K];
    Dims const& v = dims[kIN_V];
    Dims const& idx = dims[kIN_INDICES];
    Dims const& table = dims[kIN_TABLE];
    if (q.nbDims != 4 || k.nbDims != 4 || v.nbDims != 4 || idx.nbDims != 3 || table.nbDims != 2)
    {
        throw PluginError("DSASparseAttentionPaged expects q [B,S,H,Dk], k_pool [P,page,Hkv,Dk], v_pool "
                          "[P,page,Hkv,Dv] or [0,page,Hkv,Dv] (values from keys), indices [B,S,K], block_table [B,M]; "
                          "got q "
            + dimsToString(q) + ", k_pool " + dimsToString(k) + ", v_pool " + dimsToString(v) + ", indices "
            + dimsToString(idx) + ", block_table " + dimsToString(table));
    }
    if (v.d[0] > 0 && !sameOrUnknown(k.d[0], v.d[0]))
    {
        throw PluginError("DSASparseAttentionPaged: v_pool has " + std::to_string(v.d[0]) + " pages and k_pool "
            + std::to_string(k.d[0]) + "; v_pool shares k_pool's pages, or has none (values from keys)");
    }
    if (v.d[0] == 0 && v.d[3] >= 0 && k.d[3] >= 0 && v.d[3] > k.d[3])
    {
        throw PluginError("DSASparseAttentionPaged: a v_pool without pages " + dimsToString(v)
            + " takes the values from the keys and needs Dv <= Dk, got Dv = " + std::to_string(v.d[3]) + " and k_pool "
            + dimsToString(k));
    }
    bool ok = sameOrUnknown(q.d[0], idx.d[0]) && sameOrUnknown(q.d[0], table.d[0]) && sameOrUnknown(q.d[1], idx.d[1])
        && sameOrUnknown(k.d[1], v.d[1]) && sameOrUnknown(k.d[2], v.d[2]) && sameOrUnknown(q.d[3], k.d[3]);
    if (ok && q.d[2] > 0 && k.d[2] > 0)
    {
        ok = q.d[2] % k.d[2] == 0;
    }
    if (!ok)
    {
        throw PluginError("DSASparseAttentionPaged: inconsistent shapes q " + dimsToString(q) + ", k_pool "
            + dimsToString(k) + ", v_pool " + dimsToString(v) + ", indices " + dimsToString(idx) + ", block_table "
            + dimsToString(table) + " (page and Hkv shared by the pools, H a multiple of Hkv)");
    }
}

size_t DSASparseAttentionPagedPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return guard("getWorkspaceSize", size_t{0}, [&]() -> size_t {
        if (inputs == nullptr || nbInputs != kTABLE.nbInputs)
        {
            return 0;
        }
        Dims const& qMin = inputs[kIN_Q].min;
        Dims const& q = inputs[kIN_Q].max;
        Dims const& k = inputs[kIN_K].max;
        Dims const& v = inputs[kIN_V].max;
        Dims const& idx = inputs[kIN_INDICES].max;
        if (q.nbDims != 4 || qMin.nbDims != 4 || k.nbDims != 4 || v.nbDims != 4 || idx.nbDims != 3)
        {
            return 0;
        }
        // The schedule splits only calls with fewer CTAs than 132, and fewer rows (B*S) never give
        // fewer splits: visit the profile's row counts from the smallest up to the first that does
        // not split. Splits depend on the rows, H, Hkv and K only (dsa_kernels.h).
        size_t most = 0;
        int64_t const lo = std::max<int64_t>(1, qMin.d[0] * qMin.d[1]);
        int64_t const hi = std::min<int64_t>(q.d[0] * q.d[1], lo + kMAX_SPLIT_ROWS);
        for (int64_t rows = lo; rows <= hi; ++rows)
        {
            size_t const bytes
                = dsa_sparse_attention_paged_workspace_size(1, rows, q.d[2], k.d[2], v.d[3], idx.d[2], kSPLIT_SCHEDULE);
            if (bytes == 0)
            {
                break;
            }
            most = std::max(most, bytes);
        }
        return most;
    });
}

void DSASparseAttentionPagedPlugin::launch(PluginTensorDesc const* inputDesc, void const* const* inputs,
    void* const* outputs, void* workspace, cudaStream_t stream) const
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
    Dims const& table = inputDesc[kIN_TABLE].dims;
    if (v.d[0] != 0 && (v.d[0] != k.d[0] || v.d[1] != k.d[1]))
    {
        throw PluginError("v_pool must share k_pool's pages or have none (values from keys), got v_pool "
            + dimsToString(v) + ", k_pool " + dimsToString(k));
    }
    // A v_pool without pages may be bound to a null address (TensorRT allows nullptr only for empty
    // inputs): the values-from-keys form never reads it.
    void const* values = v.d[0] == 0 ? nullptr : inputs[kIN_V];
    // getWorkspaceSize() bounded every row count of the profile for this schedule; these rows ask
    // for no more (0 when the call does not split).
    size_t const wsBytes = dsa_sparse_attention_paged_workspace_size(
        q.d[0], q.d[1], q.d[2], k.d[2], v.d[3], idx.d[2], kSPLIT_SCHEDULE);
    checkKernelStatus(dsa_sparse_attention_paged(inputs[kIN_Q], inputs[kIN_K], values,
                          static_cast<int32_t const*>(inputs[kIN_INDICES]), static_cast<int32_t const*>(inputs[kIN_TABLE]),
                          outputs[0], q.d[0], q.d[1], q.d[2], k.d[2], q.d[3], v.d[3], idx.d[2], k.d[0], k.d[1],
                          table.d[1], float32Attr(kSCALE), static_cast<int32_t>(dtype), kSPLIT_SCHEDULE, workspace,
                          wsBytes, stream),
        "DSASparseAttentionPaged kernel");
}

} // namespace plugin
} // namespace dsa
