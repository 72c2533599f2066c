// The reference kernels against direct double-precision formulas, at awkward sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "base/allocator.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/router.h"
#include "kernels/cpu/weighted_sum.h"
#include "tensor/dtype.h"

namespace sy {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v)
    x = normal(rng);
  return v;
}

// An fp8 matrix with block scales and its exact f32 values.
struct Fp8Matrix {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<float> values;
  Matrix view;
};

Fp8Matrix MakeFp8(int64_t rows, int64_t cols, int64_t block, uint32_t seed) {
  Fp8Matrix m;
  auto raw = Random(static_cast<size_t>(rows * cols), seed);
  const int64_t scale_cols = (cols + block - 1) / block, scale_rows = (rows + block - 1) / block;
  m.scales.resize(static_cast<size_t>(scale_rows * scale_cols));
  for (size_t i = 0; i < m.scales.size(); ++i)
    m.scales[i] = 0.01f * (1 + i % 7);
  m.bytes.resize(raw.size());
  m.values.resize(raw.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float scale = m.scales[(r / block) * scale_cols + c / block];
      uint8_t q = F32ToF8E4M3(raw[r * cols + c] * 30);
      m.bytes[r * cols + c] = q;
      m.values[r * cols + c] = F8E4M3ToF32(q) * scale;
    }
  m.view.dtype = DType::kF8E4M3;
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.data = m.bytes.data();
  m.view.block_scales = m.scales.data();
  m.view.block_rows = m.view.block_cols = block;
  m.view.scale_cols = scale_cols;
  return m;
}

TEST(LinearTest, Fp8WithPartialBlocksMatchesDequantizedProduct) {
  const int64_t rows = 37, cols = 45, tokens = 3, block = 16;
  Fp8Matrix w = MakeFp8(rows, cols, block, 1);
  auto x = Random(static_cast<size_t>(tokens * cols), 2);
  std::vector<float> y(static_cast<size_t>(tokens * rows));
  kernels::Linear(x.data(), tokens, w.view, y.data());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < rows; ++o) {
      double expected = 0;
      for (int64_t i = 0; i < cols; ++i)
        expected += static_cast<double>(x[t * cols + i]) * w.values[o * cols + i];
      EXPECT_NEAR(y[t * rows + o], expected, 1e-4 * (1 + std::fabs(expected)));
    }
}

TEST(LinearTest, RowSliceUsesTheRightScales) {
  Fp8Matrix w = MakeFp8(40, 20, 16, 3);
  Matrix slice = w.view.RowSlice(17, 9);  // starts inside the second row block
  std::vector<float> row(20);
  for (int64_t r = 0; r < 9; ++r) {
    slice.DecodeRow(r, row.data());
    for (int64_t c = 0; c < 20; ++c)
      EXPECT_EQ(row[c], w.values[(17 + r) * 20 + c]);
  }
}

TEST(LinearTest, TransposedMatchesDirectSum) {
  const int64_t rows = 13, cols = 29, tokens = 2;
  auto values = Random(static_cast<size_t>(rows * cols), 4);
  Matrix w;
  w.dtype = DType::kF32;
  w.rows = rows;
  w.cols = cols;
  w.data = reinterpret_cast<const uint8_t*>(values.data());
  auto x = Random(static_cast<size_t>(tokens * rows), 5);
  std::vector<float> y(static_cast<size_t>(tokens * cols));
  kernels::LinearTransposed(x.data(), tokens, w, y.data());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < cols; ++c) {
      double expected = 0;
      for (int64_t r = 0; r < rows; ++r)
        expected += static_cast<double>(x[t * rows + r]) * values[r * cols + c];
      EXPECT_NEAR(y[t * cols + c], expected, 1e-4);
    }
}

TEST(ElementwiseTest, RmsNormAndSoftmax) {
  std::vector<float> x = {1, 2, 3, 4}, w = {1, 0.5f, 2, 1}, out(4);
  kernels::RmsNorm(x.data(), 1, 4, w.data(), 0.0f, out.data());
  const float inv = 1.0f / std::sqrt(7.5f);
  EXPECT_FLOAT_EQ(out[1], 2 * inv * 0.5f);
  std::vector<float> s = {1, 2, 3};
  kernels::Softmax(s.data(), 3);
  EXPECT_NEAR(s[2], std::exp(3.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0)), 1e-6);
}

