#include "structured/json_lexical.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace sy::structured {

Expr JsonWhitespace() {
  static const Expr kWs = Optional(Alt({Byte(' '), Seq({Byte('\n'), Repeat(Byte(' '), 0, 40)})}));
  return kWs;
}

namespace {

// Characters written raw inside a string literal.
const CodepointSet& RawChars() {
  static const CodepointSet kRaw = [] {
    CodepointSet s = CodepointSet::All();
    CodepointSet escaped = CodepointSet::Range(0, 0x1F);
    escaped.Add('"', '"');
    escaped.Add('\\', '\\');
    return s.Minus(escaped);
  }();
  return kRaw;
}

std::string EscapeOf(uint32_t cp) {
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    default:
      return fmt::format("\\u{:04x}", cp);
  }
}

const Expr& Digit() {
  static const Expr kDigit = ByteRange('0', '9');
  return kDigit;
}

}  // namespace

Expr JsonChars(const CodepointSet& set) {
  // Raw characters, then one backslash followed by a short escape or u00 and two hex digits.
  ByteSet short_escapes;
  std::vector<Expr> unicode_escapes;
  for (uint32_t high = 0; high < 2; ++high) {
    ByteSet low_digits;
    for (uint32_t low = 0; low < 16; ++low) {
      const uint32_t cp = high * 16 + low;
      if (!set.Contains(cp)) continue;
      const std::string e = EscapeOf(cp);
      if (e.size() == 2) {
        short_escapes.set(static_cast<uint8_t>(e[1]));
      } else {
        low_digits.set(static_cast<uint8_t>(e[5]));
      }
    }
    if (low_digits.any()) unicode_escapes.push_back(Seq({Byte('0' + high), Bytes(low_digits)}));
  }
  if (set.Contains('"')) short_escapes.set('"');
  if (set.Contains('\\')) short_escapes.set('\\');
  std::vector<Expr> escapes = {Bytes(short_escapes)};
  if (!unicode_escapes.empty()) {
    escapes.push_back(Seq({Literal("u00"), Alt(std::move(unicode_escapes))}));
  }
  return Alt(
      {Utf8(set.Minus(RawChars().Complement())), Seq({Byte('\\'), Alt(std::move(escapes))})});
}

Expr JsonString(int min_length, int max_length) {
  static const Expr kAny = JsonChars(CodepointSet::All());
  return Seq({Byte('"'), Repeat(kAny, min_length, max_length), Byte('"')});
}

std::string JsonStringLiteral(std::string_view utf8) {
  std::string out = "\"";
  size_t pos = 0;
  while (pos < utf8.size()) {
    uint32_t cp;
    const size_t start = pos;
    if (!DecodeUtf8(utf8, &pos, &cp)) {  // not UTF-8: keep the byte (never matches a grammar)
      out.push_back(utf8[pos++]);
      continue;
    }
    if (cp < 0x20 || cp == '"' || cp == '\\') {
      out += EscapeOf(cp);
    } else {
      out.append(utf8.substr(start, pos - start));
    }
  }
  out.push_back('"');
  return out;
}

Expr JsonStringExcept(const std::vector<std::string>& names) {
  // A trie of the names' characters; at each node: end here (unless a name ends here), follow a
  // child, or leave the trie with any other character and continue freely.
  struct TrieNode {
    std::vector<std::pair<uint32_t, int>> children;
    bool terminal = false;
  };
  std::vector<TrieNode> trie(1);
  for (const auto& name : names) {
    int node = 0;
    size_t pos = 0;
    bool valid = true;
    std::vector<uint32_t> cps;
    while (pos < name.size()) {
      uint32_t cp;
      if (!DecodeUtf8(name, &pos, &cp)) {
        valid = false;
        break;
      }
      cps.push_back(cp);
    }
    if (!valid) continue;  // no spelling of an invalid name exists anyway
    for (uint32_t cp : cps) {
      auto it = std::find_if(trie[node].children.begin(), trie[node].children.end(),
                             [&](const auto& c) { return c.first == cp; });
      if (it == trie[node].children.end()) {
        trie[node].children.push_back({cp, static_cast<int>(trie.size())});
        const int child = static_cast<int>(trie.size());
        trie.emplace_back();
        node = child;
      } else {
        node = it->second;
      }
    }
    trie[node].terminal = true;
  }
  static const Expr kAnyChars = Star(JsonChars(CodepointSet::All()));
  std::vector<Expr> built(trie.size());
  for (int n = static_cast<int>(trie.size()) - 1; n >= 0; --n) {  // children have larger ids
    std::vector<Expr> alts;
    if (!trie[n].terminal) alts.push_back(Epsilon());
    CodepointSet others = CodepointSet::All();
    for (auto [cp, child] : trie[n].children) {
      alts.push_back(Seq({JsonChars(CodepointSet::Of(cp)), built[child]}));
      others = others.Minus(CodepointSet::Of(cp));
    }
    alts.push_back(Seq({JsonChars(others), kAnyChars}));
    built[n] = Alt(std::move(alts));
  }
  return Seq({Byte('"'), built[0], Byte('"')});
}

