// OpenAI request planning (serve/openai_api.h) without a model: what a completions or chat body
// becomes for the engine, and how what is refused is named. The wire behaviour against the
// official openai client is tests/serve/test_openai_client.py and its neighbours.
#include "serve/openai_api.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

namespace sy::serve {
namespace {

using json = nlohmann::ordered_json;

const std::string kV3 = std::string(SY_FIXTURES_DIR) + "/tokenizer/deepseek-v3";

const TextCodec& Codec(const std::string& dir = kV3) {
  static std::map<std::string, TextCodec> loaded;
  auto it = loaded.find(dir);
  if (it == loaded.end()) {
    auto c = TextCodec::Load(dir);
    EXPECT_TRUE(c.ok()) << c.status().message();
    it = loaded.emplace(dir, std::move(c).value()).first;
  }
  return it->second;
}

ServingLimits Limits() {
  ServingLimits limits;
  limits.model_name = "sy-test";
  limits.max_model_len = 4096;
  limits.cache_tokens = 8192;
  return limits;
}

ParsedRequest Parse(Endpoint endpoint, const json& body, const ServingLimits& limits = Limits(),
                    const TextCodec& codec = Codec()) {
  return ParseGenerationRequest(endpoint, body.dump(), codec, limits);
}

// The ids HF tokenizers gives a corpus line (tests/fixtures/tokenizer, tools/tokenizer).
std::vector<int32_t> ExpectedIds(const std::string& name) {
  std::ifstream in(kV3 + "/expected.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const json entry = json::parse(line);
    if (entry["name"] == name) return entry["ids"].get<std::vector<int32_t>>();
  }
  ADD_FAILURE() << "no corpus line " << name;
  return {};
}

// DeepSeek's fill in the middle (its API's completions with `suffix`): each text prompt is the
// prefix of "<｜fim▁begin｜>prefix<｜fim▁hole｜>suffix<｜fim▁end｜>", tokenized as HF tokenizers
// tokenizes that string (the corpus's special_fim line), with BOS where the config asks for it as
// for any completions prompt (V3's does not: add_bos_token false).
TEST(OpenAiApiTest, SuffixMakesAFillInTheMiddlePrompt) {
  std::vector<int32_t> want = ExpectedIds("special_fim");
  ASSERT_FALSE(want.empty());
  if (Codec().config.add_bos_token) want.insert(want.begin(), *Codec().bos_id);
  const ParsedRequest fim = Parse(
      Endpoint::kCompletions,
      {{"prompt", {"def f():", "def f():"}}, {"suffix", "\n    return 1"}, {"max_tokens", 8}});
  ASSERT_TRUE(fim.plan) << fim.error.message;
  ASSERT_EQ(fim.plan->prompts.size(), 2u);
  EXPECT_EQ(fim.plan->prompts[0], want);
  EXPECT_EQ(fim.plan->prompts[1], want);
  // Refused by name: a suffix that is not a string, with echo (what would it echo?), with token
  // id prompts, and where the tokenizer has no FIM tokens.
  const std::vector<std::pair<json, std::string>> refused = {
      {{{"prompt", "x"}, {"suffix", 3}}, "must be a string"},
      {{{"prompt", "x"}, {"suffix", "y"}, {"echo", true}}, "echo"},
      {{{"prompt", {1, 2}}, {"suffix", "y"}}, "token ids"},
  };
  for (const auto& [body, words] : refused) {
    const ParsedRequest out = Parse(Endpoint::kCompletions, body);
    ASSERT_FALSE(out.plan) << body.dump();
    EXPECT_EQ(out.error.param, "suffix") << body.dump();
    EXPECT_NE(out.error.message.find(words), std::string::npos) << out.error.message;
  }
  const ParsedRequest none = Parse(Endpoint::kCompletions, {{"prompt", "x"}, {"suffix", "y"}},
                                   Limits(), Codec(std::string(SY_SOURCE_DIR) + "/models/default"));
  ASSERT_FALSE(none.plan);
  EXPECT_EQ(none.error.param, "suffix");
  EXPECT_NE(none.error.message.find("fill-in-the-middle"), std::string::npos) << none.error.message;
  // Without a suffix the prompt is the text itself.
  const ParsedRequest plain = Parse(Endpoint::kCompletions, {{"prompt", "def f():"}});
  ASSERT_TRUE(plain.plan) << plain.error.message;
  EXPECT_EQ(plain.plan->prompts[0], *Codec().EncodePrompt("def f():"));
}

// vLLM's thinking_token_budget: read on both endpoints (-1 is none), refused out of range; on
// the chat path the output starts inside the thinking where the reasoning parser says it does
// (R1's: whenever the prompt did not close it), which the engine cannot see in the prompt.
TEST(OpenAiApiTest, ThinkingTokenBudgetIsReadAndPlaced) {
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChat}) {
    json body = endpoint == Endpoint::kChat ? chat : json{{"prompt", "hi"}};
    body["thinking_token_budget"] = 12;
    ParsedRequest out = Parse(endpoint, body);
    ASSERT_TRUE(out.plan) << out.error.message;
    EXPECT_EQ(out.plan->params.thinking_token_budget, 12);
    EXPECT_FALSE(out.plan->params.starts_in_thinking);  // no reasoning parser
    body["thinking_token_budget"] = -1;
    out = Parse(endpoint, body);
    ASSERT_TRUE(out.plan) << out.error.message;
    EXPECT_FALSE(out.plan->params.thinking_token_budget.has_value());
    for (const json& bad : {json(-2), json(2.5), json("3")}) {
      body["thinking_token_budget"] = bad;
      out = Parse(endpoint, body);
      ASSERT_FALSE(out.plan) << bad.dump();
      EXPECT_EQ(out.error.param, "thinking_token_budget");
    }
  }
  ServingLimits r1 = Limits();
  r1.reasoning = chat_output::ReasoningFormat::kDeepSeekR1;
  json body = chat;
  body["thinking_token_budget"] = 0;
  const ParsedRequest out = Parse(Endpoint::kChat, body, r1);
  ASSERT_TRUE(out.plan) << out.error.message;
  EXPECT_TRUE(out.plan->params.starts_in_thinking);
  EXPECT_EQ(out.plan->params.thinking_token_budget, 0);
}

