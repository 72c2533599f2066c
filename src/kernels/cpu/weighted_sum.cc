#include "kernels/cpu/weighted_sum.h"

// Highway's per-target re-inclusion needs this order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/weighted_sum.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One pass over the row with the sum in a register: the plain loop's fill and K + 1 passes of
// loads and stores were 4% of a 32 × 64-token prefill of the bf16 bench model on a Xeon. The
// compiler would fuse Mul and Add into an FMA where the target has one (GCC contracts its vector
// intrinsics): CMakeLists.txt builds this file with -ffp-contract=off.
void WeightedRowSumImpl(const float* const* rows, const float* weights, int64_t count,
                        const float* extra, int64_t n, float* out) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto sum = hn::Zero(df);
    for (int64_t k = 0; k < count; ++k)
      sum = hn::Add(sum, hn::Mul(hn::Set(df, weights[k]), hn::LoadU(df, rows[k] + i)));
    if (extra != nullptr) sum = hn::Add(sum, hn::LoadU(df, extra + i));
    hn::StoreU(sum, df, out + i);
  }
  for (; i < n; ++i) {
    float sum = 0.0f;
    for (int64_t k = 0; k < count; ++k)
      sum += weights[k] * rows[k][i];
    out[i] = extra != nullptr ? sum + extra[i] : sum;
  }
}

void AddWeightedRowImpl(float* acc, const float* row, float weight, int64_t n, bool first) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto w = hn::Set(df, weight);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto sum = first ? hn::Zero(df) : hn::LoadU(df, acc + i);
    hn::StoreU(hn::Add(sum, hn::Mul(w, hn::LoadU(df, row + i))), df, acc + i);
  }
  for (; i < n; ++i)
    acc[i] = (first ? 0.0f : acc[i]) + weight * row[i];
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {

HWY_EXPORT(WeightedRowSumImpl);
HWY_EXPORT(AddWeightedRowImpl);

void WeightedRowSum(const float* const* rows, const float* weights, int64_t count,
                    const float* extra, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(WeightedRowSumImpl)(rows, weights, count, extra, n, out);
}

void AddWeightedRow(float* acc, const float* row, float weight, int64_t n, bool first) {
  HWY_DYNAMIC_DISPATCH(AddWeightedRowImpl)(acc, row, weight, n, first);
}

}  // namespace sy::kernels
#endif  // HWY_ONCE
