#include "jinja/interpreter.h"

#include "base/utf8.h"
#include "jinja/python_str.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace sy::jinja {

struct Template::Parsed {
  Body body;
};

namespace {

// Jinja2 reports an unknown filter or test when it compiles the template; so does Parse.
void CheckNames(const Expr* expr) {
  if (!expr) return;
  if (expr->kind == Expr::Kind::kFilter && !FindFilter(expr->name))
    throw TemplateError(expr->line, fmt::format("No filter named '{}'.", expr->name));
  if (expr->kind == Expr::Kind::kTest && !FindTest(expr->name))
    throw TemplateError(expr->line, fmt::format("No test named '{}'.", expr->name));
  for (const auto& operand : expr->operands)
    CheckNames(operand.get());
  for (const auto& [name, value] : expr->keywords)
    CheckNames(value.get());
}

void CheckNames(const Body& body) {
  for (const auto& node : body) {
    CheckNames(node->expr.get());
    CheckNames(node->filter.get());
    for (const auto& condition : node->conditions)
      CheckNames(condition.get());
    for (const auto& [name, value] : node->params)
      CheckNames(value.get());
    for (const auto& inner : node->bodies)
      CheckNames(inner);
  }
}

}  // namespace

Result<Template> Template::Parse(std::string_view source) {
  try {
    auto parsed = std::make_shared<Parsed>();
    parsed->body = ParseTemplate(source);
    CheckNames(parsed->body);
    return Template(std::move(parsed));
  } catch (const TemplateError& error) {
    return Status::Errorf("line {}: {}", error.line(), error.what());
  }
}

namespace {

bool IteratesOverIn(const Body& body, std::string_view attribute) {
  for (const auto& node : body) {
    if (node->kind == Node::Kind::kFor && node->expr) {
      const Expr& e = *node->expr;
      if (e.kind == Expr::Kind::kGetAttr && e.name == attribute) return true;
      if (e.kind == Expr::Kind::kGetItem && e.operands[1]->kind == Expr::Kind::kLiteral &&
          e.operands[1]->value.is_string() && e.operands[1]->value.text() == attribute)
        return true;
    }
    for (const auto& inner : node->bodies)
      if (IteratesOverIn(inner, attribute)) return true;
  }
  return false;
}

}  // namespace

bool Template::IteratesOver(std::string_view attribute) const {
  return IteratesOverIn(parsed_->body, attribute);
}

Result<std::string> Template::Render(const Value& context, const Limits& limits) const {
  Interpreter interpreter(limits, context);
  try {
    return interpreter.Run(parsed_->body);
  } catch (const RaisedError& error) {
    return Status::Error(error.what());
  } catch (const TemplateError& error) {
    return Status::Errorf("line {}: {}", error.line() ? error.line() : interpreter.line(),
                          error.what());
  } catch (const std::bad_alloc&) {
    return Status::Error("the template ran out of memory");
  }
}

Interpreter::Interpreter(const Limits& limits, const Value& context) : limits_(limits) {
  frames_.resize(3);
  AddGlobals(*this, &frames_[0]);
  if (context.is_dict())
    for (const auto& [key, value] : context.dict().items)
      if (key.is_string()) frames_[1][key.text()] = value;
}

std::string Interpreter::Run(const Body& body) {
  std::string out;
  Exec(body, &out);
  return out;
}

void Interpreter::Fail(const std::string& message) const {
  throw TemplateError(line_, message);
}

void Interpreter::Step() {
  if (++steps_ > limits_.max_steps)
    Fail(fmt::format("the template ran more than {} steps", limits_.max_steps));
}

void Interpreter::CheckSize(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    Fail(fmt::format("the template built more than {} bytes", limits_.max_output_bytes));
}

void Interpreter::Append(std::string* out, std::string_view text) const {
  CheckSize(out->size() + text.size());
  out->append(text);
}

