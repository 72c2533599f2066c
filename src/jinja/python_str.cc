#include "jinja/python_str.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/utf8.h"

namespace sy::jinja {

bool IsIntLike(const Value& v) {
  return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool;
}

int64_t IntArgument(Interpreter& in, const Value& v, int64_t if_absent, const char* what) {
  if (v.is_undefined() || v.is_none()) return if_absent;
  if (!IsIntLike(v)) in.Fail(fmt::format("{} must be an integer, not {}", what, v.TypeName()));
  return v.integer();
}

bool BoolArgument(const Value& v, bool if_absent) {
  return v.is_undefined() ? if_absent : v.Truthy();
}

std::string StringArgument(Interpreter& in, const Value& v, const char* what) {
  if (!v.is_string()) in.Fail(fmt::format("{} must be a string, not {}", what, v.TypeName()));
  return v.text();
}

int64_t Length(Interpreter& in, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(CodePoints(v.text()).size());
    case Value::Kind::kList:
      if (v.is_generator()) break;
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
      if (!v.is_namespace()) return static_cast<int64_t>(v.dict().items.size());
      break;
    default:
      break;
  }
  in.Fail(fmt::format("object of type '{}' has no len()", v.TypeName()));
}

uint32_t Lower(uint32_t c) {
  if ((c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  return c;
}
uint32_t Upper(uint32_t c) {
  if ((c >= 'a' && c <= 'z') || (c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  return c;
}
bool IsLowerCase(uint32_t c) {
  return Upper(c) != c;
}
bool IsUpperCase(uint32_t c) {
  return Lower(c) != c;
}
bool IsAlpha(uint32_t c) {
  return IsLowerCase(c) || IsUpperCase(c) || c > 0xFF;
}
bool IsDigit(uint32_t c) {
  return c >= '0' && c <= '9';
}

// str.islower() / str.isupper(): every cased character in the case, and at least one.
bool AllCased(const std::string& s, bool (*in_case)(uint32_t)) {
  bool cased = false;
  for (uint32_t c : CodePoints(s)) {
    if (!IsLowerCase(c) && !IsUpperCase(c)) continue;
    if (!in_case(c)) return false;
    cased = true;
  }
  return cased;
}

std::string MapCase(const std::string& s, uint32_t (*map)(uint32_t)) {
  std::string out;
  for (uint32_t c : CodePoints(s))
    AppendUtf8(map(c), &out);
  return out;
}

std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::vector<uint32_t> cps = CodePoints(s);
  std::vector<uint32_t> set;
  const bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) set = CodePoints(chars.Str());
  auto strip = [&](uint32_t c) {
    return whitespace ? IsPythonSpace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strip(cps[begin]))
      ++begin;
  if (right)
    while (end > begin && strip(cps[end - 1]))
      --end;
  return FromCodePoints(cps, begin, end);
}

// str.split / str.rsplit.
Value Split(Interpreter& in, const std::string& s, const Value& separator, int64_t max_split,
            bool from_right) {
  List parts;
  if (separator.is_undefined() || separator.is_none()) {
    // Runs of whitespace separate; leading and trailing whitespace gives no empty parts.
    const std::vector<uint32_t> cps = CodePoints(s);
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < cps.size();) {
      while (i < cps.size() && IsPythonSpace(cps[i]))
        ++i;
      if (i == cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !IsPythonSpace(cps[j]))
        ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (max_split >= 0 && static_cast<int64_t>(words.size()) > max_split) {
      // After max_split splits the last (or, from the right, first) part is the rest of the
      // text, whitespace at the text's end (or start) included, as CPython's split_whitespace.
      if (!from_right) {
        const size_t rest_begin = words[max_split].first;
        words.resize(max_split);
        words.emplace_back(rest_begin, cps.size());
      } else {
        const size_t first_kept = words.size() - max_split;
        std::vector<std::pair<size_t, size_t>> kept = {{0, words[first_kept - 1].second}};
        kept.insert(kept.end(), words.begin() + first_kept, words.end());
        words = std::move(kept);
      }
    }
    for (auto [b, e] : words)
      parts.push_back(Value::String(FromCodePoints(cps, b, e)));
    return Value::MakeList(std::move(parts));
  }
  const std::string sep = StringArgument(in, separator, "the separator");
  if (sep.empty()) in.Fail("empty separator");
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      const size_t at = s.find(sep, start);
      if (at == std::string::npos ||
          (max_split >= 0 && static_cast<int64_t>(pieces.size()) >= max_split)) {
        pieces.push_back(s.substr(start));
        break;
      }
      pieces.push_back(s.substr(start, at - start));
      start = at + sep.size();
    }
  } else {
    size_t end = s.size();
    while (true) {
      const size_t at = end >= sep.size() ? s.rfind(sep, end - sep.size()) : std::string::npos;
      if (at == std::string::npos ||
          (max_split >= 0 && static_cast<int64_t>(pieces.size()) >= max_split)) {
        pieces.push_back(s.substr(0, end));
        break;
      }
      pieces.push_back(s.substr(at + sep.size(), end - at - sep.size()));
      end = at;
    }
    std::reverse(pieces.begin(), pieces.end());
  }
  for (auto& piece : pieces)
    parts.push_back(Value::String(std::move(piece)));
  return Value::MakeList(std::move(parts));
}

// str.splitlines(): Python's line boundaries, including \r\n as one.
std::vector<std::string> SplitLines(const std::string& s, bool keep_ends) {
  const std::vector<uint32_t> cps = CodePoints(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t c = cps[i];
    const bool boundary = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C ||
                          c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!boundary) continue;
    size_t end = i + 1;
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') end = i + 2;
    lines.push_back(FromCodePoints(cps, start, keep_ends ? end : i));
    start = end;
    i = end - 1;
  }
  if (start < cps.size()) lines.push_back(FromCodePoints(cps, start, cps.size()));
  return lines;
}

std::string Replace(const std::string& s, const std::string& old, const std::string& replacement,
                    int64_t count, Interpreter& in) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement between characters and at both ends.
    const std::vector<uint32_t> cps = CodePoints(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      if (i < cps.size()) AppendUtf8(cps[i], &out);
      in.CheckSize(out.size());
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += replacement;
    in.CheckSize(out.size());
    start = at + old.size();
    ++done;
  }
  out.append(s, start);
  return out;
}

Value Tuple(Value a, Value b) {
  return Value::MakeList({std::move(a), std::move(b)}, true);
}

std::string Capitalize(const std::string& s) {
  std::vector<uint32_t> cps = CodePoints(s);
  for (size_t i = 0; i < cps.size(); ++i)
    cps[i] = i ? Lower(cps[i]) : Upper(cps[i]);
  return FromCodePoints(cps, 0, cps.size());
}

void RequireOrderable(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (!Comparable(a, b))
    in.Fail(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, a.TypeName(),
                        b.TypeName()));
}

}  // namespace sy::jinja
