#include "kernels/cpu/ggml_gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "base/thread_pool.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/ggml_quantize.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/row_tiles.h"
#include "tensor/ggml_quants.h"

namespace sy::kernels {
namespace {

GgmlKernel kernel_limit = GgmlKernel::kAvx512Vnni;

// Rows per tile of the VNNI kernel: per row a sub-block accumulator, a block one and (types with
// a separate dmin) the mins' (24 of the 32 registers at 8 rows), the rest for codes and
// broadcasts. Not tuned: the machine it was written on was shared while it was measured.
constexpr int kMaxTileRows = 8;
// Software prefetch distance in a panel stream (as the other kernels: 2 KiB).
constexpr int64_t kPrefetchBytes = 2048;

#if defined(__x86_64__)
// Prefetches the lines kPrefetchBytes ahead of a 16-column group of 4- or 6-bit codes (two or
// three 64-byte lines).
template <int Bits>
inline void PrefetchGroup(const uint8_t* group) {
  for (int line = 0; line < (Bits == 6 ? 3 : 2); ++line)
    _mm_prefetch(reinterpret_cast<const char*>(group + 64 * line + kPrefetchBytes), _MM_HINT_T0);
}
#endif

// A panel's blocks, sub-blocks per block, and where its scales start: sc and mn per sub-block and
// row (null where unit scales, mn also where d is shared), d and dmin per block and row.
struct PanelScales {
  int64_t blocks, per_block;
  const int8_t* sc;
  const int8_t* mn;
  const uint16_t* d;
  const uint16_t* dmin;
};
template <int SubCols, bool SharedD, bool Unit>
PanelScales PanelScalesOf(const PackedMatrix& w, int64_t panel) {
  const int64_t subs = w.cols / SubCols, blocks = w.cols / w.super_cols;
  return {blocks,
          w.super_cols / SubCols,
          Unit ? nullptr : w.sub_scales.data() + panel * subs * kPanelRows,
          Unit || SharedD ? nullptr : w.sub_mins.data() + panel * subs * kPanelRows,
          w.super_d.data() + panel * blocks * kPanelRows,
          SharedD ? nullptr : w.super_dmin.data() + panel * blocks * kPanelRows};
}

// Code c of row i of a panel, whatever the code width.
int CodeAt(const PackedMatrix& w, const uint8_t* codes, int64_t i, int64_t c) {
  if (w.code_bits == 8) return codes[((c / 4) * kPanelRows + i) * 4 + c % 4];
  const int64_t within = c % 8;
  int q = (codes[GgmlNibbleUnitOffset(w, c / 8) + i * 4 + within % 4] >> (within < 4 ? 0 : 4)) & 15;
  if (w.code_bits == 6)
    q |= ((codes[GgmlTopBitsOffset(c / 16) + i * 4 + c % 4] >> (2 * ((c % 16) / 4))) & 3) << 4;
  return q;
}

// The reference: one row, one panel, columns [0, w.cols); `state` the panel's 16 outputs.
void RowPortable(const int8_t* x, const float* xs, const int32_t* sums, const PackedMatrix& w,
                 int64_t panel, float* state) {
  const uint8_t* codes = w.Panel(panel);
  const int64_t subs = w.cols / w.sub_cols, blocks = w.cols / w.super_cols;
  const int64_t per_block = w.super_cols / w.sub_cols;
  for (int64_t b = 0; b < blocks; ++b) {
    int32_t a[kPanelRows] = {}, mins[kPanelRows] = {};
    for (int64_t j = b * per_block; j < (b + 1) * per_block; ++j) {
      int32_t s[kPanelRows] = {};
      for (int64_t c = j * w.sub_cols; c < (j + 1) * w.sub_cols; ++c)
        for (int64_t i = 0; i < kPanelRows; ++i)
          s[i] += CodeAt(w, codes, i, c) * x[c];
      const size_t at = static_cast<size_t>((panel * subs + j) * kPanelRows);
      for (int64_t i = 0; i < kPanelRows; ++i) {
        const int32_t sc = w.unit_scales ? 1 : w.sub_scales[at + i];
        if (w.shared_d) {
          a[i] += sc * (s[i] - sums[j]);
        } else {
          a[i] += sc * s[i];
          mins[i] += (w.unit_scales ? 1 : w.sub_mins[at + i]) * sums[j];
        }
      }
    }
    const size_t at = static_cast<size_t>((panel * blocks + b) * kPanelRows);
    for (int64_t i = 0; i < kPanelRows; ++i) {
      const float d = GgmlHalfToF32(w.super_d[at + i]);
      float t;
      if (w.shared_d) {
        t = d * static_cast<float>(a[i]);
      } else {
        const float dmin = GgmlHalfToF32(w.super_dmin[at + i]);
        t = std::fma(d, static_cast<float>(a[i]), -(dmin * static_cast<float>(mins[i])));
      }
      state[i] = std::fma(t, xs[b], state[i]);
    }
  }
}

#if defined(__x86_64__)
#define SY_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))

// Every lane. (The masked forms below: GCC 12's unmasked ones warn about their own undefined
// pass-through vectors.)
constexpr __mmask16 kAll = 0xffff;

// int32 → f32, rounded to nearest as static_cast<float> does.
SY_VNNI_TARGET inline __m512 ToFloat(__m512i v) {
  return _mm512_maskz_cvtepi32_ps(static_cast<__mmask16>(0xffff), v);
}

// Adds one 4-column quad of codes (a vector of 16 rows × 4 bytes) times each row's broadcast
// activations to s.
template <int R>
SY_VNNI_TARGET inline void Quad(__m512i codes, const int8_t* x, int64_t x_stride, int64_t c,
                                __m512i* s) {
  for (int r = 0; r < R; ++r) {
    int32_t xq;
    std::memcpy(&xq, x + r * x_stride + c, 4);
    s[r] = _mm512_dpbusd_epi32(s[r], codes, _mm512_set1_epi32(xq));
  }
}

template <int R, int Bits, int SubCols, bool SharedD, bool Unit>
SY_VNNI_TARGET void TileVnni(const int8_t* x, int64_t x_stride, const float* xs, int64_t xs_stride,
                             const int32_t* sums, int64_t sums_stride, const PackedMatrix& w,
                             int64_t panel, float* state) {
  const uint8_t* codes = w.Panel(panel);
  // 16 columns' codes: 128 bytes of low nibbles, then (Bits == 6) 64 of top bits.
  constexpr int64_t kGroupBytes = Bits == 6 ? 192 : 128;
  const auto [blocks, per_block, sc_base, mn_base, d_base, dmin_base] =
      PanelScalesOf<SubCols, SharedD, Unit>(w, panel);
  const __m512i nibble = _mm512_set1_epi8(0x0f), top = _mm512_set1_epi8(0x30);
  __m512 out[R];
  for (int r = 0; r < R; ++r)
    out[r] = _mm512_loadu_ps(state + r * kPanelRows);
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i a[R], mins[R];
    for (int r = 0; r < R; ++r)
      a[r] = mins[r] = _mm512_setzero_si512();
    for (int64_t j = b * per_block; j < (b + 1) * per_block; ++j) {
      // Shared d: the sums start at −offset · X_j, so they end as Σ (q − offset) · xq.
      __m512i s[R];
      for (int r = 0; r < R; ++r)
        s[r] = SharedD ? _mm512_set1_epi32(-sums[r * sums_stride + j]) : _mm512_setzero_si512();
      const int64_t c0 = j * SubCols;
      if constexpr (Bits == 8) {
        for (int64_t c = c0; c < c0 + SubCols; c += 4) {
          _mm_prefetch(reinterpret_cast<const char*>(codes + (c / 4) * 64 + kPrefetchBytes),
                       _MM_HINT_T0);
          Quad<R>(_mm512_loadu_si512(codes + (c / 4) * 64), x, x_stride, c, s);
        }
      } else {
        for (int64_t c = c0; c < c0 + SubCols; c += 16) {
          const uint8_t* group = codes + (c / 16) * kGroupBytes;
          // One line ahead per line read: the panels of a thread's share are contiguous, so
          // this runs into the next panel as one stream.
          PrefetchGroup<Bits>(group);
          const __m512i v0 = _mm512_loadu_si512(group);
          const __m512i v1 = _mm512_loadu_si512(group + 64);
          __m512i q0 = _mm512_and_si512(v0, nibble);
          __m512i q1 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), nibble);
          __m512i q2 = _mm512_and_si512(v1, nibble);
          __m512i q3 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), nibble);
          if constexpr (Bits == 6) {
            const __m512i h = _mm512_loadu_si512(group + 128);
            q0 = _mm512_or_si512(q0, _mm512_and_si512(_mm512_slli_epi16(h, 4), top));
            q1 = _mm512_or_si512(q1, _mm512_and_si512(_mm512_slli_epi16(h, 2), top));
            q2 = _mm512_or_si512(q2, _mm512_and_si512(h, top));
            q3 = _mm512_or_si512(q3, _mm512_and_si512(_mm512_srli_epi16(h, 2), top));
          }
          Quad<R>(q0, x, x_stride, c, s);
          Quad<R>(q1, x, x_stride, c + 4, s);
          Quad<R>(q2, x, x_stride, c + 8, s);
          Quad<R>(q3, x, x_stride, c + 12, s);
        }
      }
      if constexpr (Unit) {
        for (int r = 0; r < R; ++r) {
          a[r] = _mm512_add_epi32(a[r], s[r]);
          if constexpr (!SharedD)
            mins[r] = _mm512_add_epi32(mins[r], _mm512_set1_epi32(sums[r * sums_stride + j]));
        }
      } else {
        const __m512i sc = _mm512_maskz_cvtepi8_epi32(
            kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc_base + j * kPanelRows)));
        for (int r = 0; r < R; ++r)
          a[r] = _mm512_add_epi32(a[r], _mm512_mullo_epi32(s[r], sc));
        if constexpr (!SharedD) {
          const __m512i mn = _mm512_maskz_cvtepi8_epi32(
              kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(mn_base + j * kPanelRows)));
          for (int r = 0; r < R; ++r)
            mins[r] = _mm512_add_epi32(
                mins[r], _mm512_mullo_epi32(mn, _mm512_set1_epi32(sums[r * sums_stride + j])));
        }
      }
    }
    const __m512 d = _mm512_maskz_cvtph_ps(
        kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d_base + b * kPanelRows)));
    if constexpr (SharedD) {
      for (int r = 0; r < R; ++r) {
        const __m512 t = _mm512_mul_ps(d, ToFloat(a[r]));
        out[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(xs[r * xs_stride + b]), out[r]);
      }
    } else {
      const __m512 dmin = _mm512_maskz_cvtph_ps(
          kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dmin_base + b * kPanelRows)));
      for (int r = 0; r < R; ++r) {
        const __m512 t = _mm512_fmsub_ps(d, ToFloat(a[r]), _mm512_mul_ps(dmin, ToFloat(mins[r])));
        out[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(xs[r * xs_stride + b]), out[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(state + r * kPanelRows, out[r]);
}

template <int Bits, int SubCols, bool SharedD, bool Unit>
void TileVnniRows(int64_t count, const int8_t* x, int64_t x_stride, const float* xs,
                  int64_t xs_stride, const int32_t* sums, int64_t sums_stride,
                  const PackedMatrix& w, int64_t panel, float* state) {
  [&]<int... R>(std::integer_sequence<int, R...>) {
    (void)((count == R + 1 ? (TileVnni<R + 1, Bits, SubCols, SharedD, Unit>(
                                  x, x_stride, xs, xs_stride, sums, sums_stride, w, panel, state),
                              true)
                           : false) ||
           ...);
  }
  (std::make_integer_sequence<int, kMaxTileRows>{});
}

// AVX2: the same integers through VPMADDUBSW (unsigned codes × signed activations, pairs in
// int16) and VPMADDWD by ones, a ymm per 8-row half of a panel (8 rows × 4 columns). Codes of at
// most 63 keep a pair within int16 (2 · 63 · 127); Q8_0's bytes take the sign trick instead
// (|q − 128| × x with q − 128's sign: 2 · 128 · 127), which sums Σ (q − 128) · x directly.
#define SY_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
constexpr int kMaxTileRowsAvx2 = 4;  // rows per tile of TileAvx2Lanes and TileAvx2Bytes

// One activation quad (4 bytes at xq) times both halves' codes (c0: rows 0-7, c1: rows 8-15),
// added to s0 and s1, the broadcast shared.
template <int Bits>
SY_AVX2_TARGET inline void QuadBothHalvesAvx2(__m256i c0, __m256i c1, const int8_t* xq, __m256i& s0,
                                              __m256i& s1) {
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(static_cast<char>(0x80));
  int32_t quad;
  std::memcpy(&quad, xq, 4);
  const __m256i xb = _mm256_set1_epi32(quad);
  if constexpr (Bits == 8) {
    const __m256i q0 = _mm256_xor_si256(c0, flip), q1 = _mm256_xor_si256(c1, flip);
    s0 = _mm256_add_epi32(
        s0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q0), _mm256_sign_epi8(xb, q0)),
                              ones));
    s1 = _mm256_add_epi32(
        s1, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q1), _mm256_sign_epi8(xb, q1)),
                              ones));
  } else {
    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(c0, xb), ones));
    s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(c1, xb), ones));
  }
}

