// GGML blocks kept quantized (PackGgml) and the products on them (kernels/cpu/ggml_gemm.h), for
// every type with an integer form, on random blocks (every byte pattern is a valid block once its
// half-precision scales are finite).
//
// The bound the products are held to comes from the activation quantization: each x_c is
// replaced by xs_b · xq_c with |x_c − xs_b · xq_c| ≤ xs_b / 2 (xs_b = max_b |x| / 127, rounded to
// nearest), so |y − Σ w_c x_c| ≤ Σ_b (xs_b / 2) Σ_{c∈b} |w_c|; the rest is float rounding —
// the integer sums are exact, leaving a few roundings per block, bounded here by
// 1e-5 · Σ |w_c x_c| (float's 6e-8 per rounding, with room).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/ggml_gemm.h"
#include "kernels/cpu/grouped_ffn.h"
#include "tensor/ggml_quants.h"
#include "tensor/matrix.h"
#include "tensor/packed_matrix.h"

namespace sy {
namespace {

using kernels::GgmlKernel;

// Products of a tile of rows and more take the AMX kernel (kernels/cpu/amx_kernels.h) where it
// is enabled (off by default: slower than the vector kernels where measured): on this CPU's tiles
// where it has them, else on the emulator (read once, before the first product).
const bool kEmulateAmx = [] {
  setenv("SWITCHYARD_AMX_EMULATE", "1", 1);
  return true;
}();

// Where each type keeps its half-precision scales (ggml-common.h's block structs).
std::vector<int> HalfOffsets(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      return {0};
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {0, 2};
    case GgmlType::kQ2_K:
      return {80, 82};
    case GgmlType::kQ3_K:
      return {108};
    case GgmlType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

const GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                           GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                           GgmlType::kQ5_K, GgmlType::kQ6_K};

// A [rows, cols] matrix of random blocks with scales in [2^-12, 2^-6) of either sign (minimums
// of Q4_1/Q5_1 included).
struct RandomGgml {
  std::vector<uint8_t> bytes;
  Matrix matrix;
  std::vector<float> values;  // DequantizeGgml's
};
RandomGgml MakeRandom(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  const GgmlTypeTraits traits = *GgmlTypeInfo(type);
  RandomGgml out;
  const int64_t blocks = rows * cols / traits.block_size;
  out.bytes.resize(static_cast<size_t>(blocks * traits.block_bytes));
  std::mt19937 rng(seed);
  for (auto& b : out.bytes)
    b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> magnitude(1.0f / 4096, 1.0f / 64);
  for (int64_t b = 0; b < blocks; ++b)
    for (int offset : HalfOffsets(type)) {
      const float value = magnitude(rng) * (rng() % 2 ? 1.0f : -1.0f);
      const uint16_t half = F32ToF16(value);
      std::memcpy(out.bytes.data() + b * traits.block_bytes + offset, &half, 2);
    }
  out.matrix.dtype = DType::kGgml;
  out.matrix.ggml_type = type;
  out.matrix.rows = rows;
  out.matrix.cols = cols;
  out.matrix.data = out.bytes.data();
  out.values.resize(static_cast<size_t>(rows * cols));
  EXPECT_TRUE(DequantizeGgml(type, out.bytes.data(), rows * cols, out.values.data()).ok());
  return out;
}

std::vector<float> RandomRows(int64_t m, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * cols));
  for (auto& v : x)
    v = normal(rng);
  // A few outliers, as real activations have: they set a block's scale.
  for (int64_t i = 0; i < m; ++i)
    x[i * cols + (i * 37) % cols] *= 20.0f;
  return x;
}

std::vector<float> Product(const std::vector<float>& x, int64_t m, const PackedMatrix& w) {
  std::vector<float> y(static_cast<size_t>(m * w.rows));
  kernels::LinearPacked(x.data(), m, w, y.data());
  return y;
}

