// `switchyard quantize --to awq-int4 | gptq-int4 | ct-w4a16 | ct-w4a16-asym` (model/int4_export.h).
// The packed layouts are checked through the int4 loader (model/hf_int4.h), which reads the
// fixtures AutoAWQ's and auto-gptq's pack code and the compressed-tensors library wrote
// (hf_int4_test): every quantized layer of the default model must read back as exactly the codes
// round-to-nearest gives, each weight within half a quantization step of the source, and every
// other tensor as it was. Sharding, and the errors a user can cause.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/export_common.h"
#include "model/hf_int4.h"
#include "model/int4_export.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "tensor/dtype.h"
#include "test_support.h"

namespace sy {
namespace {

namespace fs = std::filesystem;
const std::string kDefaultModel = std::string(SY_SOURCE_DIR) + "/models/default";

struct Format {
  const char* type;
  Int4Scheme scheme;
  Int4Format format;
};
constexpr Format kFormats[] = {
    {"awq-int4", Int4Scheme::kAwq, Int4Format::kAwq},
    {"gptq-int4", Int4Scheme::kGptq, Int4Format::kGptq},
    {"ct-w4a16", Int4Scheme::kCtSym, Int4Format::kCompressed},
    {"ct-w4a16-asym", Int4Scheme::kCtAsym, Int4Format::kCompressed},
};

bool HalfScales(Int4Scheme scheme) {
  return scheme == Int4Scheme::kAwq || scheme == Int4Scheme::kGptq;
}

float Scale(uint16_t bits, Int4Scheme scheme) {
  return HalfScales(scheme) ? F16ToF32(bits) : BF16ToF32(bits);
}

// The weights `codes` stand for: s · (q − z).
std::vector<float> Dequantize(const Int4Codes& codes, int64_t rows, int64_t cols,
                              Int4Scheme scheme) {
  const int64_t groups = cols / kInt4Group;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = r * groups + c / kInt4Group;
      w[r * cols + c] = Scale(codes.scales[g], scheme) *
                        static_cast<float>(int{codes.q[r * cols + c]} - int{codes.z[g]});
    }
  return w;
}

// Half a step, and what rounding the scale to fp16 (11 significant bits) or bf16 (8) can add at
// the far end of the range (15 steps from the zero point).
double Bound(float scale, Int4Scheme scheme) {
  const double unit = HalfScales(scheme) ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  return scale * (0.5 + 16 * unit) + 1e-12;
}

bool Fits(const SafetensorsEntry& e) {
  return e.shape.size() == 2 && e.shape[1] % kInt4Group == 0 && e.shape[0] % 8 == 0;
}

bool IsLinear(const std::string& name) {
  for (const char* s :
       {"q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight",
        "o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight"})
    if (name.ends_with(s)) return true;
  return false;
}

TEST(Int4ExportTest, EveryLayerReadsBackAsItsRoundToNearestCodes) {
  auto source = Checkpoint::Open(kDefaultModel);
  ASSERT_TRUE(source.ok()) << source.status().message();
  auto source_config = LoadModelConfig(kDefaultModel + "/config.json");
  ASSERT_TRUE(source_config.ok());
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.type);
    const std::string out = testing::TempDirectory(std::string("int4-export-") + f.type) + "/m";
    Int4ExportOptions options;
    options.type = f.type;
    size_t calls = 0;
    options.progress = [&](size_t done, size_t total, uint64_t) {
      EXPECT_EQ(done, ++calls);
      EXPECT_LE(done, total);
    };
    const Status s = ExportInt4Checkpoint(kDefaultModel, out, options);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_GT(calls, 0u);
    EXPECT_FALSE(fs::exists(out + ".partial"));
    for (const char* file : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
      EXPECT_EQ(testing::ReadFile(out + "/" + file), testing::ReadFile(kDefaultModel + "/" + file))
          << file;

    auto config = LoadModelConfig(out + "/config.json");
    ASSERT_TRUE(config.ok()) << config.status().message();
    ASSERT_EQ(config.value().int4.format, f.format);
    EXPECT_EQ(config.value().int4.group_size, kInt4Group);
    EXPECT_EQ(config.value().int4.symmetric, f.scheme == Int4Scheme::kCtSym);
    EXPECT_EQ(config.value().hidden_size, source_config.value().hidden_size);
    auto ckpt = Checkpoint::Open(out);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();

    int quantized = 0, kept = 0;
    for (const auto& [name, tensor] : source.value().tensors()) {
      if (name.ends_with("_scale_inv")) continue;
      const std::string module = name.substr(0, name.size() - 7);
      if (IsLinear(name) && Fits(*tensor.entry)) {
        ++quantized;
        const int64_t rows = tensor.entry->shape[0], cols = tensor.entry->shape[1];
        ASSERT_TRUE(Int4Quantizes(config.value().int4, module)) << module;
        EXPECT_EQ(ckpt.value().Find(name), nullptr) << name;
        auto loaded = LoadInt4Matrix(ckpt.value(), config.value().int4, module, rows, cols);
        ASSERT_TRUE(loaded.ok()) << loaded.status().message();
        auto w = ReadTensorF32(source.value(), source_config.value(), name);
        ASSERT_TRUE(w.ok());
        const Int4Codes codes = QuantizeInt4(w.value().data(), rows, cols, f.scheme);
        const std::vector<float> want = Dequantize(codes, rows, cols, f.scheme);
        std::vector<float> row(static_cast<size_t>(cols));
        int64_t wrong = 0, far = 0;
        for (int64_t r = 0; r < rows; ++r) {
          loaded.value().DecodeRow(r, row.data());
          for (int64_t c = 0; c < cols; ++c) {
            wrong += row[c] != want[r * cols + c];
            const float scale =
                Scale(codes.scales[r * (cols / kInt4Group) + c / kInt4Group], f.scheme);
            far += std::abs(row[c] - w.value()[r * cols + c]) > Bound(scale, f.scheme);
          }
        }
        EXPECT_EQ(wrong, 0) << module;
        EXPECT_EQ(far, 0) << module;
        continue;
      }
      // Everything else is as it was; fp8 decoded to bf16.
      ++kept;
      const CheckpointTensor* t = ckpt.value().Find(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->entry->shape, tensor.entry->shape) << name;
      if (IsLinear(name)) {
        EXPECT_FALSE(Int4Quantizes(config.value().int4, module)) << module;
      }
      if (tensor.entry->dtype != DType::kF8E4M3) {
        EXPECT_EQ(t->entry->dtype, tensor.entry->dtype) << name;
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(t->data),
                              t->entry->data_end - t->entry->data_begin),
                  std::string(reinterpret_cast<const char*>(tensor.data),
                              tensor.entry->data_end - tensor.entry->data_begin))
            << name;
      } else {
        ASSERT_EQ(t->entry->dtype, DType::kBF16) << name;
        auto w = ReadTensorF32(source.value(), source_config.value(), name);
        ASSERT_TRUE(w.ok());
        int64_t wrong = 0;
        for (size_t i = 0; i < w.value().size(); ++i) {
          uint16_t bits;
          std::memcpy(&bits, t->data + 2 * i, 2);
          wrong += bits != F32ToBF16(w.value()[i]);
        }
        EXPECT_EQ(wrong, 0) << name;
      }
    }
    // The default model: every projection but kv_b_proj (64 input columns) is quantized.
    EXPECT_GT(quantized, 100);
    EXPECT_GT(kept, 10);
  }
}

