// Python's str, dict and list methods a template may call, Jinja's globals (range, namespace,
// dict, joiner) and transformers' (raise_exception, strftime_now), and argument binding.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "base/utf8.h"
#include "jinja/python_str.h"

namespace sy::jinja {

std::vector<Value> BindArguments(Interpreter& in, const char* function, CallArguments& args,
                                 std::initializer_list<const char*> names) {
  std::vector<Value> bound(names.size());
  std::vector<bool> given(names.size(), false);
  if (args.positional.size() > names.size())
    in.Fail(fmt::format("{}() takes at most {} argument(s) ({} given)", function, names.size(),
                        args.positional.size()));
  for (size_t i = 0; i < args.positional.size(); ++i) {
    bound[i] = args.positional[i];
    given[i] = true;
  }
  for (auto& [key, value] : args.keyword) {
    size_t index = 0;
    for (const char* name : names) {
      if (key == name) break;
      ++index;
    }
    if (index == names.size())
      in.Fail(fmt::format("{}() got an unexpected keyword argument '{}'", function, key));
    if (given[index]) in.Fail(fmt::format("{}() got multiple values for '{}'", function, key));
    bound[index] = value;
    given[index] = true;
  }
  return bound;
}

std::string PercentFormat(Interpreter& in, const std::string& format,
                          const std::vector<Value>& values) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) in.Fail("incomplete format");
    const char conversion = format[i];
    if (conversion == '%') {
      out += '%';
      continue;
    }
    if (next >= values.size()) in.Fail("not enough arguments for format string");
    const Value& v = values[next++];
    if (conversion == 's') {
      out += v.Str();
    } else if (conversion == 'r') {
      out += v.Repr();
    } else if (conversion == 'd' || conversion == 'i') {
      if (!v.is_number() && v.kind() != Value::Kind::kBool)
        in.Fail(
            fmt::format("%{} format: a real number is required, not {}", conversion, v.TypeName()));
      out += std::to_string(v.kind() == Value::Kind::kFloat
                                ? static_cast<int64_t>(std::trunc(v.number()))
                                : v.integer());
    } else {
      in.Fail(fmt::format("the format conversion %{} is not supported", conversion));
    }
    in.CheckSize(out.size());
  }
  if (next < values.size()) in.Fail("not all arguments converted during string formatting");
  return out;
}

namespace {

using Args = CallArguments;

bool StartsOrEnds(Interpreter& in, const std::string& s, const Value& affix, bool starts) {
  if (affix.is_tuple()) {
    for (const Value& item : affix.list())
      if (StartsOrEnds(in, s, item, starts)) return true;
    return false;
  }
  const std::string a =
      StringArgument(in, affix, starts ? "startswith's prefix" : "endswith's suffix");
  if (a.size() > s.size()) return false;
  return starts ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
}

// Code-point offset of a byte offset (str.find answers in characters).
int64_t CharIndex(const std::string& s, size_t byte) {
  if (byte == std::string::npos) return -1;
  return static_cast<int64_t>(CodePoints(std::string_view(s).substr(0, byte)).size());
}

// str.format with {}, {0} and {name} fields; format specs are not supported.
std::string StrFormat(Interpreter& in, const std::string& format, Args& args) {
  std::string out;
  size_t automatic = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') ++i;
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) in.Fail("Single '{' encountered in format string");
    const std::string field = format.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos)
      in.Fail("str.format conversions and format specs are not supported");
    Value value;
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      const size_t index = field.empty() ? automatic++ : std::stoul(field);
      if (index >= args.positional.size())
        in.Fail(fmt::format("Replacement index {} out of range for positional args tuple", index));
      value = args.positional[index];
    } else {
      bool found = false;
      for (const auto& [key, v] : args.keyword)
        if (key == field) {
          value = v;
          found = true;
        }
      if (!found) in.Fail(fmt::format("KeyError: '{}'", field));
    }
    out += value.Str();
    i = close;
  }
  return out;
}

Value Bound(std::string name, Function function) {
  return Value::MakeFunction(std::move(name), std::move(function));
}

