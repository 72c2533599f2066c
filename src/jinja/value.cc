#include "jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "base/utf8.h"

namespace sy::jinja {
namespace {

// Nesting of the recursive value operations on this thread.
thread_local int nesting = 0;

struct NestingGuard {
  NestingGuard() {
    if (++nesting > kMaxValueNesting) {
      --nesting;
      throw TemplateError(
          0, fmt::format("values nest deeper than {} (or contain themselves)", kMaxValueNesting));
    }
  }
  ~NestingGuard() { --nesting; }
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;
};

}  // namespace

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (Equal(k, key)) return &v;
  return nullptr;
}

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.text() == key) return &v;
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& [k, v] : items)
    if (Equal(k, key)) {
      v = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::Undefined(std::string why) {
  Value v;
  v.text_ = std::move(why);
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.boolean_ = b;
  v.integer_ = b ? 1 : 0;  // Python's bool is an int: True + 1 == 2
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.integer_ = i;
  return v;
}

Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.real_ = f;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.text_ = std::move(s);
  return v;
}

Value Value::MakeList(List items, bool tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::MakeGenerator(List items) {
  Value v = MakeList(std::move(items));
  v.generator_ = true;
  return v;
}

Value Value::MakeDict(std::shared_ptr<Dict> dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = dict ? std::move(dict) : std::make_shared<Dict>();
  return v;
}

Value Value::Namespace(std::shared_ptr<Dict> dict) {
  Value v = MakeDict(std::move(dict));
  v.namespace_ = true;
  return v;
}

Value Value::MakeFunction(std::string name, Function function) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.text_ = std::move(name);
  v.function_ = std::make_shared<Function>(std::move(function));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  NestingGuard guard;
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      // Python's ints are unbounded; past int64 the value is kept as the nearest float.
      if (u > static_cast<uint64_t>(INT64_MAX)) return Float(static_cast<double>(u));
      return Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json)
        items.push_back(FromJson(item));
      return MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto dict = std::make_shared<Dict>();
      dict->items.reserve(json.size());
      for (const auto& [key, item] : json.items())
        dict->items.emplace_back(String(key), FromJson(item));
      return MakeDict(std::move(dict));
    }
    default:
      return None();  // binary and discarded values do not come from parsed JSON
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return boolean_;
    case Kind::kInt:
      return integer_ != 0;
    case Kind::kFloat:
      return real_ != 0;
    case Kind::kString:
      return !text_.empty();
    case Kind::kList:
      return generator_ || !list_->empty();
    case Kind::kDict:
      return namespace_ || !dict_->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  // The shortest digits that round-trip (what Python's repr picks), then Python's layout: fixed
  // notation when the decimal point falls within -4 < point <= 16, else d.ddde±XX.
  char buffer[64];
  auto [end, error] =
      std::to_chars(buffer, buffer + sizeof buffer, f, std::chars_format::scientific);
  std::string_view sci(buffer, end - buffer);
  std::string out;
  size_t pos = 0;
  if (sci[0] == '-') {
    out += '-';
    pos = 1;
  }
  const size_t e_at = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e_at; ++i)
    if (sci[i] != '.') digits += sci[i];
  int exponent = 0;
  std::from_chars(sci.data() + e_at + (sci[e_at + 1] == '+' ? 2 : 1), sci.data() + sci.size(),
                  exponent);
  const int point = exponent + 1;  // digits before the decimal point
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out += "0." + std::string(-point, '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out += digits + std::string(point - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, point) + "." + digits.substr(point);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

std::vector<uint32_t> CodePoints(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp;
    // Strings reach templates from JSON and from template source, both checked UTF-8; a stray
    // byte is kept as itself rather than looping.
    if (!DecodeUtf8(text, &pos, &cp)) cp = static_cast<uint8_t>(text[pos++]);
    out.push_back(cp);
  }
  return out;
}

std::string FromCodePoints(const std::vector<uint32_t>& code_points, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i)
    AppendUtf8(code_points[i], &out);
  return out;
}

bool IsPythonSpace(uint32_t c) {
  // str.isspace(): Unicode White_Space plus the ASCII separators U+001C..U+001F.
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

namespace {

// str.isprintable() for the characters chat text meets: controls, format characters and the
// separators other than the space are written as escapes. Unassigned code points (which Python
// also escapes) are kept: that needs Unicode's tables and never occurs in a prompt that matters.
bool IsPrintable(uint32_t c) {
  if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF) return false;
  if ((c >= 0xFFF9 && c <= 0xFFFB) || (c >= 0xE000 && c <= 0xF8FF) || c >= 0xF0000) return false;
  return true;
}

std::string StringRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t c : CodePoints(s)) {
    if (c == static_cast<uint32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (IsPrintable(c)) {
      AppendUtf8(c, &out);
    } else if (c <= 0xFF) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c <= 0xFFFF) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += fmt::format("\\U{:08x}", c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return text_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  NestingGuard guard;
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return boolean_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(integer_);
    case Kind::kFloat:
      return FloatRepr(real_);
    case Kind::kString:
      return StringRepr(text_);
    case Kind::kList: {
      if (generator_) return "<generator object>";
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].Repr();
      }
      if (tuple_ && list_->size() == 1) out += ",";
      out += tuple_ ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = namespace_ ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, value] : dict_->items) {
        if (!first) out += ", ";
        first = false;
        out += key.Repr() + ": " + value.Repr();
      }
      return out + (namespace_ ? "}>" : "}");
    }
    case Kind::kFunction:
      return "<function " + text_ + ">";
  }
  return "";
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return generator_ ? "generator" : tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return namespace_ ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "";
}

