// The grammar every front end produces: rules over bytes. A rule's body is an expression tree of
// byte sets, sequences, alternations, bounded or unbounded repetitions and references to rules
// (recursion included). Expressions are immutable and shared (a DAG): front ends reuse a tail
// such as "the remaining object members" from several places without copying it, and the
// compiler (automaton.h) compiles a shared node once per continuation.
//
// Characters are UTF-8: CodepointSet lowers a set of code points to the byte sequences that
// encode them, so a class like [^"\\] is a language over bytes like everything else.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/utf8.h"  // AppendUtf8, DecodeUtf8

namespace sy::structured {

// Hard limits on what a grammar may cost, each reported by name when exceeded.
struct GrammarLimits {
  int64_t max_nfa_states = 1'000'000;  // after inlining every non-recursive rule
  int64_t max_dfa_states = 250'000;    // over all rules' automata
  int max_repeat = 10'000;             // the largest bound of one {m,n}
  int max_nesting = 200;               // nested groups / subschemas in a front end's input
  size_t max_source_bytes = 4u << 20;  // the text of a schema, regex or grammar
};

using ByteSet = std::bitset<256>;

struct ExprNode;
using Expr = std::shared_ptr<const ExprNode>;

struct ExprNode {
  enum class Kind { kBytes, kSeq, kAlt, kRepeat, kRef };
  Kind kind = Kind::kBytes;
  ByteSet bytes;               // kBytes: one byte from this set (empty: no string at all)
  std::vector<Expr> children;  // kSeq, kAlt; kRepeat: one child
  int min = 0, max = 0;        // kRepeat: max < 0 is unbounded
  int rule = -1;               // kRef
};

// Builders. An empty Seq is the empty string; an empty Alt (or Nothing()) is the empty language.
Expr Epsilon();
Expr Nothing();
Expr Byte(uint8_t b);
Expr Bytes(const ByteSet& set);
Expr ByteRange(uint8_t lo, uint8_t hi);
Expr Literal(std::string_view bytes);
Expr Seq(std::vector<Expr> items);
Expr Alt(std::vector<Expr> items);
Expr Repeat(Expr e, int min, int max);  // max < 0: unbounded
inline Expr Optional(Expr e) {
  return Repeat(std::move(e), 0, 1);
}
inline Expr Star(Expr e) {
  return Repeat(std::move(e), 0, -1);
}
inline Expr Plus(Expr e) {
  return Repeat(std::move(e), 1, -1);
}
Expr Ref(int rule);

// One vocabulary token named by its content (an added token such as "<｜tool▁calls▁begin｜>"),
// matched only as that single token, never as its text spelled in pieces. In the grammar it is
// its marker spelling: 0xFF, the content, 0xFF. No front end's language holds a 0xFF byte (it is
// never in UTF-8), and the compiler never lets an ordinary token carry one, so the marker can only
// be written by the token itself (compiler.h Vocabulary::named_tokens).
std::string TokenMarker(std::string_view content);
inline Expr SpecialToken(std::string_view content) {
  return Literal(TokenMarker(content));
}

// A set of Unicode scalar values as sorted, disjoint, inclusive ranges.
class CodepointSet {
 public:
  static constexpr uint32_t kMax = 0x10FFFF;
  CodepointSet() = default;
  static CodepointSet All();  // every scalar value (surrogates excluded)
  static CodepointSet Of(uint32_t cp) { return Range(cp, cp); }
  static CodepointSet Range(uint32_t lo, uint32_t hi);
  void Add(uint32_t lo, uint32_t hi);
  void Add(const CodepointSet& other);
  CodepointSet Complement() const;  // within All()
  CodepointSet Minus(const CodepointSet& other) const;
  bool Contains(uint32_t cp) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

 private:
  void Normalize();
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

// The UTF-8 encodings of the code points in `set` (surrogates never), as byte-set sequences.
Expr Utf8(const CodepointSet& set);

struct Rule {
  std::string name;
  Expr body;
};

struct Grammar {
  std::vector<Rule> rules;
  int root = 0;

  int AddRule(std::string name, Expr body = nullptr) {
    rules.push_back({std::move(name), std::move(body)});
    return static_cast<int>(rules.size()) - 1;
  }
  // Every rule has a body and every reference names a rule.
  Status Validate() const;
};

// Copies `from`'s rules into `into` (names prefixed, references renumbered) and returns the rule
// index `from`'s root got there: how a composite grammar embeds a JSON schema's.
int ImportGrammar(Grammar& into, const Grammar& from, std::string_view prefix);

}  // namespace sy::structured
