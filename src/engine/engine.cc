#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <unordered_set>

#include "base/clock.h"
#include "structured/matcher.h"

namespace sy {

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds.size() && value > bounds[i])
    ++i;
  ++counts[i];
  sum += value;
  ++count;
}

std::vector<double> LatencyBucketBounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
          1.0,   2.5,   5.0,  7.5,  10,   20,   40,   80,  160,  640, 2560};
}

struct Engine::Sequence {
  EngineRequest request;
  std::shared_ptr<RequestStream> stream;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t prompt_length = 0;
  int64_t computed = 0;               // tokens whose latent rows are in the cache
  SequenceCache cache;                // pages (shared prefix pages first), length == computed
  std::vector<uint64_t> page_hashes;  // chain hashes of the leading full pages
  bool looked_up = false;             // prefix cache consulted since (re)admission
  int64_t cached_tokens = 0;          // reported in usage: tokens the first admission found cached
  bool first_admission = true;
  bool sent_first = false;
  PenaltyState penalties;
  std::unique_ptr<IncrementalDetokenizer> detokenizer;
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  double arrival = 0, last_token_time = 0;
  uint64_t arrival_index = 0;  // arrival order, for the priority policy's ties
  bool aborted = false;
  bool finished = false;
  // MTP drafts for the next step's verification, each with the distribution it was drawn from.
  std::vector<int32_t> drafts;
  std::vector<TokenDistribution> draft_distributions;
  // Structured output: the grammar's state after the generated tokens (kept across preemption,
  // rebuilt from the resumed tokens on failover); while drafting it also takes the drafts so far
  // (grammar_drafts of them), rolled back once the drafts are made.
  std::unique_ptr<structured::GrammarMatcher> grammar;
  int64_t grammar_drafts = 0;
  // The reasoning budget's count after the generated tokens (SamplingParams::
  // thinking_token_budget; unused without one).
  ThinkingCount thinking;
  // Disaggregation, prefill side: rows [0, exported) went to the sink; handoff: the first token
  // is out and the request leaves once this step's rows (the MTP layer's too) are sent.
  int64_t exported = 0;
  bool handoff = false;
  // The mask at the grammar's current state, made beside the step's forward (masks_beside_forward)
  // and taken by the step's first GrammarRow.
  std::vector<uint64_t> next_mask;
  bool next_mask_ready = false;

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_length; }
  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - computed; }
  bool wants_prompt_logprobs() const { return request.params.prompt_logprobs.has_value(); }
};

Engine::Engine(const Model& model, LatentCache& cache, const Tokenizer& tokenizer,
               ForwardOptions forward_options, EngineConfig config)
    : model_(model),
      cache_(cache),
      pool_(cache),
      tokenizer_(tokenizer),
      forward_options_(forward_options),
      config_(config) {
  max_model_len_ =
      config_.max_model_len > 0 ? config_.max_model_len : model.config().max_position_embeddings;
  forward_options_.logit_rows = LogitRows::kLast;
  pool_.SetEventLog(&cache_events_);
  metrics_.time_to_first_token = Histogram(LatencyBucketBounds());
  metrics_.inter_token_latency = Histogram(LatencyBucketBounds());
  metrics_.e2e_request_latency = Histogram(LatencyBucketBounds());
  metrics_.queue_time = Histogram(LatencyBucketBounds());
}

Engine::~Engine() {
  Stop(false);
}

void Engine::Start() {
  loop_ = std::thread([this] { Loop(); });
  watchdog_ = std::thread([this] { Watchdog(); });
}

void Engine::Stop(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    stopping_ = true;
    drain_ = drain;
  }
  wake_.notify_all();
  if (loop_.joinable()) loop_.join();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

Status ValidateRequest(const EngineRequest& request, const RequestLimits& limits) {
  const int64_t vocab = limits.vocab_size;
  if (request.prompt.empty()) return Status::Error("the prompt has no tokens");
  if (request.resumed_tokens < 0 ||
      request.resumed_tokens >= static_cast<int64_t>(request.prompt.size()))
    return Status::Errorf("resumed_tokens must be in [0, {}) (the prompt's length), got {}",
                          request.prompt.size(), request.resumed_tokens);
  if (request.resumed_tokens > request.params.max_tokens)
    return Status::Errorf("resumed_tokens {} exceeds max_tokens {}", request.resumed_tokens,
                          request.params.max_tokens);
  for (size_t i = 0; i < request.prompt.size(); ++i)
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab)
      return Status::Errorf("prompt token {} (position {}) is outside [0, {})", request.prompt[i],
                            i, vocab);
  SY_RETURN_IF_ERROR(request.params.Validate(vocab));
  if (request.priority != 0 && !limits.priority_scheduling)
    return Status::Errorf(
        "priority {}: this server runs requests first come, first served (priorities need "
        "--scheduling-policy priority)",
        request.priority);
  const int64_t length = static_cast<int64_t>(request.prompt.size()) - request.resumed_tokens +
                         request.params.max_tokens;
  if (length > limits.max_model_len)
    return Status::Errorf(
        "this model's maximum context length is {} tokens; the request asks for {} ({} in the "
        "prompt, {} to generate)",
        limits.max_model_len, length, request.prompt.size() - request.resumed_tokens,
        request.params.max_tokens);
  if (length > limits.cache_tokens)
    return Status::Errorf(
        "the request needs {} tokens of cache but the whole cache holds {} (raise "
        "--kv-cache-tokens)",
        length, limits.cache_tokens);
  return Status::Ok();
}

Status Engine::Validate(const EngineRequest& request) const {
  // Whole pages: a request needs ceil(length / page) of them.
  const int64_t cache_tokens = pool_.total_pages() * pool_.page_size();
  return ValidateRequest(request,
                         {model_.config().vocab_size, max_model_len_, cache_tokens,
                          config_.scheduling_policy == EngineConfig::SchedulingPolicy::kPriority});
}

bool Engine::HasWork() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !incoming_.empty() || !aborts_.empty() || !running_.empty() || !waiting_.empty();
}

Result<std::vector<std::shared_ptr<RequestStream>>> RequestFrontend::SubmitAll(
    std::vector<EngineRequest> requests, SubmitError* error) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::string> ids;
  for (EngineRequest& request : requests) {
    ids.push_back(request.id);
    auto stream = Submit(std::move(request), error);
    if (!stream.ok()) {
      ids.pop_back();
      for (const std::string& id : ids)
        Abort(id);
      return stream.status();
    }
    streams.push_back(stream.value());
  }
  *error = SubmitError::kNone;
  return streams;
}

