#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace sy {

Status CheckBeamSearchParams(const SamplingParams& params) {
  if (params.beam_width < 1 || params.beam_width > kMaxBeamWidth)
    return Status::Errorf("n (the beam width) must be in [1, {}], got {}", kMaxBeamWidth,
                          params.beam_width);
  if (!std::isfinite(params.length_penalty))
    return Status::Error("length_penalty must be a finite number");
  // What would change the distribution the beams are ranked by: refused, not ignored.
  auto refuse = [](const char* field) {
    return Status::Errorf(
        "{} cannot be combined with it (beams are ranked by the model's own "
        "log-probabilities)",
        field);
  };
  if (params.presence_penalty != 0) return refuse("presence_penalty");
  if (params.frequency_penalty != 0) return refuse("frequency_penalty");
  if (params.repetition_penalty != 1) return refuse("repetition_penalty");
  if (!params.logit_bias.empty()) return refuse("logit_bias");
  if (!params.allowed_token_ids.empty()) return refuse("allowed_token_ids");
  if (!params.bad_words_token_ids.empty()) return refuse("bad_words");
  if (params.grammar)
    return refuse(
        "a structured output constraint (response_format, structured_outputs, "
        "tool_choice \"required\" or a named tool)");
  if (params.thinking_token_budget) return refuse("thinking_token_budget (reasoning_effort)");
  return Status::Ok();
}

Status SamplingParams::Validate(int64_t vocab_size) const {
  if (!(temperature >= 0) || temperature > 1e4)
    return Status::Errorf("temperature must be in [0, 10000], got {}", temperature);
  if (!(top_p > 0 && top_p <= 1)) return Status::Errorf("top_p must be in (0, 1], got {}", top_p);
  if (top_k < -1) return Status::Errorf("top_k must be -1 (off) or at least 0, got {}", top_k);
  if (!(min_p >= 0 && min_p <= 1)) return Status::Errorf("min_p must be in [0, 1], got {}", min_p);
  if (!(presence_penalty >= -2 && presence_penalty <= 2))
    return Status::Errorf("presence_penalty must be in [-2, 2], got {}", presence_penalty);
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2))
    return Status::Errorf("frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  if (!(repetition_penalty > 0 && repetition_penalty <= 10))
    return Status::Errorf("repetition_penalty must be in (0, 10], got {}", repetition_penalty);
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || token >= vocab_size)
      return Status::Errorf("logit_bias: token id {} is outside [0, {})", token, vocab_size);
    if (!(bias >= -100 && bias <= 100))
      return Status::Errorf("logit_bias: bias {} for token {} is outside [-100, 100]", bias, token);
  }
  for (int32_t token : stop_token_ids)
    if (token < 0 || token >= vocab_size)
      return Status::Errorf("stop_token_ids: token id {} is outside [0, {})", token, vocab_size);
  for (int32_t token : allowed_token_ids)
    if (token < 0 || token >= vocab_size)
      return Status::Errorf("allowed_token_ids: token id {} is outside [0, {})", token, vocab_size);
  for (const auto& word : bad_words_token_ids) {
    if (word.empty()) return Status::Error("bad_words: a word without tokens");
    for (int32_t token : word)
      if (token < 0 || token >= vocab_size)
        return Status::Errorf("bad_words: token id {} is outside [0, {})", token, vocab_size);
  }
  for (const auto& s : stop)
    if (s.empty()) return Status::Error("stop: empty strings are not allowed");
  if (stop.size() > 16) return Status::Errorf("stop: at most 16 strings, got {}", stop.size());
  if (max_tokens < 0) return Status::Errorf("max_tokens must be at least 0, got {}", max_tokens);
  if (min_tokens < 0 || min_tokens > max_tokens)
    return Status::Errorf("min_tokens must be in [0, max_tokens = {}], got {}", max_tokens,
                          min_tokens);
  if (grammar && ignore_eos)
    return Status::Error(
        "ignore_eos cannot be combined with structured output (the grammar "
        "decides where the output ends)");
  if (logprobs && (*logprobs < 0 || *logprobs > 20))
    return Status::Errorf("logprobs must be in [0, 20], got {}", *logprobs);
  if (prompt_logprobs && (*prompt_logprobs < 0 || *prompt_logprobs > 20))
    return Status::Errorf("prompt_logprobs must be in [0, 20], got {}", *prompt_logprobs);
  if (thinking_token_budget && *thinking_token_budget < 0)
    return Status::Errorf("thinking_token_budget must be at least 0, got {}",
                          *thinking_token_budget);
  return Status::Ok();
}

