// The values a Jinja chat template computes with, and the Python behaviour templates rely on:
// str() and repr() as Python writes them, json.dumps as transformers' `tojson` calls it, truth,
// equality and ordering. Chat templates are written against Jinja2 running on Python, so a prompt
// is only right when these match Python byte for byte ("{{ 1.0 }}" is "1.0", a dict prints with
// single quotes, `None` prints as "None").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace sy::jinja {

// Thrown inside the parser, the interpreter and the value operations, caught at Template's
// boundary (and by callers of Value::FromJson) and turned into a Status: a template error unwinds
// through deep recursion, and every frame would otherwise have to test and forward it. Line 0:
// where the interpreter is.
class TemplateError : public std::runtime_error {
 public:
  TemplateError(int line, const std::string& message) : std::runtime_error(message), line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

// Values nest at most this deep (Python's repr and == give up near 1,000): deeper JSON, or a
// value a template made to contain itself, is an error rather than a stack overflow.
inline constexpr int kMaxValueNesting = 512;

class Value;
using List = std::vector<Value>;

// A Python dict: insertion-ordered, keyed by values (strings in practice).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  void Set(Value key, Value value);
};

struct CallArguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A builtin, a bound method or a macro. Errors are thrown as TemplateError (interpreter.h).
using Function = std::function<Value(CallArguments&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value Undefined(std::string why);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeList(List items, bool tuple = false);
  // What Jinja's map, select, reject, selectattr, rejectattr, unique, batch and items return in
  // Python: a generator. It iterates like a list but has no length, no index and no JSON form,
  // prints as an object and is always true; templates that forget `| list` fail as in Python.
  static Value MakeGenerator(List items);
  static Value MakeDict(std::shared_ptr<Dict> dict = nullptr);
  // jinja's namespace(): a dict whose attributes `{% set ns.x = … %}` may assign.
  static Value Namespace(std::shared_ptr<Dict> dict);
  static Value MakeFunction(std::string name, Function function);
  // JSON (the request's messages and tools) as Python would see it after json.loads. Throws
  // TemplateError past kMaxValueNesting.
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_generator() const { return kind_ == Kind::kList && generator_; }
  bool is_namespace() const { return kind_ == Kind::kDict && namespace_; }

  bool boolean() const { return boolean_; }
  int64_t integer() const { return integer_; }
  double number() const { return kind_ == Kind::kFloat ? real_ : static_cast<double>(integer_); }
  const std::string& text() const { return text_; }
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_dict() const { return *dict_; }
  const Function& function() const { return *function_; }
  // What an undefined value stands for ("'x' is undefined"), or a function's name.
  const std::string& label() const { return text_; }

  bool Truthy() const;
  // Python's str() and repr().
  std::string Str() const;
  std::string Repr() const;
  // The Python type name as error messages write it ("int", "dict object" in jinja's words).
  std::string TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool boolean_ = false;
  bool tuple_ = false;
  bool generator_ = false;
  bool namespace_ = false;
  int64_t integer_ = 0;
  double real_ = 0;
  std::string text_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> function_;
};

// Python's ==, and the ordering of <, sorted() and max(): numbers with numbers, strings with
// strings, sequences element by element. Ordering values Python cannot order is an error thrown
// by the caller; `Comparable` says whether they can be. These, Repr and Str throw TemplateError
// past kMaxValueNesting.
bool Equal(const Value& a, const Value& b);
bool Comparable(const Value& a, const Value& b);
int Compare(const Value& a, const Value& b);  // <0, 0, >0; only where Comparable

// Python's repr() of a float ("1.0", "1e+16", "0.30000000000000004", "inf", "nan").
std::string FloatRepr(double f);

struct JsonStyle {
  int indent = -1;  // none: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python's json.dumps(value, ensure_ascii=False, ...), as transformers' tojson filter calls it.
// False where the value has no JSON form (a function, an undefined): `why` says what.
bool ToJson(const Value& value, const JsonStyle& style, std::string* out, std::string* why);

// Python string helpers over UTF-8: code points, whitespace as str.split() and str.strip() see it.
std::vector<uint32_t> CodePoints(std::string_view text);
std::string FromCodePoints(const std::vector<uint32_t>& code_points, size_t begin, size_t end);
bool IsPythonSpace(uint32_t code_point);

}  // namespace sy::jinja