// The kernels this CPU and SWITCHYARD_MAX_ISA allow, slowest first.
std::vector<GgmlKernel> Kernels() {
  kernels::LimitGgmlKernel(GgmlKernel::kAvx512Vnni);
  std::vector<GgmlKernel> all = {GgmlKernel::kPortable};
  if (kernels::ActiveGgmlKernel() >= GgmlKernel::kAvx2) all.push_back(GgmlKernel::kAvx2);
  if (kernels::ActiveGgmlKernel() == GgmlKernel::kAvx512Vnni)
    all.push_back(GgmlKernel::kAvx512Vnni);
  return all;
}

// x [m][w.cols] times w on every kernel this CPU runs: the portable kernel's bits on each, the
// AMX kernel's included from a tile of rows up.
void ExpectEveryKernelGivesThePortableBits(const std::vector<float>& x, int64_t m,
                                           const PackedMatrix& w) {
  kernels::EnableAmxGgml(false);
  kernels::LimitGgmlKernel(GgmlKernel::kPortable);
  const std::vector<float> want = Product(x, m, w);
  for (GgmlKernel kernel : Kernels()) {
    kernels::LimitGgmlKernel(kernel);
    const std::vector<float> got = Product(x, m, w);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << kernels::GgmlKernelName(kernel) << ", " << m << " rows";
  }
  kernels::EnableAmxGgml(true);
  if (m >= kernels::kAmxInt8MinRows) {
    EXPECT_NE(std::string(kernels::KernelPathName(m, w)).find("ggml-amx"), std::string::npos);
    const std::vector<float> got = Product(x, m, w);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "AMX, " << m << " rows";
  }
}

class GgmlGemmTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void TearDown() override { kernels::LimitGgmlKernel(GgmlKernel::kAvx512Vnni); }
};

TEST_P(GgmlGemmTest, IntegerFormGivesTheDequantizedValues) {
  const GgmlType type = GetParam();
  const GgmlTypeTraits traits = *GgmlTypeInfo(type);
  const GgmlIntegerLayout layout = *GgmlIntegerForm(type);
  RandomGgml w = MakeRandom(type, 4, traits.block_size * 3, 7);
  GgmlIntegerBlock block;
  for (int64_t b = 0; b < 12; ++b) {
    DecodeGgmlIntegerBlock(type, w.bytes.data() + b * traits.block_bytes, &block);
    const double d = GgmlHalfToF32(block.d), dmin = GgmlHalfToF32(block.dmin);
    for (int64_t e = 0; e < traits.block_size; ++e) {
      ASSERT_LT(block.q[e], 1 << layout.code_bits);
      const int64_t j = e / layout.sub_size;
      const double value = d * block.sc[j] * block.q[e] - dmin * block.mn[j];
      const double reference = w.values[b * traits.block_size + e];
      // The dequantizer rounds d · sc (and dmin · mn) to float before using them.
      const double slack =
          1.2e-7 * (std::fabs(d * block.sc[j] * block.q[e]) + std::fabs(dmin * block.mn[j])) * 2;
      ASSERT_NEAR(value, reference, slack) << "block " << b << " element " << e;
    }
  }
}

TEST_P(GgmlGemmTest, ProductsWithinTheActivationQuantizationBound) {
  const GgmlType type = GetParam();
  const int64_t block = GgmlTypeInfo(type)->block_size;
  // Odd row counts (partial panels), several blocks, 1–13 activation rows.
  for (const auto& [rows, blocks] : {std::pair<int64_t, int64_t>{1, 1}, {37, 3}, {16, 2}}) {
    const int64_t cols = blocks * block;
    RandomGgml w = MakeRandom(type, rows, cols, static_cast<uint32_t>(rows * 31 + blocks));
    auto packed = PackGgml(w.matrix);
    ASSERT_EQ(packed->dtype, DType::kGgml);
    for (GgmlKernel kernel : Kernels()) {
      kernels::LimitGgmlKernel(kernel);
      for (int64_t m : {1, 3, 13}) {
        SCOPED_TRACE(::testing::Message() << "rows " << rows << " cols " << cols << " m " << m
                                          << " kernel " << kernels::GgmlKernelName(kernel));
        const std::vector<float> x = RandomRows(m, cols, static_cast<uint32_t>(m + 100));
        const std::vector<float> y = Product(x, m, *packed);
        for (int64_t t = 0; t < m; ++t)
          for (int64_t i = 0; i < rows; ++i) {
            double exact = 0, bound = 0, magnitude = 0;
            for (int64_t b = 0; b < blocks; ++b) {
              double largest = 0, weights = 0;
              for (int64_t c = b * block; c < (b + 1) * block; ++c) {
                const double wc = w.values[i * cols + c], xc = x[t * cols + c];
                exact += wc * xc;
                magnitude += std::fabs(wc * xc);
                weights += std::fabs(wc);
                largest = std::max(largest, std::fabs(xc));
              }
              bound += 0.5 * (largest / 127) * weights;
            }
            bound += 1e-5 * magnitude;
            ASSERT_NEAR(y[t * rows + i], exact, bound) << "row " << t << " output " << i;
          }
      }
    }
  }
}