Result<std::unique_ptr<Engine::Sequence>> Engine::Prepare(EngineRequest request) {
  const int64_t vocab = model_.config().vocab_size;
  SY_RETURN_IF_ERROR(Validate(request));
  if (request.imported) {
    const ImportedRows& rows = *request.imported;
    if (request.kv_sink) return Status::Error("a request cannot both send and receive its rows");
    if (request.resumed_tokens < 1 || rows.rows != static_cast<int64_t>(request.prompt.size()) - 1)
      return Status::Errorf(
          "the received rows cover {} positions; the request's prompt needs {} (all but the "
          "prefill instance's token)",
          rows.rows, request.prompt.size() - 1);
    int64_t next = 0;
    for (const ImportedRows::Chunk& chunk : rows.chunks) {
      if (chunk.first != next || chunk.count <= 0)
        return Status::Errorf("the received rows are not in order at position {}", next);
      next += chunk.count;
    }
    if (next != rows.rows)
      return Status::Errorf("the received chunks hold {} rows, not {}", next, rows.rows);
    if (rows.layers != cache_.layers() || rows.row_bytes != cache_.row_bytes())
      return Status::Errorf(
          "the received rows have {} layers of {} bytes; this instance's cache has {} of {} (the "
          "same model, cache dtype and MTP setting are needed on both sides)",
          rows.layers, rows.row_bytes, cache_.layers(), cache_.row_bytes());
    if (request.params.prompt_logprobs)
      return Status::Error(
          "prompt_logprobs: computed by the prefill instance, not by the decode instance");
    const HandoffDrafts& drafts = rows.drafts;
    if (drafts.distributions.size() != drafts.tokens.size())
      return Status::Errorf("the received MTP drafts: {} tokens but {} distributions",
                            drafts.tokens.size(), drafts.distributions.size());
    for (size_t i = 0; i < drafts.tokens.size(); ++i) {
      const TokenDistribution& q = drafts.distributions[i];
      bool valid = drafts.tokens[i] >= 0 && drafts.tokens[i] < vocab &&
                   q.probs.size() == q.tokens.size() && !q.tokens.empty();
      for (size_t j = 0; valid && j < q.tokens.size(); ++j)
        valid = q.tokens[j] >= 0 && q.tokens[j] < vocab && q.probs[j] >= 0 && q.probs[j] <= 1;
      if (!valid)
        return Status::Errorf(
            "the received MTP draft {} is not a token and distribution of this "
            "model's vocabulary ({})",
            i, vocab);
    }
  }
  auto seq = std::make_unique<Sequence>();
  if (!request.params.seed) request.params.seed = std::random_device{}() * 0x100000001ull;
  seq->tokens = request.prompt;
  seq->prompt_length = static_cast<int64_t>(request.prompt.size()) - request.resumed_tokens;
  // Resumed output keeps the role it was computed in (decode steps), so it gets the same rows.
  seq->cache.prompt_end = seq->prompt_length;
  seq->stream = std::make_shared<RequestStream>();
  seq->detokenizer = std::make_unique<IncrementalDetokenizer>(
      tokenizer_, request.params.stop, request.params.skip_special_tokens,
      request.params.include_stop_str_in_output);
  if (request.params.repetition_penalty != 1.0) {
    seq->penalties.in_prompt.assign(static_cast<size_t>(vocab), 0);
    for (int32_t t : request.prompt)
      seq->penalties.in_prompt[t] = 1;
  }
  // Resumed output: counted for penalties, and replayed through the detokenizer, whose text was
  // already sent (what it holds back for a stop string stays held back, as it was).
  for (int64_t i = seq->prompt_length; i < static_cast<int64_t>(request.prompt.size()); ++i) {
    const int32_t t = request.prompt[static_cast<size_t>(i)];
    ++seq->penalties.generated_counts[t];
    bool stopped = false;
    seq->detokenizer->Add(t, &stopped);
  }
  if (request.params.grammar) {
    auto compiled = Grammars().Compile(*request.params.grammar);
    if (!compiled.ok()) return compiled.status();
    std::optional<int32_t> begin_after;
    if (!request.params.grammar->begin_after.empty()) {
      begin_after = Grammars().vocabulary().NamedToken(request.params.grammar->begin_after);
      if (!begin_after)
        return Status::Errorf("the tokenizer has no token \"{}\" to begin the grammar after",
                              request.params.grammar->begin_after);
    }
    seq->grammar = std::make_unique<structured::GrammarMatcher>(*compiled, begin_after);
    for (int64_t i = seq->prompt_length; i < static_cast<int64_t>(request.prompt.size()); ++i) {
      Status status = seq->grammar->AcceptToken(request.prompt[static_cast<size_t>(i)]);
      if (!status.ok()) return status.WithContext("the resumed output does not fit its grammar");
    }
  }
  if (request.params.thinking_token_budget) {
    SY_ASSIGN_OR_RETURN(const ThinkTokens think, ThinkMarkers());
    seq->thinking =
        PromptThinking(seq->tokens, seq->prompt_length, think, request.params.starts_in_thinking);
    for (int64_t i = seq->prompt_length; i < static_cast<int64_t>(seq->tokens.size()); ++i)
      seq->thinking.Add(seq->tokens[static_cast<size_t>(i)], think);
  }
  seq->arrival = NowSeconds();
  seq->request = std::move(request);
  return seq;
}

Result<std::shared_ptr<RequestStream>> Engine::Submit(EngineRequest request, SubmitError* error) {
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  auto streams = SubmitAll(std::move(one), error);
  if (!streams.ok()) return streams.status();
  return streams.value()[0];
}

Result<std::vector<std::shared_ptr<RequestStream>>> Engine::SubmitAll(
    std::vector<EngineRequest> requests, SubmitError* error) {
  *error = SubmitError::kInvalid;
  const int64_t count = static_cast<int64_t>(requests.size());
  if (count > config_.max_waiting)
    return Status::Errorf(
        "the request asks for {} sequences (prompts × n), more than the server queues at once "
        "(--max-waiting {})",
        count, config_.max_waiting);
  std::vector<std::unique_ptr<Sequence>> prepared;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (EngineRequest& request : requests) {
    auto seq = Prepare(std::move(request));
    if (!seq.ok()) return seq.status();
    streams.push_back(seq.value()->stream);
    prepared.push_back(std::move(seq.value()));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      *error = SubmitError::kStopping;
      return Status::Error("the server is shutting down");
    }
    if (waiting_count_ + count > config_.max_waiting) {
      *error = SubmitError::kQueueFull;
      return Status::Errorf("the waiting queue is full ({} requests)", config_.max_waiting);
    }
    waiting_count_ += count;
    for (auto& seq : prepared)
      incoming_.push_back(std::move(seq));
  }
  *error = SubmitError::kNone;
  wake_.notify_all();
  return streams;
}

