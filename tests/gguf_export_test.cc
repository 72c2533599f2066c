// `switchyard quantize` (model/gguf_export.h): the default model written as a deepseek2 GGUF in
// every type must be, byte for byte, the file tools/gguf/make_default_gguf.py writes with the
// pinned gguf-py (tests/gguf/make_models.sh, the files gguf_model_test loads and, for Q8_0 and the
// Q4_K mix, the ones llama.cpp's logits in tests/fixtures/gguf were computed on): the same
// metadata, tensor names, order, types, offsets and blocks. The encoders alone: a round trip
// through DequantizeGgml within half a quantization step; the errors a user can cause.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/gguf_export.h"
#include "tensor/dtype.h"
#include "tensor/ggml_quants.h"

namespace sy {
namespace {

const std::string kModels = SY_GGUF_MODELS_DIR;
const std::string kDefaultModel = std::string(SY_SOURCE_DIR) + "/models/default";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

struct Case {
  const char* type;
  const char* kv_b;
  const char* reference;  // in kModels
};

TEST(GgufExportTest, EveryTypeIsTheConvertersFileByteForByte) {
  const Case cases[] = {
      {"f32", "split", "default-f32.gguf"},
      {"f32", "fused", "default-f32-fused-kv-b.gguf"},
      {"f32", "both", "default-f32-both-kv-b.gguf"},
      {"f16", "split", "default-f16.gguf"},
      {"bf16", "split", "default-bf16.gguf"},
      {"q8_0", "split", "default-q8_0.gguf"},
      {"q4_k_mix", "split", "default-q4_k_mix.gguf"},
      {"q4_k_m", "split", "default-q4_k_m.gguf"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.type) + " " + c.kv_b);
    const std::string out = ::testing::TempDir() + "/export-" + c.type + "-" + c.kv_b + ".gguf";
    GgufExportOptions options;
    options.type = c.type;
    options.kv_b = c.kv_b;
    size_t calls = 0, last_total = 0;
    options.progress = [&](size_t done, size_t total, uint64_t) {
      ++calls;
      EXPECT_EQ(done, calls);
      last_total = total;
    };
    const Status s = ExportGguf(kDefaultModel, out, options);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(calls, last_total);
    const std::string ours = ReadAll(out), theirs = ReadAll(kModels + "/" + c.reference);
    ASSERT_FALSE(theirs.empty()) << kModels << "/" << c.reference;
    EXPECT_EQ(ours.size(), theirs.size());
    if (ours != theirs) {
      size_t at = 0;
      while (at < std::min(ours.size(), theirs.size()) && ours[at] == theirs[at])
        ++at;
      ADD_FAILURE() << "first differing byte at offset " << at;
    }
    EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
    std::filesystem::remove(out);
  }
}

// Chat templates given by the caller (all the forms a checkpoint keeps them in) are written as
// gguf-py writes them: the default one, and a named tool_use one with the list of names.
TEST(GgufExportTest, ChatTemplatesAreWrittenAsGgufPyWritesThem) {
  const std::string out = ::testing::TempDir() + "/export-templates.gguf";
  GgufExportOptions options;
  options.type = "f32";
  options.chat_template = "{{ messages[0].content }}";
  options.tool_use_chat_template = "TOOLS {{ tools | length }}";
  ASSERT_TRUE(ExportGguf(kDefaultModel, out, options).ok());
  auto file = GgufFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto text = [&](const char* key) -> std::string {
    const GgufValue* v = file->Find(key);
    return v ? std::string(v->string_value) : "<absent>";
  };
  EXPECT_EQ(text("tokenizer.chat_template"), *options.chat_template);
  EXPECT_EQ(text("tokenizer.chat_template.tool_use"), options.tool_use_chat_template);
  const GgufValue* names = file->Find("tokenizer.chat_templates");
  ASSERT_NE(names, nullptr);
  ASSERT_EQ(names->elements.size(), 1u);
  EXPECT_EQ(names->elements[0].string_value, "tool_use");
  // Without a tool_use template neither of its keys is written; an empty template, no key.
  options.tool_use_chat_template.clear();
  options.chat_template = "";
  ASSERT_TRUE(ExportGguf(kDefaultModel, out, options).ok());
  auto plain = GgufFile::Open(out);
  ASSERT_TRUE(plain.ok());
  for (const char* key :
       {"tokenizer.chat_template", "tokenizer.chat_template.tool_use", "tokenizer.chat_templates"})
    EXPECT_EQ(plain->Find(key), nullptr) << key;
  std::filesystem::remove(out);
}

// Decoding what was encoded lands within the encoder's own error of each value (below, per type,
// in steps of the block's d): an independent check of the encoders beside the byte comparison.
TEST(GgufExportTest, EncodedBlocksDecodeWithinTheirSteps) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int64_t n = 4096;
  std::vector<float> x(n);
  for (float& v : x)
    v = normal(rng);
  x[5] = 0.3f;  // an outlier, as real weights have
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const auto traits = *GgmlTypeInfo(type);
    SCOPED_TRACE(std::string(traits.name));
    std::vector<uint8_t> blocks(n / traits.block_size * traits.block_bytes);
    ASSERT_TRUE(EncodeGgml(type, x.data(), n, blocks.data()).ok());
    std::vector<float> y(n);
    ASSERT_TRUE(DequantizeGgml(type, blocks.data(), n, y.data()).ok());
    const int64_t group = type == GgmlType::kQ8_0 || type == GgmlType::kQ5_0 ? 32 : 256;
    for (int64_t b = 0; b < n; b += group) {
      float lo = 0, hi = 0;
      for (int64_t i = b; i < b + group; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      const double amax = std::max(hi, -lo);
      // The step d and how many steps off a value may land:
      //  - Q8_0: d = max|x|/127, round to nearest: half a step;
      //  - Q5_0: d = (the largest-magnitude value)/−16, codes −16..15: that value exactly, the
      //    opposite end clipped from 16 to 15: up to one step;
      //  - Q4_K (range/15) and Q6_K (max|x|/32 per 16): round to nearest of a sub-block scale that
      //    is itself a 6- or 8-bit multiple of the block's d: about a step and a half at most.
      // Plus d's rounding to f16 (2^-11 of it) times the largest code.
      double step, steps, largest_code;
      switch (type) {
        case GgmlType::kQ8_0:
          step = amax / 127, steps = 0.5, largest_code = 127;
          break;
        case GgmlType::kQ5_0:
          step = amax / 16, steps = 1.0, largest_code = 16;
          break;
        case GgmlType::kQ4_K:
          step = (hi - lo) / 15, steps = 1.5, largest_code = 15;
          break;
        default:
          step = amax / 32, steps = 1.5, largest_code = 32;
          break;
      }
      const double bound = (steps + largest_code * std::ldexp(1.0, -11)) * step * 1.001 + 1e-7;
      for (int64_t i = b; i < b + group; ++i)
        ASSERT_LE(std::fabs(x[i] - y[i]), bound) << "element " << i << " of block " << b / group;
    }
  }
}

