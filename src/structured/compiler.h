// Joins grammars with a tokenizer's vocabulary. GrammarCompiler holds the vocabulary (token id ->
// bytes, arranged as a byte trie so shared prefixes are matched once) and a cache of compiled
// grammars keyed by their source text. A CompiledGrammar holds the pushdown automaton and, per
// automaton state, the part of the token mask that does not depend on the parser's stack:
//
//   for a stack whose top frame is in state S, a token is ACCEPTED if its bytes can be read
//   without returning from S's rule (whatever lies below), REJECTED if every path dies inside the
//   rule, and UNCERTAIN if some path must return into the frame below first.
//
// These tables are computed on first use of a state and kept (thread-safe; shared by all
// requests on the grammar). A mask step then ORs the accepted sets of the current stacks' tops
// and runs only the uncertain tokens through the full parse state — exact, because the union of
// the three cases over every stack is precisely "the token continues some string".
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "structured/automaton.h"
#include "structured/grammar.h"

namespace sy::structured {

struct Vocabulary {
  std::vector<std::string> token_bytes;  // by id: the bytes the token stands for
  std::vector<uint8_t> special;          // 1: a control token, never allowed as text
  std::vector<int32_t> eos_ids;          // allowed exactly when the grammar is complete
  // Tokens a grammar may name (grammar.h SpecialToken): content -> id, the tokenizer's added
  // tokens. Such a token also matches its marker spelling (special or not); a non-special one
  // still matches its text as well.
  std::vector<std::pair<std::string, int32_t>> named_tokens;
  // By id: the marker of a named token, else empty, and which spellings a token has (bit 0 its
  // text, bit 1 a marker) — derived by GrammarCompiler, so the mask's hot loop reads one byte.
  std::vector<std::string> markers;
  std::vector<uint8_t> spellings;
  int32_t size() const { return static_cast<int32_t>(token_bytes.size()); }
  // Whether the token's bytes may be read as text: not special, not empty, and no 0xFF byte
  // (never in UTF-8; reserved for markers).
  bool IsText(int32_t id) const;
  // The id of a named token.
  std::optional<int32_t> NamedToken(std::string_view content) const;
  // The grammar spellings of a token: its text (IsText) and its marker (named), up to two.
  std::vector<std::string_view> Spellings(int32_t id) const;
};

// The vocabulary's spellings (Vocabulary::Spellings) as a byte trie in preorder; a named
// non-special token appears twice.
class TokenTrie {
 public:
  struct Node {
    uint8_t byte;
    int32_t depth;         // bytes from the root (the root itself is not stored)
    int32_t subtree_end;   // first node index after this node's descendants
    int32_t tokens_begin;  // into token_ids(): tokens whose bytes end here
    int32_t tokens_end;
  };
  explicit TokenTrie(const Vocabulary& vocab);
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
};

// A token bitmask: bit i of word i/64 is token i.
using TokenMask = std::vector<uint64_t>;

class CompiledGrammar {
 public:
  struct MaskEntry {
    std::vector<int32_t> accepted;  // when accepted_bits is empty
    std::vector<uint64_t> accepted_bits;
    std::vector<int32_t> uncertain;
    size_t Bytes() const {
      return (accepted.size() + uncertain.size()) * 4 + accepted_bits.size() * 8;
    }
  };

  CompiledGrammar(PushdownAutomaton automaton, std::shared_ptr<const Vocabulary> vocab,
                  std::shared_ptr<const TokenTrie> trie, std::string description);

  const PushdownAutomaton& automaton() const { return automaton_; }
  const Vocabulary* vocabulary() const { return vocab_.get(); }
  const std::string& description() const { return description_; }
  // The mask table of a state, computed on first use.
  std::shared_ptr<const MaskEntry> Entry(int32_t dfa_state) const;
  // Computes the tables of every state now (for measuring; bounded by `max_states`).
  void PrecomputeAll(size_t max_states) const;
  size_t cached_entries() const;

 private:
  std::shared_ptr<const MaskEntry> Compute(int32_t dfa_state) const;

  PushdownAutomaton automaton_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::shared_ptr<const TokenTrie> trie_;
  std::string description_;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const MaskEntry>> entries_;
  mutable size_t cache_bytes_ = 0;
  static constexpr size_t kMaxCacheBytes = size_t{64} << 20;  // beyond: computed, not kept
};

// What a request asks for, in one of the front ends' languages.
struct GrammarSpec {
  // kStructural: a composition of literal text, named tokens and JSON schemas (structural.h),
  // which tool-call formats are written in.
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGbnf, kStructural };
  GrammarSpec() = default;
  GrammarSpec(Kind kind, std::string text, std::vector<std::string> choices = {},
              std::string begin_after = {})
      : kind(kind),
        text(std::move(text)),
        choices(std::move(choices)),
        begin_after(std::move(begin_after)) {}
  Kind kind = Kind::kJsonSchema;
  std::string text;                  // schema JSON, regex, GBNF; unused for kJsonObject
  std::vector<std::string> choices;  // kChoice
  // When set, the grammar applies only after this named token (a reasoning model's "</think>"):
  // before it any token but end-of-sequence may come (GrammarMatcher's free phase). Not part of
  // the compiled grammar.
  std::string begin_after;
  std::string CacheKey() const;
};

// The front ends, no vocabulary involved: spec -> grammar.
Result<Grammar> BuildGrammar(const GrammarSpec& spec, const GrammarLimits& limits);

// Spec -> automaton without a vocabulary (byte-level matching, tests).
Result<std::shared_ptr<const CompiledGrammar>> CompileForBytes(const GrammarSpec& spec,
                                                               const GrammarLimits& limits = {});

// Whether the spec compiles (CompileForBytes with the default limits), the verdict remembered by
// the spec's text (up to 64 MB of texts; then forgotten and relearned), so a server checking the
// same schema on every request compiles it once. Thread-safe.
Status CheckCompiles(const GrammarSpec& spec);

class GrammarCompiler {
 public:
  explicit GrammarCompiler(Vocabulary vocab, GrammarLimits limits = {},
                           size_t max_cached_grammars = 256);
  Result<std::shared_ptr<const CompiledGrammar>> Compile(const GrammarSpec& spec);
  const Vocabulary& vocabulary() const { return *vocab_; }

 private:
  std::shared_ptr<const Vocabulary> vocab_;
  std::shared_ptr<const TokenTrie> trie_;
  GrammarLimits limits_;
  size_t max_cached_;
  std::mutex mu_;
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<const CompiledGrammar>,
                                            std::list<std::string>::iterator>>
      cache_;
};

}  // namespace sy::structured