void Engine::Abort(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborts_.push_back(id);
  }
  wake_.notify_all();
}

void Engine::CountWaiting() {
  // Recounted from the queues rather than adjusted at each move: requests leave the waiting
  // queue by admission, abort or error and come back to it by preemption, and a count kept by
  // hand had drifted (negative after preemptions; up with every queued request aborted, which
  // would end in 503s for everyone).
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_count_ = static_cast<int64_t>(incoming_.size() + waiting_.size());
}

void Engine::TakeIncoming() {
  std::vector<std::string> aborts;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& seq : incoming_) {
      seq->arrival_index = next_arrival_index_++;
      waiting_.push_back(std::move(seq));
    }
    incoming_.clear();
    aborts.swap(aborts_);
  }
  for (const std::string& id : aborts) {
    for (auto& seq : running_)
      if (seq->request.id == id) seq->aborted = true;
    for (auto& seq : waiting_)
      if (seq->request.id == id) seq->aborted = true;
  }
}

bool Engine::EnsurePages(Sequence& seq, int64_t length) {
  const int64_t needed = (length + pool_.page_size() - 1) / pool_.page_size();
  std::vector<int32_t> taken;
  while (static_cast<int64_t>(seq.cache.pages.size() + taken.size()) < needed) {
    const int32_t page = pool_.Allocate();
    if (page < 0) {
      for (int32_t p : taken)
        pool_.Release(p);
      return false;
    }
    taken.push_back(page);
  }
  seq.cache.pages.insert(seq.cache.pages.end(), taken.begin(), taken.end());
  return true;
}

void Engine::FreePages(Sequence& seq) {
  for (int32_t page : seq.cache.pages)
    pool_.Release(page);
  seq.cache.pages.clear();
  seq.cache.length = 0;
  seq.computed = 0;
  seq.drafts.clear();
  seq.draft_distributions.clear();
  seq.page_hashes.clear();
  seq.looked_up = false;
}

void Engine::Preempt(Sequence& seq) {
  // Recompute later: the cache rows go, the tokens stay (prompt + generated become the prompt
  // of the resumed computation; full pages may still be found in the prefix cache).
  FreePages(seq);
  std::lock_guard<std::mutex> lock(metrics_mutex_);
  ++metrics_.preemptions_total;
}

void Engine::Finish(Sequence& seq, const std::string& reason, RequestEvent event) {
  if (!seq.sent_first) {
    event.first = true;
    event.prompt_tokens = seq.prompt_length;
    event.cached_tokens = seq.cached_tokens;
    event.prompt_logprobs = std::move(seq.prompt_logprobs);
    seq.sent_first = true;
  }
  event.finish_reason = reason;
  seq.finished = true;
  if (seq.request.kv_sink && reason != "transferred") seq.request.kv_sink->Abandon();
  FreePages(seq);
  const double now = NowSeconds();
  {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    ++metrics_.finished_by_reason[reason];
    metrics_.e2e_request_latency.Observe(now - seq.arrival);
  }
  seq.stream->Push(std::move(event));
}

int64_t Engine::GeneratedFrom(const Sequence& seq) const {
  if (forward_options_.attention != AttentionForm::kAuto) return INT64_MAX;
  return seq.prompt_length;
}

void Engine::RegisterFullPages(Sequence& seq) {
  const int64_t size = pool_.page_size();
  while (static_cast<int64_t>(seq.page_hashes.size() + 1) * size <= seq.computed) {
    const size_t index = seq.page_hashes.size();
    const std::span<const int32_t> page_tokens(seq.tokens.data() + index * size, size);
    const uint64_t hash = PagePool::PageHash(index == 0 ? 0 : seq.page_hashes.back(), page_tokens,
                                             static_cast<int64_t>(index), GeneratedFrom(seq));
    pool_.Register(seq.cache.pages[index], hash, page_tokens);
    seq.page_hashes.push_back(hash);
  }
}

void Engine::RecordPromptLogprobs(Sequence& seq, int64_t first, int64_t count, const float* rows) {
  // Row r predicts the token at position first + r + 1.
  const int64_t vocab = model_.config().vocab_size;
  if (seq.prompt_logprobs.empty()) seq.prompt_logprobs.assign(1, std::nullopt);
  for (int64_t r = 0; r < count; ++r) {
    const int64_t position = first + r + 1;
    if (position >= seq.prompt_length) break;
    if (static_cast<int64_t>(seq.prompt_logprobs.size()) != position) continue;  // recomputed
    scratch_.assign(rows + r * vocab, rows + (r + 1) * vocab);
    LogSoftmaxInPlace(scratch_.data(), vocab);
    TokenLogprob entry;
    entry.token = seq.tokens[position];
    entry.logprob = scratch_[entry.token];
    entry.rank = 1 + std::count_if(scratch_.begin(), scratch_.end(),
                                   [&](float l) { return l > entry.logprob; });
    const int64_t top = *seq.request.params.prompt_logprobs;
    if (top > 0) entry.top = TopEntries(scratch_.data(), vocab, top);
    seq.prompt_logprobs.push_back(std::move(entry));
  }
}

structured::GrammarCompiler& Engine::Grammars() {
  std::call_once(grammars_once_, [&] {
    structured::Vocabulary vocab;
    const int64_t size = model_.config().vocab_size;
    for (int64_t id = 0; id < size; ++id) {
      const auto t = static_cast<int32_t>(id);
      vocab.token_bytes.emplace_back(tokenizer_.TokenBytes(t));  // empty past the tokenizer's
      vocab.special.push_back(tokenizer_.IsSpecial(t) ? 1 : 0);
    }
    vocab.eos_ids.push_back(static_cast<int32_t>(model_.config().eos_token_id));
    for (const AddedToken& t : tokenizer_.added_tokens())
      if (t.id < size) vocab.named_tokens.emplace_back(t.content, t.id);
    grammars_ = std::make_unique<structured::GrammarCompiler>(std::move(vocab));
  });
  return *grammars_;
}

const float* Engine::GrammarRow(Sequence& seq, const float* row) {
  if (!seq.grammar) return row;
  const int64_t vocab = model_.config().vocab_size;
  const std::vector<uint64_t>* mask = &seq.next_mask;
  if (seq.next_mask_ready) {
    seq.next_mask_ready = false;
  } else {
    grammar_mask_.resize(static_cast<size_t>((vocab + 63) / 64));
    seq.grammar->FillNextTokenMask(grammar_mask_);
    mask = &grammar_mask_;
  }
  masked_row_.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    const bool allowed = ((*mask)[static_cast<size_t>(i >> 6)] >> (i & 63)) & 1;
    masked_row_[static_cast<size_t>(i)] =
        allowed ? row[i] : -std::numeric_limits<float>::infinity();
  }
  return masked_row_.data();
}

