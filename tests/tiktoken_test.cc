// tiktoken vocabularies (tokenizer/tiktoken.h) against the tiktoken library: a vocabulary of
// DeepSeek-V3's tokens with Kimi K2's tokenizer class, ids and decoded text on the tokenizer
// corpus and on inputs Kimi's pattern and run cuts treat specially. Fixtures:
// tests/fixtures/tiktoken, made by tools/tokenizer/make_tiktoken_fixtures.sh. Also the
// malformed files, tokenizer.json's ignore_merges, and Kimi K2's config.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "test_support.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/text_codec.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer.h"

namespace sy {
namespace {

using json = nlohmann::json;

std::string Fixtures() {
  return std::string(testing::kFixturesDir) + "/tiktoken";
}

const Tokenizer& Kimi() {
  static const Tokenizer* tokenizer = [] {
    auto t = Tokenizer::Load(Fixtures());
    EXPECT_TRUE(t.ok()) << t.status().message();
    return new Tokenizer(std::move(t).value());
  }();
  return *tokenizer;
}

constexpr int32_t kRanks = 127997;  // the fixture's tiktoken.model

TEST(TiktokenTest, IdsAndDecodingMatchTiktoken) {
  const Tokenizer& tokenizer = Kimi();
  auto corpus =
      testing::ReadJsonLines(std::string(testing::kFixturesDir) + "/tokenizer/corpus.jsonl");
  for (json& extra : testing::ReadJsonLines(Fixtures() + "/corpus-extra.jsonl"))
    corpus.push_back(extra);
  const auto expected = testing::ReadJsonLines(Fixtures() + "/expected.jsonl");
  ASSERT_EQ(corpus.size(), expected.size());
  ASSERT_GT(corpus.size(), 260u);
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string name = corpus[i]["name"];
    ASSERT_EQ(name, expected[i]["name"]);
    std::string text;
    for (int k = 0; k < corpus[i].value("repeat", 1); ++k)
      text += corpus[i]["text"].get<std::string>();
    auto ids = tokenizer.Encode(text);
    ASSERT_TRUE(ids.ok()) << name << ": " << ids.status().message();
    EXPECT_EQ(*ids, expected[i]["ids"].get<std::vector<int32_t>>()) << name;
    auto decoded = tokenizer.Decode(*ids);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, expected[i].value("decoded", text)) << name;
  }
}

TEST(TiktokenTest, SpecialTokensFollowTheRanks) {
  const Tokenizer& tokenizer = Kimi();
  EXPECT_EQ(tokenizer.vocab_size(), kRanks + 258);
  EXPECT_EQ(tokenizer.TokenToId("[BOS]"), kRanks);
  EXPECT_EQ(tokenizer.TokenToId("<|tool_calls_section_begin|>"), kRanks + 11);
  // Ids tokenizer_config.json does not name are the class's reserved tokens.
  EXPECT_EQ(tokenizer.TokenToId("<|reserved_token_" + std::to_string(kRanks + 5) + "|>"),
            kRanks + 5);
  EXPECT_TRUE(tokenizer.IsSpecial(kRanks + 5));
  EXPECT_FALSE(tokenizer.IsSpecial(kRanks - 1));
  auto decoded = tokenizer.Decode(std::vector<int32_t>{kRanks + 2, 100, kRanks + 3}, true);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->find("<|im"), std::string::npos) << *decoded;
}

TEST(TiktokenTest, TheCheckpointLoadsAsATextCodec) {
  auto codec = TextCodec::Load(Fixtures());
  ASSERT_TRUE(codec.ok()) << codec.status().message();
  EXPECT_EQ(codec->bos_id, kRanks);
  EXPECT_TRUE(codec->config.sort_tool_keys);
  ASSERT_TRUE(codec->chat.has_value()) << codec->chat_status.message();
  auto ids = codec->EncodeChat("Hello");
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  EXPECT_EQ(ids->front(), kRanks + 10);  // <|im_system|>: the template's default system turn
  // The tiktoken.model path names the same tokenizer.
  auto by_file = Tokenizer::Load(Fixtures() + "/tiktoken.model");
  ASSERT_TRUE(by_file.ok()) << by_file.status().message();
  EXPECT_EQ(by_file->vocab_size(), Kimi().vocab_size());
}

