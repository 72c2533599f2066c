// `switchyard bench beam-search`: what a beam search costs against sampling the same number of
// sequences. For each width W, `searches` prompts at once either run a beam search of width W
// (engine/beam_search.h: a step's one-token requests per live beam) or sample n = W sequences
// each, both max_tokens long (ignore_eos), on one engine in this process; repeats interleave the
// two. Reports the output tokens per second of each (median), the beam search's ratio to
// sampling, and what its steps recomputed: prompt tokens computed per output token (the part of
// each beam past its last full cached page) and the prefix cache's share of what was looked up.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "parallel/parallel_run.h"
#include "tokenizer/text_codec.h"

namespace sy::bench {

struct BeamBenchOptions {
  std::string prompts;  // JSON Lines of {"text": ...}
  std::vector<int64_t> widths = {2, 4, 8};
  int64_t searches = 4;  // prompts at once
  int64_t max_tokens = 32;
  int repeats = 3;
  DType kv_dtype = DType::kBF16;
  bool keep_partial_pages = true;     // EngineConfig's (off: every step recomputes partial pages)
  bool wait_for_shared_pages = true;  // EngineConfig's (off: n samples each compute the prompt)
};

struct BeamBenchRow {
  int64_t width = 0;
  double beam_tokens_per_second = 0, sample_tokens_per_second = 0;  // medians
  double ratio = 0;                                                 // beam ÷ sampling
  double computed_per_output = 0;  // the search's prompt tokens computed per output token
  double cache_share = 0;          // of the prompt tokens its steps looked up, found cached
  double steps_per_token = 0;      // engine steps per generated position
};

struct BeamBenchReport {
  std::vector<BeamBenchRow> rows;
  int64_t searches = 0, max_tokens = 0, mean_prompt_tokens = 0, page_size = 0;
  int repeats = 0;
  bool keep_partial_pages = true, wait_for_shared_pages = true;
};

// One process (the searches run on this process's engine).
Result<BeamBenchReport> BenchBeamSearch(const ParallelRun& run, const TextCodec& codec,
                                        const BeamBenchOptions& options);
std::string BeamReportTable(const BeamBenchReport& report);
std::string BeamReportJson(const BeamBenchReport& report);

}  // namespace sy::bench
