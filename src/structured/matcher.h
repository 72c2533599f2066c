// The per-request matcher: the parse state of one generation under a compiled grammar. Its
// whole interface is accept a token, fill the next token mask, roll back, and ask whether the
// output so far is complete. Not thread-safe (one per sequence); the CompiledGrammar it shares is.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "structured/compiler.h"
#include "structured/recognizer.h"

namespace sy::structured {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  // The grammar applies only after `begin_after` (GrammarSpec::begin_after's id): until that
  // token any token but end-of-sequence is allowed and nothing is matched (the free phase of a
  // reasoning model's thinking).
  GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, std::optional<int32_t> begin_after);

  // Advances by one token; an error (naming the token) leaves the state unchanged. An EOS id is
  // accepted exactly when IsComplete(); afterwards nothing more is.
  Status AcceptToken(int32_t id);
  // Advances by raw bytes (one rollback step); for tests and byte-level checks.
  Status AcceptBytes(std::string_view bytes);
  // Whether `bytes` would be accepted now (state unchanged).
  bool CanAcceptBytes(std::string_view bytes);
  // Sets bit i of `mask` (ceil(vocab/64) words, overwritten) iff token i may come next.
  void FillNextTokenMask(std::span<uint64_t> mask);
  // Undoes the last `steps` AcceptToken/AcceptBytes calls.
  Status Rollback(int steps);
  bool IsComplete() const { return !history_.back().free && history_.back().state.complete; }
  // Still before the begin_after token.
  bool IsFree() const { return history_.back().free; }
  bool IsTerminated() const { return history_.back().terminated; }
  int steps() const { return static_cast<int>(history_.size()) - 1; }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  struct Snapshot {
    ParseState state;
    size_t arena_size = 0;
    bool terminated = false;
    bool free = false;  // before begin_after
  };
  bool IsEos(int32_t id) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::optional<int32_t> begin_after_;
  Recognizer recognizer_;
  std::vector<Snapshot> history_;
  std::vector<uint64_t> checked_;  // scratch for FillNextTokenMask
};

}  // namespace sy::structured