// One activation row (several take TileAvx2Lanes or TileAvx2Bytes, below) against both 8-row
// halves of a panel (a ymm holds 8 rows × 4 columns) in one pass: each line of codes read once,
// each activation quad broadcast once for both halves, the sub-block scales widened together.
// Two passes, one per half, spent as much on that as on the products (bench kernels --max-isa
// avx2: 13-17 GB/s at m = 2 where this streamed 26-34). The row waits on memory here, and
// TileAvx2Lanes took 0.98-0.998x this kernel's time for Q4_K and 1.03-1.13x for Q6_K (paired
// A/B, one thread, AMD Zen 3).
template <int Bits, int SubCols, bool SharedD, bool Unit>
SY_AVX2_TARGET void TileAvx2(const int8_t* x, const float* xs, const int32_t* sums,
                             const PackedMatrix& w, int64_t panel, float* state) {
  constexpr int R = 1;  // the arrays below keep a row index, as the other tiles' do
  constexpr int64_t x_stride = 0, xs_stride = 0, sums_stride = 0;
  const uint8_t* codes = w.Panel(panel);
  constexpr int64_t kGroupBytes = Bits == 6 ? 192 : 128;
  const auto [blocks, per_block, sc_base, mn_base, d_base, dmin_base] =
      PanelScalesOf<SubCols, SharedD, Unit>(w, panel);
  const __m256i nibble = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi8(0x30);
  __m256 out[R][2];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h)
      out[r][h] = _mm256_loadu_ps(state + r * kPanelRows + 8 * h);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i a[R][2], mins[R][2];
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h)
        a[r][h] = mins[r][h] = _mm256_setzero_si256();
    for (int64_t j = b * per_block; j < (b + 1) * per_block; ++j) {
      __m256i s[R][2];
      for (int r = 0; r < R; ++r)
        s[r][0] = s[r][1] = SharedD && Bits != 8 ? _mm256_set1_epi32(-sums[r * sums_stride + j])
                                                 : _mm256_setzero_si256();
      const int64_t c0 = j * SubCols;
      if constexpr (Bits == 8) {
        for (int64_t c = c0; c < c0 + SubCols; c += 4) {
          const uint8_t* line = codes + (c / 4) * 64;
          _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetchBytes), _MM_HINT_T0);
          const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line));
          const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32));
          for (int r = 0; r < R; ++r)
            QuadBothHalvesAvx2<Bits>(q0, q1, x + r * x_stride + c, s[r][0], s[r][1]);
        }
      } else {
        for (int64_t c = c0; c < c0 + SubCols; c += 16) {
          const uint8_t* group = codes + (c / 16) * kGroupBytes;
          PrefetchGroup<Bits>(group);
          // Half h of a 64-byte unit is its rows 8h..8h+7.
          __m256i q[2][4];
          for (int h = 0; h < 2; ++h) {
            const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32 * h));
            const __m256i v1 =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 64 + 32 * h));
            q[h][0] = _mm256_and_si256(v0, nibble);
            q[h][1] = _mm256_and_si256(_mm256_srli_epi16(v0, 4), nibble);
            q[h][2] = _mm256_and_si256(v1, nibble);
            q[h][3] = _mm256_and_si256(_mm256_srli_epi16(v1, 4), nibble);
            if constexpr (Bits == 6) {
              const __m256i t =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 128 + 32 * h));
              q[h][0] = _mm256_or_si256(q[h][0], _mm256_and_si256(_mm256_slli_epi16(t, 4), top));
              q[h][1] = _mm256_or_si256(q[h][1], _mm256_and_si256(_mm256_slli_epi16(t, 2), top));
              q[h][2] = _mm256_or_si256(q[h][2], _mm256_and_si256(t, top));
              q[h][3] = _mm256_or_si256(q[h][3], _mm256_and_si256(_mm256_srli_epi16(t, 2), top));
            }
          }
          for (int k = 0; k < 4; ++k)
            QuadBothHalvesAvx2<Bits>(q[0][k], q[1][k], x + c + 4 * k, s[0][0], s[0][1]);
        }
      }
      if constexpr (Unit) {
        for (int r = 0; r < R; ++r) {
          const __m256i x_sum = _mm256_set1_epi32(sums[r * sums_stride + j]);
          for (int h = 0; h < 2; ++h) {
            a[r][h] = _mm256_add_epi32(a[r][h], s[r][h]);
            if constexpr (!SharedD) mins[r][h] = _mm256_add_epi32(mins[r][h], x_sum);
          }
        }
      } else {
        const __m128i sc_bytes =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc_base + j * kPanelRows));
        const __m256i sc[2] = {_mm256_cvtepi8_epi32(sc_bytes),
                               _mm256_cvtepi8_epi32(_mm_srli_si128(sc_bytes, 8))};
        for (int r = 0; r < R; ++r)
          for (int h = 0; h < 2; ++h)
            a[r][h] = _mm256_add_epi32(a[r][h], _mm256_mullo_epi32(s[r][h], sc[h]));
        if constexpr (!SharedD) {
          const __m128i mn_bytes =
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(mn_base + j * kPanelRows));
          const __m256i mn[2] = {_mm256_cvtepi8_epi32(mn_bytes),
                                 _mm256_cvtepi8_epi32(_mm_srli_si128(mn_bytes, 8))};
          for (int r = 0; r < R; ++r) {
            const __m256i x_sum = _mm256_set1_epi32(sums[r * sums_stride + j]);
            for (int h = 0; h < 2; ++h)
              mins[r][h] = _mm256_add_epi32(mins[r][h], _mm256_mullo_epi32(mn[h], x_sum));
          }
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 d = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(d_base + b * kPanelRows + 8 * h)));
      if constexpr (SharedD) {
        for (int r = 0; r < R; ++r)
          out[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(a[r][h])),
                                      _mm256_set1_ps(xs[r * xs_stride + b]), out[r][h]);
      } else {
        const __m256 dmin = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(dmin_base + b * kPanelRows + 8 * h)));
        for (int r = 0; r < R; ++r)
          out[r][h] =
              _mm256_fmadd_ps(_mm256_fmsub_ps(d, _mm256_cvtepi32_ps(a[r][h]),
                                              _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mins[r][h]))),
                              _mm256_set1_ps(xs[r * xs_stride + b]), out[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_ps(state + r * kPanelRows + 8 * h, out[r][h]);
}

