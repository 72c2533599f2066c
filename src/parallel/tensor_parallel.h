// Tensor parallelism inside a DP group. Attention: heads split over the group's ranks (o_proj
// partial sums added by an all-reduce), or SP-TP-SP (token shards, exchanges of q, latent rows
// and head outputs) — model/attention_group.h. MoE under head-split attention: the tokens,
// identical on every rank of the group, are split among them on the way into expert parallelism
// and gathered after (TokenShardedMoe); under SP-TP-SP each rank already holds its own shard.
#pragma once

#include <memory>
#include <vector>

#include "model/attention_group.h"
#include "model/moe_executor.h"
#include "parallel/communicator.h"

namespace sy {

class TensorParallelAttention final : public AttentionGroup {
 public:
  explicit TensorParallelAttention(Communicator& group) : group_(group) {}
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }
  void Sum(float* values, int64_t count) override { group_.AllReduceSumFloats(values, count); }
  void AllGather(const float* mine, const std::vector<int64_t>& counts, float* all) override;
  void AllToAll(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                const std::vector<int64_t>& recv_counts) override;

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
  void Begin(const ModelConfig& config, const MoeWeights& weights, int64_t layer, const float* x,
             int64_t tokens, int slot) override;
  void Middle(int slot) override { inner_.Middle(slot); }
  void End(int slot, float* out) override;

 private:
  void Gather(std::vector<float>& mine, float* out);

  MoeExecutor& inner_;
  Communicator& group_;
  std::vector<float> share_[kSlots];
};

}  // namespace sy
