// `switchyard bench mtp` (also `bench speculative`): greedy decoding with drafts (K = 1, 2, …) —
// the MTP module's, or n-gram lookup's (--speculative ngram) — side by side with plain decoding
// (K = 0) in one run, at several batch sizes, on held-out prompts. Reports decode
// throughput (median of repeats) with its ratio to the plain run of the same batch, the
// acceptance rate per draft position, tokens per step, and whether the tokens equal the plain
// run's (they must: greedy verification keeps the model's own output).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "model/ngram_drafter.h"
#include "parallel/parallel_run.h"
#include "tokenizer/text_codec.h"

namespace sy::bench {

struct MtpBenchOptions {
  std::string prompts;  // JSON Lines of {"text": ...}; prompts are cycled to fill a batch
  std::vector<int64_t> batches = {1, 8, 32};
  std::vector<int64_t> draft_counts = {1, 2, 3};
  int64_t max_tokens = 64;
  int repeats = 3;
  DType kv_dtype = DType::kBF16;
  Drafter drafter = Drafter::kMtp;
  NgramLookup ngram;
};

struct MtpBenchRow {
  int64_t batch = 0, draft_tokens = 0;  // K (0: plain decoding)
  double median_tokens_per_second = 0, min_tokens_per_second = 0, max_tokens_per_second = 0;
  double speedup = 1;     // median over the plain run's median, same batch
  double acceptance = 0;  // drafts kept / drafts proposed
  std::vector<double> acceptance_per_position;
  double tokens_per_step = 1;
  // Draft tokens proposed per sequence step: K for MTP; for n-gram lookup, where a suffix recurs.
  double drafts_per_step = 0;
  bool same_tokens = true;  // as the plain run's
};

struct MtpBenchReport {
  std::vector<MtpBenchRow> rows;
  Drafter drafter = Drafter::kMtp;
  NgramLookup ngram;
  int64_t prompts = 0, mean_prompt_tokens = 0, max_tokens = 0;
  int repeats = 0;
};

// Prompts from JSON Lines of {"text": ...}, encoded; an error names the file and line.
Result<std::vector<std::vector<int32_t>>> LoadPrompts(const std::string& path,
                                                      const TextCodec& codec);

// One process (or every rank of an mpirun job, alike).
Result<MtpBenchReport> BenchMtp(const ParallelRun& run, const TextCodec& codec,
                                const MtpBenchOptions& options);
std::string MtpReportTable(const MtpBenchReport& report);
std::string MtpReportJson(const MtpBenchReport& report);

}  // namespace sy::bench