// The vector paths at widths with tails, against double formulas.
TEST(ElementwiseTest, RmsNormRowsMatchDoubleAtAwkwardWidths) {
  for (int64_t width : {1, 7, 33, 2048, 7171}) {
    const int64_t rows = 3;
    std::vector<float> x = Random(static_cast<size_t>(rows * width), 5, 3.0f);
    std::vector<float> w = Random(static_cast<size_t>(width), 6);
    std::vector<float> out(x.size());
    kernels::RmsNorm(x.data(), rows, width, w.data(), 1e-6f, out.data());
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (int64_t c = 0; c < width; ++c)
        sum += static_cast<double>(x[r * width + c]) * x[r * width + c];
      const double inverse = 1.0 / std::sqrt(sum / width + 1e-6);
      for (int64_t c = 0; c < width; ++c) {
        const double want = x[r * width + c] * inverse * w[c];
        ASSERT_NEAR(out[r * width + c], want, 1e-5 * std::max(1.0, std::fabs(want)))
            << "width " << width << " row " << r << " col " << c;
      }
    }
  }
}

TEST(ElementwiseTest, SiluMulMatchesDoubleAndKeepsNaN) {
  for (int64_t count : {1, 9, 64, 1003}) {
    std::vector<float> gate = Random(static_cast<size_t>(count), 7, 6.0f);
    std::vector<float> up = Random(static_cast<size_t>(count), 8);
    gate[0] = -200.0f;  // exp(200) overflows f32: the product is ~0, not NaN
    if (count > 1) gate[1] = 95.0f;
    std::vector<float> out = gate;
    kernels::SiluMul(out.data(), up.data(), count);
    for (int64_t i = 0; i < count; ++i) {
      const double g = gate[i], want = g / (1.0 + std::exp(-g)) * up[i];
      ASSERT_NEAR(out[i], want, 2e-6 * std::max(1.0, std::fabs(want)))
          << "count " << count << " element " << i;
    }
  }
  std::vector<float> gate(17, 1.0f), up(17, 1.0f);
  gate[3] = NAN;
  gate[16] = NAN;  // in the scalar tail
  kernels::SiluMul(gate.data(), up.data(), 17);
  EXPECT_TRUE(std::isnan(gate[3]));
  EXPECT_TRUE(std::isnan(gate[16]));
  EXPECT_FALSE(std::isnan(gate[4]));
}

// The routing sum: every product rounded, then every sum, in order, as the plain loop (this
// file is built without fused multiply-adds) — whatever the vector width, with and without the
// shared row, for widths that end in a partial vector.
TEST(ElementwiseTest, WeightedRowSumHasTheBitsOfThePlainLoop) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t n : {1, 7, 16, 37, 2048})
    for (int64_t count : {1, 4, 8})
      for (bool with_extra : {false, true}) {
        std::vector<std::vector<float>> rows(static_cast<size_t>(count),
                                             std::vector<float>(static_cast<size_t>(n)));
        std::vector<const float*> pointers;
        std::vector<float> weights, extra(static_cast<size_t>(n));
        for (auto& row : rows) {
          for (float& v : row)
            v = normal(rng);
          pointers.push_back(row.data());
          weights.push_back(normal(rng) * 0.3f);
        }
        for (float& v : extra)
          v = normal(rng);
        std::vector<float> want(static_cast<size_t>(n)), got(want.size(), -1.0f);
        for (int64_t i = 0; i < n; ++i) {
          float sum = 0.0f;
          for (int64_t k = 0; k < count; ++k) {
            const float product = weights[k] * rows[k][i];
            sum = sum + product;
          }
          want[i] = with_extra ? sum + extra[i] : sum;
        }
        kernels::WeightedRowSum(pointers.data(), weights.data(), count,
                                with_extra ? extra.data() : nullptr, n, got.data());
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << n << " values, " << count << " rows, extra " << with_extra;
      }
}

