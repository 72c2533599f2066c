#include "kernels/cpu/int8_gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/row_tiles.h"

namespace sy::kernels {
namespace {

// Rows per tile. AVX2: 12 int32 accumulators + 2 weight vectors + broadcast + temporary fill
// the 16 registers. AVX-512: one accumulator per row, the weights and a broadcast of 32.
constexpr int kMaxTileRows = 6;
constexpr int kMaxTileRowsVnni = 12;
constexpr int64_t kRangeGroups = 2;  // groups per column range: 4 KiB of a panel, kept in L1
constexpr int64_t kGroupQuads = kInt8GroupCols / kInt8QuadCols;

// The groups of a column range one tile kernel call walks (one call per range and tile, not per
// group: 1.6% fewer instructions at 4–8 rows in callgrind). The last group of a matrix may be
// short.
struct GroupRange {
  int64_t groups;
  int64_t last_quads;
};
Int8Kernel kernel_limit = Int8Kernel::kAvx512Vnni;

// Software prefetch in the panel stream. The first tile of a column range streams it from memory
// and prefetches 1 KiB (16 column quads) ahead; the later tiles read the range from L1, and
// prefetch the same place in the next range instead, so memory stays busy while they compute.
constexpr int64_t kPrefetchBytes = 1024;
constexpr int64_t kRangeBytes = kRangeGroups * kInt8GroupCols * kPanelRows;
int64_t PrefetchBytes(int64_t tile) {
  return tile == 0 ? kPrefetchBytes : kRangeBytes;
}

// Group g of panel p for `count` rows: the exact integer sums, then the group's term added to
// each row's state (16 floats per row). The reference for the AVX2 tile, bit for bit.
void GroupPortable(const uint8_t* x, int64_t x_stride, const float* xs, int64_t xs_stride,
                   const int8_t* w, int64_t quads, const float* w_scale, const int32_t* w_offset,
                   int64_t count, float* state) {
  for (int64_t r = 0; r < count; ++r) {
    int32_t sums[kPanelRows] = {};
    for (int64_t q = 0; q < quads; ++q)
      for (int64_t i = 0; i < kPanelRows; ++i)
        for (int64_t k = 0; k < kInt8QuadCols; ++k)
          sums[i] += static_cast<int32_t>(x[r * x_stride + q * kInt8QuadCols + k]) *
                     w[(q * kPanelRows + i) * kInt8QuadCols + k];
    for (int64_t i = 0; i < kPanelRows; ++i) {
      const float term = static_cast<float>(sums[i] - w_offset[i]) * w_scale[i];
      state[r * kPanelRows + i] = std::fma(term, xs[r * xs_stride], state[r * kPanelRows + i]);
    }
  }
}

#if defined(__x86_64__)
#define SY_INT8_TARGET __attribute__((target("avx2,fma")))

alignas(32) const int16_t kOnes[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

// The accumulators are named variables, not an array: GCC keeps an array of vectors on the
// stack here and spilled them in the loop.
#define SY_INT8_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

template <int R>
SY_INT8_TARGET void RangeAvx2(const uint8_t* x, int64_t x_stride, const float* xs,
                              int64_t xs_stride, const int8_t* w, const GroupRange& range,
                              const float* w_scale, const int32_t* w_offset, int64_t prefetch,
                              float* state) {
  static_assert(R >= 1 && R <= kMaxTileRows);
  for (int64_t g = 0; g < range.groups; ++g, x += kInt8GroupCols, ++xs,
               w += kInt8GroupCols * kPanelRows, w_scale += kPanelRows, w_offset += kPanelRows) {
    const int64_t quads = g + 1 == range.groups ? range.last_quads : kGroupQuads;
#define SY_DECLARE(k) __m256i acc##k##0 = _mm256_setzero_si256(), acc##k##1 = acc##k##0;
    SY_INT8_ROWS(SY_DECLARE)
#undef SY_DECLARE
    for (int64_t q = 0; q < quads; ++q) {
      const int8_t* wq = w + q * kPanelRows * kInt8QuadCols;
      _mm_prefetch(reinterpret_cast<const char*>(wq) + prefetch, _MM_HINT_T0);
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wq));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wq + 32));
      const uint8_t* xq = x + q * kInt8QuadCols;
// One row's step as one asm block: GCC otherwise issues every row's VPMADDUBSW first and needs
// a temporary per product, which spills accumulators to the stack in the loop. Here each row
// needs two accumulators, its broadcast and one temporary: 16 registers at six rows, the
// vector of ones read from memory.
#define SY_ROW(k)                                                                      \
  if constexpr (R > k) {                                                               \
    __m256i xb, t;                                                                     \
    asm("vpbroadcastd %[x], %[xb]\n\t"                                                 \
        "vpmaddubsw %[w0], %[xb], %[t]\n\t"                                            \
        "vpmaddwd %[ones], %[t], %[t]\n\t"                                             \
        "vpaddd %[t], %[a0], %[a0]\n\t"                                                \
        "vpmaddubsw %[w1], %[xb], %[t]\n\t"                                            \
        "vpmaddwd %[ones], %[t], %[t]\n\t"                                             \
        "vpaddd %[t], %[a1], %[a1]"                                                    \
        : [a0] "+x"(acc##k##0), [a1] "+x"(acc##k##1), [xb] "=&x"(xb), [t] "=&x"(t)     \
        : [x] "m"(*reinterpret_cast<const int32_t*>(xq + k * x_stride)), [w0] "x"(w0), \
          [w1] "x"(w1), [ones] "m"(kOnes));                                            \
  }
      SY_INT8_ROWS(SY_ROW)
#undef SY_ROW
    }
    const __m256 s0 = _mm256_loadu_ps(w_scale), s1 = _mm256_loadu_ps(w_scale + 8);
    const __m256i o0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w_offset));
    const __m256i o1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w_offset + 8));
