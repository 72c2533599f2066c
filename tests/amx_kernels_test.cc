// The AMX tile machine's emulator (kernels/cpu/amx_tiles.h) against the SDM's rules and
// arithmetic, and the AMX kernels (kernels/cpu/amx_kernels.h) on it — and, where this CPU has
// AMX, on its tiles: int8 products give the vector kernels' bits, bf16 products stay within the
// rounding bound of their f32 sums and give every row the same bits at every batch size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "base/thread_pool.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/grouped_ffn.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/panel_gemm.h"
#include "kernels/cpu/weighted_sum.h"
#include "model/feed_forward.h"
#include "model/model.h"
#include "tensor/packed_matrix.h"
#include "test_support.h"

namespace sy {
namespace {

using kernels::AmxBackend;
using kernels::EmulatedTiles;
using kernels::TileConfig;

// On a CPU without AMX the products in this file run on the emulator (before the first
// ActiveAmxBackend(), which reads it once).
const bool kEmulate = [] {
  setenv("SWITCHYARD_AMX_EMULATE", "1", 1);
  return true;
}();

// The backends this CPU runs the kernels on: the emulator everywhere, the tiles where allowed.
std::vector<AmxBackend> Backends() {
  std::vector<AmxBackend> backends = {AmxBackend::kEmulated};
  if (kernels::AmxAllowed()) backends.push_back(AmxBackend::kHardware);
  return backends;
}

TileConfig ThreeTiles(int rows, int a_bytes) {
  TileConfig config;
  config.Set(0, rows, 64);
  config.Set(1, rows, a_bytes);
  config.Set(2, a_bytes / 4, 64);
  return config;
}

TEST(EmulatedTilesTest, ConfigurationIsCheckedAsLdtilecfgChecksIt) {
  EXPECT_NO_THROW(EmulatedTiles::Configure(ThreeTiles(16, 64)));
  TileConfig bad = ThreeTiles(16, 64);
  bad.palette = 2;
  EXPECT_THROW(EmulatedTiles::Configure(bad), std::logic_error);
  bad = ThreeTiles(16, 64);
  bad.rows[0] = 17;
  EXPECT_THROW(EmulatedTiles::Configure(bad), std::logic_error);
  bad = ThreeTiles(16, 64);
  bad.colsb[1] = 68;
  EXPECT_THROW(EmulatedTiles::Configure(bad), std::logic_error);
  bad = ThreeTiles(16, 64);
  bad.rows[9] = 1, bad.colsb[9] = 4;  // palette 1 has tiles 0-7
  EXPECT_THROW(EmulatedTiles::Configure(bad), std::logic_error);
  bad = ThreeTiles(16, 64);
  bad.colsb[5] = 64;  // bytes without rows
  EXPECT_THROW(EmulatedTiles::Configure(bad), std::logic_error);
  bad = ThreeTiles(16, 64);
  bad.reserved0[3] = 1;
  EXPECT_THROW(EmulatedTiles::Configure(bad), std::logic_error);
  EmulatedTiles::Release();
}

TEST(EmulatedTilesTest, TilesOutsideTheConfigurationAndMismatchedShapesFault) {
  EmulatedTiles::Release();
  alignas(64) uint8_t buffer[1024] = {};
  EXPECT_THROW(EmulatedTiles::Load<0>(buffer, 64), std::logic_error);  // nothing configured
  EmulatedTiles::Configure(ThreeTiles(8, 64));
  EXPECT_THROW(EmulatedTiles::Zero<5>(), std::logic_error);  // tile 5 not configured
  EXPECT_NO_THROW((EmulatedTiles::DotUnsignedSigned<0, 1, 2>()));
  TileConfig config = ThreeTiles(8, 64);
  config.rows[1] = 7;  // A's rows differ from C's
  EmulatedTiles::Configure(config);
  EXPECT_THROW((EmulatedTiles::DotUnsignedSigned<0, 1, 2>()), std::logic_error);
  config = ThreeTiles(8, 64);
  config.rows[2] = 15;  // B's rows are not A's bytes / 4
  EmulatedTiles::Configure(config);
  EXPECT_THROW((EmulatedTiles::DotBf16<0, 1, 2>()), std::logic_error);
  EmulatedTiles::Release();
}

TEST(EmulatedTilesTest, LoadsAndStoresFollowTheStrideAndZeroTheRest) {
  EmulatedTiles::Configure(ThreeTiles(3, 8));  // tile 1: 3 rows of 8 bytes
  std::vector<uint8_t> source(200);
  for (size_t i = 0; i < source.size(); ++i)
    source[i] = static_cast<uint8_t>(i + 1);
  EmulatedTiles::Load<1>(source.data(), 50);
  std::vector<uint8_t> out(200, 0xee);
  EmulatedTiles::Store<1>(out.data(), 60);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 60; ++c)
      EXPECT_EQ(out[r * 60 + c], c < 8 ? source[r * 50 + c] : 0xee) << r << " " << c;
  EmulatedTiles::Zero<1>();
  EmulatedTiles::Store<1>(out.data(), 60);
  EXPECT_EQ(out[0], 0);
  EmulatedTiles::Release();
}

TEST(EmulatedTilesTest, Tdpbusd_SumsUnsignedBySignedBytesExactly) {
  for (int rows : {16, 5}) {
    for (int a_bytes : {64, 12}) {
      EmulatedTiles::Configure(ThreeTiles(rows, a_bytes));
      std::mt19937 rng(static_cast<uint32_t>(rows * 100 + a_bytes));
      std::vector<uint8_t> a(16 * 64), b(16 * 64);
      for (auto& v : a)
        v = static_cast<uint8_t>(rng());
      for (auto& v : b)
        v = static_cast<uint8_t>(rng());
      a[0] = 255, b[0] = 0x80;  // the extremes: 255 · −128
      std::vector<int32_t> c(16 * 16);
      for (size_t i = 0; i < c.size(); ++i)
        c[i] = static_cast<int32_t>(i) - 100;
      const std::vector<int32_t> before = c;
      EmulatedTiles::Load<0>(c.data(), 64);
      EmulatedTiles::Load<1>(a.data(), 64);
      EmulatedTiles::Load<2>(b.data(), 64);
      EmulatedTiles::DotUnsignedSigned<0, 1, 2>();
      EmulatedTiles::Store<0>(c.data(), 64);
      for (int m = 0; m < rows; ++m)
        for (int n = 0; n < 16; ++n) {
          int64_t want = before[m * 16 + n];
          for (int k = 0; k < a_bytes; ++k)
            want += int64_t{a[m * 64 + k]} * static_cast<int8_t>(b[(k / 4) * 64 + 4 * n + k % 4]);
          EXPECT_EQ(c[m * 16 + n], want) << m << " " << n;
        }
    }
  }
  EmulatedTiles::Release();
}

// Small integers: every partial sum is exact in f32, whatever the order, so the tile's result is
// the exact one. Then random values: within the bound of its additions' rounding.
TEST(EmulatedTilesTest, Tdpbf16ps_AddsTheProductsOfPairsIntoF32) {
  EmulatedTiles::Configure(ThreeTiles(16, 64));
  std::mt19937 rng(7);
  for (bool integers : {true, false}) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto value = [&] {
      return integers ? static_cast<float>(static_cast<int>(rng() % 33) - 16) : normal(rng);
    };
    std::vector<uint16_t> a(16 * 32), b(16 * 32);
    for (auto& v : a)
      v = F32ToBF16(value());
    for (auto& v : b)
      v = F32ToBF16(value());
    std::vector<float> c(16 * 16);
    for (auto& v : c)
      v = integers ? 3.0f : value();
    const std::vector<float> before = c;
    EmulatedTiles::Load<0>(c.data(), 64);
    EmulatedTiles::Load<1>(a.data(), 64);
    EmulatedTiles::Load<2>(b.data(), 64);
    EmulatedTiles::DotBf16<0, 1, 2>();
    EmulatedTiles::Store<0>(c.data(), 64);
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n) {
        double want = before[m * 16 + n], magnitude = std::fabs(want);
        for (int k = 0; k < 32; ++k) {
          const double p =
              double{BF16ToF32(a[m * 32 + k])} * BF16ToF32(b[(k / 2) * 32 + 2 * n + k % 2]);
          want += p;
          magnitude += std::fabs(p);
        }
        // 18 roundings at most on any path: 16 per chain, the chains' sum, the add into C.
        const double bound = integers ? 0.0 : 18 * std::ldexp(1.0, -24) * magnitude;
        EXPECT_LE(std::fabs(c[m * 16 + n] - want), bound) << m << " " << n;
      }
  }
  EmulatedTiles::Release();
}

