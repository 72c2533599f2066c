// The serving engine against the model run directly: continuous batching, chunked prefill,
// prefix reuse, preemption and sampling must not change what a request gets.
#include <gtest/gtest.h>

#include <random>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>
#include "chat_output/tool_choice.h"
#include "engine/engine.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/onednn_linear.h"
#include "model/synthetic.h"
#include "structured/matcher.h"
#include "test_support.h"
#include "tokenizer/embedded_tokenizers.h"
#include "tokenizer/unicode.h"

namespace sy {
namespace {

using Setup = testing::LoadedModel;

const Setup& DefaultModel() {
  return testing::BatchInvariantSmallModel();
}

// The trained default model (models/default), whose MTP drafts are often right.
const Setup& TrainedModel() {
  static Setup setup = [] {
    DefaultModel();  // the batch-invariant kernel settings
    return testing::LoadModelAndTokenizer(std::string(SY_SOURCE_DIR) + "/models/default");
  }();
  return setup;
}

// Greedy tokens of one prompt decoded alone, straight through Model::Forward.
std::vector<int32_t> GreedyAlone(const std::vector<int32_t>& prompt, int64_t count,
                                 const Setup& setup = DefaultModel(),
                                 AttentionForm form = AttentionForm::kAuto) {
  const Model& model = *setup.model;
  LatentCache cache = model.NewCache(static_cast<int64_t>(prompt.size()) + count, 1, DType::kF32);
  SequenceCache seq;
  seq.prompt_end = static_cast<int64_t>(prompt.size());  // as the engine has it
  ForwardOptions options;
  options.attention = form;
  options.logit_rows = LogitRows::kLast;
  std::vector<float> logits;
  std::vector<int32_t> out;
  std::vector<int32_t> next = prompt;
  const int64_t vocab = model.config().vocab_size;
  for (int64_t i = 0; i < count; ++i) {
    ForwardBatch batch;
    batch.Add(next.data(), static_cast<int64_t>(next.size()), &seq);
    EXPECT_TRUE(model.Forward(batch, cache, options, &logits).ok());
    const int32_t token = static_cast<int32_t>(
        std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
    out.push_back(token);
    next = {token};
  }
  return out;
}

std::vector<int32_t> Prompt(int64_t length, int32_t salt) {
  return testing::SaltedPrompt(length, salt);
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  std::string finish;
  std::string error;
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
  int64_t prompt_tokens = -1, cached_tokens = -1;
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  std::vector<TokenLogprob> logprobs;
};

Collected FromEvents(std::vector<RequestEvent>& events) {
  Collected c;
  for (auto& e : events) {
    c.tokens.insert(c.tokens.end(), e.token_ids.begin(), e.token_ids.end());
    c.text += e.text;
    for (auto& l : e.logprobs)
      c.logprobs.push_back(l);
    if (e.first) {
      c.prompt_tokens = e.prompt_tokens;
      c.cached_tokens = e.cached_tokens;
      c.prompt_logprobs = e.prompt_logprobs;
    }
    if (e.finish_reason) {
      c.finish = *e.finish_reason;
      c.error = e.error;
      c.stop_string = e.stop_string;
      c.stop_token = e.stop_token;
    }
  }
  return c;
}

Collected Collect(RequestStream& stream) {
  std::vector<RequestEvent> events;
  stream.Drain(&events);
  return FromEvents(events);
}

struct Harness {
  LatentCache cache;
  Engine engine;
  // With MTP drafts (config.num_speculative_tokens > 0) the cache has the MTP layer.
  Harness(int64_t cache_tokens, EngineConfig config, const Setup& setup = DefaultModel(),
          ForwardOptions forward = {})
      : cache(setup.model->NewCache(
            cache_tokens, 1, DType::kF32, 16,
            config.num_speculative_tokens > 0 && config.drafter == Drafter::kMtp)),
        engine(*setup.model, cache, *setup.tokenizer, forward, config) {}
  std::shared_ptr<RequestStream> Submit(std::string id, std::vector<int32_t> prompt,
                                        SamplingParams params) {
    SubmitError error;
    auto stream = engine.Submit({std::move(id), std::move(prompt), params}, &error);
    EXPECT_TRUE(stream.ok()) << stream.status().message();
    return stream.ok() ? stream.value() : nullptr;
  }
  void RunToIdle() {
    for (int i = 0; i < 100000 && engine.StepOnce(); ++i) {
    }
  }
};

using testing::Greedy;

TEST(EngineTest, ContinuousBatchingMatchesEachRequestAlone) {
  EngineConfig config;
  config.max_num_batched_tokens = 48;  // prompts prefill in chunks, beside others' decode steps
  Harness h(4096, config);
  std::vector<std::vector<int32_t>> prompts = {Prompt(70, 1), Prompt(5, 2), Prompt(33, 3),
                                               Prompt(120, 4)};
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    streams.push_back(h.Submit("r" + std::to_string(i), prompts[i], Greedy(12)));
    h.engine.StepOnce();  // arrivals staggered across steps
  }
  h.RunToIdle();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Collected c = Collect(*streams[i]);
    EXPECT_EQ(c.finish, "length");
    EXPECT_EQ(c.prompt_tokens, static_cast<int64_t>(prompts[i].size()));
    EXPECT_EQ(c.tokens, GreedyAlone(prompts[i], 12)) << "request " << i;
  }
  EngineMetrics m = h.engine.Metrics();
  EXPECT_EQ(m.used_pages, 0);
  // vLLM's request histograms: one entry per finished request, their sums what the requests
  // were; each step's computed tokens add up to every prompt token and every decode token (the
  // last generated token of each is never computed).
  int64_t prompt_total = 0;
  for (const auto& p : prompts)
    prompt_total += static_cast<int64_t>(p.size());
  const int64_t n = static_cast<int64_t>(prompts.size());
  EXPECT_EQ(m.request_prompt_tokens.count, n);
  EXPECT_EQ(m.request_prompt_tokens.sum, prompt_total);
  EXPECT_EQ(m.request_generation_tokens.sum, 12 * n);
  EXPECT_EQ(m.request_max_tokens.sum, 12 * n);
  EXPECT_EQ(m.iteration_tokens.sum, prompt_total + 11 * n);
  EXPECT_EQ(m.iteration_tokens.count, m.steps_total);
  for (const Histogram* h : {&m.request_prefill_time, &m.request_decode_time,
                             &m.request_inference_time, &m.queue_time}) {
    EXPECT_EQ(h->count, n);
    EXPECT_GE(h->sum, 0);
  }
  EXPECT_LE(m.request_prefill_time.sum + m.request_decode_time.sum,
            m.request_inference_time.sum + 1e-9);
  // The token bounds are vLLM's 1-2-5 series up to the context: 120 prompt tokens fall in
  // the bucket bounded by 200.
  EXPECT_EQ(TokenBucketBounds(120), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
}

TEST(EngineTest, PrefixHitGivesTheSameTokensAsAMiss) {
  Harness h(4096, EngineConfig{});
  std::vector<int32_t> shared = Prompt(80, 7);
  std::vector<int32_t> a = shared, b = shared;
  a.push_back(11);
  b.insert(b.end(), {12, 13, 14});
  auto first = h.Submit("a", a, Greedy(6));
  h.RunToIdle();
  auto second = h.Submit("b", b, Greedy(6));
  h.RunToIdle();
  Collected ca = Collect(*first), cb = Collect(*second);
  EXPECT_EQ(ca.cached_tokens, 0);
  EXPECT_EQ(cb.cached_tokens, 80);  // five full pages of 16
  EXPECT_EQ(cb.tokens, GreedyAlone(b, 6));
  auto metrics = h.engine.Metrics();
  EXPECT_EQ(metrics.prefix_cache_hits_total, 80);
  EXPECT_EQ(metrics.prefix_cache_queries_total, static_cast<int64_t>(a.size() + b.size()));
  EXPECT_EQ(metrics.used_pages, 0);
  EXPECT_GT(metrics.cached_pages, 0);
}

// A finished request's partial last page, when it holds prompt rows only, is kept: a later
// request extending those tokens copies the rows it shares instead of computing them.
TEST(EngineTest, APartialPageOfPromptRowsIsCopiedIntoALaterRequest) {
  const std::vector<int32_t> prompt = Prompt(37, 8);  // two full pages and 5 rows
  auto extended = [&](std::initializer_list<int32_t> more, int64_t keep) {
    std::vector<int32_t> p(prompt.begin(), prompt.begin() + keep);
    p.insert(p.end(), more);
    return p;
  };
  for (bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "kept" : "not kept");
    EngineConfig config;
    config.keep_partial_pages = keep;
    Harness h(4096, config);
    h.Submit("one token", prompt, Greedy(1));
    h.RunToIdle();
    // The whole prompt and one more token: its 5 rows come from the kept page.
    const std::vector<int32_t> b = extended({11}, 37);
    auto stream = h.Submit("b", b, Greedy(5));
    h.RunToIdle();
    Collected c = Collect(*stream);
    EXPECT_EQ(c.cached_tokens, keep ? 37 : 32);
    EXPECT_EQ(c.tokens, GreedyAlone(b, 5));
    // Tokens that part from the kept page's within it take none of its rows.
    const std::vector<int32_t> d = extended({12, 13}, 35);
    stream = h.Submit("d", d, Greedy(5));
    h.RunToIdle();
    c = Collect(*stream);
    EXPECT_EQ(c.cached_tokens, 32);
    EXPECT_EQ(c.tokens, GreedyAlone(d, 5));
    EXPECT_EQ(h.engine.Metrics().used_pages, 0);
  }
  // A request that generated keeps no partial page: its last page holds output rows.
  Harness h(4096, EngineConfig{});
  const std::vector<int32_t> other = Prompt(53, 9);
  h.Submit("generates", other, Greedy(4));
  h.RunToIdle();
  std::vector<int32_t> e = other;
  e.push_back(14);
  auto stream = h.Submit("e", e, Greedy(3));
  h.RunToIdle();
  EXPECT_EQ(Collect(*stream).cached_tokens, 48);
}

// Requests of one prompt arriving together (n > 1 samples, one system prompt): the first
// computes the shared pages, the others wait for them and take them from the cache, while
// unrelated requests behind them are admitted.
TEST(EngineTest, RequestsOfOnePromptComputeItOnce) {
  const std::vector<int32_t> prompt = Prompt(100, 12);
  for (auto [wait, policy] : {std::pair(true, EngineConfig::SchedulingPolicy::kFcfs),
                              std::pair(false, EngineConfig::SchedulingPolicy::kFcfs),
                              std::pair(true, EngineConfig::SchedulingPolicy::kPriority)}) {
    SCOPED_TRACE(std::string(wait ? "waiting for shared pages" : "each computing its own") +
                 (policy == EngineConfig::SchedulingPolicy::kPriority ? ", by priority" : ""));
    EngineConfig config;
    config.wait_for_shared_pages = wait;
    config.scheduling_policy = policy;
    Harness h(8192, config);  // a step's budget holds every prompt
    std::vector<std::shared_ptr<RequestStream>> siblings;
    for (int i = 0; i < 3; ++i)
      siblings.push_back(h.Submit("n" + std::to_string(i), prompt, Greedy(4)));
    auto other = h.Submit("other", Prompt(20, 13), Greedy(4));
    h.engine.StepOnce();
    // The unrelated request is not held back by the waiting ones.
    EXPECT_EQ(h.engine.Metrics().waiting, wait ? 2 : 0);
    h.RunToIdle();
    const std::vector<int32_t> alone = GreedyAlone(prompt, 4);
    for (size_t i = 0; i < siblings.size(); ++i) {
      Collected c = Collect(*siblings[i]);
      EXPECT_EQ(c.tokens, alone) << "sibling " << i;
      EXPECT_EQ(c.cached_tokens, i == 0 || !wait ? 0 : 96) << "sibling " << i;
    }
    EXPECT_EQ(Collect(*other).tokens, GreedyAlone(Prompt(20, 13), 4));
    EXPECT_EQ(h.engine.Metrics().prefix_cache_hits_total, wait ? 2 * 96 : 0);
  }
}

TEST(EngineTest, PreemptionUnderPagePressureLosesNothing) {
  EngineConfig config;
  config.max_num_batched_tokens = 256;
  Harness h(16 * 14, config);  // 14 pages for 6 requests that need 4 or 5 each
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(Prompt(30 + i * 5, 20 + i));
    streams.push_back(h.Submit("p" + std::to_string(i), prompts.back(), Greedy(30)));
  }
  h.RunToIdle();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Collected c = Collect(*streams[i]);
    EXPECT_EQ(c.finish, "length");
    EXPECT_EQ(c.tokens, GreedyAlone(prompts[i], 30)) << "request " << i;
  }
  auto metrics = h.engine.Metrics();
  EXPECT_GT(metrics.preemptions_total, 0);
  EXPECT_EQ(metrics.used_pages, 0);
  EXPECT_EQ(metrics.waiting, 0);  // preempted requests went back to the queue and left it again
  EXPECT_EQ(metrics.running, 0);
}

