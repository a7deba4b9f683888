/*
 * IPluginV3 glue of DSASparseAttention (namespace "dsa", version "1"); see README.md in this folder.
 * The table drives what all plugins share (common/dsaPluginBase.h); the class adds the shape and
 * type rules, the output shape and the kernel call (no workspace).
 */
#pragma once

#include "common/dsaPluginBase.h"

#include <cstdint>

namespace dsa
{
namespace plugin
{

//! DSASparseAttention's inputs, outputs and attributes, in the op contract's order.
struct DSASparseAttentionTable
{
    static constexpr char const* kNAME = "DSASparseAttention";
    static constexpr TensorSpec kINPUTS[] = {
        input("q"),
        input("k"),
        input("v"),
        input("indices"),
    };
    static constexpr TensorSpec kOUTPUTS[] = {
        output("out"),
    };
    static constexpr AttrSpec kATTRIBUTES[] = {
        attrFloat32("scale"),
    };
};

class DSASparseAttentionPlugin : public DSAAttentionPlugin<DSASparseAttentionPlugin, DSASparseAttentionTable>
{
public:
    //! The input holding the selection (int32): DSAAttentionPlugin's type rule reads it.
    static constexpr char const* kSELECTION_INPUT = "indices";
    //! The values input (its last dim is the output's Dv).
    static constexpr char const* kVALUE_INPUT = "v";
    //! No input besides the selection is int32.
    static constexpr bool isTableInput(int32_t /*pos*/)
    {
        return false;
    }

    explicit DSASparseAttentionPlugin(float scale)
        : DSAAttentionPlugin(scale)
    {
    }

private:
    void checkInputs(nvinfer1::Dims const* dims, int32_t nbInputs) override;
    void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* const* outputs,
        void* workspace, cudaStream_t stream) const override;
};

using DSASparseAttentionPluginCreator = DSAPluginCreator<DSASparseAttentionPlugin>;

} // namespace plugin
} // namespace dsa
