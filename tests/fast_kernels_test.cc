// Every fast kernel against its reference kernel on random inputs at awkward sizes (not
// multiples of the panel, of 128, of the SIMD width; experts with zero rows; one row), on every
// SIMD target this binary was built for and this CPU runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <sys/mman.h>

#include "base/thread_pool.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/grouped_ffn.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/mla_decode.h"
#include "kernels/cpu/onednn_linear.h"
#include "kernels/cpu/panel_gemm.h"
#include "model/feed_forward.h"
#include "test_support.h"

namespace sy {
namespace {

// These tests hold the f32 panel kernel and the bf16 GEMM to their references; the bf16 dot
// kernel, which would otherwise take fp8 and bf16 weights on CPUs that have it, has its own
// (bf16_dot_test.cc).
const bool kDotKernelOff = [] {
  kernels::GlobalKernelOptions().bf16_dot = false;
  return true;
}();

struct OwnedMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  Matrix view;
};

// A random [rows, cols] matrix in `dtype`; fp8 with `block`-sized scale blocks.
OwnedMatrix RandomMatrix(DType dtype, int64_t rows, int64_t cols, uint32_t seed,
                         int64_t block = 128) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  OwnedMatrix m;
  const size_t count = static_cast<size_t>(rows * cols);
  m.bytes.resize(count * DTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    const float v = normal(rng);
    switch (dtype) {
      case DType::kF8E4M3:
        m.bytes[i] = F32ToF8E4M3(v * 100);
        break;
      case DType::kBF16: {
        uint16_t b = F32ToBF16(v);
        std::memcpy(&m.bytes[2 * i], &b, 2);
        break;
      }
      case DType::kF16: {
        uint16_t b = F32ToF16(v);
        std::memcpy(&m.bytes[2 * i], &b, 2);
        break;
      }
      default:
        std::memcpy(&m.bytes[4 * i], &v, 4);
        break;
    }
  }
  m.view.dtype = dtype;
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.data = m.bytes.data();
  if (dtype == DType::kF8E4M3) {
    m.view.block_rows = m.view.block_cols = block;
    m.view.scale_cols = (cols + block - 1) / block;
    m.scales.resize(static_cast<size_t>((rows + block - 1) / block * m.view.scale_cols));
    for (size_t i = 0; i < m.scales.size(); ++i)
      m.scales[i] = 0.001f * (1 + i % 5);
    m.view.block_scales = m.scales.data();
  }
  return m;
}

std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v)
    x = normal(rng);
  return v;
}

// max |a − b| relative to max |b|.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

// Rows already sorted by expert, `counts[e]` of them for expert e, one slot per token.
ExpertRouting OneSlotRouting(const std::vector<int64_t>& counts) {
  ExpertRouting routing;
  routing.top_k = 1;
  routing.expert_offsets = {0};
  for (int64_t c : counts)
    routing.expert_offsets.push_back(routing.expert_offsets.back() + c);
  routing.tokens = routing.expert_offsets.back();
  for (int64_t i = 0; i < routing.tokens; ++i)
    routing.sorted_slots.push_back(static_cast<int32_t>(i));
  return routing;
}

class PerTarget : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { kernels::ForcePanelGemmTarget(GetParam()); }
  void TearDown() override { kernels::ForcePanelGemmTarget(0); }
};

// Forcing a target affects every Highway dispatch in the process, the MLA kernel's included.
class PerTargetMla : public PerTarget {};

std::string TargetName(const ::testing::TestParamInfo<int64_t>& info) {
  return kernels::TargetName(info.param);
}

TEST_P(PerTarget, PanelGemmMatchesReference) {
  kernels::GlobalKernelOptions().allow_bf16_gemm = false;
  for (DType dtype : {DType::kF8E4M3, DType::kBF16, DType::kF32, DType::kF16}) {
    for (auto [rows, cols, m] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 1, 1},
             {17, 33, 1},
             {33, 129, 3},
             {130, 300, 5},
             {256, 257, 9},
             {48, 7, 2},
             // four-panel decode path (m ≤ 2) with leftover panels and an odd column count
             {100, 131, 1},
             {70, 257, 2},
             {64, 128, 1}}) {
      OwnedMatrix w = RandomMatrix(dtype, rows, cols, static_cast<uint32_t>(rows * 31 + cols));
      ASSERT_TRUE(CanPack(w.view));
      auto packed = Pack(w.view);
      auto x = RandomVector(static_cast<size_t>(m * cols), 7);
      std::vector<float> expected(static_cast<size_t>(m * rows)), got(expected.size(), -1);
      kernels::Linear(x.data(), m, w.view, expected.data());
      kernels::LinearPacked(x.data(), m, *packed, got.data());
      EXPECT_LT(RelativeError(got, expected), 1e-5)
          << DTypeName(dtype) << " rows " << rows << " cols " << cols << " m " << m;
    }
  }
  kernels::GlobalKernelOptions().allow_bf16_gemm = false;
}