std::vector<int32_t> Engine::BlockedTokens(const Sequence& seq) const {
  const SamplingParams& params = seq.request.params;
  std::vector<int32_t> blocked;
  // A complete structured output may end whatever min_tokens says: nothing else may follow.
  const bool grammar_done = seq.grammar && seq.grammar->IsComplete();
  if (seq.generated() < params.min_tokens && !grammar_done) {
    blocked = params.stop_token_ids;
    if (!params.ignore_eos) blocked.push_back(static_cast<int32_t>(model_.config().eos_token_id));
  }
  if (!params.bad_words_token_ids.empty()) {
    const std::vector<int32_t> bad = BadWordTokens(
        params, std::span(seq.tokens).subspan(static_cast<size_t>(seq.prompt_length)));
    blocked.insert(blocked.end(), bad.begin(), bad.end());
  }
  return blocked;
}

Result<ThinkTokens> Engine::ThinkMarkers() {
  std::call_once(think_once_, [&] {
    const auto begin = tokenizer_.TokenToId("<think>"), end = tokenizer_.TokenToId("</think>");
    if (begin && end) think_ = ThinkTokens{*begin, *end};
  });
  if (!think_)
    return Status::Error(
        "thinking_token_budget: this model's tokenizer has no \"<think>\" and \"</think>\" "
        "tokens to count a reasoning section by");
  return *think_;
}

bool Engine::ThinkingSpent(const Sequence& seq, const ThinkingCount& count) const {
  const std::optional<int64_t>& budget = seq.request.params.thinking_token_budget;
  // A grammar past its reasoning gate (or without one) decides every token itself.
  return budget && count.open && count.used >= *budget && (!seq.grammar || seq.grammar->IsFree());
}

std::string Engine::EmitToken(Sequence& seq, int32_t token, const float* row, double now,
                              RequestEvent& event, bool& stopped_by_string) {
  const int64_t vocab = model_.config().vocab_size;
  const SamplingParams& params = seq.request.params;
  seq.tokens.push_back(token);
  if (params.thinking_token_budget) seq.thinking.Add(token, *think_);
  if (seq.grammar) {
    Status status = seq.grammar->AcceptToken(token);
    if (!status.ok()) {  // the mask makes this unreachable; never emit text outside the grammar
      event.error = status.message();
      return "error";
    }
  }
  ++seq.penalties.generated_counts[token];
  if (!seq.penalties.in_prompt.empty()) seq.penalties.in_prompt[token] = 1;
  event.token_ids.push_back(token);
  if (params.logprobs) {
    SampledToken sampled;
    sampled.token = token;
    FillLogprobs(row, vocab, params, scratch_, sampled);
    // A grammar may leave fewer candidates than asked for: the masked ones are not alternatives.
    std::erase_if(sampled.top, [](const auto& t) { return !std::isfinite(t.second); });
    event.logprobs.push_back({token, sampled.logprob, std::move(sampled.top)});
  }
  {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    ++metrics_.generation_tokens_total;
    if (seq.generated() == 1)
      metrics_.time_to_first_token.Observe(now - seq.arrival);
    else if (seq.last_token_time > 0)
      metrics_.inter_token_latency.Observe(now - seq.last_token_time);
  }
  seq.last_token_time = now;
  const bool eos = !params.ignore_eos && token == model_.config().eos_token_id;
  // The end-of-sequence token that ends the output is not part of its text (as vLLM), even when
  // special tokens are kept (tool-call and reasoning parsing keep them).
  if (!eos) event.text += seq.detokenizer->Add(token, &stopped_by_string);
  const bool stop_token = std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                                    token) != params.stop_token_ids.end();
  // vLLM's order: the end-of-sequence token reports no stop reason, then stop tokens, then text.
  if (eos) return "stop";
  if (stop_token) {
    event.stop_token = token;
    return "stop";
  }
  if (stopped_by_string) {
    event.stop_string = seq.detokenizer->matched_stop();
    return "stop";
  }
  if (seq.generated() >= params.max_tokens) return "length";
  return "";
}

void Engine::Deliver(Sequence& seq, RequestEvent event, const std::string& reason,
                     bool stopped_by_string) {
  if (!reason.empty()) {
    if (!stopped_by_string) event.text += seq.detokenizer->Flush();
    Finish(seq, reason, std::move(event));
    return;
  }
  if (!seq.sent_first) {
    event.first = true;
    event.prompt_tokens = seq.prompt_length;
    event.cached_tokens = seq.cached_tokens;
    event.prompt_logprobs = std::move(seq.prompt_logprobs);
    seq.prompt_logprobs.clear();
    seq.sent_first = true;
  }
  seq.stream->Push(std::move(event));
}

void Engine::ProcessOutput(Sequence& seq, int64_t count, const float* rows, double now) {
  const int64_t vocab = model_.config().vocab_size;
  const SamplingParams& params = seq.request.params;
  const int64_t first = seq.computed;
  seq.computed += count;
  seq.cache.length = seq.computed;
  RegisterFullPages(seq);
  const bool all_rows = seq.wants_prompt_logprobs() && first < seq.prompt_length;
  if (all_rows) RecordPromptLogprobs(seq, first, count, rows);
  if (seq.remaining() > 0) return;  // a prefill chunk with more to come

  const float* last = GrammarRow(seq, rows + (all_rows ? count - 1 : 0) * vocab);
  RequestEvent event;
  bool stopped_by_string = false;
  std::string reason;
  if (params.max_tokens > 0) {
    const int32_t token = ThinkingSpent(seq, seq.thinking)
                              ? think_->end
                              : SampleToken(last, vocab, params, seq.penalties, seq.generated(),
                                            BlockedTokens(seq), scratch_)
                                    .token;
    if (token < 0) {
      event.error = kNothingAllowedError;
      reason = "error";
    } else {
      reason = EmitToken(seq, token, last, now, event, stopped_by_string);
    }
  } else {
    reason = "length";
  }
  // A prefill instance's request goes on elsewhere: its first token is out now, the request
  // leaves after this step's rows are sent (ExportRows).
  if (reason.empty() && seq.request.kv_sink) seq.handoff = true;
  Deliver(seq, std::move(event), reason, stopped_by_string);
}