#define SY_FLUSH(k)                                                                           \
  if constexpr (R > k) {                                                                      \
    const __m256 scale = _mm256_set1_ps(xs[k * xs_stride]);                                   \
    float* out = state + k * kPanelRows;                                                      \
    const __m256 t0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc##k##0, o0)), s0); \
    const __m256 t1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc##k##1, o1)), s1); \
    _mm256_storeu_ps(out, _mm256_fmadd_ps(t0, scale, _mm256_loadu_ps(out)));                  \
    _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(t1, scale, _mm256_loadu_ps(out + 8)));          \
  }
    SY_INT8_ROWS(SY_FLUSH)
#undef SY_FLUSH
  }
}
#undef SY_INT8_ROWS

// The tile kernel of `count` rows, 1 ≤ count ≤ kMax: kernel(std::integral_constant<int, R>{}).
template <int kMax, typename Kernel>
void WithRowCount(int64_t count, Kernel kernel) {
  [&]<int... R>(std::integer_sequence<int, R...>) {
    (void)((count == R + 1 ? (kernel(std::integral_constant<int, R + 1>{}), true) : false) || ...);
  }
  (std::make_integer_sequence<int, kMax>{});
}

void RangeFast(const uint8_t* x, int64_t x_stride, const float* xs, int64_t xs_stride,
               const int8_t* w, const GroupRange& range, const float* w_scale,
               const int32_t* w_offset, int64_t count, int64_t prefetch, float* state) {
  WithRowCount<kMaxTileRows>(count, [&](auto rows) {
    RangeAvx2<rows()>(x, x_stride, xs, xs_stride, w, range, w_scale, w_offset, prefetch, state);
  });
}

// AVX-512 VNNI: a quad's 16 rows × 4 columns of weights are one 64-byte vector, and VPDPBUSD
// adds the four products of each row with a row's broadcast activations into its int32 lane —
// the same exact sums as the AVX2 tile, one instruction per row step instead of six. The flush
// is the AVX2 one's arithmetic on 16 lanes at once, so the bits are the same. (Written on an
// AVX2-only machine: BestInt8Kernel checks it against the portable kernel before using it.)
#define SY_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define SY_VNNI_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

