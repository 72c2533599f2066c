// Measured expert load: how many routed slots (token, k) each logical expert of each MoE layer
// drew over a window of steps, and how evenly the expert-parallel ranks shared the work. The
// input of the balancing algorithm (plan/eplb.h) and of `--record-expert-load`.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "model/feed_forward.h"

namespace sy {

struct ExpertLoad {
  int64_t experts = 0;                       // logical experts per MoE layer, E
  int64_t top_k = 0;                         // routed slots per token
  int64_t groups = 1;                        // expert groups of the router (n_group)
  std::vector<int64_t> layers;               // MoE layer indices, ascending
  std::vector<std::vector<int64_t>> counts;  // [layers][experts] routed slots
  int64_t steps = 0;                         // forward passes in the window
  int64_t tokens = 0;                        // tokens through the first MoE layer
  int ranks = 1;                             // expert-parallel ranks it was measured on
  // Σ over exchanges of the busiest rank's received rows / Σ of the mean rank's (expert
  // parallelism only: each layer of each step, each micro-batch, is one exchange).
  std::optional<double> imbalance;
  // Its two sums (Σ busiest, Σ mean), so that windows combine into one run's figure.
  double busiest_rows = 0, mean_rows = 0;
  // The same per layer, in `layers` order (empty without expert parallelism).
  std::vector<double> layer_imbalance;
  // Per layer, routed slots per expert in single exchanges (all ranks summed): a sample of at
  // most kExchangeSamples of the exchanges since recording began (every window so far), the
  // same ones on every rank. What the
  // balancer evaluates a placement on beyond the window's sum (plan/eplb.h). May be empty.
  std::vector<std::vector<std::vector<int64_t>>> exchanges;  // [layer][sample][expert]
};

// Exchanges sampled per layer and window (a reservoir: every exchange equally likely to be kept).
inline constexpr int64_t kExchangeSamples = 128;

// {"experts", "top_k", "groups", "ranks", "window": {"steps", "tokens"}, "expert_imbalance",
//  "layers": [{"layer", "counts": [E], "imbalance"?, "exchanges"?: [[E], ...]}]}
std::string ExpertLoadToJson(const ExpertLoad& load);
// Errors name `source` and the field at fault.
Result<ExpertLoad> ParseExpertLoad(const std::string& json_text, const std::string& source);

// Σ busiest / Σ mean over exchanges. rows[r][i]: rows rank r received in exchange i; every
// rank lists the same exchanges. Exchanges where no rank received anything count nothing.
// `per_layer` (optional): the same ratio for each exchange's layer, given exchange_layer[i] as
// an index into the result. `sums` (optional): the two sums themselves.
double ImbalanceOverExchanges(const std::vector<std::vector<int64_t>>& rows,
                              const std::vector<int32_t>& exchange_layer = {},
                              std::vector<double>* per_layer = nullptr, size_t layers = 0,
                              std::pair<double, double>* sums = nullptr);

// Counts one rank's routed slots per logical expert as the MoE executors route them, and the
// rows each of its expert-parallel exchanges brought this rank. Thread-safe: the engine's
// thread records while another may take a snapshot.
class ExpertLoadRecorder {
 public:
  // layers: the MoE layer indices the model runs (main layers, then MTP blocks).
  ExpertLoadRecorder(std::vector<int64_t> layers, int64_t experts, int64_t top_k);

  // A layer's routing of this rank's tokens. A step begins when the first MoE layer is routed
  // after any other layer (micro-batches of one layer follow each other; an MTP pass routes
  // only its own block and counts no step).
  void Record(int64_t layer, const ExpertRouting& routing);
  // Rows this rank received for its experts in one exchange of `layer`.
  void RecordExchange(int64_t layer, int64_t received_rows);

  // This rank's counts so far (imbalance unset: one rank cannot know it).
  ExpertLoad Snapshot() const;
  // Rows received per exchange, in order, with each exchange's index into layers().
  void Exchanges(std::vector<int64_t>* rows, std::vector<int32_t>* layer_index) const;
  // Starts a new window. The sampled exchanges carry on: a sample of every window so far.
  void Clear();
  // Every `steps` steps, as the next step begins (at its first MoE layer, on every rank at the
  // same point of the forward pass: a collective may run there), calls `on_window_end`, which is
  // expected to take the window and Clear.
  void SetWindow(int64_t steps, std::function<void()> on_window_end);
  // Calls `on_step_begin` as every step begins, at the same point, before a window's end: where
  // an online expert move switches layers (parallel/expert_migration.h). Empty: none.
  void SetStepBegin(std::function<void()> on_step_begin);
  const std::vector<int64_t>& layers() const { return layers_; }
  int64_t steps() const;

 private:
  int LayerIndex(int64_t layer) const;

  mutable std::mutex mutex_;
  std::function<void()> on_step_begin_;
  std::vector<int64_t> layers_;
  int64_t experts_, top_k_;
  std::vector<std::vector<int64_t>> counts_;
  int64_t steps_ = 0, tokens_ = 0;
  int64_t last_layer_ = -1;
  std::vector<int64_t> exchange_rows_;
  std::vector<int32_t> exchange_layer_;
  std::vector<std::vector<std::vector<int64_t>>> samples_;  // ExpertLoad::exchanges, this rank's
  std::vector<int64_t> routed_;                             // Record calls per layer this window
  int64_t window_steps_ = 0;
  std::function<void()> on_window_end_;
};

}  // namespace sy
