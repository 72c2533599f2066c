#include "model/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/allocator.h"
#include "base/thread_pool.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/index_scores.h"

namespace sy {
namespace {

// The indexer key's LayerNorm eps (HF's nn.LayerNorm(index_head_dim, eps=1e-6)).
constexpr double kKeyNormEps = 1e-6;
// Sparse queries of one sequence share one gather of its keys, this many at a time.
constexpr int64_t kQueriesPerItem = 16;

// RoPE on halves: element i pairs with i + dim/2 (HF's rotate_half), both turned by the angle of
// frequency i, from the same cos/sin table as the pairwise form (RopeTable).
void RotateHalves(float* v, int64_t dim, const float* cos_sin) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

}  // namespace

void IndexerProject(const ModelConfig& c, const RopeParams& rope, const AttentionWeights& w,
                    int64_t tokens, const int64_t* positions, const float* x, const float* cq,
                    float* keys, int64_t key_stride, float* queries) {
  const int64_t T = tokens, Hi = c.index_n_heads, dI = c.index_head_dim, dr = c.qk_rope_head_dim;
  const int64_t width = IndexerQueryWidth(c);
  if (T == 0) return;
  // Written whole by the products.
  auto q = UninitializedArray<float>(T * Hi * dI);
  auto k = UninitializedArray<float>(T * dI);
  auto head_weights = UninitializedArray<float>(T * Hi);
  kernels::LinearF32(cq, T, w.indexer_wq_b, q.get());
  kernels::LinearF32(x, T, w.indexer_wk, k.get());
  kernels::LinearF32(x, T, w.indexer_weights_proj, head_weights.get());
  // score = Σ_h w_h · n_heads^-½ · relu(q_h·k · dI^-½): both scales are positive, so they ride
  // on the head weight.
  const float scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(Hi) * static_cast<double>(dI)));
  ThreadPool::Global().ParallelForIf(
      T * Hi * dI >= 16384, static_cast<size_t>(T), [&](size_t begin, size_t end) {
        std::vector<float> cos_sin(static_cast<size_t>(dr));
        for (size_t t = begin; t < end; ++t) {
          kernels::RopeTable(dr, positions[t], rope.inv_freq.data(), rope.attention_factor,
                             cos_sin.data());
          // The key: LayerNorm in double sums (dI values), then RoPE on its first dr values.
          float* kt = k.get() + t * dI;
          double mean = 0, variance = 0;
          for (int64_t i = 0; i < dI; ++i)
            mean += kt[i];
          mean /= static_cast<double>(dI);
          for (int64_t i = 0; i < dI; ++i)
            variance += (kt[i] - mean) * (kt[i] - mean);
          variance /= static_cast<double>(dI);
          const double inverse = 1.0 / std::sqrt(variance + kKeyNormEps);
          float* key = keys + static_cast<int64_t>(t) * key_stride;
          for (int64_t i = 0; i < dI; ++i)
            key[i] = static_cast<float>((kt[i] - mean) * inverse) * w.indexer_k_norm[i] +
                     w.indexer_k_norm_bias[i];
          RotateHalves(key, dr, cos_sin.data());
          float* out = queries + static_cast<int64_t>(t) * width;
          for (int64_t h = 0; h < Hi; ++h) {
            float* qh = out + h * dI;
            std::copy_n(q.get() + (t * Hi + h) * dI, dI, qh);
            RotateHalves(qh, dr, cos_sin.data());
            out[Hi * dI + h] = head_weights[t * Hi + h] * scale;
          }
        }
      });
}

void ChooseTopKeys(const float* scores, int64_t count, int64_t topk, std::vector<int32_t>& order,
                   std::vector<int32_t>& chosen) {
  order.resize(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), 0);
  // A NaN score (from NaN weights) sorts last rather than breaking the ordering.
  const auto better = [&](int32_t a, int32_t b) {
    const float sa = scores[a], sb = scores[b];
    if (std::isnan(sa) != std::isnan(sb)) return std::isnan(sb);
    if (std::isnan(sa)) return a < b;
    return sa > sb || (sa == sb && a < b);
  };
  std::nth_element(order.begin(), order.begin() + topk, order.end(), better);
  chosen.assign(order.begin(), order.begin() + topk);
  std::sort(chosen.begin(), chosen.end());
}

std::vector<SparseQuery> SelectSparseKeys(const ModelConfig& c, int64_t layer,
                                          const ForwardBatch& batch,
                                          const std::vector<int64_t>& positions,
                                          const LatentCache& cache, const float* queries) {
  const int64_t topk = c.index_topk, Hi = c.index_n_heads, dI = c.index_head_dim;
  const int64_t width = IndexerQueryWidth(c);
  std::vector<SparseQuery> sparse;
  struct Item {
    size_t first, count;  // in `sparse`
  };
  std::vector<Item> items;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceSlice& seq = batch.sequences[s];
    const size_t first = sparse.size();
    for (int64_t i = 0; i < seq.token_count; ++i) {
      const int64_t token = seq.token_offset + i;
      if (positions[token] >= topk) sparse.push_back({token, positions[token], s, {}});
    }
    for (size_t b = first; b < sparse.size(); b += kQueriesPerItem)
      items.push_back({b, std::min<size_t>(kQueriesPerItem, sparse.size() - b)});
  }
  if (sparse.empty()) return sparse;
  ThreadPool::Global().ParallelFor(items.size(), [&](size_t begin, size_t end) {
    std::vector<float> keys, scores;
    std::vector<int32_t> order;
    for (size_t i = begin; i < end; ++i) {
      const Item& item = items[i];
      // Queries are in position order: the last sees the most keys.
      const int64_t key_count = sparse[item.first + item.count - 1].position + 1;
      const SequenceSlice& seq = batch.sequences[sparse[item.first].sequence];
      keys.resize(static_cast<size_t>(key_count * dI));
      cache.GatherColumns(layer, *seq.cache, key_count, c.latent_cache_width(), dI, keys.data());
      for (size_t j = item.first; j < item.first + item.count; ++j) {
        SparseQuery& query = sparse[j];
        const int64_t visible = query.position + 1;
        const float* q = queries + query.token * width;
        scores.resize(static_cast<size_t>(visible));
        kernels::IndexScores(q, q + Hi * dI, Hi, dI, keys.data(), visible, scores.data());
        ChooseTopKeys(scores.data(), visible, topk, order, query.keys);
      }
    }
  });
  return sparse;
}

}  // namespace sy