Value StringMethod(Interpreter& in, const std::string& s, const std::string& name) {
  Interpreter* ip = &in;
  auto unary = [&](std::string (*f)(const std::string&)) {
    return Bound(name, [ip, s, f, name](Args& a) {
      BindArguments(*ip, name.c_str(), a, {});
      return Value::String(f(s));
    });
  };
  auto predicate = [&](bool (*f)(uint32_t), bool all_cased) {
    return Bound(name, [ip, s, f, all_cased, name](Args& a) {
      BindArguments(*ip, name.c_str(), a, {});
      if (all_cased) return Value::Bool(AllCased(s, f));
      const std::vector<uint32_t> cps = CodePoints(s);
      return Value::Bool(!cps.empty() && std::all_of(cps.begin(), cps.end(), f));
    });
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Bound(name, [ip, s, name](Args& a) {
      auto v = BindArguments(*ip, name.c_str(), a, {"chars"});
      return Value::String(Strip(s, v[0], name != "rstrip", name != "lstrip"));
    });
  if (name == "split" || name == "rsplit")
    return Bound(name, [ip, s, name](Args& a) {
      auto v = BindArguments(*ip, name.c_str(), a, {"sep", "maxsplit"});
      return Split(*ip, s, v[0], IntArgument(*ip, v[1], -1, "maxsplit"), name == "rsplit");
    });
  if (name == "splitlines")
    return Bound(name, [ip, s, name](Args& a) {
      auto v = BindArguments(*ip, name.c_str(), a, {"keepends"});
      List lines;
      for (auto& line : SplitLines(s, BoolArgument(v[0], false)))
        lines.push_back(Value::String(std::move(line)));
      return Value::MakeList(std::move(lines));
    });
  if (name == "startswith" || name == "endswith")
    return Bound(name, [ip, s, name](Args& a) {
      auto v = BindArguments(*ip, name.c_str(), a, {"affix"});
      return Value::Bool(StartsOrEnds(*ip, s, v[0], name == "startswith"));
    });
  if (name == "upper") return unary([](const std::string& t) { return MapCase(t, Upper); });
  if (name == "lower") return unary([](const std::string& t) { return MapCase(t, Lower); });
  if (name == "capitalize") return unary(Capitalize);
  if (name == "title")
    return unary([](const std::string& t) {
      // str.title(): a letter after a non-letter starts a word.
      std::vector<uint32_t> cps = CodePoints(t);
      bool previous_cased = false;
      for (uint32_t& c : cps) {
        const bool cased = IsLowerCase(c) || IsUpperCase(c);
        c = previous_cased ? Lower(c) : Upper(c);
        previous_cased = cased;
      }
      return FromCodePoints(cps, 0, cps.size());
    });
  if (name == "swapcase")
    return unary([](const std::string& t) {
      std::vector<uint32_t> cps = CodePoints(t);
      for (uint32_t& c : cps)
        c = IsUpperCase(c) ? Lower(c) : Upper(c);
      return FromCodePoints(cps, 0, cps.size());
    });
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
    return predicate(IsDigit, false);
  if (name == "isalpha") return predicate(IsAlpha, false);
  if (name == "isalnum")
    return predicate([](uint32_t c) { return IsAlpha(c) || IsDigit(c); }, false);
  if (name == "isspace") return predicate(IsPythonSpace, false);
  if (name == "isupper") return predicate(IsUpperCase, true);
  if (name == "islower") return predicate(IsLowerCase, true);
  if (name == "replace")
    return Bound(name, [ip, s, name](Args& a) {
      auto v = BindArguments(*ip, name.c_str(), a, {"old", "new", "count"});
      return Value::String(Replace(s, StringArgument(*ip, v[0], "replace's old"),
                                   StringArgument(*ip, v[1], "replace's new"),
                                   IntArgument(*ip, v[2], -1, "count"), *ip));
    });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count")
    return Bound(name, [ip, s, name](Args& a) {
      auto v = BindArguments(*ip, name.c_str(), a, {"sub"});
      const std::string sub = StringArgument(*ip, v[0], "the substring");
      if (name == "count") {
        if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePoints(s).size()) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
          ++n;
        return Value::Int(n);
      }
      const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
      if (at == std::string::npos && (name == "index" || name == "rindex"))
        ip->Fail("substring not found");
      return Value::Int(CharIndex(s, at));
    });
  if (name == "join")
    return Bound(name, [ip, s, name](Args& a) {
      auto v = BindArguments(*ip, name.c_str(), a, {"iterable"});
      std::string out;
      bool first = true;
      for (const Value& item : ip->Iterate(v[0])) {
        if (!item.is_string())
          ip->Fail(fmt::format("sequence item: expected str instance, {} found", item.TypeName()));
        if (!first) out += s;
        first = false;
        out += item.text();
        ip->CheckSize(out.size());
      }
      return Value::String(std::move(out));
    });
  if (name == "format")
    return Bound(name, [ip, s](Args& a) { return Value::String(StrFormat(*ip, s, a)); });
  if (name == "removeprefix" || name == "removesuffix")
    return Bound(name, [ip, s, name](Args& a) {
      auto v = BindArguments(*ip, name.c_str(), a, {"affix"});
      const std::string affix = StringArgument(*ip, v[0], "the affix");
      if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0)
        return Value::String(s.substr(affix.size()));
      if (name == "removesuffix" && affix.size() <= s.size() && !affix.empty() &&
          s.compare(s.size() - affix.size(), affix.size(), affix) == 0)
        return Value::String(s.substr(0, s.size() - affix.size()));
      return Value::String(s);
    });
  if (name == "partition" || name == "rpartition")
    return Bound(name, [ip, s, name](Args& a) {
      auto v = BindArguments(*ip, name.c_str(), a, {"sep"});
      const std::string sep = StringArgument(*ip, v[0], "the separator");
      if (sep.empty()) ip->Fail("empty separator");
      const size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
      List parts;
      if (at == std::string::npos) {
        parts = name == "partition" ? List{Value::String(s), Value::String(""), Value::String("")}
                                    : List{Value::String(""), Value::String(""), Value::String(s)};
      } else {
        parts = {Value::String(s.substr(0, at)), Value::String(sep),
                 Value::String(s.substr(at + sep.size()))};
      }
      return Value::MakeList(std::move(parts), true);
    });
  return Value::Undefined(fmt::format("'str object' has no attribute '{}'", name));
}

}  // namespace

