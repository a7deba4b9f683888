/*
 * The IPluginV3 machinery every DSA plugin shares, so that each plugin folder holds only what
 * differs (its I/O table, shape rules, type rules, output shapes, workspace, the kernel call):
 *
 *   DSAPluginBase         core/build/runtime capability interfaces; driven by the plugin's table
 *                         (common/dsaPluginTable.h): name/version/namespace, getNbOutputs, the input
 *                         and output counts of configurePlugin/onShapeChange (then one checkInputs()
 *                         hook), getOutputDataTypes, getOutputShapes, supportsFormatCombination and
 *                         enqueue (each then one hook), the attribute values with their serialized
 *                         fields and timing-cache ID / metadata string; clone/attachToContext.
 *   DSAPlugin<D, Table>   CRTP layer of a plugin class D: its table, clone, compile-time positions of
 *                         its inputs and attributes by name.
 *   DSAPluginCreatorBase  creator: field names from the table, createPlugin() with the by-name field
 *                         lookup of the table's attributes and error logging.
 *   DSAPluginCreator<P>   the creator of plugin class P: calls P::create(fields).
 *   PluginFieldList       the fields a plugin serializes (pointers into its attribute values).
 *   PluginFieldReader     the table's attributes from the fields handed to createPlugin().
 *   guarded()             runs a body and turns exceptions into a logged error and a failure value.
 *
 * Uses only inline/virtual TensorRT API, so libdsa_plugins.so still links without libnvinfer.
 */
#pragma once

#include "NvInferRuntime.h"
#include "NvInferVersion.h"
#include "common/dsaPluginCommon.h"
#include "common/dsaPluginTable.h"

