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
#include "hwy/contrib/math/math-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Keys per step: two vectors, and at least 16, so that a chunk's f32 rows and their transpose
// (2 × 36 KiB at 16 keys of 576 dims) stay near L1 for every head group that reads them; at 32
// keys both loops read them from L2 (docs/benchmarks.md: this chunking and the changes beside it
// took q1 decode over 5,000 keys from 84 to 95 GFLOP/s on Zen 3).
constexpr int64_t kChunk = HWY_MIN(32, HWY_MAX(16, 2 * static_cast<int64_t>(HWY_LANES(float))));
constexpr size_t kScoreVectors = 2;
constexpr size_t kValueVectors = 3;
constexpr int64_t kGroup = 4;  // heads sharing each loaded key/value vector

using DF = hn::CappedTag<float, 16>;  // kChunk is a multiple of every vector length

// o_g[d, d + kVectors·N) = o_g · correction_g + Σ_j p_gj · value_j for the kGroup heads of a group
// (null outputs: padding heads, whose probabilities are zero). Every loop over heads and vectors
// has a constant count, so the kGroup × kVectors accumulators stay in registers.
template <size_t kVectors>
HWY_INLINE void AccumulateValues(DF df, const float* values, int64_t width, int64_t used,
                                 const float* scores, const float* correction,
                                 float* const* o_group, int64_t d) {
  const size_t N = hn::Lanes(df);
  hn::Vec<DF> o[kGroup][kVectors];
#pragma GCC unroll 8
  for (int64_t g = 0; g < kGroup; ++g)
#pragma GCC unroll 4
    for (size_t v = 0; v < kVectors; ++v)
      o[g][v] = o_group[g] == nullptr
                    ? hn::Zero(df)
                    : hn::Mul(hn::LoadU(df, o_group[g] + d + v * N), hn::Set(df, correction[g]));
#pragma GCC unroll 2
  for (int64_t j = 0; j < used; ++j) {
    hn::Vec<DF> value[kVectors];
#pragma GCC unroll 4
    for (size_t v = 0; v < kVectors; ++v)
      value[v] = hn::LoadU(df, values + j * width + v * N);
#pragma GCC unroll 8
    for (int64_t g = 0; g < kGroup; ++g) {
      const auto p = hn::Set(df, scores[g * kChunk + j]);
#pragma GCC unroll 4
      for (size_t v = 0; v < kVectors; ++v)
        o[g][v] = hn::MulAdd(p, value[v], o[g][v]);
    }
  }
#pragma GCC unroll 8
  for (int64_t g = 0; g < kGroup; ++g)
    if (o_group[g] != nullptr)
#pragma GCC unroll 4
      for (size_t v = 0; v < kVectors; ++v)
        hn::StoreU(o[g][v], df, o_group[g] + d + v * N);
}

// scores[g][j] = scale · (q_latent_g · key_j + q_pe_g · rope_j) for the kVectors · N keys whose
// transposed columns start at `columns` (row stride kChunk). kGroup × kVectors chains hide the
// multiply-add latency, and every broadcast query element feeds kVectors multiply-adds.
template <size_t kVectors>
HWY_INLINE void ScoreKeys(DF df, const float* columns, int64_t latent, int64_t rope,
                          const float* const* q_latent, const float* const* q_pe, float scale,
                          float* scores) {
  const size_t N = hn::Lanes(df);
  hn::Vec<DF> acc[kGroup][kVectors];
#pragma GCC unroll 8
  for (int64_t g = 0; g < kGroup; ++g)
#pragma GCC unroll 4
    for (size_t v = 0; v < kVectors; ++v)
      acc[g][v] = hn::Zero(df);
  const auto pass = [&](const float* const* q, const float* first, int64_t dims) HWY_ATTR {
#pragma GCC unroll 2
    for (int64_t d = 0; d < dims; ++d) {
      hn::Vec<DF> key[kVectors];
#pragma GCC unroll 4
      for (size_t v = 0; v < kVectors; ++v)
        key[v] = hn::LoadU(df, first + d * kChunk + v * N);
#pragma GCC unroll 8
      for (int64_t g = 0; g < kGroup; ++g) {
        const auto qv = hn::Set(df, q[g][d]);
#pragma GCC unroll 4
        for (size_t v = 0; v < kVectors; ++v)
          acc[g][v] = hn::MulAdd(qv, key[v], acc[g][v]);
      }
    }
  };
  pass(q_latent, columns, latent);
  pass(q_pe, columns + latent * kChunk, rope);
#pragma GCC unroll 8
  for (int64_t g = 0; g < kGroup; ++g)
#pragma GCC unroll 4
    for (size_t v = 0; v < kVectors; ++v)
      hn::StoreU(hn::Mul(acc[g][v], hn::Set(df, scale)), df, scores + g * kChunk + v * N);
}