// Several activation rows against 4- or 6-bit codes: the same integers as TileAvx2 in a form
// that fits AVX2's sixteen registers. TileAvx2 at R = 4 holds every code of a 16-column group,
// an int32 sub-block sum, a block sum and a mins sum per row and half: twice the registers there
// are, so its accumulators lived on the stack in the inner loop (perf: 70% of a 32-sequence
// Q4_K_M decode step is these tiles). Here the inner loop holds an int16 sum per row and half,
// one quad of codes and one broadcast:
//  - the VPMADDUBSW pairs add up in int16 over kFlush columns, as many as keep a lane (kFlush / 2
//    products of a code ≤ MaxCode and an activation |x| ≤ 127) within 32767: 32 columns of
//    4-bit codes (30480), 16 of 5-bit (31496), 8 of 6-bit (32004);
//  - VPMADDWD by the sub-block scale, as int16 pairs, widens them and applies sc in one step;
//  - the corrections that do not depend on the codes (mn · X for a separate dmin, sc · off · X
//    for a shared d's offset) are summed once per block after the codes.
// Every sum is an exact integer, so a block's a and mins, and the floats made from them, are the
// same bits as TileAvx2's and the other kernels'. Decode of the bench model's Q4_K_M file at 32
// sequences: 1.10-1.12x TileAvx2's tok/s (paired in one process, AMD Zen 3).
constexpr int kMinLaneRows = 2;  // fewer rows take TileAvx2 (one row waits on memory anyway)