// OpenAI's service_tier: priorities where the engine schedules by them ("priority" before the
// default tier, "flex" after, an explicit priority ruling), else every tier served as the default
// one — and the plan says which tier was served.
TEST(OpenAiApiTest, ServiceTiersArePrioritiesWhereTheEngineHasThem) {
  ServingLimits by_priority = Limits();
  by_priority.priority_scheduling = true;
  auto plan = [&](const json& extra, const ServingLimits& limits) {
    json body = {{"prompt", "hi"}};
    body.update(extra);
    const ParsedRequest out = Parse(Endpoint::kCompletions, body, limits);
    EXPECT_TRUE(out.plan) << out.error.message;
    return out.plan ? std::pair(out.plan->priority, out.plan->service_tier)
                    : std::pair(int64_t{99}, std::string("?"));
  };
  using Served = std::pair<int64_t, std::string>;
  EXPECT_EQ(plan(json::object(), by_priority), Served(0, ""));
  EXPECT_EQ(plan({{"service_tier", "priority"}}, by_priority), Served(-1, "priority"));
  EXPECT_EQ(plan({{"service_tier", "flex"}}, by_priority), Served(1, "flex"));
  EXPECT_EQ(plan({{"service_tier", "auto"}}, by_priority), Served(0, "default"));
  EXPECT_EQ(plan({{"service_tier", "flex"}, {"priority", -7}}, by_priority), Served(-7, "flex"));
  EXPECT_EQ(plan({{"service_tier", "priority"}}, Limits()), Served(0, "default"));
  EXPECT_EQ(plan({{"service_tier", "flex"}}, Limits()), Served(0, "default"));
  const ParsedRequest bad =
      Parse(Endpoint::kCompletions, {{"prompt", "hi"}, {"service_tier", "gold"}});
  ASSERT_FALSE(bad.plan);
  EXPECT_EQ(bad.error.param, "service_tier");
}

