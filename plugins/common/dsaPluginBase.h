/*
 * The IPluginV3 boilerplate every DSA plugin shares, so that each plugin folder holds only what
 * differs (shape rules, type rules, output shapes, workspace, enqueue):
 *
 *   DSAPluginBase         core/build/runtime capability interfaces, name/version/namespace,
 *                         clone/attachToContext, configurePlugin/onShapeChange forwarding to one
 *                         checkInputs() hook, timing-cache ID and metadata, serialized fields.
 *   DSAPluginCreatorBase  creator: field names, createPlugin() with field lookup and error logging.
 *   PluginFieldList       the fields a plugin serializes (pointers into its own members).
 *   PluginFieldReader     by-name access to the fields handed to createPlugin().
 *   guarded()             runs a body and turns exceptions into a logged error and a failure value.
 *
 * Uses only inline/virtual TensorRT API, so libdsa_plugins.so still links without libnvinfer.
 */
#pragma once

#include "NvInferRuntime.h"
#include "common/dsaPluginCommon.h"

#include <cstdint>
#include <exception>
#include <string>
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
//! members. Not copyable: a copied plugin rebuilds its list so the pointers refer to its members.
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

//! By-name access to the fields of createPlugin(). Unknown fields are logged (verbose) and ignored;
//! a field given twice takes its last value. Getters throw PluginError on missing required fields
//! or wrong field types.
class PluginFieldReader
{
public:
    PluginFieldReader(
        char const* pluginName, nvinfer1::PluginFieldCollection const* fc, std::vector<std::string> const& known);

    bool has(char const* name) const;
    int64_t requireInt(char const* name) const;
    int64_t getInt(char const* name, int64_t defaultValue) const;
    float requireFloat(char const* name) const;
    float getFloat(char const* name, float defaultValue) const;
    std::string getString(char const* name, std::string const& defaultValue) const;

private:
    nvinfer1::PluginField const* find(char const* name) const;

    nvinfer1::PluginFieldCollection const* mFc;
};

//! Base of the DSA plugins: one class implements the three IPluginV3One capability interfaces.
class DSAPluginBase : public nvinfer1::IPluginV3,
                      public nvinfer1::IPluginV3OneCore,
                      public nvinfer1::IPluginV3OneBuild,
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

    // IPluginV3OneBuild (the shape/type/format/workspace rules stay with each plugin)
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    char const* getTimingCacheID() noexcept override;
    char const* getMetadataString() noexcept override;

    // IPluginV3OneRuntime (enqueue stays with each plugin)
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

protected:
    explicit DSAPluginBase(char const* pluginName);
    //! Copies the name only; the derived copy constructor rebuilds mFields and mDescription.
    DSAPluginBase(DSAPluginBase const& other);

    //! Validates the input shapes (build-time dims may be -1) and records what enqueue needs, e.g.
    //! how many inputs are present. Called by configurePlugin and onShapeChange; throws PluginError.
    virtual void checkInputs(nvinfer1::Dims const* dims, int32_t nbInputs) = 0;
    //! A copy of this plugin (may throw).
    virtual DSAPluginBase* cloneImpl() const = 0;

    template <typename R, typename F>
    R guard(char const* where, R failure, F&& fn) const noexcept
    {
        return guarded(mPluginName, where, failure, static_cast<F&&>(fn));
    }

    PluginFieldList mFields;  //!< what getFieldsToSerialize() returns
    std::string mDescription; //!< attributes as text: timing-cache ID and metadata string

private:
    char const* mPluginName;
};

//! Base of the DSA plugin creators: the declared fields, names, and a createPlugin() that looks the
//! fields up by name and turns exceptions into a logged error and a null plugin.
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
    //! fieldNames: the attributes this plugin takes (data null), as getFieldNames() reports them.
    DSAPluginCreatorBase(char const* pluginName, std::vector<nvinfer1::PluginField> fieldNames);

    //! Builds the plugin from its fields (may throw PluginError).
    virtual nvinfer1::IPluginV3* create(PluginFieldReader const& fields, nvinfer1::TensorRTPhase phase) = 0;

private:
    char const* mPluginName;
    std::vector<nvinfer1::PluginField> mFieldNames;
    std::vector<std::string> mKnown;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace plugin
} // namespace dsa
