// Absorbed MLA decode on a bf16 latent cache with bf16 dot products (VDPBF16PS), for CPUs with
// AVX-512 BF16: the same flash-decoding walk as mla_decode.cc, with
// - scores: heads in lanes; each cached row's bf16 pairs broadcast straight from the cache (no
//   conversion, no transpose) against the queries' pairs, one chain per (key, head);
// - the online softmax in f32, heads in lanes;
// - P·V: latent dims in lanes; two keys' rows interleaved into pairs once per chunk and shared by
//   every head, probabilities rounded to bf16 and broadcast per head.
// Every (token, head) has its own lanes and chains, in key order, so the result of a row does
// not depend on the heads or tokens beside it.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/mla_decode.h"

namespace sy::kernels {

bool MlaDecodeBf16Applies(DType cache_dtype, int64_t latent, int64_t rope) {
  return HasBf16Dot() && (cache_dtype == DType::kBF16 || cache_dtype == DType::kF8E4M3) &&
         latent % 16 == 0 && rope % 2 == 0;
}

namespace {

// bf16 bits of each e4m3 magnitude (codes 0..127) at scale 1; 127 (NaN) a quiet NaN. Exact:
// e4m3 values have at most 4 significant bits and exponents -9..8.
const std::array<uint16_t, 128> kFp8MagnitudeBf16 = [] {
  std::array<uint16_t, 128> table{};
  for (int code = 0; code < 128; ++code)
    table[code] = F32ToBF16(F8E4M3ToF32(static_cast<uint8_t>(code)));
  return table;
}();

}  // namespace

#if defined(__x86_64__)
#define SY_MLA_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,fma")))

namespace {

// Keys per step. Each step's P·V tiles run over its key pairs and then fold into the outputs
// (load, fma, store), and its softmax rescales them: a longer step spreads both over more keys.
// Its buffers (DeepSeek-V3, all 128 heads in one item: 128 KiB of scores, 64 of probabilities, 256
// of interleaved values) sit in L2. Against 32 keys (128 heads, Zen 4, 2 threads, interleaved
// medians): 4 sequences × 5,000 keys 1.21x, one × 2,000 1.30x, 8 × 500 1.25x.
constexpr int64_t kChunk = 256;

// A 64-byte aligned array of vectors (std::vector of __m512 would drop the alignment).
class VectorBuffer {
 public:
  SY_MLA_TARGET __m512i* Get(size_t count) {
    storage_.resize(count * 64 + 64);
    return reinterpret_cast<__m512i*>((reinterpret_cast<uintptr_t>(storage_.data()) + 63) &
                                      ~static_cast<uintptr_t>(63));
  }