ThinkingCount PromptThinking(const std::vector<int32_t>& tokens, int64_t prompt_length,
                             const ThinkTokens& think, bool starts_in_thinking) {
  ThinkingCount count;
  for (int64_t i = 0; i < prompt_length; ++i)
    count.Add(tokens[static_cast<size_t>(i)], think);
  return {count.open || starts_in_thinking, 0};
}

void LogSoftmaxInPlace(float* row, int64_t size) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < size; ++i)
    max = std::max(max, row[i]);
  double sum = 0;
  for (int64_t i = 0; i < size; ++i)
    sum += std::exp(static_cast<double>(row[i] - max));
  const float log_sum = static_cast<float>(std::log(sum)) + max;
  for (int64_t i = 0; i < size; ++i)
    row[i] -= log_sum;
}

std::vector<std::pair<int32_t, float>> TopEntries(const float* row, int64_t size, int64_t count) {
  count = std::min(count, size);
  std::vector<int32_t> ids(static_cast<size_t>(size));
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), better);
  std::vector<std::pair<int32_t, float>> out;
  for (int64_t i = 0; i < count; ++i)
    out.push_back({ids[i], row[ids[i]]});
  return out;
}

double UniformDraw(uint64_t seed, int64_t step, uint64_t stream) {
  uint64_t z = (seed ^ (0xD1B54A32D192ED03ull * stream)) ^
               (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step + 1));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

double TokenDistribution::Prob(int32_t token) const {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == token) return probs[i];
  return 0;
}

int32_t TokenDistribution::Draw(double u) const {
  double target = u;
  for (size_t i = 0; i < tokens.size(); ++i) {
    target -= probs[i];
    if (target < 0) return tokens[i];
  }
  return tokens.back();  // rounding left a sliver past the last candidate
}

TokenDistribution ProcessedDistribution(const float* logits, int64_t vocab,
                                        const SamplingParams& params, const PenaltyState& penalties,
                                        const std::vector<int32_t>& blocked_tokens,
                                        std::vector<float>& scratch) {
  // Processed logits: penalties, bias, masks; then temperature and truncation.
  scratch.assign(logits, logits + vocab);
  float* x = scratch.data();
  if (params.repetition_penalty != 1.0 && !penalties.in_prompt.empty()) {
    const float r = static_cast<float>(params.repetition_penalty);
    for (int64_t t = 0; t < vocab; ++t)
      if (penalties.in_prompt[t]) x[t] = x[t] > 0 ? x[t] / r : x[t] * r;
  }
  for (const auto& [token, count] : penalties.generated_counts) {
    x[token] -= static_cast<float>(params.frequency_penalty * static_cast<double>(count));
    x[token] -= static_cast<float>(params.presence_penalty);
  }
  for (const auto& [token, bias] : params.logit_bias)
    x[token] += static_cast<float>(bias);
  const float minus_inf = -std::numeric_limits<float>::infinity();
  if (!params.allowed_token_ids.empty()) {  // before the blocked ones, which stay blocked
    std::vector<float> allowed;
    for (int32_t token : params.allowed_token_ids)
      allowed.push_back(x[token]);
    std::fill(x, x + vocab, minus_inf);
    for (size_t i = 0; i < allowed.size(); ++i)
      x[params.allowed_token_ids[i]] = allowed[i];
  }
  for (int32_t token : blocked_tokens)
    x[token] = minus_inf;

  TokenDistribution out;
  const int64_t best = std::max_element(x, x + vocab) - x;
  if (x[best] == minus_inf) return out;  // nothing is left to sample
  if (params.temperature == 0) {
    out.tokens = {static_cast<int32_t>(best)};
    out.probs = {1.0};
    return out;
  }
  const float inv_t = static_cast<float>(1.0 / params.temperature);
  for (int64_t t = 0; t < vocab; ++t)
    x[t] *= inv_t;
  // Candidates sorted by processed logit, best first (ties: lower id), then truncated.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  int64_t keep = vocab;
  if (params.top_k > 0) keep = std::min(keep, params.top_k);
  auto better = [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  if (keep < vocab) {
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), better);
    order.resize(static_cast<size_t>(keep));
  } else {
    std::sort(order.begin(), order.end(), better);
  }
  const float top = x[order[0]];
  std::vector<double> probs(order.size());
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i)
    sum += probs[i] = std::exp(double(x[order[i]] - top));
  // Masked tokens (-inf: blocked, banned, not allowed, outside the grammar) are no candidates:
  // kept at probability 0, the draw's rounding fallback (the last candidate) could pick one.
  size_t cut = order.size();
  while (cut > 1 && probs[cut - 1] == 0)
    --cut;
  if (params.min_p > 0) {  // relative to the most likely token
    for (size_t i = 0; i < order.size(); ++i)
      if (probs[i] < params.min_p * probs[0]) {
        cut = std::max<size_t>(i, 1);
        break;
      }
  }
  if (params.top_p < 1) {  // smallest prefix whose mass reaches top_p
    double mass = 0;
    for (size_t i = 0; i < cut; ++i) {
      mass += probs[i] / sum;
      if (mass >= params.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < cut; ++i)
    kept += probs[i];
  out.tokens.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(cut));
  out.probs.resize(cut);
  for (size_t i = 0; i < cut; ++i)
    out.probs[i] = probs[i] / kept;
  return out;
}