Value FindMethod(Interpreter& in, const Value& receiver, const std::string& name) {
  Interpreter* ip = &in;
  if (receiver.is_string()) return StringMethod(in, receiver.text(), name);
  if (receiver.is_dict() && !receiver.is_namespace()) {
    if (name == "items" || name == "keys" || name == "values")
      return Bound(name, [ip, receiver, name](Args& a) {
        BindArguments(*ip, name.c_str(), a, {});
        List out;
        for (const auto& [key, value] : receiver.dict().items)
          out.push_back(name == "items" ? Tuple(key, value) : name == "keys" ? key : value);
        return Value::MakeList(std::move(out));
      });
    if (name == "get")
      return Bound(name, [ip, receiver](Args& a) {
        auto v = BindArguments(*ip, "get", a, {"key", "default"});
        if (const Value* found = receiver.dict().Find(v[0])) return *found;
        return v[1].is_undefined() ? Value::None() : v[1];
      });
    if (name == "copy")
      return Bound(name, [receiver](Args&) {
        return Value::MakeDict(std::make_shared<Dict>(receiver.dict()));
      });
    if (name == "update" || name == "pop" || name == "popitem" || name == "setdefault" ||
        name == "clear")
      return Bound(name, [ip, name](Args&) -> Value {
        ip->Fail(fmt::format("access to attribute '{}' of 'dict' object is unsafe", name));
      });
    return Value::Undefined("");
  }
  if (receiver.is_list()) {
    if (name == "index" || name == "count")
      return Bound(name, [ip, receiver, name](Args& a) {
        auto v = BindArguments(*ip, name.c_str(), a, {"value"});
        int64_t n = 0;
        for (size_t i = 0; i < receiver.list().size(); ++i) {
          if (!Equal(receiver.list()[i], v[0])) continue;
          if (name == "index") return Value::Int(static_cast<int64_t>(i));
          ++n;
        }
        if (name == "index") ip->Fail(fmt::format("{} is not in list", v[0].Repr()));
        return Value::Int(n);
      });
    if (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
        name == "remove" || name == "reverse" || name == "sort" || name == "clear")
      return Bound(name, [ip, name, receiver](Args&) -> Value {
        ip->Fail(fmt::format("access to attribute '{}' of '{}' object is unsafe", name,
                             receiver.TypeName()));
      });
  }
  return Value::Undefined("");
}