// The waiting count (the /metrics gauge and the --max-waiting limit) follows the queue through
// admissions, aborts of queued requests and preemptions.
TEST(EngineTest, TheWaitingCountFollowsTheQueue) {
  EngineConfig config;
  config.max_num_seqs = 1;
  config.max_waiting = 3;
  Harness h(4096, config);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i)
    streams.push_back(h.Submit("w" + std::to_string(i), Prompt(8, i), Greedy(4)));
  SubmitError error;
  EXPECT_FALSE(h.engine.Submit({"over", Prompt(8, 9), Greedy(4)}, &error).ok());
  EXPECT_EQ(error, SubmitError::kQueueFull);
  h.engine.StepOnce();  // one admitted, two wait
  EXPECT_EQ(h.engine.Metrics().waiting, 2);
  h.engine.Abort("w1");
  h.engine.Abort("w2");
  h.engine.StepOnce();
  EXPECT_EQ(h.engine.Metrics().waiting, 0);
  // Aborted queued requests free their places: the queue takes three again.
  for (int i = 3; i < 6; ++i)
    streams.push_back(h.Submit("w" + std::to_string(i), Prompt(8, i), Greedy(4)));
  h.RunToIdle();
  EXPECT_EQ(h.engine.Metrics().waiting, 0);
  for (int i : {0, 3, 4, 5})
    EXPECT_EQ(Collect(*streams[static_cast<size_t>(i)]).finish, "length") << i;
  EXPECT_EQ(Collect(*streams[1]).finish, "abort");
}

// The serving default on CPUs with AVX-512 BF16: the bf16 dot kernel, whose rows do not depend on
// the batch. With one attention form for prompts and decode (absorbed, as --batch-invariant
// asks), a preempted and recomputed request gives the tokens of the request decoded alone.
// (Steps of 256 tokens and more may take oneDNN by default, whose rows depend on the step: the
// property is the dot kernel's, so this keeps every product on it, as --prefill-gemm own does.)
TEST(EngineTest, PreemptionOnTheBf16DotPathLosesNothing) {
  if (!kernels::HasBf16Dot()) GTEST_SKIP() << "no AVX-512 BF16 and VBMI on this CPU";
  DefaultModel();
  kernels::GlobalKernelOptions().bf16_dot = true;
  kernels::GlobalPrefillGemm() = kernels::PrefillGemm::kOwn;
  EngineConfig config;
  config.max_num_batched_tokens = 256;
  ForwardOptions forward;
  forward.attention = AttentionForm::kAbsorbed;
  Harness h(16 * 14, config, DefaultModel(), forward);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(Prompt(30 + i * 5, 40 + i));
    streams.push_back(h.Submit("d" + std::to_string(i), prompts.back(), Greedy(30)));
  }
  h.RunToIdle();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Collected c = Collect(*streams[i]);
    EXPECT_EQ(c.tokens, GreedyAlone(prompts[i], 30, DefaultModel(), AttentionForm::kAbsorbed))
        << "request " << i;
  }
  EXPECT_GT(h.engine.Metrics().preemptions_total, 0);
  kernels::GlobalKernelOptions().bf16_dot = false;
  kernels::GlobalPrefillGemm() = kernels::PrefillGemm::kAuto;
}

// One answer per request in the serving default (attention by role and position, products
// whose rows do not depend on the batch, a bf16 cache, the bf16 dot kernel where the CPU has it):
// a greedy request's tokens and log-probabilities are the same bits alone, after a prefix-cache
// hit, with its prompt in small chunks beside other requests, preempted and recomputed, and
// resumed from its own output (failover). A later request that has this one's output in its
// prompt does not reuse the pages holding that output (they were computed as decode steps).
// AMX kernels run on the emulator where this CPU has no tiles (read once, before the first
// product asks for a backend), for the --amx-bf16 test below; no other test here asks for them.
const bool kEmulateAmx = [] {
  setenv("SWITCHYARD_AMX_EMULATE", "1", 1);
  return true;
}();

struct DefaultServing {
  DefaultServing() {
    DefaultModel();
    kernels::GlobalKernelOptions().bf16_dot = true;  // where the CPU has it, as serve runs
    kernels::SplitKEnabled() = true;
  }
  ~DefaultServing() {
    kernels::GlobalKernelOptions().bf16_dot = false;
    kernels::SplitKEnabled() = false;
  }
};

// The latent cache's dtype of the serving runs below (serve's --kv-dtype), bf16 unless a test
// holds a ServingCacheDtype (which puts bf16 back however the test ends).
DType g_serving_cache = DType::kBF16;
struct ServingCacheDtype {
  explicit ServingCacheDtype(DType dtype) { g_serving_cache = dtype; }
  ~ServingCacheDtype() { g_serving_cache = DType::kBF16; }
};

struct ServingRun {
  LatentCache cache;
  Engine engine;
  ServingRun(int64_t cache_tokens, EngineConfig config)
      : cache(DefaultModel().model->NewCache(cache_tokens, 1, g_serving_cache, 16)),
        engine(*DefaultModel().model, cache, *DefaultModel().tokenizer, ForwardOptions{}, config) {}
  std::shared_ptr<RequestStream> Submit(std::string id, std::vector<int32_t> prompt,
                                        SamplingParams params, int64_t resumed = 0) {
    SubmitError error;
    EngineRequest request{std::move(id), std::move(prompt), params};
    request.resumed_tokens = resumed;
    auto stream = engine.Submit(std::move(request), &error);
    EXPECT_TRUE(stream.ok()) << stream.status().message();
    return stream.ok() ? stream.value() : nullptr;
  }
  void RunToIdle() {
    for (int i = 0; i < 100000 && engine.StepOnce(); ++i) {
    }
  }
};

SamplingParams GreedyWithLogprobs(int64_t max_tokens) {
  SamplingParams p = Greedy(max_tokens);
  p.logprobs = 2;
  return p;
}

std::vector<float> Logprobs(const Collected& c) {
  std::vector<float> out;
  for (const auto& l : c.logprobs) {
    out.push_back(l.logprob);
    for (const auto& [token, logprob] : l.top)
      out.push_back(logprob);
  }
  return out;
}

// The bits of a request run alone on a fresh engine.
Collected ServedAlone(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  ServingRun run(4096, EngineConfig{});
  auto stream = run.Submit("alone", prompt, GreedyWithLogprobs(max_tokens));
  run.RunToIdle();
  return Collect(*stream);
}

void ExpectOneAnswer(int64_t length) {
  const std::vector<int32_t> prompt = Prompt(length, 31);
  const int64_t kTokens = 16;
  SCOPED_TRACE("a prompt of " + std::to_string(length) + " tokens");
  const Collected alone = ServedAlone(prompt, kTokens);
  ASSERT_EQ(static_cast<int64_t>(alone.tokens.size()), kTokens);
  const std::vector<float> alone_logprobs = Logprobs(alone);
  auto expect_same = [&](const Collected& c, const std::string& how) {
    EXPECT_EQ(c.tokens, alone.tokens) << how;
    const std::vector<float> logprobs = Logprobs(c);
    EXPECT_EQ(logprobs.size(), alone_logprobs.size()) << how;
    EXPECT_TRUE(
        logprobs.size() == alone_logprobs.size() &&
        std::memcmp(logprobs.data(), alone_logprobs.data(), logprobs.size() * sizeof(float)) == 0)
        << how << ": log-probabilities are not the same bits";
  };
  const int64_t shared = length * 3 / 4, page = 16;
  {  // after a request sharing its first three quarters (a cache hit of whole pages)
    ServingRun run(4096, EngineConfig{});
    std::vector<int32_t> other(prompt.begin(), prompt.begin() + shared);
    other.push_back(7);
    run.Submit("first", other, Greedy(3));
    run.RunToIdle();
    auto stream = run.Submit("x", prompt, GreedyWithLogprobs(kTokens));
    run.RunToIdle();
    Collected c = Collect(*stream);
    EXPECT_EQ(c.cached_tokens, shared / page * page);
    expect_same(c, "after a prefix-cache hit");
    // The whole prompt again: every full page before the last token comes from the cache, and
    // the few tokens left are computed as prompt rows, not as a decode step's.
    stream = run.Submit("again", prompt, GreedyWithLogprobs(kTokens));
    run.RunToIdle();
    c = Collect(*stream);
    EXPECT_EQ(c.cached_tokens, (length - 1) / page * page);
    expect_same(c, "sent twice");
  }
  {  // after a one-token request of all but its last two tokens (a beam search's step, say):
     // its full pages come from the prefix cache and the rows of its partial last page are
     // copied from that request's kept page
    ServingRun run(4096, EngineConfig{});
    std::vector<int32_t> head(prompt.begin(), prompt.end() - 2);
    run.Submit("head", head, Greedy(1));
    run.RunToIdle();
    auto stream = run.Submit("x", prompt, GreedyWithLogprobs(kTokens));
    run.RunToIdle();
    Collected c = Collect(*stream);
    EXPECT_EQ(c.cached_tokens, static_cast<int64_t>(head.size()));
    expect_same(c, "after its head's partial page was kept");
  }
  {  // in chunks of 24 tokens, beside three other requests decoding and prefilling
    EngineConfig config;
    config.max_num_batched_tokens = 24;
    ServingRun run(8192, config);
    for (int i = 0; i < 3; ++i)
      run.Submit("other" + std::to_string(i), Prompt(20 + 7 * i, 50 + i), Greedy(40));
    run.engine.StepOnce();
    auto stream = run.Submit("x", prompt, GreedyWithLogprobs(kTokens));
    run.RunToIdle();
    expect_same(Collect(*stream), "chunked beside others");
  }
  {  // resumed after its first 5 tokens (a router's failover): the rest is the same
    ServingRun run(4096, EngineConfig{});
    std::vector<int32_t> resumed = prompt;
    resumed.insert(resumed.end(), alone.tokens.begin(), alone.tokens.begin() + 5);
    auto stream = run.Submit("x", resumed, GreedyWithLogprobs(kTokens), 5);
    run.RunToIdle();
    Collected c = Collect(*stream);
    ASSERT_EQ(c.tokens.size(), alone.tokens.size() - 5);
    EXPECT_TRUE(std::equal(c.tokens.begin(), c.tokens.end(), alone.tokens.begin() + 5));
    std::vector<float> tail = Logprobs(c),
                       want(alone_logprobs.begin() + 5 * 3, alone_logprobs.end());
    EXPECT_TRUE(tail.size() == want.size() &&
                std::memcmp(tail.data(), want.data(), tail.size() * sizeof(float)) == 0)
        << "resumed: log-probabilities are not the same bits";
  }
  {  // a later prompt that holds this request's output: pages with output rows are not reused
    ServingRun run(4096, EngineConfig{});
    auto stream = run.Submit("x", prompt, GreedyWithLogprobs(kTokens));
    run.RunToIdle();
    Collect(*stream);
    std::vector<int32_t> next_turn = prompt;
    next_turn.insert(next_turn.end(), alone.tokens.begin(), alone.tokens.end());
    next_turn.push_back(9);
    stream = run.Submit("next", next_turn, GreedyWithLogprobs(6));
    run.RunToIdle();
    Collected c = Collect(*stream);
    EXPECT_EQ(c.cached_tokens, length / page * page);  // the prompt's full pages only
    const Collected fresh = ServedAlone(next_turn, 6);
    EXPECT_EQ(c.tokens, fresh.tokens);
    const std::vector<float> a = Logprobs(c), b = Logprobs(fresh);
    EXPECT_TRUE(a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0)
        << "the next turn's log-probabilities depend on the cache";
  }
}

TEST(EngineTest, OneAnswerPerRequestInTheDefaultMode) {
  DefaultServing serving;
  // 100 tokens: every position before kAbsorbedPromptKeys (prompt rows expanded, output rows
  // absorbed); 400: past it, where the bf16 MLA kernel runs the prompt's last rows are absorbed.
  ExpectOneAnswer(100);
  ExpectOneAnswer(400);
}