 private:
  std::vector<uint8_t> storage_;
};

// e^x for x ≤ 0 (scores minus their running maximum), to ~2e-7 relative: 2^n · p(r) with
// |r| ≤ ln2 / 2 and p the degree-7 Taylor polynomial.
SY_MLA_TARGET inline __m512 ExpNonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

SY_MLA_TARGET inline __m512i Broadcast32(const void* p) {
  int32_t bits;
  std::memcpy(&bits, p, 4);
  return _mm512_set1_epi32(bits);
}

SY_MLA_TARGET inline __m512 Dot(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
}

// (a_l, b_l) pairs from 16 values of a (low half) and 16 of b (high half).
SY_MLA_TARGET inline __m512i InterleaveHalves(__m512i both) {
  const __m512i index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(index, both);
}

// scores[j][g] for kKeys keys from key j0 and kGroups head groups from g0.
template <int kKeys, int kGroups>
SY_MLA_TARGET void ScoreTile(const uint8_t* const* rows, int64_t pairs, const __m512i* q,
                             int64_t groups, int64_t g0, float scale, __m512* scores) {
  __m512 acc[kKeys][kGroups];
  for (int j = 0; j < kKeys; ++j)
    for (int g = 0; g < kGroups; ++g)
      acc[j][g] = _mm512_setzero_ps();
  for (int64_t i = 0; i < pairs; ++i) {
    __m512i qv[kGroups];
    for (int g = 0; g < kGroups; ++g)
      qv[g] = _mm512_load_si512(q + i * groups + g0 + g);
    for (int j = 0; j < kKeys; ++j) {
      const __m512i k = Broadcast32(rows[j] + 4 * i);
      for (int g = 0; g < kGroups; ++g)
        acc[j][g] = Dot(acc[j][g], k, qv[g]);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int j = 0; j < kKeys; ++j)
    for (int g = 0; g < kGroups; ++g)
      scores[j * groups + g0 + g] = _mm512_mul_ps(acc[j][g], s);
}

using ScoreTileFn = void (*)(const uint8_t* const*, int64_t, const __m512i*, int64_t, int64_t,
                             float, __m512*);
template <int kKeys>
constexpr ScoreTileFn kScoreTiles[5] = {nullptr, ScoreTile<kKeys, 1>, ScoreTile<kKeys, 2>,
                                        ScoreTile<kKeys, 3>, ScoreTile<kKeys, 4>};
constexpr const ScoreTileFn* kScoreTable[9] = {nullptr,        kScoreTiles<1>, kScoreTiles<2>,
                                               kScoreTiles<3>, kScoreTiles<4>, kScoreTiles<5>,
                                               kScoreTiles<6>, kScoreTiles<7>, kScoreTiles<8>};

// Keys per score tile for ng head groups: enough (key, group) chains to cover the dot's latency
// (about 5-6 cycles at one or two a cycle). One or two groups (16 or 32 heads in a block: every
// decode step of a model with few heads) took four keys, four chains, latency-bound: 8 heads
// over 1,000 keys took 100 µs on one Zen 4 thread, 83 with eight keys a tile.
constexpr int64_t ScoreTileKeys(int64_t ng) {
  return ng <= 2 ? 8 : 4;
}

// o[h][d] = o[h][d]·correction[h] + Σ_pairs p·v for kHeads heads and kDims dim vectors.
template <int kHeads, int kDims>
SY_MLA_TARGET void ValueTile(const __m512i* values, int64_t dim_vectors, int64_t d0,
                             const uint32_t* const* probs, int64_t pair_stride, int64_t pairs,
                             const float* correction, float* const* out) {
  __m512 acc[kHeads][kDims];
  for (int h = 0; h < kHeads; ++h)
    for (int d = 0; d < kDims; ++d)
      acc[h][d] = _mm512_setzero_ps();
  for (int64_t jj = 0; jj < pairs; ++jj) {
    __m512i v[kDims];
    for (int d = 0; d < kDims; ++d)
      v[d] = _mm512_load_si512(values + jj * dim_vectors + d0 + d);
    for (int h = 0; h < kHeads; ++h) {
      const __m512i p = _mm512_set1_epi32(static_cast<int32_t>(probs[h][jj * pair_stride]));
      for (int d = 0; d < kDims; ++d)
        acc[h][d] = Dot(acc[h][d], p, v[d]);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    const __m512 c = _mm512_set1_ps(correction[h]);
    for (int d = 0; d < kDims; ++d) {
      float* o = out[h] + (d0 + d) * 16;
      _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_loadu_ps(o), c, acc[h][d]));
    }
  }
}

using ValueTileFn = void (*)(const __m512i*, int64_t, int64_t, const uint32_t* const*, int64_t,
                             int64_t, const float*, float* const*);
template <int kHeads>
constexpr ValueTileFn kValueTiles[5] = {nullptr, ValueTile<kHeads, 1>, ValueTile<kHeads, 2>,
                                        ValueTile<kHeads, 3>, ValueTile<kHeads, 4>};
constexpr const ValueTileFn* kValueTable[5] = {nullptr, kValueTiles<1>, kValueTiles<2>,
                                               kValueTiles<3>, kValueTiles<4>};

// An fp8 row's first `width` values as bf16 (latent_row.h), 32 codes at a time: each magnitude
// looked up in the table above (four registers, two VPERMI2W and a blend on bit 6), the block's
// power of two added to the exponent field of every finite non-zero value, the sign put back.
// Exact, and some three times fewer instructions than widening through f32 (the staging was a
// fifth of the kernel's time at 128 heads). Rows are staged once per chunk and shared by every
// head and token of the call.
SY_MLA_TARGET void StageFp8Row(const LatentRowLayout& layout, const uint8_t* row, int64_t width,
                               uint16_t* out) {
  const __m512i t0 = _mm512_loadu_si512(kFp8MagnitudeBf16.data());
  const __m512i t1 = _mm512_loadu_si512(kFp8MagnitudeBf16.data() + 32);
  const __m512i t2 = _mm512_loadu_si512(kFp8MagnitudeBf16.data() + 64);
  const __m512i t3 = _mm512_loadu_si512(kFp8MagnitudeBf16.data() + 96);
  const __m512i magnitude_mask = _mm512_set1_epi16(0x7f), high_bit = _mm512_set1_epi16(0x40);
  const __m512i sign_mask = _mm512_set1_epi16(0x80);
  const int64_t latent = layout.quantized;  // a multiple of 16 (MlaDecodeBf16Applies)
  for (int64_t d = 0; d < latent; d += 32) {
    // 32 codes (16 for a last half step) never straddle a scale block: 32 divides 128.
    const __mmask32 lanes = latent - d >= 32 ? ~__mmask32{0} : __mmask32{0xffff};
    const int exponent = static_cast<int8_t>(row[latent + d / LatentRowLayout::kScaleBlock]);
    const __m512i code = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(lanes, row + d));
    const __m512i magnitude = _mm512_and_si512(code, magnitude_mask);
    const __m512i low = _mm512_permutex2var_epi16(t0, magnitude, t1);
    const __m512i high = _mm512_permutex2var_epi16(t2, magnitude, t3);
    __m512i value = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(magnitude, high_bit), low, high);
    const __mmask32 scaled = _mm512_cmpneq_epi16_mask(magnitude, _mm512_setzero_si512()) &
                             _mm512_cmpneq_epi16_mask(magnitude, magnitude_mask);
    value = _mm512_mask_add_epi16(value, scaled, value,
                                  _mm512_set1_epi16(static_cast<int16_t>(exponent * 128)));
    value = _mm512_or_si512(value, _mm512_slli_epi16(_mm512_and_si512(code, sign_mask), 8));
    _mm512_mask_storeu_epi16(out + d, lanes, value);
  }
  std::memcpy(out + latent, layout.Plain(row, latent), static_cast<size_t>(width - latent) * 2);
}

}  // namespace