Interpreter::Flow Interpreter::Exec(const Body& body, std::string* out) {
  for (const auto& node : body) {
    const Flow flow = ExecNode(*node, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::ExecNode(const Node& node, std::string* out) {
  Step();
  line_ = node.line;
  switch (node.kind) {
    case Node::Kind::kText:
      Append(out, node.text);
      break;
    case Node::Kind::kOutput:
      Append(out, Eval(*node.expr).Str());
      break;
    case Node::Kind::kIf:
      for (size_t i = 0; i < node.bodies.size(); ++i) {
        if (i < node.conditions.size() && !Eval(*node.conditions[i]).Truthy()) continue;
        return Exec(node.bodies[i], out);
      }
      break;
    case Node::Kind::kFor:
      ExecFor(node, out);
      break;
    case Node::Kind::kSet:
      if (node.expr) {
        Assign(node.targets, Eval(*node.expr));
      } else {
        std::string text;
        Exec(node.bodies[0], &text);
        Value value = Value::String(std::move(text));
        if (node.filter) {
          const Value* saved = block_input_;
          block_input_ = &value;
          Value filtered = EvalFilter(*node.filter);
          block_input_ = saved;
          value = std::move(filtered);
        }
        Assign(node.targets, value);
      }
      break;
    case Node::Kind::kMacro:
      frames_.back()[node.text] = MakeMacro(node);
      break;
    case Node::Kind::kFilter: {
      std::string text;
      Exec(node.bodies[0], &text);
      Value value = Value::String(std::move(text));
      const Value* saved = block_input_;
      block_input_ = &value;
      Value filtered = EvalFilter(*node.expr);
      block_input_ = saved;
      Append(out, filtered.Str());
      break;
    }
    case Node::Kind::kBreak:
      return Flow::kBreak;
    case Node::Kind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

void Interpreter::ExecFor(const Node& node, std::string* out) {
  std::vector<Value> items = Iterate(Eval(*node.expr));
  if (node.filter) {
    // `for x in xs if cond`: the condition sees each item; loop.* counts the kept ones.
    std::vector<Value> kept;
    for (Value& item : items) {
      Step();
      frames_.emplace_back();
      Assign(node.targets, item);
      const bool keep = Eval(*node.filter).Truthy();
      frames_.pop_back();
      if (keep) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (node.bodies.size() > 1) Exec(node.bodies[1], out);
    return;
  }
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    Step();
    // A fresh frame per iteration: Jinja's `set` inside a loop does not outlive the iteration.
    frames_.emplace_back();
    auto loop = std::make_shared<Dict>();
    loop->items.reserve(12);
    loop->Set(Value::String("index"), Value::Int(i + 1));
    loop->Set(Value::String("index0"), Value::Int(i));
    loop->Set(Value::String("revindex"), Value::Int(length - i));
    loop->Set(Value::String("revindex0"), Value::Int(length - i - 1));
    loop->Set(Value::String("first"), Value::Bool(i == 0));
    loop->Set(Value::String("last"), Value::Bool(i == length - 1));
    loop->Set(Value::String("length"), Value::Int(length));
    loop->Set(Value::String("depth"), Value::Int(1));
    loop->Set(Value::String("depth0"), Value::Int(0));
    loop->Set(Value::String("previtem"),
              i > 0 ? items[i - 1] : Value::Undefined("there is no previous item"));
    loop->Set(Value::String("nextitem"),
              i + 1 < length ? items[i + 1] : Value::Undefined("there is no next item"));
    loop->Set(Value::String("cycle"),
              Value::MakeFunction("loop.cycle", [i, this](CallArguments& args) {
                if (args.positional.empty()) Fail("no items for cycling given");
                return args.positional[i % args.positional.size()];
              }));
    frames_.back()["loop"] = Value::MakeDict(std::move(loop));
    Assign(node.targets, items[i]);
    const Flow flow = Exec(node.bodies[0], out);
    frames_.pop_back();
    if (flow == Flow::kBreak) break;
  }
}

void Interpreter::Assign(const std::vector<std::string>& targets, const Value& value) {
  auto assign_one = [&](const std::string& target, const Value& v) {
    const size_t dot = target.find('.');
    if (dot == std::string::npos) {
      frames_.back()[target] = v;
      return;
    }
    const Value object = Lookup(target.substr(0, dot));
    if (!object.is_namespace())
      Fail(fmt::format("cannot assign attribute on non-namespace object '{}'",
                       target.substr(0, dot)));
    object.mutable_dict().Set(Value::String(target.substr(dot + 1)), v);
  };
  if (targets.size() == 1) return assign_one(targets[0], value);
  std::vector<Value> items = Iterate(value);
  if (items.size() != targets.size())
    Fail(fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
  for (size_t i = 0; i < targets.size(); ++i)
    assign_one(targets[i], items[i]);
}

Value Interpreter::Lookup(const std::string& name) const {
  for (size_t i = frames_.size(); i > floor_; --i) {
    auto found = frames_[i - 1].find(name);
    if (found != frames_[i - 1].end()) return found->second;
  }
  for (size_t i = 3; i > 0; --i) {
    auto found = frames_[i - 1].find(name);
    if (found != frames_[i - 1].end()) return found->second;
  }
  return Value::Undefined(fmt::format("'{}' is undefined", name));
}

Value Interpreter::MakeMacro(const Node& node) {
  const Node* macro = &node;
  return Value::MakeFunction(node.text, [this, macro](CallArguments& args) {
    if (args.positional.size() > macro->params.size())
      Fail(fmt::format("macro '{}' takes not more than {} argument(s)", macro->text,
                       macro->params.size()));
    Frame frame;
    for (size_t i = 0; i < macro->params.size(); ++i) {
      const auto& [name, default_value] = macro->params[i];
      if (i < args.positional.size()) {
        frame[name] = args.positional[i];
        continue;
      }
      bool found = false;
      for (const auto& [key, value] : args.keyword)
        if (key == name) {
          frame[name] = value;
          found = true;
        }
      if (!found)
        frame[name] = default_value ? Eval(*default_value)
                                    : Value::Undefined(fmt::format("'{}' is undefined", name));
    }
    for (const auto& [key, value] : args.keyword) {
      bool known = false;
      for (const auto& param : macro->params)
        known = known || param.first == key;
      if (!known) Fail(fmt::format("macro '{}' takes no keyword argument '{}'", macro->text, key));
    }
    if (++call_depth_ > limits_.max_call_depth)
      Fail(fmt::format("macro calls nest deeper than {}", limits_.max_call_depth));
    const size_t saved_floor = floor_;
    const int saved_line = line_;
    floor_ = frames_.size();
    frames_.push_back(std::move(frame));
    std::string out;
    Exec(macro->bodies[0], &out);
    frames_.pop_back();
    floor_ = saved_floor;
    line_ = saved_line;
    --call_depth_;
    return Value::String(std::move(out));
  });
}

std::vector<Value> Interpreter::Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return value.list();
    case Value::Kind::kDict: {
      if (value.is_namespace()) break;
      std::vector<Value> keys;
      for (const auto& [key, item] : value.dict().items)
        keys.push_back(key);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      const std::vector<uint32_t> cps = CodePoints(value.text());
      for (size_t i = 0; i < cps.size(); ++i)
        chars.push_back(Value::String(FromCodePoints(cps, i, i + 1)));
      return chars;
    }
    default:
      break;
  }
  Fail(fmt::format("'{}' object is not iterable", value.TypeName()));
}

Value Interpreter::Attribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) Fail(object.label());
  if (object.is_dict()) {
    if (object.is_namespace()) {
      if (const Value* found = object.dict().Find(name)) return *found;
      return Value::Undefined(fmt::format("'Namespace' object has no attribute '{}'", name));
    }
    // Jinja tries getattr first: a dict's methods shadow keys of the same name.
    Value method = FindMethod(*this, object, name);
    if (!method.is_undefined()) return method;
    if (const Value* found = object.dict().Find(name)) return *found;
    return Value::Undefined(fmt::format("'dict object' has no attribute '{}'", name));
  }
  Value method = FindMethod(*this, object, name);
  if (!method.is_undefined()) return method;
  return Value::Undefined(
      fmt::format("'{} object' has no attribute '{}'", object.TypeName(), name));
}

Value Interpreter::Item(const Value& object, const Value& key) {
  if (object.is_undefined()) Fail(object.label());
  if (object.is_dict() && !object.is_namespace()) {
    if (const Value* found = object.dict().Find(key)) return *found;
    if (key.is_string()) {
      Value method = FindMethod(*this, object, key.text());
      if (!method.is_undefined()) return method;
    }
    return Value::Undefined(fmt::format("'dict object' has no attribute {}", key.Repr()));
  }
  if (object.is_generator()) Fail("'generator' object is not subscriptable");
  if (object.is_list() || object.is_string()) {
    if (!IsIntLike(key)) {
      if (key.is_string()) return Attribute(object, key.text());
      Fail(fmt::format("{} indices must be integers, not {}", object.TypeName(), key.TypeName()));
    }
    int64_t index = key.integer();
    if (object.is_list()) {
      const int64_t n = static_cast<int64_t>(object.list().size());
      if (index < 0) index += n;
      if (index < 0 || index >= n)
        return Value::Undefined(
            fmt::format("'{} object' has no element {}", object.TypeName(), key.integer()));
      return object.list()[index];
    }
    const std::vector<uint32_t> cps = CodePoints(object.text());
    const int64_t n = static_cast<int64_t>(cps.size());
    if (index < 0) index += n;
    if (index < 0 || index >= n)
      return Value::Undefined(fmt::format("'str object' has no element {}", key.integer()));
    return Value::String(FromCodePoints(cps, index, index + 1));
  }
  if (object.is_namespace() && key.is_string()) return Attribute(object, key.text());
  return Value::Undefined(
      fmt::format("'{} object' has no attribute {}", object.TypeName(), key.Repr()));
}

Value Interpreter::Call(const Value& callee, CallArguments& args) {
  if (callee.is_undefined()) Fail(callee.label());
  if (callee.kind() != Value::Kind::kFunction)
    Fail(fmt::format("'{}' object is not callable", callee.TypeName()));
  return callee.function()(args);
}

Value Interpreter::CallFilter(const std::string& name, const Value& operand, CallArguments& args) {
  FilterFunction filter = FindFilter(name);
  if (!filter) Fail(fmt::format("No filter named '{}'.", name));
  return filter(*this, operand, args);
}

bool Interpreter::CallTest(const std::string& name, const Value& operand, CallArguments& args) {
  TestFunction test = FindTest(name);
  if (!test) Fail(fmt::format("No test named '{}'.", name));
  return test(*this, operand, args);
}

CallArguments Interpreter::EvalArguments(const Expr& expr) {
  CallArguments args;
  for (size_t i = 1; i < expr.operands.size(); ++i)
    args.positional.push_back(Eval(*expr.operands[i]));
  for (const auto& [key, value] : expr.keywords)
    args.keyword.emplace_back(key, Eval(*value));
  line_ = expr.line;
  return args;
}

Value Interpreter::EvalFilter(const Expr& expr) {
  Value operand =
      expr.operands[0] ? Eval(*expr.operands[0]) : (block_input_ ? *block_input_ : Value());
  CallArguments args = EvalArguments(expr);
  return CallFilter(expr.name, operand, args);
}

namespace {

int64_t CheckedInt(Interpreter& in, __int128 v) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min())
    in.Fail("integer overflow (switchyard's template integers are 64-bit)");
  return static_cast<int64_t>(v);
}

std::string Repeat(Interpreter& in, const std::string& text, int64_t times) {
  if (times <= 0) return "";
  in.CheckSize(text.size() * static_cast<size_t>(std::min<int64_t>(times, INT32_MAX)));
  std::string out;
  out.reserve(text.size() * times);
  for (int64_t i = 0; i < times; ++i)
    out += text;
  return out;
}

}  // namespace

