// Online expert moves. After rank 0 rebalances (plan/eplb.h), the experts that each rank's new
// slots need travel from a rank that holds them now, over MPI, on a thread of their own, while
// the engine keeps stepping with the old placement. The move goes layer by layer: once every
// rank holds a layer's arrivals, every rank switches that layer's experts and dispatch at the
// same step boundary (where the expert-load recorder marks a step's start), so no step waits for
// weights to travel and no step sees two placements in one layer. At most `staged_layers`
// layers' arrivals wait in memory beside the experts in use: with 2 the move is double-buffered,
// one layer waiting for its switch while the next one travels.
//
// What travels is each expert as its holder keeps it (model/expert_wire.h), so a moved expert is
// the bytes the loader would have made of the checkpoint (SWITCHYARD_VERIFY_EXPERT_MOVES=1 checks
// each arrival against a fresh load and ends the job on a difference).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"
#include "model/expert_placement.h"
#include "model/model.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"

namespace sy {

struct ExpertMove {
  size_t layer_index = 0;  // into the next placement's layers
  int32_t expert = 0;      // logical expert
  int source = 0;          // a rank that holds it under the current placement
  int destination = 0;     // a rank that holds it under the next and not the current
};

// Every expert a rank holds under `next` and not under `current`, once per rank, each from the
// holder under `current` with the fewest moves of that layer assigned so far (ties: the lowest
// rank), so sources share the work. Ordered by layer, destination, expert. The placements have
// the same ranks and slots; a layer of `next` that `current` does not name moves nothing.
std::vector<ExpertMove> PlanExpertMoves(const ExpertPlacement& current,
                                        const ExpertPlacement& next);

class ExpertMigration {
 public:
  struct Options {
    size_t staged_layers = 2;  // layers whose arrivals may wait for their switch
    bool background = true;    // false: every layer moves inside Start (no thread)
    bool verify = false;       // compare every arrival with a fresh load from the checkpoint
    // When the step that starts the move began (its report counts the decision in that step);
    // default: when the move starts.
    std::chrono::steady_clock::time_point step_began{};
  };
  // Starts moving from `current` to `next` (collective: every rank calls it at the same step
  // boundary). `placement` is the run's placement, updated layer by layer as layers switch;
  // `comm` is duplicated for the moving thread.
  ExpertMigration(Communicator& comm, Model& model, ExpertParallelMoe& moe,
                  ExpertPlacement& placement, ExpertPlacement next, Options options);
  // Lets the moving thread finish every layer (its peers move the same layers), then joins it.
  ~ExpertMigration();

  // At a step's start, on every rank (collective): switches every layer that has arrived
  // everywhere. Returns true once every layer has switched.
  bool OnStepBegin();
  bool done() const { return switched_ == layers_; }

  // What the move cost, for its report: bytes this rank sent and received, experts it received,
  // seconds from Start to the last switch, and the longest step from Start on.
  struct Report {
    int64_t bytes_sent = 0, bytes_received = 0, experts_received = 0, steps = 0;
    double seconds = 0, longest_step_seconds = 0;
  };
  Report report() const;

 private:
  void MoveLayers();
  void MoveLayer(size_t layer_index);
  void SwitchLayer(size_t layer_index);

  Communicator& comm_;
  std::unique_ptr<Communicator> mover_comm_;
  Model& model_;
  ExpertParallelMoe& moe_;
  ExpertPlacement& placement_;
  const ExpertPlacement next_;
  const Options options_;
  std::vector<ExpertMove> moves_;
  const size_t layers_;

  mutable std::mutex mutex_;
  std::condition_variable switched_changed_;
  size_t arrived_ = 0;   // layers whose moves this rank has finished (mover thread)
  size_t switched_ = 0;  // layers switched on every rank (stepping thread)
  bool finishing_ = false;
  Status failure_ = Status::Ok();
  std::vector<std::map<int32_t, FeedForwardWeights>> arrivals_;  // by layer index
  Report report_;
  std::chrono::steady_clock::time_point start_, last_step_;
  std::thread thread_;
};

}  // namespace sy
