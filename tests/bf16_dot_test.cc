// The bf16 dot-product kernel (kernels/cpu/bf16_dot.h): exact fp8 conversion, products equal to a
// double-precision sum over the same bf16 operands, and rows that do not depend on the batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/grouped_ffn.h"
#include "kernels/cpu/mla_decode.h"
#include "tensor/packed_matrix.h"
#include "test_support.h"

namespace sy {
namespace {

using testing::Bf16ProductReference;
using testing::RandomRows;
using OwnedMatrix = testing::TestMatrix;
using testing::MakeTestMatrix;
using testing::RandomTestMatrix;

class Bf16DotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::HasBf16Dot()) GTEST_SKIP() << "no AVX-512 BF16 and VBMI on this CPU";
  }
};

TEST_F(Bf16DotTest, EveryFp8ValueConvertsExactly) {
  // Every fp8 byte, NaNs replaced by zero.
  const int64_t rows = 16, cols = 16;
  OwnedMatrix w = testing::EveryFp8ByteMatrix(cols);
  auto packed = Pack(w.view);
  ASSERT_TRUE(kernels::Bf16DotApplies(*packed));
  // One-hot rows of x pick each column in turn: y is the weight itself.
  for (int64_t c = 0; c < cols; ++c) {
    std::vector<float> x(static_cast<size_t>(cols), 0.0f);
    x[c] = 1.0f;
    std::vector<uint16_t> xb(x.size());
    kernels::ToBf16RowsForDot(x.data(), 1, cols, xb.data());
    std::vector<float> y(rows, -7.0f);
    kernels::Bf16DotPanels(xb.data(), 1, *packed, 0, packed->panels, y.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float want = F8E4M3ToF32(w.bytes[r * cols + c]);
      EXPECT_EQ(y[r], want) << "byte 0x" << std::hex << int{w.bytes[r * cols + c]};
    }
  }
}

TEST_F(Bf16DotTest, MatchesDoublePrecisionSumOverTheSameOperands) {
  for (DType dtype : {DType::kF8E4M3, DType::kBF16}) {
    for (auto [rows, cols, m, block] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {16, 4, 1, 16},  // one quad, a partial scale block
             {17, 36, 1, 16},
             {70, 260, 2, 128},    // partial last block and panel, three panels after a quad
             {100, 132, 3, 16},    // the tiled kernel from three rows
             {33, 128, 12, 128},   // one full tile
             {47, 300, 13, 16},    // a tile and one row
             {130, 512, 37, 128},  // several tiles, odd panel count
         }) {
      OwnedMatrix w =
          RandomTestMatrix(dtype, rows, cols, static_cast<uint32_t>(rows * 3 + cols), block);
      ASSERT_TRUE(CanPack(w.view));
      auto packed = Pack(w.view);
      ASSERT_TRUE(kernels::Bf16DotApplies(*packed));
      auto x = RandomRows(m, cols, 5);
      std::vector<float> y(static_cast<size_t>(m * rows), -1);
      kernels::LinearPacked(x.data(), m, *packed, y.data());
      const auto want = Bf16ProductReference(w, x, m);
      double scale = 1e-30, diff = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        scale = std::max(scale, std::fabs(want[i]));
        diff = std::max(diff, std::fabs(y[i] - want[i]));
      }
      EXPECT_LT(diff / scale, 2e-5)
          << DTypeName(dtype) << " " << rows << "x" << cols << " m " << m << " block " << block;
    }
  }
}

// Each row alone, then among m − 1 others (the streamed kernel for one or two rows, the tiled one
// from three): the same bits.
TEST_F(Bf16DotTest, RowsAreTheSameBitsAtEveryBatchSize) {
  for (DType dtype : {DType::kF8E4M3, DType::kBF16}) {
    const int64_t rows = 90, cols = 384;
    OwnedMatrix w = RandomTestMatrix(dtype, rows, cols, 17, 128);
    auto packed = Pack(w.view);
    const int64_t most = 41;
    auto x = RandomRows(most, cols, 23);
    std::vector<float> alone(static_cast<size_t>(most * rows));
    for (int64_t t = 0; t < most; ++t)
      kernels::LinearPacked(x.data() + t * cols, 1, *packed, alone.data() + t * rows);
    for (int64_t m : {2, 3, 4, 8, 12, 13, 32, 41}) {
      std::vector<float> batch(static_cast<size_t>(m * rows));
      kernels::LinearPacked(x.data(), m, *packed, batch.data());
      EXPECT_EQ(0, std::memcmp(batch.data(), alone.data(), batch.size() * sizeof(float)))
          << DTypeName(dtype) << " m " << m;
    }
  }
}

