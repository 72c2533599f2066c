#include <gtest/gtest.h>

#include "model/latent_cache.h"

namespace sy {
namespace {

TEST(LatentCacheTest, PagesAreReservedTruncatedAndReused) {
  LatentCache cache(/*layers=*/2, /*row_width=*/3, /*page_size=*/4, /*pages=*/3, DType::kF32);
  SequenceCache a, b;
  ASSERT_TRUE(cache.Reserve(a, 5).ok());  // 2 pages
  EXPECT_EQ(a.pages.size(), 2u);
  EXPECT_EQ(cache.free_pages(), 1);
  EXPECT_FALSE(cache.Reserve(b, 5).ok());  // needs 2, 1 free
  EXPECT_TRUE(b.pages.empty());
  cache.Truncate(a, 4);  // back to one page
  EXPECT_EQ(cache.free_pages(), 2);
  EXPECT_EQ(a.length, 4);
  ASSERT_TRUE(cache.Reserve(b, 8).ok());
  cache.Release(a);
  EXPECT_EQ(cache.free_pages(), 1);
}

TEST(LatentCacheTest, RowsRoundTripAcrossPages) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    LatentCache cache(2, 3, 2, 8, dtype);
    SequenceCache a, b;
    ASSERT_TRUE(cache.Reserve(a, 5).ok());
    ASSERT_TRUE(cache.Reserve(b, 3).ok());
    for (int64_t p = 0; p < 5; ++p) {
      float row[3] = {static_cast<float>(p), 0.5f, -static_cast<float>(p)};
      cache.Write(1, a, p, row);
      float other[3] = {100.0f + p, 1, 2};
      if (p < 3) cache.Write(1, b, p, other);
    }
    std::vector<float> out(15);
    cache.Gather(1, a, 5, out.data());
    for (int64_t p = 0; p < 5; ++p) {
      EXPECT_EQ(out[p * 3], static_cast<float>(p));
      EXPECT_EQ(out[p * 3 + 1], 0.5f);
      EXPECT_EQ(out[p * 3 + 2], -static_cast<float>(p));
    }
  }
}

TEST(LatentCacheTest, BytesPerTokenOfDeepSeekV3InBf16) {
  LatentCache cache(61, 512 + 64, 16, 1, DType::kBF16);
  EXPECT_EQ(cache.BytesPerToken(), 70272);
}

}  // namespace
}  // namespace sy
