/*
 * IPluginV3 glue of DSAMoEExperts and DSAMoEExpertsFP8 (namespace "dsa", version "1"); see
 * README.md in this folder. One plugin class serves both ops (they differ in the expert weight
 * type and the two block-scale inputs); each op has its own creator.
 */
#pragma once

#include "common/dsaPluginBase.h"

#include <cstdint>
#include <string>

namespace dsa
{
namespace plugin
{

class DSAMoEExpertsPlugin : public DSAPluginBase
{
public:
    //! fp8: DSAMoEExpertsFP8 (7 inputs, FP8 e4m3 experts with block scales) instead of DSAMoEExperts.
    DSAMoEExpertsPlugin(bool fp8, std::string activation, int32_t blockSize);
    DSAMoEExpertsPlugin(DSAMoEExpertsPlugin const& other);

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
    int32_t nbInputs() const;

    bool mFp8;
    std::string mActivation;
    int32_t mBlockSize;
};

//! Creator of DSAMoEExperts (fp8 = false) or DSAMoEExpertsFP8 (fp8 = true).
class DSAMoEExpertsPluginCreator : public DSAPluginCreatorBase
{
public:
    explicit DSAMoEExpertsPluginCreator(bool fp8 = false);

protected:
    nvinfer1::IPluginV3* create(PluginFieldReader const& fields, nvinfer1::TensorRTPhase phase) override;

private:
    bool mFp8;
};

//! DSAMoEExpertsFP8's creator as its own type, for REGISTER_TENSORRT_PLUGIN.
class DSAMoEExpertsFP8PluginCreator : public DSAMoEExpertsPluginCreator
{
public:
    DSAMoEExpertsFP8PluginCreator();
};

} // namespace plugin
} // namespace dsa
