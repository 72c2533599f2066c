// Per-request sampling: the parameters of OpenAI's and vLLM's APIs, and the sampler that turns one
// row of logits into the next token. Reproducible for a given seed whatever else is in the batch:
// the random draw for a request's k-th token depends only on (seed, k).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "structured/compiler.h"

namespace sy {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;  // 0 or -1: off
  double min_p = 0.0;
  std::optional<uint64_t> seed;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  std::map<int32_t, double> logit_bias;
  // vLLM's allowed_token_ids: only these may be sampled (empty: any token).
  std::vector<int32_t> allowed_token_ids;
  // vLLM's bad_words as token sequences (the API tokenizes each word as it starts a text and
  // after a space): a sequence's last token may not come where the output ends with the rest of
  // it (a one-token word never comes).
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int64_t max_tokens = 16;
  int64_t min_tokens = 0;
  std::optional<int64_t> logprobs;         // top log-probabilities per generated token
  std::optional<int64_t> prompt_logprobs;  // ... per prompt token
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  // Structured output: the generated text must be in this grammar's language (the engine
  // compiles it against its vocabulary and masks every token the grammar does not allow).
  std::optional<structured::GrammarSpec> grammar;
  // The reasoning budget (vLLM's thinking_token_budget; Anthropic's thinking.budget_tokens): at
  // most this many generated tokens inside each thinking section ("<think>" … "</think>"). Where
  // a section has used it, the next token is "</think>" whatever the model would sample, and the
  // output goes on to its answer. Prompt tokens are not counted (R1's template writes "<think>\n"
  // into the prompt; a continued message's thinking was not generated under this budget).
  std::optional<int64_t> thinking_token_budget;
  // The output starts inside a thinking section that its prompt does not open (DeepSeek-R1's
  // first template, whose generation prompt leaves "<think>" to the model; the chat path knows).
  // Otherwise the prompt tells: inside when its last "<think>" follows its last "</think>".
  bool starts_in_thinking = false;
  // Beam search (vLLM's use_beam_search; engine/beam_search.h): the width W (0: no search), and
  // the exponent of the length that divides a beam's cumulative log-probability when beams of
  // different lengths are ranked. A search runs above the engine (BeamSearchFrontend), which
  // refuses a request that still carries one.
  int64_t beam_width = 0;
  double length_penalty = 1.0;

  // Ranges as vLLM checks them; the message names the field.
  Status Validate(int64_t vocab_size) const;
};

// Beam search's widest: its 2W candidates per beam come as top log-probabilities, of which a
// request may ask for at most 20.
inline constexpr int64_t kMaxBeamWidth = 10;

// Whether `params` describe a beam search that engine/beam_search.h runs exactly: a width in
// [1, kMaxBeamWidth], and nothing that would change the distribution beams are ranked by. The
// message names the field.
Status CheckBeamSearchParams(const SamplingParams& params);

// The reasoning budget's bookkeeping: the marker tokens, and where a sequence stands.
struct ThinkTokens {
  int32_t begin = 0, end = 0;  // "<think>", "</think>"
};
struct ThinkingCount {
  bool open = false;  // inside a thinking section
  int64_t used = 0;   // its tokens so far (neither marker counted)
  // Past one more token: "</think>" closes the section, "<think>" opens one (a second inside an
  // open section is just another of its tokens), any other token inside it counts.
  void Add(int32_t token, const ThinkTokens& think) {
    if (token == think.end) {
      *this = {};
    } else if (!open && token == think.begin) {
      open = true;
      used = 0;
    } else if (open) {
      ++used;
    }
  }
};
// Where an output starts: inside when `starts_in_thinking` or when the prompt's first
// `prompt_length` tokens end inside a section; nothing used yet.
ThinkingCount PromptThinking(const std::vector<int32_t>& tokens, int64_t prompt_length,
                             const ThinkTokens& think, bool starts_in_thinking);

