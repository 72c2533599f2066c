// Beam search: the search against brute force on a made-up distribution (where the answer can be
// enumerated), and the frontend over the real engine against plain requests of the same model.
#include "engine/beam_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include "test_support.h"
#include "tokenizer/embedded_tokenizers.h"

namespace sy {
namespace {

const Tokenizer& DefaultTokenizer() {
  static Tokenizer tokenizer = [] {
    const std::string dir = testing::TempDirectory("beam_tokenizer");
    EXPECT_TRUE(WriteEmbeddedTokenizer("default", dir).ok());
    auto t = Tokenizer::Load(dir);
    EXPECT_TRUE(t.ok());
    return std::move(t).value();
  }();
  return tokenizer;
}

int32_t OneToken(const std::string& text) {
  auto ids = DefaultTokenizer().Encode(text);
  EXPECT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 1u) << text;
  return ids->front();
}

// A made-up language model over a few tokens: each sequence's next-token logits are drawn from a
// hash of it, so the distribution changes with every token and near-ties are rare.
using Next = std::vector<std::pair<int32_t, float>>;
struct ToyModel {
  std::vector<int32_t> vocab;
  std::map<std::vector<int32_t>, Next> fixed;  // sequences whose distribution a test chooses
  Next operator()(const std::vector<int32_t>& sequence) const {
    if (auto it = fixed.find(sequence); it != fixed.end()) return it->second;
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : sequence)
      h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
    std::vector<double> logits;
    for (size_t i = 0; i < vocab.size(); ++i) {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      logits.push_back(static_cast<double>(h >> 11) / 9007199254740992.0 * 6 - 3);
    }
    double max = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (double l : logits)
      sum += std::exp(l - max);
    Next next;
    for (size_t i = 0; i < vocab.size(); ++i)
      next.push_back({vocab[i], static_cast<float>(logits[i] - max - std::log(sum))});
    std::stable_sort(next.begin(), next.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    return next;
  }
};

// Runs a search to its end against the toy model.
std::vector<BeamResult> RunToy(const ToyModel& model, const std::vector<int32_t>& prompt,
                               const SamplingParams& params, int32_t eos,
                               std::vector<int32_t> more_eos = {}) {
  BeamSearch search(DefaultTokenizer(), prompt, params, eos, std::move(more_eos));
  while (!search.done()) {
    std::vector<Next> next;
    for (const auto& p : search.LivePrompts())
      next.push_back(model(p));
    search.Extend(next);
  }
  return search.Best();
}

SamplingParams Beams(int64_t width, int64_t max_tokens) {
  SamplingParams p;
  p.beam_width = width;
  p.max_tokens = max_tokens;
  return p;
}

TEST(BeamSearchTest, AWideEnoughSearchIsTheExhaustiveOne) {
  // Three tokens, three steps: width 9 keeps every two-token prefix, so the last step ranks all
  // 27 outputs, and with length_penalty 0 the result is their top 9 by log-probability.
  ToyModel model{{OneToken("a"), OneToken("b"), OneToken("c")}, {}};
  const std::vector<int32_t> prompt = {OneToken("x"), OneToken("y")};
  SamplingParams params = Beams(9, 3);
  params.length_penalty = 0;
  std::vector<std::pair<double, std::vector<int32_t>>> all;
  for (int32_t t1 : model.vocab)
    for (int32_t t2 : model.vocab)
      for (int32_t t3 : model.vocab) {
        std::vector<int32_t> seq = prompt;
        double sum = 0;
        for (int32_t t : {t1, t2, t3}) {
          for (const auto& [token, logprob] : model(seq))
            if (token == t) sum += logprob;
          seq.push_back(t);
        }
        all.push_back({sum, {t1, t2, t3}});
      }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  const std::vector<BeamResult> best = RunToy(model, prompt, params, /*eos=*/-1);
  ASSERT_EQ(best.size(), 9u);
  for (size_t i = 0; i < best.size(); ++i) {
    EXPECT_EQ(best[i].tokens, all[i].second) << "rank " << i;
    EXPECT_NEAR(best[i].cumulative_logprob, all[i].first, 1e-9) << "rank " << i;
    EXPECT_EQ(best[i].finish_reason, "length");
  }
  // The best is strictly better than the runner-up the enumeration found.
  EXPECT_GT(best[0].cumulative_logprob, all[9].first);
}

TEST(BeamSearchTest, WidthOneIsGreedyAndAWiderSearchFindsWhatGreedyMisses) {
  const int32_t a = OneToken("a"), b = OneToken("b"), c = OneToken("c");
  ToyModel model{{a, b, c}, {}};
  const std::vector<int32_t> prompt = {OneToken("x")};
  // Greedy takes "a" (0.5) and then can only go on at 0.4; "b" (0.4) leads to 0.9.
  model.fixed[{prompt[0]}] = {{a, std::log(0.5f)}, {b, std::log(0.4f)}, {c, std::log(0.1f)}};
  model.fixed[{prompt[0], a}] = {{a, std::log(0.4f)}, {b, std::log(0.3f)}, {c, std::log(0.3f)}};
  model.fixed[{prompt[0], b}] = {{c, std::log(0.9f)}, {a, std::log(0.05f)}, {b, std::log(0.05f)}};
  const std::vector<BeamResult> greedy = RunToy(model, prompt, Beams(1, 2), -1);
  ASSERT_EQ(greedy.size(), 1u);
  EXPECT_EQ(greedy[0].tokens, (std::vector<int32_t>{a, a}));
  const std::vector<BeamResult> beams = RunToy(model, prompt, Beams(2, 2), -1);
  ASSERT_EQ(beams.size(), 2u);
  EXPECT_EQ(beams[0].tokens, (std::vector<int32_t>{b, c}));
  EXPECT_NEAR(beams[0].cumulative_logprob, std::log(0.4f) + std::log(0.9f), 1e-6);
  EXPECT_EQ(beams[1].tokens, (std::vector<int32_t>{a, a}));
  EXPECT_EQ(beams[0].text, "bc");
}

TEST(BeamSearchTest, AnEndedBeamIsRankedByItsLengthWithoutTheEndToken) {
  const int32_t a = OneToken("a"), b = OneToken("b"), eos = OneToken("z");
  ToyModel model{{a, b, eos}, {}};
  const std::vector<int32_t> prompt = {OneToken("x"), OneToken("y")};
  // The end is the likeliest first token; the beams that go on keep ~0.9 per token.
  model.fixed[prompt] = {{eos, std::log(0.5f)}, {a, std::log(0.3f)}, {b, std::log(0.2f)}};
  for (int32_t first : {a, b}) {
    std::vector<int32_t> seq = prompt;
    seq.push_back(first);
    for (int i = 0; i < 4; ++i) {
      model.fixed[seq] = {{a, std::log(0.9f)}, {b, std::log(0.06f)}, {eos, std::log(0.04f)}};
      seq.push_back(a);
    }
  }
  // Without a length penalty the ended beam (log 0.5) outranks every longer one.
  SamplingParams flat = Beams(2, 4);
  flat.length_penalty = 0;
  std::vector<BeamResult> best = RunToy(model, prompt, flat, eos);
  ASSERT_EQ(best.size(), 2u);
  EXPECT_EQ(best[0].tokens, (std::vector<int32_t>{eos}));
  EXPECT_EQ(best[0].text, "");
  EXPECT_EQ(best[0].finish_reason, "stop");
  EXPECT_FALSE(best[0].stop_token);
  // The same end named by generation_config.json instead (Kimi K2's <|im_end|>): the same result.
  const std::vector<BeamResult> by_generation_config =
      RunToy(model, prompt, flat, /*eos=*/-1, /*more_eos=*/{eos});
  ASSERT_EQ(by_generation_config.size(), 2u);
  EXPECT_EQ(by_generation_config[0].tokens, best[0].tokens);
  EXPECT_EQ(by_generation_config[0].finish_reason, "stop");
  EXPECT_EQ(by_generation_config[1].score, best[1].score);
  // With vLLM's default (cumulative / length, the prompt counted, the end token not): the ended
  // beam scores log(0.5) / 2 and "a a a a" log(0.3·0.9³) / 6, which is higher.
  best = RunToy(model, prompt, Beams(2, 4), eos);
  ASSERT_EQ(best.size(), 2u);
  const double ended = std::log(0.5) / 2, long_one = (std::log(0.3) + 3 * std::log(0.9)) / 6;
  ASSERT_GT(long_one, ended);
  EXPECT_EQ(best[0].tokens, (std::vector<int32_t>{a, a, a, a}));
  EXPECT_NEAR(best[0].score, long_one, 1e-6);
  EXPECT_EQ(best[0].finish_reason, "length");
  // min_tokens holds the end back: no result ends before its second token.
  SamplingParams held = flat;
  held.min_tokens = 2;
  for (const BeamResult& r : RunToy(model, prompt, held, eos))
    EXPECT_GE(r.tokens.size(), 2u);
  // ignore_eos: the end token is an ordinary one.
  SamplingParams ignoring = flat;
  ignoring.ignore_eos = true;
  for (const BeamResult& r : RunToy(model, prompt, ignoring, eos)) {
    EXPECT_EQ(r.tokens.size(), 4u);
    EXPECT_EQ(r.finish_reason, "length");
  }
  // A stop token ends a beam as the end does, and is reported.
  SamplingParams stop_on_b = flat;
  stop_on_b.ignore_eos = true;
  stop_on_b.stop_token_ids = {b};
  bool stopped = false;
  for (const BeamResult& r : RunToy(model, prompt, stop_on_b, eos))
    if (r.finish_reason == "stop") {
      stopped = true;
      EXPECT_EQ(r.stop_token, b);
      EXPECT_EQ(r.tokens.back(), b);
    }
  EXPECT_TRUE(stopped);
}

TEST(BeamSearchTest, AStopStringEndsABeamWhereItAppears) {
  const int32_t a = OneToken("a"), b = OneToken("b");
  ToyModel model{{a, b}, {}};
  const std::vector<int32_t> prompt = {OneToken("x")};
  model.fixed[prompt] = {{a, std::log(0.6f)}, {b, std::log(0.4f)}};
  model.fixed[{prompt[0], a}] = {{b, std::log(0.7f)}, {a, std::log(0.3f)}};
  model.fixed[{prompt[0], b}] = {{a, std::log(0.9f)}, {b, std::log(0.1f)}};
  SamplingParams params = Beams(2, 2);
  params.length_penalty = 0;
  params.stop = {"ab"};
  std::vector<BeamResult> best = RunToy(model, prompt, params, -1);
  ASSERT_EQ(best.size(), 2u);
  // "ab" (0.42) stops on its second token: the text ends before the stop string.
  EXPECT_EQ(best[0].tokens, (std::vector<int32_t>{a, b}));
  EXPECT_EQ(best[0].finish_reason, "stop");
  EXPECT_EQ(best[0].stop_string, "ab");
  EXPECT_EQ(best[0].text, "");
  EXPECT_EQ(best[1].tokens, (std::vector<int32_t>{b, a}));  // 0.36
  EXPECT_EQ(best[1].text, "ba");
  params.include_stop_str_in_output = true;
  best = RunToy(model, prompt, params, -1);
  EXPECT_EQ(best[0].text, "ab");
}

TEST(BeamSearchTest, LogprobsKeepTheAskedAlternativesAndNothingGeneratedFillsEveryChoice) {
  ToyModel model{{OneToken("a"), OneToken("b"), OneToken("c"), OneToken("d")}, {}};
  SamplingParams params = Beams(2, 3);
  params.logprobs = 3;
  BeamSearch search(DefaultTokenizer(), {OneToken("x")}, params, -1);
  EXPECT_EQ(search.candidates_wanted(), 4);
  params.logprobs = 7;
  EXPECT_EQ(BeamSearch(DefaultTokenizer(), {OneToken("x")}, params, -1).candidates_wanted(), 7);
  params.logprobs = 3;
  for (const BeamResult& r : RunToy(model, {OneToken("x")}, params, -1)) {
    ASSERT_EQ(r.logprobs.size(), 3u);
    double sum = 0;
    for (const TokenLogprob& lp : r.logprobs) {
      EXPECT_EQ(lp.top.size(), 3u);
      sum += lp.logprob;
    }
    EXPECT_NEAR(sum, r.cumulative_logprob, 1e-6);
  }
  const std::vector<BeamResult> none = RunToy(model, {OneToken("x")}, Beams(3, 0), -1);
  ASSERT_EQ(none.size(), 3u);
  for (const BeamResult& r : none) {
    EXPECT_TRUE(r.tokens.empty());
    EXPECT_EQ(r.finish_reason, "length");
  }
}

TEST(BeamSearchTest, WhatWouldChangeTheDistributionIsRefusedByName) {
  EXPECT_TRUE(CheckBeamSearchParams(Beams(4, 8)).ok());
  EXPECT_NE(CheckBeamSearchParams(Beams(0, 8)).message().find("beam width"), std::string::npos);
  EXPECT_NE(CheckBeamSearchParams(Beams(kMaxBeamWidth + 1, 8)).message().find("[1, 10]"),
            std::string::npos);
  auto refused = [](auto change, const std::string& field) {
    SamplingParams p = Beams(2, 8);
    change(p);
    const Status s = CheckBeamSearchParams(p);
    EXPECT_FALSE(s.ok()) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  };
  refused([](SamplingParams& p) { p.presence_penalty = 0.5; }, "presence_penalty");
  refused([](SamplingParams& p) { p.frequency_penalty = 0.5; }, "frequency_penalty");
  refused([](SamplingParams& p) { p.repetition_penalty = 1.2; }, "repetition_penalty");
  refused([](SamplingParams& p) { p.logit_bias[3] = 1; }, "logit_bias");
  refused([](SamplingParams& p) { p.allowed_token_ids = {3}; }, "allowed_token_ids");
  refused([](SamplingParams& p) { p.bad_words_token_ids = {{3}}; }, "bad_words");
  refused([](SamplingParams& p) { p.thinking_token_budget = 4; }, "thinking_token_budget");
  refused(
      [](SamplingParams& p) {
        p.grammar = structured::GrammarSpec{structured::GrammarSpec::Kind::kJsonObject, "", {}, ""};
      },
      "structured output");
  refused([](SamplingParams& p) { p.length_penalty = NAN; }, "length_penalty");
}

// ---------------------------------------------------------------------------------------------
// The frontend over the engine.

const testing::LoadedModel& SmallModel() {
  return testing::BatchInvariantSmallModel();
}

struct Running {
  LatentCache cache;
  Engine engine;
  BeamSearchFrontend beams;
  explicit Running(EngineConfig config = {}, int64_t cache_tokens = 8192)
      : cache(SmallModel().model->NewCache(cache_tokens, 1, DType::kF32, 16)),
        engine(*SmallModel().model, cache, *SmallModel().tokenizer, Absorbed(), config),
        beams(engine, *SmallModel().tokenizer, engine.limits()) {
    engine.Start();
  }
  ~Running() { beams.Stop(/*drain=*/false); }
  static ForwardOptions Absorbed() {
    ForwardOptions forward;
    forward.attention = AttentionForm::kAbsorbed;
    return forward;
  }
};

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  std::string text, finish, error;
  int64_t prompt_tokens = -1;
};

