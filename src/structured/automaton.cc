#include "structured/automaton.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

namespace sy::structured {
namespace {

struct PairHash {
  size_t operator()(const std::pair<const void*, int32_t>& p) const {
    return std::hash<const void*>()(p.first) * 1000003u ^ std::hash<int32_t>()(p.second);
  }
};

struct VectorHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    size_t h = v.size();
    for (int32_t x : v)
      h = h * 1000003u ^ static_cast<size_t>(x);
    return h;
  }
};

// A Thompson-style automaton with epsilon edges, built in continuation-passing style so that a
// shared expression followed by the same continuation is compiled once.
class NfaBuilder {
 public:
  enum Kind : uint8_t { kEps, kBytes, kRef, kAccept };
  struct Node {
    Kind kind;
    int32_t arg = -1;     // kBytes: index into sets; kRef: rule
    int32_t target = -1;  // kBytes, kRef
    std::vector<int32_t> eps;
  };

  NfaBuilder(const Grammar& grammar, const std::vector<bool>& kept, const GrammarLimits& limits)
      : grammar_(grammar), kept_(kept), limits_(limits) {}

  int32_t NewNode(Kind kind, int32_t arg = -1, int32_t target = -1) {
    nodes.push_back({kind, arg, target, {}});
    return static_cast<int32_t>(nodes.size()) - 1;
  }

  // The start node of `e` followed by `next`; -1 when `e` admits no string.
  Result<int32_t> Compile(const Expr& e, int32_t next, int depth) {
    if (depth > kMaxDepth) {
      return Status::Errorf("the grammar nests more than {} levels of rules and groups deep",
                            kMaxDepth);
    }
    if (static_cast<int64_t>(nodes.size()) > limits_.max_nfa_states) {
      return Status::Errorf(
          "the grammar is too large: over {} automaton states once its rules "
          "are expanded (limit max_nfa_states)",
          limits_.max_nfa_states);
    }
    const auto key = std::make_pair(static_cast<const void*>(e.get()), next);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    int32_t result = -1;
    switch (e->kind) {
      case ExprNode::Kind::kBytes:
        if (e->bytes.any()) result = NewNode(kBytes, InternSet(e->bytes), next);
        break;
      case ExprNode::Kind::kSeq: {
        result = next;
        for (auto it = e->children.rbegin(); it != e->children.rend() && result >= 0; ++it) {
          SY_ASSIGN_OR_RETURN(result, Compile(*it, result, depth + 1));
        }
        break;
      }
      case ExprNode::Kind::kAlt: {
        std::vector<int32_t> starts;
        for (const auto& child : e->children) {
          SY_ASSIGN_OR_RETURN(int32_t s, Compile(child, next, depth + 1));
          if (s >= 0) starts.push_back(s);
        }
        if (!starts.empty()) {
          result = NewNode(kEps);
          nodes[result].eps = std::move(starts);
        }
        break;
      }
      case ExprNode::Kind::kRepeat: {
        const Expr& child = e->children[0];
        int32_t tail = next;
        if (e->max < 0) {
          const int32_t loop = NewNode(kEps);
          SY_ASSIGN_OR_RETURN(int32_t body, Compile(child, loop, depth + 1));
          nodes[loop].eps.push_back(next);
          if (body >= 0) nodes[loop].eps.push_back(body);
          tail = loop;
        } else {
          for (int j = e->max - 1; j >= e->min; --j) {
            SY_ASSIGN_OR_RETURN(int32_t body, Compile(child, tail, depth + 1));
            const int32_t choice = NewNode(kEps);
            nodes[choice].eps.push_back(next);
            if (body >= 0) nodes[choice].eps.push_back(body);
            tail = choice;
            if (static_cast<int64_t>(nodes.size()) > limits_.max_nfa_states) break;
          }
        }
        for (int j = 0; j < e->min && tail >= 0; ++j) {
          SY_ASSIGN_OR_RETURN(tail, Compile(child, tail, depth + 1));
          if (static_cast<int64_t>(nodes.size()) > limits_.max_nfa_states) break;
        }
        result = tail;
        break;
      }
      case ExprNode::Kind::kRef:
        if (kept_[e->rule]) {
          result = NewNode(kRef, e->rule, next);
        } else {
          SY_ASSIGN_OR_RETURN(result, Compile(grammar_.rules[e->rule].body, next, depth + 1));
        }
        break;
    }
    memo_[key] = result;
    return result;
  }

  int32_t InternSet(const ByteSet& set) {
    auto [it, inserted] = set_ids_.try_emplace(set, static_cast<int32_t>(sets.size()));
    if (inserted) sets.push_back(set);
    return it->second;
  }

  std::vector<Node> nodes;
  std::vector<ByteSet> sets;

