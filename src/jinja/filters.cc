// Jinja2's builtin filters and tests that chat templates use, after jinja2/filters.py and
// jinja2/tests.py.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "base/utf8.h"
#include "jinja/python_str.h"

namespace sy::jinja {

using Args = CallArguments;

namespace {

// The items a filter's attribute= argument selects, as jinja's make_attrgetter does: a dotted
// path, each part looked up in turn; a default replaces an undefined part and the walk goes on.
Value Pick(Interpreter& in, const Value& item, const Value& attribute, const Value& if_missing) {
  if (attribute.is_undefined() || attribute.is_none()) return item;
  std::vector<Value> parts;
  if (IsIntLike(attribute)) {
    parts.push_back(attribute);
  } else {
    const std::string path = attribute.Str();
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
      const bool digits =
          !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      parts.push_back(digits ? Value::Int(std::stoll(part)) : Value::String(part));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  }
  Value current = item;
  for (const Value& part : parts) {
    current = in.Item(current, part);
    if (current.is_undefined() && !if_missing.is_undefined() && !if_missing.is_none())
      current = if_missing;
  }
  return current;
}

Value CaseKey(const Value& v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  return Value::String(MapCase(v.text(), Lower));
}

// The items of (sort key, item) pairs in a stable sort by key, as a list.
Value SortedItems(Interpreter& in, std::vector<std::pair<Value, Value>> keyed, bool reverse) {
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    RequireOrderable(in, "<", a.first, b.first);
    return reverse ? Compare(b.first, a.first) < 0 : Compare(a.first, b.first) < 0;
  });
  List out;
  for (auto& [key, item] : keyed)
    out.push_back(std::move(item));
  return Value::MakeList(std::move(out));
}

// select/reject/selectattr/rejectattr.
Value FilterBy(Interpreter& in, const Value& sequence, Args& args, bool by_attribute,
               bool keep_when) {
  std::vector<Value> rest = args.positional;
  Value attribute;
  if (by_attribute) {
    if (rest.empty()) in.Fail("selectattr and rejectattr need an attribute");
    attribute = rest.front();
    rest.erase(rest.begin());
  }
  std::string test;
  if (!rest.empty()) {
    test = rest.front().Str();
    rest.erase(rest.begin());
    if (!FindTest(test)) in.Fail(fmt::format("No test named '{}'.", test));
  }
  List out;
  for (const Value& item : in.Iterate(sequence)) {
    in.Step();
    const Value subject = by_attribute ? Pick(in, item, attribute, Value()) : item;
    bool passed;
    if (test.empty()) {
      passed = subject.Truthy();
    } else {
      Args test_args{rest, args.keyword};
      passed = in.CallTest(test, subject, test_args);
    }
    if (passed == keep_when) out.push_back(item);
  }
  return Value::MakeGenerator(std::move(out));
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Python's int(text): optional sign, digits with single underscores, surrounding whitespace.
bool ParseInt(const std::string& text, int64_t base, int64_t* out) {
  std::string s = Strip(text, Value(), true, true);
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i == s.size()) return false;
  __int128 v = 0;
  bool previous_underscore = true;
  for (; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (previous_underscore) return false;
      previous_underscore = true;
      continue;
    }
    int digit = std::isdigit(static_cast<unsigned char>(s[i]))   ? s[i] - '0'
                : std::isalpha(static_cast<unsigned char>(s[i])) ? std::tolower(s[i]) - 'a' + 10
                                                                 : 99;
    if (digit >= base) return false;
    v = v * base + digit;
    if (v > static_cast<__int128>(INT64_MAX) + 1) return false;
    previous_underscore = false;
  }
  if (previous_underscore) return false;
  v = negative ? -v : v;
  if (v > INT64_MAX) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