void Engine::LookUpDrafts(Sequence& seq) {
  const SamplingParams& params = seq.request.params;
  // Drafts never run past the request's end: at most max_tokens − generated − 1 of them.
  const int64_t k =
      std::min(config_.num_speculative_tokens, params.max_tokens - seq.generated() - 1);
  std::vector<int32_t> drafts = NgramDrafts(seq.tokens, config_.ngram, k);
  ThinkingCount thinking = seq.thinking;
  size_t keep = 0;
  bool forced = false;
  for (; keep < drafts.size() && !forced; ++keep) {
    int32_t& draft = drafts[keep];
    if (params.thinking_token_budget) {
      // The budget closes the section here: "</think>" is what the step will take, and what
      // followed the looked-up n-gram no longer follows it.
      forced = ThinkingSpent(seq, thinking);
      if (forced) draft = think_->end;
      thinking.Add(draft, *think_);
    }
    if (seq.grammar) {
      if (!seq.grammar->AcceptToken(draft).ok()) break;
      ++seq.grammar_drafts;
    }
  }
  if (seq.grammar_drafts > 0) {
    (void)seq.grammar->Rollback(static_cast<int>(seq.grammar_drafts));
    seq.grammar_drafts = 0;
  }
  drafts.resize(keep);
  seq.draft_distributions.clear();
  for (int32_t draft : drafts)  // deterministic drafts: q is one-hot
    seq.draft_distributions.push_back(TokenDistribution{{draft}, {1.0}});
  seq.drafts = std::move(drafts);
}

int64_t Engine::StepCount(Sequence& seq, int64_t budget) {
  if (seq.remaining() == 1 && seq.drafts.empty() && config_.num_speculative_tokens > 0 &&
      config_.drafter == Drafter::kNgram)
    LookUpDrafts(seq);
  if (seq.remaining() != 1 || seq.drafts.empty()) return std::min(seq.remaining(), budget);
  // Verify the drafts with the last token: query length 1 + drafts, within the budget and the
  // request's length; without pages for them, decode plainly rather than preempt.
  const int64_t left = seq.request.params.max_tokens - seq.generated();
  const int64_t use = std::min({static_cast<int64_t>(seq.drafts.size()), left - 1, budget - 1});
  seq.drafts.resize(static_cast<size_t>(std::max<int64_t>(use, 0)));
  seq.draft_distributions.resize(seq.drafts.size());
  const int64_t count = 1 + static_cast<int64_t>(seq.drafts.size());
  if (!seq.drafts.empty() && !EnsurePages(seq, seq.computed + count)) {
    seq.drafts.clear();
    seq.draft_distributions.clear();
    return 1;
  }
  return count;
}

bool Engine::InstallImported(Sequence& seq) {
  const ImportedRows& rows = *seq.request.imported;
  if (seq.computed < rows.rows) {
    if (!EnsurePages(seq, rows.rows)) return false;
    for (const ImportedRows::Chunk& chunk : rows.chunks) {
      const int64_t from = std::max(seq.computed, chunk.first), to = chunk.first + chunk.count;
      for (int64_t l = 0; from < to && l < rows.layers; ++l)
        cache_.WriteRows(l, seq.cache, from, to - from,
                         chunk.rows + (l * chunk.count + from - chunk.first) * rows.row_bytes);
    }
    // As if computed here: registered in the prefix cache under the hashes the prefill
    // instance gave them (the same roles: prompt_end is the same).
    seq.computed = rows.rows;
    seq.cache.length = seq.computed;
    RegisterFullPages(seq);
  }
  // The prefill instance's drafts: verified in this request's first step here, as colocated.
  const auto keep = static_cast<size_t>(config_.num_speculative_tokens);
  if (keep > 0 && seq.drafts.empty() && !rows.drafts.tokens.empty()) {
    const size_t n = std::min(keep, rows.drafts.tokens.size());
    seq.drafts.assign(rows.drafts.tokens.begin(), rows.drafts.tokens.begin() + n);
    seq.draft_distributions.assign(rows.drafts.distributions.begin(),
                                   rows.drafts.distributions.begin() + n);
  }
  seq.request.imported.reset();  // a preemption from here on recomputes, with the same bits
  return true;
}

void Engine::ExportRows(Sequence& seq) {
  const int64_t end = std::min<int64_t>(seq.computed, seq.request.prompt.size());
  if (end > seq.exported) {
    const int64_t first = seq.exported, count = end - first, row_bytes = cache_.row_bytes();
    std::vector<uint8_t> data(static_cast<size_t>(cache_.layers() * count * row_bytes));
    for (int64_t l = 0; l < cache_.layers(); ++l)
      cache_.CopyRows(l, seq.cache, first, count, data.data() + l * count * row_bytes);
    seq.request.kv_sink->Rows(first, count, cache_.layers(), row_bytes, std::move(data));
    seq.exported = end;
  }
  if (seq.handoff) {
    seq.request.kv_sink->Done(seq.tokens[seq.request.prompt.size()],
                              HandoffDrafts{seq.drafts, seq.draft_distributions});
    Finish(seq, "transferred", RequestEvent{});
  }
}

void Engine::ProcessVerification(Sequence& seq, int64_t drafts, const float* rows, double now) {
  // Rejection sampling (sampling.h VerifyDraft) position by position, p being the distribution
  // the request would sample from there (penalties, bias and truncation included, given the
  // tokens kept before it); when every draft is kept one more token comes from p.
  const int64_t vocab = model_.config().vocab_size;
  const SamplingParams& params = seq.request.params;
  const uint64_t seed = SamplingSeed(params);
  seq.computed += 1;  // the last sampled token's row
  RequestEvent event;
  bool stopped_by_string = false;
  std::string reason;
  int64_t accepted = 0;
  for (int64_t j = 0; j <= drafts && reason.empty(); ++j) {
    const float* row = GrammarRow(seq, rows + j * vocab);
    const int64_t step = seq.generated();
    const TokenDistribution p = ThinkingSpent(seq, seq.thinking)
                                    ? TokenDistribution{{think_->end}, {1.0}}
                                    : ProcessedDistribution(row, vocab, params, seq.penalties,
                                                            BlockedTokens(seq), scratch_);
    if (p.tokens.empty()) {
      event.error = kNothingAllowedError;
      reason = "error";
      break;
    }
    int32_t token;
    bool kept = false;
    if (j < drafts) {
      const DraftVerdict verdict = VerifyDraft(p, seq.drafts[static_cast<size_t>(j)],
                                               seq.draft_distributions[static_cast<size_t>(j)],
                                               seed, step, vocab, dense_scratch_);
      token = verdict.token;
      kept = verdict.kept;
    } else {
      token = p.tokens.size() == 1 ? p.tokens[0] : p.Draw(UniformDraw(seed, step, kTokenStream));
    }
    reason = EmitToken(seq, token, row, now, event, stopped_by_string);
    if (!kept) break;
    ++accepted;
    seq.computed += 1;  // the kept draft's row is valid
  }
  {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    ++metrics_.spec_drafts_total;
    metrics_.spec_draft_tokens_total += drafts;
    metrics_.spec_accepted_tokens_total += accepted;
    if (static_cast<int64_t>(metrics_.spec_accepted_per_position.size()) < drafts)
      metrics_.spec_accepted_per_position.resize(static_cast<size_t>(drafts), 0);
    for (int64_t j = 0; j < accepted; ++j)
      ++metrics_.spec_accepted_per_position[static_cast<size_t>(j)];
  }
  seq.drafts.clear();
  seq.draft_distributions.clear();
  seq.cache.length = seq.computed;
  RegisterFullPages(seq);
  Deliver(seq, std::move(event), reason, stopped_by_string);
}

