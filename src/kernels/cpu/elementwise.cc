#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>

#include "base/thread_pool.h"
#include "tensor/dtype.h"

// Highway's per-target re-inclusion needs this order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Each row's sum of squares in double lanes (a row of 7168 values should not lose bits), four
// accumulators to cover the add latency, then the scaled row in f32. A decode step of 32 rows
// normalizes every row three times per layer: in scalar double this was 1% of the step.
void RmsNormRowsImpl(const float* x, int64_t begin, int64_t end, int64_t width, const float* weight,
                     float eps, float* out) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dh;  // as many floats as dd has doubles
  const hn::ScalableTag<float> df;
  const int64_t nd = static_cast<int64_t>(hn::Lanes(dd)), nf = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = begin; r < end; ++r) {
    const float* in = x + r * width;
    float* target = out + r * width;
    auto a0 = hn::Zero(dd), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 4 * nd <= width; i += 4 * nd) {
      const auto v0 = hn::PromoteTo(dd, hn::LoadU(dh, in + i));
      const auto v1 = hn::PromoteTo(dd, hn::LoadU(dh, in + i + nd));
      const auto v2 = hn::PromoteTo(dd, hn::LoadU(dh, in + i + 2 * nd));
      const auto v3 = hn::PromoteTo(dd, hn::LoadU(dh, in + i + 3 * nd));
      a0 = hn::MulAdd(v0, v0, a0);
      a1 = hn::MulAdd(v1, v1, a1);
      a2 = hn::MulAdd(v2, v2, a2);
      a3 = hn::MulAdd(v3, v3, a3);
    }
    double sum = hn::GetLane(hn::SumOfLanes(dd, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
    for (; i < width; ++i)
      sum += static_cast<double>(in[i]) * in[i];
    const float inverse = 1.0f / std::sqrt(static_cast<float>(sum / width) + eps);
    const auto scale = hn::Set(df, inverse);
    int64_t c = 0;
    for (; c + nf <= width; c += nf)
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, in + c), scale), hn::LoadU(df, weight + c)), df,
                 target + c);
    for (; c < width; ++c)
      target[c] = in[c] * inverse * weight[c];
  }
}

// gate = gate / (1 + exp(-gate)) · up. exp's argument is capped at 88 (exp(88) ≈ 1.7e38, still
// finite; Highway's Exp is specified up to 104): past it the product is below 1e-36 either way.
// A NaN gate stays NaN through the division.
void SiluMulImpl(float* gate, const float* up, int64_t count) {
  const hn::ScalableTag<float> df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const auto one = hn::Set(df, 1.0f), cap = hn::Set(df, 88.0f);
  auto silu_mul = [&](const float* g_in, const float* u_in, float* g_out) {
    const auto g = hn::LoadU(df, g_in);
    const auto e = hn::Exp(df, hn::Min(hn::Neg(g), cap));
    hn::StoreU(hn::Mul(hn::Div(g, hn::Add(one, e)), hn::LoadU(df, u_in)), df, g_out);
  };
  int64_t i = 0;
  for (; i + n <= count; i += n)
    silu_mul(gate + i, up + i, gate + i);
  // The tail through the same vector arithmetic (copied into a whole vector), so that a value's
  // bits do not depend on where a call's range ends: callers split rows by columns, items and
  // threads.
  if (i < count) {
    constexpr int64_t kMaxLanes = 64;
    static_assert(hn::MaxLanes(hn::ScalableTag<float>()) <= kMaxLanes);
    alignas(64) float g[kMaxLanes] = {}, u[kMaxLanes] = {};
    std::copy(gate + i, gate + count, g);
    std::copy(up + i, up + count, u);
    silu_mul(g, u, g);
    std::copy(g, g + (count - i), gate + i);
  }
}

// F32ToBF16 (tensor/dtype.h) lane by lane, in integer arithmetic as it is written: nearest, ties
// to even, subnormals kept, NaN quieted. (The CPUs' own conversions flush subnormals.)
void RoundToBf16Impl(const float* x, int64_t count, uint16_t* out) {
  const hn::ScalableTag<uint32_t> du;
  const hn::Rebind<uint16_t, decltype(du)> du16;
  const int64_t n = static_cast<int64_t>(hn::Lanes(du));
  const auto magnitude = hn::Set(du, 0x7fffffffu), infinity = hn::Set(du, 0x7f800000u);
  const auto half = hn::Set(du, 0x7fffu), one = hn::Set(du, 1u), quiet = hn::Set(du, 0x40u);
  auto round = [&](const float* in, uint16_t* to) {
    const auto bits = hn::LoadU(du, reinterpret_cast<const uint32_t*>(in));
    const auto high = hn::ShiftRight<16>(bits);
    const auto nearest = hn::ShiftRight<16>(hn::Add(bits, hn::Add(half, hn::And(high, one))));
    const auto nan = hn::Gt(hn::And(bits, magnitude), infinity);
    hn::StoreU(hn::TruncateTo(du16, hn::IfThenElse(nan, hn::Or(high, quiet), nearest)), du16, to);
  };
  int64_t i = 0;
  for (; i + n <= count; i += n)
    round(x + i, out + i);
  for (; i < count; ++i)
    out[i] = F32ToBF16(x[i]);
}

// bf16 → f32 is exact: each value's bits moved to the top half.
void WidenBf16Impl(const uint16_t* x, int64_t count, float* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(du)> du16;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + n <= count; i += n)
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, x + i)))), df,
               out + i);
  for (; i < count; ++i)
    out[i] = BF16ToF32(x[i]);
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {

HWY_EXPORT(RmsNormRowsImpl);
HWY_EXPORT(SiluMulImpl);
HWY_EXPORT(RoundToBf16Impl);
HWY_EXPORT(WidenBf16Impl);

void WidenBf16(const uint16_t* x, int64_t count, float* out) {
  HWY_DYNAMIC_DISPATCH(WidenBf16Impl)(x, count, out);
}

void RoundToBf16(const float* x, int64_t count, uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(RoundToBf16Impl)(x, count, out);
}

void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight, float eps,
             float* out) {
  // A batch's rows over the threads: each row's arithmetic is its own, so the split changes
  // nothing but the time (one decode step normalizes every row three times per layer).
  if (rows >= 2 && ThreadPool::Global().size() > 1) {
    ThreadPool::Global().ParallelFor(static_cast<size_t>(rows), [&](size_t begin, size_t end) {
      RmsNormRows(x, static_cast<int64_t>(begin), static_cast<int64_t>(end), width, weight, eps,
                  out);
    });
  } else {
    RmsNormRows(x, 0, rows, width, weight, eps, out);
  }
}

void RmsNormRows(const float* x, int64_t begin, int64_t end, int64_t width, const float* weight,
                 float eps, float* out) {
  HWY_DYNAMIC_DISPATCH(RmsNormRowsImpl)(x, begin, end, width, weight, eps, out);
}

void SiluMul(float* gate, const float* up, int64_t count) {
  HWY_DYNAMIC_DISPATCH(SiluMulImpl)(gate, up, count);
}

void Softmax(float* values, int64_t count) {
  if (count == 0) return;
  float maximum = *std::max_element(values, values + count);
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) {
    values[i] = std::exp(values[i] - maximum);
    sum += values[i];
  }
  float inverse = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < count; ++i)
    values[i] *= inverse;
}

}  // namespace sy::kernels
#endif  // HWY_ONCE
