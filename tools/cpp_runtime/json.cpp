#include "json.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dsa
{

Json const& Json::operator[](std::string const& key) const
{
    static Json const kNullValue;
    if (type != Type::kObject)
    {
        return kNullValue;
    }
    auto it = object.find(key);
    return it == object.end() ? kNullValue : it->second;
}

bool Json::isInteger() const
{
    return type == Type::kNumber && std::isfinite(number) && std::floor(number) == number;
}

namespace
{

class JsonParser
{
public:
    JsonParser(std::string const& text, std::string const& where) : mText(text), mWhere(where) {}

    Json parse()
    {
        Json value = parseValue(0);
        skipSpace();
        if (mPos != mText.size())
        {
            fail("trailing characters");
        }
        return value;
    }

private:
    static constexpr int kMaxDepth = 256;

    [[noreturn]] void fail(std::string const& what) const
    {
        throw UserError(mWhere + " is not valid JSON (" + what + " at offset " + std::to_string(mPos) + ")");
    }

    char peek() const { return mPos < mText.size() ? mText[mPos] : '\0'; }

    char take()
    {
        if (mPos >= mText.size())
        {
            fail("unexpected end");
        }
        return mText[mPos++];
    }

    void skipSpace()
    {
        while (mPos < mText.size() && std::isspace(static_cast<unsigned char>(mText[mPos])))
        {
            ++mPos;
        }
    }

    bool consume(char const* word)
    {
        size_t const n = std::strlen(word);
        if (mText.compare(mPos, n, word) == 0)
        {
            mPos += n;
            return true;
        }
        return false;
    }

    Json parseValue(int depth)
    {
        if (depth > kMaxDepth)
        {
            fail("nesting too deep");
        }
        skipSpace();
        if (mPos >= mText.size())
        {
            fail("unexpected end");
        }
        Json value;
        char const c = mText[mPos];
        if (c == '{')
        {
            value.type = Json::Type::kObject;
            ++mPos;
            skipSpace();
            if (peek() == '}')
            {
                ++mPos;
                return value;
            }
            while (true)
            {
                skipSpace();
                std::string key = parseString();
                skipSpace();
                if (take() != ':')
                {
                    fail("expected ':'");
                }
                value.object[key] = parseValue(depth + 1);
                skipSpace();
                char const next = take();
                if (next == '}')
                {
                    break;
                }
                if (next != ',')
                {
                    fail("expected ',' or '}'");
                }
            }
        }
        else if (c == '[')
        {
            value.type = Json::Type::kArray;
            ++mPos;
            skipSpace();
            if (peek() == ']')
            {
                ++mPos;
                return value;
            }
            while (true)
            {
                value.array.push_back(parseValue(depth + 1));
                skipSpace();
                char const next = take();
                if (next == ']')
                {
                    break;
                }
                if (next != ',')
                {
                    fail("expected ',' or ']'");
                }
            }
        }
        else if (c == '"')
        {
            value.type = Json::Type::kString;
            value.string = parseString();
        }
        else if (consume("true"))
        {
            value.type = Json::Type::kBool;
            value.boolean = true;
        }
        else if (consume("false"))
        {
            value.type = Json::Type::kBool;
        }
        else if (consume("null"))
        {
            value.type = Json::Type::kNull;
        }
        else if (c == '-' || std::isdigit(static_cast<unsigned char>(c)))
        {
            char* end = nullptr;
            value.number = std::strtod(mText.c_str() + mPos, &end);
            if (end == mText.c_str() + mPos)
            {
                fail("unexpected character");
            }
            value.type = Json::Type::kNumber;
            mPos = static_cast<size_t>(end - mText.c_str());
        }
        else
        {
            fail("unexpected character");
        }
        return value;
    }

    std::string parseString()
    {
        if (peek() != '"')
        {
            fail("expected a string");
        }
        ++mPos;
        std::string out;
        while (true)
        {
            char c = take();
            if (c == '"')
            {
                break;
            }
            if (c == '\\')
            {
                char const e = take();
                switch (e)
                {
                case 'n': c = '\n'; break;
                case 't': c = '\t'; break;
                case 'r': c = '\r'; break;
                case 'b': c = '\b'; break;
                case 'f': c = '\f'; break;
                case 'u':
                    // Names and paths are ASCII; other characters (free-text notes) become '?'.
                    if (mPos + 4 > mText.size())
                    {
                        fail("unterminated \\u escape");
                    }
                    mPos += 4;
                    c = '?';
                    break;
                default: c = e; break;
                }
            }
            out.push_back(c);
        }
        return out;
    }

    std::string const& mText;
    std::string const& mWhere;
    size_t mPos{0};
};

} // namespace

Json parseJson(std::string const& text, std::string const& where)
{
    return JsonParser(text, where).parse();
}

std::string readText(std::string const& path)
{
    std::ifstream file(path, std::ios::binary);
    if (!file)
    {
        throw UserError(path + " cannot be opened");
    }
    std::stringstream buffer;
    buffer << file.rdbuf();
    return buffer.str();
}

bool isFile(std::string const& path)
{
    std::error_code error;
    return std::filesystem::is_regular_file(path, error);
}

bool isDir(std::string const& path)
{
    std::error_code error;
    return std::filesystem::is_directory(path, error);
}

} // namespace dsa
