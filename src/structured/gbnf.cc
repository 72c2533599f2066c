#include "structured/gbnf.h"

#include <unordered_map>

namespace sy::structured {
namespace {

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, const GrammarLimits& limits) : s_(text), limits_(limits) {}

  Result<Grammar> Parse() {
    SkipSpace(true);
    while (pos_ < s_.size()) {
      SY_RETURN_IF_ERROR(ParseRule());
    }
    for (size_t r = 0; r < grammar_.rules.size(); ++r) {
      if (!grammar_.rules[r].body) {
        pos_ = first_use_pos_[r];
        return Error(fmt::format("rule '{}' is used but never defined", grammar_.rules[r].name));
      }
    }
    auto root = ids_.find("root");
    if (root == ids_.end()) return Status::Error("the grammar has no 'root' rule");
    grammar_.root = root->second;
    return std::move(grammar_);
  }

 private:
  int Line() const {
    int line = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i)
      line += s_[i] == '\n';
    return line;
  }
  Status Error(std::string_view what) const {
    return Status::Errorf("{} on line {}", what, Line());
  }
  bool AtEnd() const { return pos_ >= s_.size(); }

  void SkipSpace(bool newline_ok) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n' && s_[pos_] != '\r')
          ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  int RuleId(const std::string& name) {
    auto [it, inserted] = ids_.try_emplace(name, static_cast<int>(grammar_.rules.size()));
    if (inserted) {
      grammar_.AddRule(name);
      first_use_pos_.push_back(pos_);
    }
    return it->second;
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (pos_ < s_.size() && IsWordChar(s_[pos_]))
      ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  Status ParseRule() {
    const std::string name = ParseName();
    if (name.empty()) return Error("expected a rule name");
    SkipSpace(false);
    if (s_.substr(pos_, 3) != "::=") return Error(fmt::format("expected '::=' after '{}'", name));
    pos_ += 3;
    SkipSpace(true);
    const int id = RuleId(name);
    if (grammar_.rules[id].body) return Error(fmt::format("rule '{}' is defined twice", name));
    SY_ASSIGN_OR_RETURN(Expr body, ParseAlternates(false, 0));
    grammar_.rules[id].body = body;
    if (pos_ < s_.size() && s_[pos_] == '\r') ++pos_;
    if (pos_ < s_.size()) {
      if (s_[pos_] != '\n') {
        return Error(fmt::format("unexpected '{}' in rule '{}'", s_[pos_], name));
      }
      ++pos_;
    }
    SkipSpace(true);
    return Status::Ok();
  }

  Result<Expr> ParseAlternates(bool nested, int depth) {
    if (depth > limits_.max_nesting) return Error("groups nested too deeply");
    std::vector<Expr> alts;
    SY_ASSIGN_OR_RETURN(Expr first, ParseSequence(nested, depth));
    alts.push_back(first);
    while (pos_ < s_.size() && s_[pos_] == '|') {
      ++pos_;
      SkipSpace(true);
      SY_ASSIGN_OR_RETURN(Expr next, ParseSequence(nested, depth));
      alts.push_back(next);
    }
    return alts.size() == 1 ? alts[0] : Alt(std::move(alts));
  }

  // One code point of a literal or class, escapes decoded.
  Result<uint32_t> ParseChar() {
    if (s_[pos_] == '\\') {
      ++pos_;
      if (AtEnd()) return Error("a backslash at the end of the grammar");
      const char c = s_[pos_++];
      int hex_digits = 0;
      switch (c) {
        case 'x':
          hex_digits = 2;
          break;
        case 'u':
          hex_digits = 4;
          break;
        case 'U':
          hex_digits = 8;
          break;
        case 't':
          return uint32_t{'\t'};
        case 'r':
          return uint32_t{'\r'};
        case 'n':
          return uint32_t{'\n'};
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '\'':
          return static_cast<uint32_t>(c);
        default:
          return Error(fmt::format("an unknown escape '\\{}'", c));
      }
      uint32_t value = 0;
      for (int i = 0; i < hex_digits; ++i) {
        if (AtEnd()) return Error("a truncated hexadecimal escape");
        const char h = s_[pos_++];
        int v;
        if (h >= '0' && h <= '9') {
          v = h - '0';
        } else if (h >= 'a' && h <= 'f') {
          v = h - 'a' + 10;
        } else if (h >= 'A' && h <= 'F') {
          v = h - 'A' + 10;
        } else {
          return Error("an invalid hexadecimal escape");
        }
        value = value * 16 + v;
      }
      if (value > CodepointSet::kMax || (value >= 0xD800 && value <= 0xDFFF)) {
        return Error("an escape that is not a Unicode scalar value");
      }
      return value;
    }
    uint32_t cp;
    if (!DecodeUtf8(s_, &pos_, &cp)) return Error("invalid UTF-8");
    return cp;
  }

  Result<Expr> ParseSequence(bool nested, int depth) {
    std::vector<Expr> items;
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        std::string bytes;
        while (true) {
          if (AtEnd() || s_[pos_] == '\n') return Error("an unterminated string literal");
          if (s_[pos_] == '"') break;
          SY_ASSIGN_OR_RETURN(uint32_t cp, ParseChar());
          AppendUtf8(cp, &bytes);
        }
        ++pos_;
        items.push_back(Literal(bytes));
      } else if (c == '[') {
        ++pos_;
        bool negate = false;
        if (pos_ < s_.size() && s_[pos_] == '^') negate = true, ++pos_;
        CodepointSet set;
        while (true) {
          if (AtEnd() || s_[pos_] == '\n') return Error("an unterminated character class");
          if (s_[pos_] == ']') break;
          SY_ASSIGN_OR_RETURN(uint32_t lo, ParseChar());
          uint32_t hi = lo;
          if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
            ++pos_;
            SY_ASSIGN_OR_RETURN(hi, ParseChar());
            if (hi < lo) return Error("a character class range out of order");
          }
          set.Add(lo, hi);
        }
        ++pos_;
        items.push_back(Utf8(negate ? set.Complement() : set));
      } else if (IsWordChar(c)) {
        items.push_back(Ref(RuleId(ParseName())));
      } else if (c == '(') {
        ++pos_;
        SkipSpace(true);
        SY_ASSIGN_OR_RETURN(Expr inner, ParseAlternates(true, depth + 1));
        if (AtEnd() || s_[pos_] != ')') return Error("missing ')'");
        ++pos_;
        items.push_back(inner);
      } else if (c == '.') {
        ++pos_;
        items.push_back(Utf8(CodepointSet::All()));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (items.empty()) return Error(fmt::format("'{}' with nothing before it to repeat", c));
        int min = 0, max = -1;
        ++pos_;
        if (c == '+') min = 1;
        if (c == '?') max = 1;
        if (c == '{') {
          SkipSpace(false);
          SY_ASSIGN_OR_RETURN(int lo, ParseInt(/*optional=*/true));
          min = lo < 0 ? 0 : lo;
          SkipSpace(false);
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            SkipSpace(false);
            SY_ASSIGN_OR_RETURN(max, ParseInt(/*optional=*/true));
          } else {
            if (lo < 0) return Error("a repetition '{}' without a count");
            max = min;
          }
          SkipSpace(false);
          if (AtEnd() || s_[pos_] != '}') return Error("expected '}' closing a repetition");
          ++pos_;
          if (max >= 0 && max < min) return Error("a repetition {m,n} with n < m");
        }
        items.back() = Repeat(items.back(), min, max);
      } else if (c == '<') {
        return Error("token references (<...>) are not supported");
      } else {
        break;
      }
      SkipSpace(nested);
    }
    return Seq(std::move(items));
  }

  // A decimal number, or -1 when `optional` and there is none.
  Result<int> ParseInt(bool optional) {
    const size_t start = pos_;
    int64_t value = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      value = value * 10 + (s_[pos_++] - '0');
      if (value > limits_.max_repeat) {
        return Error(fmt::format("a repetition bound over {}", limits_.max_repeat));
      }
    }
    if (pos_ == start) {
      if (optional) return -1;
      return Error("expected a number");
    }
    return static_cast<int>(value);
  }

  std::string_view s_;
  const GrammarLimits& limits_;
  size_t pos_ = 0;
  Grammar grammar_;
  std::unordered_map<std::string, int> ids_;
  std::vector<size_t> first_use_pos_;
};

}  // namespace

Result<Grammar> GbnfGrammar(std::string_view text, const GrammarLimits& limits) {
  if (text.size() > limits.max_source_bytes) {
    return Status::Errorf("the grammar is longer than {} bytes", limits.max_source_bytes);
  }
  GbnfParser parser(text, limits);
  return parser.Parse();
}

}  // namespace sy::structured