// Every target's panel products give a row the same bits whatever the rows beside it: decode does
// not depend on the batch, and --batch-invariant holds on every CPU (AVX2 included).
TEST_P(PerTarget, RowsAreTheSameBitsAtEveryBatchSize) {
  kernels::GlobalKernelOptions().allow_bf16_gemm = false;
  for (DType dtype : {DType::kF8E4M3, DType::kBF16, DType::kF32}) {
    // 6 panels (no split-K), 300 columns: two whole fp8 blocks and a partial one; 600 columns
    // cross the many-row path's 256-column ranges inside a block.
    for (int64_t cols : {300, 600}) {
      OwnedMatrix w = RandomMatrix(dtype, 90, cols, static_cast<uint32_t>(cols) + 5);
      auto packed = Pack(w.view);
      constexpr int64_t kRows = 41;
      auto x = RandomVector(static_cast<size_t>(kRows * cols), 9);
      std::vector<float> all(static_cast<size_t>(kRows * 90));
      kernels::LinearPacked(x.data(), kRows, *packed, all.data());
      for (int64_t m : {1, 2, 3, 4, 5, 7, 12, 13}) {
        for (int64_t first : {int64_t{0}, kRows - m}) {
          std::vector<float> some(static_cast<size_t>(m * 90));
          kernels::LinearPacked(x.data() + first * cols, m, *packed, some.data());
          EXPECT_EQ(std::memcmp(some.data(), all.data() + first * 90, some.size() * sizeof(float)),
                    0)
              << DTypeName(dtype) << " cols " << cols << " m " << m << " first row " << first;
        }
      }
    }
  }
  kernels::GlobalKernelOptions().allow_bf16_gemm = false;
}

INSTANTIATE_TEST_SUITE_P(Targets, PerTarget, ::testing::ValuesIn(kernels::PanelGemmTargets()),
                         TargetName);

// Whether [p, p + bytes) is mapped: mincore fails with ENOMEM on an unmapped page.
bool Mapped(const uint8_t* p, size_t bytes) {
  const uintptr_t page = 4096, start = reinterpret_cast<uintptr_t>(p) / page * page;
  std::vector<unsigned char> resident((reinterpret_cast<uintptr_t>(p) + bytes - start + page - 1) /
                                      page);
  return ::mincore(reinterpret_cast<void*>(start), reinterpret_cast<uintptr_t>(p) + bytes - start,
                   resident.data()) == 0;
}

TEST(PanelArenaTest, SmallMatricesOfALoadShareAChunkThatLivesWhileAnyOfThem) {
  const size_t sizes[] = {1000, 64 * 1024, (1u << 20) + 7};
  std::vector<std::shared_ptr<uint8_t>> pieces;
  {
    PanelArenaScope scope;
    for (size_t bytes : sizes)
      pieces.push_back(AllocatePanels(bytes));
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const uint8_t* p = pieces[i].get();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << i;
    EXPECT_TRUE(std::all_of(p, p + sizes[i], [](uint8_t b) { return b == 0; })) << i;
    std::memset(pieces[i].get(), 0xa5, sizes[i]);  // writable, and no piece overlaps another
    if (i > 0) {  // side by side: each after the previous one, rounded to 64 bytes
      EXPECT_EQ(p - pieces[i - 1].get(), static_cast<ptrdiff_t>((sizes[i - 1] + 63) / 64 * 64))
          << i;
    }
  }
  for (size_t i = 0; i < pieces.size(); ++i)
    EXPECT_EQ(pieces[i].get()[sizes[i] - 1], 0xa5) << i;
  // The chunk outlives the scope while a piece lives, and goes with the last one.
  const uint8_t* first = pieces[0].get();
  pieces.erase(pieces.begin(), pieces.begin() + 2);
  EXPECT_TRUE(Mapped(first, 64));
  pieces.clear();
  EXPECT_FALSE(Mapped(first, 64));

  // A matrix's scale vectors come from the same chunks, after its panels, and hold them too.
  {
    std::shared_ptr<uint8_t> panels;
    PanelVector<int8_t> scales;
    {
      PanelArenaScope scope;
      panels = AllocatePanels(100);
      scales.assign(1000, 3);
    }
    EXPECT_EQ(reinterpret_cast<uint8_t*>(scales.data()), panels.get() + 128);
    const uint8_t* chunk = panels.get();
    panels.reset();
    EXPECT_TRUE(Mapped(chunk, 64));
    EXPECT_EQ(scales[999], 3);
    PanelVector<int8_t> copy = scales;  // outside a load: the heap
    EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.data()) % 64, 0u);
    scales = PanelVector<int8_t>();
    EXPECT_FALSE(Mapped(chunk, 64));
    EXPECT_EQ(copy[999], 3);
  }

  // The chunk's untouched tail goes back when the load ends, and freeing the chunk later leaves
  // alone whatever was mapped there since.
  std::shared_ptr<uint8_t> piece;
  {
    PanelArenaScope scope;
    piece = AllocatePanels(1000);
  }
  uint8_t* tail = piece.get() + (2u << 20);
  void* other = ::mmap(tail, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_EQ(other, tail) << "the kernel did not place the mapping in the returned tail";
  piece.reset();
  EXPECT_TRUE(Mapped(static_cast<uint8_t*>(other), 4096));
  ::munmap(other, 4096);

  // Outside a scope small matrices come from the heap (not side by side in a chunk); large ones
  // are mapped on their own either way.
  auto heap = AllocatePanels(1000);
  auto large = AllocatePanels(3u << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(heap.get()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.get()) % (2u << 20), 0u);
  EXPECT_EQ(large.get()[(3u << 20) - 1], 0);
}

TEST(FastKernelsTest, PartialFp8BlocksUseTheirOwnScales) {
  // 16-row blocks: every panel has its own scale row; 40 columns leave a partial column block.
  OwnedMatrix w = RandomMatrix(DType::kF8E4M3, 50, 40, 3, 16);
  auto packed = Pack(w.view);
  auto x = RandomVector(40 * 2, 4);
  std::vector<float> expected(100), got(100);
  kernels::Linear(x.data(), 2, w.view, expected.data());
  kernels::LinearPacked(x.data(), 2, *packed, got.data());
  EXPECT_LT(RelativeError(got, expected), 1e-5);
}

