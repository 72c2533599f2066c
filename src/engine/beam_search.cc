#include "engine/beam_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <thread>

namespace sy {

BeamSearch::BeamSearch(const Tokenizer& tokenizer, std::vector<int32_t> prompt,
                       SamplingParams params, int32_t eos_token_id, std::vector<int32_t> more_eos)
    : tokenizer_(tokenizer),
      prompt_(std::move(prompt)),
      params_(std::move(params)),
      eos_(eos_token_id),
      more_eos_(std::move(more_eos)) {
  Beam first;
  if (!params_.stop.empty())
    first.detokenizer = std::make_shared<IncrementalDetokenizer>(
        tokenizer_, params_.stop, params_.skip_special_tokens, params_.include_stop_str_in_output);
  live_.push_back(std::move(first));
}

int64_t BeamSearch::candidates_wanted() const {
  return std::max<int64_t>(2 * params_.beam_width, params_.logprobs.value_or(0));
}

std::vector<std::vector<int32_t>> BeamSearch::LivePrompts() const {
  std::vector<std::vector<int32_t>> prompts;
  if (done()) return prompts;
  for (const Beam& beam : live_) {
    std::vector<int32_t> prompt = prompt_;
    prompt.insert(prompt.end(), beam.tokens.begin(), beam.tokens.end());
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

void BeamSearch::Extend(const std::vector<std::vector<std::pair<int32_t, float>>>& next) {
  struct Candidate {
    double cumulative_logprob;
    size_t beam, rank;
    std::shared_ptr<const IncrementalDetokenizer> detokenizer;
  };
  std::vector<Candidate> growing;
  const size_t per_beam = static_cast<size_t>(2 * params_.beam_width);
  const size_t alternatives = static_cast<size_t>(params_.logprobs.value_or(0));
  auto extended = [&](size_t b, size_t rank) {
    const Beam& parent = live_[b];
    const auto& [token, logprob] = next[b][rank];
    Beam beam = parent;
    beam.tokens.push_back(token);
    beam.cumulative_logprob = parent.cumulative_logprob + logprob;
    if (params_.logprobs) {
      TokenLogprob entry{token, logprob, {}, 0};
      entry.top.assign(next[b].begin(), next[b].begin() + std::min(alternatives, next[b].size()));
      beam.logprobs.push_back(std::move(entry));
    }
    return beam;
  };
  for (size_t b = 0; b < live_.size() && b < next.size(); ++b) {
    const Beam& parent = live_[b];
    // min_tokens holds back the end of the output, as the engine's sampler does.
    const bool may_end = static_cast<int64_t>(parent.tokens.size()) >= params_.min_tokens;
    for (size_t rank = 0; rank < std::min(per_beam, next[b].size()); ++rank) {
      const auto& [token, logprob] = next[b][rank];
      if (!std::isfinite(logprob)) continue;
      const bool eos = !params_.ignore_eos && IsEos(token);
      const bool stop_token =
          std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) !=
          params_.stop_token_ids.end();
      if (eos || stop_token) {
        if (!may_end) continue;
        Beam beam = extended(b, rank);
        beam.finish_reason = "stop";
        if (!eos) beam.stop_token = token;
        finished_.push_back(std::move(beam));
        continue;
      }
      std::shared_ptr<const IncrementalDetokenizer> detokenizer;
      if (parent.detokenizer) {
        auto text = std::make_shared<IncrementalDetokenizer>(*parent.detokenizer);
        bool stopped = false;
        text->Add(token, &stopped);
        if (stopped) {
          Beam beam = extended(b, rank);
          beam.finish_reason = "stop";
          beam.stop_string = text->matched_stop();
          finished_.push_back(std::move(beam));
          continue;
        }
        detokenizer = std::move(text);
      }
      growing.push_back({parent.cumulative_logprob + logprob, b, rank, std::move(detokenizer)});
    }
  }
  // Best first; among equals, the earlier beam's and then the likelier token's (stable).
  std::stable_sort(growing.begin(), growing.end(), [](const Candidate& a, const Candidate& b) {
    return a.cumulative_logprob > b.cumulative_logprob;
  });
  if (growing.size() > static_cast<size_t>(params_.beam_width))
    growing.resize(static_cast<size_t>(params_.beam_width));
  std::vector<Beam> live;
  for (Candidate& c : growing) {
    Beam beam = extended(c.beam, c.rank);
    beam.detokenizer = std::move(c.detokenizer);
    live.push_back(std::move(beam));
  }
  live_ = std::move(live);
  ++steps_;
}

double BeamSearch::Score(const Beam& beam) const {
  // vLLM's length: the prompt and the output, without an end-of-sequence token that ends it.
  int64_t length = static_cast<int64_t>(prompt_.size() + beam.tokens.size());
  if (!beam.tokens.empty() && IsEos(beam.tokens.back()) && !params_.ignore_eos) --length;
  return beam.cumulative_logprob /
         std::pow(static_cast<double>(std::max<int64_t>(length, 1)), params_.length_penalty);
}

BeamResult BeamSearch::Result(const Beam& beam) const {
  BeamResult out;
  out.tokens = beam.tokens;
  out.logprobs = beam.logprobs;
  out.cumulative_logprob = beam.cumulative_logprob;
  out.score = Score(beam);
  out.finish_reason = beam.finish_reason.empty() ? "length" : beam.finish_reason;
  out.stop_string = beam.stop_string;
  out.stop_token = beam.stop_token;
  // The text as the engine would have streamed it: through the detokenizer (a stop string cuts
  // it where it did during the search), the ending end-of-sequence token left out.
  IncrementalDetokenizer text(tokenizer_, params_.stop, params_.skip_special_tokens,
                              params_.include_stop_str_in_output);
  bool stopped = false;
  for (int32_t token : beam.tokens) {
    if (IsEos(token) && !params_.ignore_eos) break;
    out.text += text.Add(token, &stopped);
    if (stopped) break;
  }
  if (!stopped) out.text += text.Flush();
  return out;
}

std::vector<BeamResult> BeamSearch::Best() const {
  std::vector<const Beam*> all;
  for (const Beam& beam : finished_)
    all.push_back(&beam);
  for (const Beam& beam : live_)
    all.push_back(&beam);
  std::vector<std::pair<double, const Beam*>> ranked;
  for (const Beam* beam : all)
    ranked.emplace_back(Score(*beam), beam);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<BeamResult> best;
  for (const auto& [score, beam] : ranked) {
    if (static_cast<int64_t>(best.size()) == params_.beam_width) break;
    best.push_back(Result(*beam));
  }
  // Nothing generated (max_tokens 0): every choice is the same empty output.
  if (params_.max_tokens == 0)
    while (static_cast<int64_t>(best.size()) < params_.beam_width)
      best.push_back(best.front());
  return best;
}

// ---------------------------------------------------------------------------------------------

namespace {

// At most this many searches at once (each holds a thread that mostly waits).
constexpr size_t kMaxSearches = 256;

// What one step's request came to.
struct StepOutcome {
  std::vector<std::pair<int32_t, float>> top;
  std::string finish_reason, error;
  bool first = false;
  int64_t prompt_tokens = 0, cached_tokens = 0;
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
};

}  // namespace

struct BeamSearchFrontend::Search {
  Search(const Tokenizer& tokenizer, const EngineRequest& first, const RequestLimits& limits)
      : request(first),
        search(tokenizer, first.prompt, first.params, limits.eos_token_id,
               limits.more_eos_token_ids) {}
  EngineRequest request;  // the first choice's: prompt, parameters, priority
  std::vector<std::string> choice_ids;
  std::vector<std::shared_ptr<RequestStream>> choices;
  BeamSearch search;
  // The step in flight: its requests and their streams.
  int64_t step = 0;
  std::vector<std::string> step_ids;
  std::vector<std::shared_ptr<RequestStream>> step_streams;

  std::mutex mutex;
  std::condition_variable wake;
  uint64_t pokes = 0;  // events arrived (or an abort) since the runner last looked
  bool aborted = false;
  bool ended = false;
  std::thread thread;

  void Poke() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++pokes;
    }
    wake.notify_all();
  }
  // The requests of the step that asks for the live beams' next tokens.
  std::vector<EngineRequest> StepRequests() {
    std::vector<EngineRequest> requests;
    step_ids.clear();
    const std::vector<std::vector<int32_t>> prompts = search.LivePrompts();
    for (size_t i = 0; i < prompts.size(); ++i) {
      EngineRequest r;
      r.id = fmt::format("{}-beam{}-{}", choice_ids.front(), step, i);
      r.prompt = prompts[i];
      r.priority = request.priority;
      r.background = request.background;
      r.params.temperature = 0;
      r.params.max_tokens = 1;
      r.params.ignore_eos = true;
      r.params.logprobs = search.candidates_wanted();
      if (step == 0) r.params.prompt_logprobs = request.params.prompt_logprobs;
      step_ids.push_back(r.id);
      requests.push_back(std::move(r));
    }
    return requests;
  }
  // Ends every choice with the same event (an error or an abort).
  void EndAll(const std::string& reason, const std::string& error, const StepOutcome& facts) {
    for (const auto& stream : choices) {
      RequestEvent event;
      event.first = true;
      event.prompt_tokens = facts.prompt_tokens;
      event.cached_tokens = facts.cached_tokens;
      event.finish_reason = reason;
      event.error = error;
      stream->Push(std::move(event));
    }
  }
};