// Columns (4, 8, 16 or 32) whose VPMADDUBSW results one int16 lane holds: each adds a pair of
// products, at most 2 · 127 · max_code.
constexpr int64_t LaneFlushCols(int max_code) {
  const int64_t quads = 32767 / (2 * 127 * max_code);
  int64_t cols = 4;
  while (cols * 2 <= quads * 4 && cols < 32)
    cols *= 2;
  return cols;
}

// An empty asm that takes and gives v in a vector register. Without it GCC re-associates a
// row's sums (s += p0; s += p1; ... as s + (p0 + p1 + ...)), computes every product before
// adding any and spills them to the stack; with it each one is added as it is made.
SY_AVX2_TARGET inline void InRegister(__m256i& v) {
  asm("" : "+x"(v));
}

// sc of rows 8h..8h+7 as int16 pairs (sc_r, sc_r): VPMADDWD's factor for a row's two lanes.
SY_AVX2_TARGET inline __m256i ScalePairs(const int8_t* sc) {
  int64_t bytes;
  std::memcpy(&bytes, sc, 8);
  const __m256i v = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes));
  return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(v, 16));
}

// a += s · factor (a sub-block's ScalePairs, half by half).
template <int R>
SY_AVX2_TARGET inline void FlushLanes(__m256i (&a)[R][2], const __m256i (&s)[R][2],
                                      const __m256i (&factor)[2]) {
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < R; ++r)
      a[r][h] = _mm256_add_epi32(a[r][h], _mm256_madd_epi16(s[r][h], factor[h]));
}

