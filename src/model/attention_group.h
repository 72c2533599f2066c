// The ranks that share one DP group's attention under tensor parallelism, as the forward pass
// sees them (parallel/tensor_parallel.h implements it over MPI). Two ways to split the work:
//   heads:        every rank holds all the group's tokens and computes its share of the heads;
//                 o_proj's partial sums are added up (Sum).
//   SP-TP-SP:     every rank holds an even share of the tokens (sequence parallel); q moves to
//                 the head owners and the latent rows to everyone (AllGather), attention runs TP
//                 over heads, and the outputs move back to the token owners (AllToAll) before a
//                 whole o_proj — the Huawei prefill recipe.
#pragma once

#include <cstdint>
#include <vector>

namespace sy {

enum class AttentionSplit { kHeads, kSequence };

class AttentionGroup {
 public:
  virtual ~AttentionGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // values[count]: this rank's partial sum in, the group's total out.
  virtual void Sum(float* values, int64_t count) = 0;
  // all = every rank's `counts[r]` floats, concatenated in rank order; mine holds counts[rank()].
  virtual void AllGather(const float* mine, const std::vector<int64_t>& counts, float* all) = 0;
  // send holds send_counts[r] floats for each rank r in rank order; recv receives
  // recv_counts[r] floats from each rank r in rank order.
  virtual void AllToAll(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                        const std::vector<int64_t>& recv_counts) = 0;
};

}  // namespace sy
