// Element types of checkpoint tensors and their conversions to and from float32.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace sy {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,
  kF8E5M2,
  kF64,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
  // GGML blocks of a GGUF file, kept as they are (the GGML type travels beside: Matrix::ggml_type,
  // SafetensorsEntry::ggml_type); never read from a safetensors header.
  kGgml
};

// Bytes per element.
size_t DTypeSize(DType dtype);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view DTypeName(DType dtype);
// Parses the safetensors spelling; nullopt for anything unknown.
std::optional<DType> ParseDType(std::string_view name);

inline float F32FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}
inline uint32_t BitsFromF32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float BF16ToF32(uint16_t bits) {
  return F32FromBits(static_cast<uint32_t>(bits) << 16);
}
// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t F32ToBF16(float value) {
  uint32_t bits = BitsFromF32(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Nearest integer, ties to even (nearbyint in the default mode; numpy's and torch's round).
// Adding and subtracting 1.5 · 2^23 rounds exactly so for |x| < 2^22, without nearbyint's library
// call on baseline x86-64 (one call per weight was most of an int8 repack, a fifth of an int4
// export); larger values and NaN take nearbyint.
inline float RoundEven(float x) {
  constexpr float kMagic = 12582912.0f;                        // 1.5 · 2^23
  if (!(std::fabs(x) < 4194304.0f)) return std::nearbyint(x);  // 2^22 and beyond, NaN
  return (x + kMagic) - kMagic;
}

float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);

// float8 e4m3fn: s eeee mmm, bias 7, no infinities, 0x7f/0xff are NaN, max finite 448.
float F8E4M3ToF32(uint8_t bits);
// Round to nearest even, saturating to ±448 (the quantizer's convention).
inline uint8_t F32ToF8E4M3(float value) {
  // Bit arithmetic with selects instead of branches (or frexp/ldexp): dispatch quantizes every
  // activation it sends, and in a loop this vectorizes.
  const uint32_t bits = BitsFromF32(value);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  // Normal codes (≥ 2^-6): round the 23-bit mantissa to 3 bits, to nearest even; a carry moves
  // into the exponent (bias 127 → 7).
  const uint32_t rounded = magnitude + 0x7ffffu + ((magnitude >> 20) & 1u);
  const uint32_t normal = (((rounded >> 23) - 120u) << 3) | ((rounded >> 20) & 7u);
  // Subnormal codes m · 2^-9 below 2^-6 (m = 8 is 2^-6 itself, with the same bits): adding
  // 1.5·2^23 leaves m, rounded to nearest even, in the low bits.
  const uint32_t subnormal =
      BitsFromF32(F32FromBits(magnitude) * 512.0f + 12582912.0f) - 0x4b400000u;
  uint32_t code = magnitude < 0x3c800000u ? subnormal : normal;
  code = magnitude >= 0x43e00000u ? 0x7eu : code;  // ≥ 448 saturates
  code = magnitude > 0x7f800000u ? 0x7fu : code;   // NaN
  return static_cast<uint8_t>(sign | code);
}

// A 256-entry table of F8E4M3ToF32, for kernels that decode bytes in bulk.
const float* F8E4M3Table();

}  // namespace sy
