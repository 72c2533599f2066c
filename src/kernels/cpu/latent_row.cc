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

// codes[i] · 2^exponent for `count` e4m3 codes. In integer arithmetic rather than a table: a
// normal code's exponent and mantissa bits moved into f32's place with the bias raised by 120
// (7 → 127); a subnormal one (exponent bits 0) is m · 2^-9. Both exact, the scale too.
void DecodeCodesImpl(const uint8_t* codes, int64_t count, int exponent, float* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(du)> du8;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const float scale = std::ldexp(1.0f, exponent);
  const auto magnitude_mask = hn::Set(du, 0x7fu), sign_mask = hn::Set(du, 0x80u);
  const auto exponent_mask = hn::Set(du, 0x78u), bias = hn::Set(du, 120u << 23);
  const auto nan_code = hn::Set(du, 0x7fu);
  const auto subnormal_step = hn::Set(df, 1.0f / 512.0f), scale_v = hn::Set(df, scale);
  const auto nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  int64_t i = 0;
  for (; i + n <= count; i += n) {
    const auto code = hn::PromoteTo(du, hn::LoadU(du8, codes + i));
    const auto magnitude = hn::And(code, magnitude_mask);
    const auto normal = hn::BitCast(df, hn::Add(hn::ShiftLeft<20>(magnitude), bias));
    const auto subnormal =
        hn::Mul(hn::ConvertTo(df, hn::BitCast(di, hn::And(magnitude, hn::Set(du, 7u)))),
                subnormal_step);
    const auto is_subnormal = hn::RebindMask(df, hn::Eq(hn::And(code, exponent_mask), hn::Zero(du)));
    auto value = hn::Mul(hn::IfThenElse(is_subnormal, subnormal, normal), scale_v);
    value = hn::Or(value, hn::BitCast(df, hn::ShiftLeft<24>(hn::And(code, sign_mask))));
    const auto is_nan = hn::RebindMask(df, hn::Eq(magnitude, nan_code));
    hn::StoreU(hn::IfThenElse(is_nan, nan, value), df, out + i);
  }
  for (; i < count; ++i)
    out[i] = F8E4M3ToF32(codes[i]) * scale;
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
  RoundToBf16(values + first, layout.width - first,
              reinterpret_cast<uint16_t*>(row + layout.tail));
}

void DecodeLatentRow(const LatentRowLayout& layout, const uint8_t* row, int64_t column,
                     int64_t count, float* out) {
  const int64_t end = column + count;
  if (layout.dtype == DType::kF32) {
    std::memcpy(out, row + column * 4, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  // The quantized columns, a scale block (or the part of one asked for) at a time.
  while (column < std::min(end, layout.quantized)) {
    const int64_t block = column / LatentRowLayout::kScaleBlock;
    const int64_t stop = std::min({end, layout.quantized, (block + 1) * LatentRowLayout::kScaleBlock});
    const int exponent = static_cast<int8_t>(row[layout.quantized + block]);
    HWY_DYNAMIC_DISPATCH(DecodeCodesImpl)(row + column, stop - column, exponent, out);
    out += stop - column;
    column = stop;
  }
  if (column < end)
    WidenBf16(reinterpret_cast<const uint16_t*>(layout.Plain(row, column)), end - column, out);
}

}  // namespace sy::kernels
#endif