// int32 → f32, rounded to nearest as static_cast<float> does. (The masked form: GCC 12's
// _mm512_cvtepi32_ps warns about its own undefined pass-through vector.)
SY_VNNI_TARGET inline __m512 ToFloat(__m512i v) {
  return _mm512_maskz_cvtepi32_ps(static_cast<__mmask16>(0xffff), v);
}

template <int R>
SY_VNNI_TARGET void RangeVnni(const uint8_t* x, int64_t x_stride, const float* xs,
                              int64_t xs_stride, const int8_t* w, const GroupRange& range,
                              const float* w_scale, const int32_t* w_offset, int64_t prefetch,
                              float* state) {
  static_assert(R >= 1 && R <= kMaxTileRowsVnni);
  for (int64_t g = 0; g < range.groups; ++g, x += kInt8GroupCols, ++xs,
               w += kInt8GroupCols * kPanelRows, w_scale += kPanelRows, w_offset += kPanelRows) {
    const int64_t quads = g + 1 == range.groups ? range.last_quads : kGroupQuads;
#define SY_DECLARE(k) __m512i acc##k = _mm512_setzero_si512();
    SY_VNNI_ROWS(SY_DECLARE)
#undef SY_DECLARE
    for (int64_t q = 0; q < quads; ++q) {
      const int8_t* wq = w + q * kPanelRows * kInt8QuadCols;
      _mm_prefetch(reinterpret_cast<const char*>(wq) + prefetch, _MM_HINT_T0);
      const __m512i wv = _mm512_loadu_si512(wq);
      const uint8_t* xq = x + q * kInt8QuadCols;
// The step as asm, as on AVX2: through the intrinsic GCC copied each accumulator to a scratch
// register and back around every VPDPBUSD.
#define SY_ROW(k)                                                                      \
  if constexpr (R > k) {                                                               \
    __m512i xb;                                                                        \
    asm("vpbroadcastd %[x], %[xb]\n\t"                                                 \
        "vpdpbusd %[w], %[xb], %[a]"                                                   \
        : [a] "+v"(acc##k), [xb] "=&v"(xb)                                             \
        : [x] "m"(*reinterpret_cast<const int32_t*>(xq + k * x_stride)), [w] "v"(wv)); \
  }
      SY_VNNI_ROWS(SY_ROW)
#undef SY_ROW
    }
    const __m512 s = _mm512_loadu_ps(w_scale);
    const __m512i o = _mm512_loadu_si512(w_offset);
#define SY_FLUSH(k)                                                                                \
  if constexpr (R > k) {                                                                           \
    float* out = state + k * kPanelRows;                                                           \
    const __m512 t = _mm512_mul_ps(ToFloat(_mm512_sub_epi32(acc##k, o)), s);                       \
    _mm512_storeu_ps(out,                                                                          \
                     _mm512_fmadd_ps(t, _mm512_set1_ps(xs[k * xs_stride]), _mm512_loadu_ps(out))); \
  }
    SY_VNNI_ROWS(SY_FLUSH)
#undef SY_FLUSH
  }
}
#undef SY_VNNI_ROWS

void RangeVnniFast(const uint8_t* x, int64_t x_stride, const float* xs, int64_t xs_stride,
                   const int8_t* w, const GroupRange& range, const float* w_scale,
                   const int32_t* w_offset, int64_t count, int64_t prefetch, float* state) {
  WithRowCount<kMaxTileRowsVnni>(count, [&](auto rows) {
    RangeVnni<rows()>(x, x_stride, xs, xs_stride, w, range, w_scale, w_offset, prefetch, state);
  });
}

// A column range of two groups (the second short, as a matrix's last group may be) for every
// tile height, on fixed codes spanning the whole range (weights ±63, activations 1..255, so the
// int16 pairs of the AVX2 path would be at their largest): the VNNI kernel's state must equal
// the portable kernel's bit for bit.
bool VnniGivesThePortableBits() {
  constexpr int64_t kGroups = 2, kLastQuads = 8;
  constexpr int64_t kCols = kInt8GroupCols + kLastQuads * kInt8QuadCols;
  constexpr int64_t kStride = kCols + 64;
  std::vector<int8_t> w(static_cast<size_t>(kGroups * kInt8GroupCols * kPanelRows));
  std::vector<uint8_t> x(static_cast<size_t>(kMaxTileRowsVnni * kStride));
  std::vector<float> xs(kMaxTileRowsVnni * kGroups), w_scale(kGroups * kPanelRows);
  std::vector<int32_t> w_offset(kGroups * kPanelRows);
  uint32_t seed = 12345;
  auto next = [&] { return seed = seed * 1664525u + 1013904223u, seed >> 8; };
  for (auto& v : w)
    v = static_cast<int8_t>(static_cast<int>(next() % 127) - 63);
  for (auto& v : x)
    v = static_cast<uint8_t>(1 + next() % 255);
  for (auto& v : xs)
    v = static_cast<float>(next() % 1000 + 1) * 1e-4f;
  for (auto& v : w_scale)
    v = static_cast<float>(next() % 1000 + 1) * 1e-3f;
  for (auto& v : w_offset)
    v = static_cast<int32_t>(next() % 20000) - 10000;
  for (int64_t rows = 1; rows <= kMaxTileRowsVnni; ++rows) {
    std::vector<float> want(static_cast<size_t>(rows * kPanelRows), 0.25f), got(want);
    for (int64_t g = 0; g < kGroups; ++g)
      GroupPortable(x.data() + g * kInt8GroupCols, kStride, xs.data() + g, kGroups,
                    w.data() + g * kInt8GroupCols * kPanelRows,
                    g + 1 == kGroups ? kLastQuads : kGroupQuads, w_scale.data() + g * kPanelRows,
                    w_offset.data() + g * kPanelRows, rows, want.data());
    RangeVnniFast(x.data(), kStride, xs.data(), kGroups, w.data(), GroupRange{kGroups, kLastQuads},
                  w_scale.data(), w_offset.data(), rows, kPrefetchBytes, got.data());
    if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

// Codes for columns [0, count) of one row's group, count a multiple of 32: the portable loop's
// arithmetic exactly (same product, same half-away rounding, truncation), 32 at a time.
SY_INT8_TARGET void QuantizeGroupAvx2(const float* row, int64_t count, float inverse,
                                      uint8_t* codes) {
  const __m256 scale = _mm256_set1_ps(inverse), half = _mm256_set1_ps(0.5f),
               minus_half = _mm256_set1_ps(-0.5f), zero = _mm256_setzero_ps();
  const __m256i offset = _mm256_set1_epi32(128), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t c = 0; c < count; c += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(row + c + 8 * k), scale);
      const __m256 bias = _mm256_blendv_ps(minus_half, half, _mm256_cmp_ps(v, zero, _CMP_GE_OQ));
      q[k] = _mm256_add_epi32(_mm256_cvttps_epi32(_mm256_add_ps(v, bias)), offset);
    }
    const __m256i bytes =
        _mm256_packus_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + c),
                        _mm256_permutevar8x32_epi32(bytes, order));
  }
}

// max |x| over [0, count), count a multiple of 8; whether every value is finite.
SY_INT8_TARGET float LargestAvx2(const float* row, int64_t count, bool* finite) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 limit = _mm256_set1_ps(3.402823466e38f);
  __m256 largest = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int64_t c = 0; c < count; c += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(row + c), magnitude);
    largest = _mm256_max_ps(largest, a);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, limit, _CMP_NLE_UQ));  // inf, or NaN (unordered)
  }
  *finite = _mm256_movemask_ps(bad) == 0;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, largest);
  return *std::max_element(lanes, lanes + 8);
}
#endif

}  // namespace

