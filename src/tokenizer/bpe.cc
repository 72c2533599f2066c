#include "tokenizer/bpe.h"

#include <atomic>
#include <queue>

#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"

namespace sy {
namespace {

std::atomic<uint64_t> next_serial{1};

// Pieces up to this many bytes merge by rescanning all pairs (cheapest for short words); longer
// ones use a heap, so 20,000 spaces cost n log n, not n².
constexpr size_t kScanLimit = 48;
// Per-thread cache of piece → ids, cleared when full.
constexpr size_t kCacheEntries = 1 << 16;
constexpr size_t kCacheMaxPiece = 64;

struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>> entries;
};

PieceCache& ThreadCache(uint64_t owner) {
  thread_local PieceCache cache;
  if (cache.owner != owner) {
    cache.entries.clear();
    cache.owner = owner;
  }
  return cache;
}

}  // namespace

void BpeModel::MergeTable::Reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2)
    capacity <<= 1;
  keys.assign(capacity, kEmpty);
  values.assign(capacity, 0);
  mask = capacity - 1;
}

void BpeModel::MergeTable::Insert(uint64_t key, uint64_t value) {
  for (uint64_t slot = Hash(key) & mask;; slot = (slot + 1) & mask) {
    if (keys[slot] == key) return;  // a repeated merge keeps its first (lowest) rank
    if (keys[slot] == kEmpty) {
      keys[slot] = key;
      values[slot] = value;
      return;
    }
  }
}

Result<BpeModel> BpeModel::FromJson(const nlohmann::json& model) {
  if (!model.is_object()) return Status::Error("\"model\" must be an object");
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") return Status::Errorf("model type \"{}\" is not supported (BPE only)", type);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      return Status::Errorf("model.{} is not supported (byte-level BPE has none)", key);
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null())
    return Status::Error("model.dropout is not supported (encoding must be deterministic)");
  if (model.value("byte_fallback", false))
    return Status::Error("model.byte_fallback is not supported (byte-level BPE needs none)");
  BpeModel bpe;
  bpe.whole_piece_first_ = model.value("ignore_merges", false);
  bpe.serial_ = next_serial.fetch_add(1);
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object())
    return Status::Error("model.vocab must be an object of token → id");
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= (int64_t{1} << 31))
      return Status::Errorf("model.vocab[\"{}\"]: id must be a non-negative integer", it.key());
    max_id = std::max(max_id, it.value().get<int64_t>());
  }
  // Tables are sized by the largest id, so a corrupt id (billions) must not size them: ids may
  // leave gaps (reserved ids), but at most kIdSlack of them.
  if (max_id >= static_cast<int64_t>(vocab->size()) + kIdSlack)
    return Status::Errorf(
        "model.vocab: id {} but only {} tokens (ids must be 0..N-1, give or "
        "take {} reserved)",
        max_id, vocab->size(), kIdSlack);
  bpe.id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  bpe.token_to_id_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    if (!bpe.id_to_token_[id].empty() || (it.key().empty()))
      return Status::Errorf("model.vocab: id {} is given twice (or to an empty token)", id);
    bpe.id_to_token_[id] = it.key();
    bpe.token_to_id_.emplace(it.key(), id);
  }
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    AppendUtf8(alphabet.CodePointOf(static_cast<uint8_t>(b)), &symbol);
    auto found = bpe.token_to_id_.find(symbol);
    bpe.byte_to_id_[b] = found == bpe.token_to_id_.end() ? -1 : found->second;
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array())
    return Status::Error("model.merges must be a list");
  bpe.merges_.Reserve(merges->size());
  std::string left, right;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const auto& merge = (*merges)[rank];
    // Two spellings: "a b" (older files) or ["a", "b"].
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
        return Status::Errorf("model.merges[{}]: \"{}\" is not two tokens separated by a space",
                              rank, text);
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return Status::Errorf("model.merges[{}]: expected \"a b\" or [\"a\", \"b\"]", rank);
    }
    auto l = bpe.token_to_id_.find(left), r = bpe.token_to_id_.find(right),
         m = bpe.token_to_id_.find(left + right);
    if (l == bpe.token_to_id_.end() || r == bpe.token_to_id_.end() || m == bpe.token_to_id_.end())
      return Status::Errorf("model.merges[{}]: \"{}\" + \"{}\" uses a token not in the vocabulary",
                            rank, left, right);
    bpe.merges_.Insert(static_cast<uint64_t>(l->second) << 32 | static_cast<uint32_t>(r->second),
                       static_cast<uint64_t>(rank) << 32 | static_cast<uint32_t>(m->second));
  }
  if (bpe.whole_piece_first_) {
    std::string bytes;
    bpe.bytes_to_id_.reserve(bpe.token_to_id_.size());
    for (const auto& [token, id] : bpe.token_to_id_) {
      bytes.clear();
      if (alphabet.Decode(token, &bytes)) bpe.bytes_to_id_.emplace(bytes, id);
    }
  }
  return bpe;
}