// The hint of the product a thread runs next (NextPanels) only fetches: with or without it,
// over several groups of panels and row blocks, from a panel inside the matrix, the same bits,
// which are the reference's.
TEST_F(Bf16DotTest, AHintOfTheNextProductChangesNoBit) {
  OwnedMatrix other = RandomTestMatrix(DType::kBF16, 64, 256, 3, 128);
  auto other_packed = Pack(other.view);
  for (DType dtype : {DType::kF8E4M3, DType::kBF16}) {
    const int64_t rows = 300, cols = 1152;  // 19 panels: three groups; three column ranges
    OwnedMatrix w = RandomTestMatrix(dtype, rows, cols, 11, 128);
    auto packed = Pack(w.view);
    ASSERT_TRUE(kernels::Bf16DotApplies(*packed));
    for (int64_t m : {3, 8, 13, 200}) {  // 200: two row blocks
      auto x = RandomRows(m, cols, static_cast<uint32_t>(m));
      std::vector<uint16_t> xb(x.size());
      kernels::ToBf16RowsForDot(x.data(), m, cols, xb.data());
      for (int64_t first : {0, 3}) {
        std::vector<float> plain(static_cast<size_t>(m * rows), -1.0f), hinted(plain);
        kernels::Bf16DotPanels(xb.data(), m, *packed, first, packed->panels, plain.data());
        kernels::Bf16DotPanels(xb.data(), m, *packed, first, packed->panels, hinted.data(),
                               {other_packed.get(), 1, 4});
        EXPECT_EQ(0, std::memcmp(plain.data(), hinted.data(), plain.size() * sizeof(float)))
            << DTypeName(dtype) << " m " << m << " from panel " << first;
        if (first != 0) continue;
        const auto want = Bf16ProductReference(w, x, m);
        double scale = 1e-30, diff = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          scale = std::max(scale, std::fabs(want[i]));
          diff = std::max(diff, std::fabs(hinted[i] - want[i]));
        }
        EXPECT_LT(diff / scale, 2e-5) << DTypeName(dtype) << " m " << m;
      }
    }
  }
}

// bf16 weights laid out in pairs at load (PackedMatrix::bf16_pairs, as `switchyard` does where
// this kernel runs) are read in place: the bits of the converted columns, at every row count and
// through the grouped experts; the f32 products (LinearPanelsF32, the router's LinearF32) stay
// f32-accurate on them.
TEST_F(Bf16DotTest, PairsLaidOutAtLoadGiveTheBitsOfColumns) {
  const int64_t rows = 150, cols = 640;  // 10 panels: a group and a pair; two column ranges
  OwnedMatrix w = RandomTestMatrix(DType::kBF16, rows, cols, 19, 128);
  auto columns = Pack(w.view);
  GlobalBf16Pairs() = true;
  auto pairs = Pack(w.view);
  GlobalBf16Pairs() = false;
  ASSERT_TRUE(pairs->bf16_pairs);
  ASSERT_FALSE(columns->bf16_pairs);
  ASSERT_TRUE(kernels::UseBf16Dot(*pairs));
  ASSERT_FALSE(kernels::UseAmxBf16(*pairs));
  {
    // A weight of 1 passes each value through with all 24 of its significant bits (one bf16
    // part, or two, would lose the lower ones).
    const int64_t n = 64;
    OwnedMatrix one = MakeTestMatrix(DType::kBF16, n, n, 32,
                                     [](int64_t r, int64_t c) { return r == c ? 1.0f : 0.0f; });
    GlobalBf16Pairs() = true;
    auto one_pairs = Pack(one.view);
    GlobalBf16Pairs() = false;
    auto x = RandomRows(5, n, 8);
    for (float& v : x)
      v *= 1.0f + 0x1.0p-20f;  // low bits set
    std::vector<float> y(x.size(), -1.0f);
    kernels::LinearPanelsF32(x.data(), 5, *one_pairs, 0, one_pairs->panels, y.data());
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
  }
  for (int64_t m : {1, 2, 3, 8, 12, 13, 37, 200}) {
    auto x = RandomRows(m, cols, static_cast<uint32_t>(70 + m));
    std::vector<float> want(static_cast<size_t>(m * rows)), got(want.size(), -1.0f);
    kernels::LinearPacked(x.data(), m, *columns, want.data());
    kernels::LinearPacked(x.data(), m, *pairs, got.data());
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << "m " << m;
    // f32 activations: within the f32 sum's rounding of the double-precision product.
    std::vector<float> f32(want.size(), -1.0f);
    kernels::LinearPanelsF32(x.data(), m, *pairs, 0, pairs->panels, f32.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t r = 0; r < rows; ++r) {
        double sum = 0, magnitude = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double term =
              static_cast<double>(x[i * cols + c]) *
              BF16ToF32(reinterpret_cast<const uint16_t*>(w.view.data)[r * cols + c]);
          sum += term;
          magnitude += std::fabs(term);
        }
        // Three parts' products of exact terms, each summed in f32 (a chain per 128 columns,
        // then the blocks), the parts added: (cols + 4)·2^-24 of the terms' magnitude bounds it.
        EXPECT_NEAR(f32[i * rows + r], sum, (cols + 4) * std::ldexp(magnitude, -24))
            << "m " << m << " row " << i << " column " << r;
      }
  }
}

