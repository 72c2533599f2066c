// A deepseek2 GGUF of the default model (made at test time by tests/gguf/make_models.sh, laid out
// as llama.cpp's converter lays it out) loaded as a model: its config against config.json, its
// logits against transformers' (the committed golden logits) and against the same model loaded
// from safetensors, and the errors for files it cannot load.
//
// Tolerances, from the arithmetic:
// - F32: the GGUF holds fp8 · scale rounded once to f32, the very weights the reference ran on,
//   and switchyard computes in f32: the bar of the f32 path, 1e-4 · max|logit| (conformance_test).
//   The fused attn_kv_b file must give the same bits as the split one (the join is a permutation).
// - F16: 11 significant bits, 2^-11 of each weight at most (weights under f16's 6e-5 normal
//   limit move by at most 2^-25, nothing against the logits): a quarter of BF16's bar, 2.5e-3.
// - BF16: every weight rounded to 8 significant bits moves by at most 2^-9 of itself; through
//   4 layers the logits move by a few times that relative to the largest one: the bar
//   1e-2 · max|logit| on 95% of rows (a near-tie expert choice may flip a row), top-1 unchanged
//   wherever the reference's top-2 margin is clear.
// - Q8_0: each weight moves by at most half a step of its block's d = max|w|/127 (plus d's f16
//   rounding), ≤ 0.4% of the block's largest weight, 2-4× BF16's: 2e-2 · max|logit| on 95% of
//   rows, top-1 unchanged where the margin is clear.
// - Q4_K with Q6_K/Q5_0/Q8_0 where llama.cpp's Q4_K_M puts them (a round-to-nearest encoder of
//   tools/gguf, gguf-py having none): see QuantizedFilesMeetTheirBars.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/fast_linear.h"
#include "model/feed_forward.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "tensor/packed_matrix.h"

