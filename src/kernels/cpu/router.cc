#include "kernels/cpu/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/elementwise.h"

namespace sy::kernels {
namespace {

// Indices of the `count` largest values, best first, ties to the lower index.
void TopIndices(const float* values, int64_t size, int64_t count, int32_t* out) {
  std::vector<int32_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [&](int32_t a, int32_t b) {
    return values[a] != values[b] ? values[a] > values[b] : a < b;
  });
  std::copy_n(order.begin(), count, out);
}

}  // namespace

void Route(const float* logits, int64_t tokens, const float* bias, const RouterParams& params,
           int32_t* ids, float* weights) {
  const int64_t experts = params.experts, top_k = params.top_k;
  const int64_t per_group = experts / params.groups;
  const float masked = -std::numeric_limits<float>::infinity();
  // Tokens [begin, end), each on its own: a prompt's thousands of tokens on one thread were half
  // a percent of its prefill while the other threads waited.
  auto route = [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(experts)), selection(scores.size());
    std::vector<float> group_scores(static_cast<size_t>(params.groups));
    std::vector<int32_t> kept_groups(static_cast<size_t>(params.groups));
    for (int64_t t = begin; t < end; ++t) {
      const float* row = logits + t * experts;
      if (params.sigmoid) {
        for (int64_t e = 0; e < experts; ++e)
          scores[e] = 1.0f / (1.0f + std::exp(-row[e]));
      } else {
        std::copy_n(row, experts, scores.begin());
        Softmax(scores.data(), experts);
      }
      for (int64_t e = 0; e < experts; ++e)
        selection[e] = scores[e] + (bias ? bias[e] : 0.0f);

      if (params.group_score != GroupScore::kNone && params.groups > 1 &&
          params.groups_kept < params.groups) {
        for (int64_t g = 0; g < params.groups; ++g) {
          const float* group = selection.data() + g * per_group;
          if (params.group_score == GroupScore::kMax) {
            group_scores[g] = *std::max_element(group, group + per_group);
          } else {
            float first = masked, second = masked;
            for (int64_t i = 0; i < per_group; ++i) {
              if (group[i] > first) {
                second = first;
                first = group[i];
              } else if (group[i] > second) {
                second = group[i];
              }
            }
            group_scores[g] = first + second;
          }
        }
        TopIndices(group_scores.data(), params.groups, params.groups_kept, kept_groups.data());
        std::vector<bool> keep(static_cast<size_t>(params.groups), false);
        for (int64_t i = 0; i < params.groups_kept; ++i)
          keep[kept_groups[i]] = true;
        for (int64_t e = 0; e < experts; ++e)
          if (!keep[e / per_group]) selection[e] = masked;
      }

      int32_t* token_ids = ids + t * top_k;
      float* token_weights = weights + t * top_k;
      TopIndices(selection.data(), experts, top_k, token_ids);
      float sum = 0;
      for (int64_t k = 0; k < top_k; ++k) {
        token_weights[k] = scores[token_ids[k]];  // the raw affinity, never the biased one
        sum += token_weights[k];
      }
      const float divisor = params.normalize ? sum + 1e-20f : 1.0f;
      for (int64_t k = 0; k < top_k; ++k)
        token_weights[k] = token_weights[k] / divisor * params.scale;
    }
  };
  ThreadPool::Global().ParallelForIf(
      tokens >= 256, static_cast<size_t>(tokens), [&](size_t begin, size_t end) {
        route(static_cast<int64_t>(begin), static_cast<int64_t>(end));
      });
}

}  // namespace sy::kernels
