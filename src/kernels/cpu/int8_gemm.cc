#include "kernels/cpu/int8_gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sy::kernels {
namespace {

constexpr int kMaxTileRows = 6;      // 12 int32 accumulators + 2 weight vectors + broadcast + ones
constexpr int64_t kRangeGroups = 2;  // groups per column range: 4 KiB of a panel, kept in L1
bool force_portable = false;

// Rows split into near-equal tiles of at most kMaxTileRows (13 rows: 5 + 4 + 4, not 6 + 6 + 1).
template <typename Body>
void ForEachTile(int64_t m, Body body) {
  const int64_t tiles = (m + kMaxTileRows - 1) / kMaxTileRows;
  int64_t row = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t count = (m - row) / (tiles - t);
    body(row, count);
    row += count;
  }
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

// Software prefetch distance in each panel stream: 1 KiB (16 column quads) ahead.
constexpr int64_t kPrefetchBytes = 1024;

// The accumulators are named variables, not an array: GCC keeps an array of vectors on the
// stack here and spilled them in the loop.
#define SY_INT8_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

template <int R>
SY_INT8_TARGET void GroupAvx2(const uint8_t* x, int64_t x_stride, const float* xs,
                              int64_t xs_stride, const int8_t* w, int64_t quads,
                              const float* w_scale, const int32_t* w_offset, float* state) {
  static_assert(R >= 1 && R <= kMaxTileRows);
#define SY_DECLARE(k) __m256i acc##k##0 = _mm256_setzero_si256(), acc##k##1 = acc##k##0;
  SY_INT8_ROWS(SY_DECLARE)
#undef SY_DECLARE
  for (int64_t q = 0; q < quads; ++q) {
    const int8_t* wq = w + q * kPanelRows * kInt8QuadCols;
    _mm_prefetch(reinterpret_cast<const char*>(wq) + kPrefetchBytes, _MM_HINT_T0);
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
#undef SY_INT8_ROWS

void GroupFast(const uint8_t* x, int64_t x_stride, const float* xs, int64_t xs_stride,
               const int8_t* w, int64_t quads, const float* w_scale, const int32_t* w_offset,
               int64_t count, float* state) {
  switch (count) {
#define SY_INT8_CASE(R)                                                           \
  case R:                                                                         \
    GroupAvx2<R>(x, x_stride, xs, xs_stride, w, quads, w_scale, w_offset, state); \
    break;
    SY_INT8_CASE(1)
    SY_INT8_CASE(2)
    SY_INT8_CASE(3)
    SY_INT8_CASE(4)
    SY_INT8_CASE(5)
    SY_INT8_CASE(6)
#undef SY_INT8_CASE
    default:
      break;
  }
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

bool HasInt8Avx2() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && !force_portable;
#else
  return false;
#endif
}

void ForceInt8Portable(bool on) {
  force_portable = on;
}

void QuantizeRowsInt8(const float* x, int64_t m, int64_t cols, Int8Rows& out) {
  out.cols = cols;
  out.groups = (cols + kInt8GroupCols - 1) / kInt8GroupCols;
  out.codes.resize(static_cast<size_t>(m * cols));
  out.scales.resize(static_cast<size_t>(m * out.groups));
  const bool fast = HasInt8Avx2();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < out.groups; ++g) {
      const int64_t c0 = g * kInt8GroupCols, c1 = std::min(cols, c0 + kInt8GroupCols);
      const float* row = x + r * cols;
      uint8_t* codes = out.codes.data() + r * cols;
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

void Int8Panels(const uint8_t* codes, const float* scales, int64_t m, const PackedMatrix& w,
                int64_t panel_begin, int64_t panel_end, float* y) {
  if (m <= 0) return;
  thread_local std::vector<float> state;
  state.resize(static_cast<size_t>(m * kPanelRows));
  const bool fast = HasInt8Avx2();
  const int64_t per_panel = w.groups * kPanelRows;
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    std::fill(state.begin(), state.end(), 0.0f);
    const auto* panel = reinterpret_cast<const int8_t*>(w.Panel(p));
    const float* w_scale = w.row_scales.data() + p * per_panel;
    const int32_t* w_offset = w.row_offsets.data() + p * per_panel;
    for (int64_t g0 = 0; g0 < w.groups; g0 += kRangeGroups) {
      const int64_t g1 = std::min(w.groups, g0 + kRangeGroups);
      ForEachTile(m, [&](int64_t row, int64_t count) {
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t c0 = g * kInt8GroupCols;
          const int64_t quads = (std::min(w.cols, c0 + kInt8GroupCols) - c0) / kInt8QuadCols;
          const uint8_t* x = codes + row * w.cols + c0;
          const float* xs = scales + row * w.groups + g;
          const int8_t* wg = panel + c0 * kPanelRows;
          float* s = state.data() + row * kPanelRows;
#if defined(__x86_64__)
          if (fast) {
            GroupFast(x, w.cols, xs, w.groups, wg, quads, w_scale + g * kPanelRows,
                      w_offset + g * kPanelRows, count, s);
            continue;
          }
#endif
          GroupPortable(x, w.cols, xs, w.groups, wg, quads, w_scale + g * kPanelRows,
                        w_offset + g * kPanelRows, count, s);
        }
      });
    }
    const int64_t valid = std::min(kPanelRows, w.rows - p * kPanelRows);
    for (int64_t r = 0; r < m; ++r)
      std::copy_n(state.data() + r * kPanelRows, valid, y + r * w.rows + p * kPanelRows);
  }
}

}  // namespace sy::kernels
