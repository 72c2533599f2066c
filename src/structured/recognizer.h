// The byte-level recognizer over a PushdownAutomaton: a parse state is the set of stacks the
// input so far can leave (each stack a chain of frames in a hash-consed arena, so equal stacks
// are one node and sets need no deduplication beyond a visit mark). Only stacks whose top state
// can move on a byte are kept; calls, returns and completion are followed eagerly ("closure").
//
// A stack may also be rooted at kSentinel instead of kRoot: the mask precomputation starts from a
// single frame with unknown context and records when a path would have to return into it.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "structured/automaton.h"

namespace sy::structured {

struct ParseState {
  std::vector<int32_t> stacks;  // arena node ids of stacks whose top can read a byte
  bool complete = false;        // the input so far is a whole string of the language
  bool escaped = false;         // a sentinel-rooted stack returned into its unknown context
  bool overflow = false;        // more stacks than the recognizer's limit
  bool alive() const { return complete || !stacks.empty(); }
};

class Recognizer {
 public:
  static constexpr int32_t kRoot = -1;
  static constexpr int32_t kSentinel = -2;

  Recognizer(const PushdownAutomaton* pa, size_t max_stacks = 100'000)
      : pa_(pa), max_stacks_(max_stacks) {}

  // The state before any input: the root rule's start.
  ParseState Initial();
  // The state of a lone frame in `dfa_state` over `parent`: kSentinel for an unknown context,
  // kRoot for the bottom frame.
  ParseState FromFrame(int32_t dfa_state, int32_t parent);
  // The state after one more byte (stacks empty when the byte is not allowed).
  void Step(const ParseState& in, uint8_t byte, ParseState* out);
  // Runs `bytes` from `in`; the result's alive() says whether they continue a string.
  ParseState Run(const ParseState& in, std::span<const uint8_t> bytes);

  int32_t top_state(int32_t node) const { return nodes_[node].state; }
  // The arena only grows; Truncate forgets nodes made after a Size() mark (their ids must no
  // longer be in use).
  size_t Size() const { return nodes_.size(); }
  void Truncate(size_t size);

 private:
  struct Node {
    int32_t state;
    int32_t parent;
  };
  int32_t Intern(int32_t state, int32_t parent);
  void Close(ParseState* out);  // expands out->stacks (the seeds) in place

  const PushdownAutomaton* pa_;
  size_t max_stacks_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> index_;
  std::vector<uint32_t> mark_;
  uint32_t generation_ = 0;
  std::vector<int32_t> work_, seeds_;
};

}  // namespace sy::structured
