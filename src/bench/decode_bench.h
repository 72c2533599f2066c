// `switchyard bench decode --model DIR`: end-to-end greedy decode at batch 1…64 next to the
// memory-bandwidth bound for that batch: the bytes a step must read (every weight it uses once,
// the expected distinct experts, the latent cache) over the read bandwidth measured in the run —
// at the start and beside every batch, the best reading taken as the machine's peak.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "bench/machine_peaks.h"

namespace sy::bench {

struct DecodeResult {
  int64_t batch = 0;
  double tokens_per_second = 0;
  double bytes_per_step = 0;
  double bound_tokens_per_second = 0;  // batch / (bytes_per_step / the run's best read reading)
  double read_gbps_beside = 0;         // the better of the readings just before and after it
  // Memory: the checkpoint's files, resident memory right after loading, and after this batch
  // ran (the latent cache for its tokens allocated and in use).
  double checkpoint_bytes = 0;
  double rss_after_load_bytes = 0;
  double rss_after_batch_bytes = 0;
  double cache_bytes = 0;
};

struct DecodeBenchOptions {
  std::vector<int64_t> batches = {1, 2, 4, 8, 16, 32, 64};
  int64_t prompt_len = 32;
  int64_t steps = 16;
};

// Raises peaks.read_gbps to the best reading of the run.
Result<std::vector<DecodeResult>> BenchDecode(const std::string& model_dir, MachinePeaks& peaks,
                                              const DecodeBenchOptions& options);
std::string DecodeResultsTable(const MachinePeaks& peaks, const std::vector<DecodeResult>& results);

}  // namespace sy::bench
