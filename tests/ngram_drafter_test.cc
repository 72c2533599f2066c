// N-gram lookup drafting (model/ngram_drafter.h) against a reference written the other way round:
// suffix lengths longest first, and for each, positions earliest first.
#include <gtest/gtest.h>

#include <random>

#include "model/ngram_drafter.h"

namespace sy {
namespace {

std::vector<int32_t> Reference(const std::vector<int32_t>& t, NgramLookup lookup, int64_t k) {
  const auto size = static_cast<int64_t>(t.size());
  for (int64_t n = std::min(lookup.max_n, size - 1); n >= lookup.min_n; --n)
    for (int64_t start = 0; start + n < size; ++start) {  // ends before the suffix's last token
      if (!std::equal(t.begin() + start, t.begin() + start + n, t.end() - n)) continue;
      const int64_t from = start + n;
      const int64_t count = lookup.drafts_by_match ? std::min(k, n - lookup.min_n + 1) : k;
      return {t.begin() + from, t.begin() + std::min(from + count, size)};
    }
  return {};
}

// vLLM's rule, k drafts whatever the match.
NgramLookup Fixed(int64_t min_n, int64_t max_n) {
  return {min_n, max_n, false};
}

TEST(NgramDrafterTest, TheLongestRecurringSuffixAtItsEarliestPlace) {
  // "7 8 9" recurs once (then 1 2); the shorter "8 9" recurs later too (then 5), and earlier.
  const std::vector<int32_t> t = {8, 9, 4, 7, 8, 9, 1, 2, 3, 8, 9, 5, 6, 7, 8, 9};
  EXPECT_EQ(NgramDrafts(t, Fixed(2, 5), 3), (std::vector<int32_t>{1, 2, 3}));
  // Limited to pairs: the earliest "8 9", at the start.
  EXPECT_EQ(NgramDrafts(t, Fixed(2, 2), 3), (std::vector<int32_t>{4, 7, 8}));
  // Needing 4 tokens: "6 7 8 9" never recurs.
  EXPECT_TRUE(NgramDrafts(t, Fixed(4, 5), 3).empty());
  EXPECT_EQ(NgramDrafts(t, Fixed(2, 5), 1), (std::vector<int32_t>{1}));
  EXPECT_TRUE(NgramDrafts(t, Fixed(2, 5), 0).empty());
}

TEST(NgramDrafterTest, ALongerMatchEarnsMoreDrafts) {
  const std::vector<int32_t> t = {8, 9, 4, 7, 8, 9, 1, 2, 3, 8, 9, 5, 6, 7, 8, 9};
  // "7 8 9", three tokens: two drafts from a minimum of 2, one from 3; the pair "8 9" earns one.
  EXPECT_EQ(NgramDrafts(t, {2, 5}, 4), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(NgramDrafts(t, {3, 5}, 4), (std::vector<int32_t>{1}));
  EXPECT_EQ(NgramDrafts(t, {2, 2}, 4), (std::vector<int32_t>{4}));
  EXPECT_EQ(NgramDrafts(t, {1, 5}, 4), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(NgramDrafts(t, {1, 5}, 2), (std::vector<int32_t>{1, 2}));  // k still caps
}

TEST(NgramDrafterTest, DraftsStopAtTheSequenceEndAndMayOverlapTheSuffix) {
  // "1 2 1 2 1": the suffix "1 2 1" occurs at the start, overlapping itself; what follows it runs
  // to the end: "2 1".
  const std::vector<int32_t> t = {1, 2, 1, 2, 1};
  EXPECT_EQ(NgramDrafts(t, Fixed(1, 3), 5), (std::vector<int32_t>{2, 1}));
  // A sequence too short for any n-gram before its suffix, and one token.
  EXPECT_TRUE(NgramDrafts(std::vector<int32_t>{3, 4}, Fixed(2, 5), 4).empty());
  EXPECT_TRUE(NgramDrafts(std::vector<int32_t>{3}, Fixed(1, 5), 4).empty());
  EXPECT_EQ(NgramDrafts(std::vector<int32_t>{3, 3}, Fixed(1, 5), 4), (std::vector<int32_t>{3}));
}

TEST(NgramDrafterTest, AgreesWithTheReferenceOnRandomSequences) {
  std::mt19937 random(7);
  int64_t found = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int alphabet = 2 + static_cast<int>(random() % 6);
    std::vector<int32_t> t(1 + random() % 60);
    for (auto& x : t)
      x = static_cast<int32_t>(random() % alphabet);
    const int64_t min_n = 1 + static_cast<int64_t>(random() % 4);
    const NgramLookup lookup{min_n, min_n + static_cast<int64_t>(random() % 4), trial % 2 == 0};
    const int64_t k = static_cast<int64_t>(random() % 7);
    const std::vector<int32_t> got = NgramDrafts(t, lookup, k);
    ASSERT_EQ(got, Reference(t, lookup, k))
        << "trial " << trial << " n " << lookup.min_n << ".." << lookup.max_n << " k " << k;
    found += !got.empty();
  }
  EXPECT_GT(found, 1000);  // the cases are not mostly empty
}

}  // namespace
}  // namespace sy