namespace sy {
namespace {

const bool kDotKernelOff = [] {
  // f32 products everywhere, as conformance_test holds the f32 bars.
  kernels::GlobalKernelOptions().bf16_dot = false;
  return true;
}();

const std::string kModels = SY_GGUF_MODELS_DIR;
const std::string kDefaultModel = std::string(SY_SOURCE_DIR) + "/models/default";
const std::string kGoldenDir = std::string(SY_FIXTURES_DIR) + "/default-model";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::vector<int32_t>> GoldenTokens() {
  // "1,2,3;4,5": sequences split by ';', ids by ','.
  std::vector<std::vector<int32_t>> sequences;
  std::stringstream text(ReadAll(kGoldenDir + "/tokens.txt"));
  for (std::string sequence; std::getline(text, sequence, ';');) {
    std::stringstream ids(sequence);
    sequences.emplace_back();
    for (std::string id; std::getline(ids, id, ',');)
      sequences.back().push_back(std::stoi(id));
  }
  return sequences;
}

std::vector<float> GoldenLogits() {
  const std::string bytes = ReadAll(kGoldenDir + "/logits.bin");
  std::vector<float> logits(bytes.size() / sizeof(float));
  std::memcpy(logits.data(), bytes.data(), bytes.size());
  return logits;
}

// Every sequence prefilled on its own, with an f32 cache.
std::vector<float> RunLogits(const Model& model, const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<float> all;
  for (const auto& ids : seqs) {
    const int64_t T = static_cast<int64_t>(ids.size());
    LatentCache cache = model.NewCache(T, 1, DType::kF32);
    SequenceCache seq;
    ForwardBatch batch;
    batch.Add(ids.data(), T, &seq);
    std::vector<float> logits;
    Status status = model.Forward(batch, cache, ForwardOptions{}, &logits);
    EXPECT_TRUE(status.ok()) << status.message();
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// Every sequence fed one token a step (decode steps: the absorbed attention form).
std::vector<float> RunStepwise(const Model& model, const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<float> all;
  for (const auto& ids : seqs) {
    const int64_t T = static_cast<int64_t>(ids.size());
    LatentCache cache = model.NewCache(T, 1, DType::kF32);
    SequenceCache seq;
    for (int64_t t = 0; t < T; ++t) {
      ForwardBatch batch;
      batch.Add(ids.data() + t, 1, &seq);
      std::vector<float> logits;
      Status status = model.Forward(batch, cache, ForwardOptions{}, &logits);
      EXPECT_TRUE(status.ok()) << status.message();
      all.insert(all.end(), logits.begin(), logits.end());
    }
  }
  return all;
}

struct Comparison {
  double max_abs_reference = 0;
  std::vector<double> row_max_diff;
  int64_t clear_rows = 0, top1_mismatches = 0, top1_agree = 0;  // agree: over all rows
  double MaxDiff() const {
    double m = 0;
    for (double d : row_max_diff)
      m = std::max(m, d);
    return m;
  }
  int64_t RowsOver(double relative) const {
    int64_t n = 0;
    for (double d : row_max_diff)
      n += d > relative * max_abs_reference;
    return n;
  }
};

// Top-1 is compared on rows whose reference top-2 margin exceeds `clear_margin` × max|logit|
// (a clear choice; 0.05 / 15 ≈ 0.0033: the conformance tests' 0.05 on this model).
Comparison Compare(const std::vector<float>& reference, const std::vector<float>& got,
                   int64_t vocab, double clear_margin = 0.0033) {
  Comparison c;
  EXPECT_EQ(reference.size(), got.size());
  const size_t rows = std::min(reference.size(), got.size()) / vocab;
  for (size_t i = 0; i < rows * vocab; ++i)
    c.max_abs_reference = std::max(c.max_abs_reference, std::fabs(double{reference[i]}));
  const double margin = clear_margin * c.max_abs_reference;
  for (size_t r = 0; r < rows; ++r) {
    const float* want = reference.data() + r * vocab;
    const float* have = got.data() + r * vocab;
    double diff = 0;
    int64_t best = 0, second = -1, got_best = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      diff = std::max(diff, std::fabs(static_cast<double>(want[v]) - have[v]));
      if (want[v] > want[best]) best = v;
      if (have[v] > have[got_best]) got_best = v;
    }
    for (int64_t v = 0; v < vocab; ++v)
      if (v != best && (second < 0 || want[v] > want[second])) second = v;
    c.row_max_diff.push_back(diff);
    c.top1_agree += best == got_best;
    if (want[best] - want[second] > margin) {
      ++c.clear_rows;
      c.top1_mismatches += best != got_best;
    }
  }
  return c;
}

std::unique_ptr<Model> LoadOrFail(const std::string& path) {
  auto model = Model::Load(path);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::move(model).value() : nullptr;
}

TEST(GgufModelTest, ConfigMatchesConfigJson) {
  auto from_gguf = LoadGgufModelConfig(kModels + "/default-f32.gguf");
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().message();
  auto from_json = LoadModelConfig(kDefaultModel + "/config.json");
  ASSERT_TRUE(from_json.ok());
  const ModelConfig& g = from_gguf.value();
  const ModelConfig& j = from_json.value();
  EXPECT_EQ(g.model_type, j.model_type);
  for (auto [a, b] : {std::pair{g.vocab_size, j.vocab_size},
                      {g.hidden_size, j.hidden_size},
                      {g.intermediate_size, j.intermediate_size},
                      {g.moe_intermediate_size, j.moe_intermediate_size},
                      {g.num_hidden_layers, j.num_hidden_layers},
                      {g.num_attention_heads, j.num_attention_heads},
                      {g.n_shared_experts, j.n_shared_experts},
                      {g.n_routed_experts, j.n_routed_experts},
                      {g.num_experts_per_tok, j.num_experts_per_tok},
                      {g.n_group, j.n_group},
                      {g.topk_group, j.topk_group},
                      {g.first_k_dense_replace, j.first_k_dense_replace},
                      {g.kv_lora_rank, j.kv_lora_rank},
                      {g.qk_nope_head_dim, j.qk_nope_head_dim},
                      {g.qk_rope_head_dim, j.qk_rope_head_dim},
                      {g.v_head_dim, j.v_head_dim},
                      {g.max_position_embeddings, j.max_position_embeddings},
                      {g.bos_token_id, j.bos_token_id},
                      {g.eos_token_id, j.eos_token_id}})
    EXPECT_EQ(a, b);
  EXPECT_EQ(g.q_lora_rank, j.q_lora_rank);
  EXPECT_EQ(g.scoring_func, j.scoring_func);
  EXPECT_EQ(g.topk_method, j.topk_method);
  EXPECT_EQ(g.norm_topk_prob, j.norm_topk_prob);
  EXPECT_EQ(g.tie_word_embeddings, j.tie_word_embeddings);
  EXPECT_EQ(g.routed_scaling_factor, j.routed_scaling_factor);
  EXPECT_EQ(g.rope_theta, j.rope_theta);
  // Stored as f32 in the file.
  EXPECT_EQ(static_cast<float>(g.rms_norm_eps), static_cast<float>(j.rms_norm_eps));
  ASSERT_TRUE(g.yarn && j.yarn);
  EXPECT_EQ(g.yarn->factor, j.yarn->factor);
  EXPECT_EQ(g.yarn->original_max_position_embeddings, j.yarn->original_max_position_embeddings);
  EXPECT_EQ(g.yarn->beta_fast, j.yarn->beta_fast);
  EXPECT_EQ(g.yarn->beta_slow, j.yarn->beta_slow);
  EXPECT_EQ(g.yarn->mscale, j.yarn->mscale);
  EXPECT_EQ(g.yarn->mscale_all_dim, j.yarn->mscale_all_dim);
  EXPECT_EQ(g.num_nextn_predict_layers, 0);  // the converter leaves MTP layers out
}

TEST(GgufModelTest, F32MatchesTransformersAndTheSafetensorsModel) {
  auto gguf = LoadOrFail(kModels + "/default-f32.gguf");
  auto safetensors = LoadOrFail(kDefaultModel);
  ASSERT_TRUE(gguf && safetensors);
  const auto tokens = GoldenTokens();
  const auto logits = RunLogits(*gguf, tokens);
  const int64_t vocab = gguf->config().vocab_size;
  auto golden = Compare(GoldenLogits(), logits, vocab);
  EXPECT_GT(golden.clear_rows, 0);
  EXPECT_EQ(golden.top1_mismatches, 0);
  EXPECT_LE(golden.MaxDiff(), 1e-4 * golden.max_abs_reference);
  auto same_model = Compare(RunLogits(*safetensors, tokens), logits, vocab);
  EXPECT_EQ(same_model.top1_mismatches, 0);
  EXPECT_LE(same_model.MaxDiff(), 1e-4 * same_model.max_abs_reference);
  std::printf("F32 GGUF: max |Δ| %.3g vs transformers, %.3g vs safetensors (max |logit| %.3g)\n",
              golden.MaxDiff(), same_model.MaxDiff(), golden.max_abs_reference);

  // The older layout, one fused attn_kv_b per layer, gives the same bits; so does a file with
  // both layouts.
  for (const char* file : {"default-f32-fused-kv-b.gguf", "default-f32-both-kv-b.gguf"}) {
    auto other = LoadOrFail(kModels + "/" + file);
    ASSERT_TRUE(other);
    EXPECT_EQ(RunLogits(*other, tokens), logits) << file;
  }
}

// F32, F16 and BF16 tensors are the file's own bytes: the checkpoint points into the mapped file
// rather than holding a copy, which stayed resident beside the packed weights (a BF16 file at
// twice its size, an F16 one decoded to float32 at four times).
TEST(GgufModelTest, PlainTypesAreReadInPlace) {
  for (const auto& [name, dtype] :
       {std::pair{"default-f32.gguf", DType::kF32}, std::pair{"default-f16.gguf", DType::kF16},
        std::pair{"default-bf16.gguf", DType::kBF16}}) {
    SCOPED_TRACE(name);
    auto file = GgufFile::Open(kModels + "/" + name);
    ASSERT_TRUE(file.ok()) << file.status().message();
    auto config = GgufModelConfig(file.value());
    ASSERT_TRUE(config.ok());
    const uint8_t* begin = file->mapping()->data();
    const uint8_t* end = begin + file->mapping()->size();
    auto shards = GgufShards::Single(file.value());
    ASSERT_TRUE(shards.ok());
    auto checkpoint = GgufCheckpoint(shards.value(), config.value());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().message();
    // The embedding (whole), one expert cut from a stacked tensor, a dense MLP matrix.
    for (const char* tensor :
         {"model.embed_tokens.weight", "model.layers.1.mlp.experts.5.down_proj.weight",
          "model.layers.0.mlp.gate_proj.weight"}) {
      const CheckpointTensor* t = checkpoint->Find(tensor);
      ASSERT_NE(t, nullptr) << tensor;
      EXPECT_EQ(t->entry->dtype, dtype) << tensor;
      EXPECT_TRUE(t->data >= begin && t->data < end) << tensor << " is a copy";
    }
  }
}

// Under expert parallelism a rank decodes only the experts it holds.
TEST(GgufModelTest, ARankDecodesOnlyItsExperts) {
  WeightLoadOptions options;
  options.expert_begin = 8;
  options.expert_end = 16;
  auto model = Model::Load(kModels + "/default-q8_0.gguf", options);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const auto& experts = model.value()->weights().layers[1].moe.experts;
  ASSERT_EQ(experts.size(), 32u);
  for (int64_t e = 0; e < 32; ++e)
    EXPECT_EQ(experts[e].empty(), e < 8 || e >= 16) << e;

  auto file = GgufFile::Open(kModels + "/default-q8_0.gguf");
  ASSERT_TRUE(file.ok());
  auto config = GgufModelConfig(file.value());
  ASSERT_TRUE(config.ok());
  auto shards = GgufShards::Single(file.value());
  ASSERT_TRUE(shards.ok());
  auto all = GgufCheckpoint(shards.value(), config.value());
  auto some = GgufCheckpoint(shards.value(), config.value(),
                             [](int64_t, int64_t expert) { return expert < 8; });
  ASSERT_TRUE(all.ok() && some.ok());
  // 3 MoE layers × 3 projections × 24 experts left out.
  EXPECT_EQ(all->tensors().size() - some->tensors().size(), 3u * 3u * 24u);
}

// Three shards (split.no / split.count), opened from the first, are the single file.
TEST(GgufModelTest, ShardedFileLoadsLikeTheSingleOne) {
  auto single = LoadOrFail(kModels + "/default-f32.gguf");
  auto sharded = LoadOrFail(kModels + "/split/default-f32-00001-of-00003.gguf");
  ASSERT_TRUE(single && sharded);
  const auto tokens = GoldenTokens();
  EXPECT_EQ(RunLogits(*sharded, tokens), RunLogits(*single, tokens));

  // A missing shard, and a first shard under another name, are errors naming them.
  const std::string dir = ::testing::TempDir() + "/gguf-shards";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (int i = 1; i <= 2; ++i) {
    const std::string name = "default-f32-0000" + std::to_string(i) + "-of-00003.gguf";
    std::filesystem::create_symlink(kModels + "/split/" + name, dir + "/" + name);
  }
  auto missing = GgufShards::Open(dir + "/default-f32-00001-of-00003.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("default-f32-00003-of-00003.gguf"), std::string::npos)
      << missing.status().message();
  std::filesystem::create_symlink(kModels + "/split/default-f32-00001-of-00003.gguf",
                                  dir + "/renamed.gguf");
  auto renamed = GgufShards::Open(dir + "/renamed.gguf");
  ASSERT_FALSE(renamed.ok());
  EXPECT_NE(renamed.status().message().find("-00001-of-00003.gguf"), std::string::npos)
      << renamed.status().message();
}

// Tensor parallelism over heads keeps a GGUF's blocks in the shards: q_b_proj's rows always (a
// row is whole blocks), o_proj's columns where the shard is whole blocks of its type. The
// default model's o_proj has 8 heads × 32 columns: Q8_0's 32-column blocks split anywhere, the
// Q4_K mix's Q6_K (256-column blocks) cannot be split in two, so that shard is decoded to f32 and
// the load says so. gguf_parallel_test runs the same shards under mpirun against one process.
TEST(GgufModelTest, TensorParallelShardsKeepTheirBlocks) {
  auto packed_dtype = [](const Matrix& m) { return m.packed ? m.packed->dtype : DType::kF32; };
  for (const char* file : {"default-q8_0.gguf", "default-q4_k_mix.gguf"}) {
    SCOPED_TRACE(file);
    const bool q6_k_output = std::string(file).find("q4_k_mix") != std::string::npos;
    for (int rank = 0; rank < 2; ++rank) {
      WeightLoadOptions options;
      options.tp_rank = rank;
      options.tp_size = 2;
      ::testing::internal::CaptureStderr();
      auto model = Model::Load(kModels + "/" + file, options);
      const std::string said = ::testing::internal::GetCapturedStderr();
      ASSERT_TRUE(model.ok()) << model.status().message();
      const ModelConfig& c = model.value()->config();
      for (const auto& layer : model.value()->weights().layers) {
        const AttentionWeights& a = layer.self_attn;
        EXPECT_EQ(a.q_b_proj.rows, c.num_attention_heads / 2 * c.qk_head_dim());
        EXPECT_EQ(packed_dtype(a.q_b_proj), DType::kGgml);
        EXPECT_EQ(a.o_proj.cols, c.num_attention_heads / 2 * c.v_head_dim);
        EXPECT_EQ(packed_dtype(a.o_proj), q6_k_output ? DType::kF32 : DType::kGgml);
        EXPECT_EQ(a.w_uk_t.size(), static_cast<size_t>(c.num_attention_heads / 2));
      }
      // One line from the group's first rank, naming the matrix, the type and the columns.
      if (q6_k_output && rank == 0) {
        EXPECT_NE(said.find("model.layers.0.self_attn.o_proj: this rank's columns [0, 128) cut "
                            "Q6_K's 256-column blocks"),
                  std::string::npos)
            << said;
      } else {
        EXPECT_EQ(said.find("decoded to f32"), std::string::npos) << said;
      }
    }
  }
}

TEST(GgufModelTest, QuantizedFilesMeetTheirBars) {
  const auto tokens = GoldenTokens();
  const auto golden_logits = GoldenLogits();
  struct Case {
    const char* file;
    double bar;           // max |Δ| / max|logit| allowed on 95% of rows
    double clear_margin;  // top-1 compared where the reference's margin exceeds this × max|logit|
  };
  // Q4_K mix: each weight moves by up to half a step of its 32-weight sub-block, (max − min)/15,
  // plus the 6-bit rounding of the sub-block's min: about 8× Q8_0's worst case, so 8× its bar.
  // Where every logit moves by at most bar × max|logit|, top-1 can only change on rows whose
  // margin is under twice that; it is checked on the others.
  for (const Case& c :
       {Case{"default-f16.gguf", 2.5e-3, 0.0033}, Case{"default-bf16.gguf", 1e-2, 0.0033},
        Case{"default-q8_0.gguf", 2e-2, 0.0033}, Case{"default-q4_k_mix.gguf", 0.15, 0.30}}) {
    SCOPED_TRACE(c.file);
    // The weights' rounding alone: dequantized at load, f32 products (the native products'
    // activation rounding is measured against this path below).
    GlobalGgufWeights() = GgufWeights::kDequantized;
    auto model = LoadOrFail(kModels + "/" + c.file);
    GlobalGgufWeights() = GgufWeights::kNative;
    ASSERT_TRUE(model);
    auto result = Compare(golden_logits, RunLogits(*model, tokens), model->config().vocab_size,
                          c.clear_margin);
    const int64_t rows = static_cast<int64_t>(result.row_max_diff.size());
    EXPECT_EQ(result.top1_mismatches, 0);
    EXPECT_LE(result.RowsOver(c.bar), rows / 20);
    std::printf(
        "%s: max |Δ| %.3g (%.2g of max |logit|), %lld of %lld rows over %.2g; top-1 "
        "checked on %lld rows; the same top-1 as transformers on %lld\n",
        c.file, result.MaxDiff(), result.MaxDiff() / result.max_abs_reference,
        static_cast<long long>(result.RowsOver(c.bar)), static_cast<long long>(rows), c.bar,
        static_cast<long long>(result.clear_rows), static_cast<long long>(result.top1_agree));
  }
}

// The quantized weights multiplied natively (kept as GGML blocks, activations quantized per row
// to int8: kernels/cpu/ggml_gemm.h) against the same file dequantized at load and multiplied in
// f32. The weights are the same values; only the activations move, each by at most half a step
// of its block's scale max|x|/127 — the same relative rounding Q8_0 applies to the weights, whose
// bar against the reference is 2e-2 · max|logit| on 95% of rows (above). Activations and weights
// rounded both ways: twice that, 4e-2, and top-1 unchanged where the margin is clear of twice
// the bar. Decode steps (the absorbed form) round two more products a layer than prefill does —
// q_nope against W_UKᵀ and the attention's latent output against W_UV (the expanded form's
// kv_b_proj is f32 in both paths) — half as many again: 6e-2.
TEST(GgufModelTest, NativeQuantizedProductsMatchTheDequantizedPath) {
  const auto tokens = GoldenTokens();
  for (const char* file : {"default-q8_0.gguf", "default-q4_k_mix.gguf"}) {
    SCOPED_TRACE(file);
    GlobalGgufWeights() = GgufWeights::kDequantized;
    auto dequantized = LoadOrFail(kModels + "/" + file);
    GlobalGgufWeights() = GgufWeights::kNative;
    auto native = LoadOrFail(kModels + "/" + file);
    ASSERT_TRUE(dequantized && native);
    // The native model really holds blocks: the experts and projections are packed as GGML.
    const auto& layer = native->weights().layers.back();
    ASSERT_TRUE(layer.self_attn.o_proj.packed);
    EXPECT_EQ(layer.self_attn.o_proj.packed->dtype, DType::kGgml);
    EXPECT_EQ(dequantized->weights().layers.back().self_attn.o_proj.packed->dtype, DType::kF32);
    // attn_k_b and attn_v_b serve as the absorbed matrices as they are.
    EXPECT_EQ(layer.self_attn.w_uk_t.front().packed->dtype, DType::kGgml);
    EXPECT_EQ(layer.self_attn.w_uv.front().packed->dtype, DType::kGgml);
    // Prefill (the expanded form) and decode steps (the absorbed one) both.
    auto prefill = Compare(RunLogits(*dequantized, tokens), RunLogits(*native, tokens),
                           native->config().vocab_size, 0.08);
    auto result = Compare(RunStepwise(*dequantized, tokens), RunStepwise(*native, tokens),
                          native->config().vocab_size, 0.12);
    EXPECT_EQ(prefill.top1_mismatches, 0);
    EXPECT_LE(prefill.RowsOver(4e-2), static_cast<int64_t>(prefill.row_max_diff.size()) / 20);
    const int64_t rows = static_cast<int64_t>(result.row_max_diff.size());
    EXPECT_EQ(result.top1_mismatches, 0);
    EXPECT_LE(result.RowsOver(6e-2), rows / 20);
    std::printf(
        "%s native vs dequantized: prefill max |Δ| %.2g of max |logit|; decode steps "
        "max |Δ| %.3g (%.2g of max |logit|), %lld of %lld rows over 6e-2; top-1 checked on %lld "
        "rows, the same on %lld of all\n",
        file, prefill.MaxDiff() / prefill.max_abs_reference, result.MaxDiff(),
        result.MaxDiff() / result.max_abs_reference, static_cast<long long>(result.RowsOver(6e-2)),
        static_cast<long long>(rows), static_cast<long long>(result.clear_rows),
        static_cast<long long>(result.top1_agree));
  }
}

// The shared expert in the routed experts' grouped pass (SharedExpertJoinsGroup) gives the very
// bits of its own FeedForward: every GGML product's row depends on its own activations only.
TEST(GgufModelTest, TheSharedExpertInTheGroupedPassKeepsItsBits) {
  auto model = LoadOrFail(kModels + "/default-q4_k_mix.gguf");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  const MoeWeights& moe = model->weights().layers.back().moe;
  ASSERT_TRUE(model->weights().layers.back().is_moe);
  ASSERT_TRUE(SharedExpertJoinsGroup(moe));
  const int64_t D = c.hidden_size;
  for (int64_t tokens : {1, 3, 9}) {
    SCOPED_TRACE(tokens);
    std::vector<float> x(static_cast<size_t>(tokens * D));
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 7));
    const ExpertRouting routing = RouteTokens(c, moe, x.data(), tokens);
    std::vector<float> joined(x.size());
    MoeForwardRouted(c, moe, routing, x.data(), joined.data());
    // Apart: the routed experts grouped, the shared one through FeedForward.
    std::vector<float> rows(static_cast<size_t>(tokens * routing.top_k * D)), shared(x.size()),
        apart(x.size());
    RunExperts(moe, routing, x.data(), D, rows.data());
    FeedForward(moe.shared_experts, x.data(), tokens, shared.data());
    FinalizeRouting(routing, rows.data(), shared.data(), D, apart.data());
    EXPECT_EQ(std::memcmp(joined.data(), apart.data(), x.size() * sizeof(float)), 0);
  }
}

// A hand-built GGUF: header, metadata pairs, tensor infos, zeroed data.
struct GgufBuilder {
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> infos;
  uint64_t pairs = 0, tensors = 0, data = 0;
  static void Put(std::vector<uint8_t>& out, const void* p, size_t n) {
    out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  }
  static void PutString(std::vector<uint8_t>& out, std::string_view s) {
    const uint64_t n = s.size();
    Put(out, &n, 8);
    Put(out, s.data(), s.size());
  }
  std::vector<uint8_t> kv;
  void String(std::string_view key, std::string_view value) {
    const uint32_t type = 8;
    PutString(kv, key), Put(kv, &type, 4), PutString(kv, value), ++pairs;
  }
  void Tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t bytes) {
    const uint32_t n = static_cast<uint32_t>(dims.size());
    PutString(infos, name), Put(infos, &n, 4);
    for (uint64_t d : dims)
      Put(infos, &d, 8);
    Put(infos, &type, 4), Put(infos, &data, 8);
    data += (bytes + 31) / 32 * 32;
    ++tensors;
  }
  std::vector<uint8_t> Build() {
    std::vector<uint8_t> out;
    const uint32_t version = 3;
    Put(out, "GGUF", 4), Put(out, &version, 4), Put(out, &tensors, 8), Put(out, &pairs, 8);
    out.insert(out.end(), kv.begin(), kv.end());
    out.insert(out.end(), infos.begin(), infos.end());
    out.resize((out.size() + 31) / 32 * 32 + data, 0);
    return out;
  }
};

// Switchyard's logits on `file` against llama.cpp's (llama_logits.py's format) on the golden
// tokens. Both engines quantize the activations per block to int8 the same way (Q8_K / Q8_0)
// and multiply exactly in integers; what differs is llama.cpp's f16 latent cache (a 2^-11
// relative rounding of every cached latent and key; switchyard's here is f32), its f16 rounding
// of the attention's softmax inputs on the CPU path and the order of its float sums. Through 4
// layers that is a few 1e-3 of max|logit|: the bar is 2e-2 on 95% of rows (Q8_0's bar against
// the reference, as large as the weights' own rounding), and top-1 the same wherever the
// reference's margin is clear of twice that.
void ExpectLlamaCppLogits(const std::string& file, const std::string& llama_logits_file) {
  SCOPED_TRACE(file);
  const std::string bytes = ReadAll(llama_logits_file);
  std::vector<float> theirs(bytes.size() / sizeof(float));
  std::memcpy(theirs.data(), bytes.data(), bytes.size());
  auto model = LoadOrFail(file);
  ASSERT_TRUE(model);
  const int64_t vocab = model->config().vocab_size;
  const auto ours = RunLogits(*model, GoldenTokens());
  ASSERT_EQ(theirs.size(), ours.size()) << llama_logits_file;
  auto result = Compare(theirs, ours, vocab, 0.04);
  const int64_t rows = static_cast<int64_t>(result.row_max_diff.size());
  EXPECT_GT(result.clear_rows, rows / 3);
  EXPECT_EQ(result.top1_mismatches, 0);
  EXPECT_LE(result.RowsOver(2e-2), rows / 20);
  std::printf(
      "%s against llama.cpp: max |Δ| %.3g (%.2g of max |logit|), %lld of %lld rows over 2e-2; "
      "top-1 checked on %lld rows; the same top-1 on %lld\n",
      file.c_str(), result.MaxDiff(), result.MaxDiff() / result.max_abs_reference,
      static_cast<long long>(result.RowsOver(2e-2)), static_cast<long long>(rows),
      static_cast<long long>(result.clear_rows), static_cast<long long>(result.top1_agree));
}

std::string GoldenTokensText() {
  std::string text;
  for (const auto& sequence : GoldenTokens()) {
    text += text.empty() ? "" : ";";
    for (size_t i = 0; i < sequence.size(); ++i)
      text += (i ? "," : "") + std::to_string(sequence[i]);
  }
  return text;
}

// llama.cpp's logits on the default model's Q8_0 file and on its Q4_K mix (Q4_K, Q6_K, Q5_0 and
// Q8_0, as in a Q4_K_M), committed with the script that made them
// (tools/llama_cpp/make_llama_fixture.sh, llama-cpp-python 0.3.36), so every run compares with
// llama.cpp without building it. Each file must be the one they were made on (its SHA-256).
// A prompt's prefill products of a tile of rows and more take the AMX GGML kernel (on this CPU's
// tiles, else on its emulator): the logits of the vector kernels, bit for bit, on both files.
const bool kEmulateAmx = [] {  // read once, before the first product asks for a backend
  setenv("SWITCHYARD_AMX_EMULATE", "1", 1);
  return true;
}();

TEST(GgufModelTest, AmxKernelGivesTheVectorKernelsLogits) {
  ASSERT_NE(kernels::ActiveAmxBackend(), kernels::AmxBackend::kNone);
  int64_t tokens = 0;
  for (const auto& sequence : GoldenTokens())
    tokens += static_cast<int64_t>(sequence.size());
  ASSERT_GE(tokens, kernels::kAmxInt8MinRows);  // the prefill's products fill tiles
  for (const char* file : {"default-q8_0.gguf", "default-q4_k_mix.gguf"}) {
    SCOPED_TRACE(file);
    auto model = LoadOrFail(kModels + "/" + file);
    ASSERT_TRUE(model);
    kernels::EnableAmxGgml(false);
    const auto vector_kernels = RunLogits(*model, GoldenTokens());
    kernels::EnableAmxGgml(true);
    const auto amx = RunLogits(*model, GoldenTokens());
    ASSERT_EQ(amx.size(), vector_kernels.size());
    EXPECT_EQ(std::memcmp(amx.data(), vector_kernels.data(), amx.size() * sizeof(float)), 0);
  }
}

TEST(GgufModelTest, LogitsMatchLlamaCppOnTheSameFile) {
  const std::string fixtures = std::string(SY_FIXTURES_DIR) + "/gguf";
  for (const std::string& name : {std::string("q8_0"), std::string("q4_k_mix")}) {
    const std::string file = kModels + "/default-" + name + ".gguf";
    std::string expected = ReadAll(fixtures + "/llama-cpp-" + name + ".sha256");
    expected.erase(expected.find_last_not_of(" \n") + 1);
    std::string digest(64, '\0');
    FILE* pipe = popen(("sha256sum " + file).c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    digest.resize(std::fread(digest.data(), 1, digest.size(), pipe));
    pclose(pipe);
    ASSERT_EQ(digest, expected) << file
                                << " is not the file llama.cpp's logits were made on: rerun "
                                   "tools/llama_cpp/make_llama_fixture.sh";
    ExpectLlamaCppLogits(file, fixtures + "/llama-cpp-" + name + "-logits.bin");
  }
}

// The same through llama.cpp itself, where its pinned build is at hand (SY_LLAMA_PYTHON, else
// the venv tools/llama_cpp/compare_q4_k_m.sh makes; skipped without one): the Q8_0 file, and a
// Q4_K_M that llama.cpp's own llama_model_quantize makes of the F32 file (its Q4_K_M choice per
// tensor and its search for scales).
TEST(GgufModelTest, LogitsMatchLlamaCppRunHereOnItsOwnQ4KM) {
  const char* from_env = std::getenv("SY_LLAMA_PYTHON");
  const std::string python = from_env != nullptr ? from_env : SY_LLAMA_PYTHON;
  const std::string script = std::string(SY_SOURCE_DIR) + "/tools/llama_cpp/llama_logits.py";
  if (std::system((python + " -c 'import llama_cpp' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "no llama-cpp-python at " << python
                 << " (tools/llama_cpp/compare_q4_k_m.sh builds it)";
  const std::string q4_k_m = kModels + "/default-q4_k_m-llama.gguf";
  if (!std::filesystem::exists(q4_k_m) ||
      std::filesystem::last_write_time(q4_k_m) <
          std::filesystem::last_write_time(kModels + "/default-f32.gguf")) {
    ASSERT_EQ(
        std::system((python + " " + script + " quantize " + kModels + "/default-f32.gguf " +
                     q4_k_m + ".tmp Q4_K_M 2 >/dev/null 2>&1 && mv " + q4_k_m + ".tmp " + q4_k_m)
                        .c_str()),
        0);
  }
  for (const std::string& file : {kModels + "/default-q8_0.gguf", q4_k_m}) {
    const std::string out = ::testing::TempDir() + "/llama-logits.bin";
    ASSERT_EQ(std::system((python + " " + script + " logits " + file + " '" + GoldenTokensText() +
                           "' " + out + " 2 >/dev/null 2>&1")
                              .c_str()),
              0);
    ExpectLlamaCppLogits(file, out);
  }
}

TEST(GgufModelTest, UnsupportedFilesAreErrorsNamingWhatIsWrong) {
  GgufBuilder llama;
  llama.String("general.architecture", "llama");
  auto llama_bytes = llama.Build();
  auto llama_file = GgufFile::Parse(llama_bytes.data(), llama_bytes.size(), "llama.gguf");
  ASSERT_TRUE(llama_file.ok());
  auto refused = GgufModelConfig(llama_file.value());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("architecture 'llama'"), std::string::npos)
      << refused.status().message();

  // The tokenizer-only fixture has no deepseek2.* keys.
  auto no_keys = LoadGgufModelConfig(std::string(SY_FIXTURES_DIR) + "/gguf/default-tokenizer.gguf");
  ASSERT_FALSE(no_keys.ok());
  EXPECT_NE(no_keys.status().message().find("deepseek2.block_count is missing"), std::string::npos)
      << no_keys.status().message();

  // A type this build cannot decode, and a tensor outside the layout, each named.
  auto config = LoadGgufModelConfig(kModels + "/default-f32.gguf");
  ASSERT_TRUE(config.ok());
  for (auto [name, type, message] :
       {std::tuple{"blk.0.attn_q_a.weight", 16u, "is IQ2_XXS"},
        std::tuple{"blk.0.attn_sinks.weight", 0u, "not part of the deepseek2 layout"},
        std::tuple{"blk.9.attn_norm.weight", 0u, "names layer 9 but the file has 4"}}) {
    GgufBuilder bad;
    bad.String("general.architecture", "deepseek2");
    bad.Tensor(name, {256, 1}, type, 256 * 4);
    auto bytes = bad.Build();
    auto file = GgufFile::Parse(bytes.data(), bytes.size(), "bad.gguf");
    ASSERT_TRUE(file.ok()) << file.status().message();
    auto checkpoint = GgufCheckpoint(file.value(), config.value());
    ASSERT_FALSE(checkpoint.ok()) << name;
    EXPECT_NE(checkpoint.status().message().find(std::string("'") + name + "'"), std::string::npos)
        << checkpoint.status().message();
    EXPECT_NE(checkpoint.status().message().find(message), std::string::npos)
        << checkpoint.status().message();
  }
}

}  // namespace
}  // namespace sy