// The same on an fp8 cache (--kv-dtype fp8): its rows are rounded once, when written, and read
// back exactly, so a request's answer does not depend on how its rows came to be there either.
TEST(EngineTest, OneAnswerPerRequestOnAnFp8Cache) {
  DefaultServing serving;
  ServingCacheDtype fp8_cache(DType::kF8E4M3);
  ExpectOneAnswer(100);
  ExpectOneAnswer(400);
  // And the cache is fp8: the answer is not the bf16 cache's (its log-probabilities move).
  const std::vector<int32_t> prompt = Prompt(100, 31);
  const Collected fp8 = ServedAlone(prompt, 16);
  g_serving_cache = DType::kBF16;
  const Collected bf16 = ServedAlone(prompt, 16);
  EXPECT_NE(Logprobs(fp8), Logprobs(bf16));
}

// The same with --amx-bf16: products, grouped experts and absorbed attention on AMX tiles keep
// the one answer. (On the emulator where this CPU has no tiles, so a 100-token prompt only:
// the emulated tiles are some thirty times slower. Named apart from the *OneAnswer* tests that
// CTest repeats at every instruction-set level: the emulator's arithmetic does not change with it.)
TEST(EngineTest, AmxTilesGiveTheSameBitsCachedChunkedOrResumed) {
  ASSERT_NE(kernels::ActiveAmxBackend(), kernels::AmxBackend::kNone);
  DefaultServing serving;
  kernels::GlobalKernelOptions().amx_bf16 = true;
  ExpectOneAnswer(100);
  if (kernels::ActiveAmxBackend() == kernels::AmxBackend::kHardware) ExpectOneAnswer(400);
  kernels::GlobalKernelOptions().amx_bf16 = false;
}

// Preemption in the serving default: every request recomputed after losing its pages gives the
// bits it gives alone (its prompt rows as prompt, its output rows as decode steps).
TEST(EngineTest, PreemptionInTheDefaultModeGivesTheSameBits) {
  DefaultServing serving;
  EngineConfig config;
  config.max_num_batched_tokens = 256;
  ServingRun run(16 * 14, config);  // 14 pages for 6 requests that need 4 or 5 each
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(Prompt(30 + i * 5, 60 + i));
    streams.push_back(run.Submit("p" + std::to_string(i), prompts.back(), GreedyWithLogprobs(30)));
  }
  run.RunToIdle();
  EXPECT_GT(run.engine.Metrics().preemptions_total, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Collected c = Collect(*streams[i]), alone = ServedAlone(prompts[i], 30);
    EXPECT_EQ(c.tokens, alone.tokens) << "request " << i;
    const std::vector<float> a = Logprobs(c), b = Logprobs(alone);
    EXPECT_TRUE(a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0)
        << "request " << i << ": log-probabilities are not the same bits";
  }
}

// A client request's sequences (prompts × n) are queued all together or not at all.
TEST(EngineTest, SubmitAllQueuesEverySequenceOrNone) {
  EngineConfig config;
  config.max_waiting = 5;
  Harness h(4096, config);
  auto batch = [](int count, int salt) {
    std::vector<EngineRequest> requests;
    for (int i = 0; i < count; ++i)
      requests.push_back(
          {"b" + std::to_string(salt) + "-" + std::to_string(i), Prompt(8, salt + i), Greedy(3)});
    return requests;
  };
  SubmitError error;
  auto three = h.engine.SubmitAll(batch(3, 0), &error);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(error, SubmitError::kNone);
  // Three more do not fit beside the three queued: none of them is taken.
  auto refused = h.engine.SubmitAll(batch(3, 10), &error);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(error, SubmitError::kQueueFull);
  EXPECT_EQ(h.engine.Metrics().waiting, 3);
  // More than the queue ever holds: an invalid request, not "try again later".
  auto too_many = h.engine.SubmitAll(batch(6, 20), &error);
  EXPECT_FALSE(too_many.ok());
  EXPECT_EQ(error, SubmitError::kInvalid);
  EXPECT_NE(too_many.status().message().find("--max-waiting 5"), std::string::npos);
  // One invalid sequence among valid ones: none is queued.
  auto mixed = batch(2, 30);
  mixed[1].prompt = {-1};
  EXPECT_FALSE(h.engine.SubmitAll(std::move(mixed), &error).ok());
  EXPECT_EQ(error, SubmitError::kInvalid);
  EXPECT_EQ(h.engine.Metrics().waiting, 3);
  h.RunToIdle();
  for (auto& stream : three.value())
    EXPECT_EQ(Collect(*stream).finish, "length");
  auto metrics = h.engine.Metrics();
  EXPECT_EQ(metrics.waiting, 0);
  EXPECT_EQ(metrics.running, 0);
}

TEST(EngineTest, SeededSamplingDoesNotDependOnTheBatch) {
  SamplingParams params;
  params.temperature = 0.9;
  params.top_p = 0.9;
  params.top_k = 50;
  params.seed = 1234;
  params.max_tokens = 10;
  params.ignore_eos = true;
  std::vector<int32_t> alone_tokens;
  {
    Harness h(4096, EngineConfig{});
    auto s = h.Submit("alone", Prompt(20, 9), params);
    h.RunToIdle();
    alone_tokens = Collect(*s).tokens;
  }
  Harness h(4096, EngineConfig{});
  std::vector<std::shared_ptr<RequestStream>> others;
  for (int i = 0; i < 5; ++i)
    others.push_back(h.Submit("o" + std::to_string(i), Prompt(15, i), Greedy(8)));
  auto s = h.Submit("crowd", Prompt(20, 9), params);
  h.RunToIdle();
  EXPECT_EQ(Collect(*s).tokens, alone_tokens);
  params.seed = 99;
  auto other_seed = h.Submit("seed99", Prompt(20, 9), params);
  h.RunToIdle();
  EXPECT_NE(Collect(*other_seed).tokens, alone_tokens);
}

TEST(EngineTest, PromptLogprobsAreTheLogSoftmaxOfTheLogits) {
  const Model& model = *DefaultModel().model;
  std::vector<int32_t> prompt = Prompt(40, 3);
  LatentCache cache = model.NewCache(64, 1, DType::kF32);
  SequenceCache seq;
  ForwardBatch batch;
  batch.Add(prompt.data(), static_cast<int64_t>(prompt.size()), &seq);
  std::vector<float> logits;
  ASSERT_TRUE(model.Forward(batch, cache, ForwardOptions{}, &logits).ok());
  const int64_t vocab = model.config().vocab_size;

  EngineConfig config;
  config.max_num_batched_tokens = 16;  // prompt rows arrive over three chunks
  Harness h(4096, config);
  SamplingParams params = Greedy(1);
  params.prompt_logprobs = 2;
  params.logprobs = 1;
  auto s = h.Submit("echo", prompt, params);
  h.RunToIdle();
  Collected c = Collect(*s);
  ASSERT_EQ(c.prompt_logprobs.size(), prompt.size());
  EXPECT_FALSE(c.prompt_logprobs[0].has_value());
  for (size_t p = 1; p < prompt.size(); ++p) {
    std::vector<float> row(logits.begin() + (p - 1) * vocab, logits.begin() + p * vocab);
    LogSoftmaxInPlace(row.data(), vocab);
    ASSERT_TRUE(c.prompt_logprobs[p].has_value());
    EXPECT_NEAR(c.prompt_logprobs[p]->logprob, row[prompt[p]], 1e-4) << p;
    EXPECT_EQ(c.prompt_logprobs[p]->top.size(), 2u);
  }
  ASSERT_EQ(c.logprobs.size(), 1u);
  EXPECT_LE(c.logprobs[0].logprob, 0);
}

TEST(EngineTest, StopStringsAreNotReturnedAndAbortFreesPages) {
  Harness h(4096, EngineConfig{});
  // Find what greedy writes, then stop on a piece of it.
  auto probe = h.Submit("probe", Prompt(10, 4), Greedy(20));
  h.RunToIdle();
  Collected full = Collect(*probe);
  ASSERT_GE(full.text.size(), 12u);
  const std::string stop = full.text.substr(6, 4);
  SamplingParams params = Greedy(20);
  params.stop = {stop};
  auto stopped = h.Submit("stopped", Prompt(10, 4), params);
  h.RunToIdle();
  Collected c = Collect(*stopped);
  EXPECT_EQ(c.finish, "stop");
  EXPECT_EQ(c.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(c.stop_string, stop);  // vLLM's stop_reason: the string that matched
  EXPECT_FALSE(c.stop_token.has_value());
  EXPECT_FALSE(full.stop_string.has_value());  // "length" has no stop reason

  // A stop token reports its id; the end-of-sequence token reports none (as vLLM).
  params = Greedy(20);
  params.stop_token_ids = {full.tokens[3]};
  auto by_token = h.Submit("by-token", Prompt(10, 4), params);
  params = Greedy(20);
  params.ignore_eos = false;
  params.logit_bias = {{static_cast<int32_t>(DefaultModel().model->config().eos_token_id), 100.0}};
  auto by_eos = h.Submit("by-eos", Prompt(10, 4), params);
  h.RunToIdle();
  c = Collect(*by_token);
  EXPECT_EQ(c.finish, "stop");
  EXPECT_EQ(c.stop_token, full.tokens[3]);
  EXPECT_FALSE(c.stop_string.has_value());
  c = Collect(*by_eos);
  EXPECT_EQ(c.finish, "stop");
  EXPECT_EQ(c.tokens.size(), 1u);
  EXPECT_FALSE(c.stop_token.has_value());
  EXPECT_FALSE(c.stop_string.has_value());

  auto long_one = h.Submit("long", Prompt(10, 5), Greedy(500));
  for (int i = 0; i < 5; ++i)
    h.engine.StepOnce();
  EXPECT_GT(h.engine.Metrics().used_pages, 0);
  h.engine.Abort("long");
  h.RunToIdle();
  EXPECT_EQ(Collect(*long_one).finish, "abort");
  EXPECT_EQ(h.engine.Metrics().used_pages, 0);
}

TEST(EngineTest, BadRequestsAreRefusedByField) {
  Harness h(1024, EngineConfig{});
  SubmitError error;
  auto bad_token = h.engine.Submit({"x", {1, 5000}, Greedy(1)}, &error);
  ASSERT_FALSE(bad_token.ok());
  EXPECT_NE(bad_token.status().message().find("position 1"), std::string::npos);
  SamplingParams params = Greedy(1);
  params.top_p = 0;
  auto bad_top_p = h.engine.Submit({"y", {1, 2}, params}, &error);
  ASSERT_FALSE(bad_top_p.ok());
  EXPECT_NE(bad_top_p.status().message().find("top_p"), std::string::npos);
  auto too_long = h.engine.Submit({"z", {1, 2}, Greedy(5000)}, &error);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("cache"), std::string::npos);
}

// Runs the engine to idle, noting the order in which requests finish.
std::vector<std::string> FinishOrder(
    Harness& h, const std::map<std::string, std::shared_ptr<RequestStream>>& streams,
    std::map<std::string, Collected>* out) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<RequestEvent>> events;
  for (int i = 0; i < 100000; ++i) {
    const bool busy = h.engine.StepOnce();
    for (const auto& [id, stream] : streams) {
      if (std::ranges::find(order, id) != order.end()) continue;
      if (stream->Drain(&events[id])) order.push_back(id);
    }
    if (!busy) break;
  }
  for (auto& [id, list] : events)
    (*out)[id] = FromEvents(list);
  return order;
}

EngineConfig PriorityConfig() {
  EngineConfig config;
  config.scheduling_policy = EngineConfig::SchedulingPolicy::kPriority;
  return config;
}

// --scheduling-policy priority: waiting requests are admitted by (priority, arrival), where first
// come, first served takes them in arrival order; outputs are each request's own either way.
TEST(EngineTest, PriorityAdmitsTheMostUrgentFirst) {
  for (bool priority : {false, true}) {
    EngineConfig config = priority ? PriorityConfig() : EngineConfig{};
    config.max_num_seqs = 1;
    Harness h(2048, config);
    std::map<std::string, std::shared_ptr<RequestStream>> streams;
    const std::vector<std::pair<std::string, int64_t>> requests = {
        {"later", 5}, {"normal", 0}, {"urgent", -3}, {"normal2", 0}};
    SubmitError error;
    for (const auto& [id, level] : requests) {
      EngineRequest request{id, Prompt(12, static_cast<int32_t>(id.size())), Greedy(4)};
      request.priority = priority ? level : 0;
      auto stream = h.engine.Submit(request, &error);
      ASSERT_TRUE(stream.ok()) << stream.status().message();
      streams[id] = stream.value();
    }
    std::map<std::string, Collected> got;
    const auto order = FinishOrder(h, streams, &got);
    const std::vector<std::string> want =
        priority ? std::vector<std::string>{"urgent", "normal", "normal2", "later"}
                 : std::vector<std::string>{"later", "normal", "urgent", "normal2"};
    EXPECT_EQ(order, want);
    for (const auto& [id, level] : requests)
      EXPECT_EQ(got[id].tokens, GreedyAlone(Prompt(12, static_cast<int32_t>(id.size())), 4)) << id;
  }
}

