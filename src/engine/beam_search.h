// Beam search (vLLM's use_beam_search, as its V1 engine runs it): a search of width W keeps the
// W most likely continuations of one prompt. Each step asks the model for the next-token
// log-probabilities of every live beam, as ordinary one-token requests whose prompt is the beam
// (the prefix cache keeps what earlier steps computed); each beam's 2W most likely next tokens
// are the candidates. A candidate that ends its output (end of sequence, a stop token or a stop
// string) joins the finished; of the rest, the W of highest cumulative log-probability are the
// next step's beams. After max_tokens steps (or when no beam is left), the finished and the live
// are ranked by cumulative log-probability / length^length_penalty — the length counting the
// prompt and not the end-of-sequence token, as vLLM's — and the W best are the W choices.
//
// The search is deterministic: the log-probabilities are the model's own (raw), so temperature
// and the truncations (top-k, top-p, min-p) and seed do not change it. Constraints that would
// change the distribution (penalties, logit_bias, allowed_token_ids, bad_words, a grammar, a
// reasoning budget) are refused, not ignored (CheckBeamSearchParams, engine/sampling.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "engine/detokenizer.h"
#include "engine/engine.h"
#include "engine/request.h"
#include "tokenizer/tokenizer.h"

namespace sy {

// One of a search's results: a choice.
struct BeamResult {
  std::vector<int32_t> tokens;  // the output (the end-of-sequence token included, not its text)
  std::string text;
  std::vector<TokenLogprob> logprobs;  // per token, with the request's `logprobs` alternatives
  double cumulative_logprob = 0;
  double score = 0;           // what ranked it
  std::string finish_reason;  // "stop" or "length"
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
};

// The search itself, without the model: fed each step's log-probabilities, it keeps the beams.
class BeamSearch {
 public:
  // `prompt` and `params` (params.beam_width ≥ 1) as the request gives them; `eos_token_id`: the
  // model's end of sequence (-1: none), and `more_eos` its others (generation_config.json's).
  BeamSearch(const Tokenizer& tokenizer, std::vector<int32_t> prompt, SamplingParams params,
             int32_t eos_token_id, std::vector<int32_t> more_eos = {});

  int64_t width() const { return params_.beam_width; }
  // Top log-probabilities a step's request must return: the 2W candidates, or more where the
  // request's own logprobs asks for more alternatives.
  int64_t candidates_wanted() const;
  // The live beams as the prompts whose next token is wanted; empty once the search is over.
  std::vector<std::vector<int32_t>> LivePrompts() const;
  // One step: `next[i]` holds live beam i's most likely next tokens with their log-probabilities,
  // best first (at least candidates_wanted() of them where the vocabulary has that many).
  void Extend(const std::vector<std::vector<std::pair<int32_t, float>>>& next);
  bool done() const { return steps_ >= params_.max_tokens || live_.empty(); }
  // The W best (fewer where fewer exist), best first.
  std::vector<BeamResult> Best() const;

 private:
  struct Beam {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprob> logprobs;
    double cumulative_logprob = 0;
    // With stop strings: the beam's text so far, where they are looked for.
    std::shared_ptr<const IncrementalDetokenizer> detokenizer;
    std::string finish_reason;
    std::optional<std::string> stop_string;
    std::optional<int32_t> stop_token;
  };
  double Score(const Beam& beam) const;
  BeamResult Result(const Beam& beam) const;

  const Tokenizer& tokenizer_;
  std::vector<int32_t> prompt_;
  SamplingParams params_;
  bool IsEos(int32_t token) const {
    return token == eos_ || std::find(more_eos_.begin(), more_eos_.end(), token) != more_eos_.end();
  }
  int32_t eos_;
  std::vector<int32_t> more_eos_;
  int64_t steps_ = 0;
  std::vector<Beam> live_;
  std::vector<Beam> finished_;
};

// A frontend that runs beam searches over another: requests with params.beam_width W > 0 come
// as W consecutive requests of the same prompt and parameters (a plan's W choices), and each of
// their streams receives one of the W best beams, in rank order, in a single event when the
// search ends. Every other request passes through. Each search runs on a thread of its own that
// submits its steps to the inner frontend and waits for them.
class BeamSearchFrontend : public RequestFrontend {
 public:
  // `limits`: what a request must fit (its eos_token_id ends a beam).
  BeamSearchFrontend(RequestFrontend& inner, const Tokenizer& tokenizer, RequestLimits limits);
  ~BeamSearchFrontend() override;

  Result<std::shared_ptr<RequestStream>> Submit(EngineRequest request, SubmitError* error) override;
  Result<std::vector<std::shared_ptr<RequestStream>>> SubmitAll(std::vector<EngineRequest> requests,
                                                                SubmitError* error) override;
  void Abort(const std::string& id) override;
  EngineMetrics Metrics() const override;
  void Stop(bool drain) override;
  const CacheEventLog* cache_events() const override { return inner_.cache_events(); }

  // Searches running now (tests).
  int64_t running() const;

 private:
  struct Search;
  void Run(const std::shared_ptr<Search>& search);
  // Joins the threads of searches that ended (under mutex_).
  void ReapLocked();
  // Refuses new requests and ends the searches (aborted unless `drain`), joining their threads.
  void EndSearches(bool drain);

  RequestFrontend& inner_;
  const Tokenizer& tokenizer_;
  RequestLimits limits_;
  mutable std::mutex mutex_;
  bool stopping_ = false;
  std::map<std::string, std::shared_ptr<Search>> by_choice_;  // every choice id → its search
  std::vector<std::shared_ptr<Search>> searches_;
};

}  // namespace sy
