// Jinja2's lexer: template source → text, {{ … }} and {% … %} tokens, with transformers'
// whitespace handling (trim_blocks, lstrip_blocks, the -/+ modifiers, one trailing newline
// dropped) and {% raw %} applied here. Internal to src/jinja.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "jinja/value.h"

namespace sy::jinja {

struct Token {
  enum class Type {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEnd
  };
  Type type;
  std::string text;
  int line;
  Value literal;
};

// Throws TemplateError (syntax.h) naming the line.
std::vector<Token> Lex(std::string_view source);

}  // namespace sy::jinja