// A more urgent arrival takes the slot of a less urgent running request, which is preempted and
// later recomputed, losing nothing; an equally urgent one waits its turn.
TEST(EngineTest, PriorityPreemptsLessUrgentRunningRequests) {
  EngineConfig config = PriorityConfig();
  config.max_num_seqs = 1;
  Harness h(2048, config);
  std::map<std::string, std::shared_ptr<RequestStream>> streams;
  SubmitError error;
  auto submit = [&](const std::string& id, int64_t level, int32_t salt, int64_t tokens) {
    EngineRequest request{id, Prompt(10, salt), Greedy(tokens)};
    request.priority = level;
    auto stream = h.engine.Submit(request, &error);
    ASSERT_TRUE(stream.ok()) << stream.status().message();
    streams[id] = stream.value();
  };
  submit("batch", 1, 1, 24);
  for (int i = 0; i < 4; ++i)
    h.engine.StepOnce();  // the batch request is decoding
  submit("peer", 1, 2, 3);
  submit("interactive", 0, 3, 3);
  std::map<std::string, Collected> got;
  const auto order = FinishOrder(h, streams, &got);
  EXPECT_EQ(order, (std::vector<std::string>{"interactive", "batch", "peer"}));
  EXPECT_EQ(got["batch"].tokens, GreedyAlone(Prompt(10, 1), 24));
  EXPECT_EQ(got["interactive"].tokens, GreedyAlone(Prompt(10, 3), 3));
  EXPECT_EQ(got["peer"].tokens, GreedyAlone(Prompt(10, 2), 3));
  EXPECT_EQ(h.engine.Metrics().preemptions_total, 1);
  EXPECT_EQ(h.engine.Metrics().used_pages, 0);
}

// When pages run out, the least urgent running request is preempted (first come, first served
// preempts the newest): the urgent one, though newer, runs through.
TEST(EngineTest, PriorityPreemptsTheLeastUrgentUnderPagePressure) {
  for (bool priority : {false, true}) {
    Harness h(16 * 10, priority ? PriorityConfig() : EngineConfig{});
    std::map<std::string, std::shared_ptr<RequestStream>> streams;
    SubmitError error;
    for (const auto& [id, level, salt] : {std::tuple{"older", 2, 1}, std::tuple{"newer", -2, 2}}) {
      EngineRequest request{id, Prompt(30, salt), Greedy(60)};
      request.priority = priority ? level : 0;
      auto stream = h.engine.Submit(request, &error);
      ASSERT_TRUE(stream.ok()) << stream.status().message();
      streams[id] = stream.value();
      h.engine.StepOnce();
    }
    std::map<std::string, Collected> got;
    const auto order = FinishOrder(h, streams, &got);
    const std::vector<std::string> want = priority ? std::vector<std::string>{"newer", "older"}
                                                   : std::vector<std::string>{"older", "newer"};
    EXPECT_EQ(order, want);
    // One preemption: the less urgent request (or, first come, first served, the newer) gives
    // way once and the other runs through.
    EXPECT_EQ(h.engine.Metrics().preemptions_total, 1);
    EXPECT_EQ(got["older"].tokens, GreedyAlone(Prompt(30, 1), 60));
    EXPECT_EQ(got["newer"].tokens, GreedyAlone(Prompt(30, 2), 60));
  }
}

// Background requests (a batch's lines) run behind the others under either policy: a live
// arrival takes a running background request's slot (preempted, recomputed later, losing
// nothing), is admitted before background requests that came earlier, and among live requests
// first come, first served still holds.
TEST(EngineTest, BackgroundRequestsRunBehindTheOthers) {
  for (bool priority : {false, true}) {
    EngineConfig config = priority ? PriorityConfig() : EngineConfig{};
    config.max_num_seqs = 1;
    Harness h(2048, config);
    std::map<std::string, std::shared_ptr<RequestStream>> streams;
    SubmitError error;
    auto submit = [&](const std::string& id, bool background, int32_t salt, int64_t tokens) {
      EngineRequest request{id, Prompt(10, salt), Greedy(tokens)};
      request.background = background;
      auto stream = h.engine.Submit(request, &error);
      ASSERT_TRUE(stream.ok()) << stream.status().message();
      streams[id] = stream.value();
    };
    submit("line1", true, 1, 24);
    for (int i = 0; i < 4; ++i)
      h.engine.StepOnce();  // the first line is decoding
    submit("line2", true, 2, 3);
    submit("live1", false, 3, 3);
    submit("live2", false, 4, 3);
    std::map<std::string, Collected> got;
    const auto order = FinishOrder(h, streams, &got);
    EXPECT_EQ(order, (std::vector<std::string>{"live1", "live2", "line1", "line2"})) << priority;
    EXPECT_EQ(got["line1"].tokens, GreedyAlone(Prompt(10, 1), 24));
    EXPECT_EQ(got["line2"].tokens, GreedyAlone(Prompt(10, 2), 3));
    EXPECT_EQ(got["live1"].tokens, GreedyAlone(Prompt(10, 3), 3));
    EXPECT_EQ(got["live2"].tokens, GreedyAlone(Prompt(10, 4), 3));
    EXPECT_EQ(h.engine.Metrics().preemptions_total, 1);
    EXPECT_EQ(h.engine.Metrics().used_pages, 0);
  }
}

// Under first come, first served a priority is refused by name, not silently ignored.
TEST(EngineTest, PriorityNeedsThePriorityPolicy) {
  Harness h(1024, EngineConfig{});
  EngineRequest request{"p", {1, 2, 3}, Greedy(2)};
  request.priority = -1;
  SubmitError error;
  auto refused = h.engine.Submit(request, &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--scheduling-policy priority"), std::string::npos)
      << refused.status().message();
}

// MTP speculative decoding, on the trained default model: both the accept and the reject paths
// run.
std::vector<int32_t> Text(const std::string& text) {
  auto ids = TrainedModel().tokenizer->Encode(text);
  EXPECT_TRUE(ids.ok());
  std::vector<int32_t> out = {0};  // BOS, as the default tokenizer's config asks
  if (ids.ok()) out.insert(out.end(), ids->begin(), ids->end());
  return out;
}

// Structured output: a JSON schema the trained model fills, and whether text is in a language.
structured::GrammarSpec PersonSchema() {
  return {structured::GrammarSpec::Kind::kJsonSchema,
          R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
              "lines": {"type": "integer", "minimum": 1, "maximum": 99},
              "mood": {"enum": ["calm", "angry"]}},
              "required": ["name", "lines"], "additionalProperties": false})",
          {}};
}

bool InLanguage(const structured::GrammarSpec& spec, const std::string& text, bool complete) {
  auto compiled = structured::CompileForBytes(spec);
  EXPECT_TRUE(compiled.ok()) << compiled.status().message();
  structured::GrammarMatcher m(*compiled);
  if (!m.AcceptBytes(text).ok()) return false;
  return !complete || m.IsComplete();
}

// DeepSeek-V3.2's sparse attention under the engine (the tiny-v32-fp8 fixture, whose queries at
// positions ≥ 8 attend to their indexer's 8 best keys, and whose MTP layer has an indexer too,
// with the default tokenizer beside it): chunked prefill, continuous batching, a prefix hit and
// MTP drafts verified 1 + K queries at a time give each request the tokens it decodes alone.
// The chosen keys live in the cache rows that prefix pages share and rollback truncates.
const Setup& DsaModel() {
  static Setup setup = [] {
    DefaultModel();  // the batch-invariant kernel settings
    Setup s;
    auto model = Model::Load(testing::LoadFixture("tiny-v32-fp8").directory);
    EXPECT_TRUE(model.ok()) << model.status().message();
    if (model.ok()) s.model = std::move(model).value();
    auto tokenizer = Tokenizer::Load(std::string(SY_SOURCE_DIR) + "/models/default");
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
    if (tokenizer.ok()) s.tokenizer = std::make_unique<Tokenizer>(std::move(tokenizer).value());
    return s;
  }();
  return setup;
}

TEST(EngineTest, SparseAttentionServesAsItDecodesAlone) {
  const testing::LoadedModel& setup = DsaModel();
  ASSERT_TRUE(setup.model && setup.tokenizer);
  ASSERT_TRUE(setup.model->config().has_indexer());
  std::mt19937 rng(32);
  std::uniform_int_distribution<int32_t> id(2, 999);
  std::vector<int32_t> long_prompt(40), short_prompt(9);
  for (int32_t& t : long_prompt)
    t = id(rng);
  for (int32_t& t : short_prompt)
    t = id(rng);
  std::vector<int32_t> extended(long_prompt.begin(), long_prompt.begin() + 36);
  extended.insert(extended.end(), {17, 18, 19});
  for (bool mtp : {false, true}) {
    EngineConfig config;
    config.max_num_batched_tokens = 12;  // prompts in chunks, beside decode steps
    if (mtp) {
      config.num_speculative_tokens = 2;
      config.drafter = Drafter::kMtp;
    }
    Harness h(4096, config, setup);
    auto first = h.Submit("long", long_prompt, Greedy(20));
    h.engine.StepOnce();
    auto second = h.Submit("short", short_prompt, Greedy(20));
    h.RunToIdle();
    auto third = h.Submit("extended", extended, Greedy(20));  // two pages of 16 from the cache
    h.RunToIdle();
    const Collected a = Collect(*first), b = Collect(*second), c = Collect(*third);
    EXPECT_EQ(a.tokens, GreedyAlone(long_prompt, 20, setup)) << "mtp " << mtp;
    EXPECT_EQ(b.tokens, GreedyAlone(short_prompt, 20, setup)) << "mtp " << mtp;
    EXPECT_EQ(c.tokens, GreedyAlone(extended, 20, setup)) << "mtp " << mtp;
    EXPECT_EQ(c.cached_tokens, 32);
    const EngineMetrics m = h.engine.Metrics();
    if (mtp) EXPECT_GT(m.spec_draft_tokens_total, 0);  // (a random MTP layer's are rarely kept)
    EXPECT_EQ(m.used_pages, 0);
  }
}

// One request alone on the trained model, drafting as `config` says (by default not at all);
// `metrics`, when given, gets the engine's.
Collected RunAlone(const std::vector<int32_t>& prompt, const SamplingParams& params,
                   const EngineConfig& config = {}, EngineMetrics* metrics = nullptr) {
  Harness h(4096, config, TrainedModel());
  auto stream = h.Submit("alone", prompt, params);
  h.RunToIdle();
  if (metrics) *metrics = h.engine.Metrics();
  return Collect(*stream);
}

// Each drafter at draft counts: the MTP module's drafts, and n-gram lookup's in the request's
// own tokens (where the trained model's output repeats its prompt or itself).
struct DraftingCase {
  Drafter drafter;
  int64_t k;
};
void PrintTo(const DraftingCase& c, std::ostream* os) {
  *os << (c.drafter == Drafter::kMtp ? "mtp" : "ngram") << " K=" << c.k;
}

class SpeculativeEngineTest : public ::testing::TestWithParam<DraftingCase> {
 protected:
  static EngineConfig Drafting(EngineConfig config = {}) {
    config.num_speculative_tokens = GetParam().k;
    config.drafter = GetParam().drafter;
    return config;
  }
  static bool Mtp() { return GetParam().drafter == Drafter::kMtp; }
};

// Greedy output is the model's own, with drafts of any count, under continuous batching,
// chunked prefill and prefix hits; the counters add up and some drafts are kept.
TEST_P(SpeculativeEngineTest, GreedyOutputIsUnchangedByDrafting) {
  EngineConfig config;
  config.max_num_batched_tokens = 40;
  Harness h(4096, Drafting(config), TrainedModel());
  const std::vector<std::vector<int32_t>> prompts = {
      Text("ROMEO: But soft, what light through yonder window breaks?"), Text("KING HENRY:"),
      Text("To be, or not to be, that is the question: whether 'tis nobler in the mind"),
      Text("ROMEO: But soft, what light through yonder window breaks? It is the east")};
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    streams.push_back(h.Submit("r" + std::to_string(i), prompts[i], Greedy(24)));
    h.engine.StepOnce();  // staggered: prefill chunks beside verification steps
  }
  h.RunToIdle();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Collected c = Collect(*streams[i]);
    EXPECT_EQ(c.finish, "length");
    EXPECT_EQ(c.tokens, GreedyAlone(prompts[i], 24, TrainedModel())) << "request " << i;
  }
  const EngineMetrics m = h.engine.Metrics();
  EXPECT_GT(m.spec_drafts_total, 0);
  EXPECT_GT(m.spec_accepted_tokens_total, 0);
  EXPECT_LE(m.spec_accepted_tokens_total, m.spec_draft_tokens_total);
  // MTP drafts K every step; lookup at most K, where the suffix recurs.
  if (Mtp()) {
    ASSERT_EQ(static_cast<int64_t>(m.spec_accepted_per_position.size()), GetParam().k);
  } else {
    ASSERT_LE(static_cast<int64_t>(m.spec_accepted_per_position.size()), GetParam().k);
  }
  int64_t per_position = 0;
  for (size_t j = 0; j < m.spec_accepted_per_position.size(); ++j) {
    per_position += m.spec_accepted_per_position[j];
    if (j > 0) {
      EXPECT_LE(m.spec_accepted_per_position[j], m.spec_accepted_per_position[j - 1]);
    }
  }
  EXPECT_EQ(per_position, m.spec_accepted_tokens_total);
  EXPECT_EQ(m.generation_tokens_total, 24 * static_cast<int64_t>(prompts.size()));
  EXPECT_EQ(m.used_pages, 0);
}

