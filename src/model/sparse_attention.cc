#include "model/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
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
// A decode step's query splits its keys over the threads in chunks of at least this many.
constexpr int64_t kMinKeysPerChunk = 1024;

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

void ChooseTopKeys(const float* scores, int64_t count, int64_t topk, std::vector<float>& scratch,
                   std::vector<int32_t>& chosen) {
  // The topk-th best score by a selection over plain floats (a NaN, from NaN weights, taken as
  // the lowest), then one pass in key order: every key above it, and as many at it as fill topk,
  // the earlier first. A comparator carrying the tie rule made the selection a fifth of a small
  // model's decode step.
  scratch.assign(scores, scores + count);
  for (float& v : scratch)
    if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
  std::nth_element(scratch.begin(), scratch.begin() + (topk - 1), scratch.end(),
                   std::greater<float>());
  const float threshold = scratch[static_cast<size_t>(topk - 1)];
  int64_t above = 0;
  for (int64_t j = 0; j < count; ++j)
    above += scores[j] > threshold;
  int64_t at_threshold = topk - above;
  chosen.clear();
  for (int64_t j = 0; j < count; ++j) {
    const float v = scores[j];
    if (v > threshold || (v == threshold && at_threshold-- > 0))
      chosen.push_back(static_cast<int32_t>(j));
  }
  if (static_cast<int64_t>(chosen.size()) < topk) {  // the threshold is -inf and NaNs fill in
    for (int64_t j = 0; j < count && static_cast<int64_t>(chosen.size()) < topk; ++j)
      if (std::isnan(scores[j])) chosen.push_back(static_cast<int32_t>(j));
    std::sort(chosen.begin(), chosen.end());
  }
}

std::vector<SparseQuery> SelectSparseKeys(const ModelConfig& c, int64_t layer,
                                          const ForwardBatch& batch,
                                          const std::vector<int64_t>& positions,
                                          const LatentCache& cache, const float* queries) {
  const int64_t topk = c.index_topk, Hi = c.index_n_heads, dI = c.index_head_dim;
  const int64_t width = IndexerQueryWidth(c), column = c.latent_cache_width();
  std::vector<SparseQuery> sparse;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceSlice& seq = batch.sequences[s];
    for (int64_t i = 0; i < seq.token_count; ++i) {
      const int64_t token = seq.token_offset + i;
      if (positions[token] >= topk) sparse.push_back({token, positions[token], s, {}});
    }
  }
  if (sparse.empty()) return sparse;
  const auto keys_of = [&](const SparseQuery& query) {
    return cache.Pages(layer, *batch.sequences[query.sequence].cache);
  };
  const auto score = [&](const SparseQuery& query, int64_t first, int64_t count, float* out) {
    const float* q = queries + query.token * width;
    kernels::IndexScores(q, q + Hi * dI, Hi, dI, keys_of(query), column, first, count, out);
  };
  // Prompt chunks bring many queries: each thread scores and chooses whole queries. Decode
  // steps bring one or a few: each query's keys are split over the threads (a score depends on
  // its query and key alone, so the split changes no bit), then each chooses.
  const size_t threads = ThreadPool::Global().size();
  if (sparse.size() >= 2 * threads) {
    ThreadPool::Global().ParallelFor(sparse.size(), [&](size_t begin, size_t end) {
      std::vector<float> scores;
      std::vector<float> scratch;
      for (size_t j = begin; j < end; ++j) {
        SparseQuery& query = sparse[j];
        const int64_t visible = query.position + 1;
        scores.resize(static_cast<size_t>(visible));
        score(query, 0, visible, scores.data());
        ChooseTopKeys(scores.data(), visible, topk, scratch, query.keys);
      }
    });
    return sparse;
  }
  struct Chunk {
    size_t query;
    int64_t first, count;
  };
  std::vector<std::vector<float>> scores(sparse.size());
  std::vector<Chunk> chunks;
  for (size_t j = 0; j < sparse.size(); ++j) {
    const int64_t visible = sparse[j].position + 1;
    scores[j].resize(static_cast<size_t>(visible));
    const int64_t per_chunk =
        std::max<int64_t>(kMinKeysPerChunk, (visible + 2 * static_cast<int64_t>(threads) - 1) /
                                                (2 * static_cast<int64_t>(threads)));
    for (int64_t first = 0; first < visible; first += per_chunk)
      chunks.push_back({j, first, std::min(per_chunk, visible - first)});
  }
  ThreadPool::Global().ParallelFor(chunks.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const Chunk& chunk = chunks[i];
      score(sparse[chunk.query], chunk.first, chunk.count,
            scores[chunk.query].data() + chunk.first);
    }
  });
  ThreadPool::Global().ParallelFor(sparse.size(), [&](size_t begin, size_t end) {
    std::vector<float> scratch;
    for (size_t j = begin; j < end; ++j)
      ChooseTopKeys(scores[j].data(), sparse[j].position + 1, topk, scratch, sparse[j].keys);
  });
  return sparse;
}

}  // namespace sy