uint64_t SamplingSeed(const SamplingParams& params) {
  return params.seed.value_or(0x5EEDull);
}

void FillLogprobs(const float* logits, int64_t vocab, const SamplingParams& params,
                  std::vector<float>& scratch, SampledToken& out) {
  if (!params.logprobs) return;
  scratch.assign(logits, logits + vocab);
  LogSoftmaxInPlace(scratch.data(), vocab);
  out.logprob = scratch[out.token];
  if (*params.logprobs > 0) out.top = TopEntries(scratch.data(), vocab, *params.logprobs);
}

DraftVerdict VerifyDraft(const TokenDistribution& p, int32_t draft, const TokenDistribution& q,
                         uint64_t seed, int64_t step, int64_t vocab,
                         std::vector<float>& dense_scratch) {
  const double pd = p.Prob(draft), qd = q.Prob(draft);
  if (UniformDraw(seed, step, kAcceptStream) * qd < pd) return {draft, true};
  // The residual max(0, p − q), over p's candidates (where p is 0 it is 0).
  dense_scratch.assign(static_cast<size_t>(vocab), 0.0f);
  for (size_t i = 0; i < q.tokens.size(); ++i)
    dense_scratch[static_cast<size_t>(q.tokens[i])] = static_cast<float>(q.probs[i]);
  TokenDistribution residual;
  double total = 0;
  for (size_t i = 0; i < p.tokens.size(); ++i) {
    const double r = p.probs[i] - dense_scratch[static_cast<size_t>(p.tokens[i])];
    if (r > 0) {
      residual.tokens.push_back(p.tokens[i]);
      residual.probs.push_back(r);
      total += r;
    }
  }
  const double u = UniformDraw(seed, step, kResidualStream);
  if (total <= 0) return {p.Draw(u), false};  // p ≤ q everywhere: only rounding gets here
  for (double& r : residual.probs)
    r /= total;
  return {residual.Draw(u), false};
}

std::vector<int32_t> BadWordTokens(const SamplingParams& params, std::span<const int32_t> output) {
  // vLLM's rule: the word's tokens but its last are the output's last ones (none for a one-token
  // word), so the last would complete it. Only the output counts, not the prompt.
  std::vector<int32_t> banned;
  for (const auto& word : params.bad_words_token_ids) {
    const size_t prefix = word.size() - 1;
    if (prefix > output.size()) continue;
    if (std::equal(word.begin(), word.end() - 1,
                   output.end() - static_cast<std::ptrdiff_t>(prefix)))
      banned.push_back(word.back());
  }
  return banned;
}

SampledToken SampleToken(const float* logits, int64_t vocab, const SamplingParams& params,
                         const PenaltyState& penalties, int64_t step,
                         const std::vector<int32_t>& blocked_tokens, std::vector<float>& scratch) {
  const TokenDistribution p =
      ProcessedDistribution(logits, vocab, params, penalties, blocked_tokens, scratch);
  SampledToken out;
  if (p.tokens.empty()) {
    out.token = -1;
    return out;
  }
  out.token = p.tokens.size() == 1 ? p.tokens[0]
                                   : p.Draw(UniformDraw(SamplingSeed(params), step, kTokenStream));
  FillLogprobs(logits, vocab, params, scratch, out);
  return out;
}

}  // namespace sy