// The grouped expert kernel runs the same arithmetic: an expert's row alone equals that row
// inside a batch of experts with many rows, and equals the plain products.
TEST_F(Bf16DotTest, GroupedExpertsGiveTheRowsOfPlainProducts) {
  const int64_t hidden = 256, width = 128, experts = 3;
  std::vector<OwnedMatrix> storage;
  std::vector<std::shared_ptr<const PackedMatrix>> packed;
  for (int64_t i = 0; i < 3 * experts; ++i) {
    const bool down = i % 3 == 2;
    storage.push_back(RandomTestMatrix(DType::kF8E4M3, down ? hidden : width, down ? width : hidden,
                                       static_cast<uint32_t>(40 + i), 128));
    packed.push_back(Pack(storage.back().view));
  }
  std::vector<kernels::ExpertPanels> panels;
  for (int64_t e = 0; e < experts; ++e)
    panels.push_back({packed[3 * e].get(), packed[3 * e + 1].get(), packed[3 * e + 2].get()});
  const std::vector<int64_t> offsets = {0, 1, 3, 20};  // 1, 2 and 17 rows
  auto x = RandomRows(offsets.back(), hidden, 31);
  for (float& v : x)
    v *= 0.05f;
  std::vector<float> grouped(x.size());
  kernels::GroupedExpertFfn(x.data(), offsets, panels, hidden, grouped.data());
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t row = offsets[e]; row < offsets[e + 1]; ++row) {
      std::vector<float> gate(width), up(width), out(hidden);
      kernels::LinearPacked(x.data() + row * hidden, 1, *panels[e].gate, gate.data());
      kernels::LinearPacked(x.data() + row * hidden, 1, *panels[e].up, up.data());
      for (int64_t c = 0; c < width; ++c)
        gate[c] = gate[c] / (1.0f + std::exp(-gate[c])) * up[c];
      kernels::LinearPacked(gate.data(), 1, *panels[e].down, out.data());
      EXPECT_EQ(0, std::memcmp(out.data(), grouped.data() + row * hidden, hidden * sizeof(float)))
          << "expert " << e << " row " << row;
    }
}

// MLA decode with bf16 dot products on a bf16 cache: against a double-precision softmax over the
// same cache rows (queries and probabilities are rounded to bf16: within 1% of the output's
// range), and every (token, head) row the same bits however heads and tokens are grouped. 600
// keys span three of the kernel's key steps (256), the last one partial and odd.
TEST_F(Bf16DotTest, MlaDecodeMatchesTheSoftmaxAndDoesNotDependOnItsNeighbours) {
  const int64_t heads = 21, latent = 48, rope = 8, page = 7, width = latent + rope;
  for (int64_t keys : {int64_t{1}, int64_t{37}, int64_t{70}, int64_t{600}}) {
    for (int64_t tokens : {int64_t{1}, int64_t{2}, int64_t{3}}) {
      if (tokens > keys) continue;
      const testing::TestLatentCache cache = testing::MakeTestLatentCache(keys, width, page, 11);
      const kernels::LatentPages& view = cache.view;
      const std::vector<float>& rows = cache.rows;
      ASSERT_TRUE(kernels::MlaDecodeBf16Applies(view.layout.dtype, latent, rope));
      auto q_latent = RandomRows(tokens * heads, latent, 12);
      auto q_pe = RandomRows(tokens * heads, rope, 13);
      std::vector<int64_t> positions;
      for (int64_t t = 0; t < tokens; ++t)
        positions.push_back(keys - tokens + t);
      const float scale = 0.3f;
      std::vector<float> whole(static_cast<size_t>(tokens * heads * latent));
      kernels::MlaDecodeAttentionBf16(q_latent.data(), q_pe.data(), tokens, positions.data(), view,
                                      keys, heads, 0, heads, latent, rope, scale, whole.data());
      // Head blocks of 5 and 16, and each token alone: the same bits.
      std::vector<float> blocks(whole.size(), -1.0f), alone(whole.size(), -1.0f);
      for (int64_t h0 = 0; h0 < heads; h0 += 5)
        kernels::MlaDecodeAttentionBf16(q_latent.data(), q_pe.data(), tokens, positions.data(),
                                        view, keys, heads, h0, std::min(heads, h0 + 5), latent,
                                        rope, scale, blocks.data());
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t h0 = 0; h0 < heads; h0 += 16)
          kernels::MlaDecodeAttentionBf16(q_latent.data() + t * heads * latent,
                                          q_pe.data() + t * heads * rope, 1, positions.data() + t,
                                          view, keys, heads, h0, std::min(heads, h0 + 16), latent,
                                          rope, scale, alone.data() + t * heads * latent);
      EXPECT_EQ(0, std::memcmp(blocks.data(), whole.data(), whole.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(alone.data(), whole.data(), whole.size() * sizeof(float)));
      const auto want = testing::AbsorbedAttentionReference(q_latent, q_pe, rows, positions, heads,
                                                            latent, rope, scale);
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(whole[i], want[i], 2e-2)
            << "keys " << keys << " tokens " << tokens << " at " << i;
    }
  }
}

