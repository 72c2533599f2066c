// The byte-level BPE model: a piece's bytes become one symbol each, then adjacent pairs merge in
// rank order (lowest first, leftmost on ties) exactly as Hugging Face tokenizers' BPE does.
// Written here because it is the product's hot path: merges are looked up by id pairs in a flat
// hash table, and each thread keeps a cache of recent pieces.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace sy {

// How many unused ids a vocabulary (or its added tokens) may leave between 0 and its largest id.
constexpr int64_t kIdSlack = 65536;

class BpeModel {
 public:
  // Parses the "model" object of tokenizer.json (type BPE, byte-level vocabulary).
  static Result<BpeModel> FromJson(const nlohmann::json& model);
  // A tiktoken vocabulary: `token_bytes[rank]` is the raw bytes of the token with that rank (and
  // id); empty where a rank is unused. tiktoken's rule, not tokenizers': a piece that is itself a
  // token is that token, and otherwise the adjacent pair whose concatenation has the lowest rank
  // merges first (leftmost on ties). Every split of a token into two tokens is a merge ranked as
  // the token, so two pairs making the same token tie and the leftmost wins, as in tiktoken; a
  // tokenizer.json merge list cannot say that (its ranks are its positions).
  static Result<BpeModel> FromRanks(const std::vector<std::string>& token_bytes);

  // Appends the ids of one pre-tokenized piece (raw bytes).
  void EncodePiece(std::string_view bytes, std::vector<int32_t>* ids) const;

  // Vocabulary strings, indexed by id (empty where an id is unused).
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }
  const std::unordered_map<std::string, int32_t>& token_to_id() const { return token_to_id_; }

 private:
  struct MergeTable {
    // Open addressing over (left << 32 | right) keys; value = rank << 32 | merged id.
    std::vector<uint64_t> keys;
    std::vector<uint64_t> values;
    uint64_t mask = 0;
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    void Reserve(size_t count);
    void Insert(uint64_t key, uint64_t value);
    // kEmpty when absent.
    uint64_t Find(uint64_t key) const {
      for (uint64_t slot = Hash(key) & mask;; slot = (slot + 1) & mask) {
        if (keys[slot] == key) return values[slot];
        if (keys[slot] == kEmpty) return kEmpty;
      }
    }
    static uint64_t Hash(uint64_t key) { return (key * 0x9E3779B97F4A7C15ull) >> 20; }
  };

  void Merge(const int32_t* symbols, size_t count, std::vector<int32_t>* ids) const;

  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  int32_t byte_to_id_[256];  // -1 where the vocabulary lacks a byte (the byte is dropped)
  // tokenizers' ignore_merges (and tiktoken's rule): a piece that is a token whole is that token.
  // Raw bytes → id, filled only then.
  bool whole_piece_first_ = false;
  struct BytesHash {
    using is_transparent = void;  // looked up by string_view, no copy per piece
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  std::unordered_map<std::string, int32_t, BytesHash, std::equal_to<>> bytes_to_id_;
  MergeTable merges_;
  uint64_t serial_ = 0;  // identifies this model to the per-thread piece caches
};

}  // namespace sy