TEST(FastKernelsTest, Bf16GemmMatchesReferenceWithinBf16Rounding) {
  if (!kernels::HasAvx512Bf16()) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  kernels::GlobalKernelOptions().bf16_gemm_min_rows = 1;
  kernels::GlobalKernelOptions().allow_bf16_gemm = true;  // as --prefill-gemm other than own
  for (DType dtype : {DType::kF8E4M3, DType::kBF16, DType::kF32}) {
    for (auto [rows, cols, m] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {16, 2, 1}, {17, 33, 13}, {47, 301, 25}, {256, 513, 37}, {33, 1, 12}}) {
      OwnedMatrix w = RandomMatrix(dtype, rows, cols, static_cast<uint32_t>(rows + cols));
      auto packed = Pack(w.view);
      auto x = RandomVector(static_cast<size_t>(m * cols), 9);
      std::vector<float> expected(static_cast<size_t>(m * rows)), got(expected.size(), -1);
      kernels::Linear(x.data(), m, w.view, expected.data());
      kernels::LinearPacked(x.data(), m, *packed, got.data());
      // Activations (and f32 weights) are rounded to bf16: 8 significant bits.
      EXPECT_LT(RelativeError(got, expected), 2e-2)
          << DTypeName(dtype) << " " << rows << "x" << cols << " m " << m;
    }
  }
  kernels::GlobalKernelOptions().bf16_gemm_min_rows = 128;
  kernels::GlobalKernelOptions().allow_bf16_gemm = false;
}

TEST(FastKernelsTest, GroupedExpertFfnMatchesReference) {
  const int64_t hidden = 70, width = 45, experts = 6;
  // Expert 1 and 4 have no rows, expert 3 exactly one, expert 5 is not held here.
  const std::vector<int64_t> counts = {3, 0, 7, 1, 0, 2};
  MoeWeights moe;
  std::vector<OwnedMatrix> storage;
  moe.experts.resize(experts);
  for (int64_t e = 0; e < experts - 1; ++e) {
    storage.push_back(
        RandomMatrix(DType::kF8E4M3, width, hidden, static_cast<uint32_t>(10 + e), 16));
    storage.push_back(
        RandomMatrix(DType::kF8E4M3, width, hidden, static_cast<uint32_t>(20 + e), 16));
    storage.push_back(
        RandomMatrix(DType::kF8E4M3, hidden, width, static_cast<uint32_t>(30 + e), 16));
  }
  for (int64_t e = 0; e < experts - 1; ++e) {
    moe.experts[e] = {storage[3 * e].view, storage[3 * e + 1].view, storage[3 * e + 2].view};
  }
  const ExpertRouting routing = OneSlotRouting(counts);
  const int64_t rows = routing.tokens;
  auto x = RandomVector(static_cast<size_t>(rows * hidden), 5);
  for (float& v : x)
    v *= 0.1f;
  std::vector<float> expected(x.size(), 0), got(x.size(), 0);
  RunExpertsReference(moe, routing, x.data(), hidden, expected.data());
  std::vector<kernels::ExpertPanels> panels(experts);
  std::vector<std::shared_ptr<const PackedMatrix>> keep;
  for (int64_t e = 0; e < experts - 1; ++e) {
    for (Matrix* m :
         {&moe.experts[e].gate_proj, &moe.experts[e].up_proj, &moe.experts[e].down_proj}) {
      keep.push_back(Pack(*m));
    }
    panels[e] = {keep[3 * e].get(), keep[3 * e + 1].get(), keep[3 * e + 2].get()};
  }
  kernels::GlobalKernelOptions().allow_bf16_gemm = true;  // as --prefill-gemm other than own
  for (int64_t min_rows :
       {int64_t{1}, int64_t{1000}}) {  // the bf16 GEMM for every expert, then none
    kernels::GlobalKernelOptions().bf16_gemm_min_rows = min_rows;
    std::fill(got.begin(), got.end(), 0.0f);
    kernels::GroupedExpertFfn(x.data(), routing.expert_offsets, panels, hidden, got.data());
    const double tolerance = min_rows == 1 && kernels::HasAvx512Bf16() ? 3e-2 : 1e-5;
    EXPECT_LT(RelativeError(got, expected), tolerance) << "min rows " << min_rows;
  }
  kernels::GlobalKernelOptions().bf16_gemm_min_rows = 128;
  kernels::GlobalKernelOptions().allow_bf16_gemm = false;
}

// --- int8 products (--int8-products) ---

// The weight code of output row `o`, column `c` in PackInt8's layout.
int Int8Code(const PackedMatrix& w, int64_t o, int64_t c) {
  const auto* panel = reinterpret_cast<const int8_t*>(w.Panel(o / kPanelRows));
  return panel[((c / kInt8QuadCols) * kPanelRows + o % kPanelRows) * kInt8QuadCols +
               c % kInt8QuadCols];
}
float Int8Scale(const PackedMatrix& w, int64_t o, int64_t g) {
  return w.row_scales[(o / kPanelRows) * w.groups * kPanelRows + g * kPanelRows + o % kPanelRows];
}

// The product of the quantized values in double: what the kernel must give, up to the f32
// rounding of each group's term.
std::vector<float> Int8Reference(const PackedMatrix& w, const kernels::Int8Rows& x, int64_t m) {
  std::vector<float> y(static_cast<size_t>(m * w.rows));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < w.rows; ++o) {
      double sum = 0;
      for (int64_t g = 0; g < w.groups; ++g) {
        int64_t dot = 0;
        for (int64_t c = g * kInt8GroupCols; c < std::min(w.cols, (g + 1) * kInt8GroupCols); ++c)
          dot += static_cast<int64_t>(Int8Code(w, o, c)) * (x.Codes(r)[c] - 128);
        sum += static_cast<double>(dot) * Int8Scale(w, o, g) * x.Scales(r)[g];
      }
      y[r * w.rows + o] = static_cast<float>(sum);
    }
  return y;
}

