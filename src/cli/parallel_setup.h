// What a verb needs to run on every rank of an mpirun launch (or alone): the parallel options on
// the command line, and loading (parallel/parallel_run.h) that fails the verb with the reason.
#pragma once

#include <CLI/CLI.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "parallel/parallel_run.h"

namespace sy {

// The command-line face of parallel_run.h: options, and loading that fails the verb.
using ParallelArgs = ParallelOptions;

// Loads the model on every rank (aborting every rank, with the reason, if any rank fails).
ParallelRun LoadParallel(const std::string& directory, const ParallelArgs& args);

// Registers --wire-dtype and --overlap on a verb.
void AddParallelOptions(CLI::App* verb, ParallelArgs& args);

// A server's --record-expert-load FILE and --expert-load-window STEPS: LoadParallel then writes
// each window's load to FILE and, under mpirun, its imbalance to /metrics.
void AddExpertLoadWindowOptions(CLI::App* verb, ParallelArgs& args);

// Fails every rank alike: a message on rank 0, then a non-zero exit everywhere.
[[noreturn]] void FailEverywhere(Communicator& comm, const std::string& message);

}  // namespace sy