// ---- numbers ----

std::optional<Decimal> Decimal::Parse(std::string_view text) {
  size_t i = 0;
  Decimal d;
  if (i < text.size() && text[i] == '-') d.negative = true, ++i;
  std::string mantissa;
  int64_t point = 0;
  const size_t int_start = i;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9')
    mantissa.push_back(text[i++]);
  if (i == int_start) return std::nullopt;
  point = static_cast<int64_t>(mantissa.size());
  if (i < text.size() && text[i] == '.') {
    ++i;
    const size_t frac_start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9')
      mantissa.push_back(text[i++]);
    if (i == frac_start) return std::nullopt;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool neg = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) neg = text[i++] == '-';
    int64_t exp = 0;
    const size_t exp_start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      exp = exp * 10 + (text[i++] - '0');
      if (exp > 1000) return std::nullopt;
    }
    if (i == exp_start) return std::nullopt;
    point += neg ? -exp : exp;
  }
  if (i != text.size()) return std::nullopt;
  if (point < 0) {
    mantissa.insert(0, static_cast<size_t>(-point), '0');
    point = 0;
  }
  if (point > static_cast<int64_t>(mantissa.size())) mantissa.append(point - mantissa.size(), '0');
  d.integer = mantissa.substr(0, point);
  d.fraction = mantissa.substr(point);
  d.integer.erase(0, std::min(d.integer.find_first_not_of('0'), d.integer.size()));
  if (d.integer.empty()) d.integer = "0";
  while (!d.fraction.empty() && d.fraction.back() == '0')
    d.fraction.pop_back();
  if (d.IsZero()) d.negative = false;
  return d;
}

Result<Decimal> Decimal::FromJson(const nlohmann::ordered_json& number) {
  std::string text;
  if (number.is_number_unsigned()) {
    text = std::to_string(number.get<uint64_t>());
  } else if (number.is_number_integer()) {
    text = std::to_string(number.get<int64_t>());
  } else if (number.is_number_float()) {
    const double v = number.get<double>();
    if (!std::isfinite(v)) return Status::Error("a number that is not finite");
    text = fmt::format("{}", v);  // shortest round-trip spelling: 1.1, not 1.1000000000000001
  } else {
    return Status::Error("expected a number");
  }
  auto d = Parse(text);
  if (!d) return Status::Errorf("the number {} is out of the supported range", text);
  return *d;
}

std::string Decimal::ToString() const {
  std::string s = negative ? "-" : "";
  s += integer;
  if (!fraction.empty()) s += "." + fraction;
  return s;
}

namespace {
int CompareMagnitude(const Decimal& a, const Decimal& b) {
  if (a.integer.size() != b.integer.size()) return a.integer.size() < b.integer.size() ? -1 : 1;
  if (int c = a.integer.compare(b.integer); c != 0) return c < 0 ? -1 : 1;
  const size_t n = std::max(a.fraction.size(), b.fraction.size());
  for (size_t i = 0; i < n; ++i) {
    const char x = i < a.fraction.size() ? a.fraction[i] : '0';
    const char y = i < b.fraction.size() ? b.fraction[i] : '0';
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}
}  // namespace

int Compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int m = CompareMagnitude(a, b);
  return a.negative ? -m : m;
}

namespace {

// Non-negative decimals in [lo, hi] (hi absent: unbounded), digit by digit. A path is "tight"
// against a bound while its digits equal the bound's; it leaves the range when a digit crosses
// a tight bound, and is free once no bound is tight.
class NonNegativeRange {
 public:
  NonNegativeRange(const Decimal& lo, bool lo_incl, const std::optional<Decimal>& hi, bool hi_incl,
                   bool integer_only)
      : lo_(lo), lo_incl_(lo_incl), hi_(hi), hi_incl_(hi_incl), integer_only_(integer_only) {}

