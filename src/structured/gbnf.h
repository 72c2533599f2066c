// EBNF grammars in llama.cpp's GBNF syntax (github.com/ggml-org/llama.cpp, grammars/README.md):
//
//   root   ::= "answer: " item ("," item)*      # rules: name ::= alternatives
//   item   ::= [a-z]+ | "\"" [^"\\]* "\""        # literals, classes, groups, | * + ? {m,n}
//
// Names are [A-Za-z0-9_-]+; the start rule is `root`. Literals and classes are over Unicode code
// points (UTF-8) with the escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH; `.` is any code
// point; '#' starts a comment. A rule ends at a newline unless inside parentheses or after '|'.
// As in llama.cpp, left recursion is an error (rewrite it with repetition); token references
// (<...>) are not supported.
#pragma once

#include <string_view>

#include "base/status.h"
#include "structured/grammar.h"

namespace sy::structured {

Result<Grammar> GbnfGrammar(std::string_view text, const GrammarLimits& limits);

}  // namespace sy::structured
