#include "kernels/cpu/mla_decode.h"

#include "kernels/cpu/amx_kernels.h"

#include "kernels/cpu/fast_linear.h"

#include <hwy/cache_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

// Highway's per-target re-inclusion needs this order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/mla_decode.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "kernels/cpu/attention_chunk-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void MlaDecodeAttentionImpl(const float* q_latent, const float* q_pe, int64_t tokens,
                            const int64_t* positions, const LatentPages& cache, int64_t keys,
                            int64_t heads, int64_t head_begin, int64_t head_end, int64_t latent,
                            int64_t rope, float scale, float* o_latent) {
  const DF df;
  const int64_t width = latent + rope;
  const int64_t items = tokens * (head_end - head_begin);
  // Per (token, head): running max, running sum, and the output accumulator.
  std::vector<float> running_max(static_cast<size_t>(items),
                                 -std::numeric_limits<float>::infinity());
  std::vector<float> running_sum(static_cast<size_t>(items), 0.0f);
  std::vector<float> rows(static_cast<size_t>(kChunk * width));        // chunk rows, f32, key-major
  std::vector<float> transposed(static_cast<size_t>(width * kChunk));  // [dim][key] for scores
  std::vector<float> scores(kChunk * kGroup);
  const int64_t last_visible =
      BeginMlaDecode(positions, tokens, keys, heads, head_begin, head_end, latent, o_latent);

  for (int64_t start = 0; start < last_visible; start += kChunk) {
    const int64_t count = std::min(kChunk, last_visible - start);
    // Decode the chunk's rows once for every head of this block.
    for (int64_t j = 0; j < count; ++j)
      DecodeLatentRow(cache.layout, cache.Row(start + j), 0, width, rows.data() + j * width);
    // The next chunk's rows come from memory (or L3) while this one computes: converting them
    // waited on the loads otherwise (8–10% of a 5,000-key decode on Zen 3).
    const int64_t next_count = std::min(kChunk, last_visible - start - count);
    const int64_t row_bytes = cache.layout.BytesThrough(width);
    for (int64_t j = 0; j < next_count; ++j) {
      const uint8_t* source = cache.Row(start + count + j);
      for (int64_t b = 0; b < row_bytes; b += 64)
        hwy::Prefetch(source + b);
    }
    if (count < kChunk)  // keys past the end score zero
      std::fill(rows.begin() + count * width, rows.end(), 0.0f);
    TransposeChunk(df, rows.data(), width, width, transposed.data());

    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t visible =
          std::min(keys, positions[t] + 1) - start;  // keys of this chunk t sees
      if (visible <= 0) continue;
      const int64_t used = std::min(count, visible);
      // Heads in groups of kGroup: every key or value vector loaded feeds kGroup heads.
      for (int64_t h0 = head_begin; h0 < head_end; h0 += kGroup) {
        const int64_t group = std::min<int64_t>(kGroup, head_end - h0);
        const float* ql[kGroup];
        const float* qp[kGroup];
        for (int64_t g = 0; g < kGroup; ++g) {
          const int64_t h = h0 + std::min(g, group - 1);  // pad with the last head
          ql[g] = q_latent + (t * heads + h) * latent;
          qp[g] = q_pe + (t * heads + h) * rope;
        }
        // scores[g][j] = q_g · row_j, keys in lanes.
        ScoreChunk(df, transposed.data(), latent, rope, ql, qp, scale, scores.data());
        // Online softmax per head: p = exp(s − max); rescale what was accumulated so far.
        float correction[kGroup];
        for (int64_t g = 0; g < group; ++g) {
          const int64_t item = t * (head_end - head_begin) + (h0 + g - head_begin);
          correction[g] = SoftmaxChunk(df, scores.data() + g * kChunk, used, running_max[item],
                                       running_sum[item]);
        }
        for (int64_t g = group; g < kGroup; ++g)
          std::fill_n(scores.data() + g * kChunk, kChunk, 0.0f);
        // o_g = o_g · correction_g + Σ_j p_gj · c_j, latent dims in lanes.
        float* o_group[kGroup];
        for (int64_t g = 0; g < kGroup; ++g)
          o_group[g] = g < group ? o_latent + (t * heads + h0 + g) * latent : nullptr;
        AccumulateGroup(df, rows.data(), width, latent, used, scores.data(), correction, o_group);
      }
    }
  }
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = head_begin; h < head_end; ++h) {
      const int64_t item = t * (head_end - head_begin) + (h - head_begin);
      const float inverse = running_sum[item] > 0 ? 1.0f / running_sum[item] : 0.0f;
      float* o = o_latent + (t * heads + h) * latent;
      for (int64_t d = 0; d < latent; ++d)
        o[d] *= inverse;
    }
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {
HWY_EXPORT(MlaDecodeAttentionImpl);

void MlaDecodeAttention(const float* q_latent, const float* q_pe, int64_t tokens,
                        const int64_t* positions, const LatentPages& cache, int64_t keys,
                        int64_t heads, int64_t head_begin, int64_t head_end, int64_t latent,
                        int64_t rope, float softmax_scale, float* o_latent) {
  if (UseAmxMla(cache.layout.dtype, latent, rope)) {
    AmxMlaDecode(ActiveAmxBackend(), q_latent, q_pe, tokens, positions, cache, keys, heads,
                 head_begin, head_end, latent, rope, softmax_scale, o_latent);
    return;
  }
  if (GlobalKernelOptions().bf16_dot && MlaDecodeBf16Applies(cache.layout.dtype, latent, rope)) {
    MlaDecodeAttentionBf16(q_latent, q_pe, tokens, positions, cache, keys, heads, head_begin,
                           head_end, latent, rope, softmax_scale, o_latent);
    return;
  }
  HWY_DYNAMIC_DISPATCH(MlaDecodeAttentionImpl)
  (q_latent, q_pe, tokens, positions, cache, keys, heads, head_begin, head_end, latent, rope,
   softmax_scale, o_latent);
}
}  // namespace sy::kernels
#endif