BeamSearchFrontend::BeamSearchFrontend(RequestFrontend& inner, const Tokenizer& tokenizer,
                                       RequestLimits limits)
    : inner_(inner), tokenizer_(tokenizer), limits_(limits) {}

BeamSearchFrontend::~BeamSearchFrontend() {
  EndSearches(/*drain=*/false);
}

void BeamSearchFrontend::EndSearches(bool drain) {
  // Whoever takes the searches out of the list joins their threads (Stop, then the destructor).
  std::vector<std::shared_ptr<Search>> searches;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    searches.swap(searches_);
  }
  // Draining lets every search run its steps to the end; otherwise each ends as aborted.
  if (!drain)
    for (const auto& s : searches) {
      {
        std::lock_guard<std::mutex> lock(s->mutex);
        s->aborted = true;
      }
      s->Poke();
    }
  for (const auto& s : searches)
    if (s->thread.joinable()) s->thread.join();
  std::lock_guard<std::mutex> lock(mutex_);
  by_choice_.clear();
}

Result<std::shared_ptr<RequestStream>> BeamSearchFrontend::Submit(EngineRequest request,
                                                                  SubmitError* error) {
  if (request.params.beam_width == 0) return inner_.Submit(std::move(request), error);
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  auto streams = SubmitAll(std::move(one), error);
  if (!streams.ok()) return streams.status();
  return streams->front();
}