// An fp8 cache's rows are widened to bf16 exactly (kernels/cpu/latent_row.h), so the kernel gives
// the bits it gives on a bf16 cache holding the same values: two scale blocks, the second
// partial (latent 160), keys over one, two and three key steps.
TEST_F(Bf16DotTest, MlaDecodeOnAnFp8CacheIsTheBf16CacheOfItsValues) {
  const int64_t heads = 21, latent = 160, rope = 8, page = 7, width = latent + rope;
  // Random rows, and rows holding every code: each block's first value 448 · 2^k (so its
  // exponent is k, from -100 to 90) and then the codes in turn, subnormals, zeros and signs
  // included (NaN's two codes left out: NaN in a row poisons the whole output).
  const auto every_code = [&](int64_t keys) {
    std::vector<float> rows(static_cast<size_t>(keys * width));
    for (int64_t j = 0; j < keys; ++j)
      for (int64_t d = 0; d < width; ++d) {
        const int k = static_cast<int>((j * 7 + d / 128 * 3) % 191) - 100;
        int code = static_cast<int>((j * latent + d) % 256);
        if ((code & 0x7f) == 0x7f) code -= 1;
        const float value = d % 128 == 0 ? 448.0f : F8E4M3ToF32(static_cast<uint8_t>(code));
        rows[j * width + d] = d < latent ? std::ldexp(value, k) : 0.25f * static_cast<float>(d);
      }
    return rows;
  };
  for (bool all_codes : {false, true})
    for (int64_t keys : {int64_t{1}, int64_t{70}, int64_t{600}}) {
      const int64_t tokens = std::min<int64_t>(keys, 2);
      const testing::TestLatentCache fp8 =
          all_codes ? testing::MakeTestLatentCacheOf(every_code(keys), width, page, DType::kF8E4M3,
                                                     latent)
                    : testing::MakeTestLatentCache(keys, width, page, 17, DType::kF8E4M3, latent);
      if (all_codes)  // the codes went in as they were: nothing was rounded
        ASSERT_EQ(fp8.rows, every_code(keys));
      const testing::TestLatentCache bf16 =
          testing::MakeTestLatentCacheOf(fp8.rows, width, page, DType::kBF16, latent);
      ASSERT_EQ(0, std::memcmp(fp8.rows.data(), bf16.rows.data(), fp8.rows.size() * sizeof(float)))
          << "an fp8 cache's values are bf16 values";
      ASSERT_TRUE(kernels::MlaDecodeBf16Applies(DType::kF8E4M3, latent, rope));
      auto q_latent = RandomRows(tokens * heads, latent, 12);
      auto q_pe = RandomRows(tokens * heads, rope, 13);
      std::vector<int64_t> positions;
      for (int64_t t = 0; t < tokens; ++t)
        positions.push_back(keys - tokens + t);
      std::vector<float> got(static_cast<size_t>(tokens * heads * latent)), want(got.size());
      kernels::MlaDecodeAttentionBf16(q_latent.data(), q_pe.data(), tokens, positions.data(),
                                      fp8.view, keys, heads, 0, heads, latent, rope, 0.3f,
                                      got.data());
      kernels::MlaDecodeAttentionBf16(q_latent.data(), q_pe.data(), tokens, positions.data(),
                                      bf16.view, keys, heads, 0, heads, latent, rope, 0.3f,
                                      want.data());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << keys << " keys" << (all_codes ? ", every code" : "");
    }
}

}  // namespace
}  // namespace sy
