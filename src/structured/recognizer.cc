#include "structured/recognizer.h"

namespace sy::structured {

int32_t Recognizer::Intern(int32_t state, int32_t parent) {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(parent);
  auto [it, inserted] = index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({state, parent});
  return it->second;
}

void Recognizer::Truncate(size_t size) {
  while (nodes_.size() > size) {
    const Node& n = nodes_.back();
    index_.erase((static_cast<uint64_t>(static_cast<uint32_t>(n.state)) << 32) |
                 static_cast<uint32_t>(n.parent));
    nodes_.pop_back();
  }
}

void Recognizer::Close(ParseState* out) {
  if (++generation_ == 0) {
    std::fill(mark_.begin(), mark_.end(), 0);
    generation_ = 1;
  }
  work_.assign(out->stacks.rbegin(), out->stacks.rend());
  out->stacks.clear();
  while (!work_.empty()) {
    const int32_t node = work_.back();
    work_.pop_back();
    if (mark_.size() < nodes_.size()) mark_.resize(nodes_.size() * 2, 0);
    if (mark_[node] == generation_) continue;
    mark_[node] = generation_;
    const Node n = nodes_[node];
    const auto& st = pa_->states[n.state];
    if (st.byte_begin != st.byte_end) {
      if (out->stacks.size() >= max_stacks_) {
        out->overflow = true;
        out->stacks.clear();
        out->complete = false;
        return;
      }
      out->stacks.push_back(node);
    }
    if (st.accepting) {
      if (n.parent == kRoot) {
        out->complete = true;
      } else if (n.parent == kSentinel) {
        out->escaped = true;
      } else {
        work_.push_back(n.parent);
      }
    }
    for (uint32_t i = st.ref_begin; i < st.ref_end; ++i) {
      const auto& e = pa_->ref_edges[i];
      // A call in tail position (the caller only returns afterwards) returns straight to the
      // caller's parent: right recursion (list ::= item ("," list)?) keeps the stack flat.
      const auto& after = pa_->states[e.target];
      const bool tail =
          after.accepting && after.byte_begin == after.byte_end && after.ref_begin == after.ref_end;
      const int32_t ret = tail ? n.parent : Intern(e.target, n.parent);
      work_.push_back(Intern(pa_->rule_start[e.rule], ret));
    }
  }
}

ParseState Recognizer::Initial() {
  ParseState s;
  s.stacks.push_back(Intern(pa_->rule_start[pa_->root_rule], kRoot));
  Close(&s);
  return s;
}

ParseState Recognizer::FromFrame(int32_t dfa_state, int32_t parent) {
  ParseState s;
  s.stacks.push_back(Intern(dfa_state, parent));
  Close(&s);
  return s;
}

void Recognizer::Step(const ParseState& in, uint8_t byte, ParseState* out) {
  out->stacks.clear();
  out->complete = out->escaped = out->overflow = false;
  for (int32_t node : in.stacks) {
    const Node n = nodes_[node];
    const int32_t t = pa_->Next(n.state, byte);
    if (t >= 0) out->stacks.push_back(Intern(t, n.parent));
  }
  if (!out->stacks.empty()) Close(out);
}

ParseState Recognizer::Run(const ParseState& in, std::span<const uint8_t> bytes) {
  ParseState cur = in, next;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (cur.stacks.empty()) {  // complete or not, no byte can follow
      cur.complete = false;
      break;
    }
    Step(cur, bytes[i], &next);
    std::swap(cur, next);
  }
  return cur;
}

}  // namespace sy::structured
