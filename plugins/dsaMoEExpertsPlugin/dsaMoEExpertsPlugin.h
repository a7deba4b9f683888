/*
 * IPluginV3 glue of DSAMoEExperts and DSAMoEExpertsFP8 (namespace "dsa", version "1"); see
 * README.md in this folder. One class template serves both ops (they differ in the expert weight
 * type, the two block-scale inputs and block_size); each op has its own table and creator. The
 * tables drive what all plugins share (common/dsaPluginBase.h); the class adds the shape and type
 * rules, the output shape, the workspace and the kernel call.
 */
#pragma once

#include "common/dsaPluginBase.h"

#include <cstdint>
#include <string>
#include <type_traits>

namespace dsa
{
namespace plugin
{

//! DSAMoEExperts's inputs, outputs and attributes, in the op contract's order.
struct DSAMoEExpertsTable
{
    static constexpr char const* kNAME = "DSAMoEExperts";
    static constexpr TensorSpec kINPUTS[] = {
        input("x"),
        input("topk_ids"),
        input("topk_weights"),
        input("gate_up"),
        input("down"),
    };
    static constexpr TensorSpec kOUTPUTS[] = {
        output("out"),
    };
    static constexpr AttrSpec kATTRIBUTES[] = {
        attrString("activation", "silu"),
    };
};

//! DSAMoEExpertsFP8's: DSAMoEExperts's, then the block scales of the FP8 experts and block_size.
struct DSAMoEExpertsFP8Table
{
    static constexpr char const* kNAME = "DSAMoEExpertsFP8";
    static constexpr TensorSpec kINPUTS[] = {
        input("x"),
        input("topk_ids"),
        input("topk_weights"),
        input("gate_up"),
        input("down"),
        input("gate_up_scale"),
        input("down_scale"),
    };
    static constexpr TensorSpec kOUTPUTS[] = {
        output("out"),
    };
    static constexpr AttrSpec kATTRIBUTES[] = {
        attrString("activation", "silu"),
        attrInt32("block_size", 128),
    };
};

//! kFP8: DSAMoEExpertsFP8 (FP8 e4m3 experts with block scales) instead of DSAMoEExperts.
template <bool kFP8>
class DSAMoEExpertsPluginT
    : public DSAPlugin<DSAMoEExpertsPluginT<kFP8>, std::conditional_t<kFP8, DSAMoEExpertsFP8Table, DSAMoEExpertsTable>>
{
public:
    using Base
        = DSAPlugin<DSAMoEExpertsPluginT<kFP8>, std::conditional_t<kFP8, DSAMoEExpertsFP8Table, DSAMoEExpertsTable>>;

    //! blockSize: the edge of the FP8 scale blocks; DSAMoEExperts has none and ignores it.
    DSAMoEExpertsPluginT(std::string activation, int32_t blockSize);
    static DSAMoEExpertsPluginT* create(PluginFieldReader const& fields);

    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

private:
    void checkInputs(nvinfer1::Dims const* dims, int32_t nbInputs) override;
    bool inferOutputTypes(nvinfer1::DataType* outputTypes, nvinfer1::DataType const* inputTypes) const noexcept override;
    void inferOutputShapes(nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs* outputs,
        nvinfer1::IExprBuilder& exprBuilder) const override;
    bool supportsType(
        int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs) const noexcept override;
    void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* const* outputs,
        void* workspace, cudaStream_t stream) const override;

    //! The scale block edge the kernels get (DSAMoEExperts: block_size's default).
    int32_t blockSize() const;
};

using DSAMoEExpertsPlugin = DSAMoEExpertsPluginT<false>;
using DSAMoEExpertsFP8Plugin = DSAMoEExpertsPluginT<true>;
using DSAMoEExpertsPluginCreator = DSAPluginCreator<DSAMoEExpertsPlugin>;
using DSAMoEExpertsFP8PluginCreator = DSAPluginCreator<DSAMoEExpertsFP8Plugin>;

// Both are instantiated in dsaMoEExpertsPlugin.cpp.
extern template class DSAMoEExpertsPluginT<false>;
extern template class DSAMoEExpertsPluginT<true>;

} // namespace plugin
} // namespace dsa