Result<BpeModel> BpeModel::FromRanks(const std::vector<std::string>& token_bytes) {
  if (token_bytes.size() >= (size_t{1} << 31)) return Status::Error("too many tokens");
  BpeModel bpe;
  bpe.serial_ = next_serial.fetch_add(1);
  bpe.whole_piece_first_ = true;
  bpe.id_to_token_.assign(token_bytes.size(), std::string());
  bpe.bytes_to_id_.reserve(token_bytes.size());
  bpe.token_to_id_.reserve(token_bytes.size());
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    const std::string& bytes = token_bytes[id];
    if (bytes.empty()) continue;
    if (!bpe.bytes_to_id_.emplace(bytes, static_cast<int32_t>(id)).second)
      return Status::Errorf("ranks {} and {} are the same token", bpe.bytes_to_id_[bytes], id);
    bpe.id_to_token_[id] = alphabet.Encode(bytes);
    bpe.token_to_id_.emplace(bpe.id_to_token_[id], static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    auto found = bpe.bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    bpe.byte_to_id_[b] = found == bpe.bytes_to_id_.end() ? -1 : found->second;
  }
  // Every split of every token into two tokens.
  std::vector<std::pair<uint64_t, uint64_t>> merges;
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    const std::string_view bytes = token_bytes[id];
    for (size_t cut = 1; cut < bytes.size(); ++cut) {
      auto l = bpe.bytes_to_id_.find(std::string(bytes.substr(0, cut)));
      if (l == bpe.bytes_to_id_.end()) continue;
      auto r = bpe.bytes_to_id_.find(std::string(bytes.substr(cut)));
      if (r == bpe.bytes_to_id_.end()) continue;
      merges.push_back({static_cast<uint64_t>(l->second) << 32 | static_cast<uint32_t>(r->second),
                        static_cast<uint64_t>(id) << 32 | static_cast<uint32_t>(id)});
    }
  }
  bpe.merges_.Reserve(merges.size());
  for (const auto& [key, value] : merges)
    bpe.merges_.Insert(key, value);
  return bpe;
}

void BpeModel::Merge(const int32_t* symbols, size_t count, std::vector<int32_t>* ids) const {
  constexpr uint64_t kNone = MergeTable::kEmpty;
  std::vector<int32_t> id(symbols, symbols + count);
  std::vector<int32_t> next(count), prev(count);
  for (size_t i = 0; i < count; ++i) {
    next[i] = i + 1 < count ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  auto pair_value = [&](int32_t i) -> uint64_t {
    const int32_t j = next[i];
    if (j < 0) return kNone;
    return merges_.Find(static_cast<uint64_t>(id[i]) << 32 | static_cast<uint32_t>(id[j]));
  };
  auto merge_at = [&](int32_t i, uint64_t value) {
    const int32_t j = next[i];
    id[i] = static_cast<int32_t>(value & 0xFFFFFFFFu);
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    id[j] = -1;
  };

  if (count <= kScanLimit) {
    while (true) {
      uint64_t best = kNone;
      int32_t best_at = -1;
      for (int32_t i = 0; i >= 0; i = next[i]) {
        const uint64_t v = pair_value(i);
        if (v < best) {  // rank in the high bits: smaller is better; strict keeps the leftmost
          best = v;
          best_at = i;
        }
      }
      if (best_at < 0) break;
      merge_at(best_at, best);
    }
  } else {
    // (rank, position, left id, right id), smallest rank then leftmost first; entries whose
    // pair has changed since they were pushed are skipped when they surface.
    struct Candidate {
      uint32_t rank;
      int32_t at;
      int32_t left, right;
      uint32_t merged;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : at > o.at;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto push = [&](int32_t i) {
      if (i < 0) return;
      const uint64_t v = pair_value(i);
      if (v != kNone)
        heap.push({static_cast<uint32_t>(v >> 32), i, id[i], id[next[i]],
                   static_cast<uint32_t>(v & 0xFFFFFFFFu)});
    };
    for (int32_t i = 0; i >= 0; i = next[i])
      push(i);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      if (id[c.at] != c.left || next[c.at] < 0 || id[next[c.at]] != c.right) continue;
      merge_at(c.at, static_cast<uint64_t>(c.rank) << 32 | c.merged);
      push(prev[c.at]);
      push(c.at);
    }
  }
  for (int32_t i = 0; i >= 0; i = next[i])
    ids->push_back(id[i]);
}

void BpeModel::EncodePiece(std::string_view bytes, std::vector<int32_t>* ids) const {
  if (whole_piece_first_) {
    auto whole = bytes_to_id_.find(bytes);
    if (whole != bytes_to_id_.end()) {
      ids->push_back(whole->second);
      return;
    }
  }
  if (bytes.size() == 1) {
    const int32_t id = byte_to_id_[static_cast<uint8_t>(bytes[0])];
    if (id >= 0) ids->push_back(id);
    return;
  }
  PieceCache* cache = nullptr;
  if (bytes.size() <= kCacheMaxPiece) {
    cache = &ThreadCache(serial_);
    auto hit = cache->entries.find(std::string(bytes));
    if (hit != cache->entries.end()) {
      ids->insert(ids->end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  int32_t stack_symbols[kCacheMaxPiece];
  std::vector<int32_t> heap_symbols;
  int32_t* symbols = stack_symbols;
  if (bytes.size() > kCacheMaxPiece) {
    heap_symbols.resize(bytes.size());
    symbols = heap_symbols.data();
  }
  size_t count = 0;
  for (unsigned char b : bytes)
    if (byte_to_id_[b] >= 0) symbols[count++] = byte_to_id_[b];
  const size_t first = ids->size();
  if (count > 0) Merge(symbols, count, ids);
  if (cache != nullptr) {
    if (cache->entries.size() >= kCacheEntries) cache->entries.clear();
    cache->entries.emplace(std::string(bytes),
                           std::vector<int32_t>(ids->begin() + first, ids->end()));
  }
}

}  // namespace sy