// bench kernels' peak loop: as many tile multiplies as asked, on every backend here.
TEST(AmxPeakTest, TheLoopRunsItsRounds) {
  for (AmxBackend backend : Backends()) {
    EXPECT_EQ(kernels::AmxPeakLoop(backend, true, 3), 3 * 32.0) << kernels::AmxBackendName(backend);
    EXPECT_EQ(kernels::AmxPeakLoop(backend, false, 5), 5 * 64.0)
        << kernels::AmxBackendName(backend);
  }
}

// --- int8 ---

struct Int8Case {
  int64_t rows, cols, m;
};

TEST(AmxInt8Test, GivesThePortableKernelsBitsOnEveryBackend) {
  for (AmxBackend backend : Backends()) {
    for (Int8Case c : std::vector<Int8Case>{{16, 64, 1},
                                            {40, 192, 37},  // partial panel, short group
                                            {33, 256, 16},  // one full tile
                                            {70, 704, 17},  // tiles 9 + 8
                                            {128, 128, 50}}) {
      testing::TestMatrix w = testing::RandomTestMatrix(
          DType::kBF16, c.rows, c.cols, static_cast<uint32_t>(c.rows + c.cols), 128);
      auto packed = PackInt8(w.view);
      ASSERT_TRUE(kernels::AmxInt8Applies(*packed));
      auto x = testing::RandomRows(c.m, c.cols, 3);
      kernels::Int8Rows rows;
      kernels::QuantizeRowsInt8(x.data(), c.m, c.cols, rows);
      std::vector<float> want(static_cast<size_t>(c.m * c.rows)), got(want.size(), -1.0f);
      kernels::Int8PanelsOn(kernels::Int8Kernel::kPortable, rows.codes.data(), rows.stride,
                            rows.scales.data(), c.m, *packed, 0, packed->panels, want.data());
      kernels::AmxInt8Panels(backend, rows.codes.data(), rows.stride, rows.scales.data(), c.m,
                             *packed, 0, packed->panels, got.data());
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
          << kernels::AmxBackendName(backend) << " " << c.rows << "x" << c.cols << " m " << c.m;
      // A range of panels writes those panels' outputs and no others.
      if (packed->panels > 2) {
        std::vector<float> part(want.size(), -1.0f);
        kernels::AmxInt8Panels(backend, rows.codes.data(), rows.stride, rows.scales.data(), c.m,
                               *packed, 1, 2, part.data());
        for (int64_t t = 0; t < c.m; ++t)
          for (int64_t r = 0; r < c.rows; ++r) {
            const size_t i = static_cast<size_t>(t * c.rows + r);
            EXPECT_EQ(part[i], r / kPanelRows == 1 ? want[i] : -1.0f) << t << " " << r;
          }
      }
    }
  }
}

// Through LinearPacked, which takes AMX from a tile of rows up: the path says so, and rows have
// the same bits as on the vector kernels at any batch.
TEST(AmxInt8Test, ProductsTakeItFromATileOfRowsWithTheSameBits) {
  testing::TestMatrix w = testing::RandomTestMatrix(DType::kF8E4M3, 90, 640, 21, 128);
  auto packed = PackInt8(w.view);
  constexpr int64_t kRows = 41;
  auto x = testing::RandomRows(kRows, 640, 9);
  std::vector<float> vector_kernels(static_cast<size_t>(kRows * 90)), amx(vector_kernels.size());
  kernels::EnableAmxInt8(false);
  EXPECT_EQ(std::string(kernels::KernelPathName(kRows, *packed)).find("amx"), std::string::npos);
  kernels::LinearPacked(x.data(), kRows, *packed, vector_kernels.data());
  kernels::EnableAmxInt8(true);
  EXPECT_NE(std::string(kernels::KernelPathName(kRows, *packed)).find("int8-amx"),
            std::string::npos);
  EXPECT_EQ(std::string(kernels::KernelPathName(15, *packed)).find("amx"), std::string::npos);
  kernels::LinearPacked(x.data(), kRows, *packed, amx.data());
  EXPECT_EQ(std::memcmp(amx.data(), vector_kernels.data(), amx.size() * sizeof(float)), 0);
  for (int64_t m : {1, 15, 16, 17, 33}) {
    std::vector<float> some(static_cast<size_t>(m * 90));
    kernels::LinearPacked(x.data() + (kRows - m) * 640, m, *packed, some.data());
    EXPECT_EQ(std::memcmp(some.data(), amx.data() + (kRows - m) * 90, some.size() * sizeof(float)),
              0)
        << "m " << m;
  }
}

// --- bf16 ---

struct Bf16Case {
  int64_t rows, cols, m, block;
};

std::vector<float> AmxBf16Product(AmxBackend backend, const PackedMatrix& w,
                                  const std::vector<float>& x, int64_t m, int64_t first_panel,
                                  int64_t end_panel) {
  std::vector<uint16_t> xb(static_cast<size_t>(kernels::AmxBf16Elements(m, w.cols)), 0xffff);
  kernels::AmxToBf16Rows(backend, x.data(), m, w.cols, xb.data());
  std::vector<float> y(static_cast<size_t>(m * w.rows), -1.0f);
  kernels::AmxBf16Panels(backend, xb.data(), m, w, first_panel, end_panel, y.data());
  return y;
}

// Each output against the double-precision sum over the same operands. Per block the tile adds
// the block's products in chains of at most the block's length plus the chains' sum and the add
// into the tile (block + 2 roundings); the blocks' fmas add one each. So the error is within
// (cols + 3 · blocks) · 2^-24 · Σ|x · w|.
TEST(AmxBf16Test, StaysWithinTheRoundingOfItsF32Sums) {
  for (AmxBackend backend : Backends()) {
    for (DType dtype : {DType::kF8E4M3, DType::kBF16}) {
      for (Bf16Case c : std::vector<Bf16Case>{{16, 32, 1, 32},
                                              {17, 96, 2, 32},     // partial panel, 3 blocks
                                              {70, 256, 16, 128},  // one full tile
                                              {47, 320, 13, 64},   // a short last block
                                              {130, 512, 37, 128},
                                              // column chunks of 512 and row chunks of 256
                                              {40, 1280, 300, 128}}) {
        testing::TestMatrix w = testing::RandomTestMatrix(
            dtype, c.rows, c.cols, static_cast<uint32_t>(c.rows * 3 + c.cols), c.block);
        auto packed = Pack(w.view);
        ASSERT_TRUE(kernels::AmxBf16Applies(*packed));
        auto x = testing::RandomRows(c.m, c.cols, 5);
        std::vector<double> magnitude;
        const auto want = testing::Bf16ProductReference(w, x, c.m, &magnitude);
        const auto got = AmxBf16Product(backend, *packed, x, c.m, 0, packed->panels);
        const int64_t blocks = (c.cols + 127) / 128 + (c.cols + c.block - 1) / c.block;
        for (size_t i = 0; i < got.size(); ++i) {
          const double bound =
              static_cast<double>(c.cols + 3 * blocks) * std::ldexp(1.0, -24) * magnitude[i];
          ASSERT_LE(std::fabs(got[i] - want[i]), bound)
              << kernels::AmxBackendName(backend) << " " << DTypeName(dtype) << " " << c.rows << "x"
              << c.cols << " m " << c.m << " output " << i;
        }
      }
    }
  }
}

TEST(AmxBf16Test, EveryFp8ValueConvertsExactly) {
  // Every fp8 byte twice, NaNs replaced by zero; one-hot rows of x pick each column in turn.
  const int64_t rows = 16, cols = 32;
  testing::TestMatrix w = testing::EveryFp8ByteMatrix(cols);
  auto packed = Pack(w.view);
  for (AmxBackend backend : Backends()) {
    for (int64_t c = 0; c < cols; ++c) {
      std::vector<float> x(static_cast<size_t>(cols), 0.0f);
      x[c] = 1.0f;
      const auto y = AmxBf16Product(backend, *packed, x, 1, 0, packed->panels);
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_EQ(y[r], F8E4M3ToF32(w.bytes[r * cols + c]))
            << kernels::AmxBackendName(backend) << " byte 0x" << std::hex
            << int{w.bytes[r * cols + c]};
    }
  }
}

