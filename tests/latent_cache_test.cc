#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/latent_row.h"
#include "kernels/cpu/mla_decode.h"
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

// 512 e4m3 codes, 4 exponents and 64 bf16 values: 644 bytes a row.
TEST(LatentCacheTest, BytesPerTokenOfDeepSeekV3InFp8) {
  LatentCache cache(61, 512 + 64, 16, 1, DType::kF8E4M3, 512);
  EXPECT_EQ(cache.BytesPerToken(), 61 * 644);
  // A DSA row's index keys (128 more values) are bf16 after the rope part.
  EXPECT_EQ(kernels::LatentRowLayout::Of(DType::kF8E4M3, 512 + 64 + 128, 512).row_bytes, 900);
  // An odd count of codes and exponents is padded to an even byte before the bf16 values.
  const auto odd = kernels::LatentRowLayout::Of(DType::kF8E4M3, 40 + 6, 40);
  EXPECT_EQ(odd.tail, 42);
  EXPECT_EQ(odd.row_bytes, 54);
}

// Rows of 300 latent values (scale blocks of 128, 128 and 44) and 20 more, at magnitudes from
// 1e-38 to 1e30: each block's exponent is the smallest e with max|x| ≤ 448 · 2^e (inside
// ±100), each latent value reads back as the e4m3 value times 2^e nearest to it (ties to the
// even code), found here by trying every code, and the other columns as bf16 rounds them.
std::vector<float> Fp8TestRows(int64_t rows, int64_t width, int64_t latent) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const float magnitudes[] = {1.0f, 1e-3f, 3e4f, 0.0f, 1e-38f, 1e30f, 448.0f, 7.0f};
  std::vector<float> values(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < width; ++d) {
      const float magnitude = magnitudes[(r + d / 128) % 8];
      values[r * width + d] = d < latent ? normal(rng) * magnitude : normal(rng);
    }
  // Exact powers of two times 448 (a block's largest on the boundary) and a tie between codes.
  values[0] = 448.0f * 4.0f;
  values[1] = 1.0625f * 4.0f;  // halfway between codes 1.0 and 1.125 of scale 4
  return values;
}

TEST(LatentCacheTest, Fp8RowsHoldTheNearestScaledCodes) {
  const int64_t latent = 300, width = latent + 20, rows = 16;
  const auto layout = kernels::LatentRowLayout::Of(DType::kF8E4M3, width, latent);
  ASSERT_EQ(layout.scale_blocks(), 3);
  const std::vector<float> values = Fp8TestRows(rows, width, latent);
  std::vector<uint8_t> row(static_cast<size_t>(layout.row_bytes));
  std::vector<float> got(static_cast<size_t>(width));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = values.data() + r * width;
    kernels::EncodeLatentRow(layout, x, row.data());
    kernels::DecodeLatentRow(layout, row.data(), 0, width, got.data());
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t begin = b * 128, end = std::min<int64_t>(latent, begin + 128);
      double max_abs = 0;
      for (int64_t d = begin; d < end; ++d)
        max_abs = std::max(max_abs, std::fabs(static_cast<double>(x[d])));
      const int e = static_cast<int8_t>(row[latent + b]);
      if (max_abs > 0) {
        EXPECT_TRUE(max_abs <= std::ldexp(448.0, e) || e == 100) << "row " << r << " block " << b;
        EXPECT_TRUE(max_abs > std::ldexp(448.0, e - 1) || e == -100)
            << "row " << r << " block " << b << ": " << max_abs << " at exponent " << e;
      }
      for (int64_t d = begin; d < end; ++d) {
        double best = 0;
        int best_code = 0;
        double best_distance = INFINITY;
        for (int code = 0; code < 256; ++code) {
          if ((code & 0x7f) == 0x7f) continue;  // NaN
          const double v =
              std::ldexp(static_cast<double>(F8E4M3ToF32(static_cast<uint8_t>(code))), e);
          const double distance = std::fabs(v - static_cast<double>(x[d]));
          if (distance < best_distance ||
              (distance == best_distance && (code & 1) == 0 && (best_code & 1) == 1)) {
            best_distance = distance;
            best = v;
            best_code = code;
          }
        }
        ASSERT_EQ(static_cast<double>(got[d]), best)
            << "row " << r << " column " << d << ": " << x[d] << " at exponent " << e;
      }
    }
    for (int64_t d = latent; d < width; ++d)
      ASSERT_EQ(got[d], BF16ToF32(F32ToBF16(x[d]))) << "row " << r << " column " << d;
    // Any run of columns reads back as the same values (blocks entered and left midway).
    for (auto [column, count] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 1}, {5, 200}, {127, 2}, {130, 190}, {299, 3}, {310, 10}}) {
      std::vector<float> part(static_cast<size_t>(count));
      kernels::DecodeLatentRow(layout, row.data(), column, count, part.data());
      ASSERT_EQ(0, std::memcmp(part.data(), got.data() + column, part.size() * sizeof(float)))
          << column << "+" << count;
    }
  }
  // NaN stays NaN; the rest of its block is unaffected.
  std::vector<float> x(values.begin(), values.begin() + width);
  x[3] = NAN;
  kernels::EncodeLatentRow(layout, x.data(), row.data());
  kernels::DecodeLatentRow(layout, row.data(), 0, width, got.data());
  EXPECT_TRUE(std::isnan(got[3]));
  EXPECT_EQ(got[0], 448.0f * 4.0f);
}