SY_MLA_TARGET void MlaDecodeAttentionBf16(const float* q_latent, const float* q_pe, int64_t tokens,
                                          const int64_t* positions, const LatentPages& cache,
                                          int64_t keys, int64_t heads, int64_t head_begin,
                                          int64_t head_end, int64_t latent, int64_t rope,
                                          float scale, float* o_latent) {
  const int64_t width = latent + rope, pairs = width / 2, count_heads = head_end - head_begin;
  const int64_t groups = (count_heads + 15) / 16, dim_vectors = latent / 16;
  thread_local VectorBuffer q_buffer, score_buffer, prob_buffer, value_buffer;
  // Queries as bf16 pairs, heads in lanes: q[t][i][g] lane l = head head_begin + 16g + l.
  __m512i* q = q_buffer.Get(static_cast<size_t>(tokens * pairs * groups));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < pairs; ++i)
      for (int64_t g = 0; g < groups; ++g) {
        alignas(64) float first[16] = {}, second[16] = {};
        for (int64_t l = 0; l < 16 && 16 * g + l < count_heads; ++l) {
          const int64_t h = head_begin + 16 * g + l;
          for (int half = 0; half < 2; ++half) {
            const int64_t d = 2 * i + half;
            const float value = d < latent ? q_latent[(t * heads + h) * latent + d]
                                           : q_pe[(t * heads + h) * rope + d - latent];
            (half == 0 ? first : second)[l] = value;
          }
        }
        const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_load_ps(second), _mm512_load_ps(first));
        q[(t * pairs + i) * groups + g] = InterleaveHalves(reinterpret_cast<const __m512i&>(both));
      }
  __m512* scores =
      reinterpret_cast<__m512*>(score_buffer.Get(static_cast<size_t>(kChunk * groups)));
  __m512i* probs = prob_buffer.Get(static_cast<size_t>(kChunk / 2 * groups));
  __m512i* values = value_buffer.Get(static_cast<size_t>(kChunk / 2 * dim_vectors));
  std::vector<float> running_max(static_cast<size_t>(tokens * groups * 16),
                                 -std::numeric_limits<float>::infinity());
  std::vector<float> running_sum(running_max.size(), 0.0f);
  std::vector<float> correction(16 * static_cast<size_t>(groups));
  const int64_t last_visible =
      BeginMlaDecode(positions, tokens, keys, heads, head_begin, head_end, latent, o_latent);
  // An fp8 cache's rows are widened to bf16 a chunk at a time (exactly) and read from there.
  const bool fp8 = cache.layout.dtype == DType::kF8E4M3;
  const int64_t row_bytes = cache.layout.BytesThrough(width);
  thread_local std::vector<uint16_t> staged;
  if (fp8) staged.resize(static_cast<size_t>(kChunk * width));

  for (int64_t start = 0; start < last_visible; start += kChunk) {
    const int64_t count = std::min(kChunk, last_visible - start);
    const uint8_t* rows[kChunk];
    for (int64_t j = 0; j < count; ++j) {
      rows[j] = cache.Row(start + j);
      if (fp8) {
        uint16_t* to = staged.data() + j * width;
        StageFp8Row(cache.layout, rows[j], width, to);
        rows[j] = reinterpret_cast<const uint8_t*>(to);
      }
    }
    // The next chunk's rows on their way while this one computes, as the f32 kernel does: under
    // DSA the keys are a query's chosen rows, scattered over the pages, which the hardware
    // prefetcher does not follow (2,048 chosen keys took 1.6x the time of 2,048 in a row).
    const int64_t next_count = std::min(kChunk, last_visible - start - count);
    for (int64_t j = 0; j < next_count; ++j) {
      const char* next = reinterpret_cast<const char*>(cache.Row(start + count + j));
      for (int64_t b = 0; b < row_bytes; b += 64)
        __builtin_prefetch(next + b);
    }
    // Values: rows 2jj and 2jj + 1 interleaved into pairs, latent dims in lanes.
    const int64_t count_pairs = (count + 1) / 2;
    for (int64_t jj = 0; jj < count_pairs; ++jj) {
      const uint8_t* a = rows[2 * jj];
      const uint8_t* b = 2 * jj + 1 < count ? rows[2 * jj + 1] : nullptr;
      for (int64_t k = 0; k < dim_vectors; ++k) {
        const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32 * k));
        const __m256i high = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 * k))
                               : _mm256_setzero_si256();
        values[jj * dim_vectors + k] =
            InterleaveHalves(_mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1));
      }
    }
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t visible = std::min(keys, positions[t] + 1) - start;
      if (visible <= 0) continue;
      const int64_t used = std::min(count, visible);
      const __m512i* qt = q + t * pairs * groups;
      for (int64_t g0 = 0; g0 < groups; g0 += 4) {
        const int64_t ng = std::min<int64_t>(4, groups - g0), tile_keys = ScoreTileKeys(ng);
        for (int64_t j0 = 0; j0 < used; j0 += tile_keys) {
          const int64_t nk = std::min<int64_t>(tile_keys, used - j0);
          kScoreTable[nk][ng](rows + j0, pairs, qt, groups, g0, scale, scores + j0 * groups);
        }
      }
      // Online softmax, heads in lanes.
      const int64_t used_pairs = (used + 1) / 2;
      for (int64_t g = 0; g < groups; ++g) {
        float* run_max = running_max.data() + (t * groups + g) * 16;
        float* run_sum = running_sum.data() + (t * groups + g) * 16;
        __m512 chunk_max = scores[g];
        for (int64_t j = 1; j < used; ++j)
          chunk_max = _mm512_max_ps(chunk_max, scores[j * groups + g]);
        const __m512 old_max = _mm512_loadu_ps(run_max);
        const __m512 new_max = _mm512_max_ps(old_max, chunk_max);
        const __m512 c = ExpNonPositive(_mm512_sub_ps(old_max, new_max));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < used; ++j) {
          const __m512 p = ExpNonPositive(_mm512_sub_ps(scores[j * groups + g], new_max));
          scores[j * groups + g] = p;
          sum = _mm512_add_ps(sum, p);
        }
        if (used % 2 == 1) scores[used * groups + g] = _mm512_setzero_ps();
        _mm512_storeu_ps(run_sum, _mm512_fmadd_ps(_mm512_loadu_ps(run_sum), c, sum));
        _mm512_storeu_ps(run_max, new_max);
        _mm512_storeu_ps(correction.data() + 16 * g, c);
        for (int64_t jj = 0; jj < used_pairs; ++jj) {
          const __m512bh both =
              _mm512_cvtne2ps_pbh(scores[(2 * jj + 1) * groups + g], scores[2 * jj * groups + g]);
          probs[jj * groups + g] = InterleaveHalves(reinterpret_cast<const __m512i&>(both));
        }
      }
      // o = o·correction + P·V, four heads by four dim vectors at a time.
      for (int64_t h0 = 0; h0 < count_heads; h0 += 4) {
        const int64_t nh = std::min<int64_t>(4, count_heads - h0);
        const uint32_t* head_probs[4];
        float* out[4];
        float head_correction[4];
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t local = h0 + h;
          head_probs[h] = reinterpret_cast<const uint32_t*>(probs + local / 16) + local % 16;
          out[h] = o_latent + (t * heads + head_begin + local) * latent;
          head_correction[h] = correction[local];
        }
        for (int64_t d0 = 0; d0 < dim_vectors; d0 += 4) {
          const int64_t nd = std::min<int64_t>(4, dim_vectors - d0);
          kValueTable[nh][nd](values, dim_vectors, d0, head_probs, groups * 16, used_pairs,
                              head_correction, out);
        }
      }
    }
  }
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = head_begin; h < head_end; ++h) {
      const int64_t local = h - head_begin;
      const float total = running_sum[(t * groups + local / 16) * 16 + local % 16];
      const float inverse = total > 0 ? 1.0f / total : 0.0f;
      float* o = o_latent + (t * heads + h) * latent;
      for (int64_t d = 0; d < latent; ++d)
        o[d] *= inverse;
    }
}

#else
void MlaDecodeAttentionBf16(const float*, const float*, int64_t, const int64_t*, const LatentPages&,
                            int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float*) {}
#endif

void StageLatentRowBf16(const LatentRowLayout& layout, const uint8_t* row, int64_t width,
                        uint16_t* out) {
#if defined(__x86_64__)
  if (HasBf16Dot()) return StageFp8Row(layout, row, width, out);
#endif
  // The same bits a value at a time: the magnitude's bf16 at scale 1, the block's exponent added
  // to a finite non-zero one, the sign.
  const int64_t latent = layout.quantized;
  for (int64_t d = 0; d < latent; ++d) {
    const uint8_t code = row[d];
    const int magnitude = code & 0x7f;
    uint16_t value = kFp8MagnitudeBf16[static_cast<size_t>(magnitude)];
    if (magnitude != 0 && magnitude != 0x7f)
      value = static_cast<uint16_t>(
          value + static_cast<int8_t>(row[latent + d / LatentRowLayout::kScaleBlock]) * 128);
    out[d] = static_cast<uint16_t>(value | ((code & 0x80) << 8));
  }
  std::memcpy(out + latent, layout.Plain(row, latent), static_cast<size_t>(width - latent) * 2);
}

}  // namespace sy::kernels