TEST(GgufExportTest, UnsupportedTypesAndPartBlocksAreErrors) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> out(1024);
  Status s = EncodeGgml(GgmlType::kQ3_K, x.data(), 256, out.data());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("Q3_K"), std::string::npos) << s.message();
  s = EncodeGgml(GgmlType::kQ4_K, x.data(), 200, out.data());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("whole"), std::string::npos) << s.message();
}

TEST(GgufExportTest, BadRequestsNameWhatIsWrongAndWriteNothing) {
  const std::string out = ::testing::TempDir() + "/export-bad.gguf";
  GgufExportOptions options;
  options.type = "q3_k";
  Status s = ExportGguf(kDefaultModel, out, options);
  EXPECT_NE(s.message().find("q3_k"), std::string::npos) << s.message();
  options.type = "q8_0";
  options.kv_b = "merged";
  s = ExportGguf(kDefaultModel, out, options);
  EXPECT_NE(s.message().find("merged"), std::string::npos) << s.message();
  options.kv_b = "split";
  s = ExportGguf("/nonexistent/model", out, options);
  EXPECT_NE(s.message().find("/nonexistent/model"), std::string::npos) << s.message();
  // A checkpoint without its weights: the config and tokenizer alone.
  const std::string dir = ::testing::TempDir() + "/export-no-weights";
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(kDefaultModel + "/" + f, dir + "/" + f,
                               std::filesystem::copy_options::overwrite_existing);
  s = ExportGguf(dir, out, options);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

}  // namespace
}  // namespace sy