// Each row alone, then among others (tiles of other heights, other rows beside it): the same
// bits. On hardware as well: TDPBF16PS computes each tile row on its own.
TEST(AmxBf16Test, RowsAreTheSameBitsAtEveryBatchSize) {
  for (AmxBackend backend : Backends()) {
    for (DType dtype : {DType::kF8E4M3, DType::kBF16}) {
      // Two column chunks; the whole batch crosses a row chunk (256 rows). Scale blocks of 32, so
      // that panels paired from an odd one below have different scales.
      const int64_t rows = 90, cols = 640;
      testing::TestMatrix w = testing::RandomTestMatrix(dtype, rows, cols, 17, 32);
      auto packed = Pack(w.view);
      const int64_t most = 270;
      auto x = testing::RandomRows(most, cols, 23);
      const auto all = AmxBf16Product(backend, *packed, x, most, 0, packed->panels);
      for (int64_t m : {1, 2, 13, 16, 17, 33, 259}) {
        const int64_t first = most - m;
        std::vector<float> rows_x(x.begin() + first * cols, x.begin() + most * cols);
        const auto some = AmxBf16Product(backend, *packed, rows_x, m, 0, packed->panels);
        EXPECT_EQ(0, std::memcmp(some.data(), all.data() + first * rows, some.size() * 4))
            << kernels::AmxBackendName(backend) << " " << DTypeName(dtype) << " m " << m;
      }
      // Panels from the second on (an odd count, paired from another start): the same bits.
      const auto part = AmxBf16Product(backend, *packed, x, most, 1, packed->panels);
      for (int64_t r = 0; r < most; ++r)
        ASSERT_EQ(0, std::memcmp(part.data() + r * rows + kPanelRows,
                                 all.data() + r * rows + kPanelRows, (rows - kPanelRows) * 4))
            << kernels::AmxBackendName(backend) << " " << DTypeName(dtype) << " row " << r;
    }
  }
}

// A matrix of fewer panels than threads (a router's 16 experts) splits a batch's rows over the
// threads in whole tiles instead of its panels: each row keeps the bits it has alone.
TEST(AmxBf16Test, OnePanelSplitsItsRowsAndKeepsEachRowsBits) {
  if (kernels::ActiveAmxBackend() == AmxBackend::kNone) GTEST_SKIP() << "no AMX backend";
  kernels::GlobalKernelOptions().amx_bf16 = true;
  for (bool pairs : {true, false}) {
    const int64_t rows = 16, cols = 256, m = 300;
    testing::TestMatrix w = testing::RandomTestMatrix(DType::kBF16, rows, cols, 19, 32);
    auto packed = Pack(w.view, pairs);
    ASSERT_EQ(packed->panels, 1);
    ASSERT_TRUE(kernels::UseAmxBf16(*packed));
    const auto x = testing::RandomRows(m, cols, 29);
    std::vector<float> all(static_cast<size_t>(m * rows), -1.0f);
    kernels::LinearPacked(x.data(), m, *packed, all.data());
    for (int64_t r = 0; r < m; ++r) {
      std::vector<float> one(static_cast<size_t>(rows), -2.0f);
      kernels::LinearPacked(x.data() + r * cols, 1, *packed, one.data());
      ASSERT_EQ(0, std::memcmp(one.data(), all.data() + r * rows, rows * sizeof(float)))
          << (pairs ? "pairs" : "column panels") << ", row " << r;
    }
  }
  kernels::GlobalKernelOptions().amx_bf16 = false;
}

