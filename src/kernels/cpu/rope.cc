// DeepSeek's rotary embedding (elementwise.h). Compiled without floating-point contraction
// (CMakeLists.txt): the rotation's vector form must round each product and then the sum as the
// scalar form does, and GCC fuses a vector multiply feeding an add where the target has FMA.
#include <cmath>

#include "kernels/cpu/elementwise.h"

// Highway's per-target re-inclusion needs this order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/rope.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ApplyRope's rotation a vector of pairs at a time: with v = (a, b) pairs and (c, s) from the
// table, even lanes a·c − b·s and odd lanes b·c + a·s — each product rounded, then the sum, as
// the scalar loop does (this file is compiled without contraction), so the same bits.
void ApplyRopeImpl(float* vector, int64_t dim, const float* cos_sin) {
  int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR  // one lane: no pairs in a vector
  const hn::ScalableTag<float> df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  for (; i + n <= dim; i += n) {
    const auto v = hn::LoadU(df, vector + i), table = hn::LoadU(df, cos_sin + i);
    const auto with_cos = hn::Mul(v, hn::DupEven(table));                   // a·c, b·c
    const auto with_sin = hn::Mul(hn::Reverse2(df, v), hn::DupOdd(table));  // b·s, a·s
    hn::StoreU(hn::OddEven(hn::Add(with_cos, with_sin), hn::Sub(with_cos, with_sin)), df,
               vector + i);
  }
#endif
  for (; i + 1 < dim; i += 2) {
    const float c = cos_sin[i], s = cos_sin[i + 1];
    const float a = vector[i], b = vector[i + 1];
    vector[i] = a * c - b * s;
    vector[i + 1] = a * s + b * c;
  }
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {

HWY_EXPORT(ApplyRopeImpl);

void RopePairwise(float* vector, int64_t dim, int64_t position, const float* inv_freq,
                  float attention_factor) {
  for (int64_t i = 0; i < dim / 2; ++i) {
    // The angle in f32 as HF computes it: position (as float) times the f32 frequency.
    float angle = static_cast<float>(position) * inv_freq[i];
    float c = std::cos(angle) * attention_factor, s = std::sin(angle) * attention_factor;
    float a = vector[2 * i], b = vector[2 * i + 1];
    vector[2 * i] = a * c - b * s;
    vector[2 * i + 1] = a * s + b * c;
  }
}

void RopeTable(int64_t dim, int64_t position, const float* inv_freq, float attention_factor,
               float* cos_sin) {
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    cos_sin[2 * i] = std::cos(angle) * attention_factor;
    cos_sin[2 * i + 1] = std::sin(angle) * attention_factor;
  }
}

void ApplyRope(float* vector, int64_t dim, const float* cos_sin) {
  HWY_DYNAMIC_DISPATCH(ApplyRopeImpl)(vector, dim, cos_sin);
}

}  // namespace sy::kernels
#endif  // HWY_ONCE
