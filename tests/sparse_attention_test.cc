// DeepSeek-V3.2's sparse attention (model/sparse_attention.h): the indexer's score kernel, the
// top-k choice, the config and checkpoint checks, and — the conformance fixtures being built so
// that most queries attend sparsely — proof that the fixtures' logits turn on the choice.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/index_scores.h"
#include "model/config.h"
#include "model/model.h"
#include "model/sparse_attention.h"
#include "tensor/dtype.h"
#include "test_support.h"

namespace sy {
namespace {

// f32 products, as the conformance bars assume (the bf16 dot kernel rounds activations).
const bool kDotKernelOff = [] {
  kernels::GlobalKernelOptions().bf16_dot = false;
  return true;
}();

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

// The kernel is the scalar sum in its order — each product rounded, over dim then over heads —
// bit for bit, at every vector width (this suite also runs at SWITCHYARD_MAX_ISA=avx2 and
// portable): key counts around the widths, and heads not a multiple of the kernel's four.
TEST(SparseAttentionTest, IndexScoresAreTheScalarSumsBitForBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t heads : {1, 3, 4, 8, 13}) {
      for (int64_t dim : {8, 32, 128}) {
        for (int64_t count : {1, 7, 15, 16, 17, 33, 100}) {
          // Rows of [5 other values | the key | 3 more] in pages of 4 rows, pages out of order:
          // the kernel reads the key columns in place, as from a DSA cache.
          const int64_t column = 5, row_width = column + dim + 3, page = 4;
          const int64_t pages = (count + 2 + page - 1) / page;
          std::vector<int32_t> table(static_cast<size_t>(pages));
          for (int64_t p = 0; p < pages; ++p)
            table[p] = static_cast<int32_t>(pages - 1 - p);
          std::vector<uint8_t> storage(static_cast<size_t>(pages * page * row_width) *
                                       DTypeSize(dtype));
          kernels::LatentPages rows{storage.data(),
                                    kernels::LatentRowLayout::Of(dtype, row_width, 0), page,
                                    table.data()};
          std::vector<float> q(heads * dim), weights(heads), keys((count + 2) * dim), got(count);
          for (float& v : q)
            v = normal(rng);
          for (float& v : weights)
            v = normal(rng);
          for (int64_t j = 0; j < count + 2; ++j) {
            uint8_t* row = const_cast<uint8_t*>(rows.Row(j)) + column * DTypeSize(dtype);
            for (int64_t d = 0; d < dim; ++d) {
              float& v = keys[j * dim + d];
              v = normal(rng);
              if (dtype == DType::kBF16) {
                v = BF16ToF32(F32ToBF16(v));
                reinterpret_cast<uint16_t*>(row)[d] = F32ToBF16(v);
              } else {
                reinterpret_cast<float*>(row)[d] = v;
              }
            }
          }
          const int64_t first = 2;  // keys from the third row on
          kernels::IndexScores(q.data(), weights.data(), heads, dim, rows, column, first, count,
                               got.data());
          for (int64_t j = 0; j < count; ++j) {
            float total = 0;
            for (int64_t h = 0; h < heads; ++h) {
              float dot = 0;
              for (int64_t d = 0; d < dim; ++d) {
                const volatile float product = q[h * dim + d] * keys[(first + j) * dim + d];
                dot = dot + product;
              }
              const volatile float weighted = weights[h] * std::max(dot, 0.0f);
              total = total + weighted;
            }
            ASSERT_EQ(Bits(got[j]), Bits(total))
                << DTypeName(dtype) << " heads " << heads << " dim " << dim << " key " << j
                << " of " << count;
          }
        }
      }
    }
  }
}

