#include "kernels/cpu/mla_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/mla_decode.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kChunk = 32;  // keys per step

void MlaDecodeAttentionImpl(const float* q_latent, const float* q_pe, int64_t tokens, const int64_t* positions,
                            const LatentPages& cache, int64_t keys, int64_t heads, int64_t head_begin,
                            int64_t head_end, int64_t latent, int64_t rope, float scale, float* o_latent) {
  const hn::CappedTag<float, kChunk> df;
  const size_t N = hn::Lanes(df);
  const int64_t width = latent + rope;
  const int64_t items = tokens * (head_end - head_begin);
  // Per (token, head): running max, running sum, and the output accumulator.
  std::vector<float> running_max(static_cast<size_t>(items), -std::numeric_limits<float>::infinity());
  std::vector<float> running_sum(static_cast<size_t>(items), 0.0f);
  std::vector<float> rows(static_cast<size_t>(kChunk * width));        // chunk rows, f32, key-major
  std::vector<float> transposed(static_cast<size_t>(width * kChunk));  // [dim][key] for scores
  std::vector<float> scores(kChunk);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = head_begin; h < head_end; ++h)
      std::fill_n(o_latent + (t * heads + h) * latent, latent, 0.0f);
  int64_t last_visible = 0;
  for (int64_t t = 0; t < tokens; ++t) last_visible = std::max(last_visible, std::min(keys, positions[t] + 1));

  for (int64_t start = 0; start < last_visible; start += kChunk) {
    const int64_t count = std::min(kChunk, last_visible - start);
    // Decode the chunk's rows once for every head of this block.
    for (int64_t j = 0; j < count; ++j) {
      const uint8_t* source = cache.Row(start + j);
      float* target = rows.data() + j * width;
      if (cache.dtype == DType::kF32) {
        std::memcpy(target, source, static_cast<size_t>(width) * 4);
      } else {
        for (int64_t d = 0; d < width; ++d) {
          uint16_t bits;
          std::memcpy(&bits, source + 2 * d, 2);
          target[d] = BF16ToF32(bits);
        }
      }
    }
    for (int64_t d = 0; d < width; ++d)
      for (int64_t j = 0; j < kChunk; ++j) transposed[d * kChunk + j] = j < count ? rows[j * width + d] : 0.0f;

    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t visible = std::min(keys, positions[t] + 1) - start;  // keys of this chunk t sees
      if (visible <= 0) continue;
      const int64_t used = std::min(count, visible);
      for (int64_t h = head_begin; h < head_end; ++h) {
        const int64_t item = t * (head_end - head_begin) + (h - head_begin);
        const float* ql = q_latent + (t * heads + h) * latent;
        const float* qp = q_pe + (t * heads + h) * rope;
        // scores[j] = q · row_j over the latent and rope parts, keys in lanes.
        for (int64_t j0 = 0; j0 < kChunk; j0 += static_cast<int64_t>(N)) {
          auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
          int64_t d = 0;
          for (; d + 1 < latent; d += 2) {
            acc0 = hn::MulAdd(hn::Set(df, ql[d]), hn::LoadU(df, transposed.data() + d * kChunk + j0), acc0);
            acc1 = hn::MulAdd(hn::Set(df, ql[d + 1]), hn::LoadU(df, transposed.data() + (d + 1) * kChunk + j0), acc1);
          }
          for (; d < latent; ++d)
            acc0 = hn::MulAdd(hn::Set(df, ql[d]), hn::LoadU(df, transposed.data() + d * kChunk + j0), acc0);
          for (int64_t r = 0; r < rope; ++r)
            acc1 = hn::MulAdd(hn::Set(df, qp[r]), hn::LoadU(df, transposed.data() + (latent + r) * kChunk + j0), acc1);
          hn::StoreU(hn::Mul(hn::Add(acc0, acc1), hn::Set(df, scale)), df, scores.data() + j0);
        }
        float chunk_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < used; ++j) chunk_max = std::max(chunk_max, scores[j]);
        const float new_max = std::max(running_max[item], chunk_max);
        const float correction = std::exp(running_max[item] - new_max);
        float sum = 0;
        for (int64_t j = 0; j < used; ++j) {
          scores[j] = std::exp(scores[j] - new_max);
          sum += scores[j];
        }
        running_sum[item] = running_sum[item] * correction + sum;
        running_max[item] = new_max;
        // o = o · correction + Σ_j p_j · c_j, the latent dims in lanes.
        float* o = o_latent + (t * heads + h) * latent;
        const auto corr = hn::Set(df, correction);
        int64_t d = 0;
        for (; d + static_cast<int64_t>(N) <= latent; d += static_cast<int64_t>(N)) {
          auto acc = hn::Mul(hn::LoadU(df, o + d), corr);
          for (int64_t j = 0; j < used; ++j)
            acc = hn::MulAdd(hn::Set(df, scores[j]), hn::LoadU(df, rows.data() + j * width + d), acc);
          hn::StoreU(acc, df, o + d);
        }
        for (; d < latent; ++d) {
          float acc = o[d] * correction;
          for (int64_t j = 0; j < used; ++j) acc += scores[j] * rows[j * width + d];
          o[d] = acc;
        }
      }
    }
  }
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = head_begin; h < head_end; ++h) {
      const int64_t item = t * (head_end - head_begin) + (h - head_begin);
      const float inverse = running_sum[item] > 0 ? 1.0f / running_sum[item] : 0.0f;
      float* o = o_latent + (t * heads + h) * latent;
      for (int64_t d = 0; d < latent; ++d) o[d] *= inverse;
    }
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {
HWY_EXPORT(MlaDecodeAttentionImpl);

void MlaDecodeAttention(const float* q_latent, const float* q_pe, int64_t tokens, const int64_t* positions,
                        const LatentPages& cache, int64_t keys, int64_t heads, int64_t head_begin, int64_t head_end,
                        int64_t latent, int64_t rope, float softmax_scale, float* o_latent) {
  HWY_DYNAMIC_DISPATCH(MlaDecodeAttentionImpl)(q_latent, q_pe, tokens, positions, cache, keys, heads, head_begin,
                                               head_end, latent, rope, softmax_scale, o_latent);
}
}  // namespace sy::kernels
#endif