bool ParseFloat(const std::string& text, double* out) {
  std::string s = Strip(text, Value(), true, true);
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

Value RoundFloat(double x, int64_t precision, const std::string& method) {
  if (method == "common") {
    // Python's round(): correctly rounded from the exact binary value, ties to even, which is
    // what printf's %.Nf does.
    if (precision < 0 || precision > 300 || !std::isfinite(x)) {
      const double scale = std::pow(10.0, static_cast<double>(precision));
      return Value::Float(std::nearbyint(x * scale) / scale);
    }
    return Value::Float(std::strtod(fmt::format("{:.{}f}", x, precision).c_str(), nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  return Value::Float((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
}

Value FilterMinMax(Interpreter& in, const Value& v, Args& a, bool max) {
  auto b = BindArguments(in, max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const bool case_sensitive = BoolArgument(b[0], false);
  std::vector<Value> items = in.Iterate(v);
  if (items.empty()) return Value::Undefined("no items for min/max");
  auto key = [&](const Value& item) {
    return CaseKey(Pick(in, item, b[1], Value()), case_sensitive);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value x = key(items[i]);
    RequireOrderable(in, max ? ">" : "<", x, best_key);
    const int c = Compare(x, best_key);
    if (max ? c > 0 : c < 0) {
      best = i;
      best_key = std::move(x);
    }
  }
  return items[best];
}

Value FilterIndent(Interpreter& in, const Value& v, Args& a) {
  auto b = BindArguments(in, "indent", a, {"width", "first", "blank"});
  const std::string indentation =
      b[0].is_string() ? b[0].text() : std::string(IntArgument(in, b[0], 4, "width"), ' ');
  const bool first = BoolArgument(b[1], false), blank = BoolArgument(b[2], false);
  std::vector<std::string> lines = SplitLines(v.Str() + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    if (i && (blank || !lines[i].empty())) out += indentation;
    out += lines[i];
    in.CheckSize(out.size());
  }
  if (first) out = indentation + out;
  return Value::String(std::move(out));
}

Value FilterToJson(Interpreter& in, const Value& v, Args& a) {
  auto b = BindArguments(in, "tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle style;
  style.ensure_ascii = BoolArgument(b[0], false);
  if (!b[1].is_undefined() && !b[1].is_none()) {
    style.indent = static_cast<int>(IntArgument(in, b[1], 0, "indent"));
    style.item_separator = ",";
  }
  if (!b[2].is_undefined() && !b[2].is_none()) {
    if (!b[2].is_list() || b[2].list().size() != 2)
      in.Fail("tojson's separators must be an (item, key) pair");
    style.item_separator = b[2].list()[0].Str();
    style.key_separator = b[2].list()[1].Str();
  }
  style.sort_keys = BoolArgument(b[3], false);
  std::string out, why;
  if (!ToJson(v, style, &out, &why)) in.Fail(why);
  in.CheckSize(out.size());
  return Value::String(std::move(out));
}

Value FilterMap(Interpreter& in, const Value& v, Args& a) {
  List out;
  std::vector<Value> items = in.Iterate(v);
  Value attribute, if_missing;
  bool by_attribute = false;
  for (const auto& [key, value] : a.keyword) {
    if (key == "attribute") {
      attribute = value;
      by_attribute = true;
    } else if (key == "default") {
      if_missing = value;
    }
  }
  if (by_attribute) {
    for (const Value& item : items)
      out.push_back(Pick(in, item, attribute, if_missing));
    return Value::MakeGenerator(std::move(out));
  }
  if (a.positional.empty()) in.Fail("map needs a filter name or attribute=");
  const std::string filter = a.positional[0].Str();
  if (!FindFilter(filter)) in.Fail(fmt::format("No filter named '{}'.", filter));
  Args rest{std::vector<Value>(a.positional.begin() + 1, a.positional.end()), a.keyword};
  for (const Value& item : items) {
    in.Step();
    Args call = rest;
    out.push_back(in.CallFilter(filter, item, call));
  }
  return Value::MakeGenerator(std::move(out));
}

std::string Title(const std::string& s) {
  // jinja's do_title: words begin after runs of whitespace, '-', '(', '{', '[' or '<'.
  std::vector<uint32_t> cps = CodePoints(s);
  bool word_start = true;
  for (uint32_t& c : cps) {
    const bool separator =
        IsPythonSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (separator) {
      word_start = true;
      continue;
    }
    c = word_start ? Upper(c) : Lower(c);
    word_start = false;
  }
  return FromCodePoints(cps, 0, cps.size());
}

const std::unordered_map<std::string_view, FilterFunction>& Filters() {
  static const auto* filters = new std::unordered_map<std::string_view, FilterFunction>{
      {"abs",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "abs", a, {});
         if (IsIntLike(v)) {
           if (v.integer() == INT64_MIN) in.Fail("integer overflow");
           return Value::Int(std::abs(v.integer()));
         }
         if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.number()));
         in.Fail(fmt::format("bad operand type for abs(): '{}'", v.TypeName()));
       }},
      {"attr",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "attr", a, {"name"});
         if (v.is_dict() && !v.is_namespace()) return FindMethod(in, v, b[0].Str());
         return in.Attribute(v, b[0].Str());
       }},
      {"batch",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "batch", a, {"linecount", "fill_with"});
         const int64_t size = IntArgument(in, b[0], 1, "linecount");
         if (size <= 0) in.Fail("batch's linecount must be positive");
         List out, current;
         for (const Value& item : in.Iterate(v)) {
           current.push_back(item);
           if (static_cast<int64_t>(current.size()) == size) {
             out.push_back(Value::MakeList(std::move(current)));
             current.clear();
           }
         }
         if (!current.empty()) {
           if (!b[1].is_undefined() && !b[1].is_none())
             while (static_cast<int64_t>(current.size()) < size) current.push_back(b[1]);
           out.push_back(Value::MakeList(std::move(current)));
         }
         return Value::MakeGenerator(std::move(out));
       }},
      {"capitalize",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "capitalize", a, {});
         return Value::String(Capitalize(v.Str()));
       }},
      {"center",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "center", a, {"width"});
         const std::string s = v.Str();
         const int64_t width = IntArgument(in, b[0], 80, "width");
         const int64_t n = static_cast<int64_t>(CodePoints(s).size());
         if (width <= n) return Value::String(s);
         in.CheckSize(static_cast<size_t>(width));
         // CPython's str.center puts the odd space on the left when the padding is odd and the
         // width is odd.
         const int64_t pad = width - n;
         const int64_t left = pad / 2 + (pad & width & 1);
         return Value::String(std::string(left, ' ') + s + std::string(pad - left, ' '));
       }},
      {"count",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "count", a, {});
         return Value::Int(Length(in, v));
       }},
      {"default",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "default", a, {"default_value", "boolean"});
         const Value fallback = b[0].is_undefined() ? Value::String("") : b[0];
         if (v.is_undefined() || (BoolArgument(b[1], false) && !v.Truthy())) return fallback;
         return v;
       }},
      {"dictsort",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "dictsort", a, {"case_sensitive", "by", "reverse"});
         if (!v.is_dict() || v.is_namespace()) in.Fail("dictsort needs a dict");
         const std::string by = b[1].is_undefined() ? "key" : b[1].Str();
         if (by != "key" && by != "value") in.Fail("You can only sort by either 'key' or 'value'");
         std::vector<std::pair<Value, Value>> keyed;
         for (const auto& [key, value] : v.dict().items)
           keyed.emplace_back(CaseKey(by == "key" ? key : value, BoolArgument(b[0], false)),
                              Tuple(key, value));
         return SortedItems(in, std::move(keyed), BoolArgument(b[2], false));
       }},
      {"escape",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "escape", a, {});
         return Value::String(HtmlEscape(v.Str()));
       }},
      {"first",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "first", a, {});
         std::vector<Value> items = in.Iterate(v);
         return items.empty() ? Value::Undefined("No first item, sequence was empty.") : items[0];
       }},
      {"float",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "float", a, {"default"});
         const Value fallback = b[0].is_undefined() ? Value::Float(0) : b[0];
         if (v.is_number() || v.kind() == Value::Kind::kBool) return Value::Float(v.number());
         double d;
         if (v.is_string() && ParseFloat(v.text(), &d)) return Value::Float(d);
         return fallback;
       }},
      {"format",
       [](Interpreter& in, const Value& v, Args& a) {
         if (!a.keyword.empty()) in.Fail("format with keyword arguments is not supported");
         return Value::String(PercentFormat(in, v.Str(), a.positional));
       }},
      {"indent", FilterIndent},
      {"int",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "int", a, {"default", "base"});
         const Value fallback = b[0].is_undefined() ? Value::Int(0) : b[0];
         if (IsIntLike(v)) return Value::Int(v.integer());
         if (v.kind() == Value::Kind::kFloat) {
           if (!std::isfinite(v.number()) || std::fabs(v.number()) > 9.2e18) return fallback;
           return Value::Int(static_cast<int64_t>(std::trunc(v.number())));
         }
         if (!v.is_string()) return fallback;
         int64_t i;
         if (ParseInt(v.text(), IntArgument(in, b[1], 10, "base"), &i)) return Value::Int(i);
         double d;
         if (ParseFloat(v.text(), &d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
           return Value::Int(static_cast<int64_t>(std::trunc(d)));
         return fallback;
       }},
      {"items",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "items", a, {});
         if (v.is_undefined()) return Value::MakeGenerator({});
         if (!v.is_dict() || v.is_namespace())
           in.Fail(fmt::format("Can only get item pairs from a mapping, not {}", v.TypeName()));
         List out;
         for (const auto& [key, value] : v.dict().items) out.push_back(Tuple(key, value));
         return Value::MakeGenerator(std::move(out));
       }},
      {"join",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "join", a, {"d", "attribute"});
         const std::string separator = b[0].is_undefined() ? "" : b[0].Str();
         std::string out;
         bool first = true;
         for (const Value& item : in.Iterate(v)) {
           if (!first) out += separator;
           first = false;
           out += Pick(in, item, b[1], Value()).Str();
           in.CheckSize(out.size());
         }
         return Value::String(std::move(out));
       }},
      {"last",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "last", a, {});
         std::vector<Value> items = in.Iterate(v);
         return items.empty() ? Value::Undefined("No last item, sequence was empty.")
                              : items.back();
       }},
      {"length",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "length", a, {});
         return Value::Int(Length(in, v));
       }},
      {"list",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "list", a, {});
         return Value::MakeList(in.Iterate(v));
       }},
      {"lower",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "lower", a, {});
         return Value::String(MapCase(v.Str(), Lower));
       }},
      {"map", FilterMap},
      {"max", [](Interpreter& in, const Value& v, Args& a) { return FilterMinMax(in, v, a, true); }},
      {"min",
       [](Interpreter& in, const Value& v, Args& a) { return FilterMinMax(in, v, a, false); }},
      {"reject",
       [](Interpreter& in, const Value& v, Args& a) { return FilterBy(in, v, a, false, false); }},
      {"rejectattr",
       [](Interpreter& in, const Value& v, Args& a) { return FilterBy(in, v, a, true, false); }},
      {"replace",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "replace", a, {"old", "new", "count"});
         return Value::String(Replace(v.Str(), b[0].Str(), b[1].Str(),
                                      IntArgument(in, b[2], -1, "count"), in));
       }},
      {"reverse",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "reverse", a, {});
         if (v.is_string()) {
           std::vector<uint32_t> cps = CodePoints(v.text());
           std::reverse(cps.begin(), cps.end());
           return Value::String(FromCodePoints(cps, 0, cps.size()));
         }
         std::vector<Value> items = in.Iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::MakeGenerator(std::move(items));  // Python's reversed() iterator
       }},
      {"round",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "round", a, {"precision", "method"});
         const std::string method = b[1].is_undefined() ? "common" : b[1].Str();
         if (method != "common" && method != "ceil" && method != "floor")
           in.Fail("method must be common, ceil or floor");
         if (!v.is_number() && v.kind() != Value::Kind::kBool)
           in.Fail(fmt::format("round needs a number, not {}", v.TypeName()));
         if (IsIntLike(v) && method == "common") return Value::Int(v.integer());
         return RoundFloat(v.number(), IntArgument(in, b[0], 0, "precision"), method);
       }},
      {"safe",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "safe", a, {});
         return v;
       }},
      {"select",
       [](Interpreter& in, const Value& v, Args& a) { return FilterBy(in, v, a, false, true); }},
      {"selectattr",
       [](Interpreter& in, const Value& v, Args& a) { return FilterBy(in, v, a, true, true); }},
      {"sort",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "sort", a, {"reverse", "case_sensitive", "attribute"});
         std::vector<std::pair<Value, Value>> keyed;
         for (const Value& item : in.Iterate(v))
           keyed.emplace_back(CaseKey(Pick(in, item, b[2], Value()), BoolArgument(b[1], false)),
                              item);
         return SortedItems(in, std::move(keyed), BoolArgument(b[0], false));
       }},
      {"string",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "string", a, {});
         return Value::String(v.Str());
       }},
      {"sum",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "sum", a, {"attribute", "start"});
         Value total = b[1].is_undefined() ? Value::Int(0) : b[1];
         for (const Value& item : in.Iterate(v)) {
           const Value x = Pick(in, item, b[0], Value());
           if (IsIntLike(total) && IsIntLike(x)) {
             const __int128 s = static_cast<__int128>(total.integer()) + x.integer();
             if (s > INT64_MAX || s < INT64_MIN) in.Fail("integer overflow");
             total = Value::Int(static_cast<int64_t>(s));
           } else if ((total.is_number() || IsIntLike(total)) && (x.is_number() || IsIntLike(x))) {
             total = Value::Float(total.number() + x.number());
           } else {
             in.Fail(fmt::format("unsupported operand type(s) for +: '{}' and '{}'",
                                 total.TypeName(), x.TypeName()));
           }
         }
         return total;
       }},
      {"title",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "title", a, {});
         return Value::String(Title(v.Str()));
       }},
      {"tojson", FilterToJson},
      {"trim",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "trim", a, {"chars"});
         return Value::String(Strip(v.Str(), b[0], true, true));
       }},
      {"unique",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "unique", a, {"case_sensitive", "attribute"});
         List out;
         std::vector<Value> seen;
         for (const Value& item : in.Iterate(v)) {
           in.Step();
           const Value key = CaseKey(Pick(in, item, b[1], Value()), BoolArgument(b[0], false));
           bool duplicate = false;
           for (const Value& s : seen) duplicate = duplicate || Equal(s, key);
           if (duplicate) continue;
           seen.push_back(key);
           out.push_back(item);
         }
         return Value::MakeGenerator(std::move(out));
       }},
      {"upper",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "upper", a, {});
         return Value::String(MapCase(v.Str(), Upper));
       }},
      {"wordcount",
       [](Interpreter& in, const Value& v, Args& a) {
         BindArguments(in, "wordcount", a, {});
         // \w+ runs: letters, digits and the underscore.
         int64_t words = 0;
         bool in_word = false;
         for (uint32_t c : CodePoints(v.Str())) {
           const bool word = IsAlpha(c) || IsDigit(c) || c == '_';
           if (word && !in_word) ++words;
           in_word = word;
         }
         return Value::Int(words);
       }},
  };
  return *filters;
}

}  // namespace