Int8Kernel BestInt8Kernel() {
#if defined(__x86_64__)
  static const Int8Kernel best = [] {
    if (!CpuHasAvx2Fma()) return Int8Kernel::kPortable;
    if (!CpuHasAvx512Vnni()) return Int8Kernel::kAvx2;
    if (VnniGivesThePortableBits()) return Int8Kernel::kAvx512Vnni;
    std::fprintf(stderr,
                 "warning: the AVX-512 VNNI int8 kernel disagreed with the portable kernel on "
                 "its check; using the AVX2 kernel\n");
    return Int8Kernel::kAvx2;
  }();
  return best;
#else
  return Int8Kernel::kPortable;
#endif
}

Int8Kernel ActiveInt8Kernel() {
  const Int8Kernel level = IsaAllows(IsaLevel::kAvx512) ? Int8Kernel::kAvx512Vnni
                           : IsaAllows(IsaLevel::kAvx2) ? Int8Kernel::kAvx2
                                                        : Int8Kernel::kPortable;
  return std::min({BestInt8Kernel(), kernel_limit, level});
}

void LimitInt8Kernel(Int8Kernel kernel) {
  kernel_limit = kernel;
}

const char* Int8KernelName(Int8Kernel kernel) {
  switch (kernel) {
    case Int8Kernel::kAvx512Vnni:
      return "int8-avx512vnni";
    case Int8Kernel::kAvx2:
      return "int8-avx2";
    case Int8Kernel::kPortable:
      break;
  }
  return "int8";
}

