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

namespace sy {

struct ParallelArgs {
  std::string wire_dtype = "bf16";  // rows on the wire between ranks
  std::string overlap = "none";     // none | dispatch
};

struct ParallelRun {
  Communicator* comm = nullptr;
  std::unique_ptr<Model> model;
  std::unique_ptr<ExpertParallelMoe> moe;  // null with one rank
  ForwardOptions Options() const {
    ForwardOptions options;
    options.moe = moe.get();
    return options;
  }
  // Sequence s runs on rank s % size (each rank is one DP group).
  bool Owns(size_t sequence) const {
    return static_cast<int>(sequence % comm->size()) == comm->rank();
  }
};

// Loads the model on every rank (aborting every rank, with the reason, if any rank fails) and
// reports each rank's share and memory on stderr.
ParallelRun LoadParallel(const std::string& directory, const ParallelArgs& args);

// Registers --wire-dtype and --overlap on a verb.
void AddParallelOptions(CLI::App* verb, ParallelArgs& args);

// Fails every rank alike: a message on rank 0, then a non-zero exit everywhere.
[[noreturn]] void FailEverywhere(Communicator& comm, const std::string& message);

}  // namespace sy
