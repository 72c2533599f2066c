#include "tensor/dtype.h"

#include <array>
#include <cmath>

namespace sy {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 12> kDTypes{{
    {DType::kF32, "F32", 4},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kF64, "F64", 8},
    {DType::kI64, "I64", 8},
    {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},
    {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
}};

}  // namespace

size_t DTypeSize(DType dtype) {
  if (dtype == DType::kGgml) return 1;  // a row's bytes depend on the GGML type: Matrix::RowBytes
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.size;
  return 0;
}

std::string_view DTypeName(DType dtype) {
  if (dtype == DType::kGgml) return "GGML";
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.name;
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& info : kDTypes)
    if (info.name == name) return info.dtype;
  return std::nullopt;
}

float F16ToF32(uint16_t bits) {
  uint32_t sign = (bits >> 15) & 1u, exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t F32ToF16(float value) {
  // Via the hardware-independent path: scale into the half range and round to nearest even.
  uint32_t bits = BitsFromF32(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00u;
  if (magnitude >= 65520.0f) return sign | 0x7c00u;
  if (magnitude < std::ldexp(1.0f, -14)) {  // subnormal: units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * std::ldexp(1.0f, 24)));
  }
  int exponent;
  std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
  float scaled = std::nearbyint(std::ldexp(magnitude, 11 - exponent));  // 11 significant bits
  uint32_t mantissa = static_cast<uint32_t>(scaled);
  if (mantissa == 2048u) {
    mantissa = 1024u;
    ++exponent;
  }
  uint32_t biased = static_cast<uint32_t>(exponent - 1 + 15);
  return sign | static_cast<uint16_t>((biased << 10) | (mantissa & 0x3ffu));
}

float F8E4M3ToF32(uint8_t bits) {
  uint32_t sign = bits >> 7, exponent = (bits >> 3) & 0xfu, mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), static_cast<int>(exponent) - 10);
  }
  return sign ? -magnitude : magnitude;
}

const float* F8E4M3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> values{};
    for (int code = 0; code < 256; ++code)
      values[code] = F8E4M3ToF32(static_cast<uint8_t>(code));
    return values;
  }();
  return table.data();
}

}  // namespace sy