TEST(Int8ProductsTest, CodesHoldEachWeightToHalfAStep) {
  for (DType dtype : {DType::kF8E4M3, DType::kBF16}) {
    OwnedMatrix w = RandomMatrix(dtype, 37, 260, 3);
    ASSERT_TRUE(CanPackInt8(w.view));
    auto packed = PackInt8(w.view);
    ASSERT_EQ(packed->dtype, DType::kI8);
    ASSERT_EQ(packed->groups, 3);
    std::vector<float> row(260);
    for (int64_t o = 0; o < 37; ++o) {
      w.view.DecodeRow(o, row.data());
      for (int64_t c = 0; c < 260; ++c) {
        const float scale = Int8Scale(*packed, o, c / kInt8GroupCols);
        ASSERT_LE(std::abs(Int8Code(*packed, o, c)), kInt8WeightMax);
        ASSERT_LE(std::fabs(Int8Code(*packed, o, c) * scale - row[c]), 0.5f * scale * 1.0001f)
            << DTypeName(dtype) << " row " << o << " col " << c;
      }
    }
  }
  OwnedMatrix odd = RandomMatrix(DType::kBF16, 8, 6, 1);  // 6 columns: not whole quads
  EXPECT_FALSE(CanPackInt8(odd.view));
  OwnedMatrix f32 = RandomMatrix(DType::kF32, 8, 8, 1);  // f32 stays exact
  EXPECT_FALSE(CanPackInt8(f32.view));
}

// The kernel computes the quantized product exactly (integer sums, f32 group terms), and the
// quantized product stays close to the exact one.
// Every int8 kernel this CPU runs, slowest first.
std::vector<kernels::Int8Kernel> Int8KernelsHere() {
  std::vector<kernels::Int8Kernel> kernels;
  for (auto k : {kernels::Int8Kernel::kPortable, kernels::Int8Kernel::kAvx2,
                 kernels::Int8Kernel::kAvx512Vnni})
    if (k <= kernels::BestInt8Kernel()) kernels.push_back(k);
  return kernels;
}

TEST(Int8ProductsTest, MatchesTheQuantizedProductAndStaysCloseToExact) {
  for (kernels::Int8Kernel kernel : Int8KernelsHere()) {
    kernels::LimitInt8Kernel(kernel);
    for (DType dtype : {DType::kF8E4M3, DType::kBF16}) {
      for (auto [rows, cols, m] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {1, 4, 1}, {17, 132, 1}, {37, 260, 3}, {70, 388, 7}, {130, 512, 13}, {48, 128, 2}}) {
        OwnedMatrix w = RandomMatrix(dtype, rows, cols, static_cast<uint32_t>(rows * 7 + cols));
        auto packed = PackInt8(w.view);
        auto x = RandomVector(static_cast<size_t>(m * cols), 11);
        std::vector<float> exact(static_cast<size_t>(m * rows)), got(exact.size(), -1);
        kernels::Linear(x.data(), m, w.view, exact.data());
        kernels::LinearPacked(x.data(), m, *packed, got.data());
        kernels::Int8Rows quantized;
        kernels::QuantizeRowsInt8(x.data(), m, cols, quantized);
        const std::string where = std::string(DTypeName(dtype)) + " rows " + std::to_string(rows) +
                                  " cols " + std::to_string(cols) + " m " + std::to_string(m) +
                                  " " + kernels::Int8KernelName(kernel);
        EXPECT_LT(RelativeError(got, Int8Reference(*packed, quantized, m)), 1e-5) << where;
        // 7-bit weights and 8-bit activations: about 1% of the largest output here.
        EXPECT_LT(RelativeError(got, exact), 3e-2) << where;
        EXPECT_GT(RelativeError(got, exact), 0) << where;  // it is lossy: a real int8 path ran
      }
    }
  }
  kernels::LimitInt8Kernel(kernels::Int8Kernel::kAvx512Vnni);
}

// A row's bits do not depend on the rows beside it, nor on which kernel (AVX-512 VNNI, AVX2 or
// portable) ran. Tiles are up to 6 rows on AVX2 and 12 on AVX-512: m crosses both.
TEST(Int8ProductsTest, RowsAreTheSameBitsAtEveryBatchSizeAndOnEveryKernel) {
  OwnedMatrix w = RandomMatrix(DType::kF8E4M3, 90, 600, 21);
  auto packed = PackInt8(w.view);
  constexpr int64_t kRows = 41;
  auto x = RandomVector(static_cast<size_t>(kRows * 600), 9);
  std::vector<float> portable(static_cast<size_t>(kRows * 90));
  kernels::LimitInt8Kernel(kernels::Int8Kernel::kPortable);
  kernels::LinearPacked(x.data(), kRows, *packed, portable.data());
  for (kernels::Int8Kernel kernel : Int8KernelsHere()) {
    kernels::LimitInt8Kernel(kernel);
    std::vector<float> all(portable.size());
    kernels::LinearPacked(x.data(), kRows, *packed, all.data());
    EXPECT_EQ(std::memcmp(all.data(), portable.data(), all.size() * sizeof(float)), 0)
        << kernels::Int8KernelName(kernel);
    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 25}) {
      for (int64_t first : {int64_t{0}, kRows - m}) {
        std::vector<float> some(static_cast<size_t>(m * 90));
        kernels::LinearPacked(x.data() + first * 600, m, *packed, some.data());
        EXPECT_EQ(std::memcmp(some.data(), all.data() + first * 90, some.size() * sizeof(float)), 0)
            << kernels::Int8KernelName(kernel) << " m " << m << " first row " << first;
      }
    }
  }
  kernels::LimitInt8Kernel(kernels::Int8Kernel::kAvx512Vnni);
  // Where the CPU has AVX-512 VNNI, its kernel passed its own check and is the one in use.
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    EXPECT_EQ(kernels::BestInt8Kernel(), kernels::Int8Kernel::kAvx512Vnni);
  }
}