void AddGlobals(Interpreter& in, std::unordered_map<std::string, Value>* globals) {
  Interpreter* ip = &in;
  (*globals)["range"] = Value::MakeFunction("range", [ip](Args& a) {
    if (!a.keyword.empty()) ip->Fail("range() takes no keyword arguments");
    if (a.positional.empty() || a.positional.size() > 3)
      ip->Fail("range expected 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    for (const Value& v : a.positional)
      if (!IsIntLike(v))
        ip->Fail(fmt::format("'{}' object cannot be interpreted as an integer", v.TypeName()));
    if (a.positional.size() == 1) {
      stop = a.positional[0].integer();
    } else {
      start = a.positional[0].integer();
      stop = a.positional[1].integer();
      if (a.positional.size() == 3) step = a.positional[2].integer();
    }
    if (step == 0) ip->Fail("range() arg 3 must not be zero");
    // Jinja's sandbox refuses ranges over 100000 items (MAX_RANGE).
    const __int128 span = step > 0 ? (__int128)stop - start : (__int128)start - stop;
    const __int128 count =
        span <= 0 ? 0 : (span + (step > 0 ? step : -step) - 1) / (step > 0 ? step : -step);
    if (count > 100000)
      ip->Fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    List items;
    for (int64_t i = 0; i < static_cast<int64_t>(count); ++i)
      items.push_back(Value::Int(start + i * step));
    return Value::MakeList(std::move(items));
  });
  (*globals)["namespace"] = Value::MakeFunction("namespace", [ip](Args& a) {
    auto dict = std::make_shared<Dict>();
    if (a.positional.size() > 1) ip->Fail("namespace() takes at most one positional argument");
    if (!a.positional.empty()) {
      if (!a.positional[0].is_dict()) ip->Fail("namespace()'s argument must be a dict");
      *dict = a.positional[0].dict();
    }
    for (auto& [key, value] : a.keyword)
      dict->Set(Value::String(key), value);
    return Value::Namespace(std::move(dict));
  });
  (*globals)["dict"] = Value::MakeFunction("dict", [ip](Args& a) {
    auto dict = std::make_shared<Dict>();
    if (a.positional.size() > 1) ip->Fail("dict() takes at most one positional argument");
    if (!a.positional.empty()) {
      if (a.positional[0].is_dict()) {
        *dict = a.positional[0].dict();
      } else {
        for (const Value& pair : ip->Iterate(a.positional[0])) {
          if (!pair.is_list() || pair.list().size() != 2)
            ip->Fail("dict()'s sequence elements must be pairs");
          dict->Set(pair.list()[0], pair.list()[1]);
        }
      }
    }
    for (auto& [key, value] : a.keyword)
      dict->Set(Value::String(key), value);
    return Value::MakeDict(std::move(dict));
  });
  (*globals)["raise_exception"] = Value::MakeFunction("raise_exception", [ip](Args& a) -> Value {
    auto b = BindArguments(*ip, "raise_exception", a, {"message"});
    throw RaisedError(0, b[0].Str());
  });
  (*globals)["strftime_now"] = Value::MakeFunction("strftime_now", [ip](Args& a) {
    auto b = BindArguments(*ip, "strftime_now", a, {"format"});
    const std::string format = StringArgument(*ip, b[0], "strftime_now's format");
    std::tm local{};
    if (ip->limits().fixed_time) {
      local = *ip->limits().fixed_time;
    } else {
      const std::time_t now = std::time(nullptr);
      localtime_r(&now, &local);
    }
    char buffer[512];
    const size_t n =
        format.empty() ? 0 : std::strftime(buffer, sizeof buffer, format.c_str(), &local);
    if (!format.empty() && n == 0) ip->Fail("strftime_now's format gives nothing or too much");
    return Value::String(std::string(buffer, n));
  });
  (*globals)["joiner"] = Value::MakeFunction("joiner", [ip](Args& a) {
    auto b = BindArguments(*ip, "joiner", a, {"sep"});
    const std::string separator = b[0].is_undefined() ? ", " : b[0].Str();
    auto used = std::make_shared<bool>(false);
    return Value::MakeFunction("joiner", [separator, used](Args&) {
      if (!*used) {
        *used = true;
        return Value::String("");
      }
      return Value::String(separator);
    });
  });
}

}  // namespace sy::jinja