// bf16 weights laid out as the tiles at load (--amx-bf16: PackedMatrix::bf16_pairs): the same
// bits as the column panels converted per product, across column and row chunks and from an odd
// first panel; the layout converts both ways exactly; and every other reader of the panels (a
// library's matmul, the per-head products) sees the same weights.
TEST(AmxBf16Test, PanelsOfPairsGiveTheBitsOfColumnPanels) {
  struct Case {
    int64_t rows, cols, m, first_panel;
  };
  for (AmxBackend backend : Backends()) {
    for (Case c : std::vector<Case>{{16, 32, 1, 0},
                                    {17, 96, 2, 0},
                                    {47, 320, 13, 1},
                                    {130, 512, 37, 0},
                                    // from 256 rows, units of 256 columns on pairs (the
                                    // chains go on across them), of 512 on columns
                                    {40, 1280, 300, 0},
                                    {90, 640, 270, 1},
                                    // on pairs, units of 2048 columns at m 40, of 256 at 300
                                    {20, 2560, 40, 0},
                                    {20, 2560, 300, 1}}) {
      testing::TestMatrix w = testing::RandomTestMatrix(
          DType::kBF16, c.rows, c.cols, static_cast<uint32_t>(c.rows + 7 * c.cols), 32);
      auto columns = Pack(w.view);
      GlobalBf16Pairs() = true;
      auto pairs = Pack(w.view);
      GlobalBf16Pairs() = false;
      ASSERT_FALSE(columns->bf16_pairs);
      ASSERT_TRUE(pairs->bf16_pairs);
      const std::string what = std::string(kernels::AmxBackendName(backend)) + " " +
                               std::to_string(c.rows) + "x" + std::to_string(c.cols) + " m " +
                               std::to_string(c.m);
      // Laid out as documented: weight (r, c) of each panel at Bf16PairIndex(r, c).
      const auto* bits = reinterpret_cast<const uint16_t*>(pairs->Panel(1));
      for (int64_t col : {int64_t{0}, int64_t{1}, c.cols - 1})
        for (int64_t r : {0, 5, 15})
          if (kPanelRows + r < c.rows)
            ASSERT_EQ(
                bits[Bf16PairIndex(r, col)],
                reinterpret_cast<const uint16_t*>(w.view.data)[(kPanelRows + r) * c.cols + col])
                << what << " weight " << r << "," << col;
      auto x = testing::RandomRows(c.m, c.cols, 9);
      const auto want = AmxBf16Product(backend, *columns, x, c.m, c.first_panel, columns->panels);
      const auto got = AmxBf16Product(backend, *pairs, x, c.m, c.first_panel, pairs->panels);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << what;
      // Both ways in place: the bytes Pack lays out.
      PackedMatrix round = *pairs;
      round.data = AllocatePanels(pairs->Bytes());
      std::memcpy(round.data.get(), pairs->data.get(), pairs->Bytes());
      SetBf16Pairs(round, false);
      ASSERT_FALSE(round.bf16_pairs);
      ASSERT_EQ(0, std::memcmp(round.data.get(), columns->data.get(), columns->Bytes())) << what;
      SetBf16Pairs(round, true);
      ASSERT_EQ(0, std::memcmp(round.data.get(), pairs->data.get(), pairs->Bytes())) << what;
      // oneDNN's blocks read the same weights.
      for (bool f32 : {true, false}) {
        const size_t n = static_cast<size_t>(c.cols * c.rows);
        std::vector<float> fa(f32 ? n : 0, -1.0f), fb(fa);
        std::vector<uint16_t> ba(f32 ? 0 : n, 1), bb(ba);
        if (f32) {
          kernels::DequantizePanels(*columns, 0, columns->panels, 0, fa.data(), c.rows);
          kernels::DequantizePanels(*pairs, 0, pairs->panels, 0, fb.data(), c.rows);
          ASSERT_EQ(0, std::memcmp(fa.data(), fb.data(), n * sizeof(float))) << what;
        } else {
          kernels::DequantizePanels(*columns, 0, columns->panels, 0, ba.data(), c.rows);
          kernels::DequantizePanels(*pairs, 0, pairs->panels, 0, bb.data(), c.rows);
          ASSERT_EQ(0, std::memcmp(ba.data(), bb.data(), n * sizeof(uint16_t))) << what;
        }
      }
    }
  }
  // Without --amx-bf16, pairs are read by the AVX-512 BF16 dot kernel where it runs (with the
  // bits it has on columns), else by the tiles (on the emulator where they are not here): the
  // single-threaded products included.
  testing::TestMatrix w = testing::RandomTestMatrix(DType::kBF16, 48, 256, 3, 32);
  auto columns = Pack(w.view);
  GlobalBf16Pairs() = true;
  auto pairs = Pack(w.view);
  GlobalBf16Pairs() = false;
  ASSERT_FALSE(kernels::GlobalKernelOptions().amx_bf16);
  auto x = testing::RandomRows(5, 256, 4);
  std::vector<float> want(5 * 48, -2.0f);
  if (kernels::UseBf16Dot(*pairs)) {
    EXPECT_FALSE(kernels::UseAmxBf16(*pairs));
    kernels::LinearPacked(x.data(), 5, *columns, want.data());
  } else {
    EXPECT_TRUE(kernels::UseAmxBf16(*pairs));
    want = AmxBf16Product(kernels::ActiveAmxBackend(), *pairs, x, 5, 0, pairs->panels);
  }
  std::vector<float> plain(want.size(), -1.0f), single(want.size(), -1.0f);
  kernels::LinearPacked(x.data(), 5, *pairs, plain.data());
  kernels::LinearPanels(x.data(), nullptr, 5, *pairs, 0, pairs->panels, single.data());
  EXPECT_EQ(0, std::memcmp(want.data(), plain.data(), want.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(want.data(), single.data(), want.size() * sizeof(float)));
}

// f32 rows through the tiles as three bf16 parts (LinearPanelsF32, the absorbed MLA's per-head
// products): a weight of 1 passes each value through with every one of its 24 significant bits
// (one bf16 rounding, or two parts, would lose the lower ones); random weights stay within the
// rounding of f32 sums of exact products; a row's bits do not depend on the rows beside it; and
// panels laid out by columns take the f32 kernel, as LinearPanels does.
TEST(AmxBf16Test, F32RowsInThreeBf16PartsKeepEveryBitOfF32) {
  auto pack_pairs = [](const Matrix& view) {
    GlobalBf16Pairs() = true;
    auto packed = Pack(view);
    GlobalBf16Pairs() = false;
    return packed;
  };
  for (int64_t m : {1, 5, 6, 37}) {  // 3m rows: one short tile to several, a partial last one
    // Output r picks column (7r) mod 64, three panels (the last partial).
    const int64_t rows = 40, cols = 64;
    testing::TestMatrix pick = testing::MakeTestMatrix(
        DType::kBF16, rows, cols, 32,
        [&](int64_t r, int64_t c) { return c == 7 * r % cols ? 1.0f : 0.0f; });
    auto packed = pack_pairs(pick.view);
    ASSERT_TRUE(packed->bf16_pairs);
    auto x = testing::RandomRows(m, cols, 31);
    for (float& v : x)
      v *= 1.0f + std::ldexp(1.0f, -20);  // low bits set in every value
    std::vector<float> y(static_cast<size_t>(m * rows), -1.0f);
    kernels::LinearPanelsF32(x.data(), m, *packed, 0, packed->panels, y.data());
    for (int64_t t = 0; t < m; ++t)
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(y[t * rows + r], x[t * cols + 7 * r % cols]) << "m " << m << " row " << t;
  }
  struct Case {
    int64_t rows, cols, m;
  };
  // The bench model's per-head shapes (W_UKᵀ 512 × 64, W_UV 64 × 512) and a partial panel.
  for (Case c : std::vector<Case>{{512, 64, 32}, {64, 512, 32}, {40, 96, 3}}) {
    testing::TestMatrix w = testing::RandomTestMatrix(DType::kBF16, c.rows, c.cols,
                                                      static_cast<uint32_t>(c.rows + c.cols), 32);
    auto pairs = pack_pairs(w.view);
    auto columns = Pack(w.view);
    ASSERT_TRUE(pairs->bf16_pairs);
    ASSERT_FALSE(columns->bf16_pairs);
    const auto x = testing::RandomRows(c.m, c.cols, 8);
    std::vector<float> got(static_cast<size_t>(c.m * c.rows), -1.0f);
    kernels::LinearPanelsF32(x.data(), c.m, *pairs, 0, pairs->panels, got.data());
    const auto* bits = reinterpret_cast<const uint16_t*>(w.bytes.data());
    for (int64_t t = 0; t < c.m; ++t)
      for (int64_t r = 0; r < c.rows; ++r) {
        double want = 0, magnitude = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          const double term =
              static_cast<double>(x[t * c.cols + k]) * BF16ToF32(bits[r * c.cols + k]);
          want += term;
          magnitude += std::fabs(term);
        }
        // f32 sums of exact products: the three parts' chains of cols terms and two adds.
        const double bound = static_cast<double>(c.cols + 2) * std::ldexp(1.0, -24) * magnitude;
        ASSERT_LE(std::fabs(got[t * c.rows + r] - want), bound)
            << c.rows << "x" << c.cols << " row " << t << " output " << r;
      }
    // The last row alone: its bits among the others.
    std::vector<float> alone(static_cast<size_t>(c.rows), -1.0f);
    kernels::LinearPanelsF32(x.data() + (c.m - 1) * c.cols, 1, *pairs, 0, pairs->panels,
                             alone.data());
    EXPECT_EQ(
        0, std::memcmp(alone.data(), got.data() + (c.m - 1) * c.rows, alone.size() * sizeof(float)))
        << c.rows << "x" << c.cols;
    // Panels by columns: LinearPanels' f32 kernel, its bits.
    std::vector<float> f32(got.size(), -1.0f), want(got.size(), -2.0f);
    kernels::LinearPanelsF32(x.data(), c.m, *columns, 0, columns->panels, f32.data());
    kernels::LinearPanels(x.data(), nullptr, c.m, *columns, 0, columns->panels, want.data());
    EXPECT_EQ(0, std::memcmp(f32.data(), want.data(), f32.size() * sizeof(float)))
        << c.rows << "x" << c.cols;
  }
}

// Gate and up walked as pairs of panels, SiLU·up and the rounding for down in the kernel's
// copy-out: the bits of the two products, SiluMul on the item's columns and AmxToBf16Rows, at
// widths that end in a partial panel, over the 256-row chunk, for part of the panels; the rest
// of each row is left as it was.
TEST(AmxBf16Test, FusedGateAndUpGiveTheBitsOfTheProductsOneAfterAnother) {
  struct Case {
    int64_t width, hidden, m, first_panel, end_panel;
  };
  // bf16 laid out as the tiles, bf16 in column panels and fp8 (both converted a unit at a time,
  // fp8 with 64- and 128-column scale blocks).
  struct Weights {
    DType dtype;
    bool pairs;
    int64_t block;
  };
  for (AmxBackend backend : Backends())
    for (Weights kind : {Weights{DType::kBF16, true, 32}, Weights{DType::kBF16, false, 32},
                         Weights{DType::kF8E4M3, false, 64}, Weights{DType::kF8E4M3, false, 128}})
      for (Case c : std::vector<Case>{{16, 128, 1, 0, 1},
                                      {40, 256, 5, 0, 3},
                                      {72, 384, 17, 1, 4},
                                      {128, 128, 300, 2, 8},
                                      {48, 1152, 33, 0, 3},
                                      // x past L2: column slices outer, two units on pairs
                                      {24, 2560, 300, 0, 2}}) {
        testing::TestMatrix g = testing::RandomTestMatrix(
            kind.dtype, c.width, c.hidden, static_cast<uint32_t>(c.width + c.hidden), kind.block);
        testing::TestMatrix u = testing::RandomTestMatrix(
            kind.dtype, c.width, c.hidden, static_cast<uint32_t>(3 * c.width + c.m), kind.block);
        for (float& scale : u.scales)  // not gate's (the test matrices' scales follow the index)
          scale *= 1.75f;
        GlobalBf16Pairs() = kind.pairs;
        auto gate = Pack(g.view), up = Pack(u.view);
        GlobalBf16Pairs() = false;
        ASSERT_TRUE(kernels::AmxGateUpFuses(*gate, *up));
        const std::string what = std::string(kernels::AmxBackendName(backend)) + " " +
                                 std::string(DTypeName(kind.dtype)) +
                                 (kind.pairs ? " pairs " : " ") + std::to_string(c.width) + "x" +
                                 std::to_string(c.hidden) + " m " + std::to_string(c.m);
        auto x = testing::RandomRows(c.m, c.hidden, 17);
        std::vector<uint16_t> xb(static_cast<size_t>(kernels::AmxBf16Elements(c.m, c.hidden)));
        kernels::AmxToBf16Rows(backend, x.data(), c.m, c.hidden, xb.data());
        const size_t out_size = static_cast<size_t>(kernels::AmxBf16Elements(c.m, c.width));
        std::vector<uint16_t> got(out_size, 0xabcd);
        kernels::AmxBf16GateUpPanels(backend, xb.data(), c.m, *gate, *up, c.first_panel,
                                     c.end_panel, got.data());
        // One after another: both products whole, SiluMul on the columns, then the rounding.
        auto y_gate = AmxBf16Product(backend, *gate, x, c.m, 0, gate->panels);
        auto y_up = AmxBf16Product(backend, *up, x, c.m, 0, up->panels);
        const int64_t c0 = c.first_panel * kPanelRows;
        const int64_t c1 = std::min(c.width, c.end_panel * kPanelRows);
        for (int64_t r = 0; r < c.m; ++r)
          kernels::SiluMul(y_gate.data() + r * c.width + c0, y_up.data() + r * c.width + c0,
                           c1 - c0);
        std::vector<uint16_t> want(out_size, 0);
        kernels::AmxToBf16Rows(backend, y_gate.data(), c.m, c.width, want.data());
        const int64_t stride = kernels::AmxBf16RowStride(c.width);
        for (int64_t r = 0; r < c.m; ++r)
          for (int64_t col = 0; col < stride; ++col) {
            const size_t at = static_cast<size_t>(r * stride + col);
            const uint16_t expected = col >= c0 && col < c1 ? want[at] : uint16_t{0xabcd};
            ASSERT_EQ(expected, got[at]) << what << " row " << r << " column " << col;
          }
      }
}