 private:
  static constexpr int kMaxDepth = 3000;
  const Grammar& grammar_;
  const std::vector<bool>& kept_;
  const GrammarLimits& limits_;
  std::unordered_map<std::pair<const void*, int32_t>, int32_t, PairHash> memo_;
  std::unordered_map<ByteSet, int32_t> set_ids_;
};

// The rules that must stay rules: the root, and a set that cuts every cycle of references (the
// targets of a depth-first search's back edges). Every other rule is inlined into its callers,
// so a recursive group like expr -> term -> factor -> expr costs one stack frame per nesting
// level, not three, and most tokens are decided inside one frame.
std::vector<bool> KeptRules(const std::vector<std::vector<int>>& calls, int root) {
  const int n = static_cast<int>(calls.size());
  std::vector<bool> kept(n, false);
  kept[root] = true;
  std::vector<uint8_t> color(n, 0);  // 0 unvisited, 1 on the path, 2 done
  std::vector<int> order = {root};
  for (int r = 0; r < n; ++r) {
    if (r != root) order.push_back(r);
  }
  for (int start : order) {
    if (color[start]) continue;
    std::vector<std::pair<int, size_t>> stack = {{start, 0}};
    color[start] = 1;
    while (!stack.empty()) {
      auto& [v, next] = stack.back();
      if (next < calls[v].size()) {
        const int w = calls[v][next++];
        if (color[w] == 1) {
          kept[w] = true;  // a back edge: w is on a cycle through the current path
        } else if (color[w] == 0) {
          color[w] = 1;
          stack.push_back({w, 0});
        }
        continue;
      }
      color[v] = 2;
      stack.pop_back();
    }
  }
  return kept;
}

void CollectRefs(const Expr& e, std::vector<int>* out,
                 std::unordered_map<const void*, bool>* seen) {
  if (!seen->emplace(e.get(), true).second) return;
  if (e->kind == ExprNode::Kind::kRef) out->push_back(e->rule);
  for (const auto& c : e->children)
    CollectRefs(c, out, seen);
}

}  // namespace

