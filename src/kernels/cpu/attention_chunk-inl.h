// Flash-attention steps over one chunk of keys, shared by the absorbed MLA decode kernel
// (mla_decode.cc: a group is several heads of one token, keys and values are latent rows) and
// the expanded prefill kernel (mla_attention.cc: a group is several tokens of one head, keys are
// k_nope|k_pe and values v). Per query: scores against the chunk's transposed keys, the online
// softmax update, then o = o · correction + Σ_j p_j · value_j. Each query's arithmetic is the
// same whatever queries share its group, so a row's bits never depend on how it was batched.
//
// Highway's per-target re-inclusion: this header is included once per target by files that use
// hwy/foreach_target.h, inside no namespace, after hwy/highway.h.
#if defined(SY_KERNELS_CPU_ATTENTION_CHUNK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SY_KERNELS_CPU_ATTENTION_CHUNK_INL_H_
#undef SY_KERNELS_CPU_ATTENTION_CHUNK_INL_H_
#else
#define SY_KERNELS_CPU_ATTENTION_CHUNK_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Keys per step: two vectors, and at least 16, so that a chunk's f32 rows and their transpose
// (2 × 36 KiB at 16 keys of 576 dims) stay near L1 for every group that reads them; at 32 keys
// both loops read them from L2 (docs/benchmarks.md: this chunking and the changes beside it took
// q1 decode over 5,000 keys from 84 to 95 GFLOP/s on Zen 3).
constexpr int64_t kChunk = HWY_MIN(32, HWY_MAX(16, 2 * static_cast<int64_t>(HWY_LANES(float))));
constexpr size_t kScoreVectors = 2;
constexpr size_t kValueVectors = 3;
constexpr int64_t kGroup = 4;  // queries sharing each loaded key/value vector

using DF = hn::CappedTag<float, 16>;  // kChunk is a multiple of every vector length

// o_g[d, d + kVectors·N) = o_g · correction_g + Σ_j p_gj · value_j for the kGroup queries of a
// group (null outputs: padding queries, whose probabilities are zero). Every loop over queries
// and vectors has a constant count, so the kGroup × kVectors accumulators stay in registers.
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

// o_g = o_g · correction_g + Σ_j p_gj · value_j over all `dims` output dims, three vectors at a
// time (12 chains; with 8, Zen 3 waited on the multiply-add latency: 5–10% slower). `values`:
// [used keys][width], the first `dims` of each row; scores: [kGroup][kChunk] probabilities.
HWY_INLINE void AccumulateGroup(DF df, const float* values, int64_t width, int64_t dims,
                                int64_t used, const float* scores, const float* correction,
                                float* const* o_group) {
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  int64_t d = 0;
  for (; d + static_cast<int64_t>(kValueVectors) * n <= dims; d += kValueVectors * n)
    AccumulateValues<kValueVectors>(df, values + d, width, used, scores, correction, o_group, d);
  for (; d + 2 * n <= dims; d += 2 * n)
    AccumulateValues<2>(df, values + d, width, used, scores, correction, o_group, d);
  for (; d + n <= dims; d += n)
    AccumulateValues<1>(df, values + d, width, used, scores, correction, o_group, d);
  // Fewer dims than a vector. std::fma, not `acc += p · v`: GCC contracts the scalar form into
  // a fused multiply-add in some iterations and vectorizes the products of others, so a term's
  // rounding would depend on the trip count, and a query's bits on the group it sits in.
  for (; d < dims; ++d)
    for (int64_t g = 0; g < kGroup; ++g) {
      if (o_group[g] == nullptr) continue;
      float* o = o_group[g] + d;
      float acc = *o * correction[g];
      for (int64_t j = 0; j < used; ++j)
        acc = std::fma(scores[g * kChunk + j], values[j * width + d], acc);
      *o = acc;
    }
}

