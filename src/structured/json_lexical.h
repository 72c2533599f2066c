// The lexical layer of JSON grammars, and the one canonical form the JSON front ends emit.
//
// Whitespace policy (deterministic, bounded, and what models write): between JSON tokens there
// is nothing, one space, or one newline followed by at most 40 spaces — compact output,
// json.dumps' default ", " / ": ", and pretty-printing with space indentation up to 20 levels of
// two all fit; tabs and runs of blank lines do not. No whitespace before or after the value.
//
// Strings are canonical: every character is written raw (UTF-8) except '"' and '\' (escaped as
// \" and \\) and control characters below U+0020 (\b \f \n \r \t, otherwise \u00xx with
// lowercase hex). So each string value has exactly one spelling, and minLength/maxLength,
// patterns and "not one of these property names" are exact over spellings.
//
// Numbers: integers are -?(0|[1-9][0-9]*); unconstrained numbers are JSON numbers; numbers with
// bounds (minimum, maximum, exclusive*) are positional decimals (no exponent) whose value lies in
// the range, built digit by digit as an exact regular language; "-0" is written "0".
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "structured/grammar.h"

namespace sy::structured {

Expr JsonWhitespace();
// The spellings of the characters in `set` inside a JSON string literal.
Expr JsonChars(const CodepointSet& set);
// A string literal of any content with length (in code points) in [min, max] (max < 0: any).
Expr JsonString(int min_length, int max_length);
// The literal spelling a string value has (quotes included).
std::string JsonStringLiteral(std::string_view utf8);
// A string literal that is none of `names` (UTF-8 values).
Expr JsonStringExcept(const std::vector<std::string>& names);

// An exact decimal number: sign, integer digits without leading zeros ("0" for zero), fraction
// digits without trailing zeros.
struct Decimal {
  bool negative = false;
  std::string integer = "0";
  std::string fraction;
  static Result<Decimal> FromJson(const nlohmann::ordered_json& number);
  static std::optional<Decimal> Parse(std::string_view text);  // -?d+(.d+)?([eE][+-]?d+)?
  std::string ToString() const;
  bool IsZero() const { return integer == "0" && fraction.empty(); }
};
int Compare(const Decimal& a, const Decimal& b);

struct NumberBound {
  Decimal value;
  bool inclusive = true;
};
// Numbers (integers when `integer_only`) in the range; an empty language when it is empty.
Result<Expr> JsonNumberInRange(const std::optional<NumberBound>& lo,
                               const std::optional<NumberBound>& hi, bool integer_only);
Expr JsonInteger();
Expr JsonNumber();

// The canonical compact serialization of a value, as the grammars spell it (object members in
// the value's own order).
std::string CanonicalJson(const nlohmann::ordered_json& value);

// Regular expressions (ECMAScript) for the supported "format" values, over the string's
// characters; nullopt for a format that is not supported.
std::optional<std::string> FormatRegex(std::string_view format);

}  // namespace sy::structured