// One sampled token and what the request asked to know about it.
struct SampledToken {
  int32_t token = 0;
  float logprob = 0;  // of the model's own distribution (before temperature and penalties)
  std::vector<std::pair<int32_t, float>> top;  // the top `logprobs` alternatives, best first
};

// Log-softmax of a row of logits, in place.
void LogSoftmaxInPlace(float* row, int64_t size);

// The `count` largest entries of `row`, best first (ties: lower id first).
std::vector<std::pair<int32_t, float>> TopEntries(const float* row, int64_t size, int64_t count);

// Token counts a request has generated, for presence/frequency penalties; the prompt's token set
// for the repetition penalty.
struct PenaltyState {
  std::map<int32_t, int64_t> generated_counts;
  std::vector<uint8_t> in_prompt;  // [vocab] 1 where the prompt (or output) holds the token
};

// The distribution a request samples its next token from: the logits after penalties, bias,
// allowed and blocked tokens, temperature and top-k/top-p/min-p truncation, as probabilities of
// the kept candidates, best first. Greedy (temperature 0) is the argmax with probability 1.
// Empty where no token is left (allowed_token_ids, blocked tokens and a grammar's mask exclude
// every one): the caller ends the request with an error rather than sample anything.
struct TokenDistribution {
  std::vector<int32_t> tokens;
  std::vector<double> probs;  // sums to 1
  double Prob(int32_t token) const;
  // The token whose cumulative probability interval holds u in [0, 1).
  int32_t Draw(double u) const;
};
TokenDistribution ProcessedDistribution(const float* logits, int64_t vocab,
                                        const SamplingParams& params, const PenaltyState& penalties,
                                        const std::vector<int32_t>& blocked_tokens,
                                        std::vector<float>& scratch);

// Independent uniform streams of one request: a draw depends only on (seed, step, stream), so a
// request's tokens do not depend on what else is in the batch.
inline constexpr uint64_t kTokenStream = 0;     // the sampled token itself
inline constexpr uint64_t kDraftStream = 1;     // speculative decoding: the drafter's choice
inline constexpr uint64_t kAcceptStream = 2;    // ... the accept/reject test
inline constexpr uint64_t kResidualStream = 3;  // ... the replacement after a rejection
double UniformDraw(uint64_t seed, int64_t step, uint64_t stream);
uint64_t SamplingSeed(const SamplingParams& params);

// Fills out.logprob (and out.top) from the model's own distribution when the request asks.
void FillLogprobs(const float* logits, int64_t vocab, const SamplingParams& params,
                  std::vector<float>& scratch, SampledToken& out);

// Speculative decoding's rejection sampling (Leviathan et al. 2023; Chen et al. 2023): a draft d
// drawn from q is kept with probability min(1, p(d)/q(d)); otherwise the token comes from
// max(0, p − q) renormalized. The result is distributed exactly as p, whatever q is. Greedy is
// the case of one-hot p and q: the draft is kept when it is p's argmax, else the argmax replaces
// it. Draws come from (seed, step) on the accept and residual streams.
struct DraftVerdict {
  int32_t token = 0;
  bool kept = false;
};
DraftVerdict VerifyDraft(const TokenDistribution& p, int32_t draft, const TokenDistribution& q,
                         uint64_t seed, int64_t step, int64_t vocab,
                         std::vector<float>& dense_scratch);

// The tokens `bad_words_token_ids` forbid after `output` (the request's generated tokens).
std::vector<int32_t> BadWordTokens(const SamplingParams& params, std::span<const int32_t> output);

// Picks the next token from `logits` (one row of `vocab` values, left unchanged); -1 where no
// token is left (ProcessedDistribution).
// `step` numbers the request's generated tokens from 0 (the random stream's position).
// `eos_blocked`: min_tokens not reached yet, so end-of-sequence and stop tokens are masked.
SampledToken SampleToken(const float* logits, int64_t vocab, const SamplingParams& params,
                         const PenaltyState& penalties, int64_t step,
                         const std::vector<int32_t>& blocked_tokens, std::vector<float>& scratch);

}  // namespace sy
