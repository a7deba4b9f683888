// A minimal JSON reader (objects, arrays, strings, numbers, true/false/null) for manifest.json and
// pipeline.json, so the runtime needs nothing but TensorRT and the CUDA runtime. Plain C++17: it
// compiles and is tested without TensorRT or CUDA (see tests/test_cpp_runtime.py).
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace dsa
{

//! A user error: one sentence, printed as "Error: ..." with exit code 1.
class UserError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

struct Json
{
    enum class Type { kNull, kBool, kNumber, kString, kArray, kObject } type{Type::kNull};
    bool boolean{false};
    double number{0.0};
    std::string string;
    std::vector<Json> array;
    std::map<std::string, Json> object;

    bool isNull() const { return type == Type::kNull; }
    bool isString() const { return type == Type::kString; }
    bool isNumber() const { return type == Type::kNumber; }
    bool isArray() const { return type == Type::kArray; }
    bool isObject() const { return type == Type::kObject; }
    bool has(std::string const& key) const { return type == Type::kObject && object.count(key) != 0; }
    //! The member ``key``, or a null value when absent (or when this is not an object).
    Json const& operator[](std::string const& key) const;
    //! True when this is a number with no fractional part.
    bool isInteger() const;
};

//! Parse ``text``; ``where`` names the file in the UserError raised for malformed JSON.
Json parseJson(std::string const& text, std::string const& where);

//! The whole file, or a UserError naming it when it cannot be opened.
std::string readText(std::string const& path);

//! ``path`` exists and is a regular file (or a link to one).
bool isFile(std::string const& path);

//! ``path`` exists and is a folder.
bool isDir(std::string const& path);

} // namespace dsa