// A SiLU·up value's bits do not depend on where the call's range ends (the tail takes the
// vector arithmetic): every split of a row gives the bits of the whole row.
TEST(AmxBf16Test, SiluMulGivesTheSameBitsWhereverARangeEnds) {
  auto gate = testing::RandomRows(1, 75, 5), up = testing::RandomRows(1, 75, 6);
  for (float& g : gate)
    g *= 8.0f;
  std::vector<float> whole = gate;
  kernels::SiluMul(whole.data(), up.data(), 75);
  for (int64_t split : {1, 3, 7, 8, 13, 16, 31, 74}) {
    std::vector<float> parts = gate;
    kernels::SiluMul(parts.data(), up.data(), split);
    kernels::SiluMul(parts.data() + split, up.data() + split, 75 - split);
    ASSERT_EQ(0, std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)))
        << "split at " << split;
  }
}

// `experts` experts' random gate, up and down ([width, hidden], [width, hidden], [hidden,
// width]), in that order, and the same packed (bf16 weights as tile pairs where `pairs`).
struct TestExperts {
  std::vector<testing::TestMatrix> storage;
  std::vector<std::shared_ptr<const PackedMatrix>> packed;

  TestExperts(DType dtype, int64_t experts, int64_t hidden, int64_t width, uint32_t seed,
              int64_t block) {
    for (int64_t i = 0; i < 3 * experts; ++i) {
      const bool down = i % 3 == 2;
      storage.push_back(testing::RandomTestMatrix(dtype, down ? hidden : width,
                                                  down ? width : hidden,
                                                  seed + static_cast<uint32_t>(i), block));
      for (float& scale : storage.back().scales)  // each matrix its own fp8 scales
        scale *= 1.0f + 0.25f * static_cast<float>(i);
    }
  }
  std::vector<std::shared_ptr<const PackedMatrix>> Packed(bool pairs) const {
    std::vector<std::shared_ptr<const PackedMatrix>> out;
    GlobalBf16Pairs() = pairs;
    for (const auto& m : storage)
      out.push_back(Pack(m.view));
    GlobalBf16Pairs() = false;
    return out;
  }
  static std::vector<kernels::ExpertPanels> Groups(
      const std::vector<std::shared_ptr<const PackedMatrix>>& packed) {
    std::vector<kernels::ExpertPanels> groups;
    for (size_t e = 0; e + 2 < packed.size(); e += 3)
      groups.push_back({packed[e].get(), packed[e + 1].get(), packed[e + 2].get()});
    return groups;
  }
};

// Experts and a dense feed-forward on the AMX kernel (bf16 pairs; fp8 and bf16 column panels
// under --amx-bf16) take the fused gate and up, with the bits of each row's plain products one
// after another: gate, up, SiluMul, down (a row's bits do not depend on its batch). Rows taken
// from their source rows give the same bits, on the fused path (rounded from there) and on one
// that copies them first (the dot kernel's).
// `--amx-bf16` for one test: pairs go to the tiles (where neither it is on nor the tiles run,
// the dot kernel reads them).
struct TilesOn {
  TilesOn() { kernels::GlobalKernelOptions().amx_bf16 = true; }
  ~TilesOn() { kernels::GlobalKernelOptions().amx_bf16 = false; }
};

TEST(AmxBf16Test, GroupedExpertsOnTheTilesGiveTheBitsOfTheirPlainProducts) {
  const int64_t hidden = 256, width = 96, experts = 3;
  struct Weights {
    DType dtype;
    bool pairs;
    int64_t block;
  };
  for (Weights kind : {Weights{DType::kBF16, true, 32}, Weights{DType::kF8E4M3, false, 128},
                       Weights{DType::kBF16, false, 32}}) {
    kernels::GlobalKernelOptions().amx_bf16 = true;
    const TestExperts weights(kind.dtype, experts, hidden, width, 70, kind.block);
    const auto packed = weights.Packed(kind.pairs);
    ASSERT_TRUE(kernels::UseAmxBf16(*packed[0]));
    const auto group = TestExperts::Groups(packed);
    const std::string what = std::string(DTypeName(kind.dtype)) + (kind.pairs ? " pairs" : "");
    auto plain = [&](int64_t e, const float* row, float* out) {
      std::vector<float> gate(width), up(width);
      kernels::LinearPacked(row, 1, *packed[3 * e], gate.data());
      kernels::LinearPacked(row, 1, *packed[3 * e + 1], up.data());
      kernels::SiluMul(gate.data(), up.data(), width);
      kernels::LinearPacked(gate.data(), 1, *packed[3 * e + 2], out);
    };
    for (const std::vector<int64_t>& offsets :
         {std::vector<int64_t>{0, 1, 3, 20}, std::vector<int64_t>{0, 0, 290, 300}}) {
      auto x = testing::RandomRows(offsets.back(), hidden, 32);
      std::vector<float> want(x.size(), -1.0f), got(x.size(), -2.0f);
      for (int64_t e = 0; e < experts; ++e)
        for (int64_t t = offsets[e]; t < offsets[e + 1]; ++t)
          plain(e, x.data() + t * hidden, want.data() + t * hidden);
      kernels::GroupedExpertFfn(x.data(), offsets, group, hidden, got.data());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
          << what << ", " << offsets.back() << " rows";
      std::vector<float> sources(x.size());
      std::vector<int64_t> source_rows(static_cast<size_t>(offsets.back()));
      for (int64_t i = 0; i < offsets.back(); ++i) {
        source_rows[i] = offsets.back() - 1 - i;
        std::copy_n(x.data() + i * hidden, hidden, sources.data() + source_rows[i] * hidden);
      }
      std::vector<float> from_sources(x.size(), -3.0f);
      kernels::GroupedExpertFfn(sources.data(), offsets, group, hidden, from_sources.data(),
                                source_rows.data());
      EXPECT_EQ(0, std::memcmp(want.data(), from_sources.data(), want.size() * sizeof(float)))
          << what << ", " << offsets.back() << " rows from their sources";
      if (kind.dtype == DType::kBF16 && !kind.pairs) {  // the dot kernel: rows copied first
        kernels::GlobalKernelOptions().amx_bf16 = false;
        std::vector<float> copied(x.size(), -4.0f), in_order(x.size(), -5.0f);
        kernels::GroupedExpertFfn(x.data(), offsets, group, hidden, in_order.data());
        kernels::GroupedExpertFfn(sources.data(), offsets, group, hidden, copied.data(),
                                  source_rows.data());
        EXPECT_EQ(0, std::memcmp(in_order.data(), copied.data(), x.size() * sizeof(float)))
            << offsets.back() << " rows copied from their sources";
        kernels::GlobalKernelOptions().amx_bf16 = true;
      }
    }
    {
      // Rows that share a source (a token's several experts), at a prompt's size, where each
      // source row is rounded once for all its expert rows; the odd sources feed no row.
      const std::vector<int64_t> offsets = {0, 120, 250, 300};
      const int64_t rows = offsets.back(), sources_count = 140;
      const auto sources = testing::RandomRows(sources_count, hidden, 34);
      std::vector<int64_t> source_rows(static_cast<size_t>(rows));
      std::vector<float> x(static_cast<size_t>(rows * hidden));
      for (int64_t i = 0; i < rows; ++i) {
        source_rows[i] = (i * 37) % 65 * 2;
        std::copy_n(sources.data() + source_rows[i] * hidden, hidden, x.data() + i * hidden);
      }
      std::vector<float> want(x.size(), -1.0f), got(x.size(), -2.0f);
      for (int64_t e = 0; e < experts; ++e)
        for (int64_t t = offsets[e]; t < offsets[e + 1]; ++t)
          plain(e, x.data() + t * hidden, want.data() + t * hidden);
      kernels::GroupedExpertFfn(sources.data(), offsets, group, hidden, got.data(),
                                source_rows.data());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
          << what << ", rows sharing sources";
    }
    // The dense feed-forward: one group of the fused pass.
    FeedForwardWeights dense;
    Matrix* m[3] = {&dense.gate_proj, &dense.up_proj, &dense.down_proj};
    for (int i = 0; i < 3; ++i) {
      *m[i] = weights.storage[i].view;
      m[i]->packed = packed[i];
    }
    for (int64_t tokens : {1, 7, 40, 300}) {
      auto x = testing::RandomRows(tokens, hidden, 33);
      std::vector<float> want(x.size(), -1.0f), got(x.size(), -2.0f);
      for (int64_t t = 0; t < tokens; ++t)
        plain(0, x.data() + t * hidden, want.data() + t * hidden);
      FeedForward(dense, x.data(), tokens, got.data());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
          << what << ", " << tokens << " tokens";
    }
    kernels::GlobalKernelOptions().amx_bf16 = false;
  }
}

