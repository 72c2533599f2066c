#include "model/feed_forward.h"

#include <algorithm>
#include <numeric>

#include "base/stage_timer.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/grouped_ffn.h"
#include "kernels/cpu/router.h"

namespace sy {

void FeedForward(const FeedForwardWeights& w, const float* x, int64_t tokens, float* out) {
  ScopedStage stage(Stage::kGemm);
  const int64_t width = w.gate_proj.rows;
  std::vector<float> gate(static_cast<size_t>(tokens * width)), up(gate.size());
  kernels::LinearAuto(x, tokens, w.gate_proj, gate.data());
  kernels::LinearAuto(x, tokens, w.up_proj, up.data());
  kernels::SiluMul(gate.data(), up.data(), tokens * width);
  kernels::LinearAuto(gate.data(), tokens, w.down_proj, out);
}

void SortByExpert(ExpertRouting& routing, int64_t experts) {
  // Counting sort by expert: stable, so slots of one expert stay in token order.
  routing.expert_offsets.assign(static_cast<size_t>(experts + 1), 0);
  for (int32_t expert : routing.expert_ids)
    ++routing.expert_offsets[expert + 1];
  std::partial_sum(routing.expert_offsets.begin(), routing.expert_offsets.end(),
                   routing.expert_offsets.begin());
  std::vector<int64_t> next(routing.expert_offsets.begin(), routing.expert_offsets.end() - 1);
  routing.sorted_slots.resize(routing.expert_ids.size());
  for (size_t slot = 0; slot < routing.expert_ids.size(); ++slot)
    routing.sorted_slots[next[routing.expert_ids[slot]]++] = static_cast<int32_t>(slot);
}

ExpertRouting RouteTokens(const ModelConfig& c, const MoeWeights& w, const float* x,
                          int64_t tokens) {
  ScopedStage stage(Stage::kRouter);
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
  ExpertRouting routing;
  routing.tokens = tokens;
  routing.top_k = K;
  std::vector<float> logits(static_cast<size_t>(tokens * E));
  kernels::LinearAuto(x, tokens, w.gate, logits.data());  // HF runs the router in f32

  kernels::RouterParams params;
  params.experts = E;
  params.groups = c.n_group;
  params.groups_kept = c.topk_group;
  params.top_k = K;
  params.sigmoid = c.scoring_func == ScoringFunc::kSigmoid;
  params.group_score = c.topk_method == TopkMethod::kNoauxTc ? kernels::GroupScore::kSumOfTop2
                       : c.topk_method == TopkMethod::kGroupLimitedGreedy
                           ? kernels::GroupScore::kMax
                           : kernels::GroupScore::kNone;
  // V2 renormalizes only when top_k > 1; V3 whenever norm_topk_prob is set (HF semantics).
  params.normalize = c.norm_topk_prob && (c.model_type != "deepseek_v2" || K > 1);
  params.scale = static_cast<float>(c.routed_scaling_factor);
  routing.expert_ids.resize(static_cast<size_t>(tokens * K));
  routing.weights.resize(routing.expert_ids.size());
  kernels::Route(logits.data(), tokens,
                 w.e_score_correction_bias.empty() ? nullptr : w.e_score_correction_bias.data(),
                 params, routing.expert_ids.data(), routing.weights.data());

  SortByExpert(routing, E);
  return routing;
}

void RunExperts(const MoeWeights& w, const ExpertRouting& routing, const float* x, int64_t hidden,
                float* expert_rows) {
  ScopedStage stage(Stage::kGroupedGemm);
  // Gather the rows in expert order (the sort of init routing), then one grouped pass.
  const int64_t slots = static_cast<int64_t>(routing.sorted_slots.size());
  std::vector<float> inputs(static_cast<size_t>(slots * hidden));
  for (int64_t i = 0; i < slots; ++i)
    std::copy_n(x + (routing.sorted_slots[i] / routing.top_k) * hidden, hidden,
                inputs.begin() + i * hidden);
  std::vector<kernels::ExpertPanels> panels(w.experts.size());
  bool packed = true;
  for (size_t e = 0; e < w.experts.size(); ++e) {
    const FeedForwardWeights& ff = w.experts[e];
    if (ff.empty()) continue;
    if (!ff.gate_proj.packed || !ff.up_proj.packed || !ff.down_proj.packed) packed = false;
    panels[e] = {ff.gate_proj.packed.get(), ff.up_proj.packed.get(), ff.down_proj.packed.get()};
  }
  if (packed) {
    kernels::GroupedExpertFfn(inputs.data(), routing.expert_offsets, panels, hidden, expert_rows);
    return;
  }
  RunExpertsReference(w, routing, inputs.data(), hidden, expert_rows);
}

void RunExpertsReference(const MoeWeights& w, const ExpertRouting& routing, const float* sorted_x,
                         int64_t hidden, float* expert_rows) {
  for (size_t e = 0; e < w.experts.size(); ++e) {
    const int64_t begin = routing.expert_offsets[e], end = routing.expert_offsets[e + 1];
    if (begin == end || w.experts[e].empty()) continue;
    FeedForward(w.experts[e], sorted_x + begin * hidden, end - begin, expert_rows + begin * hidden);
  }
}

void FinalizeRouting(const ExpertRouting& routing, const float* expert_rows, const float* shared,
                     int64_t hidden, float* out) {
  const int64_t K = routing.top_k;
  // position[slot] = where the slot's row sits in expert order (the inverse of the sort).
  std::vector<int64_t> position(routing.sorted_slots.size());
  for (size_t i = 0; i < routing.sorted_slots.size(); ++i)
    position[routing.sorted_slots[i]] = static_cast<int64_t>(i);
  std::vector<int64_t> order(static_cast<size_t>(K));
  for (int64_t t = 0; t < routing.tokens; ++t) {
    float* target = out + t * hidden;
    std::fill_n(target, hidden, 0.0f);
    std::iota(order.begin(), order.end(), t * K);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return routing.expert_ids[a] < routing.expert_ids[b]; });
    for (int64_t slot : order) {
      const float weight = routing.weights[slot];
      const float* row = expert_rows + position[slot] * hidden;
      for (int64_t i = 0; i < hidden; ++i)
        target[i] += weight * row[i];
    }
    if (shared != nullptr)
      for (int64_t i = 0; i < hidden; ++i)
        target[i] += shared[t * hidden + i];
  }
}

void MoeForward(const ModelConfig& c, const MoeWeights& w, const float* x, int64_t tokens,
                float* out) {
  const int64_t D = c.hidden_size;
  ExpertRouting routing = RouteTokens(c, w, x, tokens);
  std::vector<float> expert_rows(static_cast<size_t>(tokens * routing.top_k * D));
  RunExperts(w, routing, x, D, expert_rows.data());
  std::vector<float> shared;
  if (!w.shared_experts.empty()) {
    shared.resize(static_cast<size_t>(tokens * D));
    FeedForward(w.shared_experts, x, tokens, shared.data());
  }
  FinalizeRouting(routing, expert_rows.data(), shared.empty() ? nullptr : shared.data(), D, out);
}

}  // namespace sy
