// Python's str and argument semantics the builtins share: case mapping, strip, split,
// splitlines, replace, len(), and reading a call's arguments. Internal to src/jinja.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "jinja/interpreter.h"

namespace sy::jinja {

bool IsIntLike(const Value& v);
int64_t IntArgument(Interpreter& in, const Value& v, int64_t if_absent, const char* what);
bool BoolArgument(const Value& v, bool if_absent);
std::string StringArgument(Interpreter& in, const Value& v, const char* what);
int64_t Length(Interpreter& in, const Value& v);  // len(); fails where Python's does

// Case mapping: ASCII and Latin-1 letters (Python maps all of Unicode; chat templates apply it to
// role names and keywords).
uint32_t Lower(uint32_t c);
uint32_t Upper(uint32_t c);
bool IsLowerCase(uint32_t c);
bool IsUpperCase(uint32_t c);
bool IsAlpha(uint32_t c);
bool IsDigit(uint32_t c);
bool AllCased(const std::string& s, bool (*in_case)(uint32_t));
std::string MapCase(const std::string& s, uint32_t (*map)(uint32_t));

// str.strip(chars) (chars undefined or none: whitespace), str.split / str.rsplit,
// str.splitlines, str.replace.
std::string Strip(const std::string& s, const Value& chars, bool left, bool right);
Value Split(Interpreter& in, const std::string& s, const Value& separator, int64_t max_split,
            bool from_right);
std::vector<std::string> SplitLines(const std::string& s, bool keep_ends);
std::string Replace(const std::string& s, const std::string& old, const std::string& replacement,
                    int64_t count, Interpreter& in);

// str.capitalize(): the first character upper case, the rest lower.
std::string Capitalize(const std::string& s);
// Fails as Python does ("'<' not supported between instances of …") where `a op b` cannot order.
void RequireOrderable(Interpreter& in, const std::string& op, const Value& a, const Value& b);

Value Tuple(Value a, Value b);

}  // namespace sy::jinja