// The routing sum in the down products' copy-out: experts in ascending order over each thread's
// columns, each row weighted into its token's row, from zero at the token's first term — the bits
// of the expert rows summed one term at a time in that order (FinalizeRouting's arithmetic), the
// last group (a shared expert) at weight 1.
TEST(AmxBf16Test, DownProductsSummedIntoTheirTokensGiveTheBitsOfTheRowsSummed) {
  const TilesOn tiles;
  const int64_t hidden = 256, width = 96, experts = 3, tokens = 7;
  const TestExperts weights(DType::kBF16, experts, hidden, width, 90, 32);
  const auto pairs = weights.Packed(true);
  const auto group = TestExperts::Groups(pairs);
  // Expert 0: tokens 1, 4; expert 1: tokens 0, 1, 5, 6; the last (shared): every token.
  const std::vector<int64_t> offsets = {0, 2, 6, 6 + tokens};
  std::vector<int64_t> token = {1, 4, 0, 1, 5, 6};
  std::vector<float> weight = {0.75f, -1.5f, 2.0f, 0.3f, -0.6f, 1.25f};
  for (int64_t t = 0; t < tokens; ++t) {
    token.push_back(t);
    weight.push_back(1.0f);
  }
  std::vector<uint8_t> first(token.size()), seen(tokens, 0);
  for (size_t i = 0; i < token.size(); ++i) {
    first[i] = seen[token[i]] == 0;
    seen[token[i]] = 1;
  }
  auto x = testing::RandomRows(tokens, hidden, 44);
  const int64_t rows = offsets.back();
  std::vector<float> expert_rows(static_cast<size_t>(rows * hidden), -1.0f);
  EXPECT_FALSE(kernels::GroupedExpertFfn(x.data(), offsets, group, hidden, expert_rows.data(),
                                         token.data()));
  std::vector<float> want(static_cast<size_t>(tokens * hidden), -2.0f);
  for (int64_t i = 0; i < rows; ++i)
    kernels::AddWeightedRow(want.data() + token[i] * hidden, expert_rows.data() + i * hidden,
                            weight[i], hidden, first[i] != 0);
  // The terms one at a time are WeightedRowSum's bits (0 + w·r, then + w·r, ...).
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<const float*> terms;
    std::vector<float> term_weights;
    for (int64_t i = 0; i < rows; ++i)
      if (token[i] == t) {
        terms.push_back(expert_rows.data() + i * hidden);
        term_weights.push_back(weight[i]);
      }
    std::vector<float> sum(hidden);
    kernels::WeightedRowSum(terms.data(), term_weights.data(), static_cast<int64_t>(terms.size()),
                            nullptr, hidden, sum.data());
    ASSERT_EQ(0, std::memcmp(sum.data(), want.data() + t * hidden, hidden * sizeof(float)))
        << "token " << t;
  }
  std::vector<float> got(want.size(), -3.0f), untouched(expert_rows.size(), -4.0f);
  const kernels::AmxRoutedRows sum{token.data(), weight.data(), first.data(), got.data(), hidden};
  EXPECT_TRUE(kernels::GroupedExpertFfn(x.data(), offsets, group, hidden, untouched.data(),
                                        token.data(), &sum));
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
  EXPECT_EQ(untouched, std::vector<float>(expert_rows.size(), -4.0f));
}

// At prompt sizes (1,024 rows and more) the threads' shares of down's columns are sized by their
// earlier speed: however unequal they come out, each token's sum keeps the bits of its rows
// summed in order.
TEST(AmxBf16Test, DownSharesOfAnySizeGiveTheSameSums) {
  const TilesOn tiles;
  const int64_t hidden = 256, width = 64, tokens = 600;
  const TestExperts weights(DType::kBF16, 3, hidden, width, 95, 32);
  const auto pairs = weights.Packed(true);
  const auto group = TestExperts::Groups(pairs);
  // Expert 0 takes the even tokens, expert 1 every third, the last (shared) every token.
  std::vector<int64_t> offsets = {0}, token;
  std::vector<float> weight;
  for (int64_t e = 0; e < 3; ++e) {
    for (int64_t t = 0; t < tokens; ++t)
      if (e == 2 || t % (e + 2) == 0) {
        token.push_back(t);
        weight.push_back(e == 2 ? 1.0f : 0.25f + 0.01f * static_cast<float>(t % 7));
      }
    offsets.push_back(static_cast<int64_t>(token.size()));
  }
  const int64_t rows = offsets.back();
  ASSERT_GE(rows, 1024);
  std::vector<uint8_t> first(token.size()), seen(tokens, 0);
  for (size_t i = 0; i < token.size(); ++i) {
    first[i] = seen[token[i]] == 0;
    seen[token[i]] = 1;
  }
  auto x = testing::RandomRows(tokens, hidden, 46);
  std::vector<float> expert_rows(static_cast<size_t>(rows * hidden));
  ASSERT_FALSE(kernels::GroupedExpertFfn(x.data(), offsets, group, hidden, expert_rows.data(),
                                         token.data()));
  std::vector<float> want(static_cast<size_t>(tokens * hidden));
  for (int64_t i = 0; i < rows; ++i)
    kernels::AddWeightedRow(want.data() + token[i] * hidden, expert_rows.data() + i * hidden,
                            weight[i], hidden, first[i] != 0);
  const size_t threads = static_cast<size_t>(ThreadPool::Global().size());
  std::vector<std::vector<double>> costs = {std::vector<double>(threads, 1.0)};
  if (threads > 1) {
    costs.push_back(std::vector<double>(threads, 2.0 / 3.0));
    costs.back()[0] = 2.0;  // share 0 slow: the least columns
    costs.push_back(std::vector<double>(threads, 2.0));
    costs.back()[0] = 2.0 / 3.0;  // share 0 fast: the most
  }
  for (const auto& cost : costs) {
    kernels::SetRoutedShareCostsForTesting(cost);
    std::vector<float> got(want.size(), -3.0f);
    const kernels::AmxRoutedRows sum{token.data(), weight.data(), first.data(), got.data(), hidden};
    ASSERT_TRUE(kernels::GroupedExpertFfn(x.data(), offsets, group, hidden, expert_rows.data(),
                                          token.data(), &sum));
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
        << "share 0's cost " << cost[0];
  }
  kernels::SetRoutedShareCostsForTesting({});
}

