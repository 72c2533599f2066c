// IndexScores (index_scores.h): heads along the lanes (q transposed once), two keys at a time,
// each key's value at d broadcast against every head's q — four head vectors for each of the two
// keys, eight independent sums to hide the adds' latency; then each key's weighted relu sum over
// the heads in order. Compiled without contraction
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
#include "hwy/cache_control.h"

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sums of G head vectors (starting at head g) with two keys over dim: a[v] for key0, b[v] for
// key1, written to sums0/sums1 (sums1 only where `pair`).
template <int G, class D>
void HeadGroupSums(D df, const float* q_t, int64_t padded, int64_t g, int64_t dim,
                   const float* key0, const float* key1, bool pair, float* sums0, float* sums1) {
  using V = hn::Vec<D>;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  V a[G], b[G];
  for (int v = 0; v < G; ++v)
    a[v] = b[v] = hn::Zero(df);
  for (int64_t d = 0; d < dim; ++d) {
    const V k0 = hn::Set(df, key0[d]), k1 = hn::Set(df, key1[d]);
    const float* row = q_t + d * padded + g;
    for (int v = 0; v < G; ++v) {
      const V qv = hn::Load(df, row + v * n);
      a[v] = hn::Add(a[v], hn::Mul(qv, k0));
      b[v] = hn::Add(b[v], hn::Mul(qv, k1));
    }
  }
  for (int v = 0; v < G; ++v) {
    hn::Store(a[v], df, sums0 + g + v * n);
    if (pair) hn::Store(b[v], df, sums1 + g + v * n);
  }
}

void IndexScoresImpl(const float* q, const float* weights, int64_t heads, int64_t dim,
                     const LatentPages& key_rows, int64_t column, int64_t first, int64_t count,
                     float* scores) {
  using D = hn::ScalableTag<float>;
  const D df;
  const hn::Rebind<uint16_t, D> du16;
  const hn::Rebind<uint32_t, D> du32;
  // Heads padded to whole vectors, summed four vectors at a time for each of two keys (eight
  // independent chains), the rest two or one at a time: a few heads (a small model's) are not
  // padded to sixty-four.
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t padded = (heads + n - 1) / n * n;
  // q transposed, heads along the lanes (zero past the last head): each key's value at d is
  // broadcast once and multiplies every head's q[h][d].
  auto q_t = hwy::AllocateAligned<float>(static_cast<size_t>(dim * padded));
  for (int64_t d = 0; d < dim; ++d)
    for (int64_t h = 0; h < padded; ++h)
      q_t[d * padded + h] = h < heads ? q[h * dim + d] : 0.0f;
  const int64_t dim_padded = (dim + n - 1) / n * n;
  auto key = hwy::AllocateAligned<float>(static_cast<size_t>(2 * dim_padded));
  // Each key's per-head sums, for a block of keys whose weighted sums over the heads then run
  // side by side (independent chains; one chain at a time was a third of the time).
  constexpr int64_t kBlock = 16;
  auto sums = hwy::AllocateAligned<float>(static_cast<size_t>(kBlock * padded));
  // Index keys follow the latent, so they are stored whole in every layout (latent_row.h).
  const bool bf16 = key_rows.layout.plain_dtype() == DType::kBF16;
  const size_t element = DTypeSize(key_rows.layout.plain_dtype());
  // Key j widened into key[slot · dim_padded …] (bf16: the bits shifted up, exact). Each key is a
  // few cache lines of its own row, rows a page apart now and then: the one kAhead keys on is
  // fetched meanwhile (waiting on each key's load was three fifths of the kernel's time).
  constexpr int64_t kAhead = 16;
  const int64_t key_bytes = dim * static_cast<int64_t>(element);
  const auto widen = [&](int64_t j, int slot) {
    if (j + kAhead < count) {
      const uint8_t* ahead = key_rows.layout.Plain(key_rows.Row(first + j + kAhead), column);
      for (int64_t b = 0; b < key_bytes; b += 64)
        hwy::Prefetch(ahead + b);
    }
    const uint8_t* row = key_rows.layout.Plain(key_rows.Row(first + j), column);
    float* out = key.get() + slot * dim_padded;
    int64_t d = 0;
    if (bf16) {
      const auto* values = reinterpret_cast<const uint16_t*>(row);
      for (; d + n <= dim; d += n)
        hn::Store(
            hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, values + d)))),
            df, out + d);
      for (; d < dim; ++d)
        out[d] = BF16ToF32(values[d]);
    } else {
      std::copy_n(reinterpret_cast<const float*>(row), dim, out);
    }
  };
  for (int64_t j0 = 0; j0 < count; j0 += kBlock) {
    const int64_t in_block = std::min(kBlock, count - j0);
    for (int64_t i = 0; i < in_block; i += 2) {
      const bool pair = i + 1 < in_block;
      widen(j0 + i, 0);
      if (pair) widen(j0 + i + 1, 1);
      float* sums0 = sums.get() + i * padded;
      float* sums1 = sums0 + padded;
      int64_t g = 0;
      for (; g + 4 * n <= padded; g += 4 * n)
        HeadGroupSums<4>(df, q_t.get(), padded, g, dim, key.get(), key.get() + dim_padded, pair,
                         sums0, sums1);
      for (; g + 2 * n <= padded; g += 2 * n)
        HeadGroupSums<2>(df, q_t.get(), padded, g, dim, key.get(), key.get() + dim_padded, pair,
                         sums0, sums1);
      for (; g < padded; g += n)
        HeadGroupSums<1>(df, q_t.get(), padded, g, dim, key.get(), key.get() + dim_padded, pair,
                         sums0, sums1);
    }
    // Over the heads in order, one rounding a step, as the scalar form: the same bits at every
    // vector width.
    float totals[kBlock] = {};
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < in_block; ++i)
        totals[i] += weights[h] * std::max(sums[i * padded + h], 0.0f);
    std::copy_n(totals, in_block, scores + j0);
  }
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {

HWY_EXPORT(IndexScoresImpl);

void IndexScores(const float* q, const float* weights, int64_t heads, int64_t dim,
                 const LatentPages& keys, int64_t column, int64_t first, int64_t count,
                 float* scores) {
  HWY_DYNAMIC_DISPATCH(IndexScoresImpl)(q, weights, heads, dim, keys, column, first, count, scores);
}

}  // namespace sy::kernels
#endif  // HWY_ONCE
