/*
 * IPluginV3 glue of DSAIndexerTopK (namespace "dsa", version "1"); see README.md in this folder.
 * The table drives what all plugins share (common/dsaPluginBase.h); the class adds the shape and
 * type rules, the output shape, the workspace and the kernel call.
 */
#pragma once

#include "common/dsaPluginBase.h"

#include <cstdint>

namespace dsa
{
namespace plugin
{

//! DSAIndexerTopK's inputs, outputs and attributes, in the op contract's order.
struct DSAIndexerTopKTable
{
    static constexpr char const* kNAME = "DSAIndexerTopK";
    static constexpr TensorSpec kINPUTS[] = {
        input("q"),
        input("k"),
        input("w"),
        optionalInput("lengths"),
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

class DSAIndexerTopKPlugin : public DSAPlugin<DSAIndexerTopKPlugin, DSAIndexerTopKTable>
{
public:
    DSAIndexerTopKPlugin(int32_t topk, float scale, int32_t causal);
    static DSAIndexerTopKPlugin* create(PluginFieldReader const& fields);

    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

private:
    void checkInputs(nvinfer1::Dims const* dims, int32_t nbInputs) override;
    bool inferOutputTypes(nvinfer1::DataType* outputTypes, nvinfer1::DataType const* inputTypes) const noexcept override;
    void inferOutputShapes(nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs* outputs,
        nvinfer1::IExprBuilder& exprBuilder) const override;
    bool supportsType(
        int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs) const noexcept override;
    bool formatsNeedInputCount() const noexcept override;
    void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* const* outputs,
        void* workspace, cudaStream_t stream) const override;
};

using DSAIndexerTopKPluginCreator = DSAPluginCreator<DSAIndexerTopKPlugin>;

} // namespace plugin
} // namespace dsa