Result<PushdownAutomaton> BuildAutomaton(const Grammar& grammar, const GrammarLimits& limits) {
  SY_RETURN_IF_ERROR(grammar.Validate());
  const int num_rules = static_cast<int>(grammar.rules.size());
  std::vector<std::vector<int>> calls(num_rules);
  for (int r = 0; r < num_rules; ++r) {
    std::unordered_map<const void*, bool> seen;
    CollectRefs(grammar.rules[r].body, &calls[r], &seen);
    for (int callee : calls[r]) {
      if (callee < 0 || callee >= num_rules) {
        return Status::Errorf("rule '{}' refers to a rule that does not exist",
                              grammar.rules[r].name);
      }
    }
  }
  const std::vector<bool> kept = KeptRules(calls, grammar.root);

  // One automaton per kept rule; pa_rule maps grammar rule -> kept rule index.
  PushdownAutomaton pa;
  std::vector<int32_t> pa_rule(num_rules, -1);
  for (int r = 0; r < num_rules; ++r) {
    if (!kept[r]) continue;
    pa_rule[r] = static_cast<int32_t>(pa.rule_names.size());
    pa.rule_names.push_back(grammar.rules[r].name);
  }
  pa.root_rule = pa_rule[grammar.root];

  NfaBuilder nfa(grammar, kept, limits);
  std::vector<int32_t> nfa_start(pa.rule_names.size()), nfa_accept(pa.rule_names.size());
  for (int r = 0; r < num_rules; ++r) {
    if (!kept[r]) continue;
    const int32_t accept = nfa.NewNode(NfaBuilder::kAccept);
    SY_ASSIGN_OR_RETURN(int32_t start, nfa.Compile(grammar.rules[r].body, accept, 0));
    nfa_start[pa_rule[r]] = start;
    nfa_accept[pa_rule[r]] = accept;
    if (static_cast<int64_t>(nfa.nodes.size()) > limits.max_nfa_states) {
      return Status::Errorf(
          "the grammar is too large: over {} automaton states once its rules "
          "are expanded (limit max_nfa_states)",
          limits.max_nfa_states);
    }
  }

  // Subset construction over all kept rules at once.
  std::vector<uint32_t> mark(nfa.nodes.size(), 0);
  uint32_t generation = 0;
  auto closure = [&](const std::vector<int32_t>& seeds) {
    ++generation;
    std::vector<int32_t> out, work;
    for (int32_t s : seeds) {
      if (s >= 0 && mark[s] != generation) mark[s] = generation, work.push_back(s);
    }
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      const auto& node = nfa.nodes[s];
      if (node.kind == NfaBuilder::kEps) {
        for (int32_t t : node.eps) {
          if (mark[t] != generation) mark[t] = generation, work.push_back(t);
        }
      } else {
        out.push_back(s);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  };

  std::unordered_map<std::vector<int32_t>, int32_t, VectorHash> dfa_ids;
  std::vector<std::vector<int32_t>> dfa_sets;
  std::vector<int32_t> work;
  auto intern = [&](std::vector<int32_t> set) -> int32_t {
    auto [it, inserted] = dfa_ids.try_emplace(set, static_cast<int32_t>(dfa_sets.size()));
    if (inserted) {
      dfa_sets.push_back(std::move(set));
      work.push_back(it->second);
    }
    return it->second;
  };
  for (size_t k = 0; k < pa.rule_names.size(); ++k) {
    pa.rule_start.push_back(intern(closure({nfa_start[k]})));
  }
  // Byte ranges of each interned set, for partitioning 0..255 cheaply.
  std::vector<std::vector<std::pair<int, int>>> set_ranges(nfa.sets.size());
  for (size_t i = 0; i < nfa.sets.size(); ++i) {
    for (int b = 0; b < 256;) {
      if (!nfa.sets[i][b]) {
        ++b;
        continue;
      }
      int e = b;
      while (e + 1 < 256 && nfa.sets[i][e + 1])
        ++e;
      set_ranges[i].push_back({b, e});
      b = e + 1;
    }
  }
  struct PendingState {
    std::vector<PushdownAutomaton::ByteEdge> bytes;
    std::vector<PushdownAutomaton::RefEdge> refs;
    bool accepting = false;
  };
  std::vector<PendingState> pending;
  while (!work.empty()) {
    const int32_t id = work.back();
    work.pop_back();
    if (static_cast<int64_t>(dfa_sets.size()) > limits.max_dfa_states) {
      return Status::Errorf(
          "the grammar is too large: over {} deterministic automaton states "
          "(limit max_dfa_states)",
          limits.max_dfa_states);
    }
    if (pending.size() <= static_cast<size_t>(id)) pending.resize(id + 1);
    const std::vector<int32_t> set = dfa_sets[id];  // copy: intern() may grow dfa_sets
    PendingState state;
    std::vector<bool> boundary(257, false);
    std::vector<int32_t> byte_nodes;
    std::vector<std::pair<int32_t, int32_t>> refs;  // (rule, nfa target)
    for (int32_t s : set) {
      const auto& node = nfa.nodes[s];
      if (node.kind == NfaBuilder::kAccept) state.accepting = true;
      if (node.kind == NfaBuilder::kRef) refs.push_back({pa_rule[node.arg], node.target});
      if (node.kind == NfaBuilder::kBytes) {
        byte_nodes.push_back(s);
        for (auto [lo, hi] : set_ranges[node.arg])
          boundary[lo] = boundary[hi + 1] = true;
      }
    }
    if (!byte_nodes.empty()) {
      int lo = 0;
      while (lo < 256) {
        int hi = lo;
        while (hi + 1 < 256 && !boundary[hi + 1])
          ++hi;
        std::vector<int32_t> targets;
        for (int32_t s : byte_nodes) {
          if (nfa.sets[nfa.nodes[s].arg][lo]) targets.push_back(nfa.nodes[s].target);
        }
        if (!targets.empty()) {
          const int32_t t = intern(closure(targets));
          if (!state.bytes.empty() && state.bytes.back().target == t &&
              state.bytes.back().hi + 1 == lo) {
            state.bytes.back().hi = static_cast<uint8_t>(hi);
          } else {
            state.bytes.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), t});
          }
        }
        lo = hi + 1;
      }
    }
    std::sort(refs.begin(), refs.end());
    for (size_t i = 0; i < refs.size();) {
      size_t j = i;
      std::vector<int32_t> targets;
      while (j < refs.size() && refs[j].first == refs[i].first)
        targets.push_back(refs[j++].second);
      state.refs.push_back({refs[i].first, intern(closure(targets))});
      i = j;
    }
    if (pending.size() <= static_cast<size_t>(id)) pending.resize(id + 1);
    pending[id] = std::move(state);
  }
  const int32_t num_states = static_cast<int32_t>(dfa_sets.size());
  pending.resize(num_states);

  // Productive rules and the states that can still reach their rule's end (fixpoint).
  const size_t num_kept = pa.rule_names.size();
  std::vector<bool> productive(num_kept, false), can_finish(num_states, false);
  std::vector<std::vector<std::pair<int32_t, int32_t>>> reverse(num_states);  // (from, rule|-1)
  for (int32_t s = 0; s < num_states; ++s) {
    for (const auto& e : pending[s].bytes)
      reverse[e.target].push_back({s, -1});
    for (const auto& e : pending[s].refs)
      reverse[e.target].push_back({s, e.rule});
  }
  for (bool changed = true; changed;) {
    changed = false;
    std::fill(can_finish.begin(), can_finish.end(), false);
    std::vector<int32_t> queue;
    for (int32_t s = 0; s < num_states; ++s) {
      if (pending[s].accepting) can_finish[s] = true, queue.push_back(s);
    }
    while (!queue.empty()) {
      const int32_t s = queue.back();
      queue.pop_back();
      for (auto [from, rule] : reverse[s]) {
        if (can_finish[from] || (rule >= 0 && !productive[rule])) continue;
        can_finish[from] = true;
        queue.push_back(from);
      }
    }
    for (size_t k = 0; k < num_kept; ++k) {
      if (!productive[k] && can_finish[pa.rule_start[k]]) productive[k] = changed = true;
    }
  }
  if (!productive[pa.root_rule]) {
    return Status::Error("the grammar admits no string at all (its constraints contradict)");
  }
  for (auto& state : pending) {
    std::erase_if(state.bytes, [&](const auto& e) { return !can_finish[e.target]; });
    std::erase_if(state.refs,
                  [&](const auto& e) { return !productive[e.rule] || !can_finish[e.target]; });
  }

  // Nullable rules, then left recursion: a rule that can call itself before consuming a byte.
  std::vector<bool> nullable(num_kept, false);
  auto empty_reach = [&](int32_t start, const std::function<void(int32_t)>& visit) {
    std::vector<int32_t> stack = {start};
    std::vector<bool> seen_state;
    std::unordered_map<int32_t, bool> seen;
    seen[start] = true;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      visit(s);
      for (const auto& e : pending[s].refs) {
        if (nullable[e.rule] && seen.emplace(e.target, true).second) stack.push_back(e.target);
      }
    }
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t k = 0; k < num_kept; ++k) {
      if (nullable[k]) continue;
      bool reaches = false;
      empty_reach(pa.rule_start[k], [&](int32_t s) { reaches |= pending[s].accepting; });
      if (reaches) nullable[k] = changed = true;
    }
  }
  std::vector<std::vector<int32_t>> left_calls(num_kept);
  for (size_t k = 0; k < num_kept; ++k) {
    empty_reach(pa.rule_start[k], [&](int32_t s) {
      for (const auto& e : pending[s].refs)
        left_calls[k].push_back(e.rule);
    });
  }
  {
    std::vector<int> color(num_kept, 0);  // 0 new, 1 on path, 2 done
    std::vector<int32_t> path;
    std::string cycle;
    std::function<bool(int32_t)> dfs = [&](int32_t k) {
      color[k] = 1;
      path.push_back(k);
      for (int32_t c : left_calls[k]) {
        if (color[c] == 1) {
          auto it = std::find(path.begin(), path.end(), c);
          for (; it != path.end(); ++it)
            cycle += pa.rule_names[*it] + " -> ";
          cycle += pa.rule_names[c];
          return true;
        }
        if (color[c] == 0 && dfs(c)) return true;
      }
      path.pop_back();
      color[k] = 2;
      return false;
    };
    for (size_t k = 0; k < num_kept; ++k) {
      if (color[k] == 0 && dfs(static_cast<int32_t>(k))) {
        return Status::Errorf(
            "left recursion: {} (a rule may not reach itself before matching "
            "a byte; rewrite it with repetition)",
            cycle);
      }
    }
  }

  pa.states.resize(num_states);
  for (size_t k = 0; k < num_kept; ++k) {  // label each state with its rule
    std::vector<int32_t> queue = {pa.rule_start[k]};
    pa.states[pa.rule_start[k]].rule = static_cast<int32_t>(k);
    while (!queue.empty()) {
      const int32_t s = queue.back();
      queue.pop_back();
      auto visit = [&](int32_t t) {
        if (pa.states[t].rule < 0) pa.states[t].rule = static_cast<int32_t>(k), queue.push_back(t);
      };
      for (const auto& e : pending[s].bytes)
        visit(e.target);
      for (const auto& e : pending[s].refs)
        visit(e.target);
    }
  }
  for (int32_t s = 0; s < num_states; ++s) {
    for (const auto& e : pending[s].refs)
      pa.root_referenced |= e.rule == pa.root_rule;
  }
  for (int32_t s = 0; s < num_states; ++s) {
    auto& out = pa.states[s];
    out.accepting = pending[s].accepting;
    out.byte_begin = static_cast<uint32_t>(pa.byte_edges.size());
    pa.byte_edges.insert(pa.byte_edges.end(), pending[s].bytes.begin(), pending[s].bytes.end());
    out.byte_end = static_cast<uint32_t>(pa.byte_edges.size());
    out.ref_begin = static_cast<uint32_t>(pa.ref_edges.size());
    pa.ref_edges.insert(pa.ref_edges.end(), pending[s].refs.begin(), pending[s].refs.end());
    out.ref_end = static_cast<uint32_t>(pa.ref_edges.size());
  }
  return pa;
}

}  // namespace sy::structured
