// IndexScores (index_scores.h): a block of keys a vector wide at a time, transposed so that each
// head's dot products with all of them accumulate lane-wise (no horizontal sums), four heads at
// once so four independent chains hide their latency. Compiled without contraction
// (CMakeLists.txt): every product is rounded before it is added, on every target.
#include "kernels/cpu/index_scores.h"

#include <algorithm>
#include <vector>

// Highway's per-target re-inclusion needs this order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/index_scores.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on
#include "hwy/aligned_allocator.h"

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void IndexScoresImpl(const float* q, const float* weights, int64_t heads, int64_t dim,
                     const float* keys, int64_t count, float* scores) {
  const hn::ScalableTag<float> df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  // keys_t[d · n + i] = keys[j + i][d] for one block of n keys (zero past the last).
  auto keys_t = hwy::AllocateAligned<float>(static_cast<size_t>(dim * n));
  auto block_scores = hwy::AllocateAligned<float>(static_cast<size_t>(n));
  const auto zero = hn::Zero(df);
  for (int64_t j = 0; j < count; j += n) {
    const int64_t in_block = std::min(n, count - j);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < dim; ++d)
        keys_t[d * n + i] = i < in_block ? keys[(j + i) * dim + d] : 0.0f;
    auto total = zero;
    int64_t h = 0;
    for (; h + 4 <= heads; h += 4) {
      const float *q0 = q + h * dim, *q1 = q0 + dim, *q2 = q1 + dim, *q3 = q2 + dim;
      auto a0 = zero, a1 = zero, a2 = zero, a3 = zero;
      for (int64_t d = 0; d < dim; ++d) {
        const auto k = hn::Load(df, keys_t.get() + d * n);
        a0 = hn::Add(a0, hn::Mul(hn::Set(df, q0[d]), k));
        a1 = hn::Add(a1, hn::Mul(hn::Set(df, q1[d]), k));
        a2 = hn::Add(a2, hn::Mul(hn::Set(df, q2[d]), k));
        a3 = hn::Add(a3, hn::Mul(hn::Set(df, q3[d]), k));
      }
      total = hn::Add(total, hn::Mul(hn::Set(df, weights[h]), hn::Max(a0, zero)));
      total = hn::Add(total, hn::Mul(hn::Set(df, weights[h + 1]), hn::Max(a1, zero)));
      total = hn::Add(total, hn::Mul(hn::Set(df, weights[h + 2]), hn::Max(a2, zero)));
      total = hn::Add(total, hn::Mul(hn::Set(df, weights[h + 3]), hn::Max(a3, zero)));
    }
    for (; h < heads; ++h) {
      const float* qh = q + h * dim;
      auto a = zero;
      for (int64_t d = 0; d < dim; ++d)
        a = hn::Add(a, hn::Mul(hn::Set(df, qh[d]), hn::Load(df, keys_t.get() + d * n)));
      total = hn::Add(total, hn::Mul(hn::Set(df, weights[h]), hn::Max(a, zero)));
    }
    hn::Store(total, df, block_scores.get());
    std::copy_n(block_scores.get(), in_block, scores + j);
  }
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {

HWY_EXPORT(IndexScoresImpl);

void IndexScores(const float* q, const float* weights, int64_t heads, int64_t dim,
                 const float* keys, int64_t count, float* scores) {
  HWY_DYNAMIC_DISPATCH(IndexScoresImpl)(q, weights, heads, dim, keys, count, scores);
}

}  // namespace sy::kernels
#endif  // HWY_ONCE
