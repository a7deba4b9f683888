/*
 * IPluginV3 glue of DSABlockSparseAttention (namespace "dsa", version "1"); see README.md in this
 * folder. The capability interfaces, naming, cloning and field handling come from
 * common/dsaPluginBase.h.
 */
#pragma once

#include "common/dsaPluginBase.h"

#include <cstdint>

namespace dsa
{
namespace plugin
{

class DSABlockSparseAttentionPlugin : public DSAPluginBase
{
public:
    DSABlockSparseAttentionPlugin(int32_t blockSize, float scale, int32_t causal);
    DSABlockSparseAttentionPlugin(DSABlockSparseAttentionPlugin const& other);

    // IPluginV3OneBuild
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;

protected:
    void checkInputs(nvinfer1::Dims const* dims, int32_t nbInputs) override;
    DSAPluginBase* cloneImpl() const override;

private:
    void initFields();

    int32_t mBlockSize;
    float mScale;
    int32_t mCausal;
};

class DSABlockSparseAttentionPluginCreator : public DSAPluginCreatorBase
{
public:
    DSABlockSparseAttentionPluginCreator();

protected:
    nvinfer1::IPluginV3* create(PluginFieldReader const& fields, nvinfer1::TensorRTPhase phase) override;
};

} // namespace plugin
} // namespace dsa
