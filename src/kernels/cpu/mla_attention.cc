#include "kernels/cpu/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/linear.h"

// Highway's per-target re-inclusion needs this order.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/mla_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "kernels/cpu/attention_chunk-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace sy::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The expanded form as flash attention. Keys are expanded with kv_b a super-block at a time (one
// product for many keys), then laid out per head and chunk of kChunk keys: keys transposed
// [nope + rope][kChunk] (for the scores, keys in lanes) and values [kChunk][v]. Work items are
// (block of kTokenBlock queries, head): an item's keys and values for one chunk (~10-20 KiB) stay
// in L1 while every group of kGroup queries reads them, where the old loop over (query, head)
// streamed the whole expanded block from L3 for every query (docs/benchmarks.md).
//
// A row's bits depend only on its query and the keys it sees: chunks start at multiples of kChunk
// from key 0 whatever the super-block, expansion rows do not depend on the rows beside them, and
// a query's scores, softmax and sums are the same whichever queries share its group.
void MlaAttendExpandedImpl(const float* q, int64_t tokens, const int64_t* positions,
                           const float* latents, int64_t keys, const Matrix& kv_b, const MlaDims& d,
                           float* out) {
  const DF df;
  constexpr int64_t kTokenBlock = 16;
  const int64_t H = d.heads, qk = d.nope + d.rope, kv_width = d.nope + d.v;
  const int64_t row = d.latent + d.rope, key_dims = d.nope + d.rope;
  // Keys per kv_b product: up to 256, fewer where heads are many, so the expanded block and its
  // layout stay near 8 MiB each (DeepSeek-V3's 128 heads: 64 keys).
  int64_t last = 0;
  for (int64_t t = 0; t < tokens; ++t)
    last = std::max(last, std::min(keys, positions[t] + 1));
  // And no more than the keys seen: chunks start at multiples of kChunk from key 0 whatever the
  // super-block, so its size changes no bit.
  const int64_t super =
      std::min(std::clamp<int64_t>((int64_t{1} << 21) / (H * kv_width) / kChunk * kChunk, kChunk,
                                   256 / kChunk * kChunk),
               std::max<int64_t>(kChunk, (last + kChunk - 1) / kChunk * kChunk));
  const int64_t chunks_per_super = super / kChunk;
  const int64_t chunk_floats = key_dims * kChunk + kChunk * d.v;  // one head's chunk
  const int64_t items = tokens * H;
  std::vector<float> running_max(static_cast<size_t>(items),
                                 -std::numeric_limits<float>::infinity());
  std::vector<float> running_sum(static_cast<size_t>(items), 0.0f);
  // The outputs are zeroed and finally scaled by the threads that attend them, item by item, in
  // the first and last super-blocks' passes: a prompt's are megabytes (16 MB for 2,048 tokens of
  // 16 heads), a few percent of its prefill on one thread while the others wait, and two loops
  // of their own per sequence and layer were 640 more of the pool's waits in a 32 × 64-token
  // prompt.
  if (last == 0) std::fill(out, out + items * d.v, 0.0f);  // no keys: no pass
  // Kept from call to call, never zeroed: every element read is written first (the rows past a
  // super-block's keys are zeroed below). Zero-filled anew, they were megabytes per sequence
  // and layer on one thread (a 32 × 64-token prefill: a few percent). By pointer for the workers.
  thread_local std::vector<float> latent_buffer, kv_buffer, layout_buffer;
  auto at_least = [](std::vector<float>& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
    return v.data();
  };
  float* const latent_only = at_least(latent_buffer, super * d.latent);
  float* const kv = at_least(kv_buffer, super * H * kv_width);
  float* const layout = at_least(layout_buffer, H * chunks_per_super * chunk_floats);

  // (token block, head) items, blocks ordered first, last, second, second to last…, so equal
  // contiguous shares of the list carry equal causal work.
  const int64_t blocks = (tokens + kTokenBlock - 1) / kTokenBlock;
  std::vector<int64_t> block_order;
  for (int64_t lo = 0, hi = blocks; lo < hi; ++lo) {
    block_order.push_back(lo);
    if (lo < --hi) block_order.push_back(hi);
  }

  for (int64_t start = 0; start < last; start += super) {
    const int64_t count = std::min(super, last - start);
    const int64_t chunks = (count + kChunk - 1) / kChunk;
    for (int64_t j = 0; j < count; ++j)
      std::copy_n(latents + (start + j) * row, d.latent, latent_only + j * d.latent);
    LinearAuto(latent_only, count, kv_b, kv);  // [count, H·(nope + v)]
    // Keys past the end of the last chunk score (and weigh) zero.
    std::fill(kv + count * H * kv_width, kv + chunks * kChunk * H * kv_width, 0.0f);
    ThreadPool::Global().ParallelFor(
        static_cast<size_t>(H * chunks), [&](size_t begin, size_t end) {
          std::vector<float> rope_rows(static_cast<size_t>(kChunk * d.rope), 0.0f);
          for (size_t index = begin; index < end; ++index) {
            const int64_t h = static_cast<int64_t>(index) / chunks;
            const int64_t c = static_cast<int64_t>(index) % chunks;
            float* target = layout + (h * chunks_per_super + c) * chunk_floats;
            const float* first = kv + (c * kChunk * H + h) * kv_width;
            TransposeChunk(df, first, H * kv_width, d.nope, target);
            const int64_t valid = std::min(kChunk, count - c * kChunk);
            for (int64_t j = 0; j < kChunk; ++j)
              for (int64_t i = 0; i < d.rope; ++i)
                rope_rows[j * d.rope + i] =
                    j < valid ? latents[(start + c * kChunk + j) * row + d.latent + i] : 0.0f;
            TransposeChunk(df, rope_rows.data(), d.rope, d.rope, target + d.nope * kChunk);
            float* values = target + key_dims * kChunk;
            for (int64_t j = 0; j < kChunk; ++j)
              std::copy_n(first + j * H * kv_width + d.nope, d.v, values + j * d.v);
          }
        });
    const bool first_pass = start == 0, last_pass = start + super >= last;
    ThreadPool::Global().ParallelFor(static_cast<size_t>(blocks * H), [&](size_t begin,
                                                                          size_t end) {
      HWY_ALIGN float scores[kGroup * kChunk];
      for (size_t index = begin; index < end; ++index) {
        const int64_t block = block_order[static_cast<size_t>(index) / H];
        const int64_t h = static_cast<int64_t>(index) % H;
        const int64_t t_begin = block * kTokenBlock;
        const int64_t t_end = std::min(tokens, t_begin + kTokenBlock);
        if (first_pass)
          for (int64_t t = t_begin; t < t_end; ++t)
            std::fill_n(out + (t * H + h) * d.v, d.v, 0.0f);
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t chunk_start = start + c * kChunk;
          const float* columns = layout + (h * chunks_per_super + c) * chunk_floats;
          const float* values = columns + key_dims * kChunk;
          for (int64_t t0 = t_begin; t0 < t_end; t0 += kGroup) {
            const int64_t group = std::min(kGroup, t_end - t0);
            int64_t used[kGroup] = {};
            int64_t group_used = 0;
            const float* q_nope[kGroup];
            const float* q_pe[kGroup];
            for (int64_t g = 0; g < kGroup; ++g) {
              const int64_t t = t0 + std::min(g, group - 1);  // pad with the last query
              if (g < group)
                used[g] = std::clamp<int64_t>(std::min(keys, positions[t] + 1) - chunk_start, 0,
                                              std::min(kChunk, count - c * kChunk));
              group_used = std::max(group_used, used[g]);
              q_nope[g] = q + (t * H + h) * qk;
              q_pe[g] = q_nope[g] + d.nope;
            }
            if (group_used == 0) continue;
            ScoreChunk(df, columns, d.nope, d.rope, q_nope, q_pe, d.softmax_scale, scores);
            float correction[kGroup];
            float* o_group[kGroup];
            for (int64_t g = 0; g < kGroup; ++g) {
              o_group[g] = nullptr;
              correction[g] = 1.0f;
              float* s = scores + g * kChunk;
              if (used[g] == 0) {  // padding, or a query that sees none of this chunk
                std::fill_n(s, kChunk, 0.0f);
                continue;
              }
              const int64_t item = (t0 + g) * H + h;
              correction[g] = SoftmaxChunk(df, s, used[g], running_max[static_cast<size_t>(item)],
                                           running_sum[static_cast<size_t>(item)]);
              o_group[g] = out + item * d.v;
            }
            AccumulateGroup(df, values, d.v, d.v, group_used, scores, correction, o_group);
          }
        }
        if (last_pass)  // the block's rows of this head are whole: divide by their sums
          for (int64_t t = t_begin; t < t_end; ++t) {
            const int64_t item = t * H + h;
            const float inverse = running_sum[item] > 0 ? 1.0f / running_sum[item] : 0.0f;
            for (int64_t i = 0; i < d.v; ++i)
              out[item * d.v + i] *= inverse;
          }
      }
    });
  }
}

}  // namespace sy::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sy::kernels {
HWY_EXPORT(MlaAttendExpandedImpl);

