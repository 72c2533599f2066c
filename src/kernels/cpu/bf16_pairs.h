// fp8 and bf16 panel weights (packed_matrix.h) as bf16 pairs: for columns c and c + 1 of a
// panel, one 512-bit vector whose 32-bit lane r holds (w[r][c], w[r][c + 1]). That is the operand
// VDPBF16PS takes (bf16_dot.cc) and, stored, one row of an AMX TDPBF16PS weight tile
// (amx_hardware.cc). Internal linkage: each file that includes it compiles its own copy.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/packed_matrix.h"

#define SY_DOT_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,fma,f16c")))

namespace sy::kernels {
namespace {

// e4m3 magnitude (7 bits) → the low and high byte of the same number in bf16. Exact: e4m3's 4
// significant bits and exponents 2^-9..2^8 (subnormals included) fit bf16's 8 and its range.
struct ConversionTables {
  alignas(64) uint8_t lo[128];
  alignas(64) uint8_t hi[128];
};

const ConversionTables& Tables() {
  static const ConversionTables tables = [] {
    ConversionTables t{};
    for (int v = 0; v < 128; ++v) {
      const uint16_t bits = F32ToBF16(F8E4M3ToF32(static_cast<uint8_t>(v)));
      t.lo[v] = static_cast<uint8_t>(bits & 0xff);
      t.hi[v] = static_cast<uint8_t>(bits >> 8);
    }
    return t;
  }();
  return tables;
}

// Registers that turn a panel's weights into VDPBF16PS operands: for columns c and c + 1, one
// vector whose 32-bit lane r holds (w[r][c], w[r][c + 1]) in bf16.
struct Converter {
  __m512i lo0, lo1, hi0, hi1;  // the tables, 64 bytes each
  __m512i sign;                // 0x80 in every byte
  __m512i pair0, pair1;        // byte shuffles interleaving columns (c, c + 1) and (c + 2, c + 3)
  __m512i word_pairs;          // bf16 weights: word shuffle interleaving two columns
};

SY_DOT_TARGET inline Converter MakeConverter() {
  const ConversionTables& t = Tables();
  Converter k;
  k.lo0 = _mm512_load_si512(t.lo);
  k.lo1 = _mm512_load_si512(t.lo + 64);
  k.hi0 = _mm512_load_si512(t.hi);
  k.hi1 = _mm512_load_si512(t.hi + 64);
  k.sign = _mm512_set1_epi8(static_cast<char>(0x80));
  alignas(64) uint8_t p0[64], p1[64];
  alignas(64) uint16_t words[32];
  for (int r = 0; r < 16; ++r) {
    // Bytes 0-63 of the shuffle's input are the low bytes, 64-127 the high bytes; a quad's
    // fp8 bytes are [column][16 rows], so column c + j of row r sits at 16·j + r.
    for (int half = 0; half < 2; ++half) {
      uint8_t* p = half == 0 ? p0 : p1;
      const int first = 32 * half + r, second = 32 * half + 16 + r;
      p[4 * r + 0] = static_cast<uint8_t>(first);
      p[4 * r + 1] = static_cast<uint8_t>(64 + first);
      p[4 * r + 2] = static_cast<uint8_t>(second);
      p[4 * r + 3] = static_cast<uint8_t>(64 + second);
    }
    words[2 * r] = static_cast<uint16_t>(r);
    words[2 * r + 1] = static_cast<uint16_t>(16 + r);
  }
  k.pair0 = _mm512_load_si512(p0);
  k.pair1 = _mm512_load_si512(p1);
  k.word_pairs = _mm512_load_si512(words);
  return k;
}

// Columns c..c+3 of a panel as two operand vectors (c, c+1) and (c+2, c+3).
template <bool kFp8>
SY_DOT_TARGET inline void ConvertQuad(const Converter& k, const uint8_t* panel, int64_t c,
                                      __m512i& first, __m512i& second) {
  if constexpr (kFp8) {
    const __m512i bytes = _mm512_loadu_si512(panel + c * kPanelRows);
    const __m512i lo = _mm512_permutex2var_epi8(k.lo0, bytes, k.lo1);
    __m512i hi = _mm512_permutex2var_epi8(k.hi0, bytes, k.hi1);
    hi = _mm512_ternarylogic_epi32(hi, bytes, k.sign, 0xF8);  // hi | (bytes & 0x80)
    first = _mm512_permutex2var_epi8(lo, k.pair0, hi);
    second = _mm512_permutex2var_epi8(lo, k.pair1, hi);
  } else {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(panel) + c * kPanelRows;
    first = _mm512_permutexvar_epi16(k.word_pairs, _mm512_loadu_si512(w));
    second = _mm512_permutexvar_epi16(k.word_pairs, _mm512_loadu_si512(w + 2 * kPanelRows));
  }
}

}  // namespace
}  // namespace sy::kernels
#endif
