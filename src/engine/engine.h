// The serving engine: one model, its paged latent cache, and a step loop that batches requests
// continuously. Each step runs one Model::Forward over a ragged batch of decode tokens of running
// requests and prefill chunks of new ones, within a token budget: running requests first, then
// admissions in arrival order, each only when the pages for its chunk can be had. When pages run
// out the newest running request is preempted (its pages freed, recomputed later from prompt +
// generated tokens). Full pages enter the prefix cache; a new request starts from the longest
// cached run of its leading pages.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/side_thread.h"
#include "base/status.h"
#include "engine/cache_events.h"
#include "engine/detokenizer.h"
#include "engine/page_pool.h"
#include "engine/request.h"
#include "model/model.h"
#include "model/ngram_drafter.h"
#include "structured/compiler.h"
#include "tokenizer/tokenizer.h"

namespace sy {

struct EngineConfig {
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_waiting = 4096;
  int64_t max_model_len = 0;          // 0: the model's max_position_embeddings
  double step_timeout_seconds = 120;  // the watchdog's limit for one step
  // Speculative decoding: draft tokens per decode step (0: off), and what drafts them — the
  // checkpoint's MTP module (the model must have one and the cache its layer: Model::NewCache
  // with mtp), or n-gram lookup in the request's own tokens (model/ngram_drafter.h), which needs
  // neither.
  int64_t num_speculative_tokens = 0;
  Drafter drafter = Drafter::kMtp;
  NgramLookup ngram;
  // Structured output: make the next token masks of the step's constrained sequences on a thread
  // of their own while the model's forward runs, instead of after it (same masks either way).
  bool masks_beside_forward = true;
  // Keep the partly filled last page of a request whose rows are all prompt rows (a one-token
  // request: a beam search's step, a scoring request) when it finishes, so that a later request
  // extending those tokens copies the rows instead of computing them (PagePool::RegisterTail).
  bool keep_partial_pages = true;
  // In-batch prefix sharing: a waiting request whose next prompt page a scheduled request
  // computes this step waits a step and takes it from the cache then, instead of computing it
  // again (n > 1 samples of one prompt, requests with one system prompt arriving together); the
  // requests behind it are admitted meanwhile.
  bool wait_for_shared_pages = true;
  // kFcfs: requests run in arrival order; when pages run out the newest running request is
  // preempted. kPriority (vLLM's --scheduling-policy priority): by (priority, arrival) — the step's
  // token budget goes to the most urgent first, a waiting request takes the slot and pages of
  // less urgent running ones (preempted, recomputed later), and page pressure preempts the least
  // urgent.
  enum class SchedulingPolicy { kFcfs, kPriority };
  SchedulingPolicy scheduling_policy = SchedulingPolicy::kFcfs;
};

// The latency histograms' bucket bounds in seconds (vLLM's, for TTFT, ITL and end-to-end).
std::vector<double> LatencyBucketBounds();
// Token-count histograms' bounds: 1, 2, 5, 10, 20, 50, … up to `max` (vLLM's 1-2-5 series, for
// prompt and generation lengths and max_tokens).
std::vector<double> TokenBucketBounds(int64_t max);
// Tokens per engine step: vLLM's iteration_tokens_total bounds.
std::vector<double> StepTokenBucketBounds();

struct Histogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // per bound (≤ bound), then +Inf
  double sum = 0;
  int64_t count = 0;
  explicit Histogram(std::vector<double> b = {})
      : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void Observe(double value);
};

// Metrics a frontend adds beside the engine's own (the router's per-pool latencies).
struct LabeledHistogram {
  std::string name, help, labels;  // labels: `key="value"` pairs
  Histogram histogram;
};
struct LabeledValue {
  std::string name, type, help, labels;  // type: counter or gauge
  double value = 0;
};

