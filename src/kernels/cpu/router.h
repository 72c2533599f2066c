// The MoE router for a batch of tokens: affinity scores, group-limited top-k selection, and
// routing weights. Covers DeepSeek-V3 (sigmoid, bias-corrected, group score = sum of the top 2),
// DeepSeek-V2 (softmax, group score = max) and plain top-k (one group).
#pragma once

#include <cstdint>

namespace sy::kernels {

enum class GroupScore { kNone, kSumOfTop2, kMax };

struct RouterParams {
  int64_t experts = 0;
  int64_t groups = 1;       // contiguous expert groups
  int64_t groups_kept = 1;  // groups a token may draw from
  int64_t top_k = 0;
  bool sigmoid = true;  // sigmoid affinities; otherwise softmax over all experts
  GroupScore group_score = GroupScore::kSumOfTop2;
  bool normalize = true;  // renormalize the chosen weights to sum to 1
  float scale = 1.0f;     // routed_scaling_factor
};

// logits:  [tokens, experts]   router logits (x · gateᵀ) in f32
// bias:    [experts] or null   e_score_correction_bias, used for selection only
// ids:     [tokens, top_k]     chosen experts, best first; ties go to the lower index
// weights: [tokens, top_k]     their routing weights
// Many tokens are spread over the thread pool (not from inside a pool task).
void Route(const float* logits, int64_t tokens, const float* bias, const RouterParams& params,
           int32_t* ids, float* weights);

}  // namespace sy::kernels