#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace dsa
{
namespace plugin
{

//! Runs fn() and returns its result; an exception becomes the logged error "<plugin> <where>: <message>"
//! and `failure` is returned. This is how every noexcept override reports a failure to TensorRT.
template <typename R, typename F>
R guarded(char const* plugin, char const* where, R failure, F&& fn) noexcept
{
    try
    {
        return fn();
    }
    catch (std::exception const& e)
    {
        logError(std::string(plugin) + " " + where + ": " + e.what());
    }
    catch (...)
    {
        logError(std::string(plugin) + " " + where + ": unknown exception");
    }
    return failure;
}

//! The attributes a plugin serializes, as TensorRT plugin fields pointing into the plugin's own
//! values. Not copyable: a copied plugin rebuilds its list so the pointers refer to its values.
class PluginFieldList
{
public:
    PluginFieldList() = default;
    PluginFieldList(PluginFieldList const&) = delete;
    PluginFieldList& operator=(PluginFieldList const&) = delete;

    void clear();
    void addInt32(char const* name, int32_t const* value);
    void addFloat32(char const* name, float const* value);
    //! A string as kCHAR with its length (no terminating NUL counted), as the ONNX parser passes it.
    void addString(char const* name, std::string const* value);
    nvinfer1::PluginFieldCollection const* collection() noexcept;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mCollection{};
};

//! The fields of createPlugin(), read as the table's attributes. Fields the table does not declare
//! are logged (verbose) and ignored; a field given twice takes its last value. Getters throw
//! PluginError on missing required attributes or wrong field types.
class PluginFieldReader
{
public:
    PluginFieldReader(PluginTable const& table, nvinfer1::PluginFieldCollection const* fc);

    //! Attribute `attribute` (its position in the table) of type kINT32, or its default when absent.
    int64_t getInt(int32_t attribute) const;
    //! Attribute `attribute` of type kFLOAT32, or its default when absent.
    float getFloat(int32_t attribute) const;
    //! Attribute `attribute` of type kSTRING, or its default when absent.
    std::string getString(int32_t attribute) const;

private:
    //! The table entry of `attribute`, checked to have type `type`.
    AttrSpec const& spec(int32_t attribute, AttrType type) const;
    //! The field of the attribute, or nullptr when absent (then PluginError if it is required).
    nvinfer1::PluginField const* find(AttrSpec const& spec) const;

    PluginTable const& mTable;
    nvinfer1::PluginFieldCollection const* mFc;
};

//! The value of one attribute, of the type its table entry declares (int32, float or string).
struct AttributeValue
{
    AttributeValue(int32_t value) noexcept
        : type(AttrType::kINT32)
        , intValue(value)
    {
    }
    AttributeValue(float value) noexcept
        : type(AttrType::kFLOAT32)
        , floatValue(value)
    {
    }
    AttributeValue(std::string value)
        : type(AttrType::kSTRING)
        , stringValue(std::move(value))
    {
    }

    AttrType type;
    int32_t intValue{0};
    float floatValue{0.F};
    std::string stringValue;
};

//! 1 when the TensorRT headers have the build capability's version 2 (IPluginV3OneBuildV2, TensorRT
//! 10.3+): getAliasedInput, an output written in place into an input's buffer. TensorRT asks it only
//! when the builder config enables PreviewFeature::kALIASED_PLUGIN_IO_10_03.
#if NV_TENSORRT_MAJOR > 10 || (NV_TENSORRT_MAJOR == 10 && NV_TENSORRT_MINOR >= 3)
#define DSA_PLUGIN_ALIASED_IO 1
#else
#define DSA_PLUGIN_ALIASED_IO 0
#endif

//! The build capability of the DSA plugins. With TensorRT 10.3+ headers it is IPluginV3OneBuildV2,
//! and it reports interface version 2 (so TensorRT asks getAliasedInput) only for a plugin whose
//! aliasedInput() names an input for one of its outputs (DSAPagedCacheWrite); the others report
//! version 1, the interface they always had (version 2 only adds getAliasedInput after it).
class DSABuildCapability
#if DSA_PLUGIN_ALIASED_IO
    : public nvinfer1::IPluginV3OneBuildV2
#else
    : public nvinfer1::IPluginV3OneBuild
#endif
{
public:
#if DSA_PLUGIN_ALIASED_IO
    nvinfer1::InterfaceInfo getInterfaceInfo() const noexcept override
    {
        return nvinfer1::InterfaceInfo{"PLUGIN_V3ONE_BUILD", aliasesAnOutput() ? 2 : 1, 0};
    }
    int32_t getAliasedInput(int32_t outputIndex) noexcept override
    {
        return aliasedInput(outputIndex);
    }
#endif
    //! The input whose buffer output `outputIndex` is written into in place, or -1 (the default: none).
    virtual int32_t aliasedInput(int32_t /*outputIndex*/) const noexcept
    {
        return -1;
    }
    bool aliasesAnOutput() const noexcept
    {
        for (int32_t i = 0; i < getNbOutputs(); ++i)
        {
            if (aliasedInput(i) >= 0)
            {
                return true;
            }
        }
        return false;
    }
};

//! Base of the DSA plugins: one class implements the three IPluginV3One capability interfaces.
class DSAPluginBase : public nvinfer1::IPluginV3,
                      public nvinfer1::IPluginV3OneCore,
                      public DSABuildCapability,
                      public nvinfer1::IPluginV3OneRuntime
{
public:
    DSAPluginBase& operator=(DSAPluginBase const&) = delete;
    ~DSAPluginBase() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild (getWorkspaceSize: TensorRT's default of 0 unless the plugin overrides it;
    // getAliasedInput: DSABuildCapability)
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    char const* getTimingCacheID() noexcept override;
    char const* getMetadataString() noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

protected:
    //! attributes: one value per attribute of the table, in its order and of its types.
    DSAPluginBase(PluginTable const& table, std::vector<AttributeValue> attributes);
    //! Copies the table, the attribute values and the input count, and rebuilds the field list.
    DSAPluginBase(DSAPluginBase const& other);

    //! Validates the input shapes (build-time dims may be -1), the input count being one the table
    //! takes. Called by configurePlugin and onShapeChange; throws PluginError.
    virtual void checkInputs(nvinfer1::Dims const* dims, int32_t nbInputs) = 0;
    //! Sets the output types from the input types (counts already checked); false when it cannot,
    //! which getOutputDataTypes reports as a wrong input or output count.
    virtual bool inferOutputTypes(nvinfer1::DataType* outputTypes, nvinfer1::DataType const* inputTypes) const noexcept
        = 0;
    //! Sets the output shapes (pointers and counts already checked); throws PluginError.
    virtual void inferOutputShapes(
        nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs* outputs, nvinfer1::IExprBuilder& exprBuilder) const
        = 0;
    //! The type rule of position `pos` (position, output count, input count and linear format
    //! already checked).
    virtual bool supportsType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs) const
        noexcept
        = 0;
    //! Whether supportsFormatCombination() refuses input counts the table does not take (default),
    //! or leaves the count to configurePlugin's message.
    virtual bool formatsNeedInputCount() const noexcept
    {
        return true;
    }
    //! Checks what enqueue needs beyond non-null pointers and launches the kernel; throws PluginError.
    virtual void launch(nvinfer1::PluginTensorDesc const* inputDesc, void const* const* inputs, void* const* outputs,
        void* workspace, cudaStream_t stream) const
        = 0;
    //! A copy of this plugin (may throw).
    virtual DSAPluginBase* cloneImpl() const = 0;

    //! The table's attribute values, by position in the table.
    int32_t int32Attr(int32_t attribute) const
    {
        return mAttributes[attribute].intValue;
    }
    float float32Attr(int32_t attribute) const
    {
        return mAttributes[attribute].floatValue;
    }
    std::string const& stringAttr(int32_t attribute) const
    {
        return mAttributes[attribute].stringValue;
    }
    //! Whether input `index` is present (optional inputs; set by configurePlugin/onShapeChange).
    bool hasInput(int32_t index) const
    {
        return index < mNbInputs;
    }
    //! The input count the table allows, for messages: "4", "3 or 4", "3 to 5".
    std::string inputCountText() const;

    template <typename R, typename F>
    R guard(char const* where, R failure, F&& fn) const noexcept
    {
        return guarded(mTable.name, where, failure, static_cast<F&&>(fn));
    }

private:
    void initFields();
    //! The shared part of configurePlugin and onShapeChange.
    void checkInputCount(nvinfer1::Dims const* dims, int32_t nbInputs);

    PluginTable const& mTable;
    std::vector<AttributeValue> mAttributes;
    int32_t mNbInputs;
    PluginFieldList mFields;  //!< what getFieldsToSerialize() returns
    std::string mDescription; //!< attributes as text: timing-cache ID and metadata string
};

//! The CRTP layer of a plugin class: `class P : public DSAPlugin<P, PTable>`, where PTable is the
//! plugin's table struct (common/dsaPluginTable.h). P is copyable; it provides the hooks of
//! DSAPluginBase and `static P* create(PluginFieldReader const& fields)` for its creator.
template <class Derived, class TableT>
class DSAPlugin : public DSAPluginBase
{
public:
    using Table = TableT;
    static constexpr PluginTable kTABLE = makeTable<TableT>();
    static_assert(kTABLE.isValid(), "a plugin table needs an output, optional inputs last and unique names");

    //! Position of an input, by name (a compile-time constant; a misspelt name does not compile).
    static constexpr int32_t inputIndex(char const* name)
    {
        return kTABLE.inputIndex(name);
    }
    //! Position of an attribute, by name (a compile-time constant).
    static constexpr int32_t attributeIndex(char const* name)
    {
        return kTABLE.attributeIndex(name);
    }

protected:
    explicit DSAPlugin(std::vector<AttributeValue> attributes)
        : DSAPluginBase(kTABLE, std::move(attributes))
    {
    }
    DSAPlugin(DSAPlugin const& other) = default;

private:
    DSAPluginBase* cloneImpl() const override
    {
        return new Derived(static_cast<Derived const&>(*this));
    }
};

//! Base of the attention plugins (DSASparseAttention, DSABlockSparseAttention, DSASparseAttentionPaged):
//! what their I/O rules share. The output is [B, S, H, Dv], q's first three dims and the values'
//! last (Derived::kVALUE_INPUT: v or v_pool; the contract's rule, dsa_export/ops/sizes.py
//! attention_dims), in q's type; q is a float type that keys, values and the output share; the
//! selection input (Derived::kSELECTION_INPUT, int32) names the keys to attend to, and any other
//! int32 input (Derived::isTableInput(pos): a paged plugin's block table) is int32 too.
template <class Derived, class TableT>
class DSAAttentionPlugin : public DSAPlugin<Derived, TableT>
{
    using Base = DSAPlugin<Derived, TableT>;

public:
    //! createPlugin() of a plugin whose one attribute is ``scale`` (DSASparseAttention and its paged
    //! form; one with more attributes declares its own).
    static Derived* create(PluginFieldReader const& fields)
    {
        return new Derived(fields.getFloat(Base::attributeIndex("scale")));
    }

protected:
    explicit DSAAttentionPlugin(std::vector<AttributeValue> attributes)
        : Base(std::move(attributes))
    {
    }
    //! A plugin whose one attribute is ``scale``, which must be finite.
    explicit DSAAttentionPlugin(float scale)
        : Base({finiteScale(scale)})
    {
    }
    DSAAttentionPlugin(DSAAttentionPlugin const& other) = default;

private:
    static float finiteScale(float scale)
    {
        if (!std::isfinite(scale))
        {
            throw PluginError(std::string(Base::kTABLE.name) + ": attribute 'scale' must be finite");
        }
        return scale;
    }

    static constexpr int32_t kQ = Base::inputIndex("q");
    static constexpr int32_t kV = Base::inputIndex(Derived::kVALUE_INPUT);

    bool inferOutputTypes(nvinfer1::DataType* outputTypes, nvinfer1::DataType const* inputTypes) const noexcept override
    {
        if (inputTypes == nullptr)
        {
            return false;
        }
        outputTypes[0] = inputTypes[kQ];
        return true;
    }

    void inferOutputShapes(nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs* outputs,
        nvinfer1::IExprBuilder& /*exprBuilder*/) const override
    {
        if (inputs[kQ].nbDims != 4 || inputs[kV].nbDims != 4)
        {
            throw PluginError("q and v must be 4-D");
        }
        outputs[0].nbDims = 4;
        outputs[0].d[0] = inputs[kQ].d[0];
        outputs[0].d[1] = inputs[kQ].d[1];
        outputs[0].d[2] = inputs[kQ].d[2];
        outputs[0].d[3] = inputs[kV].d[3];
    }

    bool supportsType(
        int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t /*nbInputs*/) const noexcept override
    {
        nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
        if (pos == kQ)
        {
            return isFloatType(desc.type);
        }
        if (pos == Base::inputIndex(Derived::kSELECTION_INPUT) || Derived::isTableInput(pos))
        {
            return desc.type == nvinfer1::DataType::kINT32;
        }
        // Keys, values and the output share q's type.
        return desc.type == inOut[kQ].desc.type;
    }
};

//! Base of the indexer plugins (DSAIndexerTopK, DSAIndexerTopKPaged): what their attributes and
//! I/O rules share. Attributes topk (> 0), scale (finite), causal (0/1); the output is [B, S, topk]
//! int32 (q's first two dims); q is a float type that the keys (Derived::kKEY_INPUT: k or k_pool)
//! share, w is float32 or q's type, every other input (lengths, block table, query starts) is int32.
//! Derived has a constructor (topk, scale, causal); create() reads the three fields.
template <class Derived, class TableT>
class DSAIndexerPlugin : public DSAPlugin<Derived, TableT>
{
    using Base = DSAPlugin<Derived, TableT>;

public:
    static Derived* create(PluginFieldReader const& fields)
    {
        int64_t const topk = fields.getInt(kTOPK);
        if (topk <= 0 || topk > 0x7fffffff)
        {
            throw PluginError("attribute 'topk' must be in [1, 2^31), got " + std::to_string(topk));
        }
        return new Derived(static_cast<int32_t>(topk), fields.getFloat(kSCALE), fields.getInt(kCAUSAL) != 0 ? 1 : 0);
    }

protected:
    static constexpr int32_t kQ = Base::inputIndex("q");
    static constexpr int32_t kK = Base::inputIndex(Derived::kKEY_INPUT);
    static constexpr int32_t kW = Base::inputIndex("w");
    static constexpr int32_t kTOPK = Base::attributeIndex("topk");
    static constexpr int32_t kSCALE = Base::attributeIndex("scale");
    static constexpr int32_t kCAUSAL = Base::attributeIndex("causal");

    DSAIndexerPlugin(int32_t topk, float scale, int32_t causal)
        : Base({topk, scale, causal != 0 ? 1 : 0})
    {
        if (topk <= 0)
        {
            throw PluginError(std::string(Base::kTABLE.name) + ": attribute 'topk' must be positive, got "
                + std::to_string(topk));
        }
        if (!std::isfinite(scale))
        {
            throw PluginError(std::string(Base::kTABLE.name) + ": attribute 'scale' must be finite");
        }
    }
    DSAIndexerPlugin(DSAIndexerPlugin const& other) = default;

private:
    bool inferOutputTypes(nvinfer1::DataType* outputTypes, nvinfer1::DataType const* /*inputTypes*/) const noexcept override
    {
        outputTypes[0] = nvinfer1::DataType::kINT32;
        return true;
    }

    void inferOutputShapes(
        nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs* outputs, nvinfer1::IExprBuilder& exprBuilder) const override
    {
        if (inputs[kQ].nbDims != 4)
        {
            throw PluginError("q must be 4-D [B,S,H,D]");
        }
        outputs[0].nbDims = 3;
        outputs[0].d[0] = inputs[kQ].d[0];
        outputs[0].d[1] = inputs[kQ].d[1];
        outputs[0].d[2] = exprBuilder.constant(this->int32Attr(kTOPK));
    }

    bool supportsType(
        int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t /*nbInputs*/) const noexcept override
    {
        nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
        if (pos == kQ)
        {
            return isFloatType(desc.type);
        }
        nvinfer1::DataType const qType = inOut[kQ].desc.type;
        if (pos == kK)
        {
            return desc.type == qType;
        }
        if (pos == kW)
        {
            return desc.type == qType || desc.type == nvinfer1::DataType::kFLOAT;
        }
        // lengths, block table, query starts (when present) and the output indices.
        return desc.type == nvinfer1::DataType::kINT32;
    }
};

//! Base of the DSA plugin creators: the table's field names, names, and a createPlugin() that reads
//! the fields as the table's attributes and turns exceptions into a logged error and a null plugin.
class DSAPluginCreatorBase : public nvinfer1::IPluginCreatorV3One
{
public:
    ~DSAPluginCreatorBase() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

protected:
    explicit DSAPluginCreatorBase(PluginTable const& table);

    //! Builds the plugin from its fields (may throw PluginError).
    virtual nvinfer1::IPluginV3* create(PluginFieldReader const& fields, nvinfer1::TensorRTPhase phase) = 0;

private:
    PluginTable const& mTable;
    std::vector<nvinfer1::PluginField> mFieldNames;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

//! The creator of plugin class Plugin (a DSAPlugin): its table's name and fields, Plugin::create().
template <class Plugin>
class DSAPluginCreator : public DSAPluginCreatorBase
{
public:
    DSAPluginCreator()
        : DSAPluginCreatorBase(Plugin::kTABLE)
    {
    }

protected:
    nvinfer1::IPluginV3* create(PluginFieldReader const& fields, nvinfer1::TensorRTPhase /*phase*/) override
    {
        return Plugin::create(fields);
    }
};

} // namespace plugin
} // namespace dsa