// m = 1 takes the one-row tiles (quad by quad on AVX2), 11 the several-row ones (int16 sums).
TEST_P(GgmlGemmTest, EveryKernelGivesThePortableBits) {
  const GgmlType type = GetParam();
  const int64_t cols = 2 * GgmlTypeInfo(type)->block_size, rows = 45;
  RandomGgml w = MakeRandom(type, rows, cols, 99);
  auto packed = PackGgml(w.matrix);
  for (int64_t m : {1, 11, 37}) {
    const std::vector<float> x = RandomRows(m, cols, 5);
    ExpectEveryKernelGivesThePortableBits(x, m, *packed);
  }
}

// The largest sums the integer form can meet: every code byte 0xff (each code at its type's
// maximum, sub-block scales and minimums too) against activations all at ±127, where the AVX2
// kernels' int16 sums are closest to overflowing (4-bit codes: 16 products of 15 · 127 a lane,
// 30480). Every kernel must still give the portable kernel's bits, at one row and in tiles.
TEST_P(GgmlGemmTest, LargestCodesAndActivationsGiveThePortableBits) {
  const GgmlType type = GetParam();
  const GgmlTypeTraits traits = *GgmlTypeInfo(type);
  const int64_t cols = 2 * traits.block_size, rows = 32;
  RandomGgml w = MakeRandom(type, rows, cols, 7);
  const std::vector<int> halves = HalfOffsets(type);
  for (size_t i = 0; i < w.bytes.size(); ++i) {
    const int at = static_cast<int>(i % static_cast<size_t>(traits.block_bytes));
    bool half = false;
    for (int offset : halves)
      half = half || (at >= offset && at < offset + 2);
    if (!half) w.bytes[i] = 0xff;
  }
  auto packed = PackGgml(w.matrix);
  for (int64_t m : {1, 2, 4, 11, 16}) {
    // Row r: all +1 (r % 3 == 0), all −1 (r % 3 == 1), or +1 and −1 by column pair.
    std::vector<float> x(static_cast<size_t>(m * cols));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < cols; ++c)
        x[r * cols + c] = r % 3 == 0 ? 1.0f : r % 3 == 1 ? -1.0f : (c / 2) % 2 ? 1.0f : -1.0f;
    ExpectEveryKernelGivesThePortableBits(x, m, *packed);
  }
}

