// A ragged batch for one forward step ("TND" layout): the new tokens of several sequences
// concatenated without padding, each sequence with its own start position and latent cache.
// A prefill chunk has many tokens, a decode step one (two with MTP).
#pragma once

#include <cstdint>
#include <vector>

#include "model/latent_cache.h"

namespace sy {

struct SequenceSlice {
  int64_t token_offset = 0;    // first token of this sequence in ForwardBatch::tokens
  int64_t token_count = 0;     // query length this step
  int64_t start_position = 0;  // absolute position of the first token; equals cache->length
  SequenceCache* cache = nullptr;
  // With LogitRows::kLast: logits for every token of this sequence, not only its last (prompt
  // log-probabilities of a serving request).
  bool all_logit_rows = false;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;  // [total tokens]
  std::vector<SequenceSlice> sequences;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  // Appends a sequence's next tokens; positions continue from what its cache holds.
  void Add(const int32_t* ids, int64_t count, SequenceCache* cache) {
    sequences.push_back({size(), count, cache->length, cache});
    tokens.insert(tokens.end(), ids, ids + count);
  }
};

}  // namespace sy
