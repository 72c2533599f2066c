#include "kernels/cpu/latent_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/elementwise.h"

// Highway's per-target re-inclusion needs this order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/latent_row.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Codes [column, column + count) of a row's quantized part as f32: code · 2^e, e the exponent of
// its block of 128. In integer arithmetic rather than a table: a normal code's exponent and
// mantissa bits moved into f32's place with the bias raised by 120 + e (7 → 127, and the scale
// folded in); a subnormal one (exponent bits 0) is m · 2^(e-9). Both exact. One call a row: a
// call and a libm ldexp per block were a tenth of the f32 flash-decode's time on AVX2.
void DecodeCodesImpl(const uint8_t* codes, const int8_t* exponents, int64_t column, int64_t count,
                     float* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(du)> du8;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const auto magnitude_mask = hn::Set(du, 0x7fu), sign_mask = hn::Set(du, 0x80u);
  const auto exponent_mask = hn::Set(du, 0x78u), mantissa_mask = hn::Set(du, 7u);
  const auto nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  const int64_t end = column + count;
  while (column < end) {
    const int64_t block = column / LatentRowLayout::kScaleBlock;
    const int64_t stop = std::min(end, (block + 1) * LatentRowLayout::kScaleBlock);
    const int e = exponents[block];
    const auto bias = hn::Set(du, static_cast<uint32_t>(120 + e) << 23);
    const auto subnormal_step = hn::Set(df, F32FromBits(static_cast<uint32_t>(127 + e - 9) << 23));
    int64_t i = column;
    for (; i + n <= stop; i += n) {
      const auto code = hn::PromoteTo(du, hn::LoadU(du8, codes + i));
      const auto magnitude = hn::And(code, magnitude_mask);
      const auto normal = hn::BitCast(df, hn::Add(hn::ShiftLeft<20>(magnitude), bias));
      const auto subnormal = hn::Mul(
          hn::ConvertTo(df, hn::BitCast(di, hn::And(magnitude, mantissa_mask))), subnormal_step);
      const auto is_subnormal =
          hn::RebindMask(df, hn::Eq(hn::And(code, exponent_mask), hn::Zero(du)));
      auto value = hn::IfThenElse(is_subnormal, subnormal, normal);
      value = hn::Or(value, hn::BitCast(df, hn::ShiftLeft<24>(hn::And(code, sign_mask))));
      const auto is_nan = hn::RebindMask(df, hn::Eq(magnitude, magnitude_mask));
      hn::StoreU(hn::IfThenElse(is_nan, nan, value), df, out + (i - column));
    }
    for (; i < stop; ++i)
      out[i - column] = F8E4M3ToF32(codes[i]) * F32FromBits(static_cast<uint32_t>(127 + e) << 23);
    out += stop - column;
    column = stop;
  }
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {

HWY_EXPORT(DecodeCodesImpl);

LatentRowLayout LatentRowLayout::Of(DType dtype, int64_t width, int64_t latent) {
  LatentRowLayout layout;
  layout.dtype = dtype;
  layout.width = width;
  if (dtype == DType::kF8E4M3) {
    layout.quantized = std::clamp<int64_t>(latent, 1, width);
    // bf16 columns start on an even byte (rows are an even number of bytes apart).
    layout.tail = (layout.quantized + layout.scale_blocks() + 1) / 2 * 2;
    layout.row_bytes = layout.tail + (width - layout.quantized) * 2;
  } else {
    layout.row_bytes = width * static_cast<int64_t>(DTypeSize(dtype));
  }
  return layout;
}

namespace {

// The smallest e with max_abs ≤ 448 · 2^e (448: e4m3's largest code), kept in range. In double,
// max_abs / 448 is a power of two exactly when max_abs is 448 times one.
int BlockExponent(float max_abs) {
  if (!(max_abs > 0.0f)) return -LatentRowLayout::kMaxExponent;
  int exponent = 0;
  const double fraction = std::frexp(static_cast<double>(max_abs) / 448.0, &exponent);
  if (fraction == 0.5) --exponent;
  return std::clamp(exponent, -LatentRowLayout::kMaxExponent, LatentRowLayout::kMaxExponent);
}

}  // namespace

int64_t FirstBadLatentRow(const LatentRowLayout& layout, const uint8_t* rows, int64_t count) {
  if (layout.dtype != DType::kF8E4M3) return -1;  // every bit pattern is a value
  for (int64_t r = 0; r < count; ++r) {
    const auto* exponents =
        reinterpret_cast<const int8_t*>(rows + r * layout.row_bytes + layout.quantized);
    for (int64_t b = 0; b < layout.scale_blocks(); ++b)
      if (exponents[b] < -LatentRowLayout::kMaxExponent ||
          exponents[b] > LatentRowLayout::kMaxExponent)
        return r;
  }
  return -1;
}

void EncodeLatentRow(const LatentRowLayout& layout, const float* values, uint8_t* row) {
  if (layout.dtype == DType::kF32) {
    std::memcpy(row, values, static_cast<size_t>(layout.width) * sizeof(float));
    return;
  }
  if (layout.dtype == DType::kF8E4M3) {
    int8_t* exponents = reinterpret_cast<int8_t*>(row + layout.quantized);
    for (int64_t b = 0; b < layout.scale_blocks(); ++b) {
      const int64_t begin = b * LatentRowLayout::kScaleBlock;
      const int64_t end = std::min(layout.quantized, begin + LatentRowLayout::kScaleBlock);
      float max_abs = 0.0f;  // NaN left out: it stays NaN, its own code
      for (int64_t i = begin; i < end; ++i)
        max_abs = std::max(max_abs, std::fabs(values[i]));
      const int exponent = BlockExponent(max_abs);
      exponents[b] = static_cast<int8_t>(exponent);
      // Scaling by a power of two is exact, so the one rounding is F32ToF8E4M3's.
      const float inverse = std::ldexp(1.0f, -exponent);
      for (int64_t i = begin; i < end; ++i)
        row[i] = F32ToF8E4M3(values[i] * inverse);
    }
    if (layout.tail > layout.quantized + layout.scale_blocks()) row[layout.tail - 1] = 0;
  }
  // The rest (all of a bf16 row): bf16, which starts on an even byte.
  const int64_t first = layout.quantized;
  RoundToBf16(values + first, layout.width - first, reinterpret_cast<uint16_t*>(row + layout.tail));
}

void DecodeLatentRow(const LatentRowLayout& layout, const uint8_t* row, int64_t column,
                     int64_t count, float* out) {
  const int64_t end = column + count;
  if (layout.dtype == DType::kF32) {
    std::memcpy(out, row + column * 4, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  if (column < layout.quantized) {  // the quantized columns asked for
    const int64_t stop = std::min(end, layout.quantized);
    HWY_DYNAMIC_DISPATCH(DecodeCodesImpl)
    (row, reinterpret_cast<const int8_t*>(row + layout.quantized), column, stop - column, out);
    out += stop - column;
    column = stop;
  }
  if (column < end)
    WidenBf16(reinterpret_cast<const uint16_t*>(layout.Plain(row, column)), end - column, out);
}

}  // namespace sy::kernels
#endif
