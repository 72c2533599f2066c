#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "model/batch.h"
#include "model/config.h"
#include "model/latent_cache.h"
#include "model/mla.h"
#include "tensor/dtype.h"

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

// A prompt's latent rows go into the cache over the threads: each row where its sequence and
// position put it, rounded to bf16 as F32ToBF16 rounds (subnormals kept, ties to even), and
// nothing else written.
TEST(LatentCacheTest, APromptsRowsAreWrittenWhereTheirSequencesPutThem) {
  ModelConfig config;
  config.kv_lora_rank = 512;
  config.qk_rope_head_dim = 64;
  const int64_t width = config.latent_cache_width(), page = 16, layer = 1;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    LatentCache cache(2, width, page, 40, dtype);
    SequenceCache a, b, c;
    ASSERT_TRUE(cache.Reserve(b, 30).ok());  // b's first 30 rows are there already
    ForwardBatch batch;
    std::vector<int32_t> ids(200, 5);
    batch.Add(ids.data(), 50, &a);
    batch.Add(ids.data(), 80, &b);
    batch.Add(ids.data(), 70, &c);
    ASSERT_EQ(batch.size(), 200);
    ASSERT_TRUE(cache.Reserve(a, 50).ok());
    ASSERT_TRUE(cache.Reserve(b, 30 + 80).ok());
    ASSERT_TRUE(cache.Reserve(c, 70).ok());
    std::mt19937 rng(3);
    std::vector<uint32_t> bits(static_cast<size_t>(batch.size() * width));
    for (auto& v : bits)  // any finite float, subnormals included
      do {
        v = static_cast<uint32_t>(rng());
      } while ((v & 0x7f800000u) == 0x7f800000u);
    std::vector<float> rows(bits.size());
    std::memcpy(rows.data(), bits.data(), bits.size() * sizeof(float));
    const float untouched = 7.0f;
    std::vector<float> mark(static_cast<size_t>(width), untouched);
    for (int64_t p = 0; p < 30; ++p)
      cache.Write(layer, b, p, mark.data());
    MlaWriteCache(config, layer, batch, rows.data(), cache);
    auto expect = [&](const SequenceCache& seq, int64_t first_token, int64_t position,
                      int64_t count) {
      std::vector<float> got(static_cast<size_t>((position + count) * width));
      cache.Gather(layer, seq, position + count, got.data());
      for (int64_t i = 0; i < count * width; ++i) {
        const float value = rows[first_token * width + i];
        const float want = dtype == DType::kBF16 ? BF16ToF32(F32ToBF16(value)) : value;
        ASSERT_EQ(0, std::memcmp(&want, &got[position * width + i], sizeof(float)))
            << DTypeName(dtype) << ": token " << first_token + i / width << ", column "
            << i % width;
      }
      for (int64_t i = 0; i < position * width; ++i)
        ASSERT_EQ(got[i], untouched) << "row " << i / width;
    };
    expect(a, 0, 0, 50);
    expect(b, 50, 30, 80);
    expect(c, 130, 0, 70);
  }
}

TEST(LatentCacheTest, BytesPerTokenOfDeepSeekV3InBf16) {
  LatentCache cache(61, 512 + 64, 16, 1, DType::kBF16);
  EXPECT_EQ(cache.BytesPerToken(), 70272);
}

}  // namespace
}  // namespace sy
