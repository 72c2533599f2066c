// Everything a rank of an mpirun launch (or a lone process) runs the model with: the
// communicator, the model with this rank's share of the routed experts (and of the heads under
// TP), and the executors that spread MoE layers and attention. Shared by the verbs and serve.
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/status.h"
#include "model/expert_load.h"
#include "model/expert_placement.h"
#include "model/model.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel.h"

namespace sy {

struct ParallelOptions {
  std::string wire_dtype = "bf16";        // rows on the wire between ranks
  std::string overlap = "none";           // none | dispatch | microbatch
  int tp = 1;                             // tensor-parallel ranks per DP group (consecutive ranks)
  std::string attention_split = "heads";  // heads | sp-tp-sp
  std::string progress_thread = "on";     // a thread advancing started exchanges
  int64_t redundant_experts = 0;          // R: each rank holds (E + R) / N physical experts
  std::string replica_dispatch = "balanced";  // own-rank | spread | balanced (ReplicaDispatch)
  std::string expert_placement;               // a placement file (`switchyard eplb`); "" = default
  bool record_expert_load = false;            // count routed slots per expert (ParallelRun::load)
  // serve: each window's load to this file, its imbalance to /metrics (cli/parallel_setup.h)
  std::string expert_load_file;
  int64_t expert_load_window = 256;  // steps
  // Online expert rebalancing under mpirun: every this many steps a new placement from the
  // window's load (plan/eplb.h), the experts that change loaded on every rank; 0: never.
  int64_t eplb_interval = 0;
  // A new placement is moved to only when it lowers the predicted per-exchange imbalance by at
  // least this much: windows of 8 steps on bench-eplb.sh's skewed workload swung it by about
  // ±0.02 from one to the next with no gain overall. Negative: move to every new placement.
  double eplb_min_gain = 0.02;
};

struct OnlineRebalance;  // parallel_run.cc: the expert move in progress

struct ParallelRun {
  Communicator* comm = nullptr;
  std::unique_ptr<Communicator> tp_group;  // this rank's TP group (TP > 1)
  std::unique_ptr<Model> model;
  std::unique_ptr<ExpertParallelMoe> moe;  // null with one rank
  std::unique_ptr<MoeExecutor> tp_moe;     // tokens split over the TP group before EP
  std::unique_ptr<AttentionGroup> tp_attention;
  std::unique_ptr<ExpertPlacement> placement;  // null: the contiguous one, no redundant experts
  std::unique_ptr<ExpertLoadRecorder> load;    // with ParallelOptions::record_expert_load
  std::unique_ptr<LocalMoe> local_moe;         // one rank, recording: experts in this process
  bool rebalance = false;                      // ParallelOptions::eplb_interval > 0
  double eplb_min_gain = 0;                    // ParallelOptions::eplb_min_gain
  int tp = 1;
  int dp_group = 0;
  bool sequence_parallel = false;  // SP-TP-SP attention: each rank holds a token shard
  bool micro_batches = false;
  ForwardOptions Options() const {
    ForwardOptions options;
    options.moe = tp_moe && !sequence_parallel ? tp_moe.get() : moe.get();
    if (options.moe == nullptr) options.moe = local_moe.get();
    options.attention_group = tp_attention.get();
    options.attention_split =
        sequence_parallel ? AttentionSplit::kSequence : AttentionSplit::kHeads;
    options.micro_batches = micro_batches;
    return options;
  }
  int dp() const { return comm->size() / tp; }
  // Sequence s runs on DP group s % DP — on every rank of that group.
  bool Owns(size_t sequence) const { return static_cast<int>(sequence % dp()) == dp_group; }
  // The first rank of the group reports the group's results.
  bool Reports(size_t sequence) const { return Owns(sequence) && comm->rank() % tp == 0; }
  // Σ busiest and Σ mean rows of the windows RecordExpertLoadWindows has closed (and cleared
  // from the recorder): GatherExpertLoad(run) adds them, so a run's imbalance covers all of it.
  std::shared_ptr<std::pair<double, double>> closed_windows;
  // Online rebalancing's state (RecordExpertLoadWindows). Last: it is destroyed first, its
  // moving thread joined before the model it reads goes.
  std::shared_ptr<OnlineRebalance> online_rebalance;
};

// Loads the model on every rank with this rank's share of the experts and heads, and the
// executors that spread MoE layers and attention; reports each rank's share and memory on
// stderr. One rank: an error comes back. Several: every rank is ended, the one that knows says
// why (a peer cannot be left waiting in a collective).
Result<ParallelRun> LoadParallelRun(const std::string& directory, const ParallelOptions& options);

// The MoE layers a model runs: main layers, then its MTP blocks when `with_mtp`.
std::vector<int64_t> MoeLayers(const ModelConfig& config, bool with_mtp);

// Rank 0 receives the expert load recorded on every rank since the last Clear: counts summed,
// steps (every rank steps alike), tokens summed, and under expert parallelism the imbalance
// over every exchange. Other ranks get an empty load. Collective over all ranks; needs
// ParallelOptions::record_expert_load. With windows (RecordExpertLoadWindows), the counts are
// the last window's but the imbalance covers the whole run.
ExpertLoad GatherExpertLoad(const ParallelRun& run);
ExpertLoad GatherExpertLoad(Communicator& comm, const ExpertLoadRecorder& recorder, int64_t groups);

// Windows of `steps` steps: at the end of each, every rank gathers the window's load (the
// collective above) and starts the next; with online rebalancing every rank then takes rank 0's
// new placement (experts loaded, dispatch switched) before the step goes on; rank 0 hands the
// load to `on_window` (may be empty) on the stepping thread. The run's communicator, model,
// executor and recorder must outlive the stepping (moving the run is fine).
void RecordExpertLoadWindows(ParallelRun& run, int64_t steps,
                             std::function<void(const ExpertLoad&)> on_window);

// Rank 0 receives every sequence's values (each reported by the first rank of its DP group),
// indexed by sequence; other ranks get an empty list. Collective over all ranks. T: 4-byte
// values (token ids, f32 logits).
template <typename T>
std::vector<std::vector<T>> GatherSequencesToRoot(const ParallelRun& run,
                                                  const std::vector<std::vector<T>>& per_sequence) {
  static_assert(sizeof(T) == 4 && std::is_trivially_copyable_v<T>);
  std::vector<uint8_t> mine;  // records: [sequence index, value count] (int64), then the values
  for (size_t s = 0; s < per_sequence.size(); ++s) {
    if (!run.Reports(s)) continue;
    const int64_t header[2] = {static_cast<int64_t>(s),
                               static_cast<int64_t>(per_sequence[s].size())};
    const auto* h = reinterpret_cast<const uint8_t*>(header);
    const auto* v = reinterpret_cast<const uint8_t*>(per_sequence[s].data());
    mine.insert(mine.end(), h, h + sizeof(header));
    mine.insert(mine.end(), v, v + per_sequence[s].size() * sizeof(T));
  }
  std::vector<uint8_t> all = run.comm->GatherToRoot(mine);
  if (run.comm->rank() != 0) return {};
  std::vector<std::vector<T>> ordered(per_sequence.size());
  for (size_t at = 0; at < all.size();) {
    int64_t header[2];
    std::memcpy(header, all.data() + at, sizeof(header));
    at += sizeof(header);
    ordered[header[0]].resize(static_cast<size_t>(header[1]));
    std::memcpy(ordered[header[0]].data(), all.data() + at, static_cast<size_t>(header[1]) * 4);
    at += static_cast<size_t>(header[1]) * 4;
  }
  return ordered;
}

}  // namespace sy
