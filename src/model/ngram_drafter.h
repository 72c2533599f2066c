// The n-gram "draft model" of speculative decoding (vLLM's `ngram` method, prompt lookup): where
// the tokens so far end with an n-gram that occurred before, the tokens that followed it then are
// proposed as what comes next. It costs no forward pass and needs no draft weights, so any
// checkpoint can use it (a GGUF or int4 file without an MTP module too); it pays where output
// repeats its context — quoting, summarizing, editing code, reformatting, a model looping.
// Verification keeps the output exactly the model's (engine/sampling.h VerifyDraft: a draft is a
// one-hot q), so the drafter only changes how many tokens a step yields.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sy {

// What drafts the tokens a speculative decoding step verifies: the checkpoint's MTP module
// (Model::ForwardMtp), or n-gram lookup in the sequence's own tokens (below).
enum class Drafter { kMtp, kNgram };

struct NgramLookup {
  // The suffix lengths tried, longest first (vLLM's prompt_lookup_min / prompt_lookup_max).
  int64_t min_n = 2, max_n = 5;
  // How many drafts a match earns. By match (the default): one for a match of min_n tokens and
  // one more for each token it is longer, at most k — a longer match is likelier to go on, and
  // on a CPU every verified row costs (docs/benchmarks.md: as many tokens per step for 40% of
  // the rows). Otherwise k whatever the match, as vLLM drafts.
  bool drafts_by_match = true;
};

// Drafts for the sequence `tokens` (prompt then output): the longest suffix of length n in
// [min_n, max_n] that also occurs ending earlier (the occurrence may overlap the suffix), at its
// earliest such place, as vLLM picks it; the drafts are the tokens after that occurrence, up to
// the sequence's end, at most `k` (and n − min_n + 1 by match). None where no suffix recurs.
std::vector<int32_t> NgramDrafts(std::span<const int32_t> tokens, const NgramLookup& lookup,
                                 int64_t k);

}  // namespace sy
