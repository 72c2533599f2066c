// Damaged checkpoints and bad requests: each gives a one-line error naming the file, tensor or
// field, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "test_support.h"

namespace sy {
namespace {

namespace fs = std::filesystem;

std::string CopyFixture(const std::string& fixture, const std::string& name) {
  std::string dir = testing::TempDirectory(name);
  testing::CopyDirectory(std::string(testing::kFixturesDir) + "/" + fixture, dir);
  return dir;
}

std::string LoadError(const std::string& dir) {
  auto model = Model::Load(dir);
  return model.ok() ? "" : model.status().message();
}

void ExpectOneLineMentioning(const std::string& error, const std::vector<std::string>& parts) {
  ASSERT_FALSE(error.empty());
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  for (const auto& part : parts)
    EXPECT_NE(error.find(part), std::string::npos) << error;
}

TEST(BadCheckpointTest, TruncatedFile) {
  std::string dir = CopyFixture("tiny-v3-fp8", "truncated");
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") / 2);
  ExpectOneLineMentioning(LoadError(dir), {"model.safetensors", "truncated"});
}

TEST(BadCheckpointTest, CorruptHeader) {
  std::string dir = CopyFixture("tiny-v3-fp8", "corrupt");
  std::string bytes = testing::ReadFile(dir + "/model.safetensors");
  for (int i = 8; i < 40; ++i)
    bytes[i] = '#';
  testing::WriteFile(dir + "/model.safetensors", bytes);
  ExpectOneLineMentioning(LoadError(dir), {"model.safetensors", "JSON"});
}

// Rewrites the checkpoint's header through a JSON edit, keeping the data section as it is.
void EditHeader(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  std::string bytes = testing::ReadFile(path);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = (length << 8) | static_cast<uint8_t>(bytes[i]);
  auto header = nlohmann::json::parse(bytes.substr(8, length));
  edit(header);
  std::string text = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  testing::WriteFile(path, out + text + bytes.substr(8 + length));
}

TEST(BadCheckpointTest, OffsetsOutOfRange) {
  std::string dir = CopyFixture("tiny-v3-fp8", "offsets");
  EditHeader(dir + "/model.safetensors",
             [](auto& h) { h["model.norm.weight"]["data_offsets"][1] = 999999999; });
  ExpectOneLineMentioning(LoadError(dir), {"model.safetensors", "model.norm.weight"});
}

TEST(BadCheckpointTest, OverlappingTensors) {
  std::string dir = CopyFixture("tiny-v3-fp8", "overlap");
  EditHeader(dir + "/model.safetensors", [](auto& h) {
    h["model.norm.weight"]["data_offsets"] = h["lm_head.weight"]["data_offsets"];
    h["model.norm.weight"]["shape"] = h["lm_head.weight"]["shape"];
    h["model.norm.weight"]["dtype"] = h["lm_head.weight"]["dtype"];
  });
  ExpectOneLineMentioning(LoadError(dir), {"overlap", "model.norm.weight"});
}

TEST(BadCheckpointTest, UnknownDtype) {
  std::string dir = CopyFixture("tiny-v3-fp8", "dtype");
  EditHeader(dir + "/model.safetensors", [](auto& h) { h["model.norm.weight"]["dtype"] = "Q8"; });
  ExpectOneLineMentioning(LoadError(dir), {"model.norm.weight", "unknown dtype 'Q8'"});
}

TEST(BadCheckpointTest, UnusableDtype) {
  std::string dir = CopyFixture("tiny-v3-fp8", "i32");
  EditHeader(dir + "/model.safetensors", [](auto& h) { h["model.norm.weight"]["dtype"] = "I32"; });
  ExpectOneLineMentioning(LoadError(dir), {"model.norm.weight", "I32"});
}

TEST(BadCheckpointTest, MissingTensor) {
  std::string dir = CopyFixture("tiny-v3-fp8", "missing");
  EditHeader(dir + "/model.safetensors", [](auto& h) {
    h["model.layers.2.mlp.experts.7.up_proj.weight_renamed"] =
        h["model.layers.2.mlp.experts.7.up_proj.weight"];
    h.erase("model.layers.2.mlp.experts.7.up_proj.weight");
  });
  ExpectOneLineMentioning(LoadError(dir),
                          {"model.layers.2.mlp.experts.7.up_proj.weight", "missing"});
}

TEST(BadCheckpointTest, MissingScale) {
  std::string dir = CopyFixture("tiny-v3-fp8", "scale");
  EditHeader(dir + "/model.safetensors", [](auto& h) {
    h["x"] = h["model.layers.0.self_attn.o_proj.weight_scale_inv"];
    h.erase("model.layers.0.self_attn.o_proj.weight_scale_inv");
  });
  ExpectOneLineMentioning(LoadError(dir),
                          {"model.layers.0.self_attn.o_proj.weight_scale_inv", "missing"});
}

TEST(BadCheckpointTest, ShapeDisagreesWithConfig) {
  std::string dir = CopyFixture("tiny-v3-fp8", "shape");
  auto config = nlohmann::json::parse(testing::ReadFile(dir + "/config.json"));
  config["kv_lora_rank"] = 48;
  testing::WriteFile(dir + "/config.json", config.dump());
  ExpectOneLineMentioning(LoadError(dir), {"kv_a_proj_with_mqa", "shape", "config.json implies"});
}

TEST(BadCheckpointTest, Fp8WithoutQuantizationConfig) {
  std::string dir = CopyFixture("tiny-v3-fp8", "noquant");
  auto config = nlohmann::json::parse(testing::ReadFile(dir + "/config.json"));
  config.erase("quantization_config");
  testing::WriteFile(dir + "/config.json", config.dump());
  ExpectOneLineMentioning(LoadError(dir), {"F8_E4M3", "quantization_config"});
}

TEST(BadCheckpointTest, MissingConfig) {
  std::string dir = CopyFixture("tiny-v3-fp8", "noconfig");
  fs::remove(dir + "/config.json");
  ExpectOneLineMentioning(LoadError(dir), {"config.json"});
}

TEST(BadRequestTest, TokenIdsOutsideTheVocabularyAndEmptySequences) {
  auto model = Model::Load(std::string(testing::kFixturesDir) + "/tiny-v3-fp8");
  ASSERT_TRUE(model.ok());
  LatentCache cache = model.value()->NewCache(64, 2, DType::kBF16);
  SequenceCache a, b;
  ForwardBatch batch;
  const int32_t good[] = {3, 4};
  const int32_t bad[] = {5, 1000};
  batch.Add(good, 2, &a);
  batch.Add(bad, 2, &b);
  std::vector<float> logits;
  Status status = model.value()->Forward(batch, cache, {}, &logits);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("token id 1000"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("sequence 1"), std::string::npos) << status.message();
  // Nothing was reserved: the cache is as it was.
  EXPECT_EQ(a.length, 0);
  EXPECT_EQ(b.length, 0);

  ForwardBatch empty;
  empty.Add(good, 0, &a);
  status = model.value()->Forward(empty, cache, {}, &logits);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("empty"), std::string::npos) << status.message();
}

TEST(BadRequestTest, FullCacheIsAnErrorAndChangesNothing) {
  auto model = Model::Load(std::string(testing::kFixturesDir) + "/tiny-v3-fp8");
  ASSERT_TRUE(model.ok());
  LatentCache cache(model.value()->config().num_hidden_layers,
                    model.value()->config().latent_cache_width(), 4, 2, DType::kBF16);
  SequenceCache a, b;
  ForwardBatch batch;
  std::vector<int32_t> tokens(6, 7);
  batch.Add(tokens.data(), 6, &a);
  batch.Add(tokens.data(), 6, &b);
  std::vector<float> logits;
  Status status = model.value()->Forward(batch, cache, {}, &logits);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("cache is full"), std::string::npos) << status.message();
  EXPECT_EQ(cache.free_pages(), 2);
  EXPECT_EQ(a.length, 0);
}

}  // namespace
}  // namespace sy