template <int R, int Bits, int SubCols, bool SharedD, bool Unit, int MaxCode>
SY_AVX2_TARGET void TileAvx2Lanes(const int8_t* x, int64_t x_stride, const float* xs,
                                  int64_t xs_stride, const int32_t* sums, int64_t sums_stride,
                                  const PackedMatrix& w, int64_t panel, float* state) {
  constexpr int64_t kFlush = std::min<int64_t>(SubCols, LaneFlushCols(MaxCode));
  static_assert(Bits == 4 || Bits == 6);
  static_assert(SubCols % std::max<int64_t>(kFlush, 16) == 0 &&
                (kFlush % 16 == 0 || 16 % kFlush == 0));
  constexpr int64_t kGroupBytes = Bits == 6 ? 192 : 128;
  const uint8_t* codes = w.Panel(panel);
  const auto [blocks, per_block, sc_base, mn_base, d_base, dmin_base] =
      PanelScalesOf<SubCols, SharedD, Unit>(w, panel);
  const __m256i nibble = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi8(0x30);
  // Sums of kFlush columns scaled into a: after each chunk of 16 or more, or (6-bit codes,
  // kFlush 8) after each half of a 16-column group.
  constexpr int64_t kChunk = std::max<int64_t>(kFlush, 16);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i a[R][2];
    for (int r = 0; r < R; ++r)
      a[r][0] = a[r][1] = _mm256_setzero_si256();
    for (int64_t c0 = b * w.super_cols; c0 < (b + 1) * w.super_cols; c0 += kChunk) {
      __m256i s[R][2];  // set by each flush span's first quad (an add to zero is not folded)
      // A chunk lies in one sub-block (kChunk divides SubCols): one scale per row.
      __m256i factor[2];
      for (int h = 0; h < 2; ++h)
        factor[h] =
            Unit ? _mm256_set1_epi16(1) : ScalePairs(sc_base + (c0 / SubCols) * kPanelRows + 8 * h);
#pragma GCC unroll 2
      for (int g = 0; g < kChunk / 16; ++g) {
        const int64_t c = c0 + 16 * g;
        // Quad k: columns c + 4k..c + 4k + 3, the low (k even) or high nibbles of unit k / 2
        // (and bits 2k, 2k + 1 of the top-bit unit); half h of a unit is its rows 8h..8h+7.
        const uint8_t* group = codes + (c / 16) * kGroupBytes;
        PrefetchGroup<Bits>(group);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          __m256i q[2];
          for (int h = 0; h < 2; ++h) {
            const __m256i v =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + (k / 2) * 64 + 32 * h));
            q[h] = _mm256_and_si256(k % 2 ? _mm256_srli_epi16(v, 4) : v, nibble);
            if constexpr (Bits == 6) {
              const __m256i t =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 128 + 32 * h));
              const __m256i shifted = k == 0   ? _mm256_slli_epi16(t, 4)
                                      : k == 1 ? _mm256_slli_epi16(t, 2)
                                      : k == 2 ? t
                                               : _mm256_srli_epi16(t, 2);
              q[h] = _mm256_or_si256(q[h], _mm256_and_si256(shifted, top));
            }
          }
          for (int r = 0; r < R; ++r) {
            int32_t quad;
            std::memcpy(&quad, x + r * x_stride + c + 4 * k, 4);
            const __m256i xb = _mm256_set1_epi32(quad);
            for (int h = 0; h < 2; ++h) {
              const __m256i p = _mm256_maddubs_epi16(q[h], xb);
              s[r][h] = (16 * g + 4 * k) % kFlush == 0 ? p : _mm256_add_epi16(s[r][h], p);
            }
            InRegister(s[r][0]);
            InRegister(s[r][1]);
          }
          if (kFlush < 16 && k == 1) FlushLanes<R>(a, s, factor);
        }
      }
      FlushLanes<R>(a, s, factor);
    }
    // The corrections: Σ_j sc_j · sums_j off a (shared d), Σ_j mn_j · sums_j into mins.
    __m256i mins[R][2];
    for (int r = 0; r < R; ++r)
      mins[r][0] = mins[r][1] = _mm256_setzero_si256();
    for (int64_t j = b * per_block; j < (b + 1) * per_block; ++j) {
      __m256i f[2];
      if constexpr (!Unit) {
        const __m128i bytes = _mm_loadu_si128(
            reinterpret_cast<const __m128i*>((SharedD ? sc_base : mn_base) + j * kPanelRows));
        f[0] = _mm256_cvtepi8_epi32(bytes);
        f[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8));
      }
      for (int r = 0; r < R; ++r) {
        const __m256i x_sum = _mm256_set1_epi32(sums[r * sums_stride + j]);
        for (int h = 0; h < 2; ++h) {
          const __m256i t = Unit ? x_sum : _mm256_mullo_epi32(f[h], x_sum);
          if constexpr (SharedD)
            a[r][h] = _mm256_sub_epi32(a[r][h], t);
          else
            mins[r][h] = _mm256_add_epi32(mins[r][h], t);
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 d = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(d_base + b * kPanelRows + 8 * h)));
      __m256 dmin = _mm256_setzero_ps();
      if constexpr (!SharedD)
        dmin = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(dmin_base + b * kPanelRows + 8 * h)));
      for (int r = 0; r < R; ++r) {
        float* out = state + r * kPanelRows + 8 * h;
        const __m256 t = SharedD
                             ? _mm256_mul_ps(d, _mm256_cvtepi32_ps(a[r][h]))
                             : _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(a[r][h]),
                                               _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mins[r][h])));
        _mm256_storeu_ps(
            out, _mm256_fmadd_ps(t, _mm256_set1_ps(xs[r * xs_stride + b]), _mm256_loadu_ps(out)));
      }
    }
  }
}

