#include "common/dsaPluginBase.h"

#include <cstring>
#include <utility>

using namespace nvinfer1;

namespace dsa
{
namespace plugin
{
namespace
{
//! "a, b, c[, d]": the table's input names, optional ones in brackets.
std::string inputListText(PluginTable const& table)
{
    std::string s;
    for (int32_t i = 0; i < table.nbInputs; ++i)
    {
        std::string const item = std::string(i == 0 ? "" : ", ") + table.inputs[i].name;
        s += table.inputs[i].optional ? "[" + item + "]" : item;
    }
    return s;
}

//! "1 output", "2 outputs".
std::string outputCountText(PluginTable const& table)
{
    return std::to_string(table.nbOutputs) + (table.nbOutputs == 1 ? " output" : " outputs");
}
} // namespace

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

PluginFieldReader::PluginFieldReader(PluginTable const& table, PluginFieldCollection const* fc)
    : mTable(table)
    , mFc(fc)
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
        for (int32_t a = 0; a < table.nbAttributes; ++a)
        {
            isKnown = isKnown || std::strcmp(table.attributes[a].name, name) == 0;
        }
        if (!isKnown)
        {
            logVerbose(std::string(table.name) + ": ignoring attribute '" + name + "'");
        }
    }
}

AttrSpec const& PluginFieldReader::spec(int32_t attribute, AttrType type) const
{
    if (attribute < 0 || attribute >= mTable.nbAttributes || mTable.attributes[attribute].type != type)
    {
        throw PluginError(std::string("internal error: attribute #") + std::to_string(attribute)
            + " of the table is not read with its type");
    }
    return mTable.attributes[attribute];
}

PluginField const* PluginFieldReader::find(AttrSpec const& spec) const
{
    PluginField const* found = nullptr;
    for (int32_t i = 0; i < mFc->nbFields; ++i)
    {
        PluginField const& f = mFc->fields[i];
        if (f.name != nullptr && std::strcmp(f.name, spec.name) == 0)
        {
            found = &f; // the last occurrence wins
        }
    }
    if (found == nullptr && spec.required)
    {
        throw PluginError(std::string("attribute '") + spec.name + "' is required");
    }
    return found;
}

int64_t PluginFieldReader::getInt(int32_t attribute) const
{
    AttrSpec const& s = spec(attribute, AttrType::kINT32);
    PluginField const* f = find(s);
    return f != nullptr ? readIntField(*f) : s.intDefault;
}

float PluginFieldReader::getFloat(int32_t attribute) const
{
    AttrSpec const& s = spec(attribute, AttrType::kFLOAT32);
    PluginField const* f = find(s);
    return f != nullptr ? readFloatField(*f) : s.floatDefault;
}

std::string PluginFieldReader::getString(int32_t attribute) const
{
    AttrSpec const& s = spec(attribute, AttrType::kSTRING);
    PluginField const* f = find(s);
    return f != nullptr ? readStringField(*f) : std::string(s.stringDefault);
}

// ---------------------------------------------------------------------------------------------
// DSAPluginBase

DSAPluginBase::DSAPluginBase(PluginTable const& table, std::vector<AttributeValue> attributes)
    : mTable(table)
    , mAttributes(std::move(attributes))
    , mNbInputs(table.nbRequiredInputs())
{
    bool ok = static_cast<int32_t>(mAttributes.size()) == mTable.nbAttributes;
    for (int32_t i = 0; ok && i < mTable.nbAttributes; ++i)
    {
        ok = mAttributes[i].type == mTable.attributes[i].type;
    }
    if (!ok)
    {
        throw PluginError(std::string(mTable.name) + ": internal error: the attribute values do not match the table");
    }
    initFields();
}

DSAPluginBase::DSAPluginBase(DSAPluginBase const& other)
    : IPluginV3(other)
    , IPluginV3OneCore(other)
    , DSABuildCapability(other)
    , IPluginV3OneRuntime(other)
    , mTable(other.mTable)
    , mAttributes(other.mAttributes)
    , mNbInputs(other.mNbInputs)
{
    initFields();
}

