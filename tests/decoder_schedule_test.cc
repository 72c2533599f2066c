// Cutting a step's batch into micro-batches and SP shards: every token lands in exactly one
// part and shard, sequences cut in two continue at the right position.
#include <gtest/gtest.h>

#include "model/decoder_schedule.h"

namespace sy {
namespace {

ForwardBatch ThreeSequences(std::vector<SequenceCache>& caches) {
  caches.resize(3);
  caches[1].length = 10;  // a sequence continuing from position 10
  std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ForwardBatch batch;
  batch.Add(ids.data(), 5, &caches[0]);
  batch.Add(ids.data() + 5, 1, &caches[1]);
  batch.Add(ids.data() + 6, 3, &caches[2]);
  return batch;
}

TEST(SplitBatchTest, TwoPartsCutASequenceAndContinueItsPositions) {
  std::vector<SequenceCache> caches;
  ForwardBatch batch = ThreeSequences(caches);
  auto parts = SplitBatch(batch, 2, 1, 0);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].batch.size(), 4);  // 9 tokens: 4 + 5
  EXPECT_EQ(parts[1].batch.size(), 5);
  EXPECT_EQ(parts[1].first_token, 4);
  // Sequence 0 (5 tokens) is cut after its 4th token; its last token opens part 1 at position 4.
  ASSERT_EQ(parts[0].batch.sequences.size(), 1u);
  ASSERT_EQ(parts[1].batch.sequences.size(), 3u);
  EXPECT_EQ(parts[1].batch.sequences[0].start_position, 4);
  EXPECT_EQ(parts[1].batch.sequences[0].token_count, 1);
  EXPECT_EQ(parts[1].batch.sequences[0].cache, &caches[0]);
  EXPECT_EQ(parts[1].batch.sequences[1].start_position, 10);
  EXPECT_EQ(parts[1].batch.sequences[2].token_offset, 2);
  EXPECT_EQ(parts[1].positions, (std::vector<int64_t>{4, 10, 0, 1, 2}));
  EXPECT_EQ(parts[1].batch.tokens, (std::vector<int32_t>{5, 6, 7, 8, 9}));
  EXPECT_EQ(parts[0].rows, 4);  // no SP: every row of the part
}

TEST(SplitBatchTest, AlwaysTheAskedNumberOfPartsEvenWhenEmpty) {
  ForwardBatch empty;
  auto parts = SplitBatch(empty, 2, 1, 0);
  ASSERT_EQ(parts.size(), 2u);  // an idle rank still makes both micro-batches' exchanges
  EXPECT_EQ(parts[0].batch.size(), 0);
  EXPECT_EQ(parts[1].rows, 0);
  std::vector<SequenceCache> caches(1);
  ForwardBatch one;
  int32_t id = 3;
  one.Add(&id, 1, &caches[0]);
  parts = SplitBatch(one, 2, 1, 0);
  EXPECT_EQ(parts[0].batch.size() + parts[1].batch.size(), 1);
}

TEST(SplitBatchTest, SequenceShardsCoverEveryRowOnce) {
  std::vector<SequenceCache> caches;
  ForwardBatch batch = ThreeSequences(caches);
  for (int parts_count : {1, 2}) {
    for (int sp : {1, 2, 4}) {
      std::vector<int> owner(static_cast<size_t>(batch.size()), 0);
      for (int r = 0; r < sp; ++r) {
        auto parts = SplitBatch(batch, parts_count, sp, r);
        for (const MicroBatch& mb : parts)
          for (int64_t i = 0; i < mb.rows; ++i)
            ++owner[mb.first_token + mb.row_begin + i];
      }
      for (int count : owner)
        EXPECT_EQ(count, 1) << parts_count << " parts, SP " << sp;
    }
  }
}

}  // namespace
}  // namespace sy