  Result<Expr> Build() {
    const int min_len = static_cast<int>(lo_.integer.size());
    const int max_len = hi_ ? static_cast<int>(hi_->integer.size()) : min_len;
    if (max_len > 400) return Status::Error("a numeric bound with more than 400 digits");
    std::vector<Expr> alts;
    for (int len = min_len; len <= max_len; ++len) {
      alts.push_back(Rest(len, 0, len == min_len, hi_ && len == max_len));
    }
    if (!hi_) {  // longer integer parts than the lower bound's are all above it
      alts.push_back(Seq({ByteRange('1', '9'), Repeat(Digit(), min_len, -1), FreeFraction()}));
    }
    return Alt(std::move(alts));
  }

 private:
  Expr FreeFraction() const {
    return integer_only_ ? Epsilon() : Optional(Seq({Byte('.'), Plus(Digit())}));
  }
  static int DigitAt(const Decimal& b, int len, int p) {
    if (p < len) return b.integer[p] - '0';
    const int q = p - len;
    return q < static_cast<int>(b.fraction.size()) ? b.fraction[q] - '0' : 0;
  }
  // Whether the bound's digits from position p on are all zero.
  static bool RestZero(const Decimal& b, int len, int p) {
    for (int i = p; i < len; ++i) {
      if (b.integer[i] != '0') return false;
    }
    return p - len >= static_cast<int>(b.fraction.size()) || (p < len && b.fraction.empty());
  }
  bool CanEnd(int len, int p, bool tl, bool th) const {
    if (tl && !(RestZero(lo_, len, p) && lo_incl_)) return false;
    if (th && RestZero(*hi_, len, p) && !hi_incl_) return false;
    return true;
  }

  // The digits from position p (of an integer part `len` digits long) onwards.
  Expr Rest(int len, int p, bool tl, bool th) {
    if (p == len) {
      std::vector<Expr> alts;
      if (CanEnd(len, p, tl, th)) alts.push_back(Epsilon());
      if (!integer_only_) alts.push_back(Seq({Byte('.'), Fraction(len, p, tl, th, true)}));
      return Alt(std::move(alts));
    }
    if (!tl && !th) {
      const Expr first = (p == 0 && len > 1) ? ByteRange('1', '9') : Digit();
      return Seq({first, Repeat(Digit(), len - p - 1, len - p - 1), FreeFraction()});
    }
    return Digits(len, p, tl, th, (p == 0 && len > 1) ? 1 : 0,
                  [&](int np, bool ntl, bool nth) { return Rest(len, np, ntl, nth); });
  }

  // Fraction digits from position p; `need`: at least one more digit is required.
  Expr Fraction(int len, int p, bool tl, bool th, bool need) {
    const Expr zeros = need ? Plus(Byte('0')) : Star(Byte('0'));
    const Expr any = need ? Plus(Digit()) : Star(Digit());
    if (!tl && !th) return any;
    const bool lz = tl && RestZero(lo_, len, p);
    const bool hz = th && RestZero(*hi_, len, p);
    if (tl && th && lz && hz) return lo_incl_ && hi_incl_ ? zeros : Nothing();
    if (tl && lz && !th) {
      if (lo_incl_) return any;
      return Seq({Star(Byte('0')), ByteRange('1', '9'), Star(Digit())});
    }
    if (th && hz && !tl) return hi_incl_ ? zeros : Nothing();
    std::vector<Expr> alts;
    if (!need && CanEnd(len, p, tl, th)) alts.push_back(Epsilon());
    alts.push_back(Digits(len, p, tl, th, 0, [&](int np, bool ntl, bool nth) {
      return Fraction(len, np, ntl, nth, false);
    }));
    return Alt(std::move(alts));
  }

  template <typename Next>
  Expr Digits(int len, int p, bool tl, bool th, int min_digit, const Next& next) {
    const int lo_d = tl ? DigitAt(lo_, len, p) : 0;
    const int hi_d = th ? DigitAt(*hi_, len, p) : 9;
    std::vector<Expr> alts;
    int free_lo = -1, free_hi = -1;
    for (int d = std::max(lo_d, min_digit); d <= hi_d; ++d) {
      const bool ntl = tl && d == lo_d;
      const bool nth = th && d == hi_d;
      if (!ntl && !nth) {
        if (free_lo < 0) free_lo = d;
        free_hi = d;
        continue;
      }
      alts.push_back(Seq({Byte(static_cast<uint8_t>('0' + d)), next(p + 1, ntl, nth)}));
    }
    if (free_lo >= 0) {
      alts.push_back(
          Seq({ByteRange(static_cast<uint8_t>('0' + free_lo), static_cast<uint8_t>('0' + free_hi)),
               next(p + 1, false, false)}));
    }
    return Alt(std::move(alts));
  }

  const Decimal& lo_;
  bool lo_incl_;
  const std::optional<Decimal>& hi_;
  bool hi_incl_;
  bool integer_only_;
};

}  // namespace