// transposed[d][j] = rows[j][d] for the chunk's kChunk keys. Decode of a few heads per call (a
// 16-head model on 2 threads: 8) amortizes this over few heads, so it must not be a scalar
// loop: where vectors are 8 floats it runs as 8 × 8 blocks of unpack/shuffle/permute.
HWY_INLINE void TransposeChunk(DF df, const float* rows, int64_t width, float* transposed) {
  int64_t d0 = 0;
#if HWY_TARGET == HWY_AVX2
  if (hn::Lanes(df) == 8) {
    const hn::Repartition<double, DF> dd;
    for (; d0 + 8 <= width; d0 += 8) {
      for (int64_t j0 = 0; j0 < kChunk; j0 += 8) {
        hn::Vec<DF> r[8];
        for (int i = 0; i < 8; ++i)
          r[i] = hn::LoadU(df, rows + (j0 + i) * width + d0);
        // Within each 128-bit half: pairs of rows interleaved, then pairs of pairs.
        hn::Vec<DF> t[8];
        for (int i = 0; i < 4; ++i) {
          t[2 * i] = hn::InterleaveLower(df, r[2 * i], r[2 * i + 1]);
          t[2 * i + 1] = hn::InterleaveUpper(df, r[2 * i], r[2 * i + 1]);
        }
        hn::Vec<DF> u[8];
        for (int i = 0; i < 2; ++i)
          for (int k = 0; k < 2; ++k) {
            const auto a = hn::BitCast(dd, t[4 * i + k]), b = hn::BitCast(dd, t[4 * i + k + 2]);
            u[4 * i + 2 * k] = hn::BitCast(df, hn::InterleaveLower(dd, a, b));
            u[4 * i + 2 * k + 1] = hn::BitCast(df, hn::InterleaveUpper(dd, a, b));
          }
        // Columns d0 + 0..3 sit in the lower halves of u[0..3] (rows 0..3) and u[4..7] (rows
        // 4..7); columns d0 + 4..7 in the upper halves.
        for (int i = 0; i < 4; ++i) {
          hn::StoreU(hn::ConcatLowerLower(df, u[4 + i], u[i]), df,
                     transposed + (d0 + i) * kChunk + j0);
          hn::StoreU(hn::ConcatUpperUpper(df, u[4 + i], u[i]), df,
                     transposed + (d0 + 4 + i) * kChunk + j0);
        }
      }
    }
  }
#endif
  for (int64_t d = d0; d < width; ++d)
    for (int64_t j = 0; j < kChunk; ++j)
      transposed[d * kChunk + j] = rows[j * width + d];
}

