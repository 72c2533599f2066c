// The sampler on its own: each parameter does what its definition says, and temperature
// sampling draws from the softmax it claims (a chi-square test over many seeds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/sampling.h"

namespace sy {
namespace {

SampledToken Sample(const std::vector<float>& logits, const SamplingParams& params,
                    int64_t step = 0, const PenaltyState& penalties = {},
                    const std::vector<int32_t>& blocked = {}) {
  std::vector<float> scratch;
  return SampleToken(logits.data(), static_cast<int64_t>(logits.size()), params, penalties, step,
                     blocked, scratch);
}

TEST(SamplingTest, GreedyTopKOneAndBias) {
  std::vector<float> logits = {0.1f, 2.0f, 1.5f, -1.0f};
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(Sample(logits, greedy).token, 1);
  SamplingParams top1;
  top1.top_k = 1;
  top1.seed = 5;
  for (int step = 0; step < 20; ++step)
    EXPECT_EQ(Sample(logits, top1, step).token, 1);
  greedy.logit_bias[3] = 100;
  EXPECT_EQ(Sample(logits, greedy).token, 3);
  // Blocked tokens (min_tokens not reached: EOS and stop tokens) are never chosen.
  greedy.logit_bias.clear();
  EXPECT_EQ(Sample(logits, greedy, 0, {}, {1}).token, 2);
}

TEST(SamplingTest, PenaltiesFollowTheirDefinitions) {
  std::vector<float> logits = {1.0f, 1.2f, 0.0f};
  SamplingParams p;
  p.temperature = 0;
  PenaltyState state;
  state.generated_counts[1] = 2;
  p.frequency_penalty = 0.15;  // 1.2 − 2·0.15 = 0.9 < 1.0
  EXPECT_EQ(Sample(logits, p, 0, state).token, 0);
  p.frequency_penalty = 0;
  p.presence_penalty = 0.1;  // 1.2 − 0.1 = 1.1 > 1.0
  EXPECT_EQ(Sample(logits, p, 0, state).token, 1);
  p.presence_penalty = 0.3;  // 0.9 < 1.0
  EXPECT_EQ(Sample(logits, p, 0, state).token, 0);
  // Repetition penalty divides positive logits of seen tokens, multiplies negative ones.
  SamplingParams r;
  r.temperature = 0;
  r.repetition_penalty = 1.5;
  PenaltyState seen;
  seen.in_prompt = {0, 1, 0};
  EXPECT_EQ(Sample(logits, r, 0, seen).token, 0);  // 1.2 / 1.5 = 0.8 < 1.0
}

TEST(SamplingTest, TopPAndMinPKeepOnlyTheHead) {
  // probabilities ∝ e^{3}, e^{2}, e^{0}, e^{0}: about 0.681, 0.251, 0.034, 0.034
  std::vector<float> logits = {3.0f, 2.0f, 0.0f, 0.0f};
  SamplingParams p;
  p.top_p = 0.6;  // the first token alone reaches 0.6
  p.seed = 1;
  for (int step = 0; step < 50; ++step)
    EXPECT_EQ(Sample(logits, p, step).token, 0);
  SamplingParams m;
  m.min_p = 0.2;  // keeps tokens with p ≥ 0.2·p_max: the first two
  m.seed = 2;
  std::map<int32_t, int> seen;
  for (int step = 0; step < 400; ++step)
    ++seen[Sample(logits, m, step).token];
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_EQ(seen.count(2) + seen.count(3), 0u);
}

TEST(SamplingTest, TemperatureSamplingDrawsFromTheSoftmax) {
  std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f};
  SamplingParams p;
  p.temperature = 0.8;
  std::vector<double> expected(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    sum += expected[i] = std::exp(logits[i] / 0.8);
  const int draws = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    p.seed = static_cast<uint64_t>(i) * 7919u + 1;
    ++counts[Sample(logits, p, i % 13).token];
  }
  double chi2 = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = draws * expected[i] / sum;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  // 5 degrees of freedom: P(χ² > 20.5) ≈ 0.001.
  EXPECT_LT(chi2, 20.5);
}

// Speculative decoding's rejection sampling keeps the target distribution whatever the drafter
// proposes: draft from q, verify against p, and the tokens that come out follow p (χ²), while
// the acceptance rate is Σ min(p, q), the overlap of the two distributions.
TEST(SamplingTest, RejectionSamplingPreservesTheTargetDistribution) {
  const int64_t vocab = 6;
  std::vector<float> target = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f};
  std::vector<float> drafter = {-1.0f, 1.5f, 0.8f, 0.0f, 0.3f, 0.5f};  // deliberately unlike p
  SamplingParams params;
  params.temperature = 0.8;
  params.top_k = 5;  // p and q truncate differently: q proposes a token p never samples
  std::vector<float> scratch, dense;
  const TokenDistribution p = ProcessedDistribution(target.data(), vocab, params, {}, {}, scratch);
  const TokenDistribution q = ProcessedDistribution(drafter.data(), vocab, params, {}, {}, scratch);
  ASSERT_EQ(p.tokens.size(), 5u);
  double overlap = 0;
  for (int32_t t = 0; t < vocab; ++t)
    overlap += std::min(p.Prob(t), q.Prob(t));
  const int draws = 40000;
  std::vector<int> counts(static_cast<size_t>(vocab), 0);
  int kept = 0;
  for (int i = 0; i < draws; ++i) {
    const uint64_t seed = static_cast<uint64_t>(i) * 7919u + 3;
    const int64_t step = i % 17;
    const int32_t draft = q.Draw(UniformDraw(seed, step, kDraftStream));
    const DraftVerdict verdict = VerifyDraft(p, draft, q, seed, step, vocab, dense);
    if (verdict.kept) {
      EXPECT_EQ(verdict.token, draft);
      ++kept;
    }
    ++counts[static_cast<size_t>(verdict.token)];
  }
  EXPECT_EQ(counts[4], 0);  // outside p's top 5: never comes out, though q proposes it
  double chi2 = 0;
  for (int32_t t = 0; t < vocab; ++t) {
    const double e = draws * p.Prob(t);
    if (e == 0) continue;
    chi2 += (counts[t] - e) * (counts[t] - e) / e;
  }
  // 4 degrees of freedom: P(χ² > 18.5) ≈ 0.001.
  EXPECT_LT(chi2, 18.5);
  // Acceptance: binomial around the overlap, within 5 standard deviations.
  const double sd = std::sqrt(draws * overlap * (1 - overlap));
  EXPECT_NEAR(kept, draws * overlap, 5 * sd);
  EXPECT_LT(overlap, 0.8);  // the test means something: q differs from p
}

