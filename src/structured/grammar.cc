#include "structured/grammar.h"

#include <algorithm>
#include <unordered_map>

namespace sy::structured {
namespace {

Expr Make(ExprNode::Kind kind, ByteSet bytes = {}, std::vector<Expr> children = {}, int min = 0,
          int max = 0, int rule = -1) {
  auto node = std::make_shared<ExprNode>();
  node->kind = kind;
  node->bytes = bytes;
  node->children = std::move(children);
  node->min = min;
  node->max = max;
  node->rule = rule;
  return node;
}

// Nested sequences and alternations are inlined into their parent only when small: a shared
// tail (an object's remaining members) must stay one node, or building chains gets quadratic.
constexpr size_t kFlattenMax = 4;

bool IsEmptyLanguage(const Expr& e) {
  return e->kind == ExprNode::Kind::kBytes && e->bytes.none();
}
bool IsEpsilon(const Expr& e) {
  return e->kind == ExprNode::Kind::kSeq && e->children.empty();
}

}  // namespace

Expr Epsilon() {
  static const Expr kEpsilon = Make(ExprNode::Kind::kSeq);
  return kEpsilon;
}

Expr Nothing() {
  static const Expr kNothing = Make(ExprNode::Kind::kBytes);
  return kNothing;
}

Expr Bytes(const ByteSet& set) {
  return Make(ExprNode::Kind::kBytes, set);
}

Expr Byte(uint8_t b) {
  ByteSet set;
  set.set(b);
  return Bytes(set);
}

Expr ByteRange(uint8_t lo, uint8_t hi) {
  ByteSet set;
  for (int b = lo; b <= hi; ++b)
    set.set(b);
  return Bytes(set);
}

Expr Literal(std::string_view bytes) {
  std::vector<Expr> items;
  items.reserve(bytes.size());
  for (unsigned char c : bytes)
    items.push_back(Byte(c));
  return Seq(std::move(items));
}

Expr Seq(std::vector<Expr> items) {
  std::vector<Expr> flat;
  for (auto& item : items) {
    if (IsEmptyLanguage(item)) return Nothing();
    if (IsEpsilon(item)) continue;
    if (item->kind == ExprNode::Kind::kSeq && item->children.size() <= kFlattenMax) {
      flat.insert(flat.end(), item->children.begin(), item->children.end());
    } else {
      flat.push_back(std::move(item));
    }
  }
  if (flat.size() == 1) return flat[0];
  return Make(ExprNode::Kind::kSeq, {}, std::move(flat));
}

Expr Alt(std::vector<Expr> items) {
  std::vector<Expr> kept;
  ByteSet merged;  // single-byte alternatives become one set
  bool any_bytes = false;
  for (auto& item : items) {
    if (IsEmptyLanguage(item)) continue;
    if (item->kind == ExprNode::Kind::kBytes) {
      merged |= item->bytes;
      any_bytes = true;
    } else if (item->kind == ExprNode::Kind::kAlt && item->children.size() <= kFlattenMax) {
      kept.insert(kept.end(), item->children.begin(), item->children.end());
    } else {
      kept.push_back(std::move(item));
    }
  }
  if (any_bytes) kept.insert(kept.begin(), Bytes(merged));
  if (kept.empty()) return Nothing();
  if (kept.size() == 1) return kept[0];
  return Make(ExprNode::Kind::kAlt, {}, std::move(kept));
}

Expr Repeat(Expr e, int min, int max) {
  if (max >= 0 && max < min) return Nothing();
  if (max == 0 || IsEpsilon(e)) return Epsilon();
  if (IsEmptyLanguage(e)) return min == 0 ? Epsilon() : Nothing();
  if (min == 1 && max == 1) return e;
  return Make(ExprNode::Kind::kRepeat, {}, {std::move(e)}, min, max);
}

Expr Ref(int rule) {
  return Make(ExprNode::Kind::kRef, {}, {}, 0, 0, rule);
}

std::string TokenMarker(std::string_view content) {
  std::string marker = "\xFF";
  marker += content;
  marker += '\xFF';
  return marker;
}

namespace {

// `e` with every rule reference moved by `offset`; subtrees without references are shared.
Expr ShiftRefs(const Expr& e, int offset, std::unordered_map<const ExprNode*, Expr>& memo) {
  if (auto it = memo.find(e.get()); it != memo.end()) return it->second;
  Expr out = e;
  if (e->kind == ExprNode::Kind::kRef) {
    out = Ref(e->rule + offset);
  } else if (!e->children.empty()) {
    std::vector<Expr> children;
    bool changed = false;
    for (const Expr& c : e->children) {
      children.push_back(ShiftRefs(c, offset, memo));
      changed |= children.back() != c;
    }
    if (changed) out = Make(e->kind, e->bytes, std::move(children), e->min, e->max, e->rule);
  }
  memo.emplace(e.get(), out);
  return out;
}

}  // namespace

int ImportGrammar(Grammar& into, const Grammar& from, std::string_view prefix) {
  const int offset = static_cast<int>(into.rules.size());
  std::unordered_map<const ExprNode*, Expr> memo;
  for (const Rule& rule : from.rules)
    into.AddRule(std::string(prefix) + rule.name,
                 rule.body ? ShiftRefs(rule.body, offset, memo) : nullptr);
  return offset + from.root;
}

// ---- code point sets ----

CodepointSet CodepointSet::All() {
  CodepointSet s;
  s.ranges_ = {{0, 0xD7FF}, {0xE000, kMax}};
  return s;
}

CodepointSet CodepointSet::Range(uint32_t lo, uint32_t hi) {
  CodepointSet s;
  s.Add(lo, hi);
  return s;
}

void CodepointSet::Add(uint32_t lo, uint32_t hi) {
  hi = std::min(hi, kMax);
  if (lo > hi) return;
  ranges_.push_back({lo, hi});
  Normalize();
}

void CodepointSet::Add(const CodepointSet& other) {
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  Normalize();
}

void CodepointSet::Normalize() {
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const auto& r : ranges_) {
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  ranges_ = std::move(out);
}

CodepointSet CodepointSet::Complement() const {
  return All().Minus(*this);
}

CodepointSet CodepointSet::Minus(const CodepointSet& other) const {
  CodepointSet out;
  for (auto [lo, hi] : ranges_) {
    uint32_t cur = lo;
    bool open = true;
    for (auto [olo, ohi] : other.ranges_) {
      if (ohi < cur || olo > hi) continue;
      if (olo > cur) out.ranges_.push_back({cur, olo - 1});
      if (ohi >= hi) {
        open = false;
        break;
      }
      cur = ohi + 1;
    }
    if (open && cur <= hi) out.ranges_.push_back({cur, hi});
  }
  out.Normalize();
  return out;
}

bool CodepointSet::Contains(uint32_t cp) const {
  for (auto [lo, hi] : ranges_) {
    if (cp >= lo && cp <= hi) return true;
  }
  return false;
}

namespace {

// Splits [lo, hi] (one encoding length, no surrogates) into ranges whose UTF-8 encodings are
// byte-wise products of byte ranges (the construction of Rust's regex-syntax utf8 module).
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<Expr>* out) {
  std::vector<std::pair<uint32_t, uint32_t>> work = {{lo, hi}};
  while (!work.empty()) {
    auto [start, end] = work.back();
    work.pop_back();
    bool split = false;
    for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
      if (start <= max && max < end) {
        work.push_back({max + 1, end});
        work.push_back({start, max});
        split = true;
        break;
      }
    }
    if (split) continue;
    for (int i = 1; i < 4 && !split; ++i) {
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((start & ~m) != (end & ~m)) {
        if ((start & m) != 0) {
          work.push_back({(start | m) + 1, end});
          work.push_back({start, start | m});
          split = true;
        } else if ((end & m) != m) {
          work.push_back({end & ~m, end});
          work.push_back({start, (end & ~m) - 1});
          split = true;
        }
      }
    }
    if (split) continue;
    std::string a, b;
    AppendUtf8(start, &a);
    AppendUtf8(end, &b);
    std::vector<Expr> seq;
    for (size_t k = 0; k < a.size(); ++k) {
      seq.push_back(ByteRange(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])));
    }
    out->push_back(Seq(std::move(seq)));
  }
}

}  // namespace

Expr Utf8(const CodepointSet& set) {
  std::vector<Expr> alts;
  const CodepointSet valid = set.Minus(CodepointSet::Range(0xD800, 0xDFFF));
  for (auto [lo, hi] : valid.ranges())
    Utf8Sequences(lo, hi, &alts);
  return Alt(std::move(alts));
}

Status Grammar::Validate() const {
  if (rules.empty()) return Status::Error("the grammar has no rules");
  if (root < 0 || root >= static_cast<int>(rules.size())) {
    return Status::Error("the grammar's root rule is missing");
  }
  for (const auto& rule : rules) {
    if (!rule.body) return Status::Errorf("rule '{}' has no definition", rule.name);
  }
  return Status::Ok();
}

}  // namespace sy::structured
