// A grammar compiled to a pushdown automaton over bytes: one deterministic automaton per rule
// that has to stay a rule (the root and the rules on a recursion cycle), every other rule inlined
// into its callers. Inside a rule's automaton a state moves on bytes, or on a reference to
// another rule (the matcher then pushes that rule's start and returns to the edge's target when
// the callee reaches an accepting state). Regular structure — strings, numbers, separators,
// whole non-recursive schemas — therefore never touches the stack.
//
// BuildAutomaton also makes the automaton trim: edges that cannot lead to the end of their rule
// (through productive rules) are removed, so every configuration the matcher reaches can still be
// completed — the property exact token masks rest on. It refuses, by name, a grammar that admits
// no string, left recursion (which would make the stack grow without consuming bytes), and
// anything over the limits in GrammarLimits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "structured/grammar.h"

namespace sy::structured {

struct PushdownAutomaton {
  struct ByteEdge {
    uint8_t lo, hi;
    int32_t target;
  };
  struct RefEdge {
    int32_t rule;    // index into rule_start
    int32_t target;  // the state to continue in once the callee is complete
  };
  struct State {
    uint32_t byte_begin = 0, byte_end = 0;  // into byte_edges, sorted by lo, disjoint
    uint32_t ref_begin = 0, ref_end = 0;    // into ref_edges
    bool accepting = false;
    int32_t rule = -1;  // the kept rule whose automaton holds this state
  };

  std::vector<State> states;
  std::vector<ByteEdge> byte_edges;
  std::vector<RefEdge> ref_edges;
  std::vector<int32_t> rule_start;  // start state of each kept rule
  std::vector<std::string> rule_names;
  int32_t root_rule = 0;
  bool root_referenced = false;  // whether any rule calls the root (else its frames are bottom)

  // The state reached from `state` on byte `b`, or -1.
  int32_t Next(int32_t state, uint8_t b) const {
    const State& s = states[state];
    for (uint32_t i = s.byte_begin; i < s.byte_end; ++i) {
      const ByteEdge& e = byte_edges[i];
      if (b < e.lo) return -1;
      if (b <= e.hi) return e.target;
    }
    return -1;
  }
  bool HasByteEdges(int32_t state) const {
    return states[state].byte_begin != states[state].byte_end;
  }
};

Result<PushdownAutomaton> BuildAutomaton(const Grammar& grammar, const GrammarLimits& limits);

}  // namespace sy::structured