TEST(SparseAttentionTest, ChooseTopKeysPrefersTheEarlierKeyOnATieAndPutsNaNLast) {
  std::vector<float> scratch;
  std::vector<int32_t> chosen;
  const float scores[] = {1.0f, 3.0f, 2.0f, 3.0f, 0.5f, 2.0f};
  ChooseTopKeys(scores, 6, 3, scratch, chosen);
  EXPECT_EQ(chosen, (std::vector<int32_t>{1, 2, 3}));  // 3, 3, then the first 2
  ChooseTopKeys(scores, 6, 1, scratch, chosen);
  EXPECT_EQ(chosen, (std::vector<int32_t>{1}));
  const float with_nan[] = {NAN, -1.0f, NAN, -2.0f};
  ChooseTopKeys(with_nan, 4, 2, scratch, chosen);
  EXPECT_EQ(chosen, (std::vector<int32_t>{1, 3}));
  ChooseTopKeys(with_nan, 4, 3, scratch, chosen);
  EXPECT_EQ(chosen, (std::vector<int32_t>{0, 1, 3}));
  // Against a full sort by (score descending, key ascending, NaN last) on scores with many ties,
  // infinities and NaNs.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t count = 2 + static_cast<int64_t>(rng() % 200);
    const int64_t topk = 1 + static_cast<int64_t>(rng() % (count - 1));
    std::vector<float> values(static_cast<size_t>(count));
    for (float& v : values) {
      const uint32_t r = rng() % 20;
      v = r == 0 ? NAN : r == 1 ? -INFINITY : r == 2 ? INFINITY : static_cast<float>(rng() % 7);
    }
    std::vector<int32_t> order(static_cast<size_t>(count));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      if (std::isnan(values[a]) != std::isnan(values[b])) return std::isnan(values[b]);
      return !std::isnan(values[a]) && values[a] > values[b];
    });
    std::vector<int32_t> expected(order.begin(), order.begin() + topk);
    std::sort(expected.begin(), expected.end());
    ChooseTopKeys(values.data(), count, topk, scratch, chosen);
    ASSERT_EQ(chosen, expected) << "trial " << trial;
  }
}

// Logits of the fixture's sequences, each in one prefill (f32 cache, f32 products).
std::vector<float> Prefill(const Model& model, const testing::Fixture& fixture) {
  std::vector<float> all, logits;
  for (const auto& tokens : fixture.tokens) {
    LatentCache cache = model.NewCache(static_cast<int64_t>(tokens.size()), 1, DType::kF32);
    SequenceCache seq;
    ForwardBatch batch;
    batch.Add(tokens.data(), static_cast<int64_t>(tokens.size()), &seq);
    Status status = model.Forward(batch, cache, {}, &logits);
    EXPECT_TRUE(status.ok()) << status.message();
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// A copy of a fixture's directory with config.json edited by `edit` (the weights linked).
std::string EditedFixture(const std::string& fixture, const std::string& name,
                          const std::function<void(std::string&)>& edit) {
  const std::string dir = testing::TempDirectory(name);
  std::string config = testing::ReadFile(testing::LoadFixture(fixture).directory + "/config.json");
  edit(config);
  testing::WriteFile(dir + "/config.json", config);
  std::filesystem::remove(dir + "/model.safetensors");
  std::filesystem::create_symlink(testing::LoadFixture(fixture).directory + "/model.safetensors",
                                  dir + "/model.safetensors");
  return dir;
}

void Replace(std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
}

// With index_topk raised past every sequence (dense MLA, the indexer unused), the rows before
// the fixture's index_topk still meet the reference and nearly every later row misses it: the
// fixtures test the choice, not attention that would be the same without it.
TEST(SparseAttentionTest, TheFixturesLogitsTurnOnTheChoice) {
  for (const char* name : {"tiny-v32-bf16", "tiny-v32-fp8"}) {
    const testing::Fixture fixture = testing::LoadFixture(name);
    auto sparse = Model::Load(fixture.directory);
    ASSERT_TRUE(sparse.ok()) << sparse.status().message();
    const int64_t topk = sparse.value()->config().index_topk;
    auto exact =
        testing::CompareLogits(fixture.logits, Prefill(*sparse.value(), fixture), fixture.vocab);
    EXPECT_LE(exact.max_abs_diff, 1e-4 * exact.max_abs_reference) << name;

    const std::string dense_dir = EditedFixture(
        name, std::string("dense_") + name,
        [](std::string& config) { Replace(config, "\"index_topk\": 8", "\"index_topk\": 4096"); });
    auto dense = Model::Load(dense_dir);
    ASSERT_TRUE(dense.ok()) << dense.status().message();
    auto comparison =
        testing::CompareLogits(fixture.logits, Prefill(*dense.value(), fixture), fixture.vocab);
    int64_t row = 0, sparse_rows = 0, sparse_over = 0;
    for (const auto& tokens : fixture.tokens) {
      for (int64_t position = 0; position < static_cast<int64_t>(tokens.size());
           ++position, ++row) {
        const double diff = comparison.row_max_diff[row] / comparison.max_abs_reference;
        if (position < topk) {
          EXPECT_LE(diff, 1e-4) << name << " row " << row;
        } else {
          ++sparse_rows;
          sparse_over += diff > 1e-2;
        }
      }
    }
    EXPECT_GT(sparse_rows, 40) << name;
    EXPECT_GE(sparse_over, sparse_rows * 9 / 10) << name << ": of " << sparse_rows;
  }
}

TEST(SparseAttentionTest, TheConfigIsReadCheckedAndWrittenBack) {
  const std::string text =
      testing::ReadFile(testing::LoadFixture("tiny-v32-bf16").directory + "/config.json");
  auto config = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->model_type, "deepseek_v32");
  EXPECT_EQ(config->index_topk, 8);
  EXPECT_EQ(config->index_head_dim, 32);
  EXPECT_EQ(config->index_n_heads, 8);
  EXPECT_EQ(config->cache_row_width(), 32 + 16 + 32);
  auto again = ParseModelConfig(ModelConfigToJson(*config), "written");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->index_topk, 8);
  EXPECT_EQ(again->cache_row_width(), config->cache_row_width());
  EXPECT_NE(ModelConfigToJson(*config).find("DeepseekV32ForCausalLM"), std::string::npos);

  // A V3 config has no indexer, whatever stray fields it carries.
  std::string v3 = text;
  Replace(v3, "\"deepseek_v32\"", "\"deepseek_v3\"");
  auto dense = ParseModelConfig(v3, "config.json");
  ASSERT_TRUE(dense.ok()) << dense.status().message();
  EXPECT_FALSE(dense->has_indexer());
  EXPECT_EQ(dense->cache_row_width(), dense->latent_cache_width());

  struct Bad {
    std::string from, to, message;
  };
  for (const Bad& bad :
       std::vector<Bad>{{"\"index_topk\": 8,", "", "index_topk"},
                        {"\"index_topk\": 8", "\"index_topk\": 0", "index_topk"},
                        {"\"index_n_heads\": 8", "\"index_n_heads\": -1", "index_n_heads"},
                        {"\"index_head_dim\": 32", "\"index_head_dim\": 8", "index_head_dim"},
                        {"\"q_lora_rank\": 64", "\"q_lora_rank\": null", "q_lora_rank"},
                        {"\"index_topk\": 8", "\"index_topk\": \"many\"", "index_topk"}}) {
    std::string edited = text;
    Replace(edited, bad.from, bad.to);
    auto parsed = ParseModelConfig(edited, "config.json");
    ASSERT_FALSE(parsed.ok()) << bad.to;
    EXPECT_NE(parsed.status().message().find(bad.message), std::string::npos)
        << parsed.status().message();
    EXPECT_NE(parsed.status().message().find("config.json"), std::string::npos);
  }
}