// scores[g][j] = scale · (q_first_g · key_j[0, first) + q_second_g · key_j[first, first + second))
// for the kVectors · N keys whose transposed columns start at `columns` (row stride kChunk; the
// two parts' dims follow each other). kGroup × kVectors chains hide the multiply-add latency,
// and every broadcast query element feeds kVectors multiply-adds.
template <size_t kVectors>
HWY_INLINE void ScoreKeys(DF df, const float* columns, int64_t first, int64_t second,
                          const float* const* q_first, const float* const* q_second, float scale,
                          float* scores) {
  const size_t N = hn::Lanes(df);
  hn::Vec<DF> acc[kGroup][kVectors];
#pragma GCC unroll 8
  for (int64_t g = 0; g < kGroup; ++g)
#pragma GCC unroll 4
    for (size_t v = 0; v < kVectors; ++v)
      acc[g][v] = hn::Zero(df);
  const auto pass = [&](const float* const* q, const float* start, int64_t dims) HWY_ATTR {
#pragma GCC unroll 2
    for (int64_t d = 0; d < dims; ++d) {
      hn::Vec<DF> key[kVectors];
#pragma GCC unroll 4
      for (size_t v = 0; v < kVectors; ++v)
        key[v] = hn::LoadU(df, start + d * kChunk + v * N);
#pragma GCC unroll 8
      for (int64_t g = 0; g < kGroup; ++g) {
        const auto qv = hn::Set(df, q[g][d]);
#pragma GCC unroll 4
        for (size_t v = 0; v < kVectors; ++v)
          acc[g][v] = hn::MulAdd(qv, key[v], acc[g][v]);
      }
    }
  };
  pass(q_first, columns, first);
  pass(q_second, columns + first * kChunk, second);
#pragma GCC unroll 8
  for (int64_t g = 0; g < kGroup; ++g)
#pragma GCC unroll 4
    for (size_t v = 0; v < kVectors; ++v)
      hn::StoreU(hn::Mul(acc[g][v], hn::Set(df, scale)), df, scores + g * kChunk + v * N);
}

// Every key of the chunk for the group: scores [kGroup][kChunk] (kChunk is a whole number of
// passes on every target).
HWY_INLINE void ScoreChunk(DF df, const float* columns, int64_t first, int64_t second,
                           const float* const* q_first, const float* const* q_second, float scale,
                           float* scores) {
  static_assert(kChunk % (kScoreVectors * hn::MaxLanes(DF())) == 0);
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j0 = 0; j0 < kChunk; j0 += kScoreVectors * n)
    ScoreKeys<kScoreVectors>(df, columns + j0, first, second, q_first, q_second, scale,
                             scores + j0);
}

// The online softmax of one query over a chunk: s[0, used) become p = exp(s − max), the rest of
// the chunk zero; running max and sum move on. Returns the factor for what was accumulated.
HWY_INLINE float SoftmaxChunk(DF df, float* s, int64_t used, float& running_max,
                              float& running_sum) {
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  float chunk_max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < used; ++j)
    chunk_max = std::max(chunk_max, s[j]);
  const float new_max = std::max(running_max, chunk_max);
  const float correction = std::exp(running_max - new_max);
  float sum = 0;
  for (int64_t j0 = 0; j0 < kChunk; j0 += n) {
    auto p = hn::CallExp(df, hn::Sub(hn::LoadU(df, s + j0), hn::Set(df, new_max)));
    p = hn::IfThenElseZero(hn::FirstN(df, static_cast<size_t>(std::max<int64_t>(0, used - j0))), p);
    hn::StoreU(p, df, s + j0);
    sum += hn::GetLane(hn::SumOfLanes(df, p));
  }
  running_sum = running_sum * correction + sum;
  running_max = new_max;
  return correction;
}

// transposed[d][j] = rows[j · stride + d] for d < dims and the chunk's kChunk keys. Decode of a
// few heads per call (a 16-head model on 2 threads: 8) amortizes this over few heads, so it must
// not be a scalar loop: where vectors are 8 floats it runs as 8 × 8 blocks of
// unpack/shuffle/permute.
HWY_INLINE void TransposeChunk(DF df, const float* rows, int64_t stride, int64_t dims,
                               float* transposed) {
  int64_t d0 = 0;
#if HWY_TARGET == HWY_AVX2
  if (hn::Lanes(df) == 8) {
    const hn::Repartition<double, DF> dd;
    for (; d0 + 8 <= dims; d0 += 8) {
      for (int64_t j0 = 0; j0 < kChunk; j0 += 8) {
        hn::Vec<DF> r[8];
        for (int i = 0; i < 8; ++i)
          r[i] = hn::LoadU(df, rows + (j0 + i) * stride + d0);
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
  for (int64_t d = d0; d < dims; ++d)
    for (int64_t j = 0; j < kChunk; ++j)
      transposed[d * kChunk + j] = rows[j * stride + d];
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SY_KERNELS_CPU_ATTENTION_CHUNK_INL_H_