// Several activation rows against Q8_0's bytes (one sub-block per block, unit scales, shared d):
// |q − 128| times the activations with q − 128's sign, each quad's pairs widened by VPMADDWD
// straight into the block's int32 sum (a pair reaches 2 · 128 · 127, so none add up in int16).
// Only those sums stay in registers; the outputs are read and written once per block. Decode of
// the bench model's Q8_0 file at 32 sequences: 1.06-1.09x TileAvx2's (paired, AMD Zen 3).
template <int R>
SY_AVX2_TARGET void TileAvx2Bytes(const int8_t* x, int64_t x_stride, const float* xs,
                                  int64_t xs_stride, const PackedMatrix& w, int64_t panel,
                                  float* state) {
  const uint8_t* codes = w.Panel(panel);
  const int64_t blocks = w.cols / w.super_cols;
  const uint16_t* d_base = w.super_d.data() + panel * blocks * kPanelRows;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i a[R][2];
    for (int r = 0; r < R; ++r)
      a[r][0] = a[r][1] = _mm256_setzero_si256();
    for (int64_t c = b * w.super_cols; c < (b + 1) * w.super_cols; c += 4) {
      const uint8_t* line = codes + (c / 4) * 64;
      _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetchBytes), _MM_HINT_T0);
      __m256i sign[2], magnitude[2];
      for (int h = 0; h < 2; ++h) {
        sign[h] = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32 * h)), flip);
        magnitude[h] = _mm256_abs_epi8(sign[h]);
      }
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        std::memcpy(&quad, x + r * x_stride + c, 4);
        const __m256i xb = _mm256_set1_epi32(quad);
        for (int h = 0; h < 2; ++h) {
          a[r][h] = _mm256_add_epi32(
              a[r][h],
              _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude[h], _mm256_sign_epi8(xb, sign[h])),
                                ones));
          InRegister(a[r][h]);
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 d = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(d_base + b * kPanelRows + 8 * h)));
      for (int r = 0; r < R; ++r) {
        float* out = state + r * kPanelRows + 8 * h;
        _mm256_storeu_ps(
            out, _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(a[r][h])),
                                 _mm256_set1_ps(xs[r * xs_stride + b]), _mm256_loadu_ps(out)));
      }
    }
  }
}