Expr JsonInteger() {
  return Seq({Optional(Byte('-')), Alt({Byte('0'), Seq({ByteRange('1', '9'), Star(Digit())})})});
}

Expr JsonNumber() {
  return Seq({JsonInteger(), Optional(Seq({Byte('.'), Plus(Digit())})),
              Optional(Seq({Bytes([] {
                              ByteSet s;
                              s.set('e');
                              s.set('E');
                              return s;
                            }()),
                            Optional(Alt({Byte('+'), Byte('-')})), Plus(Digit())}))});
}

Result<Expr> JsonNumberInRange(const std::optional<NumberBound>& lo,
                               const std::optional<NumberBound>& hi, bool integer_only) {
  if (!lo && !hi) return integer_only ? JsonInteger() : JsonNumber();
  const Decimal zero;
  std::vector<Expr> alts;
  // x >= 0 part.
  if (!hi || !hi->value.negative) {
    Decimal from = zero;
    bool from_incl = true;
    if (lo && !lo->value.negative) from = lo->value, from_incl = lo->inclusive;
    std::optional<Decimal> to;
    if (hi) to = hi->value;
    NonNegativeRange range(from, from_incl, to, hi ? hi->inclusive : true, integer_only);
    SY_ASSIGN_OR_RETURN(Expr e, range.Build());
    alts.push_back(e);
  }
  // x < 0 part, as "-" and the magnitude y = -x > 0.
  if (!lo || lo->value.negative) {
    Decimal from = zero;
    bool from_incl = false;
    if (hi && hi->value.negative) {
      from = hi->value, from.negative = false, from_incl = hi->inclusive;
    }
    std::optional<Decimal> to;
    bool to_incl = true;
    if (lo) to = lo->value, to->negative = false, to_incl = lo->inclusive;
    NonNegativeRange range(from, from_incl, to, to_incl, integer_only);
    SY_ASSIGN_OR_RETURN(Expr e, range.Build());
    alts.push_back(Seq({Byte('-'), e}));
  }
  return Alt(std::move(alts));
}

// ---- canonical values ----

std::string CanonicalJson(const nlohmann::ordered_json& value) {
  switch (value.type()) {
    case nlohmann::ordered_json::value_t::null:
      return "null";
    case nlohmann::ordered_json::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
    case nlohmann::ordered_json::value_t::number_float: {
      auto d = Decimal::FromJson(value);
      return d.ok() ? d->ToString() : "null";
    }
    case nlohmann::ordered_json::value_t::string:
      return JsonStringLiteral(value.get_ref<const std::string&>());
    case nlohmann::ordered_json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < value.size(); ++i) {
        if (i) out += ",";
        out += CanonicalJson(value[i]);
      }
      return out + "]";
    }
    case nlohmann::ordered_json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : value.items()) {
        if (!first) out += ",";
        first = false;
        out += JsonStringLiteral(k) + ":" + CanonicalJson(v);
      }
      return out + "}";
    }
    default:
      return "null";
  }
}

std::optional<std::string> FormatRegex(std::string_view format) {
  static const std::string kDate =
      R"((\d{4}-(0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|\d{4}-(0[469]|11)-(0[1-9]|[12]\d|30)|)"
      R"(\d{4}-02-(0[1-9]|1\d|2[0-8])|(\d\d(0[48]|[2468][048]|[13579][26])|)"
      R"(([02468][048]|[13579][26])00)-02-29))";
  static const std::string kTime =
      R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
  static const std::string kAtom = R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)";
  static const std::string kLabel = R"([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)";
  static const std::string kPct = R"(%[0-9A-Fa-f]{2})";
  static const std::string kRegName = "([A-Za-z0-9._~!$&'()*+,;=-]|" + kPct + ")";
  static const std::string kPchar = "([A-Za-z0-9._~!$&'()*+,;=:@-]|" + kPct + ")";
  if (format == "date") return kDate;
  if (format == "time") return kTime;
  if (format == "date-time") return kDate + "T" + kTime;
  if (format == "email") {
    return kAtom + R"((\.)" + kAtom + ")*@" + kLabel + R"((\.)" + kLabel + ")*";
  }
  if (format == "uuid") {
    return R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})";
  }
  if (format == "ipv4") {
    return R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})";
  }
  if (format == "uri") {
    return "[A-Za-z][A-Za-z0-9+.-]*:(//" + kRegName + "*(:\\d*)?(/" + kPchar + "*)*|/?(" + kPchar +
           "+(/" + kPchar + "*)*)?)(\\?(" + kPchar + "|[/?])*)?(#(" + kPchar + "|[/?])*)?";
  }
  return std::nullopt;
}

}  // namespace sy::structured