TEST_P(GgmlGemmTest, ARowIsTheSameBitsAloneAndInAnyBatch) {
  const GgmlType type = GetParam();
  const int64_t cols = GgmlTypeInfo(type)->block_size * (type == GgmlType::kQ8_0 ? 9 : 2);
  const int64_t rows = 70;
  RandomGgml w = MakeRandom(type, rows, cols, 3);
  auto packed = PackGgml(w.matrix);
  const std::vector<float> x = RandomRows(41, cols, 11);
  for (GgmlKernel kernel : Kernels()) {
    kernels::LimitGgmlKernel(kernel);
    const std::vector<float> all = Product(x, 41, *packed);
    for (int64_t m = 1; m <= 13; ++m) {
      const std::vector<float> part(x.begin(), x.begin() + m * cols);
      const std::vector<float> y = Product(part, m, *packed);
      ASSERT_EQ(std::memcmp(y.data(), all.data(), y.size() * sizeof(float)), 0)
          << m << " rows, " << kernels::GgmlKernelName(kernel);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GgmlGemmTest, ::testing::ValuesIn(kTypes), [](const auto& info) {
  return std::string(GgmlTypeInfo(info.param)->name);
});

TEST(GgmlGemmTest, NonFiniteActivationsGiveNaN) {
  RandomGgml w = MakeRandom(GgmlType::kQ4_K, 16, 512, 1);
  auto packed = PackGgml(w.matrix);
  std::vector<float> x = RandomRows(2, 512, 2);
  x[300] = INFINITY;  // row 0, second block
  const std::vector<float> y = Product(x, 2, *packed);
  for (int64_t i = 0; i < 16; ++i) {
    EXPECT_TRUE(std::isnan(y[i]));
    EXPECT_TRUE(std::isfinite(y[16 + i]));
  }
}

// The activation quantization has a vector form beside the scalar one (kAvx512Vnni): the same
// codes, scales and sums on every kernel, ties, signed zeros, an all-zero and non-finite blocks
// included.
TEST(GgmlGemmTest, ActivationQuantizationIsTheSameOnEveryKernel) {
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const int64_t cols = 1024, m = 3;
    RandomGgml w = MakeRandom(type, 16, cols, 3);
    auto packed = PackGgml(w.matrix);
    std::vector<float> x = RandomRows(m, cols, 8);
    for (int64_t c = 0; c < 64; ++c)  // row 0: ties once scaled (max 127 · 2, steps of 1/2)
      x[c] = static_cast<float>(c % 2 == 0 ? 127 - c : -(c / 2)) * 0.5f;
    x[64] = -0.0f;
    std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // row 0's second K-block: all zero
    x[cols + 700] = NAN;
    x[2 * cols + 5] = -INFINITY;
    kernels::LimitGgmlKernel(GgmlKernel::kPortable);
    kernels::Q8Rows want;
    kernels::QuantizeRowsQ8(x.data(), m, *packed, want);
    for (GgmlKernel kernel : Kernels()) {
      kernels::LimitGgmlKernel(kernel);
      kernels::Q8Rows got;
      kernels::QuantizeRowsQ8(x.data(), m, *packed, got);
      SCOPED_TRACE(kernels::GgmlKernelName(kernel));
      ASSERT_EQ(got.stride, want.stride);
      for (int64_t r = 0; r < m; ++r)
        EXPECT_EQ(std::memcmp(got.Codes(r), want.Codes(r), cols), 0) << "row " << r;
      EXPECT_EQ(std::memcmp(got.scales.data(), want.scales.data(), want.scales.size() * 4), 0);
      EXPECT_EQ(got.sums, want.sums);
    }
  }
  kernels::LimitGgmlKernel(GgmlKernel::kAvx512Vnni);
}

// Rows equal to the row before them (a decode token's row, once per routed expert and once for
// the shared one) take a copy of its quantization: the same codes, scales and sums as each
// quantized alone, serial or over the pool, on every kernel. NaN rows included.
TEST(GgmlGemmTest, RepeatedRowsQuantizeAsEachAlone) {
  const int64_t cols = 2048;
  RandomGgml w = MakeRandom(GgmlType::kQ4_K, 16, cols, 5);
  auto packed = PackGgml(w.matrix);
  const std::vector<float> distinct = RandomRows(3, cols, 12);
  std::vector<float> nan_row(distinct.begin(), distinct.begin() + cols);
  nan_row[300] = NAN;
  // Rows: a a a b a nan nan c c.
  const std::vector<const float*> order = {
      distinct.data(),           distinct.data(), distinct.data(), distinct.data() + cols,
      distinct.data(),           nan_row.data(),  nan_row.data(),  distinct.data() + 2 * cols,
      distinct.data() + 2 * cols};
  const int64_t m = static_cast<int64_t>(order.size());
  std::vector<float> x;
  for (const float* row : order)
    x.insert(x.end(), row, row + cols);
  for (GgmlKernel kernel : Kernels()) {
    kernels::LimitGgmlKernel(kernel);
    SCOPED_TRACE(kernels::GgmlKernelName(kernel));
    for (bool parallel : {false, true}) {
      kernels::Q8Rows all;
      kernels::QuantizeRowsQ8(x.data(), m, *packed, all, parallel);
      for (int64_t r = 0; r < m; ++r) {
        kernels::Q8Rows alone;
        kernels::QuantizeRowsQ8(order[r], 1, *packed, alone, false);
        EXPECT_EQ(std::memcmp(all.Codes(r), alone.Codes(0), cols), 0) << "row " << r;
        EXPECT_EQ(std::memcmp(all.Scales(r), alone.Scales(0), all.blocks * 4), 0) << "row " << r;
        EXPECT_EQ(std::memcmp(all.Sums(r), alone.Sums(0), all.subs * 4), 0) << "row " << r;
      }
    }
  }
  kernels::LimitGgmlKernel(GgmlKernel::kAvx512Vnni);
}

TEST(GgmlGemmTest, DecodeRowReadsAnyColumnRange) {
  RandomGgml w = MakeRandom(GgmlType::kQ6_K, 3, 768, 4);
  std::vector<float> out(700);
  w.matrix.DecodeRow(2, 30, 730, out.data());
  for (int64_t c = 30; c < 730; ++c)
    ASSERT_EQ(out[c - 30], w.values[2 * 768 + c]);
  // Resident bytes: six bits a Q6_K code, four a Q4_K one.
  EXPECT_EQ(PackGgml(w.matrix)->Bytes(), 12u * 768);
  EXPECT_EQ(PackGgml(MakeRandom(GgmlType::kQ4_K, 3, 768, 4).matrix)->Bytes(), 8u * 768);
}

// What the grouped FFN must give expert `e`'s rows [first, first + count) of x: its plain
// products, gate and up, SiLU·up, then down.
std::vector<float> PlainExpert(const std::vector<float>& x, int64_t first, int64_t count,
                               int64_t hidden, int64_t width, const kernels::ExpertPanels& e) {
  std::vector<float> rows(x.begin() + first * hidden, x.begin() + (first + count) * hidden);
  std::vector<float> g = Product(rows, count, *e.gate);
  const std::vector<float> u = Product(rows, count, *e.up);
  kernels::SiluMul(g.data(), u.data(), count * width);
  return Product(g, count, *e.down);
}

// Grouped experts on GGML blocks: each expert's rows give the bits the plain products give.
// Grouped experts give each expert's plain products, bit for bit: with an expert not held here
// (its rows left alone), with every expert held and one block layout (every row quantized in one
// call), and with a down matrix of another layout among them (each expert's rows on their own).
TEST(GgmlGemmTest, GroupedExpertsEqualPlainProducts) {
  const int64_t hidden = 512, width = 96, experts = 4;
  struct Case {
    const char* name;
    bool hold_expert_2;
    GgmlType expert_3_down;
  };
  for (const Case& test : {Case{"expert 2 not held", false, GgmlType::kQ8_0},
                           Case{"one layout", true, GgmlType::kQ8_0},
                           Case{"mixed down layouts", true, GgmlType::kQ4_0}}) {
    SCOPED_TRACE(test.name);
    std::vector<RandomGgml> gate, up, down;
    std::vector<std::shared_ptr<const PackedMatrix>> packed;
    std::vector<kernels::ExpertPanels> panels(experts);
    for (int64_t e = 0; e < experts; ++e) {
      gate.push_back(MakeRandom(GgmlType::kQ4_K, width, hidden, 10 + e));
      up.push_back(MakeRandom(GgmlType::kQ4_K, width, hidden, 20 + e));
      // Q4_0's codes carry an offset of 8 where Q8_0's carry none: another activation layout.
      down.push_back(
          MakeRandom(e == 3 ? test.expert_3_down : GgmlType::kQ8_0, hidden, width, 30 + e));
    }
    for (int64_t e = 0; e < experts; ++e) {
      packed.push_back(PackGgml(gate[e].matrix));
      packed.push_back(PackGgml(up[e].matrix));
      packed.push_back(PackGgml(down[e].matrix));
      if (e == 2 && !test.hold_expert_2) continue;
      panels[e] = {packed[3 * e].get(), packed[3 * e + 1].get(), packed[3 * e + 2].get()};
    }
    const std::vector<int64_t> offsets = {0, 5, 5, 8, 9};  // expert 1 empty
    const std::vector<float> x = RandomRows(9, hidden, 8);
    for (GgmlKernel kernel : Kernels()) {
      kernels::LimitGgmlKernel(kernel);
      std::vector<float> out(9 * hidden, -1.0f);
      kernels::GroupedExpertFfn(x.data(), offsets, panels, hidden, out.data());
      for (int64_t e = 0; e < experts; ++e) {
        const int64_t first = offsets[e], count = offsets[e + 1] - first;
        if (count == 0) continue;
        if (panels[e].gate == nullptr) {
          for (int64_t r = first; r < first + count; ++r)  // rows of an expert not held: untouched
            EXPECT_EQ(out[r * hidden], -1.0f);
          continue;
        }
        const std::vector<float> want = PlainExpert(x, first, count, hidden, width, panels[e]);
        EXPECT_EQ(std::memcmp(want.data(), out.data() + first * hidden, want.size() * 4), 0)
            << "expert " << e << ", " << kernels::GgmlKernelName(kernel);
      }
    }
  }
  kernels::LimitGgmlKernel(GgmlKernel::kAvx512Vnni);
}

// Decode-sized experts (one or two rows) split each matrix into items of ~256 KB of weights: at
// hidden 2048, gate and up (24 panels of 16 KB) take one item of 16 panels and a shorter one of
// 8; down (128 panels) items of 42 (Q8_0) or 55 (Q6_K), the last one short. Every row still
// equals its own expert's plain products, whichever thread took which item.
TEST(GgmlGemmTest, DecodeRowsOverSeveralItemsEqualPlainProducts) {
  const int64_t hidden = 2048, width = 384, experts = 3;
  std::vector<RandomGgml> gate, up, down;
  std::vector<std::shared_ptr<const PackedMatrix>> packed;
  std::vector<kernels::ExpertPanels> panels(experts);
  for (int64_t e = 0; e < experts; ++e) {
    gate.push_back(MakeRandom(GgmlType::kQ4_K, width, hidden, 40 + e));
    up.push_back(MakeRandom(GgmlType::kQ4_K, width, hidden, 50 + e));
    down.push_back(MakeRandom(e == 1 ? GgmlType::kQ6_K : GgmlType::kQ8_0, hidden, width, 60 + e));
  }
  for (int64_t e = 0; e < experts; ++e) {
    for (const RandomGgml* m : {&gate[e], &up[e], &down[e]})
      packed.push_back(PackGgml(m->matrix));
    panels[e] = {packed[3 * e].get(), packed[3 * e + 1].get(), packed[3 * e + 2].get()};
  }
  const std::vector<int64_t> offsets = {0, 1, 3, 4};
  const std::vector<float> x = RandomRows(4, hidden, 9);
  for (GgmlKernel kernel : Kernels()) {
    kernels::LimitGgmlKernel(kernel);
    std::vector<float> out(4 * hidden, -1.0f);
    kernels::GroupedExpertFfn(x.data(), offsets, panels, hidden, out.data());
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t first = offsets[e], count = offsets[e + 1] - first;
      const std::vector<float> want = PlainExpert(x, first, count, hidden, width, panels[e]);
      EXPECT_EQ(std::memcmp(want.data(), out.data() + first * hidden, want.size() * 4), 0)
          << "expert " << e << ", " << kernels::GgmlKernelName(kernel);
    }
  }
  kernels::LimitGgmlKernel(GgmlKernel::kAvx512Vnni);
}

}  // namespace
}  // namespace sy