// Structured output with drafts: the drafter samples from the grammar-masked distribution at the
// state after the drafts so far, verification masks p the same way, so greedy output equals the
// undrafted structured output and drafts are still kept.
TEST_P(SpeculativeEngineTest, StructuredOutputIsUnchangedByDrafting) {
  const std::vector<int32_t> prompt = Text("KING HENRY: Now, lords, for France");
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 120;
  params.grammar = PersonSchema();
  Harness plain(4096, EngineConfig{}, TrainedModel());
  auto expected = plain.Submit("plain", prompt, params);
  plain.RunToIdle();
  const Collected want = Collect(*expected);
  Harness h(4096, Drafting(), TrainedModel());
  auto stream = h.Submit("drafted", prompt, params);
  h.RunToIdle();
  const Collected got = Collect(*stream);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.finish, want.finish);
  EXPECT_TRUE(InLanguage(*params.grammar, got.text, got.finish == "stop")) << got.text;
  EXPECT_GT(h.engine.Metrics().spec_accepted_tokens_total, 0);
}

// A grammar behind a reasoning gate: drafts in the free phase (never "</think>" here: all free
// until max_tokens) and right after it ("</think>" forced first) give the model's own tokens.
TEST_P(SpeculativeEngineTest, GatedGrammarIsUnchangedByDrafting) {
  const std::vector<int32_t> prompt = Text("KING HENRY: Now, lords, for France");
  const int32_t think_end = *TrainedModel().tokenizer->TokenToId("</think>");
  for (double bias : {0.0, 50.0}) {
    SamplingParams params;
    params.temperature = 0;
    params.max_tokens = bias > 0 ? 120 : 40;
    params.grammar = PersonSchema();
    params.grammar->begin_after = "</think>";
    if (bias > 0) params.logit_bias[think_end] = bias;
    const Collected want = RunAlone(prompt, params);
    const Collected got = RunAlone(prompt, params, Drafting());
    EXPECT_EQ(got.tokens, want.tokens) << "bias " << bias;
    EXPECT_EQ(got.finish, bias > 0 ? "stop" : "length") << got.text;
    if (bias > 0) {
      EXPECT_EQ(got.tokens[0], think_end);
      EXPECT_TRUE(InLanguage(*params.grammar, got.text, true)) << got.text;
    }
  }
}

// The reasoning budget with drafts: verification forces "</think>" where the budget does, so
// greedy output is the undrafted one — with a grammar behind the reasoning gate as well (the
// forced "</think>" opens it) — and the drafter proposes it there, so such drafts are kept.
TEST_P(SpeculativeEngineTest, ReasoningBudgetIsUnchangedByDrafting) {
  const Tokenizer& tokenizer = *TrainedModel().tokenizer;
  const int32_t begin = *tokenizer.TokenToId("<think>"), end = *tokenizer.TokenToId("</think>");
  std::vector<int32_t> prompt = Text("KING HENRY: Now, lords, for France");
  prompt.push_back(begin);
  for (bool gated : {false, true}) {
    SamplingParams params;
    params.temperature = 0;
    params.max_tokens = gated ? 120 : 30;
    params.ignore_eos = !gated;
    params.logit_bias[end] = -100;  // only the budget closes the section
    params.thinking_token_budget = 9;
    if (gated) {
      params.grammar = PersonSchema();
      params.grammar->begin_after = "</think>";
    }
    const Collected want = RunAlone(prompt, params);
    ASSERT_GT(want.tokens.size(), 10u);
    EXPECT_EQ(want.tokens[9], end) << "gated " << gated;
    EXPECT_EQ(std::ranges::count(want.tokens, end), 1);
    EngineMetrics metrics;
    const Collected got = RunAlone(prompt, params, Drafting(), &metrics);
    EXPECT_EQ(got.tokens, want.tokens) << "gated " << gated;
    EXPECT_EQ(got.finish, want.finish);
    if (gated) {
      auto answer = tokenizer.Decode(std::span(got.tokens).subspan(10), true);
      ASSERT_TRUE(answer.ok());
      EXPECT_TRUE(InLanguage(*params.grammar, *answer, got.finish == "stop")) << *answer;
    }
    EXPECT_GT(metrics.spec_accepted_tokens_total, 0);
  }
  // Where the output is settled — "<think>" biased up, so sections of the opening marker and 2
  // more, each closed by the budget — the drafter proposes exactly it ("</think>" where the
  // budget forces it): every draft is kept.
  SamplingParams settled = Greedy(24);
  settled.logit_bias = {{begin, 100}, {end, -100}};
  settled.thinking_token_budget = 2;
  Harness h(4096, Drafting(), TrainedModel());
  auto stream = h.Submit("settled", Text("KING HENRY:"), settled);
  h.RunToIdle();
  std::vector<int32_t> want;
  for (int i = 0; i < 6; ++i)
    want.insert(want.end(), {begin, begin, begin, end});
  EXPECT_EQ(Collect(*stream).tokens, want);
  const EngineMetrics m = h.engine.Metrics();
  EXPECT_GT(m.spec_draft_tokens_total, 0);
  EXPECT_EQ(m.spec_accepted_tokens_total, m.spec_draft_tokens_total);
}

// Under page pressure requests are preempted and recomputed; drafts are dropped, never lost
// tokens, and greedy output still equals the model's own.
TEST_P(SpeculativeEngineTest, PreemptionWithDraftsLosesNothing) {
  EngineConfig config;
  config.max_num_batched_tokens = 256;
  Harness h(16 * 12, Drafting(config), TrainedModel());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(Text(std::string("KING HENRY: ") + std::string(static_cast<size_t>(i), 'O') +
                           ", my lords, what news from France?"));
    streams.push_back(h.Submit("p" + std::to_string(i), prompts.back(), Greedy(30)));
  }
  h.RunToIdle();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Collected c = Collect(*streams[i]);
    EXPECT_EQ(c.finish, "length");
    EXPECT_EQ(c.tokens, GreedyAlone(prompts[i], 30, TrainedModel())) << "request " << i;
  }
  EXPECT_GT(h.engine.Metrics().preemptions_total, 0);
  EXPECT_EQ(h.engine.Metrics().used_pages, 0);
}

// Seeded sampling with drafts is reproducible whatever else is in the batch, and stop strings,
// max_tokens and logprobs behave as without drafts (one entry per token).
TEST_P(SpeculativeEngineTest, SeededSamplingWithDraftsIsReproducible) {
  EngineConfig config = Drafting();
  config.ngram.min_n = 1;  // sampled text repeats single tokens more often than pairs
  SamplingParams params;
  params.temperature = 0.7;
  params.top_p = 0.95;
  params.seed = 77;
  params.max_tokens = 20;
  params.ignore_eos = true;
  params.logprobs = 2;
  // A prompt that repeats itself, so that sampled output finds n-grams to look up too.
  const std::vector<int32_t> prompt =
      Text("ROMEO: O, she is the sun, the sun, the sun.\nROMEO: O, she is the sun, the");
  Collected alone;
  {
    Harness h(4096, config, TrainedModel());
    auto s = h.Submit("alone", prompt, params);
    h.RunToIdle();
    alone = Collect(*s);
  }
  Harness h(4096, config, TrainedModel());
  std::vector<std::shared_ptr<RequestStream>> others;
  for (int i = 0; i < 3; ++i)
    others.push_back(h.Submit("o" + std::to_string(i), Text("KING HENRY: Now"), Greedy(12)));
  auto s = h.Submit("crowd", prompt, params);
  h.RunToIdle();
  Collected crowd = Collect(*s);
  EXPECT_EQ(crowd.tokens, alone.tokens);
  EXPECT_EQ(crowd.tokens.size(), 20u);
  EXPECT_EQ(crowd.logprobs.size(), 20u);
  for (const auto& l : crowd.logprobs)
    EXPECT_LE(l.logprob, 0);
  EXPECT_GT(h.engine.Metrics().spec_drafts_total, 0);
}

// A request resumed elsewhere (failover) with its output so far as the prompt's tail continues
// exactly: greedy, and seeded sampling with penalties (the draw and penalty state follow the
// generated count), text included.
TEST(EngineTest, ResumedRequestContinuesAsIfUninterrupted) {
  SamplingParams sampled;
  sampled.temperature = 0.8;
  sampled.seed = 42;
  sampled.presence_penalty = 0.5;
  sampled.frequency_penalty = 0.3;
  sampled.max_tokens = 20;
  sampled.ignore_eos = true;
  for (const SamplingParams& params : {Greedy(20), sampled}) {
    Harness h(4096, EngineConfig{}, TrainedModel());
    const std::vector<int32_t> prompt = Text("KING HENRY: Now, lords, for France");
    auto whole = h.Submit("whole", prompt, params);
    h.RunToIdle();
    Collected full = Collect(*whole);
    ASSERT_EQ(full.tokens.size(), 20u);
    EngineRequest resumed{"resumed", prompt, params};
    resumed.prompt.insert(resumed.prompt.end(), full.tokens.begin(), full.tokens.begin() + 8);
    resumed.resumed_tokens = 8;
    SubmitError error;
    auto stream = h.engine.Submit(resumed, &error);
    ASSERT_TRUE(stream.ok()) << stream.status().message();
    h.RunToIdle();
    Collected rest = Collect(*stream.value());
    EXPECT_EQ(rest.prompt_tokens, static_cast<int64_t>(prompt.size()));
    EXPECT_EQ(rest.finish, "length");
    EXPECT_EQ(rest.tokens, std::vector<int32_t>(full.tokens.begin() + 8, full.tokens.end()));
    ASSERT_LT(rest.text.size(), full.text.size());
    EXPECT_EQ(full.text.substr(full.text.size() - rest.text.size()), rest.text);
  }
  Harness h(1024, EngineConfig{});
  SubmitError error;
  EngineRequest bad{"bad", {1, 2, 3}, Greedy(2)};
  bad.resumed_tokens = 3;
  auto refused = h.engine.Submit(bad, &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("resumed_tokens"), std::string::npos);
}