// A scratch checkpoint directory with the given tiktoken.model and tokenizer_config.json.
std::string Scratch(const std::string& name, const std::string& model, const std::string& config) {
  const std::string dir = testing::TempDirectory("tiktoken-" + name);
  std::ofstream(dir + "/tiktoken.model") << model;
  std::ofstream(dir + "/tokenizer_config.json") << config;
  return dir;
}

const char* kKimiConfig =
    R"({"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", null]}})";

// The 256 single bytes, ranks 0..255, then `more` lines.
std::string Bytes(const std::string& more = "") {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (int b = 0; b < 256; ++b) {
    const char a = digits[b >> 2], c = digits[(b & 3) << 4];
    out += std::string{a, c, '=', '='} + " " + std::to_string(b) + "\n";
  }
  return out + more;
}

TEST(TiktokenTest, AWellFormedSmallVocabularyWorks) {
  // "ab" (rank 256) and "abc" (257): "abc" is whole; "abab" merges pairwise.
  auto t = Tokenizer::Load(Scratch("small", Bytes("YWI= 256\nYWJj 257\n"), kKimiConfig));
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*t->Encode("abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(*t->Encode("abab"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(t->vocab_size(), 258 + 258);
}

TEST(TiktokenTest, MalformedFilesAreNamedErrors) {
  struct Case {
    std::string name, model, config, words;
  };
  const std::vector<Case> cases = {
      {"bad-base64", Bytes("!!!! 256\n"), kKimiConfig,
       "tiktoken.model:257: \"!!!!\" is not base64"},
      {"bad-rank", Bytes("YWI= x\n"), kKimiConfig, "tiktoken.model:257: rank \"x\""},
      {"one-field", Bytes("YWI=\n"), kKimiConfig, "tiktoken.model:257: expected"},
      {"rank-twice", Bytes("YWI= 255\n"), kKimiConfig, "rank 255 is given twice"},
      {"rank-gap", Bytes("YWI= 300\n"), kKimiConfig, "ranks must be 0..N-1"},
      {"token-twice", Bytes("YQ== 256\n"), kKimiConfig, "are the same token"},
      {"empty", "", kKimiConfig, "no tokens"},
      {"unknown-class", Bytes(), R"({"tokenizer_class": "Qwen2Tokenizer"})",
       "tokenizer class \"Qwen2Tokenizer\" is not supported"},
      {"no-class", Bytes(), "{}", "tokenizer class \"(none)\""},
      {"bad-config", Bytes(), "{", "not valid JSON"},
      {"bad-added", Bytes(),
       R"({"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer"]},
           "added_tokens_decoder": {"x1": {"content": "[BOS]"}}})",
       "added_tokens_decoder[\"x1\"]: the key is not a token id"},
      {"huge-added-id", Bytes(),
       R"({"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer"]},
           "added_tokens_decoder": {"99999999": {"content": "[X]"}}})",
       "outside"},
  };
  for (const Case& c : cases) {
    auto t = Tokenizer::Load(Scratch(c.name, c.model, c.config));
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_NE(t.status().message().find(c.words), std::string::npos)
        << c.name << ": " << t.status().message();
  }
  const std::string no_config = Scratch("no-config", Bytes(), "");
  std::filesystem::remove(no_config + "/tokenizer_config.json");
  auto missing = Tokenizer::Load(no_config);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);
}