// Rows that AMX tile loads read start on 64-byte lines, whatever malloc's alignment: every size,
// every growth, and the activations' int8 codes.
TEST(AllocatorTest, TileRowsStartOnCacheLines) {
  for (int64_t count : {1, 3, 17, 1000, 100000}) {
    CacheLineVector<uint16_t> v(static_cast<size_t>(count));
    EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(v.data()) % 64) << count;
    v.resize(static_cast<size_t>(3 * count + 5));
    EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(v.data()) % 64) << count;
    auto a = UninitializedCacheLineArray<float>(count);
    EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(a.get()) % 64) << count;
  }
  kernels::Int8Rows rows;
  rows.codes.resize(77);
  EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(rows.codes.data()) % 64);
}

TEST(ElementwiseTest, RopeRotatesConsecutivePairs) {
  std::vector<float> v = {1, 0, 0, 1}, inv_freq = {1.0f, 0.5f};
  kernels::RopePairwise(v.data(), 4, 2, inv_freq.data(), 1.0f);
  EXPECT_NEAR(v[0], std::cos(2.0f), 1e-6);  // pair 0 by angle 2
  EXPECT_NEAR(v[1], std::sin(2.0f), 1e-6);
  EXPECT_NEAR(v[2], -std::sin(1.0f), 1e-6);  // pair 1 by angle 1
  EXPECT_NEAR(v[3], std::cos(1.0f), 1e-6);
}

kernels::RouterParams V3Params() {
  kernels::RouterParams p;
  p.experts = 8;
  p.groups = 4;
  p.groups_kept = 2;
  p.top_k = 2;
  p.sigmoid = true;
  p.group_score = kernels::GroupScore::kSumOfTop2;
  p.normalize = true;
  p.scale = 2.5f;
  return p;
}

TEST(RouterTest, BiasSelectsButDoesNotWeigh) {
  auto p = V3Params();
  p.groups = 1;
  p.groups_kept = 1;
  std::vector<float> logits = {2.0f, 1.0f, 0, 0, 0, 0, 0, 0};
  std::vector<float> bias = {0, 0, 0, 0, 0, 0, 0, 0.9f};  // lifts expert 7 above expert 1
  int32_t ids[2];
  float weights[2];
  kernels::Route(logits.data(), 1, bias.data(), p, ids, weights);
  EXPECT_EQ(ids[0], 7);  // sigmoid(0) + 0.9 = 1.4 > sigmoid(2) = 0.88
  EXPECT_EQ(ids[1], 0);
  const float s0 = 1 / (1 + std::exp(-2.0f)), s7 = 0.5f;
  EXPECT_NEAR(weights[0], s7 / (s0 + s7) * 2.5f, 1e-6);
  EXPECT_NEAR(weights[1], s0 / (s0 + s7) * 2.5f, 1e-6);
}

TEST(RouterTest, GroupScoreIsTheSumOfTheTopTwo) {
  auto p = V3Params();
  // Group 0 = {0,1}: one strong expert; group 1 = {2,3}: two good ones; groups 2, 3 weak.
  std::vector<float> logits = {3.0f, -3.0f, 1.0f, 1.0f, -2, -2, -1, -5};
  int32_t ids[2];
  float weights[2];
  kernels::Route(logits.data(), 1, nullptr, p, ids, weights);
  // Group sums: g0 = .953+.047 = 1.0, g1 = 1.46, g2 = .24, g3 = .27 -> keep g1 and g0.
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 2);  // 2 and 3 tie: the lower index wins
  // With the max rule (V2), the same logits keep g0 and g1 too, but a case where they differ:
  std::vector<float> close = {2.0f, -9.0f, 1.9f, 1.9f, -9, -9, -9, -9};
  p.group_score = kernels::GroupScore::kMax;
  p.groups_kept = 1;
  kernels::Route(close.data(), 1, nullptr, p, ids, weights);
  EXPECT_EQ(ids[0], 0);  // max: g0 (2.0) beats g1 (1.9); the top-2 sum would choose g1
  EXPECT_EQ(ids[1], 1);
  p.group_score = kernels::GroupScore::kSumOfTop2;
  kernels::Route(close.data(), 1, nullptr, p, ids, weights);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 3);
}