// The reasoning budget (thinking_token_budget): a thinking section that holds the budget's tokens
// is closed by "</think>". Generated tokens count, resumed ones included; the output starts inside
// a section after a prompt's "<think>" or on the chat path's word; each section has its own.
// "</think>" is biased away, so every one in the output is the budget's.
TEST(EngineTest, ReasoningBudgetClosesTheThinkingSection) {
  const Tokenizer& tokenizer = *DefaultModel().tokenizer;
  const int32_t begin = *tokenizer.TokenToId("<think>"), end = *tokenizer.TokenToId("</think>");
  auto run = [&](const std::vector<int32_t>& prompt, std::optional<int64_t> budget,
                 bool starts_inside = false, int64_t resumed = 0, double begin_bias = 0) {
    Harness h(1024, EngineConfig{});
    SamplingParams params = Greedy(12);
    params.logit_bias[end] = -100;
    if (begin_bias != 0) params.logit_bias[begin] = begin_bias;
    params.thinking_token_budget = budget;
    params.starts_in_thinking = starts_inside;
    EngineRequest request{"r", prompt, params};
    request.resumed_tokens = resumed;
    SubmitError error;
    auto stream = h.engine.Submit(request, &error);
    EXPECT_TRUE(stream.ok()) << stream.status().message();
    if (!stream.ok()) return std::vector<int32_t>{};
    h.RunToIdle();
    return Collect(*stream.value()).tokens;
  };
  const std::vector<int32_t> base = Prompt(10, 3);
  auto with = [&](std::vector<int32_t> tail) {
    std::vector<int32_t> prompt = base;
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    return prompt;
  };
  auto ends = [&](const std::vector<int32_t>& tokens) { return std::ranges::count(tokens, end); };
  auto head = [](const std::vector<int32_t>& tokens, size_t from, size_t to) {
    return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
  };

  const std::vector<int32_t> free = run(with({begin}), std::nullopt);
  ASSERT_EQ(free.size(), 12u);
  ASSERT_EQ(ends(free), 0);
  const std::vector<int32_t> five = run(with({begin}), 5);
  ASSERT_EQ(five.size(), 12u);
  EXPECT_EQ(head(five, 0, 5), head(free, 0, 5));
  EXPECT_EQ(five[5], end);
  EXPECT_EQ(ends(five), 1);  // the answer after it is not cut again
  EXPECT_EQ(run(with({begin}), 0)[0], end);
  // Prompt tokens after "<think>" (R1's template writes "<think>\n") are not counted.
  const std::vector<int32_t> after = run(with({begin, 40, 41, 42}), 5);
  EXPECT_EQ(after[5], end);
  EXPECT_EQ(ends(after), 1);
  // A prompt that opens no section: no budget applies unless the output starts inside one.
  EXPECT_EQ(ends(run(base, 2)), 0);
  const std::vector<int32_t> inside = run(base, 2, true);
  EXPECT_EQ(inside[2], end);
  EXPECT_EQ(ends(inside), 1);
  // A section the prompt closed leaves nothing to close.
  EXPECT_EQ(ends(run(with({begin, 40, end}), 0)), 0);
  // Resumed output counts: 2 of the 5 used before this instance's first token.
  const std::vector<int32_t> resumed = run(with({begin, free[0], free[1]}), 5, false, 2);
  ASSERT_EQ(resumed.size(), 10u);
  EXPECT_EQ(head(resumed, 0, 3), head(free, 2, 5));
  EXPECT_EQ(resumed[3], end);
  // Each section gets the whole budget: an output that keeps opening them ("<think>" biased up;
  // a "<think>" inside a section is one of its tokens) has sections of 2 + the opening marker.
  const std::vector<int32_t> sections = run(base, 2, false, 0, 100);
  EXPECT_EQ(sections, (std::vector<int32_t>{begin, begin, begin, end, begin, begin, begin, end,
                                            begin, begin, begin, end}));
  // A grammar not gated on "</think>" decides every token: the budget yields to it.
  {
    Harness g(1024, EngineConfig{});
    SamplingParams params;
    params.temperature = 0;
    params.max_tokens = 12;
    params.grammar = PersonSchema();
    params.thinking_token_budget = 0;
    auto stream = g.Submit("grammar", with({begin}), params);
    g.RunToIdle();
    const Collected c = Collect(*stream);
    EXPECT_NE(c.finish, "error") << c.text;
    EXPECT_EQ(ends(c.tokens), 0);
    EXPECT_TRUE(InLanguage(*params.grammar, c.text, c.finish == "stop")) << c.text;
  }
  // A negative budget is refused by name.
  Harness h(1024, EngineConfig{});
  SamplingParams negative = Greedy(2);
  negative.thinking_token_budget = -1;
  SubmitError error;
  auto refused = h.engine.Submit({"neg", base, negative}, &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("thinking_token_budget"), std::string::npos);
}

// A tokenizer without "<think>" and "</think>" has no sections to count: a budget is refused,
// saying so; requests without one are served.
TEST(EngineTest, ReasoningBudgetNeedsTheThinkingTokens) {
  nlohmann::json vocab = nlohmann::json::object();  // the 256 bytes, nothing added
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    AppendUtf8(ByteLevelAlphabet::Get().CodePointOf(static_cast<uint8_t>(b)), &symbol);
    vocab[symbol] = b;
  }
  const nlohmann::json root = {
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  auto tokenizer = Tokenizer::FromJson(root.dump(), "bytes");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const Model& model = *DefaultModel().model;
  LatentCache cache = model.NewCache(1024, 1, DType::kF32);
  Engine engine(model, cache, *tokenizer, ForwardOptions{}, EngineConfig{});
  SamplingParams params = Greedy(3);
  params.thinking_token_budget = 8;
  SubmitError error;
  auto refused = engine.Submit({"budget", {40, 41, 42}, params}, &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("\"</think>\""), std::string::npos)
      << refused.status().message();
  auto served = engine.Submit({"plain", {40, 41, 42}, Greedy(3)}, &error);
  ASSERT_TRUE(served.ok()) << served.status().message();
  for (int i = 0; i < 100 && engine.StepOnce(); ++i) {
  }
  EXPECT_EQ(Collect(*served.value()).finish, "length");
}

// Structured output: every token the grammar forbids is masked, so the text is in the grammar's
// language — complete when the request stopped, a prefix when it ran out of tokens — through
// batching, preemption and failover (the matcher rebuilt from the resumed tokens).
// Greedy decoding straight through Model::Forward where `allowed(output, token)` says which
// tokens may come next: the argmax over those (the reference for the token constraints).
std::vector<int32_t> GreedyConstrained(
    const std::vector<int32_t>& prompt, int64_t count,
    const std::function<bool(const std::vector<int32_t>&, int32_t)>& allowed) {
  const Model& model = *TrainedModel().model;
  LatentCache cache = model.NewCache(static_cast<int64_t>(prompt.size()) + count, 1, DType::kF32);
  SequenceCache seq;
  seq.prompt_end = static_cast<int64_t>(prompt.size());
  ForwardOptions options;
  options.logit_rows = LogitRows::kLast;
  std::vector<float> logits;
  std::vector<int32_t> out, next = prompt;
  const int64_t vocab = model.config().vocab_size;
  for (int64_t i = 0; i < count; ++i) {
    ForwardBatch batch;
    batch.Add(next.data(), static_cast<int64_t>(next.size()), &seq);
    EXPECT_TRUE(model.Forward(batch, cache, options, &logits).ok());
    int32_t best = -1;
    for (int32_t t = 0; t < vocab; ++t)
      if (allowed(out, t) && (best < 0 || logits[t] > logits[best])) best = t;
    out.push_back(best);
    next = {best};
  }
  return out;
}

// vLLM's allowed_token_ids and bad_words: greedy output is the model's argmax over what they
// leave, computed independently above; a bad word's last token still comes where the rest of it
// does not precede; drafts change nothing; where nothing is left the request ends with an error
// that says so.
TEST(EngineTest, AllowedTokensAndBadWordsConstrainTheOutput) {
  const std::vector<int32_t> prompt = Text("ROMEO: But soft, what light through yonder window");
  const std::vector<int32_t> free = GreedyAlone(prompt, 30, TrainedModel());
  // Allowed: the free output's tokens but its two most frequent ones, and a few others.
  std::map<int32_t, int> frequency;
  for (int32_t t : free)
    ++frequency[t];
  std::vector<std::pair<int, int32_t>> by_count;
  for (auto [t, n] : frequency)
    by_count.push_back({-n, t});
  std::sort(by_count.begin(), by_count.end());
  ASSERT_GE(by_count.size(), 4u);
  std::vector<int32_t> allowed = {5, 40, 300};
  for (size_t i = 2; i < by_count.size(); ++i)
    allowed.push_back(by_count[i].second);
  SamplingParams params = Greedy(30);
  params.allowed_token_ids = allowed;
  const auto in_allowed = [&](const std::vector<int32_t>&, int32_t t) {
    return std::ranges::find(allowed, t) != allowed.end();
  };
  const std::vector<int32_t> want_allowed = GreedyConstrained(prompt, 30, in_allowed);
  ASSERT_NE(want_allowed, free);
  // Bad words: the free output's third token alone, and the pair at its positions 5 and 6 (its
  // second token may still come after anything else).
  const int32_t single = free[2];
  const std::vector<int32_t> pair = {free[5], free[6]};
  params = Greedy(30);
  params.bad_words_token_ids = {{single}, pair};
  const auto not_bad = [&](const std::vector<int32_t>& out, int32_t t) {
    return t != single && !(t == pair[1] && !out.empty() && out.back() == pair[0]);
  };
  const std::vector<int32_t> want_bad = GreedyConstrained(prompt, 30, not_bad);
  ASSERT_NE(want_bad, free);
  EXPECT_EQ(std::ranges::count(want_bad, single), 0);
  for (size_t i = 1; i < want_bad.size(); ++i)
    EXPECT_FALSE(want_bad[i - 1] == pair[0] && want_bad[i] == pair[1]) << "at " << i;

  for (int64_t drafts : {0, 3}) {
    SCOPED_TRACE(std::to_string(drafts) + " n-gram drafts");
    EngineConfig config;
    config.num_speculative_tokens = drafts;
    config.drafter = Drafter::kNgram;
    SamplingParams only = Greedy(30);
    only.allowed_token_ids = allowed;
    EXPECT_EQ(RunAlone(prompt, only, config).tokens, want_allowed);
    SamplingParams bad = Greedy(30);
    bad.bad_words_token_ids = {{single}, pair};
    EXPECT_EQ(RunAlone(prompt, bad, config).tokens, want_bad);
  }
  // Only the end-of-sequence token allowed while min_tokens blocks it: nothing may come.
  SamplingParams none;
  none.temperature = 0.7;
  none.max_tokens = 8;
  none.min_tokens = 2;
  none.allowed_token_ids = {static_cast<int32_t>(TrainedModel().model->config().eos_token_id)};
  const Collected refused = RunAlone(prompt, none);
  EXPECT_EQ(refused.finish, "error");
  EXPECT_TRUE(refused.tokens.empty());
  EXPECT_NE(refused.error.find("allowed_token_ids"), std::string::npos) << refused.error;
  // Bad ids are refused at submission, naming the field.
  Harness h(1024, EngineConfig{}, TrainedModel());
  SubmitError error;
  SamplingParams out_of_range = Greedy(4);
  out_of_range.allowed_token_ids = {-1};
  EXPECT_FALSE(h.engine.Submit({"a", prompt, out_of_range}, &error).ok());
  out_of_range.allowed_token_ids.clear();
  out_of_range.bad_words_token_ids = {{}};
  auto empty_word = h.engine.Submit({"b", prompt, out_of_range}, &error);
  ASSERT_FALSE(empty_word.ok());
  EXPECT_NE(empty_word.status().message().find("bad_words"), std::string::npos);
}

TEST(EngineTest, StructuredOutputStaysInItsGrammar) {
  const std::vector<int32_t> prompt = Text("KING HENRY: Now, lords, for France");
  std::vector<SamplingParams> params;
  for (int i = 0; i < 4; ++i) {
    SamplingParams p;
    p.temperature = i == 0 ? 0 : 1.0;
    p.seed = 7 + i;
    p.max_tokens = 120;
    p.logprobs = 2;
    p.grammar = PersonSchema();
    params.push_back(p);
  }
  SamplingParams choice = Greedy(8);
  choice.ignore_eos = false;
  choice.grammar = structured::GrammarSpec{
      structured::GrammarSpec::Kind::kChoice, "", {"France", "England", "Rome"}};
  params.push_back(choice);
  // Alone with plenty of pages, then all at once in a cache small enough to preempt.
  std::vector<Collected> alone;
  for (size_t i = 0; i < params.size(); ++i) {
    Harness h(4096, EngineConfig{}, TrainedModel());
    auto stream = h.Submit("alone" + std::to_string(i), prompt, params[i]);
    h.RunToIdle();
    alone.push_back(Collect(*stream));
  }
  EngineConfig small;
  small.max_num_batched_tokens = 64;
  Harness h(16 * 14, small, TrainedModel());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < params.size(); ++i)
    streams.push_back(h.Submit("batched" + std::to_string(i), prompt, params[i]));
  h.RunToIdle();
  for (size_t i = 0; i < params.size(); ++i) {
    const Collected& a = alone[i];
    std::printf("request %zu (%s, %zu tokens): %s\n", i, a.finish.c_str(), a.tokens.size(),
                nlohmann::json(a.text).dump().c_str());
    ASSERT_TRUE(a.finish == "stop" || a.finish == "length") << a.finish;
    EXPECT_TRUE(InLanguage(*params[i].grammar, a.text, a.finish == "stop"))
        << "request " << i << " (" << a.finish << "): " << a.text;
    for (const auto& l : a.logprobs)
      EXPECT_TRUE(std::isfinite(l.logprob)) << a.text;
    EXPECT_EQ(Collect(*streams[i]).tokens, a.tokens) << "request " << i;
  }
  EXPECT_TRUE(std::any_of(alone.begin(), alone.end() - 1,
                          [](const Collected& c) { return c.finish == "stop"; }));
  EXPECT_EQ(alone.back().finish, "stop");
  EXPECT_TRUE(alone.back().text == "France" || alone.back().text == "England" ||
              alone.back().text == "Rome")
      << alone.back().text;

  // Failover: resumed after 6 tokens, the rest is the same.
  Harness again(4096, EngineConfig{}, TrainedModel());
  EngineRequest resumed{"resumed", prompt, params[1]};
  resumed.prompt.insert(resumed.prompt.end(), alone[1].tokens.begin(), alone[1].tokens.begin() + 6);
  resumed.resumed_tokens = 6;
  SubmitError error;
  auto stream = again.engine.Submit(resumed, &error);
  ASSERT_TRUE(stream.ok()) << stream.status().message();
  again.RunToIdle();
  EXPECT_EQ(Collect(*stream.value()).tokens,
            std::vector<int32_t>(alone[1].tokens.begin() + 6, alone[1].tokens.end()));

  // A bad grammar and ignore_eos are refused at submission, by name.
  EngineRequest bad{"bad", prompt, params[0]};
  bad.params.grammar->text = R"({"type": "string", "pattern": "(a)\\1"})";
  auto refused = again.engine.Submit(bad, &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("backreferences"), std::string::npos);
  bad.params = params[0];
  bad.params.ignore_eos = true;
  refused = again.engine.Submit(bad, &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("ignore_eos"), std::string::npos);
}