TEST(TiktokenTest, TokenizerJsonIgnoreMergesTakesWholePieces) {
  // "abc" is in the vocabulary but no merge makes it: with ignore_merges (Llama 3's files) the
  // piece is that token; without, it stays in bytes.
  auto make = [](bool ignore) {
    json spec = {{"model",
                  {{"type", "BPE"},
                   {"ignore_merges", ignore},
                   {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"abc", 3}}},
                   {"merges", json::array()}}},
                 {"pre_tokenizer", nullptr},
                 {"decoder", {{"type", "ByteLevel"}}}};
    return Tokenizer::FromJson(spec.dump(), "inline");
  };
  auto with = make(true), without = make(false);
  ASSERT_TRUE(with.ok()) << with.status().message();
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(*with->Encode("abc"), (std::vector<int32_t>{3}));
  EXPECT_EQ(*without->Encode("abc"), (std::vector<int32_t>{0, 1, 2}));
}

TEST(TiktokenTest, GgufKnowsKimisPreTokenizer) {
  auto regexes = GgufPreTokenizerRegexes("kimi-k2");
  ASSERT_TRUE(regexes.ok()) << regexes.status().message();
  EXPECT_EQ(regexes->front(), std::string(kKimiK2Pattern));
}

TEST(TiktokenTest, KimiK2ConfigIsDeepSeekV3) {
  // Kimi K2's config.json shape (smaller sizes): model_type kimi_k2, DeepSeek-V3's fields.
  const std::string config = R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
    "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128,
    "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827,
    "norm_topk_prob": true, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "rope_theta": 50000.0, "rms_norm_eps": 1e-6,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "tie_word_embeddings": false,
    "max_position_embeddings": 4096, "bos_token_id": 1000, "eos_token_id": 1001,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"}})";
  auto parsed = ParseModelConfig(config, "kimi.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->model_type, "kimi_k2");
  EXPECT_EQ(parsed->scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(parsed->topk_method, TopkMethod::kNoauxTc);
  auto written = json::parse(ModelConfigToJson(*parsed));
  EXPECT_EQ(written["architectures"][0], "DeepseekV3ForCausalLM");
  EXPECT_EQ(written["model_type"], "kimi_k2");
  auto other = ParseModelConfig(R"({"model_type": "qwen3_moe"})", "qwen3.json");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("supported: deepseek_v3, deepseek_v2, kimi_k2"),
            std::string::npos);
}

// Kimi K2 ends chat turns with <|im_end|>, which only generation_config.json names as an end of
// sequence: generation stops on it as on config.json's eos_token_id.
TEST(TiktokenTest, GenerationConfigEosIdsEndSequencesToo) {
  ModelConfig config;
  config.vocab_size = 1000;
  config.eos_token_id = 900;
  const std::string dir = testing::TempDirectory("generation-config");
  EXPECT_TRUE(ReadGenerationConfig(dir, &config).ok());  // none: nothing changes
  EXPECT_TRUE(config.generation_eos_token_ids.empty());
  testing::WriteFile(dir + "/generation_config.json", R"({"eos_token_id": [900, 901, 902]})");
  ASSERT_TRUE(ReadGenerationConfig(dir, &config).ok());
  EXPECT_EQ(config.generation_eos_token_ids, (std::vector<int64_t>{901, 902}));
  EXPECT_TRUE(config.IsEos(900) && config.IsEos(901) && config.IsEos(902));
  EXPECT_FALSE(config.IsEos(903));
  testing::WriteFile(dir + "/generation_config.json", R"({"eos_token_id": 903, "top_p": 0.9})");
  ASSERT_TRUE(ReadGenerationConfig(dir, &config).ok());
  EXPECT_EQ(config.generation_eos_token_ids, (std::vector<int64_t>{903}));
  for (const char* bad : {R"({"eos_token_id": 1000})", R"({"eos_token_id": ["x"]})", "[1]", "{"}) {
    testing::WriteFile(dir + "/generation_config.json", bad);
    const Status s = ReadGenerationConfig(dir, &config);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("generation_config.json"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace sy
