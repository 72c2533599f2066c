#include "model/ngram_drafter.h"

#include <algorithm>

namespace sy {

std::vector<int32_t> NgramDrafts(std::span<const int32_t> tokens, const NgramLookup& lookup,
                                 int64_t k) {
  const auto size = static_cast<int64_t>(tokens.size());
  const int64_t max_n = std::min(lookup.max_n, size - 1);
  if (k <= 0 || lookup.min_n < 1 || max_n < lookup.min_n) return {};
  // Every earlier end position, compared backwards with the suffix: O(size · max_n) at worst and
  // nearly always one comparison per position (a mismatch on the last token). The scan runs once
  // per decode step of a sequence, beside a forward pass that reads the whole model.
  const int32_t* t = tokens.data();
  const int32_t last = t[size - 1];
  int64_t best = 0, best_end = -1;
  for (int64_t end = 0; end + 1 < size; ++end) {
    if (t[end] != last) continue;
    const int64_t reach = std::min(max_n, end + 1);
    int64_t n = 1;
    while (n < reach && t[end - n] == t[size - 1 - n])
      ++n;
    if (n > best) {  // strictly longer: the earliest place of the longest suffix is kept
      best = n;
      best_end = end;
      if (best == max_n) break;
    }
  }
  if (best < lookup.min_n) return {};
  if (lookup.drafts_by_match) k = std::min(k, best - lookup.min_n + 1);
  const int64_t from = best_end + 1, count = std::min(k, size - from);
  return {t + from, t + from + count};
}

}  // namespace sy
