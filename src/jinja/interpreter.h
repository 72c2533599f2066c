// The tree walker behind Template::Render, and the hooks builtins.cc (filters, tests, methods,
// globals) uses. Internal to src/jinja.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "jinja/syntax.h"
#include "jinja/template.h"
#include "jinja/value.h"

namespace sy::jinja {

class Interpreter;

using FilterFunction = Value (*)(Interpreter&, const Value& operand, CallArguments& args);
using TestFunction = bool (*)(Interpreter&, const Value& operand, CallArguments& args);

// Jinja2's builtin filters and tests that chat templates use, by name; null when unknown.
FilterFunction FindFilter(std::string_view name);
TestFunction FindTest(std::string_view name);
// `receiver.name` for a str, dict or list method (Python's, the non-mutating ones the sandbox
// allows), or an undefined value when the type has no such method.
Value FindMethod(Interpreter& in, const Value& receiver, const std::string& name);
// range, namespace, dict, raise_exception, strftime_now.
void AddGlobals(Interpreter& in, std::unordered_map<std::string, Value>* globals);

// Thrown by raise_exception: the template's own message, passed on unchanged.
class RaisedError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

// A call's arguments matched to a signature, Python's way: positional first, then by keyword.
// Absent ones are undefined.
std::vector<Value> BindArguments(Interpreter& in, const char* function, CallArguments& args,
                                 std::initializer_list<const char*> names);

// Python's printf-style formatting (`"%s" % x`, the format filter): %s, %r, %d, %i and %%.
std::string PercentFormat(Interpreter& in, const std::string& format,
                          const std::vector<Value>& values);

class Interpreter {
 public:
  Interpreter(const Limits& limits, const Value& context);
  std::string Run(const Body& body);

  [[noreturn]] void Fail(const std::string& message) const;
  const Limits& limits() const { return limits_; }
  int line() const { return line_; }
  // One unit of work: fails when the template has run too long.
  void Step();
  // Fails when a string or list being built would pass the output limit.
  void CheckSize(size_t bytes) const;

  Value Attribute(const Value& object, const std::string& name);  // object.name
  Value Item(const Value& object, const Value& key);              // object[key]
  std::vector<Value> Iterate(const Value& value);
  Value CallFilter(const std::string& name, const Value& operand, CallArguments& args);
  bool CallTest(const std::string& name, const Value& operand, CallArguments& args);
  Value Call(const Value& callee, CallArguments& args);
  // Python's `a op b` for ==, !=, <, <=, >, >=, in, not in (the comparison tests use it too).
  bool EvalCompare(const std::string& op, const Value& a, const Value& b);

 private:
  using Frame = std::unordered_map<std::string, Value>;
  enum class Flow { kNormal, kBreak, kContinue };

  Flow Exec(const Body& body, std::string* out);
  Flow ExecNode(const Node& node, std::string* out);
  void ExecFor(const Node& node, std::string* out);
  void Assign(const std::vector<std::string>& targets, const Value& value);
  void Append(std::string* out, std::string_view text) const;
  Value Eval(const Expr& expr);
  Value EvalBinary(const std::string& op, const Value& a, const Value& b);
  Value EvalFilter(const Expr& expr);
  // A call's, filter's or test's arguments: operands[1..] and the keywords.
  CallArguments EvalArguments(const Expr& expr);
  Value Lookup(const std::string& name) const;
  Value MakeMacro(const Node& node);

  const Limits limits_;
  int64_t steps_ = 0;
  int line_ = 0;
  int call_depth_ = 0;
  // frames_[0] the globals, [1] the render context, [2] the template's top level; above them
  // for-loop iterations and macro calls. Lookups search from the top down to floor_, then the
  // three root frames: a macro sees its arguments and the top level, not its caller's loops.
  std::vector<Frame> frames_;
  size_t floor_ = 3;
  const Value* block_input_ = nullptr;  // the rendered body a {% filter %} block passes on
};

}  // namespace sy::jinja