// Masks made beside the forward (the default) are the masks made after it: a mask-heavy load —
// json_object (every stack top has many tokens to check against the whole parse state), a nested
// schema and a choice, sampled, batched in a cache small enough to preempt, with and without MTP
// drafts — gives the same tokens and log-probabilities bit for bit.
TEST(EngineTest, MasksBesideTheForwardChangeNothing) {
  const std::vector<int32_t> prompt = Text("KING HENRY: Now, lords, for France");
  std::vector<SamplingParams> params;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p;
    p.temperature = i == 0 ? 0 : 1.0;
    p.seed = 11 + i;
    p.max_tokens = 60;
    p.logprobs = 3;
    if (i % 3 == 0)
      p.grammar = structured::GrammarSpec{structured::GrammarSpec::Kind::kJsonObject, ""};
    if (i % 3 == 1) p.grammar = PersonSchema();
    if (i % 3 == 2)
      p.grammar = structured::GrammarSpec{
          structured::GrammarSpec::Kind::kChoice, "", {"France", "England", "Rome"}};
    params.push_back(p);
  }
  params.push_back(Greedy(20));  // unconstrained, beside them
  for (const int64_t drafts : {0, 2}) {
    std::vector<std::vector<Collected>> runs;
    for (const bool beside : {false, true}) {
      EngineConfig config;
      config.max_num_batched_tokens = 64;
      config.num_speculative_tokens = drafts;
      config.masks_beside_forward = beside;
      Harness h(16 * 24, config, TrainedModel());
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (size_t i = 0; i < params.size(); ++i)
        streams.push_back(h.Submit("r" + std::to_string(i), prompt, params[i]));
      h.RunToIdle();
      runs.emplace_back();
      for (auto& stream : streams)
        runs.back().push_back(Collect(*stream));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const Collected &after = runs[0][i], &beside = runs[1][i];
      EXPECT_EQ(beside.tokens, after.tokens) << "drafts " << drafts << ", request " << i;
      EXPECT_EQ(beside.finish, after.finish) << "drafts " << drafts << ", request " << i;
      ASSERT_EQ(beside.logprobs.size(), after.logprobs.size());
      for (size_t t = 0; t < after.logprobs.size(); ++t) {
        EXPECT_EQ(beside.logprobs[t].logprob, after.logprobs[t].logprob);
        EXPECT_EQ(beside.logprobs[t].top, after.logprobs[t].top);
      }
      if (params[i].grammar)
        EXPECT_TRUE(InLanguage(*params[i].grammar, after.text, after.finish == "stop"))
            << after.text;
    }
  }
}

// Forced tool calls (tool_choice required, in DeepSeek-V3's format) on the trained default model:
// the output is calls the parser reads back with JSON arguments, the same under preemption and
// after a failover; and behind a reasoning gate, free until "</think>" (forced here by a logit
// bias), then the calls.
TEST(EngineTest, ForcedToolCallsAreValid) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 10},
                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
      "required": ["city", "days"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "stop"}}])");
  const nlohmann::ordered_json required = "required";
  auto read = chat_output::ReadToolRequest(&tools, &required, nullptr,
                                           chat_output::ToolCallFormat::kDeepSeekV3, false);
  ASSERT_FALSE(read.error) << read.error->message;
  // One call (parallel_tool_calls false): the trained model, free to, calls again and again.
  const nlohmann::ordered_json no = false;
  auto one = chat_output::ReadToolRequest(&tools, &required, &no,
                                          chat_output::ToolCallFormat::kDeepSeekV3, false);
  ASSERT_FALSE(one.error) << one.error->message;
  const std::vector<int32_t> prompt = Text("KING HENRY: Now, lords, for France");
  std::vector<SamplingParams> params;
  for (int i = 0; i < 3; ++i) {
    SamplingParams p;
    p.temperature = i == 0 ? 0 : 1.0;
    p.seed = 11 + i;
    p.max_tokens = 160;
    p.skip_special_tokens = false;
    p.grammar = (i == 0 ? one : read).request->grammar;
    params.push_back(p);
  }
  const int32_t think_end = *TrainedModel().tokenizer->TokenToId("</think>");
  SamplingParams gated = params[0];
  gated.grammar->begin_after = "</think>";
  gated.logit_bias[think_end] = 50;  // the trained model never writes it by itself
  params.push_back(gated);
  std::vector<Collected> alone;
  for (size_t i = 0; i < params.size(); ++i) {
    Harness h(4096, EngineConfig{}, TrainedModel());
    auto stream = h.Submit("alone" + std::to_string(i), prompt, params[i]);
    h.RunToIdle();
    alone.push_back(Collect(*stream));
    const Collected& a = alone.back();
    std::printf("request %zu (%s): %s\n", i, a.finish.c_str(),
                nlohmann::json(a.text).dump().c_str());
    if (a.finish != "stop") continue;  // a call cut by max_tokens is only a prefix
    std::string text = a.text;
    if (params[i].grammar->begin_after.size()) {
      const size_t at = text.find("</think>");
      ASSERT_NE(at, std::string::npos) << text;
      text = text.substr(at + 8);
    }
    const auto parsed = chat_output::ParseToolCalls(chat_output::ToolCallFormat::kDeepSeekV3, text);
    ASSERT_FALSE(parsed.calls.empty()) << text;
    EXPECT_FALSE(parsed.content.has_value()) << text;
    for (const auto& call : parsed.calls) {
      const auto args = nlohmann::json::parse(call.arguments, nullptr, false);
      ASSERT_TRUE(args.is_object()) << call.arguments;
      if (call.name == "stop") {
        EXPECT_TRUE(args.empty());
      } else {
        ASSERT_EQ(call.name, "get_weather");
        EXPECT_TRUE(args["days"].is_number_integer() && args["days"] >= 1 && args["days"] <= 7);
      }
    }
  }
  EXPECT_EQ(alone[0].finish, "stop");
  EXPECT_EQ(alone[3].finish, "stop");
  // All at once in a cache small enough to preempt: the same tokens.
  EngineConfig small;
  small.max_num_batched_tokens = 64;
  Harness h(16 * 14, small, TrainedModel());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < params.size(); ++i)
    streams.push_back(h.Submit("batched" + std::to_string(i), prompt, params[i]));
  h.RunToIdle();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(Collect(*streams[i]).tokens, alone[i].tokens) << "request " << i;
  // Failover past the gate: the rest is the same.
  ASSERT_GT(alone[3].tokens.size(), 8u);
  EXPECT_EQ(alone[3].tokens[0], think_end);
  Harness again(4096, EngineConfig{}, TrainedModel());
  EngineRequest resumed{"resumed", prompt, params[3]};
  resumed.prompt.insert(resumed.prompt.end(), alone[3].tokens.begin(), alone[3].tokens.begin() + 5);
  resumed.resumed_tokens = 5;
  SubmitError error;
  auto stream = again.engine.Submit(resumed, &error);
  ASSERT_TRUE(stream.ok()) << stream.status().message();
  again.RunToIdle();
  EXPECT_EQ(Collect(*stream.value()).tokens,
            std::vector<int32_t>(alone[3].tokens.begin() + 5, alone[3].tokens.end()));
  // Resumed inside the reasoning, then past its end: the free text replays through the matcher's
  // free phase and the grammar starts at "</think>".
  EngineRequest thought{"thought", prompt, params[3]};
  std::vector<int32_t> reasoning = Text(" I should ask about the weather.");
  reasoning.push_back(think_end);
  thought.prompt.insert(thought.prompt.end(), reasoning.begin(), reasoning.end());
  thought.resumed_tokens = static_cast<int64_t>(reasoning.size());
  thought.params.logit_bias.clear();
  stream = again.engine.Submit(thought, &error);
  ASSERT_TRUE(stream.ok()) << stream.status().message();
  again.RunToIdle();
  const Collected rest = Collect(*stream.value());
  EXPECT_EQ(rest.finish, "stop");
  const auto parsed =
      chat_output::ParseToolCalls(chat_output::ToolCallFormat::kDeepSeekV3, rest.text);
  EXPECT_FALSE(parsed.calls.empty()) << rest.text;
  // Resumed output outside the grammar is refused.
  EngineRequest wrong{"wrong", prompt, params[0]};
  wrong.prompt.insert(wrong.prompt.end(), reasoning.begin(), reasoning.end());
  wrong.resumed_tokens = static_cast<int64_t>(reasoning.size());
  EXPECT_FALSE(again.engine.Submit(wrong, &error).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Drafters, SpeculativeEngineTest,
    ::testing::Values(DraftingCase{Drafter::kMtp, 1}, DraftingCase{Drafter::kMtp, 3},
                      DraftingCase{Drafter::kNgram, 2}, DraftingCase{Drafter::kNgram, 5}),
    [](const ::testing::TestParamInfo<DraftingCase>& info) {
      return std::string(info.param.drafter == Drafter::kMtp ? "mtp" : "ngram") +
             std::to_string(info.param.k);
    });

}  // namespace
}  // namespace sy