// A deterministic drafter (n-gram lookup) proposes one token with certainty: q is one-hot. The
// draft is kept with probability p(d) and otherwise replaced from p without d, so what comes out
// still follows p — for a draft p likes, one it does not, and one outside p's support.
TEST(SamplingTest, OneHotDraftsKeepTheTargetDistribution) {
  const int64_t vocab = 5;
  std::vector<float> target = {1.0f, 0.2f, -0.4f, 1.6f, -3.0f};
  SamplingParams params;
  params.temperature = 0.9;
  params.top_k = 4;  // token 4 is outside p
  std::vector<float> scratch, dense;
  const TokenDistribution p = ProcessedDistribution(target.data(), vocab, params, {}, {}, scratch);
  ASSERT_EQ(p.tokens.size(), 4u);
  for (int32_t draft : {3, 2, 4}) {
    SCOPED_TRACE("draft " + std::to_string(draft));
    const TokenDistribution q{{draft}, {1.0}};
    const int draws = 30000;
    std::vector<int> counts(static_cast<size_t>(vocab), 0);
    int kept = 0;
    for (int i = 0; i < draws; ++i) {
      const uint64_t seed = static_cast<uint64_t>(i) * 104729u + 11;
      const DraftVerdict verdict = VerifyDraft(p, draft, q, seed, i % 13, vocab, dense);
      kept += verdict.kept;
      if (verdict.kept) {
        EXPECT_EQ(verdict.token, draft);
      }
      ++counts[static_cast<size_t>(verdict.token)];
    }
    EXPECT_EQ(counts[4], 0);
    double chi2 = 0;
    for (int32_t t = 0; t < 4; ++t) {
      const double e = draws * p.Prob(t);
      chi2 += (counts[t] - e) * (counts[t] - e) / e;
    }
    EXPECT_LT(chi2, 16.3);  // 3 degrees of freedom: P(χ² > 16.3) ≈ 0.001
    const double accept = p.Prob(draft);
    EXPECT_NEAR(kept, draws * accept, 5 * std::sqrt(draws * accept * (1 - accept)) + 1e-9);
  }
}