namespace {

void QuantizeRowRange(const float* x, int64_t first, int64_t last, Int8Rows& out) {
  const int64_t cols = out.cols;
  const bool fast = ActiveInt8Kernel() >= Int8Kernel::kAvx2;
  for (int64_t r = first; r < last; ++r) {
    for (int64_t g = 0; g < out.groups; ++g) {
      const int64_t c0 = g * kInt8GroupCols, c1 = std::min(cols, c0 + kInt8GroupCols);
      const float* row = x + r * cols;
      uint8_t* codes = out.codes.data() + r * out.stride;
      float largest = 0;
      bool finite = true;
      int64_t c = c0;
#if defined(__x86_64__)
      if (fast) {
        c = c0 + (c1 - c0) / 8 * 8;
        largest = LargestAvx2(row + c0, c - c0, &finite);
      }
#endif
      for (; c < c1; ++c) {
        largest = std::max(largest, std::fabs(row[c]));
        finite = finite && std::isfinite(row[c]);
      }
      if (!finite) {  // the scale carries it: every output this group feeds is NaN
        std::fill(codes + c0, codes + c1, uint8_t{128});
        out.scales[r * out.groups + g] = NAN;
        continue;
      }
      const float inverse = largest > 0 ? 127.0f / largest : 0.0f;
      c = c0;
#if defined(__x86_64__)
      if (fast) {
        c = c0 + (c1 - c0) / 32 * 32;
        QuantizeGroupAvx2(row + c0, c - c0, inverse, codes + c0);
      }
#endif
      for (; c < c1; ++c) {
        // Round half away from zero (|v| ≤ 127 by construction).
        const float v = row[c] * inverse;
        codes[c] = static_cast<uint8_t>(static_cast<int>(v + (v >= 0 ? 0.5f : -0.5f)) + 128);
      }
      out.scales[r * out.groups + g] = largest / 127.0f;
    }
  }
}

}  // namespace

void QuantizeRowsInt8(const float* x, int64_t m, int64_t cols, Int8Rows& out) {
  constexpr int64_t kLine = 64;
  out.cols = cols;
  out.stride = (cols + kLine - 1) / kLine * kLine;
  if (out.stride / kLine % 2 == 0) out.stride += kLine;
  out.groups = (cols + kInt8GroupCols - 1) / kInt8GroupCols;
  out.codes.resize(static_cast<size_t>(m * out.stride));
  out.scales.resize(static_cast<size_t>(m * out.groups));
  // Rows are independent: batches spread them over the pool (on one thread they kept the other
  // waiting before every product), single rows stay on the caller.
  ThreadPool::Global().ParallelForIf(
      m > 1 && m * cols >= 8192, static_cast<size_t>(m), [&](size_t begin, size_t end) {
        QuantizeRowRange(x, static_cast<int64_t>(begin), static_cast<int64_t>(end), out);
      });
}