FilterFunction FindFilter(std::string_view name) {
  if (name == "d") name = "default";
  if (name == "e" || name == "forceescape") name = "escape";
  const auto& filters = Filters();
  auto found = filters.find(name);
  return found == filters.end() ? nullptr : found->second;
}

namespace {

bool CompareTest(Interpreter& in, const Value& v, Args& a, const char* op) {
  auto b = BindArguments(in, op, a, {"other"});
  return in.EvalCompare(op, v, b[0]);  // `x is gt y` is `x > y`
}

const std::unordered_map<std::string_view, TestFunction>& Tests() {
  static const auto* tests = new std::unordered_map<std::string_view, TestFunction>{
      {"boolean",
       [](Interpreter&, const Value& v, Args&) { return v.kind() == Value::Kind::kBool; }},
      {"callable",
       [](Interpreter&, const Value& v, Args&) { return v.kind() == Value::Kind::kFunction; }},
      {"defined", [](Interpreter&, const Value& v, Args&) { return !v.is_undefined(); }},
      {"undefined", [](Interpreter&, const Value& v, Args&) { return v.is_undefined(); }},
      {"divisibleby",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "divisibleby", a, {"num"});
         const int64_t n = IntArgument(in, b[0], 1, "num");
         if (n == 0) in.Fail("integer modulo by zero");
         return IntArgument(in, v, 0, "the value") % n == 0;
       }},
      {"==", [](Interpreter& in, const Value& v, Args& a) { return CompareTest(in, v, a, "=="); }},
      {"!=", [](Interpreter& in, const Value& v, Args& a) { return CompareTest(in, v, a, "!="); }},
      {"<", [](Interpreter& in, const Value& v, Args& a) { return CompareTest(in, v, a, "<"); }},
      {"<=", [](Interpreter& in, const Value& v, Args& a) { return CompareTest(in, v, a, "<="); }},
      {">", [](Interpreter& in, const Value& v, Args& a) { return CompareTest(in, v, a, ">"); }},
      {">=", [](Interpreter& in, const Value& v, Args& a) { return CompareTest(in, v, a, ">="); }},
      {"escaped", [](Interpreter&, const Value&, Args&) { return false; }},
      {"even", [](Interpreter& in, const Value& v,
                  Args&) { return IntArgument(in, v, 0, "the value") % 2 == 0; }},
      {"odd", [](Interpreter& in, const Value& v,
                 Args&) { return IntArgument(in, v, 0, "the value") % 2 != 0; }},
      {"false", [](Interpreter&, const Value& v,
                   Args&) { return v.kind() == Value::Kind::kBool && !v.boolean(); }},
      {"true", [](Interpreter&, const Value& v,
                  Args&) { return v.kind() == Value::Kind::kBool && v.boolean(); }},
      {"filter",
       [](Interpreter&, const Value& v, Args&) { return v.is_string() && FindFilter(v.text()); }},
      {"test",
       [](Interpreter&, const Value& v, Args&) { return v.is_string() && FindTest(v.text()); }},
      {"float",
       [](Interpreter&, const Value& v, Args&) { return v.kind() == Value::Kind::kFloat; }},
      {"integer",
       [](Interpreter&, const Value& v, Args&) { return v.kind() == Value::Kind::kInt; }},
      {"in",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "in", a, {"seq"});
         return in.EvalCompare("in", v, b[0]);
       }},
      {"iterable",
       [](Interpreter&, const Value& v, Args&) {
         return v.is_undefined() || v.is_string() || v.is_list() ||
                (v.is_dict() && !v.is_namespace());
       }},
      {"lower", [](Interpreter&, const Value& v, Args&) { return AllCased(v.Str(), IsLowerCase); }},
      {"upper", [](Interpreter&, const Value& v, Args&) { return AllCased(v.Str(), IsUpperCase); }},
      {"mapping",
       [](Interpreter&, const Value& v, Args&) { return v.is_dict() && !v.is_namespace(); }},
      {"none", [](Interpreter&, const Value& v, Args&) { return v.is_none(); }},
      {"number", [](Interpreter&, const Value& v,
                    Args&) { return v.is_number() || v.kind() == Value::Kind::kBool; }},
      {"sameas",
       [](Interpreter& in, const Value& v, Args& a) {
         auto b = BindArguments(in, "sameas", a, {"other"});
         const Value& o = b[0];
         if (v.kind() != o.kind()) return false;
         // Python's identity: singletons and small ints by value, containers by object.
         switch (v.kind()) {
           case Value::Kind::kNone:
           case Value::Kind::kUndefined:
             return true;
           case Value::Kind::kBool:
           case Value::Kind::kInt:
             return Equal(v, o);
           case Value::Kind::kList:
             return &v.list() == &o.list();
           case Value::Kind::kDict:
             return &v.dict() == &o.dict();
           case Value::Kind::kFunction:
             return &v.function() == &o.function();
           default:
             return false;
         }
       }},
      {"sequence",
       [](Interpreter&, const Value& v, Args&) {
         return v.is_undefined() || v.is_string() || (v.is_list() && !v.is_generator()) ||
                (v.is_dict() && !v.is_namespace());
       }},
      {"string", [](Interpreter&, const Value& v, Args&) { return v.is_string(); }},
  };
  return *tests;
}

}  // namespace

TestFunction FindTest(std::string_view name) {
  if (name == "eq" || name == "equalto") name = "==";
  if (name == "ne") name = "!=";
  if (name == "lt" || name == "lessthan") name = "<";
  if (name == "le") name = "<=";
  if (name == "gt" || name == "greaterthan") name = ">";
  if (name == "ge") name = ">=";
  const auto& tests = Tests();
  auto found = tests.find(name);
  return found == tests.end() ? nullptr : found->second;
}

}  // namespace sy::jinja
