/*
 * IPluginV3 glue of DSAPagedCacheWrite (namespace "dsa", version "1"); see README.md in this folder.
 * The table drives what all plugins share (common/dsaPluginBase.h); the class adds the shape and
 * type rules, the output aliased to the pool input (getAliasedInput(0) == 0, TensorRT 10.3+ with
 * PreviewFeature::kALIASED_PLUGIN_IO_10_03) and the call of dsa_paged_cache_write (api/dsa_kernels.h).
 */
#pragma once

#include "common/dsaPluginBase.h"

#include <cstdint>

namespace dsa
{
namespace plugin
{

//! DSAPagedCacheWrite's inputs and output, in the op contract's order (no attributes).
struct DSAPagedCacheWriteTable
{
    static constexpr char const* kNAME = "DSAPagedCacheWrite";
    static constexpr TensorSpec kINPUTS[] = {
        input("pool"),
        input("indices"),
        input("updates"),
    };
    static constexpr TensorSpec kOUTPUTS[] = {
        output("present"),
    };
};

class DSAPagedCacheWritePlugin : public DSAPlugin<DSAPagedCacheWritePlugin, DSAPagedCacheWriteTable>
{
public:
    DSAPagedCacheWritePlugin()
        : DSAPlugin(std::vector<AttributeValue>{})
    {
    }

    static DSAPagedCacheWritePlugin* create(PluginFieldReader const& /*fields*/)
    {
        return new DSAPagedCacheWritePlugin();
    }

    //! The output is the pool input's buffer, written in place.
    int32_t aliasedInput(int32_t outputIndex) const noexcept override
    {
        return outputIndex == 0 ? kTABLE.inputIndex("pool") : -1;
    }

private:
    void checkInputs(nvinfer1::Dims const* dims, int32_t nbInputs) override;
    bool inferOutputTypes(nvinfer1::DataType* outputTypes, nvinfer1::DataType const* inputTypes) const noexcept override;
    void inferOutputShapes(nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs* outputs,
        nvinfer1::IExprBuilder& exprBuilder) const override;
    bool supportsType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs) const
        noexcept override;
    void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* const* outputs,
        void* workspace, cudaStream_t stream) const override;
};

using DSAPagedCacheWritePluginCreator = DSAPluginCreator<DSAPagedCacheWritePlugin>;

} // namespace plugin
} // namespace dsa
