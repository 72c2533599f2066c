#include "structured/regex.h"

namespace sy::structured {
namespace {

CodepointSet Digits() {
  return CodepointSet::Range('0', '9');
}
CodepointSet Word() {
  CodepointSet s = CodepointSet::Range('a', 'z');
  s.Add('A', 'Z');
  s.Add('0', '9');
  s.Add('_', '_');
  return s;
}
// ECMAScript's WhiteSpace and LineTerminator.
CodepointSet Space() {
  CodepointSet s = CodepointSet::Range('\t', '\r');
  for (uint32_t cp :
       {0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u, 0xFEFFu}) {
    s.Add(cp, cp);
  }
  s.Add(0x2000, 0x200A);
  return s;
}
CodepointSet LineTerminators() {
  CodepointSet s = CodepointSet::Of('\n');
  s.Add('\r', '\r');
  s.Add(0x2028, 0x2029);
  return s;
}

class RegexParser {
 public:
  RegexParser(std::string_view pattern, const ClassLowering& lower, const GrammarLimits& limits)
      : lower_(lower), limits_(limits) {
    size_t pos = 0;
    while (pos < pattern.size()) {
      uint32_t cp;
      if (!DecodeUtf8(pattern, &pos, &cp)) {
        invalid_utf8_ = true;
        break;
      }
      cps_.push_back(cp);
    }
  }

  Result<Expr> Parse(bool search) {
    if (invalid_utf8_) return Status::Error("the pattern is not valid UTF-8");
    bool anchored_start = false, anchored_end = false;
    if (!cps_.empty() && cps_[0] == '^') anchored_start = true, pos_ = 1;
    SY_ASSIGN_OR_RETURN(Expr body, ParseAlternation(0));
    if (pos_ < cps_.size() && cps_[pos_] == '$') anchored_end = true, ++pos_;
    if (pos_ < cps_.size()) {
      if (cps_[pos_] == ')') return Error("unmatched ')'");
      if (cps_[pos_] == '$') return Error("'$' is only supported at the end of the pattern");
      return Error("unexpected character");
    }
    if (!search) return body;
    const Expr any = Star(lower_(CodepointSet::All()));
    return Seq({anchored_start ? Epsilon() : any, body, anchored_end ? Epsilon() : any});
  }

 private:
  Status Error(std::string_view what) const {
    return Status::Errorf("{} at character {} of the pattern", what, pos_);
  }
  bool AtEnd() const { return pos_ >= cps_.size(); }
  uint32_t Peek() const { return cps_[pos_]; }

  Result<Expr> ParseAlternation(int depth) {
    if (depth > limits_.max_nesting) return Error("groups nested too deeply");
    std::vector<Expr> branches;
    SY_ASSIGN_OR_RETURN(Expr first, ParseSequence(depth));
    branches.push_back(first);
    while (!AtEnd() && Peek() == '|') {
      ++pos_;
      SY_ASSIGN_OR_RETURN(Expr next, ParseSequence(depth));
      branches.push_back(next);
    }
    return branches.size() == 1 ? branches[0] : Alt(std::move(branches));
  }

  Result<Expr> ParseSequence(int depth) {
    std::vector<Expr> items;
    while (!AtEnd()) {
      const uint32_t c = Peek();
      if (c == '|' || c == ')') break;
      if (c == '$') {
        if (depth == 0 && pos_ + 1 == cps_.size()) break;
        return Error("'$' is only supported at the end of the pattern");
      }
      if (c == '^') return Error("'^' is only supported at the start of the pattern");
      if (c == '*' || c == '+' || c == '?') return Error("nothing to repeat before a quantifier");
      if (c == '{' && IsQuantifierAt(pos_)) return Error("nothing to repeat before a quantifier");
      SY_ASSIGN_OR_RETURN(Expr atom, ParseAtom(depth));
      SY_ASSIGN_OR_RETURN(atom, ParseQuantifiers(std::move(atom)));
      items.push_back(std::move(atom));
    }
    return Seq(std::move(items));
  }

  bool IsQuantifierAt(size_t p) const {
    if (p >= cps_.size() || cps_[p] != '{') return false;
    size_t i = p + 1;
    size_t digits = 0;
    while (i < cps_.size() && cps_[i] >= '0' && cps_[i] <= '9')
      ++i, ++digits;
    if (digits == 0) return false;
    if (i < cps_.size() && cps_[i] == ',') {
      ++i;
      while (i < cps_.size() && cps_[i] >= '0' && cps_[i] <= '9')
        ++i;
    }
    return i < cps_.size() && cps_[i] == '}';
  }