// A NaN in an activation or a weight reaches the outputs it feeds; other rows stay finite.
TEST(Int8ProductsTest, NonFiniteValuesShowInTheOutputs) {
  OwnedMatrix w = RandomMatrix(DType::kBF16, 20, 256, 4);
  const uint16_t nan = F32ToBF16(NAN);
  std::memcpy(&w.bytes[2 * (5 * 256 + 200)], &nan, 2);  // row 5, second group
  auto packed = PackInt8(w.view);
  auto x = RandomVector(2 * 256, 5);
  x[256 + 10] = INFINITY;  // activation row 1, first group
  std::vector<float> y(2 * 20);
  kernels::LinearPacked(x.data(), 2, *packed, y.data());
  for (int64_t o = 0; o < 20; ++o) {
    EXPECT_EQ(std::isnan(y[o]), o == 5) << "row 0, output " << o;
    EXPECT_TRUE(std::isnan(y[20 + o])) << "row 1, output " << o;
  }
}

TEST(Int8ProductsTest, GroupedExpertsStayCloseToTheExactReference) {
  const int64_t hidden = 132, width = 68, experts = 4;
  const std::vector<int64_t> counts = {3, 0, 9, 1};
  MoeWeights moe;
  std::vector<OwnedMatrix> storage;
  moe.experts.resize(experts);
  for (int64_t e = 0; e < experts; ++e)
    for (int part = 0; part < 3; ++part)
      storage.push_back(RandomMatrix(DType::kF8E4M3, part == 2 ? hidden : width,
                                     part == 2 ? width : hidden,
                                     static_cast<uint32_t>(40 + 3 * e + part), 16));
  for (int64_t e = 0; e < experts; ++e)
    moe.experts[e] = {storage[3 * e].view, storage[3 * e + 1].view, storage[3 * e + 2].view};
  const ExpertRouting routing = OneSlotRouting(counts);
  const int64_t rows = routing.tokens;
  auto x = RandomVector(static_cast<size_t>(rows * hidden), 6);
  for (float& v : x)
    v *= 0.1f;
  std::vector<float> expected(x.size(), 0), got(x.size(), 0), alone(x.size(), 0);
  RunExpertsReference(moe, routing, x.data(), hidden, expected.data());
  std::vector<kernels::ExpertPanels> panels(experts);
  std::vector<std::shared_ptr<const PackedMatrix>> keep;
  for (int64_t e = 0; e < experts; ++e) {
    for (Matrix* m :
         {&moe.experts[e].gate_proj, &moe.experts[e].up_proj, &moe.experts[e].down_proj})
      keep.push_back(PackInt8(*m));
    panels[e] = {keep[3 * e].get(), keep[3 * e + 1].get(), keep[3 * e + 2].get()};
  }
  kernels::GroupedExpertFfn(x.data(), routing.expert_offsets, panels, hidden, got.data());
  EXPECT_LT(RelativeError(got, expected), 5e-2);
  // Each row as it would come out alone: expert 2's last row on its own.
  const int64_t last = routing.expert_offsets[3] - 1;
  std::vector<int64_t> one = {0, 0, 0, 1, 1};
  std::vector<kernels::ExpertPanels> only(experts);
  only[2] = panels[2];
  kernels::GroupedExpertFfn(x.data() + last * hidden, one, only, hidden, alone.data());
  EXPECT_EQ(std::memcmp(alone.data(), got.data() + last * hidden, hidden * sizeof(float)), 0);
}

}  // namespace
}  // namespace sy

namespace sy {
namespace {

// The paged flash-decoding kernel against the reference absorbed attention, query lengths 1 and
// 2 on top of a cache whose length is not a multiple of the key chunk or the page. Latent 24
// and 40 take each width of the value accumulation (3, 2 and 1 vectors on the targets).
void CheckMlaDecodeAgainstDirectSums() {
  const int64_t heads = 5, rope = 6, page = 7;
  for (int64_t latent : {int64_t{24}, int64_t{40}})
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
      for (int64_t keys : {int64_t{1}, int64_t{33}, int64_t{70}}) {
        for (int64_t tokens : {int64_t{1}, int64_t{2}}) {
          if (tokens > keys) continue;
          const int64_t width = latent + rope;
          // Pages deliberately out of order in the pool; `rows` the values the cache holds.
          const testing::TestLatentCache cache = testing::MakeTestLatentCacheOf(
              RandomVector(static_cast<size_t>(keys * width), 11), width, page, dtype, latent);
          const std::vector<float>& rows = cache.rows;
          const kernels::LatentPages& view = cache.view;
          auto q_latent = RandomVector(static_cast<size_t>(tokens * heads * latent), 12);
          auto q_pe = RandomVector(static_cast<size_t>(tokens * heads * rope), 13);
          std::vector<int64_t> positions;
          for (int64_t t = 0; t < tokens; ++t)
            positions.push_back(keys - tokens + t);
          std::vector<float> got(static_cast<size_t>(tokens * heads * latent));
          kernels::MlaDecodeAttention(q_latent.data(), q_pe.data(), tokens, positions.data(), view,
                                      keys, heads, 0, 2, latent, rope, 0.3f, got.data());
          kernels::MlaDecodeAttention(q_latent.data(), q_pe.data(), tokens, positions.data(), view,
                                      keys, heads, 2, heads, latent, rope, 0.3f, got.data());
          // Reference: the absorbed form with an identity W_UK/W_UV (kv_b = [I; I] per head).
          const auto want = testing::AbsorbedAttentionReference(q_latent, q_pe, rows, positions,
                                                                heads, latent, rope, 0.3);
          for (size_t i = 0; i < want.size(); ++i)
            EXPECT_NEAR(got[i], want[i], 1e-4)
                << latent << " " << keys << " " << tokens << " at " << i;
        }
      }
    }
}

}  // namespace
}  // namespace sy

