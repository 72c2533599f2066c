// Offline batched greedy decoding over a ParallelRun (one process or an mpirun job): every
// prompt prefilled at once, then one decode step for all running sequences at a time, every rank
// stepping while any has work. With drafts each step verifies them (query length 1 + K) and the
// drafter — the MTP module, or n-gram lookup in the sequence's tokens — proposes the next ones.
// `switchyard generate` and `bench mtp` run it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/ngram_drafter.h"
#include "parallel/parallel_run.h"

namespace sy {

struct BatchDecodeOptions {
  int64_t max_tokens = 16;
  bool ignore_eos = false;
  int64_t speculative_tokens = 0;   // drafts per step (0: off)
  Drafter drafter = Drafter::kMtp;  // kMtp: the model must have an MTP module
  NgramLookup ngram;
  DType kv_dtype = DType::kBF16;
  AttentionForm attention = AttentionForm::kAuto;  // kAbsorbed under --batch-invariant
};

// This rank's results; sums over ranks are the caller's (the counts are collective-free).
struct BatchDecodeResult {
  std::vector<std::vector<int32_t>> generated;  // per prompt; filled for this DP group's prompts
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t decode_steps = 0, decoded_tokens = 0;
  int64_t sequence_steps = 0;  // (sequence, decode step) pairs: tokens per step = decoded / this
  int64_t draft_tokens = 0, accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;  // [speculative_tokens] drafts kept there
  std::vector<int64_t> drafted_per_position;   // [speculative_tokens] steps with a draft there
};

// Prompt ids must be valid and fit the context (the caller checks, on every rank alike); a
// failing step ends the job (Communicator::Abort) — it would be a bug.
BatchDecodeResult BatchDecode(const ParallelRun& run,
                              const std::vector<std::vector<int32_t>>& prompts,
                              const BatchDecodeOptions& options);

}  // namespace sy