TEST(RouterTest, SoftmaxGreedyWithoutRenormalization) {
  kernels::RouterParams p;
  p.experts = 4;
  p.top_k = 2;
  p.sigmoid = false;
  p.group_score = kernels::GroupScore::kNone;
  p.normalize = false;
  p.scale = 2.0f;
  std::vector<float> logits = {0, 1, 2, 3};
  int32_t ids[2];
  float weights[2];
  kernels::Route(logits.data(), 1, nullptr, p, ids, weights);
  double z = 1 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_EQ(ids[0], 3);
  EXPECT_NEAR(weights[0], 2 * std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(weights[1], 2 * std::exp(2.0) / z, 1e-6);
}

// A prompt's tokens are routed over the threads: every token gets what it gets routed alone.
TEST(RouterTest, ManyTokensAreEachRoutedAsAlone) {
  const auto p = V3Params();
  const int64_t tokens = 1000;
  const auto logits = Random(static_cast<size_t>(tokens * p.experts), 15, 2.0f);
  const auto bias = Random(static_cast<size_t>(p.experts), 16, 0.1f);
  std::vector<int32_t> ids(static_cast<size_t>(tokens * p.top_k), -1);
  std::vector<float> weights(ids.size(), -1.0f);
  kernels::Route(logits.data(), tokens, bias.data(), p, ids.data(), weights.data());
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> one_ids(static_cast<size_t>(p.top_k));
    std::vector<float> one_weights(one_ids.size());
    kernels::Route(logits.data() + t * p.experts, 1, bias.data(), p, one_ids.data(),
                   one_weights.data());
    for (int64_t k = 0; k < p.top_k; ++k) {
      ASSERT_EQ(ids[t * p.top_k + k], one_ids[k]) << "token " << t;
      ASSERT_EQ(weights[t * p.top_k + k], one_weights[k]) << "token " << t;
    }
  }
}

// The vector rounding to bf16 is F32ToBF16 bit for bit: ties to even both ways, the largest
// finite values rounding up to infinity, subnormals kept (the CPUs' own conversions flush them),
// NaNs quieted with their sign and payload's top bits, in the vector body and in the tail.
TEST(ElementwiseTest, RoundToBf16GivesTheBitsOfTheScalarRounding) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
                                0x3f817fffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f800000u,
                                0xff800000u, 0x7f800001u, 0xffc00000u, 0x7fbfffffu, 0x00000001u,
                                0x80008000u, 0x00018000u, 0x007fffffu, 0x807fffffu, 0x00800000u};
  std::mt19937 rng(17);
  for (int i = 0; i < 5000; ++i)
    bits.push_back(static_cast<uint32_t>(rng()));
  for (size_t count : {bits.size(), size_t{3}, size_t{17}}) {
    std::vector<float> x(count);
    std::memcpy(x.data(), bits.data(), count * sizeof(float));
    std::vector<uint16_t> got(count, 0x1234);
    kernels::RoundToBf16(x.data(), static_cast<int64_t>(count), got.data());
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(got[i], F32ToBF16(x[i])) << "bits " << std::hex << bits[i] << ", count " << count;
  }
}

TEST(ElementwiseTest, WidenBf16GivesEveryValuesBitsInF32) {
  std::vector<uint16_t> bits(65536);
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = static_cast<uint16_t>(i);
  for (size_t count : {bits.size(), size_t{3}, size_t{17}}) {
    std::vector<float> got(count, -1.0f);
    kernels::WidenBf16(bits.data() + 1, static_cast<int64_t>(count - 1), got.data());
    for (size_t i = 0; i + 1 < count; ++i) {
      uint32_t want = static_cast<uint32_t>(bits[i + 1]) << 16, have = 0;
      std::memcpy(&have, &got[i], 4);
      ASSERT_EQ(have, want) << "bf16 " << std::hex << bits[i + 1] << ", count " << count;
    }
    ASSERT_EQ(got[count - 1], -1.0f) << "wrote past the end, count " << count;
  }
}