namespace sy {
namespace {

// The paged flash-decoding kernel on every SIMD target too.
TEST_P(PerTargetMla, MlaDecodeMatchesReferenceOverPages) {
  CheckMlaDecodeAgainstDirectSums();
}

// The expanded flash kernel over several kv_b super-blocks (many heads make them 64-256 keys), with
// queries whose groups straddle chunk ends: equal to the whole-sequence form, and each row the same
// bits computed alone, in another split of the slice, or behind a cached prefix — a request's
// answer must not depend on how its prompt was chunked or batched.
TEST_P(PerTargetMla, ExpandedAttentionRowsAreTheSameBitsHoweverTheSliceIsCut) {
  kernels::MlaDims d{40, 24, 8, 20, 32, 0.2f};
  const int64_t keys = 600, tokens = 37;
  const int64_t width = d.nope + d.rope;
  auto q = RandomVector(static_cast<size_t>(tokens * d.heads * width), 26);
  auto latents = RandomVector(static_cast<size_t>(keys * (d.latent + d.rope)), 27);
  OwnedMatrix kv_b = RandomMatrix(DType::kF8E4M3, d.heads * (d.nope + d.v), d.latent, 28, 8);
  std::vector<int64_t> positions;
  for (int64_t t = 0; t < tokens; ++t)  // a chunk on top of a cached prefix, one gap
    positions.push_back(keys - tokens - 5 + t + (t >= 20 ? 5 : 0));
  const size_t out_row = static_cast<size_t>(d.heads * d.v);
  std::vector<float> whole(tokens * out_row), tiled(whole.size());
  kernels::MlaAttendExpanded(q.data(), tokens, positions.data(), latents.data(), keys, kv_b.view, d,
                             whole.data());
  kernels::MlaAttendExpandedTiled(q.data(), tokens, positions.data(), latents.data(), keys,
                                  kv_b.view, d, tiled.data());
  for (size_t i = 0; i < whole.size(); ++i)
    ASSERT_NEAR(tiled[i], whole[i], 1e-4) << i;
  // Every row alone; and the slice cut at 3 and 22 (groups and blocks fall elsewhere). The
  // outputs need no initial values: NaN there before the calls.
  std::vector<float> part(tokens * out_row, std::numeric_limits<float>::quiet_NaN());
  for (int64_t t = 0; t < tokens; ++t)
    kernels::MlaAttendExpandedTiled(q.data() + t * d.heads * width, 1, positions.data() + t,
                                    latents.data(), keys, kv_b.view, d, part.data() + t * out_row);
  EXPECT_EQ(std::memcmp(part.data(), tiled.data(), part.size() * sizeof(float)), 0);
  std::fill(part.begin(), part.end(), std::numeric_limits<float>::quiet_NaN());
  for (auto [from, to] : {std::pair<int64_t, int64_t>{0, 3}, {3, 22}, {22, tokens}})
    kernels::MlaAttendExpandedTiled(q.data() + from * d.heads * width, to - from,
                                    positions.data() + from, latents.data(), keys, kv_b.view, d,
                                    part.data() + from * out_row);
  EXPECT_EQ(std::memcmp(part.data(), tiled.data(), part.size() * sizeof(float)), 0);
  // Fewer keys in the call (only those the slice sees) change nothing either.
  kernels::MlaAttendExpandedTiled(q.data(), 20, positions.data(), latents.data(), positions[19] + 1,
                                  kv_b.view, d, part.data());
  EXPECT_EQ(std::memcmp(part.data(), tiled.data(), 20 * out_row * sizeof(float)), 0);
}
// The absorbed kernel as prompts use it (model/mla.cc: items of a block of queries and a block
// of heads): each (query, head) row the same bits in one call for everything, or cut into other
// query and head blocks. Latent 43 takes the scalar tail of the value sums as well.
TEST_P(PerTargetMla, AbsorbedRowsAreTheSameBitsHoweverTheItemIsCut) {
  const int64_t heads = 11, latent = 43, rope = 6, page = 16, keys = 300, tokens = 37;
  const int64_t width = latent + rope, pages = (keys + page - 1) / page;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
    const testing::TestLatentCache cache = testing::MakeTestLatentCacheOf(
        RandomVector(static_cast<size_t>(pages * page * width), 41), width, page, dtype, latent);
    const kernels::LatentPages& view = cache.view;
    auto q_latent = RandomVector(static_cast<size_t>(tokens * heads * latent), 42);
    auto q_pe = RandomVector(static_cast<size_t>(tokens * heads * rope), 43);
    std::vector<int64_t> positions;
    for (int64_t t = 0; t < tokens; ++t)
      positions.push_back(keys - tokens + t);
    std::vector<float> whole(static_cast<size_t>(tokens * heads * latent)), cut(whole.size());
    kernels::MlaDecodeAttention(q_latent.data(), q_pe.data(), tokens, positions.data(), view, keys,
                                heads, 0, heads, latent, rope, 0.3f, whole.data());
    for (auto [t0, t1] : {std::pair<int64_t, int64_t>{0, 1}, {1, 9}, {9, 32}, {32, tokens}})
      for (auto [h0, h1] : {std::pair<int64_t, int64_t>{0, 3}, {3, 4}, {4, heads}})
        kernels::MlaDecodeAttention(q_latent.data() + t0 * heads * latent,
                                    q_pe.data() + t0 * heads * rope, t1 - t0, positions.data() + t0,
                                    view, positions[t1 - 1] + 1, heads, h0, h1, latent, rope, 0.3f,
                                    cut.data() + t0 * heads * latent);
    EXPECT_EQ(std::memcmp(whole.data(), cut.data(), whole.size() * sizeof(float)), 0)
        << DTypeName(dtype);
  }
}

// An fp8 cache gives the bits an f32 cache holding the same values gives: its rows are decoded
// exactly (kernels/cpu/latent_row.h). Two scale blocks, the second partial, over pages of 5.
TEST_P(PerTargetMla, AnFp8CacheGivesTheAnswersOfAnF32CacheHoldingItsValues) {
  const int64_t heads = 7, latent = 160, rope = 8, page = 5, keys = 300, tokens = 3;
  const int64_t width = latent + rope;
  const testing::TestLatentCache fp8 =
      testing::MakeTestLatentCache(keys, width, page, 21, DType::kF8E4M3, latent);
  const testing::TestLatentCache f32 =
      testing::MakeTestLatentCacheOf(fp8.rows, width, page, DType::kF32, latent);
  auto q_latent = RandomVector(static_cast<size_t>(tokens * heads * latent), 22);
  auto q_pe = RandomVector(static_cast<size_t>(tokens * heads * rope), 23);
  const std::vector<int64_t> positions = {keys - 3, keys - 2, keys - 1};
  std::vector<float> got(static_cast<size_t>(tokens * heads * latent)), want(got.size());
  kernels::MlaDecodeAttention(q_latent.data(), q_pe.data(), tokens, positions.data(), fp8.view,
                              keys, heads, 0, heads, latent, rope, 0.3f, got.data());
  kernels::MlaDecodeAttention(q_latent.data(), q_pe.data(), tokens, positions.data(), f32.view,
                              keys, heads, 0, heads, latent, rope, 0.3f, want.data());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(Targets, PerTargetMla, ::testing::ValuesIn(kernels::PanelGemmTargets()),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return std::string(kernels::TargetName(info.param));
                         });

// Split-K: few panels, long rows, decode-sized m — the columns are split over the threads. The
// result must not depend on the split (fp8 splits fall on scale-block boundaries).
TEST(FastKernelsTest, SplitKMatchesReference) {
  if (ThreadPool::Global().size() < 2) GTEST_SKIP() << "split-K needs two threads";
  for (DType dtype : {DType::kF8E4M3, DType::kBF16, DType::kF32}) {
    for (auto [rows, cols, m] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {20, 777, 1}, {17, 1030, 3}, {5, 2000, 2}}) {
      OwnedMatrix w = RandomMatrix(dtype, rows, cols, static_cast<uint32_t>(rows * 7 + cols), 128);
      auto packed = Pack(w.view);
      auto x = RandomVector(static_cast<size_t>(m * cols), 3);
      std::vector<float> expected(static_cast<size_t>(m * rows)), split(expected.size(), -1),
          whole(expected.size(), -1);
      kernels::Linear(x.data(), m, w.view, expected.data());
      kernels::LinearPacked(x.data(), m, *packed, split.data());
      kernels::SplitKEnabled() = false;
      kernels::LinearPacked(x.data(), m, *packed, whole.data());
      kernels::SplitKEnabled() = true;
      EXPECT_LT(RelativeError(split, expected), 1e-5)
          << DTypeName(dtype) << " " << rows << "x" << cols;
      EXPECT_LT(RelativeError(whole, expected), 1e-5)
          << DTypeName(dtype) << " " << rows << "x" << cols;
    }
  }
}

