#include <gtest/gtest.h>

#include <filesystem>

#include "model/safetensors.h"
#include "test_support.h"

namespace sy {
namespace {

std::vector<uint8_t> File(const std::string& header, size_t data_bytes, int64_t claimed = -1) {
  std::vector<uint8_t> bytes(8);
  uint64_t length = claimed < 0 ? header.size() : static_cast<uint64_t>(claimed);
  for (int i = 0; i < 8; ++i)
    bytes[i] = static_cast<uint8_t>(length >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.resize(bytes.size() + data_bytes, 0);
  return bytes;
}

std::string ParseError(const std::vector<uint8_t>& bytes) {
  auto parsed = ParseSafetensorsHeader(bytes.data(), bytes.size(), "model.safetensors");
  return parsed.ok() ? "" : parsed.status().message();
}

TEST(SafetensorsTest, ParsesAValidHeader) {
  auto bytes = File(
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
      R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})",
      12);
  auto parsed = ParseSafetensorsHeader(bytes.data(), bytes.size(), "x");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_EQ(parsed.value().size(), 2u);
  EXPECT_EQ(parsed.value()[0].name, "a");  // sorted by offset
  EXPECT_EQ(parsed.value()[1].dtype, DType::kF32);
}

TEST(SafetensorsTest, RejectsBadFilesWithTheReason) {
  struct Bad {
    std::vector<uint8_t> bytes;
    std::string expected;
  };
  std::vector<Bad> cases = {
      {{1, 2, 3}, "truncated"},
      {File("{}", 0, 1000), "truncated"},
      {File("{}", 0, int64_t{1} << 40), "implausibly large"},
      {File("{not json", 0), "not valid JSON"},
      {File("[1,2]", 0), "JSON object"},
      {File(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "run past"},
      {File(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,0]}})", 16), "reversed"},
      {File(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16), "need 12"},
      {File(R"({"w":{"dtype":"Q4_K","shape":[4],"data_offsets":[0,4]}})", 4),
       "unknown dtype 'Q4_K'"},
      {File(R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16), "non-negative"},
      {File(R"({"w":{"dtype":"F32","shape":[4]}})", 16), "data_offsets"},
      {File(R"({"w":{"shape":[4],"data_offsets":[0,16]}})", 16), "dtype"},
      {File(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,16],"data_offsets":[0,16]}})", 16),
       "overflows"},
      {File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12),
       "overlap"},
  };
  for (const auto& c : cases) {
    std::string error = ParseError(c.bytes);
    EXPECT_NE(error.find(c.expected), std::string::npos)
        << "expected '" << c.expected << "', got '" << error << "'";
    EXPECT_NE(error.find("model.safetensors"), std::string::npos) << error;
  }
}

TEST(SafetensorsTest, NamesTheTensorAtFault) {
  std::string error = ParseError(
      File(R"({"model.norm.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,99]}})", 16));
  EXPECT_NE(error.find("model.norm.weight"), std::string::npos) << error;
}

TEST(SafetensorsTest, WriteThenOpenRoundTrips) {
  std::string dir = testing::TempDirectory("safetensors_roundtrip");
  std::vector<TensorToWrite> tensors = {
      {"x", DType::kF32, {2, 2}, std::vector<uint8_t>(16, 1)},
      {"y", DType::kF8E4M3, {3}, {1, 2, 3}},
  };
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  auto checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().message();
  const CheckpointTensor* y = checkpoint.value().Find("y");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(y->data[2], 3);
  EXPECT_EQ(checkpoint.value().Find("z"), nullptr);
}

// A multimodal wrapper's checkpoint (Kimi K2.5): the language model's tensors found without the
// prefix, the set-aside ones gone, a name there both ways an error naming it.
TEST(SafetensorsTest, LanguageModelOfAWrapper) {
  std::string dir = testing::TempDirectory("safetensors_wrapper");
  auto tensor = [](const char* name) {
    return TensorToWrite{name, DType::kF32, {1}, std::vector<uint8_t>(4)};
  };
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors",
                               {tensor("language_model.model.norm.weight"),
                                tensor("language_model.lm_head.weight"),
                                tensor("vision_tower.patch_embed.weight"),
                                tensor("mm_projector.proj.0.weight"), tensor("stray.weight")})
                  .ok());
  auto checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().message();
  ASSERT_TRUE(checkpoint.value()
                  .UseLanguageModel("language_model.", {"vision_tower.", "mm_projector."})
                  .ok());
  EXPECT_EQ(checkpoint.value().set_aside_count(), 2);
  ASSERT_NE(checkpoint.value().Find("model.norm.weight"), nullptr);
  EXPECT_EQ(checkpoint.value().Find("model.norm.weight")->entry->name,
            "language_model.model.norm.weight");  // messages name the file's tensor
  EXPECT_NE(checkpoint.value().Find("lm_head.weight"), nullptr);
  EXPECT_NE(checkpoint.value().Find("stray.weight"), nullptr);  // left for LoadWeights to report
  EXPECT_EQ(checkpoint.value().Find("vision_tower.patch_embed.weight"), nullptr);
  EXPECT_EQ(checkpoint.value().tensors().size(), 3u);

  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors",
                               {tensor("language_model.lm_head.weight"), tensor("lm_head.weight")})
                  .ok());
  auto both = Checkpoint::Open(dir);
  ASSERT_TRUE(both.ok()) << both.status().message();
  const Status status = both.value().UseLanguageModel("language_model.", {});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("'lm_head.weight' is there both with and without the prefix"),
            std::string::npos)
      << status.message();
}

TEST(SafetensorsTest, ShardedIndexIsChecked) {
  std::string dir = testing::TempDirectory("safetensors_index");
  ASSERT_TRUE(
      WriteSafetensors(dir + "/a.safetensors", {{"x", DType::kF32, {1}, std::vector<uint8_t>(4)}})
          .ok());
  ASSERT_TRUE(
      WriteSafetensors(dir + "/b.safetensors", {{"y", DType::kF32, {1}, std::vector<uint8_t>(4)}})
          .ok());
  testing::WriteFile(dir + "/model.safetensors.index.json",
                     R"({"weight_map":{"x":"a.safetensors","y":"b.safetensors"}})");
  auto ok = Checkpoint::Open(dir);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_NE(ok.value().Find("y"), nullptr);

  testing::WriteFile(dir + "/model.safetensors.index.json",
                     R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors"}})");
  auto misplaced = Checkpoint::Open(dir);
  ASSERT_FALSE(misplaced.ok());
  EXPECT_NE(misplaced.status().message().find("'y'"), std::string::npos)
      << misplaced.status().message();

  testing::WriteFile(dir + "/model.safetensors.index.json",
                     R"({"weight_map":{"x":"gone.safetensors"}})");
  auto missing = Checkpoint::Open(dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("gone.safetensors"), std::string::npos);

  testing::WriteFile(dir + "/model.safetensors.index.json",
                     R"({"weight_map":{"x":"../etc/passwd"}})");
  EXPECT_FALSE(Checkpoint::Open(dir).ok());
}

TEST(SafetensorsTest, MissingDirectoryIsAnError) {
  auto missing = Checkpoint::Open("/nonexistent/model");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model"), std::string::npos);
}

}  // namespace
}  // namespace sy