// With --amx-bf16, plain and grouped expert products take the kernel: a row of an expert's
// batch has the bits of that row's plain products (the SiLU as the kernel computes it).
TEST(AmxBf16Test, LinearAndGroupedExpertsTakeItWhenAsked) {
  kernels::GlobalKernelOptions().amx_bf16 = true;
  const AmxBackend backend = kernels::ActiveAmxBackend();
  ASSERT_NE(backend, AmxBackend::kNone);
  const int64_t hidden = 256, width = 128, experts = 3;
  const TestExperts weights(DType::kF8E4M3, experts, hidden, width, 40, 128);
  const auto packed = weights.Packed(false);
  EXPECT_NE(std::string(kernels::KernelPathName(1, *packed[0])).find("amx-bf16"),
            std::string::npos);
  const auto panels = TestExperts::Groups(packed);
  const std::vector<int64_t> offsets = {0, 1, 3, 20};  // 1, 2 and 17 rows
  auto x = testing::RandomRows(offsets.back(), hidden, 31);
  std::vector<float> grouped(x.size(), -1.0f);
  kernels::GroupedExpertFfn(x.data(), offsets, panels, hidden, grouped.data());
  // Each row alone through plain products: gate, up, SiLU(gate)·up, down.
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t t = offsets[e]; t < offsets[e + 1]; ++t) {
      std::vector<float> gate(width), up(width), out(hidden);
      kernels::LinearPacked(x.data() + t * hidden, 1, *packed[3 * e], gate.data());
      kernels::LinearPacked(x.data() + t * hidden, 1, *packed[3 * e + 1], up.data());
      for (int64_t i = 0; i < width; ++i)
        gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
      kernels::LinearPacked(gate.data(), 1, *packed[3 * e + 2], out.data());
      EXPECT_EQ(0, std::memcmp(out.data(), grouped.data() + t * hidden, hidden * sizeof(float)))
          << "expert " << e << " row " << t;
    }
  kernels::GlobalKernelOptions().amx_bf16 = false;
}

// --- MLA ---

// Absorbed attention on tiles, against the double-precision softmax (the bound of the bf16 MLA
// kernel's test: bf16 queries and probabilities), on head counts over and under a tile's 16, and
// the same bits in head blocks of 5 and 16 and for each token alone. Two caches: a width that is
// not whole tiles (48 + 8, every key tile copied) on pages of 7; and one that is (48 + 16) on
// pages of 24 laid out in reverse, so that tiles of 16 keys within a page are loaded in place and
// those across two pages copied, with keys over several softmax chunks of 128.
TEST(AmxMlaTest, MatchesTheSoftmaxAndDoesNotDependOnItsNeighbours) {
  struct Shape {
    int64_t latent, rope, page;
    std::vector<int64_t> keys;
  };
  for (const Shape& shape : {Shape{48, 8, 7, {1, 37, 70}}, Shape{48, 16, 24, {150, 300}}})
    for (AmxBackend backend : Backends()) {
      const int64_t latent = shape.latent, rope = shape.rope, page = shape.page;
      const int64_t width = latent + rope;
      ASSERT_TRUE(kernels::AmxMlaApplies(DType::kBF16, latent, rope));
      for (int64_t heads : {int64_t{21}, int64_t{3}}) {
        for (int64_t keys : shape.keys) {
          for (int64_t tokens : {int64_t{1}, int64_t{3}}) {
            if (tokens > keys) continue;
            const testing::TestLatentCache cache =
                testing::MakeTestLatentCache(keys, width, page, 11);
            auto q_latent = testing::RandomRows(tokens * heads, latent, 12);
            auto q_pe = testing::RandomRows(tokens * heads, rope, 13);
            std::vector<int64_t> positions;
            for (int64_t t = 0; t < tokens; ++t)
              positions.push_back(keys - tokens + t);
            const float scale = 0.3f;
            auto run = [&](int64_t t0, int64_t count, int64_t h0, int64_t h1, float* out) {
              kernels::AmxMlaDecode(backend, q_latent.data() + t0 * heads * latent,
                                    q_pe.data() + t0 * heads * rope, count, positions.data() + t0,
                                    cache.view, keys, heads, h0, h1, latent, rope, scale,
                                    out + t0 * heads * latent);
            };
            std::vector<float> whole(static_cast<size_t>(tokens * heads * latent));
            run(0, tokens, 0, heads, whole.data());
            std::vector<float> blocks(whole.size(), -1.0f), alone(whole.size(), -1.0f);
            for (int64_t h0 = 0; h0 < heads; h0 += 5)
              run(0, tokens, h0, std::min(heads, h0 + 5), blocks.data());
            for (int64_t t = 0; t < tokens; ++t)
              for (int64_t h0 = 0; h0 < heads; h0 += 16)
                run(t, 1, h0, std::min(heads, h0 + 16), alone.data());
            const std::string where = std::string(kernels::AmxBackendName(backend)) + " width " +
                                      std::to_string(width) + " heads " + std::to_string(heads) +
                                      " keys " + std::to_string(keys) + " tokens " +
                                      std::to_string(tokens);
            EXPECT_EQ(0, std::memcmp(blocks.data(), whole.data(), whole.size() * 4)) << where;
            EXPECT_EQ(0, std::memcmp(alone.data(), whole.data(), whole.size() * 4)) << where;
            if (backend == AmxBackend::kHardware) {  // the emulator gives the tiles' bits
              std::vector<float> emulated(whole.size(), -1.0f);
              kernels::AmxMlaDecode(AmxBackend::kEmulated, q_latent.data(), q_pe.data(), tokens,
                                    positions.data(), cache.view, keys, heads, 0, heads, latent,
                                    rope, scale, emulated.data());
              EXPECT_EQ(0, std::memcmp(emulated.data(), whole.data(), whole.size() * 4)) << where;
            }
            const auto want = testing::AbsorbedAttentionReference(
                q_latent, q_pe, cache.rows, positions, heads, latent, rope, scale);
            for (size_t i = 0; i < want.size(); ++i)
              ASSERT_NEAR(whole[i], want[i], 2e-2) << where << " at " << i;
          }
        }
      }
    }
}

// An fp8 cache on the tiles: its chunks' rows widened to bf16 (exactly) give the bits a bf16
// cache holding the same values gives — keys in place and copied, several chunks, two scale
// blocks (latent 160, the second partial), on every backend here.
TEST(AmxMlaTest, AnFp8CacheGivesTheBitsOfABf16CacheHoldingItsValues) {
  const int64_t latent = 160, rope = 16, page = 24, heads = 21, width = latent + rope;
  ASSERT_TRUE(kernels::AmxMlaApplies(DType::kF8E4M3, latent, rope));
  for (AmxBackend backend : Backends())
    for (int64_t keys : {int64_t{1}, int64_t{70}, int64_t{300}}) {
      const int64_t tokens = std::min<int64_t>(keys, 3);
      const testing::TestLatentCache fp8 =
          testing::MakeTestLatentCache(keys, width, page, 19, DType::kF8E4M3, latent);
      const testing::TestLatentCache bf16 =
          testing::MakeTestLatentCacheOf(fp8.rows, width, page, DType::kBF16, latent);
      auto q_latent = testing::RandomRows(tokens * heads, latent, 12);
      auto q_pe = testing::RandomRows(tokens * heads, rope, 13);
      std::vector<int64_t> positions;
      for (int64_t t = 0; t < tokens; ++t)
        positions.push_back(keys - tokens + t);
      std::vector<float> got(static_cast<size_t>(tokens * heads * latent)), want(got.size());
      kernels::AmxMlaDecode(backend, q_latent.data(), q_pe.data(), tokens, positions.data(),
                            fp8.view, keys, heads, 0, heads, latent, rope, 0.3f, got.data());
      kernels::AmxMlaDecode(backend, q_latent.data(), q_pe.data(), tokens, positions.data(),
                            bf16.view, keys, heads, 0, heads, latent, rope, 0.3f, want.data());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
          << kernels::AmxBackendName(backend) << " keys " << keys;
    }
}