// The rotation a prompt's tokens take (one table per token, applied to every head) has the bits of
// RopePairwise, the one-step form, for every width: whole vectors and the pairs after them.
TEST(ElementwiseTest, RopeTableThenApplyRopeGiveRopePairwisesBits) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> value(-40.0f, 40.0f);
  for (int64_t dim : {2, 6, 16, 18, 34, 64, 66, 128}) {
    std::vector<float> inv_freq(static_cast<size_t>(dim / 2));
    for (size_t i = 0; i < inv_freq.size(); ++i)
      inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(dim));
    for (int64_t position : {0, 1, 7, 4095, 163839}) {
      std::vector<float> x(static_cast<size_t>(dim));
      for (float& v : x)
        v = value(rng);
      x[0] = 3.4e38f;       // a product past f32's range: inf, as in the scalar form
      x[dim - 1] = 1e-40f;  // subnormal
      std::vector<float> want = x, got = x, table(static_cast<size_t>(dim));
      kernels::RopePairwise(want.data(), dim, position, inv_freq.data(), 1.25f);
      kernels::RopeTable(dim, position, inv_freq.data(), 1.25f, table.data());
      kernels::ApplyRope(got.data(), dim, table.data());
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), x.size() * sizeof(float)))
          << "dim " << dim << ", position " << position;
    }
  }
}

// The two MLA forms are the same function: compare them on random data with query offsets.
TEST(MlaAttentionTest, AbsorbedEqualsExpanded) {
  kernels::MlaDims d{3, 10, 6, 7, 11, 0.3f};
  const int64_t tokens = 4, keys = 9;
  auto q = Random(static_cast<size_t>(tokens * d.heads * (d.nope + d.rope)), 6);
  auto latents = Random(static_cast<size_t>(keys * (d.latent + d.rope)), 7);
  Fp8Matrix kv_b = MakeFp8(d.heads * (d.nope + d.v), d.latent, 8, 8);
  const int64_t positions[] = {5, 6, 7, 8};  // a chunk on top of 5 cached tokens
  std::vector<float> expanded(static_cast<size_t>(tokens * d.heads * d.v)),
      absorbed(expanded.size());
  kernels::MlaAttendExpanded(q.data(), tokens, positions, latents.data(), keys, kv_b.view, d,
                             expanded.data());
  kernels::MlaAttendAbsorbed(q.data(), tokens, positions, latents.data(), keys, kv_b.view, d,
                             absorbed.data());
  for (size_t i = 0; i < expanded.size(); ++i)
    EXPECT_NEAR(expanded[i], absorbed[i], 1e-4) << i;
  // The first query must not see the keys after position 5.
  std::vector<float> changed = latents;
  for (int64_t j = 6; j < keys; ++j)
    changed[j * (d.latent + d.rope)] += 100;
  std::vector<float> again(expanded.size());
  kernels::MlaAttendAbsorbed(q.data(), 1, positions, changed.data(), keys, kv_b.view, d,
                             again.data());
  for (int64_t i = 0; i < d.heads * d.v; ++i)
    EXPECT_NEAR(again[i], absorbed[i], 1e-5);
}

}  // namespace
}  // namespace sy

namespace sy {
namespace {

// The tiled prefill form equals the whole-sequence expanded form across several key blocks,
// with queries on top of a cached prefix and a partial last block.
TEST(MlaAttentionTest, TiledExpandedEqualsExpanded) {
  kernels::MlaDims d{3, 10, 6, 7, 11, 0.3f};
  const int64_t keys = 150, tokens = 40;  // blocks of 64: two full, one partial
  auto q = Random(static_cast<size_t>(tokens * d.heads * (d.nope + d.rope)), 16);
  auto latents = Random(static_cast<size_t>(keys * (d.latent + d.rope)), 17);
  Fp8Matrix kv_b = MakeFp8(d.heads * (d.nope + d.v), d.latent, 8, 18);
  std::vector<int64_t> positions;
  for (int64_t t = 0; t < tokens; ++t)
    positions.push_back(keys - tokens + t);
  std::vector<float> whole(static_cast<size_t>(tokens * d.heads * d.v)), tiled(whole.size());
  kernels::MlaAttendExpanded(q.data(), tokens, positions.data(), latents.data(), keys, kv_b.view, d,
                             whole.data());
  kernels::MlaAttendExpandedTiled(q.data(), tokens, positions.data(), latents.data(), keys,
                                  kv_b.view, d, tiled.data());
  for (size_t i = 0; i < whole.size(); ++i)
    EXPECT_NEAR(tiled[i], whole[i], 1e-4) << i;
}

}  // namespace
}  // namespace sy