// vLLM's bad_words rule: a word's last token is banned where the output ends with the rest of it
// (a one-token word always); the prompt does not count.
TEST(SamplingTest, BadWordsBanTheTokenThatWouldCompleteThem) {
  SamplingParams params;
  params.bad_words_token_ids = {{7}, {3, 4}, {1, 2, 3}};
  auto banned = [&](std::vector<int32_t> output) { return BadWordTokens(params, output); };
  EXPECT_EQ(banned({}), (std::vector<int32_t>{7}));
  EXPECT_EQ(banned({5, 3}), (std::vector<int32_t>{7, 4}));
  EXPECT_EQ(banned({3}), (std::vector<int32_t>{7, 4}));
  EXPECT_EQ(banned({1, 2}), (std::vector<int32_t>{7, 3}));
  EXPECT_EQ(banned({9, 1, 2}), (std::vector<int32_t>{7, 3}));
  EXPECT_EQ(banned({2}), (std::vector<int32_t>{7}));
  EXPECT_EQ(banned({3, 5}), (std::vector<int32_t>{7}));
  // Allowed and banned together: only allowed tokens come, a banned one never does, and where
  // nothing is left the distribution is empty.
  std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.5f, 0.0f};
  params.bad_words_token_ids.clear();
  params.temperature = 0.7;
  params.allowed_token_ids = {1, 3, 4};
  std::vector<float> scratch;
  TokenDistribution p = ProcessedDistribution(logits.data(), 5, params, {}, {3}, scratch);
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{1, 4}));
  p = ProcessedDistribution(logits.data(), 5, params, {}, {1, 3, 4}, scratch);
  EXPECT_TRUE(p.tokens.empty());
  params.temperature = 0;
  p = ProcessedDistribution(logits.data(), 5, params, {}, {1}, scratch);
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{3}));
  p = ProcessedDistribution(logits.data(), 5, params, {}, {1, 3, 4}, scratch);
  EXPECT_TRUE(p.tokens.empty());
  EXPECT_EQ(SampleToken(logits.data(), 5, params, {}, 0, {1, 3, 4}, scratch).token, -1);
}

TEST(SamplingTest, GreedyVerificationKeepsExactlyTheArgmax) {
  std::vector<float> logits = {0.1f, 2.0f, 1.5f, -1.0f};
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<float> scratch, dense;
  const TokenDistribution p = ProcessedDistribution(logits.data(), 4, greedy, {}, {}, scratch);
  for (int32_t draft = 0; draft < 4; ++draft) {
    TokenDistribution q;
    q.tokens = {draft};
    q.probs = {1.0};
    for (uint64_t seed = 0; seed < 50; ++seed) {
      const DraftVerdict v = VerifyDraft(p, draft, q, seed, 3, 4, dense);
      EXPECT_EQ(v.kept, draft == 1);
      EXPECT_EQ(v.token, 1);
    }
  }
}

TEST(SamplingTest, SameSeedAndStepSameToken) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i)
    logits[i] = std::sin(i * 0.37f);
  SamplingParams p;
  p.seed = 42;
  for (int step = 0; step < 10; ++step)
    EXPECT_EQ(Sample(logits, p, step).token, Sample(logits, p, step).token);
  int differ = 0;
  for (int step = 0; step < 10; ++step)
    differ += Sample(logits, p, step).token != Sample(logits, p, step + 1).token;
  EXPECT_GT(differ, 0);
}

TEST(SamplingTest, LogprobsAreOfTheModelsDistribution) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  p.logit_bias[0] = 50;  // forces token 0; its logprob stays the model's
  SampledToken t = Sample(logits, p);
  EXPECT_EQ(t.token, 0);
  EXPECT_NEAR(t.logprob, std::log(0.25), 1e-5);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].first, 1);
  EXPECT_NEAR(t.top[0].second, std::log(0.75), 1e-5);
}

TEST(SamplingTest, ValidationNamesTheField) {
  SamplingParams p;
  p.top_k = -3;
  EXPECT_NE(p.Validate(100).message().find("top_k"), std::string::npos);
  p = {};
  p.logit_bias[100] = 1;
  EXPECT_NE(p.Validate(100).message().find("logit_bias"), std::string::npos);
  p = {};
  p.min_tokens = 5;
  p.max_tokens = 2;
  EXPECT_NE(p.Validate(100).message().find("min_tokens"), std::string::npos);
  EXPECT_TRUE(SamplingParams{}.Validate(100).ok());
}

}  // namespace
}  // namespace sy
