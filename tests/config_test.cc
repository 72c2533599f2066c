#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/rope.h"
#include "model/synthetic.h"
#include "test_support.h"

namespace sy {
namespace {

std::string FixtureConfig(const std::string& name) {
  return testing::ReadFile(std::string(testing::kFixturesDir) + "/" + name + "/config.json");
}

Result<ModelConfig> ParseEdited(const std::function<void(nlohmann::json&)>& edit) {
  auto json = nlohmann::json::parse(FixtureConfig("tiny-v3-fp8"));
  edit(json);
  return ParseModelConfig(json.dump(), "config.json");
}

TEST(ConfigTest, ParsesTheTinyV3Config) {
  auto config = ParseModelConfig(FixtureConfig("tiny-v3-fp8"), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().message();
  const ModelConfig& c = config.value();
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
  ASSERT_TRUE(c.yarn.has_value());
  EXPECT_DOUBLE_EQ(c.yarn->factor, 40.0);  // an integer in the JSON, read as a float
  EXPECT_TRUE(c.fp8_weights);
  EXPECT_EQ(c.weight_block_rows, 128);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_FALSE(c.IsMoeLayer(0));
  EXPECT_TRUE(c.IsMoeLayer(1));
}

TEST(ConfigTest, QLoraNullMeansQProj) {
  auto config = ParseModelConfig(FixtureConfig("tiny-v3-qproj-f16"), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_FALSE(config.value().q_lora_rank.has_value());
  EXPECT_FALSE(config.value().yarn.has_value());
}

TEST(ConfigTest, V2DefaultsToSoftmax) {
  auto config = ParseModelConfig(FixtureConfig("tiny-v2-f32"), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config.value().scoring_func, ScoringFunc::kSoftmax);
  EXPECT_EQ(config.value().topk_method, TopkMethod::kGroupLimitedGreedy);
}

// Kimi K2.5: the language model's config in text_config (its quantization_config there or at
// the top), read as the model's; a malformed wrapper is named.
TEST(ConfigTest, KimiK25ReadsItsTextConfig) {
  auto text = nlohmann::json::parse(FixtureConfig("tiny-v3-fp8"));
  text["model_type"] = "kimi_k2";
  nlohmann::json wrapper = {{"model_type", "kimi_k25"},
                            {"text_config", text},
                            {"vision_config", {{"hidden_size", 1152}}}};
  auto config = ParseModelConfig(wrapper.dump(), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config.value().wrapper_type, "kimi_k25");
  EXPECT_EQ(config.value().model_type, "kimi_k2");
  EXPECT_EQ(config.value().checkpoint_prefix, "language_model.");
  EXPECT_EQ(config.value().hidden_size, 256);
  EXPECT_TRUE(config.value().fp8_weights);

  nlohmann::json top = wrapper;
  top["quantization_config"] = text["quantization_config"];
  top["text_config"].erase("quantization_config");
  top["eos_token_id"] = 999;
  top["text_config"].erase("eos_token_id");
  top["bos_token_id"] = 5;  // text_config's own wins
  config = ParseModelConfig(top.dump(), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_TRUE(config.value().fp8_weights);
  EXPECT_EQ(config.value().eos_token_id, 999);
  EXPECT_EQ(config.value().bos_token_id, text["bos_token_id"].get<int64_t>());

  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> bad = {
      {[](auto& j) { j.erase("text_config"); }, "needs a 'text_config' object"},
      {[](auto& j) { j["text_config"] = "deepseek_v3"; }, "needs a 'text_config' object"},
      {[](auto& j) { j["text_config"].erase("kv_lora_rank"); },
       "config.json: text_config: field 'kv_lora_rank' is missing"},
      {[](auto& j) { j["text_config"]["model_type"] = "qwen3_moe"; },
       "text_config: field 'model_type' is 'qwen3_moe'"},
      {[&](auto& j) { j["text_config"] = wrapper; }, "text_config is itself a kimi_k25 wrapper"},
  };
  for (const auto& [edit, message] : bad) {
    nlohmann::json broken = wrapper;
    edit(broken);
    auto result = ParseModelConfig(broken.dump(), "config.json");
    ASSERT_FALSE(result.ok()) << message;
    EXPECT_NE(result.status().message().find(message), std::string::npos)
        << result.status().message();
  }
}

TEST(ConfigTest, MissingFieldIsNamed) {
  auto config = ParseEdited([](auto& j) { j.erase("kv_lora_rank"); });
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("'kv_lora_rank' is missing"), std::string::npos)
      << config.status().message();
}

TEST(ConfigTest, UnsupportedValuesAreRejectedByName) {
  struct Edit {
    std::function<void(nlohmann::json&)> edit;
    std::string field;
  };
  std::vector<Edit> edits = {
      {[](auto& j) { j["scoring_func"] = "relu"; }, "scoring_func"},
      {[](auto& j) { j["topk_method"] = "magic"; }, "topk_method"},
      {[](auto& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {[](auto& j) { j["num_key_value_heads"] = 2; }, "num_key_value_heads"},
      {[](auto& j) { j["n_group"] = 3; }, "n_group"},
      {[](auto& j) { j["topk_group"] = 9; }, "topk_group"},
      {[](auto& j) { j["num_experts_per_tok"] = 0; }, "num_experts_per_tok"},
      {[](auto& j) { j["qk_rope_head_dim"] = 15; }, "qk_rope_head_dim"},
      {[](auto& j) { j["hidden_size"] = "big"; }, "hidden_size"},
      {[](auto& j) { j["rope_scaling"]["type"] = "ntk"; }, "rope_scaling.type"},
      {[](auto& j) { j["quantization_config"]["quant_method"] = "bitsandbytes"; }, "quant_method"},
      {[](auto& j) { j["quantization_config"].erase("weight_block_size"); }, "weight_block_size"},
      {[](auto& j) { j["tie_word_embeddings"] = true; }, "tie_word_embeddings"},
      {[](auto& j) { j["model_type"] = "llama"; }, "model_type"},
      {[](auto& j) { j["rope_interleave"] = false; }, "rope_interleave"},
      // A count that would be walked layer by layer (the GGUF fuzzer's block_count of 2^40 hung).
      {[](auto& j) { j["num_hidden_layers"] = int64_t{1} << 40; }, "num_hidden_layers"},
      {[](auto& j) { j["num_nextn_predict_layers"] = int64_t{1} << 40; },
       "num_nextn_predict_layers"},
  };
  for (const auto& e : edits) {
    auto config = ParseEdited(e.edit);
    ASSERT_FALSE(config.ok()) << e.field;
    EXPECT_NE(config.status().message().find(e.field), std::string::npos)
        << config.status().message();
    EXPECT_EQ(config.status().message().find('\n'), std::string::npos);
  }
}

// Integers may be written as integral floats (4096.0); numbers past int64's range are refused by
// name rather than converted (a double such as 1.2e69 has no defined conversion: the hf_int4
// fuzzer found one in group_size).
TEST(ConfigTest, IntegerFieldsTakeIntegralFloatsAndRefuseOutOfRange) {
  auto config = ParseEdited([](auto& j) { j["hidden_size"] = 256.0; });
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config.value().hidden_size, 256);
  for (const char* text : {"1.2e69", "-1e300", "18446744073709551615", "9223372036854775808.0"}) {
    SCOPED_TRACE(text);
    config = ParseEdited([&](auto& j) { j["hidden_size"] = nlohmann::json::parse(text); });
    ASSERT_FALSE(config.ok());
    EXPECT_NE(config.status().message().find("'hidden_size' is out of range"), std::string::npos)
        << config.status().message();
  }
  config = ParseEdited([](auto& j) { j["hidden_size"] = 256.5; });
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("'hidden_size' must be an integer"), std::string::npos)
      << config.status().message();
}

TEST(ConfigTest, NotJsonIsAnError) {
  EXPECT_FALSE(ParseModelConfig("{", "config.json").ok());
  EXPECT_FALSE(ParseModelConfig("[]", "config.json").ok());
}

TEST(ConfigTest, WrittenConfigParsesBack) {
  ModelConfig c = SmallModelConfig();
  auto back = ParseModelConfig(ModelConfigToJson(c), "generated");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back.value().hidden_size, c.hidden_size);
  EXPECT_EQ(back.value().q_lora_rank, c.q_lora_rank);
  EXPECT_EQ(back.value().fp8_weights, c.fp8_weights);
}

// The spec's worked YaRN numbers for ds3-tiny (§9.1): d = 16, low = 2, high = 6.
TEST(RopeTest, YarnMatchesTheSpec) {
  auto config = ParseModelConfig(FixtureConfig("tiny-v3-bf16"), "config.json");
  ASSERT_TRUE(config.ok());
  RopeParams rope = ComputeRopeParams(config.value());
  const double expected[] = {1,        0.316227766,     0.1,     0.02391472481,
                             0.005125, 0.0008498621212, 2.5e-05, 7.90569415e-06};
  ASSERT_EQ(rope.inv_freq.size(), 8u);
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(rope.inv_freq[i], expected[i], 1e-6 * expected[i] + 1e-12) << i;
  EXPECT_NEAR(rope.softmax_scale, 0.2704675577, 1e-7);
  EXPECT_FLOAT_EQ(rope.attention_factor, 1.0f);
}

// DeepSeek-V3's own numbers (§5.5, §6): scale 0.135233779, ω'_10 = 0.0562341325, ω'_23 = 2.5e-5/..
TEST(RopeTest, DeepSeekV3Values) {
  ModelConfig c = SmallModelConfig();
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  RopeParams rope = ComputeRopeParams(c);
  EXPECT_NEAR(rope.softmax_scale, 0.135233779, 1e-7);
  EXPECT_NEAR(rope.inv_freq[10], 5.62341325e-02, 1e-8);
  EXPECT_NEAR(rope.inv_freq[16], 5.5e-03, 1e-9);
  EXPECT_NEAR(rope.inv_freq[31], 3.33380358e-06, 1e-12);
}

TEST(RopeTest, KvBytesPerTokenOfDeepSeekV3) {
  ModelConfig c = SmallModelConfig();
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  c.num_hidden_layers = 61;
  EXPECT_EQ(c.latent_cache_width() * 2 * c.num_hidden_layers, 70272);
}

}  // namespace
}  // namespace sy
