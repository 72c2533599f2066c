// The model against Hugging Face transformers: every committed fixture, the prefill path and the
// decode path, each MLA form, both latent-cache dtypes, sequences batched raggedly.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/fast_linear.h"
#include "model/model.h"
#include "test_support.h"

namespace sy {
namespace {

// The bars against transformers here are those of f32 products (1e-4 of the largest logit): the
// bf16 dot kernel, which rounds activations to bf16 and would otherwise take fp8 and bf16 weights
// on CPUs that have it, is held to the bf16 bar in Bf16DotPathMeetsTheBar.
const bool kDotKernelOff = [] {
  kernels::GlobalKernelOptions().bf16_dot = false;
  return true;
}();

using testing::CompareLogits;
using testing::Fixture;
using testing::LoadFixture;

struct Case {
  std::string fixture;
  AttentionForm form;
  DType kv_dtype;
  int64_t decode_from;         // -1: one prefill per sequence
  bool micro_batches = false;  // the two-micro-batch schedule (sequences cut between halves)
  std::optional<DType> round_rows_as = std::nullopt;  // LatentCache::RoundRowsAs
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.fixture << " form " << static_cast<int>(c.form) << " cache " << DTypeName(c.kv_dtype)
      << " decode_from " << c.decode_from << (c.micro_batches ? " micro-batched" : "");
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.fixture + "_";
  name += info.param.form == AttentionForm::kAuto       ? "auto"
          : info.param.form == AttentionForm::kExpanded ? "expanded"
                                                        : "absorbed";
  name += info.param.kv_dtype == DType::kF32 ? "_f32cache" : "_bf16cache";
  name += info.param.decode_from < 0 ? "_prefill"
                                     : "_decode_from_" + std::to_string(info.param.decode_from);
  if (info.param.micro_batches) name += "_microbatch";
  for (char& c : name)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

// Runs the fixture's sequences as the CLI does: a batched prefill of the first K positions of
// every sequence, then one batched decode step per later position.
std::vector<float> RunModel(const Model& model, const Fixture& fixture, const Case& c) {
  int64_t total = 0;
  for (const auto& s : fixture.tokens)
    total += static_cast<int64_t>(s.size());
  LatentCache cache =
      model.NewCache(total, static_cast<int64_t>(fixture.tokens.size()), c.kv_dtype, 4);
  if (c.round_rows_as) cache.RoundRowsAs(*c.round_rows_as);
  std::vector<SequenceCache> caches(fixture.tokens.size());
  std::vector<std::vector<float>> rows(fixture.tokens.size());
  ForwardOptions options;
  options.attention = c.form;
  options.micro_batches = c.micro_batches;
  std::vector<float> logits;
  const int64_t vocab = model.config().vocab_size;
  const int64_t prefill_until = c.decode_from < 0 ? INT64_MAX : c.decode_from;

  ForwardBatch prefill;
  std::vector<size_t> members;
  for (size_t s = 0; s < fixture.tokens.size(); ++s) {
    int64_t count =
        std::min<int64_t>(prefill_until, static_cast<int64_t>(fixture.tokens[s].size()));
    if (count == 0) continue;
    prefill.Add(fixture.tokens[s].data(), count, &caches[s]);
    members.push_back(s);
  }
  if (prefill.size() > 0) {
    Status status = model.Forward(prefill, cache, options, &logits);
    EXPECT_TRUE(status.ok()) << status.message();
    for (size_t i = 0; i < members.size(); ++i) {
      const auto& slice = prefill.sequences[i];
      rows[members[i]].assign(logits.begin() + slice.token_offset * vocab,
                              logits.begin() + (slice.token_offset + slice.token_count) * vocab);
    }
  }
  while (true) {
    ForwardBatch step;
    members.clear();
    for (size_t s = 0; s < fixture.tokens.size(); ++s) {
      const int64_t position = caches[s].length;
      if (position >= static_cast<int64_t>(fixture.tokens[s].size())) continue;
      step.Add(&fixture.tokens[s][position], 1, &caches[s]);
      members.push_back(s);
    }
    if (members.empty()) break;
    Status status = model.Forward(step, cache, options, &logits);
    EXPECT_TRUE(status.ok()) << status.message();
    if (!status.ok()) break;
    for (size_t i = 0; i < members.size(); ++i)
      rows[members[i]].insert(rows[members[i]].end(), logits.begin() + i * vocab,
                              logits.begin() + (i + 1) * vocab);
  }
  std::vector<float> all;
  for (const auto& r : rows)
    all.insert(all.end(), r.begin(), r.end());
  return all;
}

class ConformanceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ConformanceTest, MatchesTransformers) {
  const Case& c = GetParam();
  Fixture fixture = LoadFixture(c.fixture);
  auto model = Model::Load(fixture.directory);
  ASSERT_TRUE(model.ok()) << model.status().message();
  std::vector<float> logits = RunModel(*model.value(), fixture, c);
  auto comparison = CompareLogits(fixture.logits, logits, fixture.vocab);
  EXPECT_GT(comparison.argmax_checked, 0);
  if (c.kv_dtype == DType::kF32) {
    // With an f32 cache the arithmetic is the reference's: the bar (max |Δ| ≤ 1e-2 ·
    // max|logit|) with a hundredfold margin.
    EXPECT_EQ(comparison.argmax_mismatches, 0);
    EXPECT_LE(comparison.max_abs_diff, 1e-4 * comparison.max_abs_reference);
  } else {
    // A bf16 cache rounds the cached latent, which can flip a near-tie expert choice in a later
    // layer (one row of tiny-v3-qproj-f16 does), as HF itself does in bf16. Every other row must
    // meet the bar.
    const int64_t rows = static_cast<int64_t>(comparison.row_max_diff.size());
    testing::ExpectRoundedPathMeetsTheBar(*model.value(), fixture, comparison, rows / 20,
                                          c.fixture);
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const auto& name : testing::FixtureNames()) {
    for (DType kv : {DType::kF32, DType::kBF16}) {
      cases.push_back({name, AttentionForm::kAuto, kv, -1});
      cases.push_back({name, AttentionForm::kAuto, kv, 5});
      cases.push_back({name, AttentionForm::kAuto, kv, 0});
    }
    cases.push_back({name, AttentionForm::kExpanded, DType::kF32, 5});
    cases.push_back({name, AttentionForm::kAbsorbed, DType::kF32, -1});
    cases.push_back({name, AttentionForm::kAuto, DType::kF32, -1, true});
    cases.push_back({name, AttentionForm::kAuto, DType::kF32, 5, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ConformanceTest, ::testing::ValuesIn(AllCases()), CaseName);

// Decoding after a prefill must reproduce the whole-sequence logits of the same run closely,
// independent of the reference (same engine, two paths through the latent cache).
TEST(ConformanceTest, DecodeAfterPrefillEqualsPrefill) {
  Fixture fixture = LoadFixture("tiny-v3-fp8");
  auto model = Model::Load(fixture.directory);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto whole =
      RunModel(*model.value(), fixture, {fixture.directory, AttentionForm::kAuto, DType::kF32, -1});
  auto stepped =
      RunModel(*model.value(), fixture, {fixture.directory, AttentionForm::kAuto, DType::kF32, 3});
  auto comparison = CompareLogits(whole, stepped, fixture.vocab);
  EXPECT_LE(comparison.max_abs_diff, 1e-5 * comparison.max_abs_reference);
}

// An fp8 latent cache gives, bit for bit, the logits of an f32 cache whose rows are rounded as
// fp8 rows are: every path through the cache (expanded and absorbed prompts, decode steps, a
// DSA model's index keys and chosen rows) reads exactly the values the cache holds. Against
// transformers fp8 is judged in docs/benchmarks.md (how far a real model's logits move), not by
// a bar here: its rounding (1 part in 16) moves a model this small by more than its near-ties.
TEST(ConformanceTest, AnFp8CacheGivesTheLogitsOfAnF32CacheRoundingAsFp8) {
  for (const auto& name : testing::FixtureNames()) {
    const Fixture fixture = LoadFixture(name);
    auto model = Model::Load(fixture.directory);
    ASSERT_TRUE(model.ok()) << model.status().message();
    for (int64_t decode_from : {int64_t{-1}, int64_t{0}, int64_t{5}}) {
      const std::vector<float> fp8 = RunModel(
          *model.value(), fixture, {name, AttentionForm::kAuto, DType::kF8E4M3, decode_from});
      const std::vector<float> f32 =
          RunModel(*model.value(), fixture,
                   {name, AttentionForm::kAuto, DType::kF32, decode_from, false, DType::kF8E4M3});
      ASSERT_EQ(fp8.size(), f32.size());
      EXPECT_EQ(0, std::memcmp(fp8.data(), f32.data(), fp8.size() * sizeof(float)))
          << name << " decode_from " << decode_from;
      // And the rounding is there: an f32 cache that does not round differs.
      const std::vector<float> exact =
          RunModel(*model.value(), fixture, {name, AttentionForm::kAuto, DType::kF32, decode_from});
      EXPECT_NE(0, std::memcmp(fp8.data(), exact.data(), fp8.size() * sizeof(float))) << name;
    }
  }
}

// The MTP module of the fp8 fixture is recognized and kept, not rejected or ignored.
TEST(ConformanceTest, MtpTensorsAreLoaded) {
  auto with_mtp = Model::Load(LoadFixture("tiny-v3-fp8").directory);
  ASSERT_TRUE(with_mtp.ok()) << with_mtp.status().message();
  ASSERT_EQ(with_mtp.value()->weights().mtp.size(), 1u);
  EXPECT_TRUE(with_mtp.value()->weights().mtp[0].block.is_moe);
  EXPECT_EQ(with_mtp.value()->weights().mtp[0].eh_proj.cols,
            2 * with_mtp.value()->config().hidden_size);
  EXPECT_TRUE(with_mtp.value()->unused_tensors().empty());
  auto without = Model::Load(LoadFixture("tiny-v3-bf16").directory);
  ASSERT_TRUE(without.ok()) << without.status().message();
  EXPECT_TRUE(without.value()->weights().mtp.empty());
}

// A fixture as Kimi K2.5 ships its language model (KimiK25ForConditionalGeneration): the
// config under text_config, every tensor under "language_model.", beside a vision tower and
// projector (a few stand-in tensors). `quantization_at_top`: the fp8 quantization_config at the
// top level instead of in text_config. Returns the new fixture's directory.
std::string WrapAsKimiK25(const std::string& name, bool quantization_at_top) {
  namespace fs = std::filesystem;
  const Fixture fixture = LoadFixture(name);
  const std::string dir = testing::TempDirectory("kimi_k25_" + name);
  std::ifstream in(fixture.directory + "/config.json");
  nlohmann::json text = nlohmann::json::parse(in);
  nlohmann::json config = {{"architectures", {"KimiK25ForConditionalGeneration"}},
                           {"model_type", "kimi_k25"},
                           {"media_placeholder_token_id", 163605},
                           {"vision_config", {{"hidden_size", 8}, {"patch_size", 14}}}};
  if (quantization_at_top && text.contains("quantization_config")) {
    config["quantization_config"] = text["quantization_config"];
    text.erase("quantization_config");
  }
  config["text_config"] = text;
  std::ofstream(dir + "/config.json") << config.dump(2);
  testing::WritePrefixedCheckpoint(fixture.directory, dir, "language_model.");
  for (const char* file : {"tokens.txt", "logits.bin", "meta.json"})
    fs::copy_file(fixture.directory + "/" + file, dir + "/" + file,
                  fs::copy_options::overwrite_existing);
  return dir;
}

// Kimi K2.5's language model is DeepSeek-V3's (vLLM runs it as DeepseekV2Model on text_config):
// the wrapped fixtures give transformers' DeepseekV3 logits, bit for bit the plain fixtures'.
TEST(ConformanceTest, KimiK25LanguageModelMatchesTransformers) {
  for (const auto& [name, quantization_at_top] : std::vector<std::pair<std::string, bool>>{
           {"tiny-v3-bf16", false}, {"tiny-v3-fp8", false}, {"tiny-v3-fp8", true}}) {
    SCOPED_TRACE(name + (quantization_at_top ? ", quantization_config at the top" : ""));
    const Fixture fixture = LoadFixture(WrapAsKimiK25(name, quantization_at_top));
    auto wrapped = Model::Load(fixture.directory);
    ASSERT_TRUE(wrapped.ok()) << wrapped.status().message();
    EXPECT_EQ(wrapped.value()->config().wrapper_type, "kimi_k25");
    // Every language-model tensor read, the vision tower's set aside.
    EXPECT_TRUE(wrapped.value()->unused_tensors().empty());
    auto plain = Model::Load(LoadFixture(name).directory);
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    EXPECT_EQ(wrapped.value()->weights().mtp.size(), plain.value()->weights().mtp.size());
    const Case c{name, AttentionForm::kAuto, DType::kF32, 3};
    const std::vector<float> logits = RunModel(*wrapped.value(), fixture, c);
    EXPECT_EQ(logits, RunModel(*plain.value(), fixture, c));
    auto comparison = CompareLogits(fixture.logits, logits, fixture.vocab);
    EXPECT_EQ(comparison.argmax_mismatches, 0);
    EXPECT_LE(comparison.max_abs_diff, 1e-4 * comparison.max_abs_reference);
  }
}

}  // namespace
}  // namespace sy

namespace sy {
namespace {

// The prefill GEMM path (AVX-512 BF16, activations rounded to bf16) forced for every product:
// the bar on every fixture, routing flips aside as with the bf16 cache.
TEST(ConformanceTest, Bf16GemmPathMeetsTheBar) {
  if (!kernels::HasAvx512Bf16()) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  kernels::GlobalKernelOptions().bf16_gemm_min_rows = 1;
  kernels::GlobalKernelOptions().allow_bf16_gemm = true;  // as --prefill-gemm other than own
  for (const auto& name : testing::FixtureNames()) {
    Fixture fixture = LoadFixture(name);
    auto model = Model::Load(fixture.directory);
    ASSERT_TRUE(model.ok()) << model.status().message();
    auto logits = RunModel(*model.value(), fixture, {name, AttentionForm::kAuto, DType::kF32, 5});
    auto comparison = CompareLogits(fixture.logits, logits, fixture.vocab);
    testing::ExpectRoundedPathMeetsTheBar(*model.value(), fixture, comparison,
                                          static_cast<int64_t>(comparison.row_max_diff.size()) / 20,
                                          name);
  }
  kernels::GlobalKernelOptions().bf16_gemm_min_rows = 128;
  kernels::GlobalKernelOptions().allow_bf16_gemm = false;
}

// The bf16 dot kernel (every product with fp8 or bf16 weights, activations rounded to bf16): the
// same bar on every fixture, and the trained default model's greedy tokens unchanged.
TEST(ConformanceTest, Bf16DotPathMeetsTheBar) {
  if (!kernels::HasBf16Dot()) GTEST_SKIP() << "no AVX-512 BF16 and VBMI on this CPU";
  kernels::GlobalKernelOptions().bf16_dot = true;
  for (const auto& name : testing::FixtureNames()) {
    Fixture fixture = LoadFixture(name);
    auto model = Model::Load(fixture.directory);
    ASSERT_TRUE(model.ok()) << model.status().message();
    // f32 cache; and a bf16 cache, whose decode steps run the bf16 MLA kernel.
    for (auto [kv, decode_from] :
         {std::pair{DType::kF32, int64_t{-1}}, std::pair{DType::kF32, int64_t{3}},
          std::pair{DType::kBF16, int64_t{3}}}) {
      auto logits =
          RunModel(*model.value(), fixture, {name, AttentionForm::kAuto, kv, decode_from});
      auto comparison = CompareLogits(fixture.logits, logits, fixture.vocab);
      // Rounded activations flip a near-tie expert choice now and then on these random models
      // (two rows of tiny-v3-fp8's 38 move by 0.16 and 0.22 of the largest logit; the others stay
      // under 0.008): at most two such rows, or one in twenty.
      const int64_t rows = static_cast<int64_t>(comparison.row_max_diff.size());
      testing::ExpectRoundedPathMeetsTheBar(*model.value(), fixture, comparison,
                                            std::max<int64_t>(2, rows / 20),
                                            name + " decode from " + std::to_string(decode_from) +
                                                " cache " + std::string(DTypeName(kv)));
    }
  }
  Fixture fixture = LoadFixture("default-model");
  auto model = Model::Load(std::string(SY_SOURCE_DIR) + "/models/default");
  ASSERT_TRUE(model.ok()) << model.status().message();
  std::vector<float> all;
  for (const auto& ids : fixture.tokens) {
    const int64_t T = static_cast<int64_t>(ids.size());
    LatentCache cache = model.value()->NewCache(T, 1, DType::kBF16);
    SequenceCache seq;
    ForwardBatch batch;
    batch.Add(ids.data(), T, &seq);
    std::vector<float> logits;
    ASSERT_TRUE(model.value()->Forward(batch, cache, ForwardOptions{}, &logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  auto comparison = CompareLogits(fixture.logits, all, fixture.vocab);
  EXPECT_EQ(comparison.argmax_mismatches, 0);
  EXPECT_LE(comparison.max_abs_diff, 2e-2 * comparison.max_abs_reference);
  kernels::GlobalKernelOptions().bf16_dot = false;
}

// The reference kernels (no packing) give the same logits as the fast ones.
TEST(ConformanceTest, ReferenceKernelsAgreeWithFastOnes) {
  Fixture fixture = LoadFixture("tiny-v3-fp8");
  WeightLoadOptions reference;
  reference.pack = false;
  auto slow = Model::Load(fixture.directory, reference);
  auto fast = Model::Load(fixture.directory);
  ASSERT_TRUE(slow.ok() && fast.ok());
  Case c{"tiny-v3-fp8", AttentionForm::kAuto, DType::kF32, 4};
  auto comparison = CompareLogits(RunModel(*slow.value(), fixture, c),
                                  RunModel(*fast.value(), fixture, c), fixture.vocab);
  EXPECT_LE(comparison.max_abs_diff, 1e-5 * comparison.max_abs_reference);
}

}  // namespace
}  // namespace sy

namespace sy {
namespace {

// The trained default model (models/default): its logits against transformers' DeepseekV3 on the
// dequantized checkpoint, and its MTP module against the MTP block built from transformers'
// DeepseekV3DecoderLayer (tools/train_default_model.py --fixture). MTP row p pairs the final
// hidden state at p with token p + 1.
TEST(ConformanceTest, DefaultModelAndItsMtpModuleMatchTheReferences) {
  Fixture fixture = LoadFixture("default-model");
  auto loaded = Model::Load(std::string(SY_SOURCE_DIR) + "/models/default");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Model& model = *loaded.value();
  ASSERT_TRUE(model.has_mtp());
  const std::string mtp_bytes = testing::ReadFile(fixture.directory + "/mtp_logits.bin");
  std::vector<float> mtp_reference(mtp_bytes.size() / sizeof(float));
  std::memcpy(mtp_reference.data(), mtp_bytes.data(), mtp_reference.size() * sizeof(float));
  const int64_t D = model.config().hidden_size;
  std::vector<float> logits_all, mtp_all;
  for (const auto& ids : fixture.tokens) {
    const int64_t T = static_cast<int64_t>(ids.size());
    LatentCache cache = model.NewCache(T, 1, DType::kF32, 16, /*mtp=*/true);
    SequenceCache seq;
    ForwardBatch batch;
    batch.Add(ids.data(), T, &seq);
    std::vector<float> logits, hidden, mtp_logits;
    ASSERT_TRUE(model.Forward(batch, cache, ForwardOptions{}, &logits, &hidden).ok());
    logits_all.insert(logits_all.end(), logits.begin(), logits.end());
    ASSERT_EQ(hidden.size(), static_cast<size_t>(T * D));
    ForwardBatch mtp;
    mtp.sequences.push_back({0, T - 1, 0, &seq});
    mtp.tokens.assign(ids.begin() + 1, ids.end());
    Status status = model.ForwardMtp(mtp, hidden.data(), cache, ForwardOptions{}, &mtp_logits);
    ASSERT_TRUE(status.ok()) << status.message();
    mtp_all.insert(mtp_all.end(), mtp_logits.begin(), mtp_logits.end());
    EXPECT_EQ(seq.length, T);  // the MTP layer caught up; the main layers' length stands
  }
  auto main = CompareLogits(fixture.logits, logits_all, fixture.vocab);
  EXPECT_EQ(main.argmax_mismatches, 0);
  EXPECT_LE(main.max_abs_diff, 1e-4 * main.max_abs_reference);
  auto mtp = CompareLogits(mtp_reference, mtp_all, fixture.vocab);
  EXPECT_GT(mtp.argmax_checked, 0);
  EXPECT_EQ(mtp.argmax_mismatches, 0);
  EXPECT_LE(mtp.max_abs_diff, 1e-4 * mtp.max_abs_reference);
}

// The absorbed form on the default model, whose kv_b_proj heads fall in whole fp8 scale blocks:
// its per-head matrices are then fp8 with their own scales (the fixtures above keep f32 ones:
// tiny-v3-fp8's heads straddle its blocks). Prompts whole and stepped token by token, against
// transformers' logits.
TEST(ConformanceTest, DefaultModelAbsorbedOnFp8HeadsMatchesTheReference) {
  Fixture fixture = LoadFixture("default-model");
  auto loaded = Model::Load(std::string(SY_SOURCE_DIR) + "/models/default");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  ASSERT_EQ(loaded.value()->weights().layers[0].self_attn.w_uk_t[0].packed->dtype, DType::kF8E4M3);
  for (int64_t decode_from : {-1, 1}) {
    auto logits = RunModel(*loaded.value(), fixture,
                           {"default-model", AttentionForm::kAbsorbed, DType::kF32, decode_from});
    auto comparison = CompareLogits(fixture.logits, logits, fixture.vocab);
    EXPECT_EQ(comparison.argmax_mismatches, 0) << "decode from " << decode_from;
    EXPECT_LE(comparison.max_abs_diff, 1e-4 * comparison.max_abs_reference)
        << "decode from " << decode_from;
  }
}

// Without the MTP layer in the cache, or without a module, drafting is a clear error.
TEST(ConformanceTest, MtpNeedsItsCacheLayerAndModule) {
  auto loaded = Model::Load(std::string(SY_SOURCE_DIR) + "/models/default");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Model& model = *loaded.value();
  LatentCache cache = model.NewCache(16, 1, DType::kF32);
  SequenceCache seq;
  ForwardBatch batch;
  const std::vector<int32_t> ids = {0, 5, 9};
  batch.Add(ids.data(), 3, &seq);
  std::vector<float> logits, hidden;
  ASSERT_TRUE(model.Forward(batch, cache, ForwardOptions{}, &logits, &hidden).ok());
  Status status = model.ForwardMtp(batch, hidden.data(), cache, ForwardOptions{}, &logits);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("MTP"), std::string::npos) << status.message();
  auto plain = Model::Load(LoadFixture("tiny-v3-bf16").directory);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain.value()->has_mtp());
}

}  // namespace
}  // namespace sy
