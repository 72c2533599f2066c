// Regular expressions in the ECMAScript subset JSON Schema's "pattern" uses: literals, escapes
// (\d \w \s and their negations, \n \t \xHH \uHHHH \u{...}, escaped punctuation), classes with
// ranges and negation, '.', groups ((...), (?:...), (?<name>...)), alternation, quantifiers
// (* + ? {n} {n,} {n,m}, lazy forms alike), and ^ / $ at the ends. Backreferences, lookaround,
// word boundaries, inline flags and \p{...} are errors naming them: they are not regular or not
// supported, and are never approximated.
//
// The parser works on code points; `lower` turns each character class into bytes, so the same
// expression can match raw UTF-8 text (RegexGrammar) or the inside of a JSON string literal,
// escapes included (json_schema.cc).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "structured/grammar.h"

namespace sy::structured {

using ClassLowering = std::function<Expr(const CodepointSet&)>;

// `search`: JSON Schema semantics, the pattern may match anywhere unless anchored by ^ / $.
// Otherwise the whole input must match (^ and $ are then allowed and redundant).
Result<Expr> ParseRegex(std::string_view pattern, const ClassLowering& lower, bool search,
                        const GrammarLimits& limits);

// A grammar whose language is the strings (UTF-8) fully matching `pattern`.
Result<Grammar> RegexGrammar(std::string_view pattern, const GrammarLimits& limits);

// A grammar whose language is exactly the given strings.
Result<Grammar> ChoiceGrammar(const std::vector<std::string>& choices);

}  // namespace sy::structured
