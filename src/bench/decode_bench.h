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
  double load_seconds = 0;  // Model::Load, with the page cache as the run found it
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

// `bench decode --against B`: two checkpoints (or one loaded twice) in one process, their decode
// steps alternated A, B, B, A, … so both meet the same moments of a shared machine; per batch the
// median step of each and the median of the per-step ratios (B's step time over A's, the pair's
// neighbouring steps), with its quartiles. On a VM whose bandwidth moves by 2x between minutes,
// processes run one after another need many repetitions to say what this says in one run.
struct PairedDecodeResult {
  int64_t batch = 0;
  double a_tokens_per_second = 0, b_tokens_per_second = 0;
  double ratio_median = 0, ratio_q1 = 0, ratio_q3 = 0;  // B's step time / A's
  int64_t pairs = 0;
};
Result<std::vector<PairedDecodeResult>> BenchDecodePaired(const std::string& model_a,
                                                          const std::string& model_b,
                                                          const DecodeBenchOptions& options);
std::string PairedDecodeTable(const std::string& model_a, const std::string& model_b,
                              const std::vector<PairedDecodeResult>& results);

}  // namespace sy::bench