// reasoning_effort (chat) is its level's thinking budget: none is 0 and the others unbounded by
// default, --reasoning-effort-budgets sets levels; an explicit thinking_token_budget rules.
TEST(OpenAiApiTest, ReasoningEffortIsALevelsThinkingBudget) {
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto budget = [&](const json& extra, const ServingLimits& limits = Limits()) {
    json body = chat;
    body.update(extra);
    const ParsedRequest out = Parse(Endpoint::kChat, body, limits);
    EXPECT_TRUE(out.plan) << out.error.message;
    return out.plan ? out.plan->params.thinking_token_budget : std::nullopt;
  };
  EXPECT_EQ(budget({{"reasoning_effort", "none"}}), 0);
  EXPECT_EQ(budget({{"reasoning_effort", "high"}}), std::nullopt);
  EXPECT_EQ(budget({{"reasoning_effort", "none"}, {"thinking_token_budget", -1}}), std::nullopt);
  EXPECT_EQ(budget({{"reasoning_effort", "none"}, {"thinking_token_budget", 9}}), 9);
  ServingLimits set = Limits();
  ASSERT_TRUE(ParseEffortBudgets("low=64,high=4096,none=-1", &set.effort_budgets).ok());
  EXPECT_EQ(budget({{"reasoning_effort", "low"}}, set), 64);
  EXPECT_EQ(budget({{"reasoning_effort", "high"}}, set), 4096);
  EXPECT_EQ(budget({{"reasoning_effort", "medium"}}, set), std::nullopt);  // still the default
  EXPECT_EQ(budget({{"reasoning_effort", "none"}}, set), std::nullopt);
  for (const json& bad : {json("extreme"), json(3)}) {
    json body = chat;
    body["reasoning_effort"] = bad;
    const ParsedRequest out = Parse(Endpoint::kChat, body);
    ASSERT_FALSE(out.plan) << bad.dump();
    EXPECT_EQ(out.error.param, "reasoning_effort");
    EXPECT_NE(out.error.message.find("high, low, max, medium, minimal, none, xhigh"),
              std::string::npos)
        << out.error.message;
  }
  // Bad flag entries are named.
  for (const char* text : {"low", "=3", "low=", "low=x", "low=3x", "low=-2", "low=1,", ""}) {
    std::map<std::string, int64_t> budgets;
    const Status s = ParseEffortBudgets(text, &budgets);
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_NE(s.message().find("--reasoning-effort-budgets"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace sy::serve

namespace sy::serve {
namespace {

// bad_words: each word tokenized as it starts a text and after a space, the spaced form kept
// unless the plain form already covers it (equal, or its tail); duplicates once. Unlike vLLM's
// rule, a spaced form of another length is kept: with DeepSeek's byte-level BPE " Romeo" and
// "Romeo" differ in length, and the word must be banned mid-text too. allowed_token_ids passes
// through. Both are refused by field when malformed.
TEST(OpenAiApiTest, BadWordsBecomeTokenSequencesForTheWordAloneAndAfterASpace) {
  const Tokenizer& tokenizer = *Codec().tokenizer;
  auto ids = [&](const std::string& text) { return tokenizer.Encode(text).value(); };
  std::vector<std::vector<int32_t>> want;
  bool other_length = false, covered = false;
  for (const std::string word : {"Romeo", "hello world", "zqxjkv", "123"}) {
    const auto plain = ids(word), spaced = ids(" " + word);
    want.push_back(plain);
    const bool ends_with_plain =
        spaced.size() >= plain.size() &&
        std::equal(plain.begin(), plain.end(), spaced.end() - static_cast<long>(plain.size()));
    if (!ends_with_plain) want.push_back(spaced);
    other_length = other_length || (!ends_with_plain && spaced.size() != plain.size());
    covered = covered || ends_with_plain;
  }
  // The test means something: a spaced form of another length is kept, and one is covered.
  ASSERT_TRUE(other_length);
  ASSERT_TRUE(covered);
  json body = {{"model", "sy-test"},
               {"prompt", "x"},
               {"bad_words", {"Romeo", "  hello world", "zqxjkv", "123", "Romeo"}},
               {"allowed_token_ids", {5, 6, 7}}};
  ParsedRequest out = Parse(Endpoint::kCompletions, body);
  ASSERT_TRUE(out.plan) << out.error.message;
  EXPECT_EQ(out.plan->params.bad_words_token_ids, want);
  EXPECT_EQ(out.plan->params.allowed_token_ids, (std::vector<int32_t>{5, 6, 7}));
  body["messages"] = {{{"role", "user"}, {"content", "hi"}}};
  body.erase("prompt");
  out = Parse(Endpoint::kChat, body);
  ASSERT_TRUE(out.plan) << out.error.message;
  EXPECT_EQ(out.plan->params.bad_words_token_ids, want);

  const std::vector<std::pair<json, std::string>> refused = {
      {{{"bad_words", "Romeo"}}, "bad_words"},
      {{{"bad_words", {"ok", ""}}}, "bad_words"},
      {{{"bad_words", {"ok", 3}}}, "bad_words"},
      {{{"bad_words", {"   "}}}, "bad_words"},
      {{{"allowed_token_ids", json::array()}}, "allowed_token_ids"},
      {{{"allowed_token_ids", {1, -2}}}, "allowed_token_ids"},
      {{{"allowed_token_ids", {1 << 30}}}, "allowed_token_ids"},
  };
  for (const auto& [fields, param] : refused) {
    json bad = {{"model", "sy-test"}, {"prompt", "x"}};
    bad.update(fields);
    const ParsedRequest r = Parse(Endpoint::kCompletions, bad);
    EXPECT_FALSE(r.plan) << bad.dump();
    EXPECT_EQ(r.error.param, param) << bad.dump() << ": " << r.error.message;
  }
  // More than 128 sequences after tokenization.
  json many = {{"model", "sy-test"}, {"prompt", "x"}, {"bad_words", json::array()}};
  for (int i = 0; i < 130; ++i)
    many["bad_words"].push_back("w" + std::to_string(i));
  const ParsedRequest r = Parse(Endpoint::kCompletions, many);
  EXPECT_FALSE(r.plan);
  EXPECT_NE(r.error.message.find("at most 128"), std::string::npos) << r.error.message;
}

}  // namespace
}  // namespace sy::serve