void DSAPluginBase::initFields()
{
    mFields.clear();
    mDescription.clear();
    for (int32_t i = 0; i < mTable.nbAttributes; ++i)
    {
        char const* name = mTable.attributes[i].name;
        AttributeValue const& v = mAttributes[i];
        std::string text;
        switch (v.type)
        {
        case AttrType::kINT32:
            mFields.addInt32(name, &v.intValue);
            text = std::to_string(v.intValue);
            break;
        case AttrType::kFLOAT32:
            mFields.addFloat32(name, &v.floatValue);
            text = std::to_string(v.floatValue);
            break;
        case AttrType::kSTRING:
            mFields.addString(name, &v.stringValue);
            text = v.stringValue;
            break;
        }
        mDescription += (i == 0 ? "" : ";") + std::string(name) + "=" + text;
    }
}

std::string DSAPluginBase::inputCountText() const
{
    int32_t const lo = mTable.nbRequiredInputs();
    int32_t const hi = mTable.nbInputs;
    if (lo == hi)
    {
        return std::to_string(hi);
    }
    return std::to_string(lo) + (hi == lo + 1 ? " or " : " to ") + std::to_string(hi);
}

IPluginCapability* DSAPluginBase::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<DSABuildCapability*>(this);
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
    return mTable.name;
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
    return mTable.nbOutputs;
}

void DSAPluginBase::checkInputCount(Dims const* dims, int32_t nbInputs)
{
    if (!mTable.acceptsInputCount(nbInputs))
    {
        throw PluginError(std::string(mTable.name) + " takes " + inputCountText() + " inputs ("
            + inputListText(mTable) + "), got " + std::to_string(nbInputs));
    }
    checkInputs(dims, nbInputs);
    mNbInputs = nbInputs;
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
        checkInputCount(dims.data(), nbInputs);
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
        checkInputCount(dims.data(), nbInputs);
        return 0;
    });
}

int32_t DSAPluginBase::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (outputTypes == nullptr || nbOutputs != mTable.nbOutputs || !mTable.acceptsInputCount(nbInputs)
        || !inferOutputTypes(outputTypes, inputTypes))
    {
        logError(std::string(mTable.name) + " getOutputDataTypes: expected " + inputCountText() + " inputs and "
            + outputCountText(mTable));
        return -1;
    }
    return 0;
}

int32_t DSAPluginBase::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept
{
    return guard("getOutputShapes", -1, [&]() {
        if (inputs == nullptr || outputs == nullptr || nbOutputs != mTable.nbOutputs
            || !mTable.acceptsInputCount(nbInputs))
        {
            throw PluginError("expected " + inputCountText() + " inputs and " + outputCountText(mTable));
        }
        inferOutputShapes(inputs, outputs, exprBuilder);
        return 0;
    });
}

bool DSAPluginBase::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (inOut == nullptr || nbOutputs != mTable.nbOutputs || pos < 0 || pos >= nbInputs + nbOutputs)
    {
        return false;
    }
    if (formatsNeedInputCount() && !mTable.acceptsInputCount(nbInputs))
    {
        return false;
    }
    if (inOut[pos].desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    return supportsType(pos, inOut, nbInputs);
}

int32_t DSAPluginBase::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    return guard("enqueue", -1, [&]() {
        if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
        {
            throw PluginError("null tensor descriptors or pointers");
        }
        launch(inputDesc, inputs, outputs, workspace, stream);
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

DSAPluginCreatorBase::DSAPluginCreatorBase(PluginTable const& table)
    : mTable(table)
{
    for (int32_t i = 0; i < table.nbAttributes; ++i)
    {
        AttrSpec const& a = table.attributes[i];
        switch (a.type)
        {
        case AttrType::kINT32: mFieldNames.emplace_back(a.name, nullptr, PluginFieldType::kINT32, 1); break;
        case AttrType::kFLOAT32: mFieldNames.emplace_back(a.name, nullptr, PluginFieldType::kFLOAT32, 1); break;
        case AttrType::kSTRING: mFieldNames.emplace_back(a.name, nullptr, PluginFieldType::kCHAR, 0); break;
        }
    }
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
}

char const* DSAPluginCreatorBase::getPluginName() const noexcept
{
    return mTable.name;
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
        PluginFieldReader const fields(mTable, fc);
        return create(fields, phase);
    }
    catch (std::exception const& e)
    {
        logError(std::string(mTable.name) + " createPlugin(" + (name != nullptr ? name : "") + "): " + e.what());
    }
    catch (...)
    {
        logError(std::string(mTable.name) + " createPlugin(" + (name != nullptr ? name : "") + "): unknown exception");
    }
    return nullptr;
}

} // namespace plugin
} // namespace dsa
