/*
 * The declarative I/O table of a DSA plugin: its name, its inputs in order (the optional ones last),
 * its outputs and its attributes (type, and default or required), as constexpr data in one struct
 * per op, next to the plugin class:
 *
 *   struct DSAExampleTable
 *   {
 *       static constexpr char const* kNAME = "DSAExample";
 *       static constexpr TensorSpec kINPUTS[] = {
 *           input("q"),
 *           input("k"),
 *           optionalInput("lengths"),
 *       };
 *       static constexpr TensorSpec kOUTPUTS[] = {
 *           output("out"),
 *       };
 *       static constexpr AttrSpec kATTRIBUTES[] = {
 *           attrInt32("topk"),                // no default: required
 *           attrFloat32("scale"),
 *           attrInt32("causal", 1),           // optional, default 1
 *           attrString("activation", "silu"),
 *       };
 *   };
 *
 * kATTRIBUTES may be left out when the op has none. DSAPluginBase drives what every plugin does the
 * same way from the table: the input and output counts (and the messages naming the inputs), the
 * serialized fields, the timing-cache ID / metadata string, the creator's field names and the
 * by-name lookup of createPlugin(). Keep one entry per call, with the names as string literals:
 * tests/plugins/test_contract_agreement.py reads the tables with a regular expression and checks
 * them against the op contract (dsa_export/ops/contract.py) and the PluginConfig YAML files.
 *
 * Plain C++17, no TensorRT: the smoke test can include it too.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

namespace dsa
{
namespace plugin
{

//! Type of an attribute, as serialized: kINT32 and kFLOAT32 fields of length 1, kCHAR for strings.
enum class AttrType : int32_t
{
    kINT32 = 0,
    kFLOAT32 = 1,
    kSTRING = 2
};

//! One input or output of a plugin.
struct TensorSpec
{
    char const* name;
    bool optional;
};

//! One attribute of a plugin; `required` attributes have no default.
struct AttrSpec
{
    char const* name;
    AttrType type;
    bool required;
    int32_t intDefault;
    float floatDefault;
    char const* stringDefault;
};

//! A required input.
constexpr TensorSpec input(char const* name)
{
    return TensorSpec{name, false};
}

//! An optional input; optional inputs come after the required ones.
constexpr TensorSpec optionalInput(char const* name)
{
    return TensorSpec{name, true};
}

//! An output.
constexpr TensorSpec output(char const* name)
{
    return TensorSpec{name, false};
}

//! A required int32 attribute.
constexpr AttrSpec attrInt32(char const* name)
{
    return AttrSpec{name, AttrType::kINT32, true, 0, 0.F, ""};
}

//! An int32 attribute with a default.
constexpr AttrSpec attrInt32(char const* name, int32_t defaultValue)
{
    return AttrSpec{name, AttrType::kINT32, false, defaultValue, 0.F, ""};
}

//! A required float32 attribute.
constexpr AttrSpec attrFloat32(char const* name)
{
    return AttrSpec{name, AttrType::kFLOAT32, true, 0, 0.F, ""};
}

//! A float32 attribute with a default.
constexpr AttrSpec attrFloat32(char const* name, float defaultValue)
{
    return AttrSpec{name, AttrType::kFLOAT32, false, 0, defaultValue, ""};
}

//! A required string attribute.
constexpr AttrSpec attrString(char const* name)
{
    return AttrSpec{name, AttrType::kSTRING, true, 0, 0.F, ""};
}

//! A string attribute with a default.
constexpr AttrSpec attrString(char const* name, char const* defaultValue)
{
    return AttrSpec{name, AttrType::kSTRING, false, 0, 0.F, defaultValue};
}

//! Two NUL-terminated names are equal (usable in constant expressions).
constexpr bool sameName(char const* a, char const* b)
{
    while (*a != '\0' && *a == *b)
    {
        ++a;
        ++b;
    }
    return *a == *b;
}

//! A table struct seen through pointers and counts, as the non-template code uses it.
struct PluginTable
{
    char const* name;
    TensorSpec const* inputs;
    int32_t nbInputs;
    TensorSpec const* outputs;
    int32_t nbOutputs;
    AttrSpec const* attributes;
    int32_t nbAttributes;

    //! The inputs that must be present (the optional ones come last).
    constexpr int32_t nbRequiredInputs() const
    {
        int32_t n = 0;
        while (n < nbInputs && !inputs[n].optional)
        {
            ++n;
        }
        return n;
    }

    //! An input count the plugin takes: all required inputs and any number of the optional ones.
    constexpr bool acceptsInputCount(int32_t n) const
    {
        return n >= nbRequiredInputs() && n <= nbInputs;
    }

    //! Position of input `inputName`; used for constants, so an unknown name does not compile.
    constexpr int32_t inputIndex(char const* inputName) const
    {
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            if (sameName(inputs[i].name, inputName))
            {
                return i;
            }
        }
        throw std::invalid_argument("not an input of the plugin table");
    }

    //! Position of attribute `attributeName`; used for constants, so an unknown name does not compile.
    constexpr int32_t attributeIndex(char const* attributeName) const
    {
        for (int32_t i = 0; i < nbAttributes; ++i)
        {
            if (sameName(attributes[i].name, attributeName))
            {
                return i;
            }
        }
        throw std::invalid_argument("not an attribute of the plugin table");
    }

    //! At least one output, optional inputs only after the required ones, no name twice in a list.
    constexpr bool isValid() const
    {
        if (nbOutputs < 1)
        {
            return false;
        }
        for (int32_t i = nbRequiredInputs(); i < nbInputs; ++i)
        {
            if (!inputs[i].optional)
            {
                return false;
            }
        }
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            for (int32_t j = 0; j < i; ++j)
            {
                if (sameName(inputs[i].name, inputs[j].name))
                {
                    return false;
                }
            }
        }
        for (int32_t i = 0; i < nbOutputs; ++i)
        {
            for (int32_t j = 0; j < i; ++j)
            {
                if (sameName(outputs[i].name, outputs[j].name))
                {
                    return false;
                }
            }
        }
        for (int32_t i = 0; i < nbAttributes; ++i)
        {
            for (int32_t j = 0; j < i; ++j)
            {
                if (sameName(attributes[i].name, attributes[j].name))
                {
                    return false;
                }
            }
        }
        return true;
    }
};

namespace detail
{
//! A table's attributes, or none when the table declares no kATTRIBUTES.
template <class Table, class = void>
struct TableAttributes
{
    static constexpr AttrSpec const* data()
    {
        return nullptr;
    }
    static constexpr int32_t size()
    {
        return 0;
    }
};

template <class Table>
struct TableAttributes<Table, std::void_t<decltype(Table::kATTRIBUTES)>>
{
    static constexpr AttrSpec const* data()
    {
        return Table::kATTRIBUTES;
    }
    static constexpr int32_t size()
    {
        return static_cast<int32_t>(std::extent<decltype(Table::kATTRIBUTES)>::value);
    }
};
} // namespace detail

//! The PluginTable of a table struct (kNAME, kINPUTS, kOUTPUTS and, when the op has attributes, kATTRIBUTES).
template <class Table>
constexpr PluginTable makeTable()
{
    return PluginTable{Table::kNAME, Table::kINPUTS, static_cast<int32_t>(std::extent<decltype(Table::kINPUTS)>::value),
        Table::kOUTPUTS, static_cast<int32_t>(std::extent<decltype(Table::kOUTPUTS)>::value),
        detail::TableAttributes<Table>::data(), detail::TableAttributes<Table>::size()};
}

} // namespace plugin
} // namespace dsa
