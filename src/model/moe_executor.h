// How a MoE layer's experts run: in this process, or spread over expert-parallel ranks
// (parallel/expert_parallel.h). Model::Forward calls it once per MoE layer.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/weights.h"

namespace sy {

class MoeExecutor {
 public:
  virtual ~MoeExecutor() = default;
  // x: [tokens, D] output of post_attention_layernorm (tokens may be 0: a rank with no work
  // still takes part); out: [tokens, D] routed experts' weighted sum plus the shared expert.
  virtual void Run(const ModelConfig& config, const MoeWeights& weights, int64_t layer,
                   const float* x, int64_t tokens, float* out) = 0;
};

}  // namespace sy
