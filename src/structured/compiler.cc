#include "structured/compiler.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "structured/gbnf.h"
#include "structured/json_schema.h"
#include "structured/recognizer.h"
#include "structured/regex.h"
#include "structured/structural.h"

namespace sy::structured {

bool Vocabulary::IsText(int32_t id) const {
  if (id < 0 || id >= size()) return false;
  if (id < static_cast<int32_t>(special.size()) && special[id]) return false;
  const std::string& bytes = token_bytes[id];
  return !bytes.empty() && bytes.find('\xFF') == std::string::npos;
}

std::optional<int32_t> Vocabulary::NamedToken(std::string_view content) const {
  for (const auto& [name, id] : named_tokens)
    if (name == content) return id;
  return std::nullopt;
}

std::vector<std::string_view> Vocabulary::Spellings(int32_t id) const {
  std::vector<std::string_view> out;
  if (IsText(id)) out.push_back(token_bytes[id]);
  if (id >= 0 && id < static_cast<int32_t>(markers.size()) && !markers[id].empty())
    out.push_back(markers[id]);
  return out;
}

TokenTrie::TokenTrie(const Vocabulary& vocab) {
  // Every spelling with its id: text tokens by their bytes, named tokens by their markers.
  std::vector<std::pair<std::string, int32_t>> spellings;
  for (int32_t id = 0; id < vocab.size(); ++id)
    if (vocab.IsText(id)) spellings.emplace_back(vocab.token_bytes[id], id);
  for (const auto& [name, id] : vocab.named_tokens)
    if (id >= 0 && id < vocab.size()) spellings.emplace_back(TokenMarker(name), id);
  std::sort(spellings.begin(), spellings.end());
  std::vector<int32_t> ids;
  for (const auto& sp : spellings)
    ids.push_back(sp.second);
  token_ids_ = ids;
  std::vector<int32_t> path;  // node index at each depth-1
  const std::string* previous = nullptr;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string& bytes = spellings[k].first;
    size_t lcp = 0;
    if (previous) {
      while (lcp < bytes.size() && lcp < previous->size() && bytes[lcp] == (*previous)[lcp])
        ++lcp;
    }
    while (path.size() > lcp) {
      nodes_[path.back()].subtree_end = static_cast<int32_t>(nodes_.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < bytes.size(); ++d) {
      path.push_back(static_cast<int32_t>(nodes_.size()));
      nodes_.push_back({static_cast<uint8_t>(bytes[d]), static_cast<int32_t>(d + 1), 0,
                        static_cast<int32_t>(k), static_cast<int32_t>(k)});
    }
    nodes_[path.back()].tokens_end = static_cast<int32_t>(k + 1);
    if (nodes_[path.back()].tokens_begin > static_cast<int32_t>(k)) {
      nodes_[path.back()].tokens_begin = static_cast<int32_t>(k);
    }
    previous = &bytes;
  }
  while (!path.empty()) {
    nodes_[path.back()].subtree_end = static_cast<int32_t>(nodes_.size());
    path.pop_back();
  }
  // A node that ends no token has an empty range.
  for (auto& n : nodes_) {
    if (n.tokens_end <= n.tokens_begin) n.tokens_begin = n.tokens_end = 0;
  }
}

CompiledGrammar::CompiledGrammar(PushdownAutomaton automaton,
                                 std::shared_ptr<const Vocabulary> vocab,
                                 std::shared_ptr<const TokenTrie> trie, std::string description)
    : automaton_(std::move(automaton)),
      vocab_(std::move(vocab)),
      trie_(std::move(trie)),
      description_(std::move(description)),
      entries_(automaton_.states.size()) {}

std::shared_ptr<const CompiledGrammar::MaskEntry> CompiledGrammar::Entry(int32_t dfa_state) const {
  {
    std::lock_guard lock(mu_);
    if (entries_[dfa_state]) return entries_[dfa_state];
  }
  auto entry = Compute(dfa_state);
  std::lock_guard lock(mu_);
  if (entries_[dfa_state]) return entries_[dfa_state];
  if (cache_bytes_ + entry->Bytes() <= kMaxCacheBytes) {
    cache_bytes_ += entry->Bytes();
    entries_[dfa_state] = entry;
  }
  return entry;
}

size_t CompiledGrammar::cached_entries() const {
  std::lock_guard lock(mu_);
  return std::count_if(entries_.begin(), entries_.end(),
                       [](const auto& e) { return e != nullptr; });
}

void CompiledGrammar::PrecomputeAll(size_t max_states) const {
  size_t done = 0;
  for (int32_t s = 0; s < static_cast<int32_t>(automaton_.states.size()) && done < max_states;
       ++s) {
    if (automaton_.HasByteEdges(s)) Entry(s), ++done;
  }
}

std::shared_ptr<const CompiledGrammar::MaskEntry> CompiledGrammar::Compute(
    int32_t dfa_state) const {
  auto entry = std::make_shared<MaskEntry>();
  Recognizer rec(&automaton_);
  const auto& nodes = trie_->nodes();
  const auto& ids = trie_->token_ids();
  // states[d]: the parse state after the first d bytes of the current trie path.
  std::vector<ParseState> states(1);
  std::vector<uint8_t> escaped(1, 0);
  // A frame of a root that nothing calls is the bottom of every stack: completing it ends the
  // output, so no token needs the (empty) context below.
  const bool bottom =
      !automaton_.root_referenced && automaton_.states[dfa_state].rule == automaton_.root_rule;
  states[0] = rec.FromFrame(dfa_state, bottom ? Recognizer::kRoot : Recognizer::kSentinel);
  states[0].escaped = false;  // returning before any byte is covered by the frame below's entry
  std::vector<int32_t> accepted;
  for (int32_t i = 0; i < static_cast<int32_t>(nodes.size());) {
    const auto& node = nodes[i];
    const int32_t d = node.depth;
    if (static_cast<int32_t>(states.size()) <= d) states.resize(d + 1), escaped.resize(d + 1);
    rec.Step(states[d - 1], node.byte, &states[d]);
    escaped[d] = escaped[d - 1] || states[d].escaped;
    if (states[d].stacks.empty()) {
      if (states[d].complete) {  // the output ends exactly here: these tokens, nothing longer
        for (int32_t t = node.tokens_begin; t < node.tokens_end; ++t)
          accepted.push_back(ids[t]);
      } else if (escaped[d]) {  // the whole subtree depends on the context below
        for (int32_t j = i; j < node.subtree_end; ++j) {
          for (int32_t t = nodes[j].tokens_begin; t < nodes[j].tokens_end; ++t) {
            entry->uncertain.push_back(ids[t]);
          }
        }
      }
      i = node.subtree_end;
      continue;
    }
    for (int32_t t = node.tokens_begin; t < node.tokens_end; ++t)
      accepted.push_back(ids[t]);
    ++i;
  }
  const size_t words = (vocab_->size() + 63) / 64;
  if (accepted.size() > words * 2) {
    entry->accepted_bits.assign(words, 0);
    for (int32_t id : accepted)
      entry->accepted_bits[id >> 6] |= uint64_t{1} << (id & 63);
  } else {
    entry->accepted = std::move(accepted);
  }
  return entry;
}

std::string GrammarSpec::CacheKey() const {
  std::string key = std::to_string(static_cast<int>(kind)) + ":";
  if (kind == Kind::kChoice) {
    for (const auto& c : choices)
      key += std::to_string(c.size()) + ":" + c;
  } else {
    key += text;
  }
  return key;
}

Result<Grammar> BuildGrammar(const GrammarSpec& spec, const GrammarLimits& limits) {
  switch (spec.kind) {
    case GrammarSpec::Kind::kJsonSchema:
      return JsonSchemaGrammar(spec.text, limits);
    case GrammarSpec::Kind::kJsonObject:
      return AnyJsonObjectGrammar();
    case GrammarSpec::Kind::kRegex:
      return RegexGrammar(spec.text, limits);
    case GrammarSpec::Kind::kChoice:
      return ChoiceGrammar(spec.choices);
    case GrammarSpec::Kind::kGbnf:
      return GbnfGrammar(spec.text, limits);
    case GrammarSpec::Kind::kStructural:
      return StructuralGrammar(spec.text, limits);
  }
  return Status::Error("unknown grammar kind");
}

namespace {
const char* KindName(GrammarSpec::Kind kind) {
  switch (kind) {
    case GrammarSpec::Kind::kJsonSchema:
      return "JSON schema";
    case GrammarSpec::Kind::kJsonObject:
      return "JSON object";
    case GrammarSpec::Kind::kRegex:
      return "regular expression";
    case GrammarSpec::Kind::kChoice:
      return "choice";
    case GrammarSpec::Kind::kGbnf:
      return "GBNF grammar";
    case GrammarSpec::Kind::kStructural:
      return "tool-call format";
  }
  return "grammar";
}
}  // namespace

Result<std::shared_ptr<const CompiledGrammar>> CompileForBytes(const GrammarSpec& spec,
                                                               const GrammarLimits& limits) {
  if (spec.text.size() > limits.max_source_bytes) {
    return Status::Errorf("the {} is {} bytes, over the limit of {}", KindName(spec.kind),
                          spec.text.size(), limits.max_source_bytes);
  }
  auto grammar = BuildGrammar(spec, limits);
  if (!grammar.ok())
    return grammar.status().WithContext(std::string("invalid ") + KindName(spec.kind));
  auto automaton = BuildAutomaton(*grammar, limits);
  if (!automaton.ok()) {
    return automaton.status().WithContext(std::string("invalid ") + KindName(spec.kind));
  }
  return std::make_shared<const CompiledGrammar>(std::move(automaton).value(), nullptr, nullptr,
                                                 KindName(spec.kind));
}

Status CheckCompiles(const GrammarSpec& spec) {
  static std::mutex mu;
  static std::unordered_map<std::string, Status> verdicts;
  static size_t bytes = 0;
  const std::string key = spec.CacheKey();
  {
    std::lock_guard lock(mu);
    if (auto it = verdicts.find(key); it != verdicts.end()) return it->second;
  }
  auto compiled = CompileForBytes(spec);
  Status verdict = compiled.ok() ? Status::Ok() : compiled.status();
  std::lock_guard lock(mu);
  if (bytes + key.size() > (size_t{64} << 20)) {
    verdicts.clear();
    bytes = 0;
  }
  if (verdicts.emplace(key, verdict).second) bytes += key.size();
  return verdict;
}

namespace {
Vocabulary WithMarkers(Vocabulary vocab) {
  vocab.markers.assign(static_cast<size_t>(vocab.size()), "");
  vocab.spellings.assign(static_cast<size_t>(vocab.size()), 0);
  for (int32_t id = 0; id < vocab.size(); ++id)
    if (vocab.IsText(id)) vocab.spellings[id] = 1;
  for (const auto& [name, id] : vocab.named_tokens) {
    if (id < 0 || id >= vocab.size()) continue;
    vocab.markers[id] = TokenMarker(name);
    vocab.spellings[id] |= 2;
  }
  return vocab;
}
}  // namespace

GrammarCompiler::GrammarCompiler(Vocabulary vocab, GrammarLimits limits, size_t max_cached_grammars)
    : vocab_(std::make_shared<const Vocabulary>(WithMarkers(std::move(vocab)))),
      trie_(std::make_shared<const TokenTrie>(*vocab_)),
      limits_(limits),
      max_cached_(max_cached_grammars) {}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(const GrammarSpec& spec) {
  const std::string key = spec.CacheKey();
  {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  if (spec.text.size() > limits_.max_source_bytes) {
    return Status::Errorf("the {} is {} bytes, over the limit of {}", KindName(spec.kind),
                          spec.text.size(), limits_.max_source_bytes);
  }
  auto grammar = BuildGrammar(spec, limits_);
  if (!grammar.ok())
    return grammar.status().WithContext(std::string("invalid ") + KindName(spec.kind));
  auto automaton = BuildAutomaton(*grammar, limits_);
  if (!automaton.ok()) {
    return automaton.status().WithContext(std::string("invalid ") + KindName(spec.kind));
  }
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(automaton).value(), vocab_,
                                                          trie_, KindName(spec.kind));
  std::lock_guard lock(mu_);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second.first;
  lru_.push_front(key);
  cache_.emplace(key, std::make_pair(compiled, lru_.begin()));
  while (cache_.size() > max_cached_) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  return std::shared_ptr<const CompiledGrammar>(compiled);
}

}  // namespace sy::structured
