/*
 * IPluginV3 glue of DSASparseAttentionPaged (namespace "dsa", version "1"); see README.md in this
 * folder. The table drives what all plugins share (common/dsaPluginBase.h); the class adds the shape
 * rules, the split-KV workspace and the call of dsa_sparse_attention_paged (api/dsa_kernels.h).
 */
#pragma once

#include "common/dsaPluginBase.h"

#include <cstdint>

namespace dsa
{
namespace plugin
{

//! DSASparseAttentionPaged's inputs, outputs and attributes, in the op contract's order.
struct DSASparseAttentionPagedTable
{
    static constexpr char const* kNAME = "DSASparseAttentionPaged";
    static constexpr TensorSpec kINPUTS[] = {
        input("q"),
        input("k_pool"),
        input("v_pool"),
        input("indices"),
        input("block_table"),
    };
    static constexpr TensorSpec kOUTPUTS[] = {
        output("out"),
    };
    static constexpr AttrSpec kATTRIBUTES[] = {
        attrFloat32("scale"),
    };
};

class DSASparseAttentionPagedPlugin
    : public DSAAttentionPlugin<DSASparseAttentionPagedPlugin, DSASparseAttentionPagedTable>
{
public:
    //! The input holding the selection (int32 logical key positions).
    static constexpr char const* kSELECTION_INPUT = "indices";
    //! The values input: v_pool [P,page,Hkv,Dv], or [0,page,Hkv,Dv] for values from keys.
    static constexpr char const* kVALUE_INPUT = "v_pool";
    //! The block table is int32 too.
    static constexpr bool isTableInput(int32_t pos)
    {
        return pos == kTABLE.inputIndex("block_table");
    }

    explicit DSASparseAttentionPagedPlugin(float scale)
        : DSAAttentionPlugin(scale)
    {
    }

    //! The split-KV decode's partial outputs: the most any row count of the profile needs on this
    //! GPU (decode-sized calls split each row's indices across CTAs; larger ones need nothing).
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

private:
    void checkInputs(nvinfer1::Dims const* dims, int32_t nbInputs) override;
    void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* const* outputs,
        void* workspace, cudaStream_t stream) const override;
};

using DSASparseAttentionPagedPluginCreator = DSAPluginCreator<DSASparseAttentionPagedPlugin>;

} // namespace plugin
} // namespace dsa