struct EngineMetrics {
  int64_t running = 0, waiting = 0;
  int64_t total_pages = 0, used_pages = 0, cached_pages = 0, free_pages = 0;
  // The latent cache as configured: tokens a page, row dtype, bytes a token over the layers.
  int64_t page_size = 0, cache_bytes_per_token = 0;
  DType cache_dtype = DType::kBF16;
  int64_t queued_tokens = 0;  // prompt tokens not yet computed plus tokens still to generate
  // The requests queued_tokens counts, by id, each with its share: a router tells its own
  // requests, and which of them the instance has taken in, from other clients' work.
  std::vector<std::pair<std::string, int64_t>> queued_requests;
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0, preemptions_total = 0;
  int64_t prefix_cache_queries_total = 0, prefix_cache_hits_total = 0;  // in tokens
  int64_t steps_total = 0;
  // Speculative decoding, as vLLM names them: verifications with drafts, draft tokens proposed,
  // drafts accepted, and accepted drafts by position (0: the first draft of a step).
  int64_t spec_drafts_total = 0, spec_draft_tokens_total = 0, spec_accepted_tokens_total = 0;
  std::vector<int64_t> spec_accepted_per_position;
  std::map<std::string, int64_t> finished_by_reason;
  Histogram time_to_first_token, inter_token_latency, e2e_request_latency;
  Histogram queue_time;  // arrival to first admission
  // Per finished request, as vLLM's: its prompt and generated token counts, its max_tokens;
  // prefill (first admission to first token), decode (first token to finish) and inference
  // (first admission to finish) times. Per step: the tokens it computed.
  Histogram request_prompt_tokens, request_generation_tokens, request_max_tokens;
  Histogram request_prefill_time, request_decode_time, request_inference_time;
  Histogram iteration_tokens;
  // Every histogram above with its Prometheus name (without the prefix) and help, so that
  // whoever carries or sums metrics (MPI groups) takes all of them.
  struct NamedHistogram {
    const char* name;
    const char* help;
    Histogram* histogram;
  };
  std::vector<NamedHistogram> Histograms();
  std::vector<LabeledHistogram> extra_histograms;
  std::vector<LabeledValue> extra_values;
  double last_step_age_seconds = 0;  // since the last step completed (0 when idle)
  bool healthy = true;
};

// What a request must fit; the checks Engine::Submit makes, also made by a router before it
// sends a request anywhere. The message names the field.
struct RequestLimits {
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
  int64_t cache_tokens = 0;
  bool priority_scheduling = false;  // else a priority other than 0 is refused
  int32_t eos_token_id = -1;         // the model's end of sequence (-1: unknown)
  // generation_config.json's other ends of sequence (Kimi K2's <|im_end|>): a beam ends on them
  // too.
  std::vector<int32_t> more_eos_token_ids;
};
Status ValidateRequest(const EngineRequest& request, const RequestLimits& limits);

// Why Submit refused a request (the server maps it to a status code).
enum class SubmitError { kNone, kInvalid, kQueueFull, kStopping };

// What a server talks to: one engine in this process, or (under mpirun) the engines of every
// DP group reached through rank 0 (serve/cluster.h).
class RequestFrontend {
 public:
  virtual ~RequestFrontend() = default;
  // Queues a request; on refusal `*error` says why and the message names the field.
  virtual Result<std::shared_ptr<RequestStream>> Submit(EngineRequest request,
                                                        SubmitError* error) = 0;
  // Queues all of a client request's sequences (its prompts × n) or none: a refusal leaves
  // nothing queued or running. This default submits one by one and aborts what it queued when
  // one is refused (a frontend that forwards elsewhere); engines check room for all first.
  virtual Result<std::vector<std::shared_ptr<RequestStream>>> SubmitAll(
      std::vector<EngineRequest> requests, SubmitError* error);
  // Aborts a request (a client hung up): its pages are freed at the next step.
  virtual void Abort(const std::string& id) = 0;
  virtual EngineMetrics Metrics() const = 0;
  // Stops admitting; with drain, lets requests finish first, else aborts them. Returns when done.
  virtual void Stop(bool drain) = 0;
  // The prefix cache's event stream, where the frontend has one place that holds it.
  virtual const CacheEventLog* cache_events() const { return nullptr; }
};

