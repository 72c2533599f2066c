#include "model/feed_forward.h"

#include <algorithm>
#include <numeric>

#include "base/allocator.h"
#include "base/stage_timer.h"
#include "base/thread_pool.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/grouped_ffn.h"
#include "kernels/cpu/router.h"
#include "kernels/cpu/weighted_sum.h"
#include "model/calibration.h"

namespace sy {

namespace {

// Work below this many elements runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelElements = 16384;

}  // namespace

namespace {

// Whether gate, up and down all take the AMX bf16 kernel at every row count (bf16 pairs, or
// fp8 and bf16 weights under --amx-bf16): as one group of GroupedExpertFfn they take the fused
// gate and up (AmxBf16GateUpPanels) with the bits of the three products one after another.
bool AllOnAmxBf16(const FeedForwardWeights& w) {
  for (const Matrix* m : {&w.gate_proj, &w.up_proj, &w.down_proj})
    if (!m->packed || !kernels::UseAmxBf16(*m->packed)) return false;
  return true;
}

}  // namespace

void FeedForward(const FeedForwardWeights& w, const float* x, int64_t tokens, float* out) {
  ScopedStage stage(Stage::kGemm);
  if (AllOnAmxBf16(w) && !ObservingLinearInputs()) {
    const std::vector<kernels::ExpertPanels> group = {
        {w.gate_proj.packed.get(), w.up_proj.packed.get(), w.down_proj.packed.get()}};
    kernels::GroupedExpertFfn(x, {0, tokens}, group, w.gate_proj.cols, out);
    return;
  }
  const int64_t width = w.gate_proj.rows;
  auto gate = UninitializedArray<float>(tokens * width),
       up = UninitializedArray<float>(tokens * width);
  ObserveLinearInput(w.gate_proj, x, tokens, w.gate_proj.cols, w.gate_proj.cols);
  ObserveLinearInput(w.up_proj, x, tokens, w.up_proj.cols, w.up_proj.cols);
  kernels::LinearAuto(x, tokens, w.gate_proj, gate.get());
  kernels::LinearAuto(x, tokens, w.up_proj, up.get());
  const int64_t count = tokens * width;
  ThreadPool::Global().ParallelForIf(
      count >= kParallelElements, static_cast<size_t>(count), [&](size_t begin, size_t end) {
        kernels::SiluMul(gate.get() + begin, up.get() + begin, static_cast<int64_t>(end - begin));
      });
  ObserveLinearInput(w.down_proj, gate.get(), tokens, width, width);
  kernels::LinearAuto(gate.get(), tokens, w.down_proj, out);
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
  kernels::LinearF32(x, tokens, w.gate, logits.data());  // HF runs the router in f32

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

bool SharedExpertJoinsGroup(const MoeWeights& w) {
  const FeedForwardWeights& shared = w.shared_experts;
  if (shared.empty() || ObservingLinearInputs()) return false;
  bool ggml = true;
  for (const Matrix* m : {&shared.gate_proj, &shared.up_proj, &shared.down_proj})
    if (!m->packed || m->packed->dtype != DType::kGgml) ggml = false;
  if (!ggml && !AllOnAmxBf16(shared)) return false;
  for (const FeedForwardWeights& routed : w.experts)
    if (!routed.empty()) return routed.gate_proj.rows == shared.gate_proj.rows;
  return false;
}

bool RunExperts(const MoeWeights& w, const ExpertRouting& routing, const float* x, int64_t hidden,
                float* expert_rows, bool with_shared, float* summed_out) {
  ScopedStage stage(Stage::kGroupedGemm);
  // The rows in expert order (the sort of init routing), then one grouped pass.
  const int64_t slots = static_cast<int64_t>(routing.sorted_slots.size());
  const int64_t shared_rows = with_shared ? routing.tokens : 0;
  std::vector<kernels::ExpertPanels> panels(w.experts.size());
  // A calibration (model/calibration.h) sees each expert's inputs on the per-expert path.
  bool packed = !ObservingLinearInputs();
  for (size_t e = 0; e < w.experts.size(); ++e) {
    const FeedForwardWeights& ff = w.experts[e];
    if (ff.empty()) continue;
    if (!ff.gate_proj.packed || !ff.up_proj.packed || !ff.down_proj.packed) packed = false;
    panels[e] = {ff.gate_proj.packed.get(), ff.up_proj.packed.get(), ff.down_proj.packed.get()};
  }
  if (packed) {
    // Each row's token: the grouped pass copies or rounds the rows from x itself, as its
    // kernels want them.
    std::vector<int64_t> source(static_cast<size_t>(slots + shared_rows));
    for (int64_t i = 0; i < slots; ++i)
      source[i] = routing.sorted_slots[i] / routing.top_k;
    std::iota(source.begin() + slots, source.end(), int64_t{0});
    std::vector<int64_t> offsets = routing.expert_offsets;
    if (with_shared) {  // the shared expert as one more group, after the routed ones
      const FeedForwardWeights& ff = w.shared_experts;
      panels.push_back(
          {ff.gate_proj.packed.get(), ff.up_proj.packed.get(), ff.down_proj.packed.get()});
      offsets.push_back(slots + shared_rows);
    }
    bool all_held = true;
    for (const FeedForwardWeights& ff : w.experts)
      all_held = all_held && !ff.empty();
    if (summed_out == nullptr || !all_held || (!with_shared && !w.shared_experts.empty()))
      return kernels::GroupedExpertFfn(x, offsets, panels, hidden, expert_rows, source.data());
    // Each row's weight (the shared expert's 1: 1 · v is v, so its term is FinalizeRouting's
    // plain add) and whether it is its token's first term: rows are in ascending expert order,
    // the shared expert's last, as FinalizeRouting adds them.
    const int64_t rows = slots + shared_rows;
    std::vector<float> weights(static_cast<size_t>(rows), 1.0f);
    std::vector<uint8_t> first(static_cast<size_t>(rows), 0);
    std::vector<uint8_t> seen(static_cast<size_t>(routing.tokens), 0);
    for (int64_t i = 0; i < rows; ++i) {
      if (i < slots) weights[i] = routing.weights[routing.sorted_slots[i]];
      first[i] = seen[source[i]] == 0;
      seen[source[i]] = 1;
    }
    if (std::find(seen.begin(), seen.end(), uint8_t{0}) != seen.end())
      return kernels::GroupedExpertFfn(x, offsets, panels, hidden, expert_rows, source.data());
    const kernels::AmxRoutedRows sum{source.data(), weights.data(), first.data(), summed_out,
                                     hidden};
    return kernels::GroupedExpertFfn(x, offsets, panels, hidden, expert_rows, source.data(), &sum);
  }
  // Kept from call to call (MoeForwardRouted says why); by pointer for the workers.
  thread_local std::vector<float> input_buffer;
  if (input_buffer.size() < static_cast<size_t>(slots * hidden))
    input_buffer.resize(static_cast<size_t>(slots * hidden));
  float* const inputs = input_buffer.data();
  auto gather = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      std::copy_n(x + (routing.sorted_slots[i] / routing.top_k) * hidden, hidden,
                  inputs + i * hidden);
  };
  ThreadPool::Global().ParallelForIf(slots * hidden >= kParallelElements,
                                     static_cast<size_t>(slots), gather);
  RunExpertsReference(w, routing, inputs, hidden, expert_rows);
  if (with_shared) FeedForward(w.shared_experts, x, shared_rows, expert_rows + slots * hidden);
  return false;
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
  // Tokens are independent, each summed in expert order: the split over threads changes nothing.
  const bool worth_it = routing.tokens >= 2 && routing.tokens * K * hidden >= kParallelElements;
  auto tokens = [&](size_t begin, size_t end) {
    std::vector<int64_t> order(static_cast<size_t>(K));
    std::vector<const float*> rows(static_cast<size_t>(K));
    std::vector<float> weights(static_cast<size_t>(K));
    for (int64_t t = static_cast<int64_t>(begin); t < static_cast<int64_t>(end); ++t) {
      std::iota(order.begin(), order.end(), t * K);
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return routing.expert_ids[a] < routing.expert_ids[b];
      });
      for (int64_t k = 0; k < K; ++k) {
        weights[k] = routing.weights[order[k]];
        rows[k] = expert_rows + position[order[k]] * hidden;
      }
      // One pass over the token's row, the sum in registers (the plain loops were 4% of a
      // 32 × 64-token prefill on a Xeon), the same bits.
      kernels::WeightedRowSum(rows.data(), weights.data(), K,
                              shared != nullptr ? shared + t * hidden : nullptr, hidden,
                              out + t * hidden);
    }
  };
  ThreadPool::Global().ParallelForIf(worth_it, static_cast<size_t>(routing.tokens), tokens);
}