  Result<int> ParseNumber() {
    int64_t value = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      value = value * 10 + (Peek() - '0');
      if (value > limits_.max_repeat) {
        return Status::Errorf("a repetition bound over {} at character {} of the pattern",
                              limits_.max_repeat, pos_);
      }
      ++pos_;
    }
    return static_cast<int>(value);
  }

  Result<Expr> ParseQuantifiers(Expr atom) {
    while (!AtEnd()) {
      const uint32_t c = Peek();
      int min, max;
      if (c == '*') {
        min = 0, max = -1, ++pos_;
      } else if (c == '+') {
        min = 1, max = -1, ++pos_;
      } else if (c == '?') {
        min = 0, max = 1, ++pos_;
      } else if (c == '{' && IsQuantifierAt(pos_)) {
        ++pos_;
        SY_ASSIGN_OR_RETURN(min, ParseNumber());
        max = min;
        if (Peek() == ',') {
          ++pos_;
          if (Peek() == '}') {
            max = -1;
          } else {
            SY_ASSIGN_OR_RETURN(max, ParseNumber());
          }
        }
        ++pos_;  // '}'
        if (max >= 0 && max < min) return Error("a repetition {m,n} with n < m");
      } else {
        break;
      }
      if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: the same language
      if (!AtEnd() && (Peek() == '*' || Peek() == '+' || (Peek() == '{' && IsQuantifierAt(pos_)))) {
        return Error("a quantifier directly after a quantifier");
      }
      atom = Repeat(std::move(atom), min, max);
    }
    return atom;
  }

  Result<Expr> ParseAtom(int depth) {
    const uint32_t c = cps_[pos_++];
    switch (c) {
      case '(': {
        if (!AtEnd() && Peek() == '?') {
          ++pos_;
          if (AtEnd()) return Error("unterminated group");
          const uint32_t k = Peek();
          if (k == ':') {
            ++pos_;
          } else if (k == '=' || k == '!') {
            return Error("lookahead assertions are not supported");
          } else if (k == '<' && pos_ + 1 < cps_.size() &&
                     (cps_[pos_ + 1] == '=' || cps_[pos_ + 1] == '!')) {
            return Error("lookbehind assertions are not supported");
          } else if (k == '<') {
            while (!AtEnd() && Peek() != '>')
              ++pos_;
            if (AtEnd()) return Error("unterminated group name");
            ++pos_;
          } else {
            return Error("inline flags and other (?...) groups are not supported");
          }
        }
        SY_ASSIGN_OR_RETURN(Expr inner, ParseAlternation(depth + 1));
        if (AtEnd() || Peek() != ')') return Error("missing ')'");
        ++pos_;
        return inner;
      }
      case '[': {
        SY_ASSIGN_OR_RETURN(CodepointSet set, ParseClass());
        return lower_(set);
      }
      case '.':
        return lower_(LineTerminators().Complement());
      case '\\': {
        SY_ASSIGN_OR_RETURN(CodepointSet set, ParseEscape(/*in_class=*/false));
        return lower_(set);
      }
      case ']':
      case '}':
      default:
        return lower_(CodepointSet::Of(c));
    }
  }