Outcome Wait(RequestStream& stream) {
  Outcome o;
  for (int i = 0; i < 60000; ++i) {
    std::vector<RequestEvent> events;
    const bool done = stream.Drain(&events);
    for (RequestEvent& e : events) {
      o.tokens.insert(o.tokens.end(), e.token_ids.begin(), e.token_ids.end());
      o.text += e.text;
      for (auto& l : e.logprobs)
        o.logprobs.push_back(l);
      if (e.first) {
        o.prompt_tokens = e.prompt_tokens;
        o.prompt_logprobs = e.prompt_logprobs;
      }
      if (e.finish_reason) {
        o.finish = *e.finish_reason;
        o.error = e.error;
      }
    }
    if (done) return o;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ADD_FAILURE() << "the stream never finished";
  return o;
}

std::vector<int32_t> Prompt(int64_t length, int32_t salt) {
  return testing::SaltedPrompt(length, salt);
}

// A search's choices as a server submits them: W requests of one prompt.
std::vector<EngineRequest> Choices(const std::string& id, const std::vector<int32_t>& prompt,
                                   const SamplingParams& params) {
  std::vector<EngineRequest> requests;
  for (int64_t i = 0; i < params.beam_width; ++i)
    requests.push_back({id + "-" + std::to_string(i), prompt, params});
  return requests;
}

std::vector<Outcome> Search(BeamSearchFrontend& beams, const std::string& id,
                            const std::vector<int32_t>& prompt, const SamplingParams& params) {
  SubmitError why = SubmitError::kNone;
  auto streams = beams.SubmitAll(Choices(id, prompt, params), &why);
  EXPECT_TRUE(streams.ok()) << streams.status().message();
  std::vector<Outcome> out;
  if (!streams.ok()) return out;
  for (auto& s : *streams)
    out.push_back(Wait(*s));
  return out;
}

using testing::Greedy;

TEST(BeamSearchFrontendTest, WidthOneGivesTheGreedyTokens) {
  Running r;
  const std::vector<int32_t> prompt = Prompt(21, 1);
  SubmitError why;
  auto plain = r.beams.Submit({"greedy", prompt, Greedy(12)}, &why);
  ASSERT_TRUE(plain.ok());
  const Outcome greedy = Wait(**plain);
  SamplingParams params = Beams(1, 12);
  params.ignore_eos = true;
  const std::vector<Outcome> beams = Search(r.beams, "b", prompt, params);
  ASSERT_EQ(beams.size(), 1u);
  EXPECT_EQ(beams[0].tokens, greedy.tokens);
  EXPECT_EQ(beams[0].text, greedy.text);
  EXPECT_EQ(beams[0].finish, "length");
  EXPECT_EQ(beams[0].prompt_tokens, 21);
  EXPECT_EQ(r.beams.running(), 0);
}

TEST(BeamSearchFrontendTest, OneStepGivesTheLikeliestNextTokensInOrder) {
  Running r;
  const std::vector<int32_t> prompt = Prompt(30, 2);
  SamplingParams ask = Greedy(1);
  ask.logprobs = 4;
  SubmitError why;
  auto plain = r.beams.Submit({"top", prompt, ask}, &why);
  ASSERT_TRUE(plain.ok());
  const Outcome top = Wait(**plain);
  ASSERT_EQ(top.logprobs.size(), 1u);
  SamplingParams params = Beams(4, 1);
  params.ignore_eos = true;
  params.logprobs = 4;
  const std::vector<Outcome> beams = Search(r.beams, "b", prompt, params);
  ASSERT_EQ(beams.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(beams[i].tokens.size(), 1u);
    EXPECT_EQ(beams[i].tokens[0], top.logprobs[0].top[i].first) << "choice " << i;
    EXPECT_EQ(beams[i].logprobs[0].logprob, top.logprobs[0].top[i].second);
    EXPECT_EQ(beams[i].logprobs[0].top, top.logprobs[0].top);
  }
}

TEST(BeamSearchFrontendTest, EachBeamsLogprobIsWhatThePromptScoringOfItsTokensSays) {
  Running r;
  const std::vector<int32_t> prompt = Prompt(19, 3);
  SamplingParams params = Beams(3, 8);
  params.ignore_eos = true;
  params.logprobs = 0;
  params.prompt_logprobs = 0;
  const std::vector<Outcome> beams = Search(r.beams, "b", prompt, params);
  ASSERT_EQ(beams.size(), 3u);
  EXPECT_EQ(beams[0].prompt_logprobs.size(), prompt.size());
  for (size_t i = 0; i < beams.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      EXPECT_NE(beams[i].tokens, beams[j].tokens) << "choices " << i << " and " << j;
    // Score the beam's tokens as a prompt: each position's log-probability there is the one the
    // search used (the same rows: one attention form, products independent of the batch).
    std::vector<int32_t> whole = prompt;
    whole.insert(whole.end(), beams[i].tokens.begin(), beams[i].tokens.end());
    SamplingParams score = Greedy(1);
    score.prompt_logprobs = 0;
    SubmitError why;
    auto plain = r.beams.Submit({"score" + std::to_string(i), whole, score}, &why);
    ASSERT_TRUE(plain.ok());
    const Outcome scored = Wait(**plain);
    ASSERT_EQ(scored.prompt_logprobs.size(), whole.size());
    ASSERT_EQ(beams[i].logprobs.size(), beams[i].tokens.size());
    for (size_t k = 0; k < beams[i].tokens.size(); ++k) {
      const auto& lp = scored.prompt_logprobs[prompt.size() + k];
      ASSERT_TRUE(lp.has_value());
      EXPECT_EQ(lp->token, beams[i].tokens[k]);
      EXPECT_EQ(lp->logprob, beams[i].logprobs[k].logprob) << "choice " << i << " token " << k;
    }
  }
  // Ranked best first by cumulative log-probability (all of one length).
  auto sum = [](const Outcome& o) {
    double s = 0;
    for (const auto& l : o.logprobs)
      s += l.logprob;
    return s;
  };
  EXPECT_GE(sum(beams[0]), sum(beams[1]));
  EXPECT_GE(sum(beams[1]), sum(beams[2]));
}

TEST(BeamSearchFrontendTest, AnAbortEndsEveryChoiceAndLeavesNothingRunning) {
  Running r;
  SamplingParams params = Beams(3, 2000);
  params.ignore_eos = true;
  SubmitError why;
  auto streams = r.beams.SubmitAll(Choices("long", Prompt(40, 4), params), &why);
  ASSERT_TRUE(streams.ok());
  EXPECT_EQ(r.beams.running(), 1);
  for (int i = 0; i < 2000 && r.engine.Metrics().steps_total < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  r.beams.Abort("long-1");  // any choice's id ends the search
  for (auto& s : *streams) {
    const Outcome o = Wait(*s);
    EXPECT_EQ(o.finish, "abort");
    EXPECT_TRUE(o.tokens.empty());
  }
  for (int i = 0; i < 2000 && (r.beams.running() > 0 || r.engine.Metrics().running > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(r.beams.running(), 0);
  EXPECT_EQ(r.engine.Metrics().running, 0);
  EXPECT_EQ(r.engine.Metrics().waiting, 0);
}

TEST(BeamSearchFrontendTest, StoppingWithoutDrainAbortsAndWithDrainFinishes) {
  SamplingParams params = Beams(2, 6);
  params.ignore_eos = true;
  {
    Running r;
    SubmitError why;
    auto streams = r.beams.SubmitAll(Choices("drained", Prompt(25, 5), params), &why);
    ASSERT_TRUE(streams.ok());
    r.beams.Stop(/*drain=*/true);
    for (auto& s : *streams) {
      const Outcome o = Wait(*s);
      EXPECT_EQ(o.finish, "length");
      EXPECT_EQ(o.tokens.size(), 6u);
    }
    auto refused = r.beams.SubmitAll(Choices("late", Prompt(25, 5), params), &why);
    EXPECT_FALSE(refused.ok());
    EXPECT_EQ(why, SubmitError::kStopping);
  }
  {
    Running r;
    params.max_tokens = 4000;
    SubmitError why;
    auto streams = r.beams.SubmitAll(Choices("cut", Prompt(25, 5), params), &why);
    ASSERT_TRUE(streams.ok());
    r.beams.Stop(/*drain=*/false);
    for (auto& s : *streams)
      EXPECT_EQ(Wait(*s).finish, "abort");
  }
}

TEST(BeamSearchFrontendTest, BadSearchesAreRefusedWithNothingQueued) {
  Running r;
  SubmitError why = SubmitError::kNone;
  SamplingParams params = Beams(3, 4);
  // The engine itself refuses a search that did not pass through the frontend.
  auto direct = r.engine.Submit({"direct", Prompt(10, 6), params}, &why);
  ASSERT_FALSE(direct.ok());
  EXPECT_NE(direct.status().message().find("BeamSearchFrontend"), std::string::npos);
  // Fewer choices than the width, or choices of different prompts.
  std::vector<EngineRequest> two = Choices("short", Prompt(10, 6), params);
  two.pop_back();
  auto partial = r.beams.SubmitAll(two, &why);
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(why, SubmitError::kInvalid);
  std::vector<EngineRequest> mixed = Choices("mixed", Prompt(10, 6), params);
  mixed[2].prompt = Prompt(10, 7);
  EXPECT_FALSE(r.beams.SubmitAll(mixed, &why).ok());
  // Parameters the search cannot honour, and a search longer than the context: named.
  SamplingParams penalized = params;
  penalized.presence_penalty = 1;
  auto bad = r.beams.SubmitAll(Choices("pen", Prompt(10, 6), penalized), &why);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("presence_penalty"), std::string::npos);
  SamplingParams too_long = params;
  too_long.max_tokens = r.engine.max_model_len();
  auto long_one = r.beams.SubmitAll(Choices("long", Prompt(10, 6), too_long), &why);
  ASSERT_FALSE(long_one.ok());
  EXPECT_NE(long_one.status().message().find("maximum context length"), std::string::npos);
  // A plain request submitted beside a refused search is not queued either.
  std::vector<EngineRequest> both = Choices("pen2", Prompt(10, 6), penalized);
  both.insert(both.begin(), EngineRequest{"plain", Prompt(10, 8), Greedy(4)});
  EXPECT_FALSE(r.beams.SubmitAll(both, &why).ok());
  EXPECT_EQ(r.engine.Metrics().waiting + r.engine.Metrics().running, 0);
  EXPECT_EQ(r.beams.running(), 0);
}

TEST(BeamSearchFrontendTest, SearchesAndPlainRequestsRunSideBySide) {
  Running r;
  SamplingParams params = Beams(2, 5);
  params.ignore_eos = true;
  std::vector<EngineRequest> requests = Choices("s1", Prompt(33, 9), params);
  requests.push_back({"plain", Prompt(12, 10), Greedy(7)});
  for (EngineRequest& c : Choices("s2", Prompt(17, 11), params))
    requests.push_back(std::move(c));
  SubmitError why;
  auto streams = r.beams.SubmitAll(requests, &why);
  ASSERT_TRUE(streams.ok()) << streams.status().message();
  ASSERT_EQ(streams->size(), 5u);
  std::vector<Outcome> got;
  for (auto& s : *streams)
    got.push_back(Wait(*s));
  EXPECT_EQ(got[2].tokens.size(), 7u);  // the plain one, in its place
  // Each search alone gives the same beams.
  const std::vector<Outcome> s1 = Search(r.beams, "again1", Prompt(33, 9), params);
  const std::vector<Outcome> s2 = Search(r.beams, "again2", Prompt(17, 11), params);
  EXPECT_EQ(got[0].tokens, s1[0].tokens);
  EXPECT_EQ(got[1].tokens, s1[1].tokens);
  EXPECT_EQ(got[3].tokens, s2[0].tokens);
  EXPECT_EQ(got[4].tokens, s2[1].tokens);
}

}  // namespace
}  // namespace sy
