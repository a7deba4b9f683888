/*
 * IPluginV3 glue of DSAIndexerTopKPaged (namespace "dsa", version "1"); see README.md in this
 * folder. The table drives what all plugins share (common/dsaPluginBase.h), DSAIndexerPlugin what
 * the indexers share (attributes, type rules, output); the class adds the shape checks, the workspace
 * and the call of dsa_indexer_topk_paged (api/dsa_kernels.h).
 */
#pragma once

#include "common/dsaPluginBase.h"

#include <cstdint>

namespace dsa
{
namespace plugin
{

//! DSAIndexerTopKPaged's inputs, outputs and attributes, in the op contract's order.
struct DSAIndexerTopKPagedTable
{
    static constexpr char const* kNAME = "DSAIndexerTopKPaged";
    static constexpr TensorSpec kINPUTS[] = {
        input("q"),
        input("k_pool"),
        input("w"),
        input("block_table"),
        input("query_start"),
        input("lengths"),
    };
    static constexpr TensorSpec kOUTPUTS[] = {
        output("indices"),
    };
    static constexpr AttrSpec kATTRIBUTES[] = {
        attrInt32("topk"),
        attrFloat32("scale"),
        attrInt32("causal", 1),
    };
};

class DSAIndexerTopKPagedPlugin : public DSAIndexerPlugin<DSAIndexerTopKPagedPlugin, DSAIndexerTopKPagedTable>
{
public:
    //! The keys input (DSAIndexerPlugin's type rule reads it).
    static constexpr char const* kKEY_INPUT = "k_pool";

    DSAIndexerTopKPagedPlugin(int32_t topk, float scale, int32_t causal);

    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

private:
    void checkInputs(nvinfer1::Dims const* dims, int32_t nbInputs) override;
    void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* const* outputs,
        void* workspace, cudaStream_t stream) const override;
};

using DSAIndexerTopKPagedPluginCreator = DSAPluginCreator<DSAIndexerTopKPagedPlugin>;

} // namespace plugin
} // namespace dsa
