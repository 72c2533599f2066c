// Tensor parallelism inside a DP group: attention heads split over the group's ranks (their
// o_proj partial sums added by an all-reduce), and the MoE layer's tokens — identical on every
// rank of the group — split among them on the way into expert parallelism and gathered after.
#pragma once

#include <memory>

#include "model/attention_reducer.h"
#include "model/moe_executor.h"
#include "parallel/communicator.h"

namespace sy {

class TensorParallelAttention final : public AttentionReducer {
 public:
  explicit TensorParallelAttention(Communicator& group) : group_(group) {}
  void Sum(float* values, int64_t count) override { group_.AllReduceSumFloats(values, count); }

 private:
  Communicator& group_;
};

// Each rank of the TP group runs `inner` (the EP exchange) on its even share of the tokens, then
// the shares are all-gathered so every rank of the group holds the whole output.
class TokenShardedMoe final : public MoeExecutor {
 public:
  TokenShardedMoe(MoeExecutor& inner, Communicator& group) : inner_(inner), group_(group) {}
  void Run(const ModelConfig& config, const MoeWeights& weights, int64_t layer, const float* x,
           int64_t tokens, float* out) override;

 private:
  MoeExecutor& inner_;
  Communicator& group_;
};

}  // namespace sy