void MoeForward(const ModelConfig& c, const MoeWeights& w, const float* x, int64_t tokens,
                float* out) {
  MoeForwardRouted(c, w, RouteTokens(c, w, x, tokens), x, out);
}

void MoeForwardRouted(const ModelConfig& c, const MoeWeights& w, const ExpertRouting& routing,
                      const float* x, float* out) {
  const int64_t D = c.hidden_size, tokens = routing.tokens, slots = tokens * routing.top_k;
  const bool joined = SharedExpertJoinsGroup(w);
  // Kept from call to call: at a prompt's thousands of rows this and RunExperts' inputs are tens
  // of megabytes each, past glibc's largest mmap threshold (32 MiB), so fresh ones were mapped,
  // zeroed, faulted in page by page and unmapped again in every MoE layer (a sixth of a 32 ×
  // 64-token prefill of the bf16 bench checkpoint on a Xeon). Every row RunExperts computes is
  // written; the rows of experts without weights here are zeroed, as FinalizeRouting adds them.
  // Not zero-filled either: where the grouped pass sums the rows into `out` itself, none is
  // written, and the pages of a buffer never written are never made resident (a 32 × 64-token
  // prompt's would be 84 MB).
  thread_local std::unique_ptr<float[]> rows_buffer;
  thread_local size_t rows_capacity = 0;
  const size_t needed = static_cast<size_t>((slots + (joined ? tokens : 0)) * D);
  if (rows_capacity < needed) {
    rows_buffer.reset();
    rows_buffer = UninitializedArray<float>(static_cast<int64_t>(needed));
    rows_capacity = needed;
  }
  float* const expert_rows = rows_buffer.get();
  for (size_t e = 0; e < w.experts.size(); ++e)
    if (w.experts[e].empty())
      std::fill(expert_rows + routing.expert_offsets[e] * D,
                expert_rows + routing.expert_offsets[e + 1] * D, 0.0f);
  if (RunExperts(w, routing, x, D, expert_rows, joined, out)) return;  // summed in the pass
  std::vector<float> shared;
  const float* shared_rows = joined ? expert_rows + slots * D : nullptr;
  if (!joined && !w.shared_experts.empty()) {
    shared.resize(static_cast<size_t>(tokens * D));
    FeedForward(w.shared_experts, x, tokens, shared.data());
    shared_rows = shared.data();
  }
  FinalizeRouting(routing, expert_rows, shared_rows, D, out);
}

}  // namespace sy