Value Interpreter::EvalBinary(const std::string& op, const Value& a, const Value& b) {
  auto numeric = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; };
  auto unsupported = [&]() -> Value {
    Fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.TypeName(),
                     b.TypeName()));
  };
  if (a.is_undefined()) Fail(a.label());
  if (b.is_undefined()) Fail(b.label());
  const bool both_int = IsIntLike(a) && IsIntLike(b);
  if (op == "+") {
    if (both_int) return Value::Int(CheckedInt(*this, (__int128)a.integer() + b.integer()));
    if (numeric(a) && numeric(b)) return Value::Float(a.number() + b.number());
    if (a.is_string() && b.is_string()) {
      CheckSize(a.text().size() + b.text().size());
      return Value::String(a.text() + b.text());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() &&
        !b.is_generator()) {
      List items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      CheckSize(items.size());
      return Value::MakeList(std::move(items), a.is_tuple());
    }
    if (a.is_string())
      Fail(fmt::format("can only concatenate str (not \"{}\") to str", b.TypeName()));
    return unsupported();
  }
  if (op == "-") {
    if (both_int) return Value::Int(CheckedInt(*this, (__int128)a.integer() - b.integer()));
    if (numeric(a) && numeric(b)) return Value::Float(a.number() - b.number());
    return unsupported();
  }
  if (op == "*") {
    if (both_int) return Value::Int(CheckedInt(*this, (__int128)a.integer() * b.integer()));
    if (numeric(a) && numeric(b)) return Value::Float(a.number() * b.number());
    if (a.is_string() && IsIntLike(b)) return Value::String(Repeat(*this, a.text(), b.integer()));
    if (b.is_string() && IsIntLike(a)) return Value::String(Repeat(*this, b.text(), a.integer()));
    if (a.is_list() && !a.is_generator() && IsIntLike(b)) {
      List items;
      for (int64_t i = 0; i < b.integer(); ++i) {
        CheckSize(items.size() + a.list().size());
        items.insert(items.end(), a.list().begin(), a.list().end());
      }
      return Value::MakeList(std::move(items), a.is_tuple());
    }
    return unsupported();
  }
  if (op == "/") {
    if (!numeric(a) || !numeric(b)) return unsupported();
    if (b.number() == 0) Fail("division by zero");
    return Value::Float(a.number() / b.number());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string())
      return Value::String(
          PercentFormat(*this, a.text(), b.is_tuple() ? b.list() : std::vector<Value>{b}));
    if (!numeric(a) || !numeric(b)) return unsupported();
    if (b.number() == 0) Fail(op == "%" ? "modulo by zero" : "integer division by zero");
    if (both_int) {
      // Python rounds the quotient toward minus infinity; the remainder takes the divisor's sign.
      int64_t q = a.integer() / b.integer();
      int64_t r = a.integer() % b.integer();
      if (r != 0 && ((r < 0) != (b.integer() < 0))) {
        --q;
        r += b.integer();
      }
      if (a.integer() == std::numeric_limits<int64_t>::min() && b.integer() == -1)
        Fail("integer overflow (switchyard's template integers are 64-bit)");
      return Value::Int(op == "//" ? q : r);
    }
    const double x = a.number(), y = b.number();
    if (op == "//") return Value::Float(std::floor(x / y));
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::Float(r);
  }
  if (op == "**") {
    if (both_int && b.integer() >= 0) {
      __int128 result = 1;
      for (int64_t i = 0; i < b.integer(); ++i) {
        result *= a.integer();
        CheckedInt(*this, result);
        if (result == 0 || result == 1) break;
        if (result == -1) {
          result = (b.integer() % 2 == 0) ? 1 : -1;
          break;
        }
      }
      return Value::Int(static_cast<int64_t>(result));
    }
    if (numeric(a) && numeric(b)) return Value::Float(std::pow(a.number(), b.number()));
    return unsupported();
  }
  Fail(fmt::format("unknown operator {}", op));
}