// Round-to-nearest as the tools compute it, on values where the answer is known: a group
// spanning [-1.5, 6] in steps of 0.5 has s = 0.5 (exact in fp16) and z = 3.
TEST(Int4ExportTest, CodesFollowEachFormatsRule) {
  std::vector<float> w(kInt4Group);
  for (int i = 0; i < kInt4Group; ++i)
    w[i] = -1.5f + 0.5f * static_cast<float>(i % 16);
  Int4Codes awq = QuantizeInt4(w.data(), 1, kInt4Group, Int4Scheme::kAwq);
  EXPECT_EQ(F16ToF32(awq.scales[0]), 0.5f);
  EXPECT_EQ(awq.z[0], 3);
  for (int i = 0; i < kInt4Group; ++i)
    EXPECT_EQ(awq.q[i], i % 16) << i;
  // Symmetric: s = max|w| / 7.5 = 0.8 (bf16 0.80078125), q = round(w / s) + 8, clamped to 15.
  Int4Codes sym = QuantizeInt4(w.data(), 1, kInt4Group, Int4Scheme::kCtSym);
  EXPECT_EQ(BF16ToF32(sym.scales[0]), BF16ToF32(F32ToBF16(0.8f)));
  EXPECT_EQ(sym.z[0], 8);
  const float s = BF16ToF32(sym.scales[0]);
  for (int i = 0; i < kInt4Group; ++i)
    EXPECT_EQ(sym.q[i], std::min(15.0f, std::nearbyint(w[i] / s) + 8)) << i;
  EXPECT_EQ(sym.q[15], 15);  // 6 / 0.8 = 7.5 rounds to 8: clamped to the top code
  // A zero group: any scale, every weight back as 0.
  std::vector<float> zeros(kInt4Group, 0.0f);
  for (Int4Scheme scheme :
       {Int4Scheme::kAwq, Int4Scheme::kGptq, Int4Scheme::kCtSym, Int4Scheme::kCtAsym}) {
    Int4Codes c = QuantizeInt4(zeros.data(), 1, kInt4Group, scheme);
    for (float v : Dequantize(c, 1, kInt4Group, scheme))
      EXPECT_EQ(v, 0.0f);
  }
}