// transformers 5 writes RoPE as rope_parameters: the same theta and YaRN scaling.
TEST(SparseAttentionTest, RopeParametersAreReadAsRopeScaling) {
  std::string text =
      testing::ReadFile(testing::LoadFixture("tiny-v32-bf16").directory + "/config.json");
  auto legacy = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(legacy.ok());
  Replace(text, "\"rope_theta\": 10000,", "");
  Replace(text, "\"rope_scaling\": {\n    \"type\": \"yarn\",",
          "\"rope_parameters\": {\n    \"rope_type\": \"yarn\", \"rope_theta\": 50000,");
  auto parsed = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->rope_theta, 50000);
  ASSERT_TRUE(parsed->yarn.has_value());
  EXPECT_EQ(parsed->yarn->factor, legacy->yarn->factor);
}

// A deepseek_v32 config over weights without an indexer names the missing tensor; the fp8
// fixture's MTP layer keeps its indexer, and a model without one in its MTP layer drafts densely.
TEST(SparseAttentionTest, IndexerTensorsAreLoadedOrNamed) {
  const std::string v3_weights = testing::LoadFixture("tiny-v3-bf16").directory;
  const std::string dir = testing::TempDirectory("v32_without_indexer");
  testing::WriteFile(
      dir + "/config.json",
      testing::ReadFile(testing::LoadFixture("tiny-v32-bf16").directory + "/config.json"));
  std::filesystem::remove(dir + "/model.safetensors");
  std::filesystem::create_symlink(v3_weights + "/model.safetensors", dir + "/model.safetensors");
  auto missing = Model::Load(dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model.layers.0.self_attn.indexer.wq_b.weight"),
            std::string::npos)
      << missing.status().message();

  auto fp8 = Model::Load(testing::LoadFixture("tiny-v32-fp8").directory);
  ASSERT_TRUE(fp8.ok()) << fp8.status().message();
  ASSERT_TRUE(fp8.value()->has_mtp());
  EXPECT_TRUE(fp8.value()->weights().mtp[0].block.self_attn.has_indexer());
  for (const auto& layer : fp8.value()->weights().layers)
    EXPECT_TRUE(layer.self_attn.has_indexer());
  EXPECT_TRUE(fp8.value()->unused_tensors().empty());
}

}  // namespace
}  // namespace sy
