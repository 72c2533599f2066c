// A parsed Jinja template: expressions and statements as a small tree, built by parser.cc with
// Jinja2's grammar (its operator precedence, its `is` tests, its whitespace control under
// transformers' trim_blocks and lstrip_blocks), walked by interpreter.cc.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace sy::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,      // value
    kName,         // name
    kList,         // operands
    kTuple,        // operands
    kDict,         // operands: key, value, key, value, …
    kGetAttr,      // operands[0].name
    kGetItem,      // operands[0][operands[1]]
    kSlice,        // operands[0][operands[1]:operands[2]:operands[3]], each may be null
    kCall,         // operands[0](operands[1..], keywords)
    kFilter,       // operands[0] | name(operands[1..], keywords); operands[0] null in a block
    kTest,         // operands[0] is name(operands[1..])
    kNot,          // not operands[0]
    kNegate,       // -operands[0]
    kPlus,         // +operands[0]
    kBinary,       // operands[0] op operands[1]
    kCompare,      // operands[0] ops[0] operands[1] ops[1] operands[2] …, Python's chaining
    kConcat,       // operands joined by ~
    kAnd,          // operands[0] and operands[1]
    kOr,           // operands[0] or operands[1]
    kConditional,  // operands[1] if operands[0] else operands[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;              // a name, attribute, filter, test or operator
  std::vector<std::string> ops;  // kCompare's operators
  std::vector<ExprPtr> operands;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // conditions[i] → bodies[i]; a trailing body without a condition is the else
    kFor,     // for targets in expr [if filter] … [else …]
    kSet,     // targets = expr, or targets = the rendered body (block set, optional filter)
    kMacro,   // name(params = defaults) body
    kFilter,  // the body rendered, then passed through expr's filter chain
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;                      // output, for's iterable, set's value, filter chain
  ExprPtr filter;                    // for's `if`, block set's filter
  std::vector<std::string> targets;  // for/set names; "ns.attr" sets a namespace attribute
  std::vector<ExprPtr> conditions;   // if
  std::vector<Body> bodies;          // if branches; for: body, else; set/macro/filter: body
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
};

// Parses template source as transformers configures Jinja2 (trim_blocks, lstrip_blocks, the
// loopcontrols extension, its {% generation %} tag). Throws TemplateError.
Body ParseTemplate(std::string_view source);

}  // namespace sy::jinja
