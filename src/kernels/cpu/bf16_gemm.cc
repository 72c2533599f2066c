#include "kernels/cpu/bf16_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/isa_level.h"
#include "tensor/dtype.h"

namespace sy::kernels {

bool HasAvx512Bf16() {
#if defined(__x86_64__)
  static const bool has =
      __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  return has && IsaAllows(IsaLevel::kAvx512);
#else
  return false;
#endif
}

std::vector<uint16_t> ToBf16Rows(const float* x, int64_t m, int64_t cols) {
  const int64_t padded = (cols + 1) / 2 * 2;
  std::vector<uint16_t> out(static_cast<size_t>(m * padded), 0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * padded + c] = F32ToBF16(x[r * cols + c]);
  return out;
}

#if defined(__x86_64__)
#define SY_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c,fma")))

namespace {

constexpr int64_t kColumnBlock = 256;  // columns (k) per packed B block: 16 KiB of bf16 pairs
constexpr int64_t kTileRows = 12;      // rows of x per micro-tile: 24 accumulators

// 16 weights of panel column `col` as f32, scaled (fp8) — the same decode as PanelGemm.
SY_BF16_TARGET inline __m512 DecodeColumn(const PackedMatrix& w, const uint8_t* panel, int64_t col,
                                          float scale) {
  if (w.dtype == DType::kF8E4M3) {
    __m256i bytes = _mm256_cvtepu8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + col * kPanelRows)));
    __m256i bits =
        _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(0x80)), 8),
                        _mm256_slli_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(0x7f)), 7));
    return _mm512_mul_ps(_mm512_cvtph_ps(bits), _mm512_set1_ps(scale * 256.0f));
  }
  if (w.dtype == DType::kBF16) {
    __m256i halves =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + col * kPanelRows * 2));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
  }
  return _mm512_loadu_ps(reinterpret_cast<const float*>(panel) + col * kPanelRows);
}

// Packs columns [k0, k0 + count) of two panels into [count/2][32 outputs][2] bf16 pairs.
SY_BF16_TARGET void PackBlock(const PackedMatrix& w, int64_t panel, int64_t k0, int64_t count,
                              uint16_t* out) {
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int half = 0; half < 2; ++half) {
    const int64_t p = panel + half;
    const bool present = p < w.panels;
    const uint8_t* base = present ? w.Panel(p) : nullptr;
    const float* scales = present && w.dtype == DType::kF8E4M3 ? w.PanelScales(p) : nullptr;
    for (int64_t pair = 0; pair < count / 2; ++pair) {
      const int64_t k = k0 + 2 * pair;
      __m512i packed = _mm512_setzero_si512();
      if (present) {
        const float scale = scales ? scales[k / w.block_cols] : 1.0f;
        __m512 even = DecodeColumn(w, base, k, scale);
        __m512 odd = k + 1 < w.cols ? DecodeColumn(w, base, k + 1, scale) : _mm512_setzero_ps();
        __m512bh both = _mm512_cvtne2ps_pbh(odd, even);  // lanes 0-15 even, 16-31 odd
        packed = _mm512_permutexvar_epi16(interleave, reinterpret_cast<__m512i&>(both));
      }
      _mm512_storeu_si512(out + (pair * 2 * kPanelRows * 2) + half * 2 * kPanelRows, packed);
    }
  }
}

template <int kRows>
SY_BF16_TARGET void MicroTile(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t pairs,
                              float* c, int64_t ldc, __mmask16 mask0, __mmask16 mask1) {
  __m512 acc[kRows][2];
  for (int r = 0; r < kRows; ++r)
    acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * 64));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * 64 + 32));
    for (int r = 0; r < kRows; ++r) {
      int32_t pair_bits;
      std::memcpy(&pair_bits, a + r * lda + 2 * p, 4);
      const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair_bits));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float* row = c + r * ldc;
    _mm512_mask_storeu_ps(row, mask0, _mm512_add_ps(_mm512_maskz_loadu_ps(mask0, row), acc[r][0]));
    _mm512_mask_storeu_ps(row + 16, mask1,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(mask1, row + 16), acc[r][1]));
  }
}

using MicroTileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t,
                             __mmask16, __mmask16);
constexpr MicroTileFn kMicroTiles[kTileRows + 1] = {
    nullptr,       MicroTile<1>,  MicroTile<2>, MicroTile<3>, MicroTile<4>,
    MicroTile<5>,  MicroTile<6>,  MicroTile<7>, MicroTile<8>, MicroTile<9>,
    MicroTile<10>, MicroTile<11>, MicroTile<12>};

}  // namespace

SY_BF16_TARGET void Bf16Gemm(const uint16_t* x, int64_t m, const PackedMatrix& w,
                             int64_t panel_begin, int64_t panel_end, float* y) {
  const int64_t lda = (w.cols + 1) / 2 * 2;
  alignas(64) uint16_t block[kColumnBlock / 2 * 2 * kPanelRows * 2];
  for (int64_t panel = panel_begin; panel < panel_end; panel += 2) {
    const int64_t col0 = panel * kPanelRows;
    const int64_t valid = std::min<int64_t>(2 * kPanelRows, w.rows - col0);
    const __mmask16 mask0 = valid >= 16 ? 0xffff : static_cast<__mmask16>((1u << valid) - 1);
    const __mmask16 mask1 = valid >= 32   ? 0xffff
                            : valid <= 16 ? 0
                                          : static_cast<__mmask16>((1u << (valid - 16)) - 1);
    // Only the caller's panels: a second panel past panel_end belongs to another thread.
    const bool single = panel + 1 >= panel_end;
    for (int64_t r = 0; r < m; ++r) {
      std::memset(y + r * w.rows + col0, 0,
                  static_cast<size_t>(std::min<int64_t>(valid, single ? kPanelRows : valid)) * 4);
    }
    const __mmask16 use1 = single ? 0 : mask1;
    for (int64_t k0 = 0; k0 < lda; k0 += kColumnBlock) {
      const int64_t count = std::min(kColumnBlock, lda - k0);
      PackBlock(w, panel, k0, count, block);
      for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
        const int64_t rows = std::min(kTileRows, m - r0);
        kMicroTiles[rows](x + r0 * lda + k0, lda, block, count / 2, y + r0 * w.rows + col0, w.rows,
                          mask0, use1);
      }
    }
  }
}

#else
void Bf16Gemm(const uint16_t*, int64_t, const PackedMatrix&, int64_t, int64_t, float*) {}
#endif

}  // namespace sy::kernels