// The block a library matmul reads (DequantizePanels): every weight exactly as the reference
// product uses it (fp8 times its block scale, partial panels and scale blocks included), and the
// bf16 form that value rounded to nearest even.
TEST(OnednnLinearTest, DequantizedBlocksHoldEachWeight) {
  for (DType dtype : {DType::kF8E4M3, DType::kBF16, DType::kF32}) {
    const int64_t rows = 37, cols = 150;
    OwnedMatrix w = RandomMatrix(dtype, rows, cols, 21, 32);
    auto packed = Pack(w.view);
    // The reference's weights: x = identity gives y[c][r] = w[r][c], one term per sum.
    std::vector<float> identity(static_cast<size_t>(cols * cols), 0.0f);
    for (int64_t c = 0; c < cols; ++c)
      identity[static_cast<size_t>(c * cols + c)] = 1.0f;
    std::vector<float> want(static_cast<size_t>(cols * rows));
    kernels::Linear(identity.data(), cols, w.view, want.data());
    // Panels 1..2 (rows 16..36, the last partial) as a block of 21 columns.
    std::vector<float> got(static_cast<size_t>(cols * 21), -1.0f);
    std::vector<uint16_t> got_bf16(got.size());
    kernels::DequantizePanels(*packed, 1, 3, 16, got.data(), 21);
    kernels::DequantizePanels(*packed, 1, 3, 16, got_bf16.data(), 21);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t j = 0; j < 21; ++j) {
        const float expected = want[static_cast<size_t>(c * rows + 16 + j)];
        ASSERT_EQ(got[static_cast<size_t>(c * 21 + j)], expected)
            << DTypeName(dtype) << " row " << 16 + j << " col " << c;
        ASSERT_EQ(got_bf16[static_cast<size_t>(c * 21 + j)], F32ToBF16(expected))
            << DTypeName(dtype) << " row " << 16 + j << " col " << c;
      }
  }
}