void Engine::Draft(const std::vector<std::pair<Sequence*, int64_t>>& scheduled,
                   const std::vector<int64_t>& first_positions, const ForwardBatch& batch) {
  // The MTP layer catches up with the main layers: row p pairs the final hidden state at p with
  // the token at p + 1, for the positions this step made valid ([first, computed)). The last row
  // of a sequence that now decodes drafts its next token; chained drafts (K > 1) feed the MTP
  // block its own output with the draft, as vLLM runs DeepSeek's single MTP module. Every rank
  // runs the same number of MTP passes (expert-parallel exchanges), with empty batches if need be.
  const int64_t vocab = model_.config().vocab_size, D = model_.config().hidden_size;
  const int64_t K = config_.num_speculative_tokens;
  ForwardBatch mtp;
  std::vector<float> hidden_in;
  std::vector<Sequence*> members;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    Sequence* seq = scheduled[i].first;
    const int64_t first = first_positions[i];
    const int64_t rows = seq->computed - first;
    if (seq->finished || rows <= 0) continue;
    if (static_cast<int64_t>(seq->tokens.size()) <= seq->computed) continue;
    mtp.sequences.push_back({mtp.size(), rows, first, &seq->cache});
    mtp.tokens.insert(mtp.tokens.end(), seq->tokens.begin() + first + 1,
                      seq->tokens.begin() + seq->computed + 1);
    const float* h = final_hidden_.data() + batch.sequences[i].token_offset * D;
    hidden_in.insert(hidden_in.end(), h, h + rows * D);
    members.push_back(seq);
  }
  ForwardOptions options = forward_options_;
  options.logit_rows = LogitRows::kLast;
  std::vector<float> logits, mtp_hidden;
  for (int64_t k = 0; k < K; ++k) {
    Status status = model_.ForwardMtp(mtp, hidden_in.data(), cache_, options, &logits, &mtp_hidden);
    if (!status.ok()) {
      std::fprintf(stderr, "switchyard: MTP drafting failed: %s\n", status.message().c_str());
      for (auto& [seq, count] : scheduled) {
        seq->drafts.clear();
        seq->draft_distributions.clear();
      }
      break;
    }
    ForwardBatch next;
    std::vector<float> next_hidden;
    std::vector<Sequence*> next_members;
    for (size_t m = 0; m < members.size(); ++m) {
      Sequence& seq = *members[m];
      const SequenceSlice& slice = mtp.sequences[m];
      const bool decoding = seq.remaining() == 1 && static_cast<int64_t>(seq.drafts.size()) == k;
      if (!decoding) continue;
      const SamplingParams& params = seq.request.params;
      const float* row = logits.data() + static_cast<int64_t>(m) * vocab;
      if (seq.grammar) {  // drafts follow the grammar too: mask q at the state after the drafts
        if (k > 0) {
          if (!seq.grammar->AcceptToken(seq.drafts.back()).ok()) continue;
          ++seq.grammar_drafts;
        }
        row = GrammarRow(seq, row);
      }
      ThinkingCount thinking = seq.thinking;  // at the state after the drafts so far
      if (params.thinking_token_budget)
        for (int32_t d : seq.drafts)
          thinking.Add(d, *think_);
      TokenDistribution q = ThinkingSpent(seq, thinking)
                                ? TokenDistribution{{think_->end}, {1.0}}
                                : ProcessedDistribution(row, vocab, params, seq.penalties,
                                                        BlockedTokens(seq), scratch_);
      if (q.tokens.empty()) continue;  // verification will say why
      const int32_t draft =
          q.tokens.size() == 1
              ? q.tokens[0]
              : q.Draw(UniformDraw(SamplingSeed(params), seq.generated() + k, kDraftStream));
      seq.drafts.push_back(draft);
      seq.draft_distributions.push_back(std::move(q));
      // Drafts never run past the request's end: at most max_tokens − generated − 1 of them.
      const int64_t left = seq.request.params.max_tokens - seq.generated();
      if (k + 1 >= K || k + 2 > left - 1) continue;
      const int64_t position = slice.start_position + slice.token_count;
      if (!EnsurePages(seq, position + 1)) continue;
      next.sequences.push_back({next.size(), 1, position, &seq.cache});
      next.tokens.push_back(draft);
      const float* h = mtp_hidden.data() + (slice.token_offset + slice.token_count - 1) * D;
      next_hidden.insert(next_hidden.end(), h, h + D);
      next_members.push_back(&seq);
    }
    mtp = std::move(next);
    hidden_in = std::move(next_hidden);
    members = std::move(next_members);
  }
  for (auto& [seq, count] : scheduled) {  // rows past `computed` were chained drafts' scratch
    if (!seq->finished) seq->cache.length = seq->computed;
    if (seq->grammar && seq->grammar_drafts > 0) {
      (void)seq->grammar->Rollback(static_cast<int>(seq->grammar_drafts));
      seq->grammar_drafts = 0;
    }
  }
}

bool Engine::ReadyToAdmit(Sequence& seq, int64_t budget, int64_t* count) {
  if (!seq.looked_up) {
    // The last token is always computed (its logits start generation), so at most the pages
    // before it come from the cache. A received request matches at most the pages the prefill
    // instance (or a colocated engine) could for the prompt it ran: the last prompt row comes
    // from the transfer, whose MTP row pairs it with this request's own first token (a cached
    // page's last MTP row pairs it with whatever token followed it there, which changes drafts
    // and so seeded draws).
    const int64_t total = static_cast<int64_t>(seq.tokens.size()) - (seq.request.imported ? 1 : 0);
    const int64_t max_pages = (total - 1) / pool_.page_size();
    seq.cache.pages = pool_.Match(seq.tokens, max_pages, GeneratedFrom(seq), &seq.page_hashes);
    seq.computed = static_cast<int64_t>(seq.cache.pages.size()) * pool_.page_size();
    seq.cache.length = seq.computed;
    seq.looked_up = true;
    // Prompt log-probabilities need every prompt row: those requests compute from the start.
    if (seq.wants_prompt_logprobs() && seq.first_admission && seq.computed > 0) {
      FreePages(seq);
      seq.looked_up = true;
    }
  }
  const int64_t matched = seq.computed;
  const bool room = !seq.request.imported || InstallImported(seq);
  *count = room ? StepCount(seq, budget) : 0;  // a received request's drafts too
  if (!room || !EnsurePages(seq, seq.computed + *count)) {
    // A waiting request holds no pages: the prefix it matched goes back (still cached) and is
    // looked up again at its next try.
    FreePages(seq);
    return false;
  }
  if (seq.first_admission) {
    seq.cached_tokens = matched;
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    metrics_.prefix_cache_queries_total += seq.prompt_length;
    metrics_.prefix_cache_hits_total += matched;
    metrics_.prompt_tokens_total += seq.prompt_length;
    metrics_.queue_time.Observe(NowSeconds() - seq.arrival);
  }
  seq.first_admission = false;
  return true;
}