// The model with --amx-bf16 against Hugging Face transformers, at the bar of the bf16 dot kernel
// (conformance_test.cc's Bf16DotPathMeetsTheBar): every tiny fixture and the default model.
TEST(AmxBf16Test, TheModelMeetsTheBf16Bar) {
  kernels::GlobalKernelOptions().amx_bf16 = true;
  auto run = [](const Model& model, const testing::Fixture& fixture) {
    std::vector<float> all;
    for (const auto& ids : fixture.tokens) {
      const int64_t T = static_cast<int64_t>(ids.size());
      LatentCache cache = model.NewCache(T, 1, DType::kBF16);
      SequenceCache seq;
      ForwardBatch batch;
      batch.Add(ids.data(), T, &seq);
      std::vector<float> logits;
      EXPECT_TRUE(model.Forward(batch, cache, ForwardOptions{}, &logits).ok());
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  };
  for (const auto& name : testing::FixtureNames()) {
    testing::Fixture fixture = testing::LoadFixture(name);
    auto model = Model::Load(fixture.directory);
    ASSERT_TRUE(model.ok()) << model.status().message();
    auto comparison =
        testing::CompareLogits(fixture.logits, run(*model.value(), fixture), fixture.vocab);
    const int64_t rows = static_cast<int64_t>(comparison.row_max_diff.size());
    testing::ExpectRoundedPathMeetsTheBar(*model.value(), fixture, comparison,
                                          std::max<int64_t>(2, rows / 20), name);
  }
  testing::Fixture fixture = testing::LoadFixture("default-model");
  auto model = Model::Load(std::string(SY_SOURCE_DIR) + "/models/default");
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto comparison =
      testing::CompareLogits(fixture.logits, run(*model.value(), fixture), fixture.vocab);
  EXPECT_EQ(comparison.argmax_mismatches, 0);
  EXPECT_LE(comparison.max_abs_diff, 2e-2 * comparison.max_abs_reference);
  EXPECT_GT(comparison.max_abs_diff, 0.0);  // bf16 activations: not the f32 path's bits
  kernels::GlobalKernelOptions().amx_bf16 = false;
}

// The MoE router's product keeps f32 activations on every kernel (kernels::LinearF32; HF runs
// the router in f32). Against double sums of the checkpoint's bf16 weights, every logit is within
// what f32 sums of exact products round, (D + 2)·2⁻²⁴ of its terms' magnitude: on column panels
// with the bf16 dot kernel or AMX allowed or not (the f32 kernel's bits every time), and on bf16
// laid out as AMX tiles (three bf16 parts a row). Through LinearAuto the dot kernel and the tiles
// rounded x to bf16, 2⁻⁹ of each term. RouteTokens takes it: the same routing whatever kernels
// are allowed, and on the tiles the same experts with weights within what the bound allows.
TEST(AmxBf16Test, TheRouterKeepsF32ActivationsOnEveryKernel) {
  const std::string dir = std::string(testing::kFixturesDir) + "/tiny-v3-bf16";
  auto columns = Model::Load(dir);
  ASSERT_TRUE(columns.ok()) << columns.status().message();
  GlobalBf16Pairs() = true;  // bf16 laid out as the tiles, as the loader does where AMX runs
  auto pairs = Model::Load(dir);
  GlobalBf16Pairs() = false;
  ASSERT_TRUE(pairs.ok()) << pairs.status().message();
  const ModelConfig& c = columns.value()->config();
  const int64_t D = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const bool dot_default = kernels::GlobalKernelOptions().bf16_dot;
  int moe_layers = 0;
  for (size_t l = 0; l < columns.value()->weights().layers.size(); ++l) {
    if (!columns.value()->weights().layers[l].is_moe) continue;
    ++moe_layers;
    const MoeWeights& by_columns = columns.value()->weights().layers[l].moe;
    const MoeWeights& by_pairs = pairs.value()->weights().layers[l].moe;
    const PackedMatrix& gate = *by_columns.gate.packed;
    ASSERT_EQ(gate.dtype, DType::kBF16);
    ASSERT_FALSE(gate.bf16_pairs);
    ASSERT_TRUE(by_pairs.gate.packed->bf16_pairs);
    auto weight = [&](int64_t e, int64_t k) {  // column panels: [cols][16] a panel
      return static_cast<double>(BF16ToF32(reinterpret_cast<const uint16_t*>(
          gate.Panel(e / kPanelRows))[k * kPanelRows + e % kPanelRows]));
    };
    for (int64_t tokens : {1, 70}) {  // 70: two blocks of rows
      SCOPED_TRACE(::testing::Message() << "layer " << l << ", " << tokens << " tokens");
      auto x = testing::RandomRows(tokens, D, static_cast<uint32_t>(l * 100 + tokens));
      for (float& v : x)
        v *= 1.0f + std::ldexp(1.0f, -20);  // low bits set in every value
      std::vector<double> bound(static_cast<size_t>(tokens * E)), want(bound.size());
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t e = 0; e < E; ++e) {
          double sum = 0, magnitude = 0;
          for (int64_t k = 0; k < D; ++k) {
            const double term = static_cast<double>(x[t * D + k]) * weight(e, k);
            sum += term;
            magnitude += std::fabs(term);
          }
          want[t * E + e] = sum;
          bound[t * E + e] = static_cast<double>(D + 2) * std::ldexp(1.0, -24) * magnitude;
        }
      auto logits = [&](const Matrix& gate_matrix) {
        std::vector<float> y(static_cast<size_t>(tokens * E), -1.0f);
        kernels::LinearF32(x.data(), tokens, gate_matrix, y.data());
        for (size_t i = 0; i < y.size(); ++i)
          EXPECT_LE(std::fabs(y[i] - want[i]), bound[i]) << "logit " << i;
        return y;
      };
      kernels::GlobalKernelOptions().bf16_dot = false;
      const auto f32 = logits(by_columns.gate);
      const ExpertRouting f32_routing = RouteTokens(c, by_columns, x.data(), tokens);
      kernels::GlobalKernelOptions().bf16_dot = true;
      const auto dot = logits(by_columns.gate);
      const ExpertRouting dot_routing = RouteTokens(c, by_columns, x.data(), tokens);
      kernels::GlobalKernelOptions().bf16_dot = dot_default;
      kernels::GlobalKernelOptions().amx_bf16 = true;  // column panels on the tiles (converted)
      const auto amx = logits(by_columns.gate);
      const ExpertRouting amx_routing = RouteTokens(c, by_columns, x.data(), tokens);
      kernels::GlobalKernelOptions().amx_bf16 = false;
      for (const auto* other : {&dot, &amx})
        EXPECT_EQ(0, std::memcmp(f32.data(), other->data(), f32.size() * sizeof(float)));
      for (const auto* other : {&dot_routing, &amx_routing}) {
        EXPECT_EQ(f32_routing.expert_ids, other->expert_ids);
        EXPECT_EQ(f32_routing.weights, other->weights);
      }

      kernels::GlobalKernelOptions().amx_bf16 = true;
      logits(by_pairs.gate);
      const ExpertRouting tiles = RouteTokens(c, by_pairs, x.data(), tokens);
      kernels::GlobalKernelOptions().amx_bf16 = false;
      ASSERT_EQ(tiles.expert_ids, f32_routing.expert_ids);
      // weight_i = scale · s_i / S over the chosen experts (s = sigmoid(logit), S = Σ s): with
      // every logit off by at most b, s' ≤ 1/4 moves it by at most scale · b · (K + 1) / (4 S),
      // plus a few roundings of the weight itself.
      for (int64_t t = 0; t < tokens; ++t) {
        double S = 0, b = 0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t e = f32_routing.expert_ids[t * K + j];
          S += 1.0 / (1.0 + std::exp(-want[t * E + e]));
        }
        for (int64_t e = 0; e < E; ++e)
          b = std::max(b, 2 * bound[t * E + e]);  // both logits within the bound of the exact one
        for (int64_t j = 0; j < K; ++j) {
          const double w = f32_routing.weights[t * K + j];
          const double slack =
              c.routed_scaling_factor * b * (K + 1) / (4 * S) + 8 * std::ldexp(std::fabs(w), -24);
          EXPECT_LE(std::fabs(tiles.weights[t * K + j] - w), slack)
              << "token " << t << " slot " << j;
        }
      }
    }
  }
  EXPECT_GT(moe_layers, 0);
}

}  // namespace
}  // namespace sy