Result<std::vector<std::shared_ptr<RequestStream>>> BeamSearchFrontend::SubmitAll(
    std::vector<EngineRequest> requests, SubmitError* error) {
  auto refuse = [&](SubmitError why, Status status) {
    *error = why;
    return status;
  };
  // The plain requests and each search's first step go to the inner frontend together, so that
  // all of them are queued or none.
  std::vector<EngineRequest> inner;
  // Per inner request: the position of a plain one, or (as ~index) the search whose step it is.
  std::vector<size_t> owners;
  std::vector<std::shared_ptr<Search>> searches;
  std::vector<size_t> search_at;
  for (size_t i = 0; i < requests.size();) {
    const EngineRequest& r = requests[i];
    const int64_t width = r.params.beam_width;
    if (width == 0) {
      owners.push_back(i);
      inner.push_back(std::move(requests[i]));
      ++i;
      continue;
    }
    if (Status s = CheckBeamSearchParams(r.params); !s.ok())
      return refuse(SubmitError::kInvalid, Status::Errorf("use_beam_search: {}", s.message()));
    EngineRequest plain = r;
    plain.params.beam_width = 0;
    if (Status s = ValidateRequest(plain, limits_); !s.ok())
      return refuse(SubmitError::kInvalid, s);
    if (r.resumed_tokens > 0 || r.kv_sink || r.imported)
      return refuse(SubmitError::kInvalid,
                    Status::Error("use_beam_search: a resumed or handed-over request cannot be "
                                  "a beam search"));
    if (i + static_cast<size_t>(width) > requests.size())
      return refuse(SubmitError::kInvalid,
                    Status::Errorf("use_beam_search: a search of width {} needs its {} choices "
                                   "submitted together",
                                   width, width));
    auto search = std::make_shared<Search>(tokenizer_, r, limits_);
    for (size_t k = i; k < i + static_cast<size_t>(width); ++k) {
      if (requests[k].prompt != r.prompt || requests[k].params.beam_width != width)
        return refuse(SubmitError::kInvalid,
                      Status::Errorf("use_beam_search: a search of width {} needs its {} "
                                     "choices of one prompt submitted together",
                                     width, width));
      search->choice_ids.push_back(requests[k].id);
      search->choices.push_back(std::make_shared<RequestStream>());
    }
    for (EngineRequest& step : search->StepRequests()) {
      owners.push_back(~searches.size());
      inner.push_back(std::move(step));
    }
    searches.push_back(search);
    search_at.push_back(i);
    i += static_cast<size_t>(width);
  }

  if (searches.empty()) return inner_.SubmitAll(std::move(inner), error);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_)
      return refuse(SubmitError::kStopping, Status::Error("the server is shutting down"));
    ReapLocked();
    if (searches_.size() + searches.size() > kMaxSearches)
      return refuse(SubmitError::kQueueFull,
                    Status::Errorf("{} beam searches are running; try again later", kMaxSearches));
  }
  // Not under the lock: a router's submission may take a while, and aborts and metrics must not
  // wait for it.
  auto submitted = inner_.SubmitAll(std::move(inner), error);
  if (!submitted.ok()) return submitted.status();
  std::vector<std::shared_ptr<RequestStream>> streams(requests.size());
  for (size_t k = 0; k < owners.size(); ++k) {
    if (owners[k] < requests.size())
      streams[owners[k]] = (*submitted)[k];
    else
      searches[~owners[k]]->step_streams.push_back((*submitted)[k]);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t s = 0; s < searches.size(); ++s) {
    const std::shared_ptr<Search>& search = searches[s];
    for (size_t k = 0; k < search->choices.size(); ++k) {
      streams[search_at[s] + k] = search->choices[k];
      by_choice_[search->choice_ids[k]] = search;
    }
    searches_.push_back(search);
    search->thread = std::thread([this, search] { Run(search); });
  }
  return streams;
}