void Engine::RefuseUnfittable(Sequence& seq) {
  // Nothing else holds pages; cached ones were evictable. Cannot happen for a request that
  // passed Submit's size check, but never spin on it.
  auto it =
      std::find_if(waiting_.begin(), waiting_.end(), [&](auto& w) { return w.get() == &seq; });
  std::unique_ptr<Sequence> owned = std::move(*it);
  waiting_.erase(it);
  RequestEvent event;
  event.error = "the request does not fit in the cache";
  Finish(*owned, "error", std::move(event));
}

void Engine::PreemptRunning(Sequence& seq) {
  auto it =
      std::find_if(running_.begin(), running_.end(), [&](auto& r) { return r.get() == &seq; });
  std::unique_ptr<Sequence> owned = std::move(*it);
  running_.erase(it);
  Preempt(*owned);
  waiting_.push_front(std::move(owned));
}

void Engine::ScheduleFcfs(int64_t& budget, std::vector<std::pair<Sequence*, int64_t>>& scheduled) {
  // Running requests first (oldest first), preempting the newest when pages run out.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& seq = *running_[i];
    const int64_t count = StepCount(seq, budget);
    if (EnsurePages(seq, seq.computed + count)) {
      scheduled.push_back({&seq, count});
      budget -= count;
      ++i;
      continue;
    }
    // Preempt the newest running request (perhaps this one) and try again.
    PreemptRunning(*running_.back());
  }
  // Then admissions in arrival order, while the budget, the sequence limit and pages allow.
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    Sequence& seq = *waiting_.front();
    int64_t count = 0;
    if (!ReadyToAdmit(seq, budget, &count)) {
      if (running_.empty() && scheduled.empty()) RefuseUnfittable(seq);
      break;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    scheduled.push_back({running_.back().get(), count});
    budget -= count;
  }
}

void Engine::SchedulePriority(int64_t& budget,
                              std::vector<std::pair<Sequence*, int64_t>>& scheduled) {
  // Running and waiting requests in one order, most urgent first: (priority, arrival). Each
  // running one is stepped; each waiting one is admitted, taking the slot and pages of the least
  // urgent running ones behind it if need be. Every request behind the current one in the order
  // is unscheduled yet, so a preempted one never has to be taken back out of `scheduled`.
  auto key = [](const Sequence* s) { return std::pair(s->request.priority, s->arrival_index); };
  std::vector<Sequence*> order;
  for (auto& seq : running_)
    order.push_back(seq.get());
  for (auto& seq : waiting_)
    order.push_back(seq.get());
  std::sort(order.begin(), order.end(), [&](auto* a, auto* b) { return key(a) < key(b); });
  std::unordered_set<const Sequence*> done, running;  // done: scheduled or preempted this step
  for (auto& seq : running_)
    running.insert(seq.get());
  // The least urgent running request not yet scheduled, if it is behind `than`.
  auto least_urgent = [&](const Sequence& than) -> Sequence* {
    Sequence* victim = nullptr;
    for (auto& seq : running_)
      if (!done.contains(seq.get()) && key(seq.get()) >= key(&than) &&
          (!victim || key(seq.get()) > key(victim)))
        victim = seq.get();
    return victim;
  };
  auto preempt = [&](Sequence& victim) {
    PreemptRunning(victim);
    running.erase(&victim);
    done.insert(&victim);
  };
  bool admitting = true;  // admissions stop at the first waiting request that cannot run
  for (Sequence* seq : order) {
    if (budget <= 0) break;
    if (done.contains(seq)) continue;
    int64_t count = 0;
    if (running.contains(seq)) {
      count = StepCount(*seq, budget);
      bool ready = EnsurePages(*seq, seq->computed + count);
      while (!ready) {  // pages from the least urgent, perhaps this one
        Sequence* victim = least_urgent(*seq);
        preempt(*victim);
        if (victim == seq) break;
        ready = EnsurePages(*seq, seq->computed + count);
      }
      if (ready) {
        scheduled.push_back({seq, count});
        budget -= count;
        done.insert(seq);
      }
      continue;
    }
    if (!admitting) continue;
    auto behind = [&]() -> Sequence* {  // strictly less urgent than this waiting request
      Sequence* victim = least_urgent(*seq);
      return victim && key(victim) > key(seq) ? victim : nullptr;
    };
    while (static_cast<int64_t>(running_.size()) >= config_.max_num_seqs)
      if (Sequence* victim = behind())
        preempt(*victim);
      else
        break;
    bool ready = static_cast<int64_t>(running_.size()) < config_.max_num_seqs &&
                 ReadyToAdmit(*seq, budget, &count);
    while (!ready && static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
      Sequence* victim = behind();
      if (!victim) break;
      preempt(*victim);
      ready = ReadyToAdmit(*seq, budget, &count);
    }
    if (!ready) {
      if (running_.empty() && scheduled.empty()) RefuseUnfittable(*seq);
      admitting = false;
      continue;
    }
    auto it =
        std::find_if(waiting_.begin(), waiting_.end(), [&](auto& w) { return w.get() == seq; });
    running_.push_back(std::move(*it));
    waiting_.erase(it);
    running.insert(seq);
    scheduled.push_back({seq, count});
    budget -= count;
    done.insert(seq);
  }
}