  Result<uint32_t> ParseHex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      if (AtEnd()) return Error("a truncated hexadecimal escape");
      const uint32_t h = Peek();
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
      ++pos_;
    }
    return value;
  }

  // After a backslash: the set it stands for.
  Result<CodepointSet> ParseEscape(bool in_class) {
    if (AtEnd()) return Error("a pattern ending in a backslash");
    const uint32_t c = cps_[pos_++];
    switch (c) {
      case 'd':
        return Digits();
      case 'D':
        return Digits().Complement();
      case 'w':
        return Word();
      case 'W':
        return Word().Complement();
      case 's':
        return Space();
      case 'S':
        return Space().Complement();
      case 'n':
        return CodepointSet::Of('\n');
      case 'r':
        return CodepointSet::Of('\r');
      case 't':
        return CodepointSet::Of('\t');
      case 'f':
        return CodepointSet::Of('\f');
      case 'v':
        return CodepointSet::Of('\v');
      case '0':
        if (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
          return Error("octal escapes are not supported");
        }
        return CodepointSet::Of(0);
      case 'b':
        if (in_class) return CodepointSet::Of('\b');
        return Error("word boundaries (\\b) are not supported");
      case 'B':
        return Error("word boundaries (\\B) are not supported");
      case 'k':
        return Error("backreferences (\\k<name>) are not supported");
      case 'p':
      case 'P':
        return Error("Unicode property escapes (\\p{...}) are not supported");
      case 'c': {
        if (AtEnd() || !((Peek() >= 'a' && Peek() <= 'z') || (Peek() >= 'A' && Peek() <= 'Z'))) {
          return Error("an invalid control escape \\c");
        }
        return CodepointSet::Of(cps_[pos_++] % 32);
      }
      case 'x': {
        SY_ASSIGN_OR_RETURN(uint32_t v, ParseHex(2));
        return CodepointSet::Of(v);
      }
      case 'u': {
        uint32_t v;
        if (!AtEnd() && Peek() == '{') {
          ++pos_;
          v = 0;
          int n = 0;
          while (!AtEnd() && Peek() != '}') {
            SY_ASSIGN_OR_RETURN(uint32_t digit, ParseHex(1));
            v = v * 16 + digit;
            if (++n > 6 || v > CodepointSet::kMax) return Error("an invalid \\u{...} escape");
          }
          if (AtEnd() || n == 0) return Error("an invalid \\u{...} escape");
          ++pos_;
        } else {
          SY_ASSIGN_OR_RETURN(v, ParseHex(4));
          if (v >= 0xD800 && v <= 0xDBFF && pos_ + 1 < cps_.size() && cps_[pos_] == '\\' &&
              cps_[pos_ + 1] == 'u') {
            const size_t save = pos_;
            pos_ += 2;
            auto low = ParseHex(4);
            if (low.ok() && *low >= 0xDC00 && *low <= 0xDFFF) {
              v = 0x10000 + ((v - 0xD800) << 10) + (*low - 0xDC00);
            } else {
              pos_ = save;
            }
          }
        }
        if (v >= 0xD800 && v <= 0xDFFF) return Error("an unpaired surrogate escape");
        return CodepointSet::Of(v);
      }
      default:
        if (c >= '1' && c <= '9') return Error("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
          return Error(fmt::format("an unknown escape \\{}", static_cast<char>(c)));
        }
        return CodepointSet::Of(c);  // escaped punctuation or any other character
    }
  }

  Result<CodepointSet> ParseClassAtom(bool* is_single, uint32_t* single) {
    const uint32_t c = cps_[pos_++];
    if (c == '\\') {
      SY_ASSIGN_OR_RETURN(CodepointSet set, ParseEscape(/*in_class=*/true));
      *is_single = set.ranges().size() == 1 && set.ranges()[0].first == set.ranges()[0].second;
      *single = *is_single ? set.ranges()[0].first : 0;
      return set;
    }
    *is_single = true;
    *single = c;
    return CodepointSet::Of(c);
  }

  Result<CodepointSet> ParseClass() {
    bool negate = false;
    if (!AtEnd() && Peek() == '^') negate = true, ++pos_;
    CodepointSet set;
    while (true) {
      if (AtEnd()) return Error("missing ']'");
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      bool single_a = false;
      uint32_t a = 0;
      SY_ASSIGN_OR_RETURN(CodepointSet first, ParseClassAtom(&single_a, &a));
      if (!AtEnd() && Peek() == '-' && pos_ + 1 < cps_.size() && cps_[pos_ + 1] != ']') {
        ++pos_;
        bool single_b = false;
        uint32_t b = 0;
        SY_ASSIGN_OR_RETURN(CodepointSet second, ParseClassAtom(&single_b, &b));
        if (!single_a || !single_b) return Error("a class range with a class escape as an end");
        if (b < a) return Error("a class range out of order");
        set.Add(a, b);
      } else {
        set.Add(first);
      }
    }
    return negate ? set.Complement() : set;
  }

  const ClassLowering& lower_;
  const GrammarLimits& limits_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
  bool invalid_utf8_ = false;
};

}  // namespace

Result<Expr> ParseRegex(std::string_view pattern, const ClassLowering& lower, bool search,
                        const GrammarLimits& limits) {
  if (pattern.size() > limits.max_source_bytes) {
    return Status::Errorf("the pattern is longer than {} bytes", limits.max_source_bytes);
  }
  RegexParser parser(pattern, lower, limits);
  return parser.Parse(search);
}

Result<Grammar> RegexGrammar(std::string_view pattern, const GrammarLimits& limits) {
  SY_ASSIGN_OR_RETURN(Expr body, ParseRegex(pattern, Utf8, /*search=*/false, limits));
  Grammar g;
  g.root = g.AddRule("root", body);
  return g;
}

Result<Grammar> ChoiceGrammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return Status::Error("a choice needs at least one string");
  std::vector<Expr> alts;
  for (const auto& c : choices)
    alts.push_back(Literal(c));
  Grammar g;
  g.root = g.AddRule("root", Alt(std::move(alts)));
  return g;
}

}  // namespace sy::structured
