// What a verb needs to run on every rank of an mpirun launch (or alone): the communicator, the
// model with this rank's share of the routed experts, and the executor that spreads MoE layers.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel.h"

namespace sy {

struct ParallelArgs {
  std::string wire_dtype = "bf16";  // rows on the wire between ranks
  std::string overlap = "none";     // none | dispatch | microbatch
  int tp = 1;                       // tensor-parallel ranks per DP group (consecutive ranks)
};

struct ParallelRun {
  Communicator* comm = nullptr;
  std::unique_ptr<Communicator> tp_group;  // this rank's TP group (TP > 1)
  std::unique_ptr<Model> model;
  std::unique_ptr<ExpertParallelMoe> moe;  // null with one rank
  std::unique_ptr<MoeExecutor> tp_moe;     // tokens split over the TP group before EP
  std::unique_ptr<AttentionReducer> tp_attention;
  int tp = 1;
  int dp_group = 0;
  ForwardOptions Options() const {
    ForwardOptions options;
    options.moe = tp_moe ? tp_moe.get() : moe.get();
    options.attention_reduce = tp_attention.get();
    return options;
  }
  int dp() const { return comm->size() / tp; }
  // Sequence s runs on DP group s % DP — on every rank of that group.
  bool Owns(size_t sequence) const { return static_cast<int>(sequence % dp()) == dp_group; }
  // The first rank of the group reports the group's results.
  bool Reports(size_t sequence) const { return Owns(sequence) && comm->rank() % tp == 0; }
};

// Loads the model on every rank (aborting every rank, with the reason, if any rank fails) and
// reports each rank's share and memory on stderr.
ParallelRun LoadParallel(const std::string& directory, const ParallelArgs& args);

// Registers --wire-dtype and --overlap on a verb.
void AddParallelOptions(CLI::App* verb, ParallelArgs& args);

// Fails every rank alike: a message on rank 0, then a non-zero exit everywhere.
[[noreturn]] void FailEverywhere(Communicator& comm, const std::string& message);

}  // namespace sy