bool Engine::StepOnce(bool must_step) {
  TakeIncoming();
  // Aborted requests leave first.
  auto drop_aborted = [&](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      if ((*it)->aborted) {
        Finish(**it, "abort", RequestEvent{});
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  };
  drop_aborted(running_);
  drop_aborted(waiting_);
  CountWaiting();
  bool stopping, drain;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping = stopping_;
    drain = drain_;
  }
  if (stopping && !drain) {
    for (auto& seq : running_)
      Finish(*seq, "abort", RequestEvent{});
    for (auto& seq : waiting_)
      Finish(*seq, "abort", RequestEvent{});
    running_.clear();
    waiting_.clear();
    CountWaiting();
  }
  if (running_.empty() && waiting_.empty() && !must_step) {
    PublishGauges();
    return false;
  }

  int64_t budget = config_.max_num_batched_tokens;
  std::vector<std::pair<Sequence*, int64_t>> scheduled;
  if (config_.scheduling_policy == EngineConfig::SchedulingPolicy::kPriority)
    SchedulePriority(budget, scheduled);
  else
    ScheduleFcfs(budget, scheduled);
  CountWaiting();
  if (scheduled.empty() && !must_step) return !running_.empty() || !waiting_.empty();

  ForwardBatch batch;
  std::vector<int64_t> first_positions, draft_counts;
  for (auto& [seq, count] : scheduled) {
    first_positions.push_back(seq->computed);
    const int64_t drafts = static_cast<int64_t>(seq->drafts.size());
    draft_counts.push_back(seq->remaining() == 1 ? drafts : 0);
    if (draft_counts.back() > 0) {
      std::vector<int32_t> query = {seq->tokens.back()};
      query.insert(query.end(), seq->drafts.begin(), seq->drafts.end());
      batch.Add(query.data(), count, &seq->cache);
      batch.sequences.back().all_logit_rows = true;
      continue;
    }
    batch.Add(seq->tokens.data() + seq->computed, count, &seq->cache);
    batch.sequences.back().all_logit_rows =
        seq->wants_prompt_logprobs() && seq->computed < seq->prompt_length;
  }
  const bool speculative = mtp_drafting();
  // The constrained sequences that sample this step (a prefill's last chunk, a decode step, a
  // verification's first row) have their masks made beside the forward: their matchers are idle
  // until sampling, and the mask depends on nothing the forward computes.
  std::vector<Sequence*> to_mask;
  if (config_.masks_beside_forward)
    for (size_t i = 0; i < scheduled.size(); ++i) {
      Sequence* seq = scheduled[i].first;
      if (seq->grammar && (draft_counts[i] > 0 || seq->remaining() == scheduled[i].second))
        to_mask.push_back(seq);
    }
  if (!to_mask.empty()) {
    const auto words = static_cast<size_t>((model_.config().vocab_size + 63) / 64);
    mask_thread_.Start([&to_mask, words] {
      for (Sequence* seq : to_mask) {
        seq->next_mask.resize(words);
        seq->grammar->FillNextTokenMask(seq->next_mask);
        seq->next_mask_ready = true;
      }
    });
  }
  const double start = NowSeconds();
  step_started_ = start;
  busy_ = true;
  Status status = model_.Forward(batch, cache_, forward_options_, &logits_,
                                 speculative ? &final_hidden_ : nullptr);
  if (!to_mask.empty()) mask_thread_.Wait();
  const double now = NowSeconds();
  busy_ = false;
  last_step_end_ = now;
  if (!status.ok()) {
    // The batch was checked at submission; a failure here is a bug. Fail these requests loudly
    // and keep serving the others.
    std::fprintf(stderr, "switchyard: step failed: %s\n", status.message().c_str());
    for (auto& [seq, count] : scheduled)
      seq->aborted = true;
    for (auto it = running_.begin(); it != running_.end();) {
      if ((*it)->aborted) {
        RequestEvent event;
        event.error = status.message();
        Finish(**it, "error", std::move(event));
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    PublishGauges();  // /metrics and the router's load probe must not keep the failed requests
    return true;
  }
  const int64_t vocab = model_.config().vocab_size;
  int64_t row = 0;
  for (size_t i = 0; i < scheduled.size(); ++i) {
    const auto [seq, count] = scheduled[i];
    if (draft_counts[i] > 0)
      ProcessVerification(*seq, draft_counts[i], logits_.data() + row * vocab, now);
    else
      ProcessOutput(*seq, count, logits_.data() + row * vocab, now);
    row += batch.sequences[i].all_logit_rows ? count : 1;
  }
  for (Sequence* seq : to_mask)
    seq->next_mask_ready = false;  // taken by now; never left for a later state
  if (speculative) Draft(scheduled, first_positions, batch);
  for (auto& [seq, count] : scheduled)  // after Draft: the MTP layer's rows are written
    if (seq->request.kv_sink && !seq->finished) ExportRows(*seq);
  // Finished requests leave the running list.
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const std::unique_ptr<Sequence>& seq) { return seq->finished; }),
                 running_.end());
  {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    ++metrics_.steps_total;
  }
  PublishGauges();
  return true;
}

void Engine::PublishGauges() {
  int64_t queued = 0;
  // A prefill instance's request generates one token here.
  auto left = [](const Sequence& seq) {
    return seq.request.kv_sink ? 1 : seq.request.params.max_tokens - seq.generated();
  };
  for (const auto& seq : running_)
    queued += seq->remaining() + left(*seq);
  for (const auto& seq : waiting_)
    queued += seq->remaining() + left(*seq);
  std::lock_guard<std::mutex> lock(mutex_);
  running_count_ = static_cast<int64_t>(running_.size());
  queued_tokens_ = queued;
  used_pages_ = pool_.used_pages();
  cached_pages_ = pool_.cached_pages();
  free_pages_ = pool_.available_pages();
}

}  // namespace sy

namespace sy {

void Engine::Loop() {
  while (true) {
    bool worked = StepOnce();
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_ && running_.empty() && waiting_.empty() && incoming_.empty()) break;
    if (!worked && incoming_.empty() && aborts_.empty() && !stopping_)
      wake_.wait(lock, [&] { return !incoming_.empty() || !aborts_.empty() || stopping_; });
  }
}

void Engine::Watchdog() {
  // A step that does not complete within the limit marks the engine unhealthy (/health turns
  // 503) and says so on stderr once; it recovers when steps complete again.
  bool reported = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopped_; })) return;
    }
    const bool stuck = busy_ && NowSeconds() - step_started_ > config_.step_timeout_seconds;
    healthy_ = !stuck;
    if (stuck && !reported) {
      std::fprintf(stderr, "switchyard: watchdog: a step has run for %.0f s (limit %.0f s)\n",
                   NowSeconds() - step_started_, config_.step_timeout_seconds);
      reported = true;
    }
    if (!stuck) reported = false;
  }
}

EngineMetrics Engine::Metrics() const {
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    m = metrics_;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    m.waiting = waiting_count_;
    m.running = running_count_;
    m.queued_tokens = queued_tokens_;
    m.used_pages = used_pages_;
    m.cached_pages = cached_pages_;
    m.free_pages = free_pages_;
  }
  m.total_pages = pool_.total_pages();
  m.healthy = healthy_;
  m.last_step_age_seconds = busy_ ? NowSeconds() - step_started_ : 0;
  return m;
}

}  // namespace sy
