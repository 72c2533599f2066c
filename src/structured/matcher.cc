#include "structured/matcher.h"

#include <algorithm>

namespace sy::structured {
namespace {

std::string Printable(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes.substr(0, 40)) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (bytes.size() > 40) out += "...";
  return out;
}

std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : GrammarMatcher(std::move(grammar), std::nullopt) {}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar,
                               std::optional<int32_t> begin_after)
    : grammar_(std::move(grammar)),
      begin_after_(begin_after),
      recognizer_(&grammar_->automaton()) {
  Snapshot first;
  first.state = recognizer_.Initial();
  first.arena_size = recognizer_.Size();
  first.free = begin_after_.has_value();
  history_.push_back(std::move(first));
}

bool GrammarMatcher::IsEos(int32_t id) const {
  const Vocabulary* vocab = grammar_->vocabulary();
  return vocab &&
         std::find(vocab->eos_ids.begin(), vocab->eos_ids.end(), id) != vocab->eos_ids.end();
}

Status GrammarMatcher::AcceptToken(int32_t id) {
  const Vocabulary* vocab = grammar_->vocabulary();
  if (!vocab) return Status::Error("the grammar was compiled without a vocabulary");
  if (id < 0 || id >= vocab->size()) return Status::Errorf("token {} is out of range", id);
  if (IsTerminated()) return Status::Errorf("token {} after the end of the output", id);
  if (IsFree()) {
    // Nothing is matched yet: the state stays the initial one until begin_after.
    if (IsEos(id))
      return Status::Errorf("end-of-sequence token {} before the {} began", id,
                            grammar_->description());
    Snapshot next = history_.back();
    next.free = id != *begin_after_;
    history_.push_back(std::move(next));
    return Status::Ok();
  }
  if (IsEos(id)) {
    if (!IsComplete()) {
      return Status::Errorf("end-of-sequence token {} before the output is complete for the {}", id,
                            grammar_->description());
    }
    Snapshot next = history_.back();
    next.terminated = true;
    history_.push_back(std::move(next));
    return Status::Ok();
  }
  // A named token is read as its marker where the grammar names it, else as its text (a grammar
  // that allows both at one point takes the marker).
  const std::vector<std::string_view> spellings = vocab->Spellings(id);
  if (spellings.empty()) {
    return Status::Errorf("special token {} is not allowed by the {} here", id,
                          grammar_->description());
  }
  for (auto it = spellings.rbegin(); it != spellings.rend(); ++it)
    if (AcceptBytes(*it).ok()) return Status::Ok();
  return Status::Errorf("token {} ('{}') is not allowed by the {} here", id,
                        Printable(vocab->token_bytes[id]), grammar_->description());
}

Status GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (IsTerminated()) return Status::Error("bytes after the end of the output");
  const size_t mark = recognizer_.Size();
  ParseState next = recognizer_.Run(history_.back().state, AsBytes(bytes));
  if (next.overflow) {
    recognizer_.Truncate(mark);
    return Status::Error("the grammar is too ambiguous here (too many parser stacks)");
  }
  if (!next.alive()) {
    recognizer_.Truncate(mark);
    return Status::Errorf("'{}' is not allowed by the {} here", Printable(bytes),
                          grammar_->description());
  }
  history_.push_back({std::move(next), recognizer_.Size(), false});
  return Status::Ok();
}

bool GrammarMatcher::CanAcceptBytes(std::string_view bytes) {
  if (IsTerminated()) return false;
  const size_t mark = recognizer_.Size();
  const bool alive = recognizer_.Run(history_.back().state, AsBytes(bytes)).alive();
  recognizer_.Truncate(mark);
  return alive;
}

Status GrammarMatcher::Rollback(int steps) {
  if (steps < 0 || steps > this->steps()) {
    return Status::Errorf("cannot roll back {} steps; {} were taken", steps, this->steps());
  }
  history_.resize(history_.size() - steps);
  recognizer_.Truncate(history_.back().arena_size);
  return Status::Ok();
}

void GrammarMatcher::FillNextTokenMask(std::span<uint64_t> mask) {
  std::fill(mask.begin(), mask.end(), 0);
  const Vocabulary* vocab = grammar_->vocabulary();
  if (!vocab || IsTerminated()) return;
  const Snapshot& now = history_.back();
  if (now.free) {  // every token but end-of-sequence
    for (int32_t id = 0; id < vocab->size(); ++id)
      mask[id >> 6] |= uint64_t{1} << (id & 63);
    for (int32_t id : vocab->eos_ids)
      mask[id >> 6] &= ~(uint64_t{1} << (id & 63));
    return;
  }
  auto set = [&](int32_t id) { mask[id >> 6] |= uint64_t{1} << (id & 63); };
  auto test = [](const std::vector<uint64_t>& bits, int32_t id) {
    return (bits[id >> 6] >> (id & 63)) & 1;
  };
  if (now.state.complete) {
    for (int32_t id : vocab->eos_ids)
      set(id);
  }
  std::vector<int32_t> tops;
  for (int32_t node : now.state.stacks)
    tops.push_back(recognizer_.top_state(node));
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  std::vector<std::shared_ptr<const CompiledGrammar::MaskEntry>> entries;
  for (int32_t top : tops) {
    auto entry = grammar_->Entry(top);
    if (!entry->accepted_bits.empty()) {
      for (size_t w = 0; w < mask.size(); ++w)
        mask[w] |= entry->accepted_bits[w];
    } else {
      for (int32_t id : entry->accepted)
        set(id);
    }
    entries.push_back(std::move(entry));
  }
  // Uncertain tokens: run through the whole parse state, once each.
  checked_.assign(mask.size(), 0);
  const size_t mark = recognizer_.Size();
  for (const auto& entry : entries) {
    for (int32_t id : entry->uncertain) {
      if (test(checked_, id) || (mask[id >> 6] >> (id & 63)) & 1) continue;
      checked_[id >> 6] |= uint64_t{1} << (id & 63);
      for (std::string_view spelling : vocab->Spellings(id)) {
        const bool alive = recognizer_.Run(now.state, AsBytes(spelling)).alive();
        recognizer_.Truncate(mark);
        if (alive) {
          set(id);
          break;
        }
      }
    }
  }
}

}  // namespace sy::structured