void MlaAttendExpanded(const float* q, int64_t tokens, const int64_t* positions,
                       const float* latents, int64_t keys, const Matrix& kv_b, const MlaDims& d,
                       float* out) {
  if (tokens == 0) return;
  const int64_t row = d.latent + d.rope, qk = d.nope + d.rope, kv_width = d.nope + d.v;
  // Expand: kv[j] = kv_b · c_j for every cached key.
  std::vector<float> latent_only(static_cast<size_t>(keys * d.latent));
  for (int64_t j = 0; j < keys; ++j)
    std::copy_n(latents + j * row, d.latent, latent_only.begin() + j * d.latent);
  std::vector<float> kv(static_cast<size_t>(keys * d.heads * kv_width));
  Linear(latent_only.data(), keys, kv_b, kv.data());

  ThreadPool::Global().ParallelFor(
      static_cast<size_t>(tokens * d.heads), [&](size_t begin, size_t end) {
        std::vector<float> scores(static_cast<size_t>(keys));
        for (size_t item = begin; item < end; ++item) {
          const int64_t t = static_cast<int64_t>(item) / d.heads,
                        h = static_cast<int64_t>(item) % d.heads;
          const float* query = q + (t * d.heads + h) * qk;
          const int64_t visible = std::min(keys, positions[t] + 1);
          for (int64_t j = 0; j < visible; ++j) {
            const float* key_nope = kv.data() + (j * d.heads + h) * kv_width;
            const float* key_pe = latents + j * row + d.latent;
            scores[j] = (Dot(query, key_nope, d.nope) + Dot(query + d.nope, key_pe, d.rope)) *
                        d.softmax_scale;
          }
          Softmax(scores.data(), visible);
          float* target = out + (t * d.heads + h) * d.v;
          std::fill_n(target, d.v, 0.0f);
          for (int64_t j = 0; j < visible; ++j) {
            const float* value = kv.data() + (j * d.heads + h) * kv_width + d.nope;
            for (int64_t i = 0; i < d.v; ++i)
              target[i] += scores[j] * value[i];
          }
        }
      });
}