// oneDNN's matmul on those blocks against the reference: a full 256-row block and a narrower last
// one, one row and many. bf16 rounding where oneDNN has a bf16 matmul; else its f32 matmul.
TEST(OnednnLinearTest, MatchesReferenceOnEveryWeightType) {
  // This binary keeps bf16_dot off (f32 products); where oneDNN has a bf16 matmul, both forms.
  for (bool bf16 : {false, true}) {
    if (bf16 && !kernels::OnednnHasBf16Matmul()) continue;
    kernels::GlobalKernelOptions().bf16_dot = bf16;
    ASSERT_EQ(kernels::OnednnRunsBf16(), bf16);
    const double tolerance = bf16 ? 2e-2 : 1e-5;
    for (DType dtype : {DType::kF8E4M3, DType::kBF16, DType::kF32}) {
      for (auto [rows, cols, m] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {300, 200, 3}, {16, 129, 1}, {513, 64, 260}}) {
        OwnedMatrix w = RandomMatrix(dtype, rows, cols, static_cast<uint32_t>(rows + 3 * cols));
        auto packed = Pack(w.view);
        auto x = RandomVector(static_cast<size_t>(m * cols), 5);
        std::vector<float> expected(static_cast<size_t>(m * rows)), got(expected.size(), -1);
        kernels::Linear(x.data(), m, w.view, expected.data());
        kernels::OnednnLinear(x.data(), m, *packed, got.data());
        EXPECT_LT(RelativeError(got, expected), tolerance)
            << DTypeName(dtype) << " " << rows << "x" << cols << " m " << m << " bf16 " << bf16;
      }
    }
  }
  kernels::GlobalKernelOptions().bf16_dot = false;
}

// LinearPacked follows --prefill-gemm from 256 rows on, never in a decode step, and measures a
// shape once.
TEST(OnednnLinearTest, PrefillChoiceIsFollowedAndMeasuredOncePerShape) {
  using kernels::PrefillGemm;
  kernels::GlobalKernelOptions().allow_bf16_gemm = true;  // as --prefill-gemm other than own
  const int64_t rows = 70, cols = 160, m = kernels::kOnednnMinRows;
  OwnedMatrix w = RandomMatrix(DType::kF8E4M3, rows, cols, 8);
  auto packed = Pack(w.view);
  auto x = RandomVector(static_cast<size_t>(m * cols), 6);
  std::vector<float> expected(static_cast<size_t>(m * rows)), own(expected.size()),
      onednn(expected.size()), step(expected.size());
  kernels::Linear(x.data(), m, w.view, expected.data());
  kernels::GlobalPrefillGemm() = PrefillGemm::kOwn;
  kernels::LinearPacked(x.data(), m, *packed, own.data());
  // Our own kernel for 256 rows rounds activations to bf16 where the CPU has AVX-512 BF16 (the
  // bf16 GEMM), else it is the f32 panel kernel; a decode step always takes the latter.
  const bool own_bf16 = std::string(kernels::KernelPathName(m, *packed)) == "avx512-bf16";
  std::vector<float> own_step(expected.size());
  {
    kernels::DecodeStepScope scope(true);
    kernels::LinearPacked(x.data(), m, *packed, own_step.data());
  }
  kernels::GlobalPrefillGemm() = PrefillGemm::kOnednn;
  kernels::LinearPacked(x.data(), m, *packed, onednn.data());
  {
    kernels::DecodeStepScope scope(true);
    kernels::LinearPacked(x.data(), m, *packed, step.data());
  }
  // bf16 activations: each rounded by at most 2^-9 of itself; 2e-2 of the largest output bounds
  // the sum's error for these 160-term products (as the bf16 tests above); f32: 1e-5.
  const double own_bound = own_bf16 ? 2e-2 : 1e-5;
  EXPECT_LT(RelativeError(own, expected), own_bound);
  EXPECT_LT(RelativeError(own_step, expected), 1e-5);
  EXPECT_LT(RelativeError(onednn, expected), 1e-5);  // f32: this binary keeps bf16_dot off
  EXPECT_EQ(std::memcmp(step.data(), own_step.data(), own.size() * sizeof(float)), 0)
      << "a decode step took oneDNN";
  // One row fewer than the threshold: ours, the same bits as kOwn.
  std::vector<float> below(static_cast<size_t>((m - 1) * rows)), below_own(below.size());
  kernels::LinearPacked(x.data(), m - 1, *packed, below.data());
  kernels::GlobalPrefillGemm() = PrefillGemm::kOwn;
  kernels::LinearPacked(x.data(), m - 1, *packed, below_own.data());
  EXPECT_EQ(std::memcmp(below.data(), below_own.data(), below.size() * sizeof(float)), 0);

  kernels::GlobalPrefillGemm() = PrefillGemm::kMeasure;
  const size_t before = kernels::PrefillGemmDecisions().size();
  std::vector<float> measured(expected.size(), -1);
  kernels::LinearPacked(x.data(), m, *packed, measured.data());
  const auto decisions = kernels::PrefillGemmDecisions();
  ASSERT_EQ(decisions.size(), before + 1);
  const auto found = std::find_if(decisions.begin(), decisions.end(), [&](const auto& d) {
    return d.rows == rows && d.cols == cols && d.dtype == "fp8";
  });
  ASSERT_NE(found, decisions.end());
  EXPECT_GT(found->own_seconds, 0);
  EXPECT_GT(found->onednn_seconds, 0);
  EXPECT_EQ(found->onednn, found->onednn_seconds < found->own_seconds);
  // The measuring call ends with ours; the next runs the chosen one (oneDNN: f32 here).
  EXPECT_LT(RelativeError(measured, expected), own_bound);
  kernels::LinearPacked(x.data(), m, *packed, measured.data());
  EXPECT_EQ(kernels::PrefillGemmDecisions().size(), before + 1);
  EXPECT_LT(RelativeError(measured, expected), found->onednn ? 1e-5 : own_bound);
  kernels::GlobalPrefillGemm() = PrefillGemm::kOwn;
  kernels::GlobalKernelOptions().allow_bf16_gemm = false;
}

}  // namespace
}  // namespace sy
