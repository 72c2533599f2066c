// SwiGLU MLPs and the MoE block. The MoE block is split into the Huawei recipe's stages —
// init routing (expand × top-k, sort by expert), expert compute, finalize routing (undo the
// sort, weighted sum, shared expert added) — so expert parallelism can put dispatch and combine
// between them.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace sy {

// out[tokens, D] = down(silu(gate(x)) · up(x))
void FeedForward(const FeedForwardWeights& w, const float* x, int64_t tokens, float* out);

// The result of init routing for `tokens` tokens with top-k experts each. A "slot" is one
// (token, k) pair, numbered token·top_k + k.
struct ExpertRouting {
  int64_t tokens = 0;
  int64_t top_k = 0;
  std::vector<int32_t> expert_ids;      // [tokens · top_k]
  std::vector<float> weights;           // [tokens · top_k]
  std::vector<int32_t> sorted_slots;    // [tokens · top_k] slots in expert order (stable)
  std::vector<int64_t> expert_offsets;  // [experts + 1] start of each expert in sorted_slots
};

// The counting sort of init routing: fills sorted_slots and expert_offsets from expert_ids.
void SortByExpert(ExpertRouting& routing, int64_t experts);

// Router GEMM in f32, gate, and the sort by expert.
ExpertRouting RouteTokens(const ModelConfig& config, const MoeWeights& w, const float* x,
                          int64_t tokens);

// expert_rows[sorted slot i] = Expert_{e}(x[token of slot]) for every expert held in `w`;
// rows [T·K, D].
// With with_shared (SharedExpertJoinsGroup(w)), rows [T·K, T·K + T) get the shared expert of
// x's rows, in the same grouped pass: one pool loop for the shared and routed gate and up, one
// for their down, instead of three more loops (and one quantization of x fewer: FeedForward
// quantizes it for gate and again for up).
// With summed_out ([T, D]), where every routed expert is held here and the shared expert is in
// the pass (or there is none), the grouped pass may add the rows into their tokens' sums itself
// (FinalizeRouting's result and bits, the shared expert included) and leave expert_rows
// unwritten: returns whether it did.
bool RunExperts(const MoeWeights& w, const ExpertRouting& routing, const float* x, int64_t hidden,
                float* expert_rows, bool with_shared = false, float* summed_out = nullptr);
// Whether the shared expert can run in the routed experts' grouped pass with the same bits as
// FeedForward: GGML blocks or weights on the AMX bf16 kernel (each row's products depend on its
// own activations only, on either path; AMX weights take the grouped pass in FeedForward too)
// and the routed experts' width.
bool SharedExpertJoinsGroup(const MoeWeights& w);

// out[t] = Σ_k weight(t,k) · expert_rows[position of slot (t,k)] + shared[t] (shared may be null).
// Slots are summed in ascending expert order, as Hugging Face's eager loop does.
void FinalizeRouting(const ExpertRouting& routing, const float* expert_rows, const float* shared,
                     int64_t hidden, float* out);

// The same with one FeedForward call per expert over rows already in expert order: the
// yardstick for the grouped kernel, and the path for unpacked weights.
void RunExpertsReference(const MoeWeights& w, const ExpertRouting& routing, const float* sorted_x,
                         int64_t hidden, float* expert_rows);

// The whole MoE block in one process: out[tokens, D].
void MoeForward(const ModelConfig& config, const MoeWeights& w, const float* x, int64_t tokens,
                float* out);
// The same after RouteTokens (routing of these x).
void MoeForwardRouted(const ModelConfig& config, const MoeWeights& w, const ExpertRouting& routing,
                      const float* x, float* out);

}  // namespace sy