void MlaAttendExpandedTiled(const float* q, int64_t tokens, const int64_t* positions,
                            const float* latents, int64_t keys, const Matrix& kv_b,
                            const MlaDims& d, float* out) {
  if (tokens == 0) return;
  HWY_DYNAMIC_DISPATCH(MlaAttendExpandedImpl)(q, tokens, positions, latents, keys, kv_b, d, out);
}

void MlaAttendAbsorbed(const float* q, int64_t tokens, const int64_t* positions,
                       const float* latents, int64_t keys, const Matrix& kv_b, const MlaDims& d,
                       float* out) {
  if (tokens == 0) return;
  const int64_t row = d.latent + d.rope, qk = d.nope + d.rope, kv_width = d.nope + d.v;
  // q_abs[t, h] = W_UK[h]ᵀ · q_nope[t, h]   ([latent] per head)
  std::vector<float> q_abs(static_cast<size_t>(tokens * d.heads * d.latent));
  std::vector<float> q_nope(static_cast<size_t>(tokens * d.nope));
  std::vector<float> head_abs(static_cast<size_t>(tokens * d.latent));
  for (int64_t h = 0; h < d.heads; ++h) {
    for (int64_t t = 0; t < tokens; ++t)
      std::copy_n(q + (t * d.heads + h) * qk, d.nope, q_nope.begin() + t * d.nope);
    LinearTransposed(q_nope.data(), tokens, kv_b.RowSlice(h * kv_width, d.nope), head_abs.data());
    for (int64_t t = 0; t < tokens; ++t)
      std::copy_n(head_abs.begin() + t * d.latent, d.latent,
                  q_abs.begin() + (t * d.heads + h) * d.latent);
  }

  // MQA over the latents: o_lat[t, h] = Σ_j softmax_j(scale · (q_abs·c_j + q_pe·k_pe_j)) c_j
  std::vector<float> o_latent(static_cast<size_t>(tokens * d.heads * d.latent));
  ThreadPool::Global().ParallelFor(
      static_cast<size_t>(tokens * d.heads), [&](size_t begin, size_t end) {
        std::vector<float> scores(static_cast<size_t>(keys));
        for (size_t item = begin; item < end; ++item) {
          const int64_t t = static_cast<int64_t>(item) / d.heads,
                        h = static_cast<int64_t>(item) % d.heads;
          const float* query_latent = q_abs.data() + item * d.latent;
          const float* query_pe = q + (t * d.heads + h) * qk + d.nope;
          const int64_t visible = std::min(keys, positions[t] + 1);
          for (int64_t j = 0; j < visible; ++j) {
            const float* key = latents + j * row;
            scores[j] = (Dot(query_latent, key, d.latent) + Dot(query_pe, key + d.latent, d.rope)) *
                        d.softmax_scale;
          }
          Softmax(scores.data(), visible);
          float* target = o_latent.data() + item * d.latent;
          std::fill_n(target, d.latent, 0.0f);
          for (int64_t j = 0; j < visible; ++j) {
            const float* value = latents + j * row;
            for (int64_t i = 0; i < d.latent; ++i)
              target[i] += scores[j] * value[i];
          }
        }
      });

  // out[t, h] = W_UV[h] · o_lat[t, h]
  std::vector<float> head_latent(static_cast<size_t>(tokens * d.latent));
  std::vector<float> head_out(static_cast<size_t>(tokens * d.v));
  for (int64_t h = 0; h < d.heads; ++h) {
    for (int64_t t = 0; t < tokens; ++t)
      std::copy_n(o_latent.begin() + (t * d.heads + h) * d.latent, d.latent,
                  head_latent.begin() + t * d.latent);
    Linear(head_latent.data(), tokens, kv_b.RowSlice(h * kv_width + d.nope, d.v), head_out.data());
    for (int64_t t = 0; t < tokens; ++t)
      std::copy_n(head_out.begin() + t * d.v, d.v, out + (t * d.heads + h) * d.v);
  }
}

}  // namespace sy::kernels
#endif  // HWY_ONCE