void BeamSearchFrontend::Run(const std::shared_ptr<Search>& search) {
  Search& s = *search;
  StepOutcome facts;  // the prompt's, from the first step
  for (;;) {
    std::vector<StepOutcome> outcomes(s.step_streams.size());
    std::vector<bool> finished(s.step_streams.size(), false);
    for (const auto& stream : s.step_streams)
      stream->SetNotifier([search] { search->Poke(); });
    uint64_t seen = 0;
    bool aborted = false;
    for (;;) {
      bool all = true;
      for (size_t i = 0; i < s.step_streams.size(); ++i) {
        if (finished[i]) continue;
        std::vector<RequestEvent> events;
        finished[i] = s.step_streams[i]->Drain(&events);
        for (RequestEvent& e : events) {
          StepOutcome& o = outcomes[i];
          if (e.first) {
            o.first = true;
            o.prompt_tokens = e.prompt_tokens;
            o.cached_tokens = e.cached_tokens;
            o.prompt_logprobs = std::move(e.prompt_logprobs);
          }
          if (!e.logprobs.empty() && o.top.empty()) o.top = e.logprobs.front().top;
          if (e.finish_reason) {
            o.finish_reason = *e.finish_reason;
            o.error = e.error;
          }
        }
        all = all && finished[i];
      }
      std::unique_lock<std::mutex> lock(s.mutex);
      if (s.aborted) {
        aborted = true;
        break;
      }
      if (all) break;
      s.wake.wait(lock, [&] { return s.pokes != seen || s.aborted; });
      seen = s.pokes;
    }
    for (const auto& stream : s.step_streams)
      stream->SetNotifier(nullptr);
    if (s.step == 0 && !outcomes.empty()) facts = outcomes.front();
    if (aborted) {
      for (const std::string& id : s.step_ids)
        inner_.Abort(id);
      s.EndAll("abort", "", facts);
      break;
    }
    const StepOutcome* failed = nullptr;
    for (const StepOutcome& o : outcomes)
      if (o.finish_reason != "stop" && o.finish_reason != "length" && !failed) failed = &o;
    if (failed) {
      s.EndAll(failed->finish_reason == "error" ? "error" : "abort", failed->error, facts);
      break;
    }
    std::vector<std::vector<std::pair<int32_t, float>>> next;
    for (StepOutcome& o : outcomes)
      next.push_back(std::move(o.top));
    s.search.Extend(next);
    ++s.step;
    if (s.search.done()) {
      const std::vector<BeamResult> best = s.search.Best();
      for (size_t k = 0; k < s.choices.size(); ++k) {
        RequestEvent event;
        event.first = true;
        event.prompt_tokens = facts.prompt_tokens;
        event.cached_tokens = facts.cached_tokens;
        if (k == 0) event.prompt_logprobs = facts.prompt_logprobs;
        if (k < best.size()) {
          event.token_ids = best[k].tokens;
          event.text = best[k].text;
          event.logprobs = best[k].logprobs;
          event.finish_reason = best[k].finish_reason;
          event.stop_string = best[k].stop_string;
          event.stop_token = best[k].stop_token;
        } else {
          event.finish_reason = "error";
          event.error = fmt::format("use_beam_search: the search found {} beams, fewer than n = {}",
                                    best.size(), s.choices.size());
        }
        s.choices[k]->Push(std::move(event));
      }
      break;
    }
    SubmitError why = SubmitError::kNone;
    auto streams = inner_.SubmitAll(s.StepRequests(), &why);
    if (!streams.ok()) {
      s.EndAll("error",
               fmt::format("use_beam_search: step {}: {}", s.step, streams.status().message()),
               facts);
      break;
    }
    s.step_streams = std::move(streams).value();
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.ended = true;
}

void BeamSearchFrontend::ReapLocked() {
  std::erase_if(searches_, [&](const std::shared_ptr<Search>& s) {
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      if (!s->ended) return false;
    }
    if (s->thread.joinable()) s->thread.join();
    for (const std::string& id : s->choice_ids)
      by_choice_.erase(id);
    return true;
  });
}

void BeamSearchFrontend::Abort(const std::string& id) {
  std::shared_ptr<Search> search;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_choice_.find(id);
    if (it != by_choice_.end()) search = it->second;
  }
  if (!search) return inner_.Abort(id);
  {
    std::lock_guard<std::mutex> lock(search->mutex);
    search->aborted = true;
  }
  search->Poke();
}

EngineMetrics BeamSearchFrontend::Metrics() const {
  EngineMetrics metrics = inner_.Metrics();
  metrics.extra_values.push_back({"beam_searches_running", "gauge",
                                  "Beam searches in progress (each runs its steps as requests).",
                                  "", static_cast<double>(running())});
  return metrics;
}

int64_t BeamSearchFrontend::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t count = 0;
  for (const auto& s : searches_) {
    std::lock_guard<std::mutex> search_lock(s->mutex);
    count += s->ended ? 0 : 1;
  }
  return count;
}

void BeamSearchFrontend::Stop(bool drain) {
  EndSearches(drain);
  inner_.Stop(drain);
}

}  // namespace sy