class Engine : public RequestFrontend {
 public:
  Engine(const Model& model, LatentCache& cache, const Tokenizer& tokenizer,
         ForwardOptions forward_options, EngineConfig config);
  ~Engine();

  // Runs the step loop on its own thread (one process); under mpirun a lockstep driver calls
  // StepOnce instead.
  void Start();
  void Stop(bool drain) override;

  Result<std::shared_ptr<RequestStream>> Submit(EngineRequest request, SubmitError* error) override;
  Result<std::vector<std::shared_ptr<RequestStream>>> SubmitAll(std::vector<EngineRequest> requests,
                                                                SubmitError* error) override;
  void Abort(const std::string& id) override;
  EngineMetrics Metrics() const override;
  // The checks Submit makes, without queueing (the same on every rank), and the limits they
  // check against.
  Status Validate(const EngineRequest& request) const;
  RequestLimits limits() const;
  // Whether a step would have anything to do (requests queued, running or waiting).
  bool HasWork() const;
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const ModelConfig& model_config() const { return model_.config(); }
  int64_t max_model_len() const { return max_model_len_; }
  int64_t page_size() const { return pool_.page_size(); }
  const CacheEventLog* cache_events() const override { return &cache_events_; }

  // Runs one step synchronously (tests and the lockstep driver). False when idle. With
  // `must_step` the model steps even with nothing scheduled (an empty batch): every rank of an
  // expert-parallel job must make the same number of steps.
  bool StepOnce(bool must_step = false);

 private:
  struct Sequence;
  // A validated request made ready to queue (Submit's checks, its detokenizer primed).
  Result<std::unique_ptr<Sequence>> Prepare(EngineRequest request);
  void Loop();
  void Watchdog();
  void TakeIncoming();
  void CountWaiting();  // waiting_count_ = incoming + waiting, under the lock
  bool EnsurePages(Sequence& seq, int64_t length);
  void FreePages(Sequence& seq);
  void Preempt(Sequence& seq);
  void Finish(Sequence& seq, const std::string& reason, RequestEvent event);
  void RegisterFullPages(Sequence& seq);
  // keep_partial_pages: a finishing sequence's partial last page kept as a tail; a sequence
  // being admitted (at most `total` − 1 rows from the cache) takes a tail's rows after its
  // matched pages.
  void KeepTail(Sequence& seq);
  void AdoptTail(Sequence& seq, int64_t total);
  // Disaggregation: puts a decode request's received rows into its pages (false: no pages);
  // hands a prefill request's newly computed rows to its sink, and the request on once its
  // first token is out.
  bool InstallImported(Sequence& seq);
  // The scheduling step's two policies (EngineConfig::SchedulingPolicy): each adds to
  // `scheduled` and spends `budget`.
  void ScheduleFcfs(int64_t& budget, std::vector<std::pair<Sequence*, int64_t>>& scheduled);
  void SchedulePriority(int64_t& budget, std::vector<std::pair<Sequence*, int64_t>>& scheduled);
  // Readies a waiting request to run this step: its prefix from the cache (first look), its
  // received rows, and pages for the `*count` tokens it computes within `budget`. False, holding
  // no pages, where the pages are not there.
  bool ReadyToAdmit(Sequence& seq, int64_t budget, int64_t* count);
  // wait_for_shared_pages: whether a request of `scheduled` completes, this step, the first
  // prompt page `seq` would otherwise compute itself.
  bool AwaitsSharedPage(const Sequence& seq,
                        const std::vector<std::pair<Sequence*, int64_t>>& scheduled) const;
  // A waiting request that cannot fit even with nothing else running: finished with an error.
  void RefuseUnfittable(Sequence& seq);
  // Moves a running request back to the waiting queue, its rows dropped.
  void PreemptRunning(Sequence& seq);
  // Tokens seq computes this step within `budget`: a chunk, a decode token, or the last token
  // with its MTP drafts (trimmed to the budget, the request's length and the pages there are).
  int64_t StepCount(Sequence& seq, int64_t budget);
  void ExportRows(Sequence& seq);
  // Where seq's own output starts, for its page hashes (PagePool::PageHash); INT64_MAX where
  // every position is computed in one attention form whatever its role (--batch-invariant).
  int64_t GeneratedFrom(const Sequence& seq) const;
  void ProcessOutput(Sequence& seq, int64_t tokens, const float* rows, double now);
  // A decode step that verified `drafts` draft tokens: rows [1 + drafts, vocab].
  void ProcessVerification(Sequence& seq, int64_t drafts, const float* rows, double now);
  // Appends a generated token: penalties, detokenizer, logprobs, metrics; returns the finish
  // reason ("" while the request goes on).
  std::string EmitToken(Sequence& seq, int32_t token, const float* row, double now,
                        RequestEvent& event, bool& stopped_by_string);
  // Sends the event (the finishing one when `reason` is set).
  void Deliver(Sequence& seq, RequestEvent event, const std::string& reason,
               bool stopped_by_string);
  std::vector<int32_t> BlockedTokens(const Sequence& seq) const;
  // The reasoning budget: the tokenizer's "<think>"/"</think>" ids (an error where it has none),
  // and whether a sequence at `count` must close its thinking section now.
  Result<ThinkTokens> ThinkMarkers();
  bool ThinkingSpent(const Sequence& seq, const ThinkingCount& count) const;
  // N-gram drafting: a decoding sequence's drafts looked up in its own tokens, cut where the
  // sequence's grammar refuses one and ending with "</think>" where the reasoning budget forces
  // it (what verification would do to them anyway).
  void LookUpDrafts(Sequence& seq);
  bool mtp_drafting() const {
    return config_.num_speculative_tokens > 0 && config_.drafter == Drafter::kMtp;
  }
  // Runs the MTP module over the rows this step made valid and drafts the next tokens.
  void Draft(const std::vector<std::pair<Sequence*, int64_t>>& scheduled,
             const std::vector<int64_t>& first_positions, const ForwardBatch& batch);
  void PublishGauges();
  void RecordPromptLogprobs(Sequence& seq, int64_t first, int64_t count, const float* rows);
  // Structured output: `row` with every token the sequence's grammar forbids at -inf (in
  // masked_row_), or `row` itself for a sequence without a grammar.
  const float* GrammarRow(Sequence& seq, const float* row);
  // The compiler of grammars against this engine's vocabulary, made on first use.
  structured::GrammarCompiler& Grammars();