namespace {

bool IsNumeric(const Value& v) {
  return v.kind() == Value::Kind::kBool || v.kind() == Value::Kind::kInt ||
         v.kind() == Value::Kind::kFloat;
}

}  // namespace

bool Equal(const Value& a, const Value& b) {
  NestingGuard guard;
  if (IsNumeric(a) && IsNumeric(b)) {
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat)
      return a.integer() == b.integer();
    return a.number() == b.number();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.text() == b.text();
    case Value::Kind::kList: {
      if (a.is_generator() || b.is_generator()) return &a.list() == &b.list();
      if (a.is_tuple() != b.is_tuple() || a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i)
        if (!Equal(a.list()[i], b.list()[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      if (a.is_namespace() || b.is_namespace()) return &a.dict() == &b.dict();
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [key, value] : a.dict().items) {
        const Value* other = b.dict().Find(key);
        if (!other || !Equal(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kFunction:
      return &a.function() == &b.function();
    default:
      return false;
  }
}

bool Comparable(const Value& a, const Value& b) {
  NestingGuard guard;
  if (IsNumeric(a) && IsNumeric(b)) return true;
  if (a.is_string() && b.is_string()) return true;
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() &&
      !b.is_generator()) {
    const size_t n = std::min(a.list().size(), b.list().size());
    for (size_t i = 0; i < n; ++i) {
      if (Equal(a.list()[i], b.list()[i])) continue;
      return Comparable(a.list()[i], b.list()[i]);
    }
    return true;
  }
  return false;
}

int Compare(const Value& a, const Value& b) {
  NestingGuard guard;
  if (IsNumeric(a) && IsNumeric(b)) {
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat)
      return a.integer() < b.integer() ? -1 : a.integer() > b.integer() ? 1 : 0;
    return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
  }
  if (a.is_string()) return a.text().compare(b.text()) < 0 ? -1 : a.text() == b.text() ? 0 : 1;
  const size_t n = std::min(a.list().size(), b.list().size());
  for (size_t i = 0; i < n; ++i)
    if (!Equal(a.list()[i], b.list()[i])) return Compare(a.list()[i], b.list()[i]);
  return a.list().size() < b.list().size() ? -1 : a.list().size() > b.list().size() ? 1 : 0;
}

namespace {

void JsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (uint32_t c : CodePoints(s)) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          *out += fmt::format("\\u{:04x}", c);
        } else if (ensure_ascii && c > 0x7E) {
          if (c >= 0x10000) {
            const uint32_t v = c - 0x10000;
            *out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            *out += fmt::format("\\u{:04x}", c);
          }
        } else {
          AppendUtf8(c, out);
        }
    }
  }
  *out += '"';
}

bool JsonAt(const Value& value, const JsonStyle& style, int depth, std::string* out,
            std::string* why);

// json.dumps turns the scalar keys Python allows into strings: a string as it is, the others as
// their JSON.
bool JsonKey(const Value& key, std::string* out, std::string* why) {
  if (key.is_string()) {
    *out = key.text();
    return true;
  }
  if (key.is_none() || key.is_number() || key.kind() == Value::Kind::kBool)
    return JsonAt(key, JsonStyle(), 0, out, why);
  *why = fmt::format("keys must be str, int, float, bool or None, not {}", key.TypeName());
  return false;
}

bool JsonAt(const Value& value, const JsonStyle& style, int depth, std::string* out,
            std::string* why) {
  if (depth > 512) {
    *why = "nesting is too deep";
    return false;
  }
  auto newline = [&](int level) {
    if (style.indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(style.indent) * level, ' ');
  };
  switch (value.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return true;
    case Value::Kind::kBool:
      *out += value.boolean() ? "true" : "false";
      return true;
    case Value::Kind::kInt:
      *out += std::to_string(value.integer());
      return true;
    case Value::Kind::kFloat: {
      const double f = value.number();
      if (std::isnan(f)) {
        *out += "NaN";
      } else if (std::isinf(f)) {
        *out += f < 0 ? "-Infinity" : "Infinity";
      } else {
        *out += FloatRepr(f);
      }
      return true;
    }
    case Value::Kind::kString:
      JsonString(value.text(), style.ensure_ascii, out);
      return true;
    case Value::Kind::kList: {
      if (value.is_generator()) break;
      if (value.list().empty()) {
        *out += "[]";
        return true;
      }
      *out += '[';
      for (size_t i = 0; i < value.list().size(); ++i) {
        if (i) *out += style.item_separator;
        newline(depth + 1);
        if (!JsonAt(value.list()[i], style, depth + 1, out, why)) return false;
      }
      newline(depth);
      *out += ']';
      return true;
    }
    case Value::Kind::kDict: {
      if (value.is_namespace()) break;
      if (value.dict().items.empty()) {
        *out += "{}";
        return true;
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [key, item] : value.dict().items) {
        std::string text;
        if (!JsonKey(key, &text, why)) return false;
        entries.emplace_back(std::move(text), &item);
      }
      if (style.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      *out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) *out += style.item_separator;
        newline(depth + 1);
        JsonString(entries[i].first, style.ensure_ascii, out);
        *out += style.key_separator;
        if (!JsonAt(*entries[i].second, style, depth + 1, out, why)) return false;
      }
      newline(depth);
      *out += '}';
      return true;
    }
    default:
      break;
  }
  *why = fmt::format("Object of type {} is not JSON serializable", value.TypeName());
  return false;
}

}  // namespace

bool ToJson(const Value& value, const JsonStyle& style, std::string* out, std::string* why) {
  return JsonAt(value, style, 0, out, why);
}

}  // namespace sy::jinja