// "gptq" checkpoints store z − 1 and readers add one back: a group whose minimum is at or above
// zero (z would be 0, stored as 15, read as 16) must get z >= 1 and still be within bounds.
TEST(Int4ExportTest, GptqNeverNeedsAZeroPointOfZero) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> positive(0.0f, 2.0f);
  const int64_t rows = 8, cols = 2 * kInt4Group;
  std::vector<float> w(rows * cols);
  for (float& v : w)
    v = positive(rng);
  const Int4Codes awq = QuantizeInt4(w.data(), rows, cols, Int4Scheme::kAwq);
  EXPECT_EQ(*std::min_element(awq.z.begin(), awq.z.end()), 0);  // the case in question
  const Int4Codes gptq = QuantizeInt4(w.data(), rows, cols, Int4Scheme::kGptq);
  EXPECT_GE(*std::min_element(gptq.z.begin(), gptq.z.end()), 1);
  const std::vector<float> back = Dequantize(gptq, rows, cols, Int4Scheme::kGptq);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float scale = F16ToF32(gptq.scales[i / kInt4Group]);
    EXPECT_LE(std::abs(back[i] - w[i]), Bound(scale, Int4Scheme::kGptq)) << i;
  }
}

TEST(Int4ExportTest, ShardsHoldTheSameTensorsAsOneFile) {
  const std::string root = testing::TempDirectory("int4-export-shards");
  Int4ExportOptions options;
  ASSERT_TRUE(ExportInt4Checkpoint(kDefaultModel, root + "/one", options).ok());
  options.max_shard_bytes = 4'000'000;
  ASSERT_TRUE(ExportInt4Checkpoint(kDefaultModel, root + "/many", options).ok());
  EXPECT_FALSE(fs::exists(root + "/one/model.safetensors.index.json"));
  ASSERT_TRUE(fs::exists(root + "/many/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(root + "/many/model.safetensors"));
  auto index =
      nlohmann::json::parse(testing::ReadFile(root + "/many/model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items())
    files.insert(file.get<std::string>());
  EXPECT_GE(files.size(), 4u);
  EXPECT_TRUE(files.count(fmt::format("model-00001-of-{:05d}.safetensors", files.size())));
  uint64_t total = 0;
  for (const std::string& file : files) {
    EXPECT_LE(fs::file_size(root + "/many/" + file), 4'000'000u + 200'000u) << file;
    total += fs::file_size(root + "/many/" + file);
  }
  EXPECT_GE(total, index["metadata"]["total_size"].get<uint64_t>());

  auto one = Checkpoint::Open(root + "/one"), many = Checkpoint::Open(root + "/many");
  ASSERT_TRUE(one.ok() && many.ok());
  ASSERT_EQ(one.value().tensors().size(), many.value().tensors().size());
  for (const auto& [name, a] : one.value().tensors()) {
    const CheckpointTensor* b = many.value().Find(name);
    ASSERT_NE(b, nullptr) << name;
    const size_t bytes = a.entry->data_end - a.entry->data_begin;
    ASSERT_EQ(bytes, b->entry->data_end - b->entry->data_begin) << name;
    EXPECT_EQ(std::memcmp(a.data, b->data, bytes), 0) << name;
  }
}

TEST(Int4ExportTest, BadCallsAreClearErrorsAndLeaveNothing) {
  const std::string root = testing::TempDirectory("int4-export-errors");
  Int4ExportOptions options;
  options.type = "int3";
  Status s = ExportInt4Checkpoint(kDefaultModel, root + "/a", options);
  EXPECT_NE(s.message().find("--to int3: not one of"), std::string::npos) << s.message();

  options.type = "awq-int4";
  fs::create_directories(root + "/full");
  testing::WriteFile(root + "/full/x", "x");
  s = ExportInt4Checkpoint(kDefaultModel, root + "/full", options);
  EXPECT_NE(s.message().find("not an empty directory"), std::string::npos) << s.message();

  s = ExportInt4Checkpoint(root + "/nowhere", root + "/b", options);
  EXPECT_NE(s.message().find(root + "/nowhere/config.json"), std::string::npos) << s.message();

  ASSERT_TRUE(ExportInt4Checkpoint(kDefaultModel, root + "/awq", options).ok());
  s = ExportInt4Checkpoint(root + "/awq", root + "/again", options);
  EXPECT_NE(s.message().find("an int4 checkpoint"), std::string::npos) << s.message();

  // A source whose fp8 tensor lost its scales fails while writing: the error names the tensor and
  // neither the output nor its .partial directory is left.
  testing::CopyDirectory(kDefaultModel, root + "/broken");
  auto ckpt = Checkpoint::Open(kDefaultModel);
  ASSERT_TRUE(ckpt.ok());
  std::vector<TensorToWrite> tensors;
  const std::string lost = "model.layers.1.self_attn.o_proj.weight_scale_inv";
  for (const auto& [name, t] : ckpt.value().tensors()) {
    if (name == lost) continue;
    TensorToWrite copy;
    copy.name = name;
    copy.dtype = t.entry->dtype;
    copy.shape = t.entry->shape;
    copy.bytes.assign(t.data, t.data + (t.entry->data_end - t.entry->data_begin));
    tensors.push_back(std::move(copy));
  }
  ASSERT_TRUE(WriteSafetensors(root + "/broken/model.safetensors", tensors).ok());
  s = ExportInt4Checkpoint(root + "/broken", root + "/c", options);
  EXPECT_NE(s.message().find("model.layers.1.self_attn.o_proj"), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(root + "/c"));
  EXPECT_FALSE(fs::exists(root + "/c.partial"));
}

TEST(SafetensorsWriterTest, WritesWhatTheReaderReadsAndRefusesRepeats) {
  const std::string root = testing::TempDirectory("safetensors-writer");
  SafetensorsWriter w;
  auto fill = [](uint8_t value) {
    return [value](uint8_t* out) {
      out[0] = value;
      return Status::Ok();
    };
  };
  ASSERT_TRUE(w.AddTensor("a", DType::kU8, {1}, fill(7)).ok());
  ASSERT_TRUE(w.AddTensor("b", DType::kI8, {1, 1}, fill(9)).ok());
  EXPECT_FALSE(w.AddTensor("a", DType::kU8, {1}, fill(1)).ok());
  EXPECT_FALSE(w.AddTensor("c", DType::kU8, {-1}, fill(1)).ok());
  ASSERT_TRUE(w.WriteDirectory(root, 1).ok());  // one byte a shard: two shards
  auto ckpt = Checkpoint::Open(root);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  EXPECT_EQ(*ckpt.value().Find("a")->data, 7);
  EXPECT_EQ(*ckpt.value().Find("b")->data, 9);
  EXPECT_TRUE(fs::exists(root + "/model-00002-of-00002.safetensors"));

  SafetensorsWriter failing;
  ASSERT_TRUE(failing
                  .AddTensor("x", DType::kF32, {2},
                             [](uint8_t*) { return Status::Error("no bytes today"); })
                  .ok());
  const Status s = failing.WriteFile(root + "/x.safetensors");
  EXPECT_NE(s.message().find("no bytes today"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("x"), std::string::npos);
  EXPECT_FALSE(fs::exists(root + "/x.safetensors"));
  EXPECT_FALSE(fs::exists(root + "/x.safetensors.partial"));
}

}  // namespace
}  // namespace sy