// R rows: TileAvx2Lanes for several rows of 4- to 6-bit codes, TileAvx2Bytes for several of
// 8-bit codes, TileAvx2 for one.
template <int R, int Bits, int SubCols, bool SharedD, bool Unit, int MaxCode>
void TileAvx2For(const int8_t* x, int64_t x_stride, const float* xs, int64_t xs_stride,
                 const int32_t* sums, int64_t sums_stride, const PackedMatrix& w, int64_t panel,
                 float* state) {
  static_assert(Bits != 8 || (SharedD && Unit), "8-bit codes are Q8_0's");
  if constexpr (Bits == 8 && R >= kMinLaneRows)
    TileAvx2Bytes<R>(x, x_stride, xs, xs_stride, w, panel, state);
  else if constexpr (R >= kMinLaneRows)
    TileAvx2Lanes<R, Bits, SubCols, SharedD, Unit, MaxCode>(x, x_stride, xs, xs_stride, sums,
                                                            sums_stride, w, panel, state);
  else
    TileAvx2<Bits, SubCols, SharedD, Unit>(x, xs, sums, w, panel, state);
}

template <int Bits, int SubCols, bool SharedD, bool Unit, int MaxCode>
void TileAvx2Rows(int64_t count, const int8_t* x, int64_t x_stride, const float* xs,
                  int64_t xs_stride, const int32_t* sums, int64_t sums_stride,
                  const PackedMatrix& w, int64_t panel, float* state) {
  [&]<int... R>(std::integer_sequence<int, R...>) {
    (void)((count == R + 1 ? (TileAvx2For<R + 1, Bits, SubCols, SharedD, Unit, MaxCode>(
                                  x, x_stride, xs, xs_stride, sums, sums_stride, w, panel, state),
                              true)
                           : false) ||
           ...);
  }
  (std::make_integer_sequence<int, kMaxTileRowsAvx2>{});
}

// The tile kernel for w's type: code width, sub-block size, shared d, unit scales, and the
// largest code (2^bits − 1 of the integer form's code bits, tensor/ggml_quants.h).
template <bool kAvx2>
void TileAny(int64_t count, const int8_t* x, int64_t x_stride, const float* xs, int64_t xs_stride,
             const int32_t* sums, int64_t sums_stride, const PackedMatrix& w, int64_t panel,
             float* state) {
#define SY_TILE(bits, sub, shared, unit, max_code)                                                 \
  if constexpr (kAvx2) {                                                                           \
    TileAvx2Rows<bits, sub, shared, unit, max_code>(count, x, x_stride, xs, xs_stride, sums,       \
                                                    sums_stride, w, panel, state);                 \
  } else {                                                                                         \
    TileVnniRows<bits, sub, shared, unit>(count, x, x_stride, xs, xs_stride, sums, sums_stride, w, \
                                          panel, state);                                           \
  }                                                                                                \
  return
  switch (w.ggml_type) {
    case GgmlType::kQ4_0:
      SY_TILE(4, 32, true, true, 15);
    case GgmlType::kQ4_1:
      SY_TILE(4, 32, false, true, 15);
    case GgmlType::kQ5_0:
      SY_TILE(6, 32, true, true, 31);
    case GgmlType::kQ5_1:
      SY_TILE(6, 32, false, true, 31);
    case GgmlType::kQ8_0:
      SY_TILE(8, 32, true, true, 255);
    case GgmlType::kQ2_K:
      SY_TILE(4, 16, false, false, 3);
    case GgmlType::kQ3_K:
      SY_TILE(4, 16, true, false, 7);
    case GgmlType::kQ4_K:
      SY_TILE(4, 32, false, false, 15);
    case GgmlType::kQ5_K:
      SY_TILE(6, 32, false, false, 31);
    case GgmlType::kQ6_K:
      SY_TILE(6, 16, true, false, 63);
    case GgmlType::kHfInt4:  // sc = 1 and mn = z per 128-column group (tensor/ggml_quants.h)
      SY_TILE(4, kHfInt4GroupCols, false, false, 15);
    default:
      return;  // PackGgml takes no other type
  }
#undef SY_TILE
}

#endif

}  // namespace

GgmlKernel ActiveGgmlKernel() {
  GgmlKernel best = GgmlKernel::kPortable;
#if defined(__x86_64__)
  const bool avx2 = CpuHasAvx2Fma(), vnni = avx2 && CpuHasAvx512Vnni();
  if (avx2 && IsaAllows(IsaLevel::kAvx2)) best = GgmlKernel::kAvx2;
  if (vnni && IsaAllows(IsaLevel::kAvx512)) best = GgmlKernel::kAvx512Vnni;
#endif
  return std::min(kernel_limit, best);
}

void LimitGgmlKernel(GgmlKernel kernel) {
  kernel_limit = kernel;
}

