#include "common/dsaPluginBase.h"

#include <cstring>
#include <utility>

using namespace nvinfer1;

namespace dsa
{
namespace plugin
{

// ---------------------------------------------------------------------------------------------
// PluginFieldList

void PluginFieldList::clear()
{
    mFields.clear();
    mCollection.nbFields = 0;
    mCollection.fields = nullptr;
}

void PluginFieldList::addInt32(char const* name, int32_t const* value)
{
    mFields.emplace_back(name, value, PluginFieldType::kINT32, 1);
}

void PluginFieldList::addFloat32(char const* name, float const* value)
{
    mFields.emplace_back(name, value, PluginFieldType::kFLOAT32, 1);
}

void PluginFieldList::addString(char const* name, std::string const* value)
{
    mFields.emplace_back(name, value->c_str(), PluginFieldType::kCHAR, static_cast<int32_t>(value->size()));
}

PluginFieldCollection const* PluginFieldList::collection() noexcept
{
    mCollection.nbFields = static_cast<int32_t>(mFields.size());
    mCollection.fields = mFields.data();
    return &mCollection;
}

// ---------------------------------------------------------------------------------------------
// PluginFieldReader

PluginFieldReader::PluginFieldReader(
    char const* pluginName, PluginFieldCollection const* fc, std::vector<std::string> const& known)
    : mFc(fc)
{
    if (fc == nullptr || (fc->nbFields > 0 && fc->fields == nullptr))
    {
        throw PluginError("no plugin fields");
    }
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        char const* name = fc->fields[i].name;
        if (name == nullptr)
        {
            continue;
        }
        bool isKnown = false;
        for (std::string const& k : known)
        {
            isKnown = isKnown || k == name;
        }
        if (!isKnown)
        {
            logVerbose(std::string(pluginName) + ": ignoring attribute '" + name + "'");
        }
    }
}

PluginField const* PluginFieldReader::find(char const* name) const
{
    PluginField const* found = nullptr;
    for (int32_t i = 0; i < mFc->nbFields; ++i)
    {
        PluginField const& f = mFc->fields[i];
        if (f.name != nullptr && std::strcmp(f.name, name) == 0)
        {
            found = &f; // the last occurrence wins
        }
    }
    return found;
}

bool PluginFieldReader::has(char const* name) const
{
    return find(name) != nullptr;
}

int64_t PluginFieldReader::requireInt(char const* name) const
{
    PluginField const* f = find(name);
    if (f == nullptr)
    {
        throw PluginError(std::string("attribute '") + name + "' is required");
    }
    return readIntField(*f);
}

int64_t PluginFieldReader::getInt(char const* name, int64_t defaultValue) const
{
    PluginField const* f = find(name);
    return f != nullptr ? readIntField(*f) : defaultValue;
}

float PluginFieldReader::requireFloat(char const* name) const
{
    PluginField const* f = find(name);
    if (f == nullptr)
    {
        throw PluginError(std::string("attribute '") + name + "' is required");
    }
    return readFloatField(*f);
}

float PluginFieldReader::getFloat(char const* name, float defaultValue) const
{
    PluginField const* f = find(name);
    return f != nullptr ? readFloatField(*f) : defaultValue;
}

std::string PluginFieldReader::getString(char const* name, std::string const& defaultValue) const
{
    PluginField const* f = find(name);
    return f != nullptr ? readStringField(*f) : defaultValue;
}

// ---------------------------------------------------------------------------------------------
// DSAPluginBase

DSAPluginBase::DSAPluginBase(char const* pluginName)
    : mPluginName(pluginName)
{
}

DSAPluginBase::DSAPluginBase(DSAPluginBase const& other)
    : IPluginV3(other)
    , IPluginV3OneCore(other)
    , IPluginV3OneBuild(other)
    , IPluginV3OneRuntime(other)
    , mPluginName(other.mPluginName)
{
}

IPluginCapability* DSAPluginBase::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* DSAPluginBase::clone() noexcept
{
    return guard<IPluginV3*>("clone", nullptr, [&]() -> IPluginV3* { return cloneImpl(); });
}

char const* DSAPluginBase::getPluginName() const noexcept
{
    return mPluginName;
}

char const* DSAPluginBase::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* DSAPluginBase::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

int32_t DSAPluginBase::getNbOutputs() const noexcept
{
    return 1;
}

int32_t DSAPluginBase::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept
{
    return guard("configurePlugin", -1, [&]() {
        if (in == nullptr || nbInputs < 0 || nbOutputs != getNbOutputs())
        {
            throw PluginError("expected " + std::to_string(getNbOutputs()) + " output(s)");
        }
        std::vector<Dims> dims;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims.push_back(in[i].desc.dims);
        }
        checkInputs(dims.data(), nbInputs);
        return 0;
    });
}

int32_t DSAPluginBase::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept
{
    return guard("onShapeChange", -1, [&]() {
        if (in == nullptr || nbInputs < 0 || nbOutputs != getNbOutputs())
        {
            throw PluginError("expected " + std::to_string(getNbOutputs()) + " output(s)");
        }
        std::vector<Dims> dims;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims.push_back(in[i].dims);
        }
        checkInputs(dims.data(), nbInputs);
        return 0;
    });
}

char const* DSAPluginBase::getTimingCacheID() noexcept
{
    return mDescription.c_str();
}

char const* DSAPluginBase::getMetadataString() noexcept
{
    return mDescription.c_str();
}

IPluginV3* DSAPluginBase::attachToContext(IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

PluginFieldCollection const* DSAPluginBase::getFieldsToSerialize() noexcept
{
    return mFields.collection();
}

// ---------------------------------------------------------------------------------------------
// DSAPluginCreatorBase

DSAPluginCreatorBase::DSAPluginCreatorBase(char const* pluginName, std::vector<PluginField> fieldNames)
    : mPluginName(pluginName)
    , mFieldNames(std::move(fieldNames))
{
    for (PluginField const& f : mFieldNames)
    {
        mKnown.emplace_back(f.name);
    }
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
}

char const* DSAPluginCreatorBase::getPluginName() const noexcept
{
    return mPluginName;
}

char const* DSAPluginCreatorBase::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* DSAPluginCreatorBase::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

PluginFieldCollection const* DSAPluginCreatorBase::getFieldNames() noexcept
{
    return &mFieldCollection;
}

IPluginV3* DSAPluginCreatorBase::createPlugin(char const* name, PluginFieldCollection const* fc, TensorRTPhase phase) noexcept
{
    try
    {
        PluginFieldReader const fields(mPluginName, fc, mKnown);
        return create(fields, phase);
    }
    catch (std::exception const& e)
    {
        logError(std::string(mPluginName) + " createPlugin(" + (name != nullptr ? name : "") + "): " + e.what());
    }
    catch (...)
    {
        logError(std::string(mPluginName) + " createPlugin(" + (name != nullptr ? name : "") + "): unknown exception");
    }
    return nullptr;
}

} // namespace plugin
} // namespace dsa