bool Interpreter::EvalCompare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Equal(a, b);
  if (op == "!=") return !Equal(a, b);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string())
        Fail(fmt::format("'in <string>' requires string as left operand, not {}", a.TypeName()));
      found = b.text().find(a.text()) != std::string::npos;
    } else if (b.is_list()) {
      for (const Value& item : b.list())
        found = found || Equal(a, item);
    } else if (b.is_dict() && !b.is_namespace()) {
      found = b.dict().Find(a) != nullptr;
    } else if (!b.is_undefined()) {
      Fail(fmt::format("argument of type '{}' is not iterable", b.TypeName()));
    }
    return op == "in" ? found : !found;
  }
  if (a.is_undefined()) Fail(a.label());
  if (b.is_undefined()) Fail(b.label());
  RequireOrderable(*this, op, a, b);
  const int c = Compare(a, b);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

Value Interpreter::Eval(const Expr& expr) {
  Step();
  line_ = expr.line;
  switch (expr.kind) {
    case Expr::Kind::kLiteral:
      return expr.value;
    case Expr::Kind::kName:
      return Lookup(expr.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      List items;
      for (const auto& operand : expr.operands)
        items.push_back(Eval(*operand));
      return Value::MakeList(std::move(items), expr.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      auto dict = std::make_shared<Dict>();
      for (size_t i = 0; i + 1 < expr.operands.size(); i += 2) {
        Value key = Eval(*expr.operands[i]);
        dict->Set(std::move(key), Eval(*expr.operands[i + 1]));
      }
      return Value::MakeDict(std::move(dict));
    }
    case Expr::Kind::kGetAttr:
      return Attribute(Eval(*expr.operands[0]), expr.name);
    case Expr::Kind::kGetItem: {
      Value object = Eval(*expr.operands[0]);
      return Item(object, Eval(*expr.operands[1]));
    }
    case Expr::Kind::kSlice: {
      Value object = Eval(*expr.operands[0]);
      if (object.is_undefined()) Fail(object.label());
      auto bound = [&](const ExprPtr& part) -> std::optional<int64_t> {
        if (!part) return std::nullopt;
        Value v = Eval(*part);
        if (v.is_none()) return std::nullopt;
        if (!IsIntLike(v)) Fail("slice indices must be integers or None");
        return v.integer();
      };
      std::optional<int64_t> start = bound(expr.operands[1]), stop = bound(expr.operands[2]),
                             step_value = bound(expr.operands[3]);
      const int64_t step = step_value.value_or(1);
      if (step == 0) Fail("slice step cannot be zero");
      std::vector<uint32_t> cps;
      int64_t n;
      if (object.is_string()) {
        cps = CodePoints(object.text());
        n = static_cast<int64_t>(cps.size());
      } else if (object.is_list() && !object.is_generator()) {
        n = static_cast<int64_t>(object.list().size());
      } else {
        Fail(fmt::format("'{}' object is not subscriptable", object.TypeName()));
      }
      // Python's PySlice_AdjustIndices.
      auto adjust = [&](std::optional<int64_t> v, int64_t if_none) {
        if (!v) return if_none;
        int64_t x = *v;
        if (x < 0) {
          x += n;
          if (x < 0) x = step < 0 ? -1 : 0;
        } else if (x >= n) {
          x = step < 0 ? n - 1 : n;
        }
        return x;
      };
      const int64_t lo = adjust(start, step < 0 ? n - 1 : 0);
      const int64_t hi = adjust(stop, step < 0 ? -1 : n);
      std::vector<int64_t> picks;
      for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
        picks.push_back(i);
      if (object.is_string()) {
        std::string out;
        for (int64_t i : picks)
          AppendUtf8(cps[i], &out);
        return Value::String(std::move(out));
      }
      List items;
      for (int64_t i : picks)
        items.push_back(object.list()[i]);
      return Value::MakeList(std::move(items), object.is_tuple());
    }
    case Expr::Kind::kCall: {
      Value callee = Eval(*expr.operands[0]);
      CallArguments args = EvalArguments(expr);
      return Call(callee, args);
    }
    case Expr::Kind::kFilter:
      return EvalFilter(expr);
    case Expr::Kind::kTest: {
      Value operand = Eval(*expr.operands[0]);
      CallArguments args = EvalArguments(expr);
      return Value::Bool(CallTest(expr.name, operand, args));
    }
    case Expr::Kind::kNot:
      return Value::Bool(!Eval(*expr.operands[0]).Truthy());
    case Expr::Kind::kNegate:
    case Expr::Kind::kPlus: {
      Value v = Eval(*expr.operands[0]);
      if (v.is_undefined()) Fail(v.label());
      const bool negate = expr.kind == Expr::Kind::kNegate;
      if (IsIntLike(v))
        return Value::Int(negate ? CheckedInt(*this, -(__int128)v.integer()) : v.integer());
      if (v.kind() == Value::Kind::kFloat) return Value::Float(negate ? -v.number() : v.number());
      Fail(fmt::format("bad operand type for unary {}: '{}'", negate ? '-' : '+', v.TypeName()));
    }
    case Expr::Kind::kBinary: {
      Value a = Eval(*expr.operands[0]);
      Value b = Eval(*expr.operands[1]);
      line_ = expr.line;
      return EvalBinary(expr.name, a, b);
    }
    case Expr::Kind::kCompare: {
      Value left = Eval(*expr.operands[0]);
      for (size_t i = 0; i < expr.ops.size(); ++i) {
        Value right = Eval(*expr.operands[i + 1]);
        line_ = expr.line;
        if (!EvalCompare(expr.ops[i], left, right)) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case Expr::Kind::kConcat: {
      std::string out;
      for (const auto& operand : expr.operands) {
        std::string part = Eval(*operand).Str();
        CheckSize(out.size() + part.size());
        out += part;
      }
      return Value::String(std::move(out));
    }
    case Expr::Kind::kAnd: {
      Value left = Eval(*expr.operands[0]);
      return left.Truthy() ? Eval(*expr.operands[1]) : left;
    }
    case Expr::Kind::kOr: {
      Value left = Eval(*expr.operands[0]);
      return left.Truthy() ? left : Eval(*expr.operands[1]);
    }
    case Expr::Kind::kConditional:
      if (Eval(*expr.operands[0]).Truthy()) return Eval(*expr.operands[1]);
      if (expr.operands[2]) return Eval(*expr.operands[2]);
      return Value::Undefined("the conditional expression has no else branch");
  }
  Fail("unknown expression");
}

}  // namespace sy::jinja