// What the bf16 kernels read in an fp8 row's place (StageLatentRowBf16): every code, at
// exponents from -100 to 100, widened to bf16 — the AVX-512 table lookup where the CPU has it
// and the portable one — is exactly the value the row holds.
TEST(LatentCacheTest, Fp8RowsWidenToBf16Exactly) {
  const int64_t latent = 256 + 32, width = latent + 24;
  const auto layout = kernels::LatentRowLayout::Of(DType::kF8E4M3, width, latent);
  std::vector<uint8_t> row(static_cast<size_t>(layout.row_bytes));
  std::vector<float> decoded(static_cast<size_t>(width));
  std::vector<uint16_t> staged(static_cast<size_t>(width));
  for (kernels::IsaLevel level : {kernels::IsaLevel::kNative, kernels::IsaLevel::kAvx2}) {
    kernels::SetMaxIsaLevel(level);
    for (int e = -100; e <= 100; e += 8) {
      for (int64_t d = 0; d < latent; ++d)
        row[d] = static_cast<uint8_t>((d * 7 + e + 256) % 256);  // every code, NaN's included
      for (int64_t b = 0; b < layout.scale_blocks(); ++b)
        row[latent + b] = static_cast<uint8_t>(
            static_cast<int8_t>(std::clamp(e + 3 * static_cast<int>(b), -100, 100)));
      for (int64_t d = latent; d < width; ++d) {
        const uint16_t bits = F32ToBF16(0.5f * static_cast<float>(d - latent) - 3.0f);
        std::memcpy(row.data() + layout.tail + (d - latent) * 2, &bits, 2);
      }
      kernels::DecodeLatentRow(layout, row.data(), 0, width, decoded.data());
      kernels::StageLatentRowBf16(layout, row.data(), width, staged.data());
      for (int64_t d = 0; d < width; ++d) {
        const float widened = BF16ToF32(staged[d]);
        if (std::isnan(decoded[d])) {
          ASSERT_TRUE(std::isnan(widened)) << "column " << d << " exponent " << e;
          continue;
        }
        ASSERT_EQ(0, std::memcmp(&widened, &decoded[d], 4))
            << "column " << d << " code " << int{row[d]} << " exponent " << e << ": " << widened
            << " against " << decoded[d] << " at " << kernels::IsaLevelName(level);
      }
    }
  }
  kernels::SetMaxIsaLevel(kernels::IsaLevel::kNative);
}

// The cache's own paths over fp8 rows: written, gathered, copied out and in (disaggregation),
// and a kept page's rows copied (the prefix cache) — all the same values; and an f32 cache told
// to round as fp8 holds those values exactly.
TEST(LatentCacheTest, Fp8RowsSurviveEveryCopyAndMatchAnF32CacheRoundingAsFp8) {
  const int64_t latent = 300, width = latent + 20, rows = 16, page = 4;
  const std::vector<float> values = Fp8TestRows(rows, width, latent);
  LatentCache fp8(2, width, page, 12, DType::kF8E4M3, latent);
  LatentCache f32(2, width, page, 12, DType::kF32, latent);
  f32.RoundRowsAs(DType::kF8E4M3);
  SequenceCache a, b, c, d;
  ASSERT_TRUE(fp8.Reserve(a, rows).ok());
  ASSERT_TRUE(f32.Reserve(d, rows).ok());
  for (int64_t p = 0; p < rows; ++p) {
    fp8.Write(1, a, p, values.data() + p * width);
    f32.Write(1, d, p, values.data() + p * width);
  }
  std::vector<float> want(values.size()), got(values.size());
  fp8.Gather(1, a, rows, want.data());
  f32.Gather(1, d, rows, got.data());
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
  // Rows out and into another sequence, as a decode instance receives them.
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * fp8.row_bytes()));
  fp8.CopyRows(1, a, 0, rows, bytes.data());
  ASSERT_TRUE(fp8.Reserve(b, rows).ok());
  fp8.WriteRows(1, b, 0, rows, bytes.data());
  fp8.Gather(1, b, rows, got.data());
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
  // Page 2 of a (rows 8..11) copied, three rows of it, into c's first page.
  ASSERT_TRUE(fp8.Reserve(c, 3).ok());
  fp8.CopyPageRows(a.pages[2], c.pages[0], 3);
  fp8.Gather(1, c, 3, got.data());
  EXPECT_EQ(0, std::memcmp(want.data() + 8 * width, got.data(), 3 * width * sizeof(float)));
  // Columns from the middle (a DSA model's index keys are gathered so).
  std::vector<float> columns(static_cast<size_t>(rows * 30));
  fp8.GatherColumns(1, a, rows, 290, 30, columns.data());
  for (int64_t p = 0; p < rows; ++p)
    ASSERT_EQ(
        0, std::memcmp(columns.data() + p * 30, want.data() + p * width + 290, 30 * sizeof(float)));
}

}  // namespace
}  // namespace sy