const char* GgmlKernelName(GgmlKernel kernel) {
  return kernel == GgmlKernel::kAvx512Vnni ? "ggml-avx512vnni"
         : kernel == GgmlKernel::kAvx2     ? "ggml-avx2"
                                           : "ggml";
}

void QuantizeRowsQ8(const float* x, int64_t m, const PackedMatrix& w, Q8Rows& out, bool parallel) {
  constexpr int64_t kLine = 64;
  out.cols = w.cols;
  out.block_cols = w.super_cols;
  out.sub_cols = w.sub_cols;
  out.blocks = w.cols / w.super_cols;
  out.subs = w.cols / w.sub_cols;
  out.offset = Q8Rows::ActivationOffset(w);
  // An odd number of cache lines between rows: the kernel reads the same columns of every row.
  out.stride = (w.cols + kLine - 1) / kLine * kLine;
  if (out.stride / kLine % 2 == 0) out.stride += kLine;
  out.codes.resize(static_cast<size_t>(m * out.stride));
  out.scales.resize(static_cast<size_t>(m * out.blocks));
  out.sums.resize(static_cast<size_t>(m * out.subs));
  // Columns in whole vectors: every block size is a multiple of 16 (32, 256; 128 for HF int4).
  const bool vector = ActiveGgmlKernel() != GgmlKernel::kPortable && out.block_cols % 16 == 0 &&
                      out.sub_cols % 16 == 0;
  // A row equal to the one before it (in the same chunk) takes a copy of that row's codes,
  // scales and sums, the same bits as quantizing it again: a decode token's row appears once per
  // routed expert and once more for the shared one (5 rows, 3 µs of the setup before each MoE
  // layer's products at hidden 2,048; a copy is ~50 ns). Rows of different tokens differ at their
  // first few columns, so the test costs them next to nothing.
  const auto quantize = vector ? QuantizeRowRangeVector : QuantizeRowRangeScalar;
  const size_t row_bytes = static_cast<size_t>(w.cols) * sizeof(float);
  ThreadPool::Global().ParallelForIf(
      parallel && m > 1 && m * w.cols >= 8192, static_cast<size_t>(m),
      [&](size_t begin, size_t end) {
        for (int64_t r = static_cast<int64_t>(begin); r < static_cast<int64_t>(end);) {
          int64_t run = r + 1;  // rows [r, run) equal row r
          while (run < static_cast<int64_t>(end) &&
                 std::memcmp(x + run * w.cols, x + r * w.cols, row_bytes) == 0)
            ++run;
          quantize(x, r, r + 1, out);
          for (int64_t copy = r + 1; copy < run; ++copy) {
            std::memcpy(out.codes.data() + copy * out.stride, out.Codes(r),
                        static_cast<size_t>(out.stride));
            std::copy_n(out.Scales(r), out.blocks, out.scales.data() + copy * out.blocks);
            std::copy_n(out.Sums(r), out.subs, out.sums.data() + copy * out.subs);
          }
          r = run;
        }
      });
}

void GgmlPanels(const Q8Rows& x, int64_t first, int64_t m, const PackedMatrix& w,
                int64_t panel_begin, int64_t panel_end, float* y) {
  if (m <= 0) return;
  if (UseAmxGgml(m, w)) {
    AmxGgmlPanels(ActiveAmxBackend(), x, first, m, w, panel_begin, panel_end, y);
    return;
  }
  GgmlPanelsOn(ActiveGgmlKernel(), x, first, m, w, panel_begin, panel_end, y);
}

void GgmlPanelsOn(GgmlKernel kernel, const Q8Rows& x, int64_t first, int64_t m,
                  const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, float* y) {
  if (m <= 0) return;
  thread_local std::vector<float> state;
  state.resize(static_cast<size_t>(m * kPanelRows));
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    std::fill(state.begin(), state.end(), 0.0f);
#if defined(__x86_64__)
    if (kernel == GgmlKernel::kAvx512Vnni) {
      ForEachRowTile(m, kMaxTileRows, [&](int64_t, int64_t row, int64_t count) {
        TileAny<false>(count, x.Codes(first + row), x.stride, x.Scales(first + row), x.blocks,
                       x.Sums(first + row), x.subs, w, p, state.data() + row * kPanelRows);
      });
    } else if (kernel == GgmlKernel::kAvx2) {
      ForEachRowTile(m, kMaxTileRowsAvx2, [&](int64_t, int64_t row, int64_t count) {
        TileAny<true>(count, x.Codes(first + row), x.stride, x.Scales(first + row), x.blocks,
                      x.Sums(first + row), x.subs, w, p, state.data() + row * kPanelRows);
      });
    }
#endif
    if (kernel == GgmlKernel::kPortable)
      for (int64_t r = 0; r < m; ++r)
        RowPortable(x.Codes(first + r), x.Scales(first + r), x.Sums(first + r), w, p,
                    state.data() + r * kPanelRows);
    const int64_t valid = std::min(kPanelRows, w.rows - p * kPanelRows);
    for (int64_t r = 0; r < m; ++r)
      std::copy_n(state.data() + r * kPanelRows, valid, y + r * w.rows + p * kPanelRows);
  }
}

}  // namespace sy::kernels
