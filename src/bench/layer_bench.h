// `switchyard bench layer`: DeepSeek-V3-sized MoE layers on this machine — fp8 weights
// generated in memory, the routed experts of one EP rank, a latent cache of kv_len tokens per
// request — run by the engine's own schedule (model/decoder_schedule.h) and timed stage by stage
// for batches 1…128 and query lengths 1 and 2: the CPU counterpart of the seed's per-layer
// figure. Several overlap modes run side by side in one process, batch by batch, so their
// ratios to no-overlap share the machine's state of the moment.
#pragma once

#include <string>
#include <vector>

#include "base/stage_timer.h"
#include "bench/machine_peaks.h"

namespace sy::bench {

struct LayerBenchOptions {
  int ep = 8;  // each rank holds 256 / ep routed experts
  // Under mpirun with N ranks the exchange is real: tokens route over the N ranks' experts
  // (N × 256/ep of them) and travel by dispatch and combine in each of these overlap modes.
  std::vector<std::string> overlaps = {"none"};
  // Consecutive MoE layers per run (results are per layer): with two or more, micro-batch A's
  // combine of one layer overlaps B's work as it does inside the model.
  int layers = 2;
  std::vector<int64_t> batches = {1, 2, 4, 8, 16, 32, 64, 128};
  std::vector<int64_t> query_lengths = {1, 2};
  int64_t kv_len = 5000;
  int repetitions = 3;
};

struct LayerResult {
  std::string overlap;
  int64_t batch = 0;
  int64_t query_len = 0;
  StageTimes stages;  // median per stage, seconds
  double total = 0;   // median of the whole layer, seconds
  double experts_active = 0;
  int ranks = 1;
  double remote_bytes = 0;  // sent to other ranks per layer (dispatch + combine)
};

std::vector<LayerResult> BenchLayer(const LayerBenchOptions& options);
std::string LayerResultsTable(const LayerBenchOptions& options,
                              const std::vector<LayerResult>& results);
std::string LayerResultsJson(const LayerBenchOptions& options,
                             const std::vector<LayerResult>& results);

}  // namespace sy::bench