  const Model& model_;
  LatentCache& cache_;
  CacheEventLog cache_events_;  // before pool_, which reports into it
  PagePool pool_;
  const Tokenizer& tokenizer_;
  ForwardOptions forward_options_;
  EngineConfig config_;
  int64_t max_model_len_;

  // Shared with submitters.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  std::vector<std::string> aborts_;
  bool stopping_ = false, drain_ = false, stopped_ = false;
  int64_t waiting_count_ = 0;  // incoming + waiting, for the queue limit
  // Gauges the step loop publishes after each step.
  std::vector<std::pair<std::string, int64_t>> queued_requests_;
  int64_t running_count_ = 0, queued_tokens_ = 0, used_pages_ = 0, cached_pages_ = 0,
          free_pages_ = 0;

  // Owned by the step loop.
  std::deque<std::unique_ptr<Sequence>> waiting_;
  uint64_t next_arrival_index_ = 0;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<float> logits_;
  std::vector<float> final_hidden_;  // the step's final hidden rows, for MTP drafting
  std::vector<float> scratch_, dense_scratch_;
  std::vector<float> masked_row_;
  std::vector<uint64_t> grammar_mask_;
  SideThread mask_thread_;  // masks_beside_forward
  std::once_flag grammars_once_, think_once_;
  std::optional<ThinkTokens> think_;
  std::unique_ptr<structured::GrammarCompiler> grammars_;

  mutable std::mutex metrics_mutex_;
  EngineMetrics metrics_;
  std::atomic<double> last_step_end_{0};
  std::atomic<double> step_started_{0};
  std::atomic<bool> busy_{false};
  std::atomic<bool> healthy_{true};

  std::thread loop_, watchdog_;
};

}  // namespace sy