void Int8Panels(const uint8_t* codes, int64_t stride, const float* scales, int64_t m,
                const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, float* y) {
  if (m <= 0) return;
  if (UseAmxInt8(m, w)) {
    AmxInt8Panels(ActiveAmxBackend(), codes, stride, scales, m, w, panel_begin, panel_end, y);
    return;
  }
  Int8PanelsOn(ActiveInt8Kernel(), codes, stride, scales, m, w, panel_begin, panel_end, y);
}

void Int8PanelsOn(Int8Kernel kernel, const uint8_t* codes, int64_t stride, const float* scales,
                  int64_t m, const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
                  float* y) {
  if (m <= 0) return;
  thread_local std::vector<float> state;
  state.resize(static_cast<size_t>(m * kPanelRows));
  const int64_t max_rows = kernel == Int8Kernel::kAvx512Vnni ? kMaxTileRowsVnni : kMaxTileRows;
  const int64_t per_panel = w.groups * kPanelRows;
  // The tiles are the same for every panel and range: split the rows once.
  struct Tile {
    int64_t row, count;
  };
  thread_local std::vector<Tile> tiles;
  tiles.clear();
  ForEachRowTile(m, max_rows, [&](int64_t, int64_t row, int64_t count) {
    tiles.push_back({row, count});
  });
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    std::fill(state.begin(), state.end(), 0.0f);
    const auto* panel = reinterpret_cast<const int8_t*>(w.Panel(p));
    const float* w_scale = w.row_scales.data() + p * per_panel;
    const int32_t* w_offset = w.row_offsets.data() + p * per_panel;
    for (int64_t g0 = 0; g0 < w.groups; g0 += kRangeGroups) {
      const int64_t g1 = std::min(w.groups, g0 + kRangeGroups);
      const int64_t c0 = g0 * kInt8GroupCols;
      const GroupRange range{
          g1 - g0,
          (std::min(w.cols, g1 * kInt8GroupCols) - (g1 - 1) * kInt8GroupCols) / kInt8QuadCols};
      const int8_t* wg = panel + c0 * kPanelRows;
      const float* range_scale = w_scale + g0 * kPanelRows;
      const int32_t* range_offset = w_offset + g0 * kPanelRows;
      for (size_t tile = 0; tile < tiles.size(); ++tile) {
        const int64_t row = tiles[tile].row, count = tiles[tile].count;
        const uint8_t* x = codes + row * stride + c0;
        const float* xs = scales + row * w.groups + g0;
        float* s = state.data() + row * kPanelRows;
#if defined(__x86_64__)
        if (kernel == Int8Kernel::kAvx512Vnni) {
          RangeVnniFast(x, stride, xs, w.groups, wg, range, range_scale, range_offset, count,
                        PrefetchBytes(static_cast<int64_t>(tile)), s);
          continue;
        }
        if (kernel == Int8Kernel::kAvx2) {
          RangeFast(x, stride, xs, w.groups, wg, range, range_scale, range_offset, count,
                    PrefetchBytes(static_cast<int64_t>(tile)), s);
          continue;
        }
#endif
        for (int64_t g = 0; g < range.groups; ++g)
          GroupPortable(x + g * kInt8GroupCols, stride, xs + g, w.groups,
                        wg + g * kInt8GroupCols * kPanelRows,
                        g + 1 == range.groups ? range.last_quads : kGroupQuads,
                        range_scale + g * kPanelRows, range_offset + g * kPanelRows, count, s);
      }
    }
    const int64_t valid = std::min(kPanelRows, w.rows - p * kPanelRows);
    for (int64_t r = 0; r < m; ++r)
      std::copy_n(state.data() + r * kPanelRows, valid, y + r * w.rows + p * kPanelRows);
  }
}

}  // namespace sy::kernels