void MlaDecodeAttentionImpl(const float* q_latent, const float* q_pe, int64_t tokens,
                            const int64_t* positions, const LatentPages& cache, int64_t keys,
                            int64_t heads, int64_t head_begin, int64_t head_end, int64_t latent,
                            int64_t rope, float scale, float* o_latent) {
  const DF df;
  const size_t N = hn::Lanes(df);
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
    for (int64_t j = 0; j < count; ++j) {
      const uint8_t* source = cache.Row(start + j);
      float* target = rows.data() + j * width;
      if (cache.dtype == DType::kF32) {
        std::memcpy(target, source, static_cast<size_t>(width) * 4);
      } else {  // bf16: the f32 with the same top half
        const hn::Rebind<uint16_t, DF> du16;
        const hn::Rebind<uint32_t, DF> du32;
        const uint16_t* halves = reinterpret_cast<const uint16_t*>(source);
        int64_t d = 0;
        for (; d + static_cast<int64_t>(N) <= width; d += static_cast<int64_t>(N))
          hn::StoreU(
              hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, halves + d)))),
              df, target + d);
        for (; d < width; ++d) {
          uint16_t bits;
          std::memcpy(&bits, source + 2 * d, 2);
          target[d] = BF16ToF32(bits);
        }
      }
    }
    // The next chunk's rows come from memory (or L3) while this one computes: converting them
    // waited on the loads otherwise (8–10% of a 5,000-key decode on Zen 3).
    const int64_t next_count = std::min(kChunk, last_visible - start - count);
    const int64_t row_bytes = width * static_cast<int64_t>(DTypeSize(cache.dtype));
    for (int64_t j = 0; j < next_count; ++j) {
      const uint8_t* source = cache.Row(start + count + j);
      for (int64_t b = 0; b < row_bytes; b += 64)
        hwy::Prefetch(source + b);
    }
    if (count < kChunk)  // keys past the end score zero
      std::fill(rows.begin() + count * width, rows.end(), 0.0f);
    TransposeChunk(df, rows.data(), width, transposed.data());

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
        // scores[g][j] = q_g · row_j, keys in lanes, kScoreVectors key vectors per pass (kChunk
        // is a whole number of passes on every target).
        static_assert(kChunk % (kScoreVectors * hn::MaxLanes(DF())) == 0);
        const int64_t n = static_cast<int64_t>(N);
        for (int64_t j0 = 0; j0 < kChunk; j0 += kScoreVectors * n)
          ScoreKeys<kScoreVectors>(df, transposed.data() + j0, latent, rope, ql, qp, scale,
                                   scores.data() + j0);
        // Online softmax per head: p = exp(s − max); rescale what was accumulated so far.
        float correction[kGroup];
        for (int64_t g = 0; g < group; ++g) {
          const int64_t item = t * (head_end - head_begin) + (h0 + g - head_begin);
          float* s = scores.data() + g * kChunk;
          float chunk_max = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < used; ++j)
            chunk_max = std::max(chunk_max, s[j]);
          const float new_max = std::max(running_max[item], chunk_max);
          correction[g] = std::exp(running_max[item] - new_max);
          float sum = 0;
          for (int64_t j0 = 0; j0 < kChunk; j0 += static_cast<int64_t>(N)) {
            auto p = hn::CallExp(df, hn::Sub(hn::LoadU(df, s + j0), hn::Set(df, new_max)));
            p = hn::IfThenElseZero(
                hn::FirstN(df, static_cast<size_t>(std::max<int64_t>(0, used - j0))), p);
            hn::StoreU(p, df, s + j0);
            sum += hn::GetLane(hn::SumOfLanes(df, p));
          }
          running_sum[item] = running_sum[item] * correction[g] + sum;
          running_max[item] = new_max;
        }
        for (int64_t g = group; g < kGroup; ++g)
          std::fill_n(scores.data() + g * kChunk, kChunk, 0.0f);
        // o_g = o_g · correction_g + Σ_j p_gj · c_j, latent dims in lanes, three vectors
        // at a time (12 chains; with 8, Zen 3 waited on the multiply-add latency: 5–10% slower).
        float* o_group[kGroup];
        for (int64_t g = 0; g < kGroup; ++g)
          o_group[g] = g < group ? o_latent + (t * heads + h0 + g) * latent : nullptr;
        int64_t d = 0;
        for (; d + kValueVectors * n <= latent; d += kValueVectors * n)
          AccumulateValues<kValueVectors>(df, rows.data() + d, width, used, scores.data(),
                                          correction, o_group, d);
        for (; d + 2 * n <= latent; d += 2 * n)
          AccumulateValues<2>(df, rows.data() + d, width, used, scores.data(), correction, o_group,
                              d);
        for (; d + n <= latent; d += n)
          AccumulateValues<1>(df, rows.data() + d, width, used, scores.data(), correction, o_group,
                              d);
        for (; d < latent; ++d)  // fewer dims than a vector
          for (int64_t g = 0; g < group; ++g) {
            float* o = o_latent + (t * heads + h0 + g) * latent + d;
            float acc = *o * correction[g];
            for (int64_t j = 0; j < used; ++j)
              acc += scores[g * kChunk + j] * rows[j * width + d];
            *o = acc;
          }
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
  if (UseAmxMla(cache.dtype, latent, rope)) {
    AmxMlaDecode(ActiveAmxBackend(), q_latent, q_pe, tokens, positions, cache, keys, heads,
                 head_begin, head_end, latent, rope, softmax_scale, o_latent);
    return;
  }
  if (GlobalKernelOptions().bf16_dot && MlaDecodeBf16Applies(cache.dtype, latent, rope)) {
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
