#include "kernels/cpu/mla_attention.h"

#include <algorithm>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/linear.h"

#include <cmath>
#include <limits>

namespace sy::kernels {

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
  constexpr int64_t kBlock = 64;
  const int64_t row = d.latent + d.rope, qk = d.nope + d.rope, kv_width = d.nope + d.v;
  const int64_t items = tokens * d.heads;
  std::vector<float> running_max(static_cast<size_t>(items),
                                 -std::numeric_limits<float>::infinity());
  std::vector<float> running_sum(static_cast<size_t>(items), 0.0f);
  std::fill_n(out, items * d.v, 0.0f);
  int64_t last = 0;
  for (int64_t t = 0; t < tokens; ++t)
    last = std::max(last, std::min(keys, positions[t] + 1));
  std::vector<float> block_latent(static_cast<size_t>(kBlock * d.latent));
  std::vector<float> kv(static_cast<size_t>(kBlock * d.heads * kv_width));
  for (int64_t start = 0; start < last; start += kBlock) {
    const int64_t count = std::min(kBlock, last - start);
    for (int64_t j = 0; j < count; ++j)
      std::copy_n(latents + (start + j) * row, d.latent, block_latent.begin() + j * d.latent);
    LinearAuto(block_latent.data(), count, kv_b, kv.data());  // [count, H·(dn + dv)]
    ThreadPool::Global().ParallelFor(static_cast<size_t>(items), [&](size_t begin, size_t end) {
      float scores[kBlock];
      for (size_t item = begin; item < end; ++item) {
        const int64_t t = static_cast<int64_t>(item) / d.heads,
                      h = static_cast<int64_t>(item) % d.heads;
        const int64_t used = std::min(count, std::min(keys, positions[t] + 1) - start);
        if (used <= 0) continue;
        const float* query = q + (t * d.heads + h) * qk;
        float block_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < used; ++j) {
          const float* key_nope = kv.data() + (j * d.heads + h) * kv_width;
          const float* key_pe = latents + (start + j) * row + d.latent;
          scores[j] = (Dot(query, key_nope, d.nope) + Dot(query + d.nope, key_pe, d.rope)) *
                      d.softmax_scale;
          block_max = std::max(block_max, scores[j]);
        }
        const float new_max = std::max(running_max[item], block_max);
        const float correction = std::exp(running_max[item] - new_max);
        float sum = 0;
        for (int64_t j = 0; j < used; ++j)
          sum += (scores[j] = std::exp(scores[j] - new_max));
        running_sum[item] = running_sum[item] * correction + sum;
        running_max[item] = new_max;
        float* target = out + item * d.v;
        for (int64_t i = 0; i < d.v; ++i)
          target[i] *= correction;
        for (int64_t j = 0; j < used; ++j) {
          const float* value = kv.data() + (j * d.heads + h) * kv_width + d.nope;
          for (int64_t i = 0; i < d.v; ++i)
            target[i] += scores[j] * value[i];
        }
      }
    });
  }
  for (int64_t item = 0; item < items; ++item) {
    const float inverse = running_sum[item] > 0 ? 1.0f / running_sum[item] : 0.0f;
    for (int64_t i = 0; i < d.v; ++i)
      out[item * d.v + i] *= inverse;
  }
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