namespace sy {
namespace {

// Disaggregation in the engine: a sink that keeps what a prefill instance hands over, laid out as
// a decode instance receives it.
struct CollectingSink : KvSink {
  std::vector<std::pair<int64_t, std::vector<uint8_t>>> chunks;
  int64_t layers = 0, row_bytes = 0, next = 0;
  std::optional<int32_t> first_token;
  bool abandoned = false, in_order = true;
  void Rows(int64_t first, int64_t count, int64_t l, int64_t rb,
            std::vector<uint8_t> data) override {
    in_order = in_order && first == next;
    next = first + count;
    layers = l;
    row_bytes = rb;
    chunks.push_back({count, std::move(data)});
  }
  void Done(int32_t token, HandoffDrafts d) override {
    first_token = token;
    drafts = std::move(d);
  }
  void Abandon() override { abandoned = true; }
  HandoffDrafts drafts;
  std::shared_ptr<ImportedRows> Imported() const {
    auto rows = std::make_shared<ImportedRows>();
    rows->rows = next;
    rows->layers = layers;
    rows->row_bytes = row_bytes;
    int64_t first = 0;
    for (const auto& [count, data] : chunks) {
      auto copy = std::make_shared<std::vector<uint8_t>>(data);
      rows->chunks.push_back({first, count, copy->data(), copy});
      first += count;
    }
    rows->drafts = drafts;
    return rows;
  }
};

// Prefill on one engine (in chunks), decode on another from the rows it handed over: the same
// tokens and log-probability bits as the request alone, and the decode engine's prefix cache
// holds the prompt's pages under the hashes a colocated run gives them.
void ExpectDisaggregatedOneAnswer(int64_t length, int64_t resumed) {
  SCOPED_TRACE("a prompt of " + std::to_string(length) + " tokens, " + std::to_string(resumed) +
               " resumed");
  const std::vector<int32_t> prompt = Prompt(length, 41);
  const int64_t kTokens = 12;
  const Collected alone = ServedAlone(prompt, kTokens);
  ASSERT_EQ(static_cast<int64_t>(alone.tokens.size()), kTokens);
  const std::vector<float> alone_logprobs = Logprobs(alone);
  std::vector<int32_t> attempt = prompt;  // a failover's attempt carries the output so far
  attempt.insert(attempt.end(), alone.tokens.begin(), alone.tokens.begin() + resumed);
  auto sink = std::make_shared<CollectingSink>();
  Collected first;
  {
    EngineConfig config;
    config.max_num_batched_tokens = 48;
    ServingRun prefill(4096, config);
    EngineRequest request{"x", attempt, GreedyWithLogprobs(kTokens)};
    request.resumed_tokens = resumed;
    request.kv_sink = sink;
    SubmitError error;
    auto stream = prefill.engine.Submit(std::move(request), &error);
    ASSERT_TRUE(stream.ok()) << stream.status().message();
    prefill.RunToIdle();
    first = Collect(*stream.value());
    EXPECT_EQ(prefill.engine.Metrics().used_pages, 0);
  }
  EXPECT_EQ(first.finish, "transferred");
  ASSERT_EQ(first.tokens.size(), 1u);
  EXPECT_EQ(first.tokens[0], alone.tokens[resumed]);
  ASSERT_TRUE(sink->first_token.has_value());
  EXPECT_EQ(*sink->first_token, first.tokens[0]);
  EXPECT_TRUE(sink->in_order);
  EXPECT_GT(sink->chunks.size(), 1u) << "rows are sent chunk by chunk";
  EXPECT_EQ(sink->next, static_cast<int64_t>(attempt.size()));
  EXPECT_FALSE(sink->abandoned);

  ServingRun decode(4096, EngineConfig{});
  EngineRequest request{"x", attempt, GreedyWithLogprobs(kTokens)};
  request.prompt.push_back(first.tokens[0]);
  request.resumed_tokens = resumed + 1;
  request.imported = sink->Imported();
  SubmitError error;
  auto stream = decode.engine.Submit(std::move(request), &error);
  ASSERT_TRUE(stream.ok()) << stream.status().message();
  decode.RunToIdle();
  const Collected rest = Collect(*stream.value());
  EXPECT_EQ(rest.finish, "length");
  std::vector<int32_t> tokens = first.tokens;
  tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(tokens, std::vector<int32_t>(alone.tokens.begin() + resumed, alone.tokens.end()));
  std::vector<float> got = Logprobs(first), more = Logprobs(rest);
  got.insert(got.end(), more.begin(), more.end());
  const std::vector<float> want(alone_logprobs.begin() + resumed * 3, alone_logprobs.end());
  EXPECT_TRUE(got.size() == want.size() &&
              std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0)
      << "disaggregated: log-probabilities are not the same bits";
  // The prompt again on the decode engine: its full pages come from the received rows.
  auto again = decode.Submit("again", prompt, GreedyWithLogprobs(kTokens));
  decode.RunToIdle();
  const Collected c = Collect(*again);
  EXPECT_EQ(c.cached_tokens, (length - 1) / 16 * 16);
  EXPECT_EQ(c.tokens, alone.tokens);
}

TEST(EngineTest, DisaggregatedRequestGivesTheColocatedBitsInTheDefaultMode) {
  DefaultServing serving;
  ExpectDisaggregatedOneAnswer(100, 0);
  ExpectDisaggregatedOneAnswer(400, 0);  // prompt rows past kAbsorbedPromptKeys too
  ExpectDisaggregatedOneAnswer(100, 3);  // a resumed attempt (after a decode instance failed)
}

// The same on fp8 caches at both ends: the rows travel as stored (codes, scales, bf16 rope). An
// fp8 prefill instance's rows offered to a bf16 decode instance are refused, saying why.
TEST(EngineTest, DisaggregatedRequestOnFp8CachesGivesTheColocatedBits) {
  DefaultServing serving;
  ServingCacheDtype fp8_cache(DType::kF8E4M3);
  ExpectDisaggregatedOneAnswer(100, 0);
  auto sink = std::make_shared<CollectingSink>();
  const std::vector<int32_t> prompt = Prompt(40, 43);
  {
    ServingRun prefill(4096, EngineConfig{});
    EngineRequest request{"x", prompt, Greedy(4)};
    request.kv_sink = sink;
    SubmitError error;
    auto stream = prefill.engine.Submit(std::move(request), &error);
    ASSERT_TRUE(stream.ok()) << stream.status().message();
    prefill.RunToIdle();
    EXPECT_EQ(Collect(*stream.value()).finish, "transferred");
  }
  {  // a row whose scale exponent no fp8 row has (corrupted on the way) is refused, named
    ServingRun decode(4096, EngineConfig{});
    CollectingSink corrupted = *sink;
    const int64_t latent = DefaultModel().model->config().kv_lora_rank;
    const int64_t layer = 1, row = 3, count = corrupted.chunks[0].first;
    corrupted.chunks[0].second[(layer * count + row) * corrupted.row_bytes + latent] = 0x80;
    EngineRequest request{"x", prompt, Greedy(4)};
    request.prompt.push_back(*sink->first_token);
    request.resumed_tokens = 1;
    request.imported = corrupted.Imported();
    SubmitError error;
    auto stream = decode.engine.Submit(std::move(request), &error);
    ASSERT_FALSE(stream.ok());
    EXPECT_NE(stream.status().message().find("position 3 in layer 1 is not an fp8 cache row"),
              std::string::npos)
        << stream.status().message();
  }
  g_serving_cache = DType::kBF16;
  ServingRun decode(4096, EngineConfig{});
  EngineRequest request{"x", prompt, Greedy(4)};
  request.prompt.push_back(*sink->first_token);
  request.resumed_tokens = 1;
  request.imported = sink->Imported();
  SubmitError error;
  auto stream = decode.engine.Submit(std::move(request), &error);
  std::string message = stream.ok() ? "" : stream.status().message();
  if (stream.ok()) {
    decode.RunToIdle();
    message = Collect(*stream.value()).error;
  }
  EXPECT_NE(message.find("cache dtype"), std::string::npos) << message;
}

// A decode instance short of pages preempts requests whose rows it received; they recompute
// (their prompt rows as prompt, their output as decode steps) and give the bits they give alone.
TEST(EngineTest, PreemptedImportedRequestsInTheDefaultModeGiveTheSameBits) {
  DefaultServing serving;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  std::vector<int32_t> firsts;
  {
    ServingRun prefill(8192, EngineConfig{});
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 5; ++i) {
      prompts.push_back(Prompt(30 + i * 5, 70 + i));
      sinks.push_back(std::make_shared<CollectingSink>());
      EngineRequest request{"p" + std::to_string(i), prompts.back(), GreedyWithLogprobs(30)};
      request.kv_sink = sinks.back();
      SubmitError error;
      streams.push_back(prefill.engine.Submit(std::move(request), &error).value());
    }
    prefill.RunToIdle();
    for (auto& stream : streams) {
      const Collected c = Collect(*stream);
      ASSERT_EQ(c.finish, "transferred");
      firsts.push_back(c.tokens.at(0));
    }
  }
  EngineConfig config;
  config.max_num_batched_tokens = 256;
  ServingRun decode(16 * 12, config);  // 12 pages for 5 requests that need 4 or 5 each
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest request{"d" + std::to_string(i), prompts[i], GreedyWithLogprobs(30)};
    request.prompt.push_back(firsts[i]);
    request.resumed_tokens = 1;
    request.imported = sinks[i]->Imported();
    SubmitError error;
    auto stream = decode.engine.Submit(std::move(request), &error);
    ASSERT_TRUE(stream.ok()) << stream.status().message();
    streams.push_back(stream.value());
  }
  decode.RunToIdle();
  EXPECT_GT(decode.engine.Metrics().preemptions_total, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Collected c = Collect(*streams[i]), alone = ServedAlone(prompts[i], 30);
    ASSERT_EQ(c.tokens.size() + 1, alone.tokens.size()) << "request " << i;
    EXPECT_TRUE(std::equal(c.tokens.begin(), c.tokens.end(), alone.tokens.begin() + 1))
        << "request " << i;
    const std::vector<float> a = Logprobs(c), b = Logprobs(alone);
    EXPECT_TRUE(a.size() + 3 == b.size() && std::memcmp(a.data(), b.data() + 3, a.size() * 4) == 0)
        << "request " << i << ": log-probabilities are not the same bits";
  }
  EXPECT_EQ(decode.engine.Metrics().used_pages, 0);
}

// With MTP the MTP layer's rows travel too, and the drafts the prefill made after its first
// token: the decode engine verifies them in its first step as the colocated engine does, so greedy
// and seeded sampling give the colocated tokens (with 1 and 3 drafts a step).
void ExpectDisaggregatedMtpAnswer(int64_t drafts, const SamplingParams& params) {
  SCOPED_TRACE(std::to_string(drafts) + " drafts, temperature " +
               std::to_string(params.temperature));
  EngineConfig config;
  config.num_speculative_tokens = drafts;
  config.max_num_batched_tokens = 16;
  const std::vector<int32_t> prompt =
      Text("ROMEO: But soft, what light through yonder window breaks? It is the east");
  Collected alone;
  EngineMetrics alone_metrics;
  {
    Harness h(4096, config, TrainedModel());
    auto s = h.Submit("alone", prompt, params);
    h.RunToIdle();
    alone = Collect(*s);
    alone_metrics = h.engine.Metrics();
  }
  ASSERT_EQ(alone.tokens.size(), static_cast<size_t>(params.max_tokens));
  auto sink = std::make_shared<CollectingSink>();
  Harness prefill(4096, config, TrainedModel());
  EngineRequest request{"m", prompt, params};
  request.kv_sink = sink;
  SubmitError error;
  auto first = prefill.engine.Submit(request, &error);
  ASSERT_TRUE(first.ok()) << first.status().message();
  prefill.RunToIdle();
  const Collected head = Collect(*first.value());
  ASSERT_EQ(head.tokens.size(), 1u);
  EXPECT_EQ(sink->layers, prefill.cache.layers());  // the MTP layer included
  ASSERT_EQ(sink->drafts.tokens.size(), static_cast<size_t>(drafts));
  ASSERT_EQ(sink->drafts.distributions.size(), static_cast<size_t>(drafts));
  Harness decode(4096, config, TrainedModel());
  request.kv_sink = nullptr;
  request.prompt.push_back(head.tokens[0]);
  request.resumed_tokens = 1;
  request.imported = sink->Imported();
  auto rest = decode.engine.Submit(request, &error);
  ASSERT_TRUE(rest.ok()) << rest.status().message();
  decode.RunToIdle();
  Collected tail = Collect(*rest.value());
  std::vector<int32_t> tokens = head.tokens;
  tokens.insert(tokens.end(), tail.tokens.begin(), tail.tokens.end());
  EXPECT_EQ(tokens, alone.tokens);
  // The decode engine made the verifications the colocated one made after its prefill, its
  // first with the prefill's drafts: the same drafts proposed and accepted.
  EXPECT_GT(decode.engine.Metrics().spec_accepted_tokens_total, 0);
  EXPECT_EQ(decode.engine.Metrics().spec_drafts_total, alone_metrics.spec_drafts_total);
  EXPECT_EQ(decode.engine.Metrics().spec_draft_tokens_total, alone_metrics.spec_draft_tokens_total);
  EXPECT_EQ(decode.engine.Metrics().spec_accepted_tokens_total,
            alone_metrics.spec_accepted_tokens_total);
  // Rows of another shape (no MTP layer on this side) are refused, naming why.
  Harness plain(4096, EngineConfig{}, TrainedModel());
  request.imported = sink->Imported();
  auto refused = plain.engine.Submit(request, &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("MTP"), std::string::npos);
  // Drafts outside the vocabulary are refused too.
  auto bad = sink->Imported();
  bad->drafts.tokens[0] = -1;
  request.imported = bad;
  auto wrong = decode.engine.Submit(request, &error);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("draft"), std::string::npos);
}

TEST(EngineTest, DisaggregatedRequestWithMtpKeepsGreedyOutput) {
  ExpectDisaggregatedMtpAnswer(2, Greedy(20));
}

TEST(EngineTest, DisaggregatedRequestWithMtpGivesTheColocatedSeededSample) {
  SamplingParams params;
  params.temperature = 0.8;
  params.top_p = 0.95;
  params.seed = 1234;
  params.max_tokens = 24;
  params.ignore_eos = true;
  params.presence_penalty = 0.3;
  for (int64_t drafts : {1, 3})
    ExpectDisaggregatedMtpAnswer(drafts, params);
}

// A prefill request whose first token ends it is not handed on.
TEST(EngineTest, APrefillRequestEndedByItsFirstTokenIsNotHandedOn) {
  auto sink = std::make_shared<CollectingSink>();
  Harness prefill(1024, EngineConfig{});
  EngineRequest request{"one", Prompt(20, 3), Greedy(1)};
  request.kv_sink = sink;
  SubmitError error;
  auto stream = prefill.engine.Submit(request, &error);
  ASSERT_TRUE(stream.ok());
  prefill.RunToIdle();
  EXPECT_EQ(Collect(*stream.value()).finish, "length");
  EXPECT_TRUE(sink->abandoned);
  EXPECT_FALSE(sink->first_token.has_value());
}

}  // namespace
}  // namespace sy
