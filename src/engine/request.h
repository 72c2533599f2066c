// What passes between the engine's step loop and whoever submitted a request: the request
// itself, and a stream of events (tokens, text, log-probabilities, the finish) the step loop
// appends to and the server drains. Appending never blocks on the reader: a slow client costs
// memory for its own events, never step time.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/handoff.h"
#include "engine/sampling.h"

namespace sy {

struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  // Under --scheduling-policy priority, lower runs first (vLLM's field; 0 by default, and only 0
  // under first come, first served).
  int64_t priority = 0;
  // Background work (a batch's line): it runs behind every other request under either policy —
  // admitted only where no other request waits, and preempted (recomputed later, losing nothing)
  // when one needs its slot or pages — so that batches beside live traffic cost the live
  // requests little. Among background requests `priority` and arrival order as usual.
  bool background = false;
  // A request resumed elsewhere (a router's failover): the last `resumed_tokens` ids of `prompt`
  // are its own output so far. They count as generated — the sampler's step, penalties,
  // min/max_tokens and the stop-string state continue from them — and are not sent again.
  int64_t resumed_tokens = 0;
  // Disaggregation (engine/handoff.h). A prefill instance's request: its rows go to the sink as
  // they are computed, and it ends ("transferred") once its first token is sampled and sent.
  std::shared_ptr<KvSink> kv_sink = nullptr;
  // A decode instance's request: `prompt` ends with the token the prefill instance sampled (so
  // resumed_tokens ≥ 1) and these are the rows of every position before it.
  std::shared_ptr<const ImportedRows> imported = nullptr;
};

// The error a request ends with where its own constraints (allowed_token_ids, bad_words, a
// grammar, min_tokens) leave no token to sample: the request's fault, which a server reports as
// such (400 where nothing was sent yet).
inline constexpr const char* kNothingAllowedError =
    "no token may come next: allowed_token_ids, bad_words, the structured output's grammar and "
    "min_tokens together exclude every one";

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
  // Prompt log-probabilities: 1 + how many tokens were more likely (vLLM's rank); 0 elsewhere.
  int64_t rank = 0;
};

inline constexpr const char* kTransferFailedReason = "transfer_failed";

struct RequestEvent {
  std::vector<int32_t> token_ids;
  std::string text;  // the text delta these tokens complete
  std::vector<TokenLogprob> logprobs;
  // "stop", "length", "abort", "error"; "transferred": a prefill instance handed the request
  // on (its first token was the event before); kTransferFailedReason: a decode job's group never
  // received the request's rows (the gRPC service answers ABORTED, and the router redoes it).
  std::optional<std::string> finish_reason;
  std::string error;  // with "error"
  // With "stop", what stopped the request (vLLM's stop_reason): the stop string matched, or the
  // stop_token_ids entry sampled; neither for the end-of-sequence token.
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
  bool first = false;  // carries the request's prompt facts below
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;  // when asked; first is none
};

class RequestStream {
 public:
  // Called (from the step loop) after events were added; must not block.
  void SetNotifier(std::function<void()> notify) {
    std::lock_guard<std::mutex> lock(mutex_);
    notify_ = std::move(notify);
  }
  void Push(RequestEvent event) {
    std::function<void()> notify;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (event.finish_reason) finished_ = true;
      events_.push_back(std::move(event));
      notify = notify_;
    }
    if (notify) notify();
  }
  // Moves out what arrived; true once the finishing event has been taken.
  bool Drain(std::vector<RequestEvent>* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& e : events_)
      out->push_back(std::move(e));
    events_.clear();
    return finished_;
  }

 private:
  std::mutex mutex_;
  std::deque<RequestEvent> events_;
  std::function<void()> notify_;
  bool finished_ = false;
};

}  // namespace sy
