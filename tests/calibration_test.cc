// Calibration (model/calibration.h): what the forward pass reports to an observer, named by
// weight; and the importance-weighted clipping it feeds (model/int4_export.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/calibration.h"
#include "model/export_common.h"
#include "model/int4_export.h"
#include "model/model.h"
#include "tensor/dtype.h"
#include "test_support.h"

namespace sy {
namespace {

const std::string kDefaultModel = std::string(SY_SOURCE_DIR) + "/models/default";

TEST(CalibrationTest, SquareSumsAddWhatEachMatrixMultiplied) {
  Matrix a, b;
  SquareSums sums;
  // Two rows of three values, five apart: 1 2 3 | 4 5 6.
  const float x[] = {1, 2, 3, 9, 9, 4, 5, 6, 9, 9};
  sums.Observe(a, x, 2, 3, 5);
  sums.Observe(a, x, 1, 3, 5);
  sums.Observe(b, x + 5, 1, 2, 5);
  ASSERT_EQ(sums.sums().size(), 2u);
  const auto& sa = sums.sums().at(&a);
  EXPECT_EQ(sa.rows, 3);
  EXPECT_EQ(sa.squares, (std::vector<double>{1 + 16 + 1, 4 + 25 + 4, 9 + 36 + 9}));
  EXPECT_EQ(sums.sums().at(&b).squares, (std::vector<double>{16, 25}));
}

TEST(CalibrationTest, WeightsAreFlooredAtAHundredthOfTheMean) {
  Importance imp;
  imp.mean_squares["w"] = {0.0f, 1.0f, 299.0f};  // mean 100
  EXPECT_EQ(imp.Weights("w", 3), (std::vector<float>{1.0f, 1.0f, 299.0f}));
  EXPECT_TRUE(imp.Weights("w", 4).empty());  // not this matrix's width
  EXPECT_TRUE(imp.Weights("v", 3).empty());
}

TEST(CalibrationTest, WindowsCutTheTextAndKeepTheBudget) {
  std::vector<int32_t> ids(10);
  for (int i = 0; i < 10; ++i)
    ids[i] = i;
  auto w = CalibrationWindows(ids, 4, 100);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[2], (std::vector<int32_t>{8, 9}));
  w = CalibrationWindows(ids, 4, 9);  // 0..3, 4..7, and one token left: dropped
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(CalibrationWindows(ids, 4, 1).size(), 0u);
}

// The default model run over a few windows: every linear layer of the main layers measured, with
// the row counts routing implies, the same inputs where layers share them, and layer 0's
// attention input equal to RMSNorm of the embeddings computed here from the checkpoint.
TEST(CalibrationTest, TheForwardPassReportsEveryLinearLayersInputs) {
  auto loaded = Model::Load(kDefaultModel);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Model& model = *loaded.value();
  const ModelConfig& c = model.config();
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(2, static_cast<int32_t>(c.vocab_size - 1));
  std::vector<std::vector<int32_t>> windows = {std::vector<int32_t>(40), std::vector<int32_t>(23)};
  for (auto& w : windows)
    for (int32_t& t : w)
      t = token(rng);
  const int64_t tokens = 63;
  size_t calls = 0;
  auto result = CollectImportance(model, windows, [&](size_t done, size_t total) {
    EXPECT_EQ(done, ++calls);
    EXPECT_EQ(total, 2u);
  });
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_FALSE(ObservingLinearInputs());
  const Importance& imp = result.value();
  EXPECT_EQ(imp.tokens, tokens);

  // 5 attention projections a layer (q_lora), a dense MLP in layer 0, 32 experts and a shared one
  // in the others; an expert no token chose is absent.
  int64_t experts_seen = 0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    for (const char* m : {"q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj"}) {
      const std::string name = p + "self_attn." + m + ".weight";
      ASSERT_NE(imp.Find(name), nullptr) << name;
      EXPECT_EQ(imp.rows.at(name), tokens) << name;
      for (float v : *imp.Find(name))
        EXPECT_TRUE(std::isfinite(v) && v >= 0) << name;
    }
    EXPECT_EQ(imp.Find(p + "self_attn.kv_b_proj.weight")->size(),
              static_cast<size_t>(c.kv_lora_rank));
    // q_a_proj and kv_a_proj_with_mqa multiply the same rows.
    EXPECT_EQ(*imp.Find(p + "self_attn.q_a_proj.weight"),
              *imp.Find(p + "self_attn.kv_a_proj_with_mqa.weight"));
    if (!c.IsMoeLayer(layer)) {
      EXPECT_EQ(imp.rows.at(p + "mlp.down_proj.weight"), tokens);
      EXPECT_EQ(imp.Find(p + "mlp.down_proj.weight")->size(),
                static_cast<size_t>(c.intermediate_size));
      continue;
    }
    EXPECT_EQ(imp.rows.at(p + "mlp.shared_experts.gate_proj.weight"), tokens);
    int64_t rows = 0;
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const std::string ex = fmt::format("{}mlp.experts.{}.", p, e);
      if (imp.Find(ex + "gate_proj.weight") == nullptr) continue;
      ++experts_seen;
      rows += imp.rows.at(ex + "gate_proj.weight");
      EXPECT_EQ(*imp.Find(ex + "gate_proj.weight"), *imp.Find(ex + "up_proj.weight"));
      EXPECT_EQ(imp.rows.at(ex + "down_proj.weight"), imp.rows.at(ex + "gate_proj.weight"));
    }
    EXPECT_EQ(rows, tokens * c.num_experts_per_tok) << "layer " << layer;  // top-k each
  }
  EXPECT_GT(experts_seen, c.n_routed_experts);  // more than one layer's worth

  // Layer 0's attention input: RMSNorm(embedding) · input_layernorm, in double here.
  auto ckpt = Checkpoint::Open(kDefaultModel);
  ASSERT_TRUE(ckpt.ok());
  auto embed = ReadTensorF32(ckpt.value(), c, "model.embed_tokens.weight");
  auto norm = ReadTensorF32(ckpt.value(), c, "model.layers.0.input_layernorm.weight");
  ASSERT_TRUE(embed.ok() && norm.ok());
  const int64_t D = c.hidden_size;
  std::vector<double> want(static_cast<size_t>(D), 0.0);
  for (const auto& w : windows)
    for (int32_t t : w) {
      const float* e = embed.value().data() + static_cast<int64_t>(t) * D;
      double ms = 0;
      for (int64_t i = 0; i < D; ++i)
        ms += static_cast<double>(e[i]) * e[i];
      const double inv = 1.0 / std::sqrt(ms / D + c.rms_norm_eps);
      for (int64_t i = 0; i < D; ++i) {
        const double v = e[i] * inv * norm.value()[i];
        want[i] += v * v / tokens;
      }
    }
  const std::vector<float>& got = *imp.Find("model.layers.0.self_attn.q_a_proj.weight");
  for (int64_t i = 0; i < D; ++i)  // float RMSNorm against double: a few ulps of each square
    EXPECT_NEAR(got[i], want[i], 1e-5 * want[i] + 1e-12) << i;
}

double WeightedError(const float* w, const float* importance, const Int4Codes& c, int64_t cols,
                     int64_t row, Int4Scheme scheme, int64_t group) {
  const bool half = scheme == Int4Scheme::kAwq || scheme == Int4Scheme::kGptq;
  const int64_t g = row * (cols / kInt4Group) + group;
  const float s = half ? F16ToF32(c.scales[g]) : BF16ToF32(c.scales[g]);
  double sum = 0;
  for (int64_t i = group * kInt4Group; i < (group + 1) * kInt4Group; ++i) {
    const double d = w[row * cols + i] - s * (int{c.q[row * cols + i]} - int{c.z[g]});
    sum += importance[i] * d * d;
  }
  return sum;
}

// Round to nearest is the first clip tried, so the importance-weighted error of every group is
// at most round-to-nearest's; on weights with outliers some groups are clipped and do better.
TEST(CalibrationTest, WeightedClippingIsNeverWorseThanRoundToNearest) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const int64_t rows = 16, cols = 4 * kInt4Group;
  std::vector<float> w(rows * cols), importance(cols);
  for (float& v : w)
    v = normal(rng) * (uniform(rng) < 0.01f ? 8.0f : 1.0f);
  for (float& h : importance)
    h = std::exp(3.0f * normal(rng));  // activations spanning orders of magnitude
  for (Int4Scheme scheme :
       {Int4Scheme::kAwq, Int4Scheme::kGptq, Int4Scheme::kCtSym, Int4Scheme::kCtAsym}) {
    const Int4Codes rtn = QuantizeInt4(w.data(), rows, cols, scheme);
    const Int4Codes clipped = QuantizeInt4(w.data(), rows, cols, scheme, importance.data());
    int better = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < cols / kInt4Group; ++g) {
        const double a = WeightedError(w.data(), importance.data(), rtn, cols, r, scheme, g);
        const double b = WeightedError(w.data(), importance.data(), clipped, cols, r, scheme, g);
        EXPECT_LE(b, a) << "row " << r << " group " << g;
        better += b < a;
      }
    EXPECT_GT(better, rows) << static_cast<int>(scheme);
    if (scheme == Int4Scheme::kGptq) {
      EXPECT_GE(*std::min_element(clipped.z.begin(), clipped.z.end()), 1);
    }
  }
}

// AWQ's scales: never worse than none by their own measure, centred (max · min = 1), and none at
// all when every column matters the same (every α gives the same scales, all 1).
TEST(CalibrationTest, ChannelScalesAreCentredAndNeverWorseThanNone) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = 32, cols = 2 * kInt4Group;
  std::vector<float> w(rows * cols), importance(cols), uniform(cols, 3.0f);
  for (float& v : w)
    v = normal(rng);
  for (float& h : importance)
    h = std::exp(2.0f * normal(rng));
  auto error = [&](const std::vector<float>& s) {
    std::vector<float> scaled(w);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        scaled[r * cols + c] *= s[c];
    const Int4Codes q = QuantizeInt4(scaled.data(), rows, cols, Int4Scheme::kAwq);
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t g = r * (cols / kInt4Group) + c / kInt4Group;
        const float back =
            F16ToF32(q.scales[g]) * static_cast<float>(int{q.q[r * cols + c]} - int{q.z[g]}) / s[c];
        sum += importance[c] * (w[r * cols + c] - back) * (w[r * cols + c] - back);
      }
    return sum;
  };
  const std::vector<float> s =
      SearchInt4Scales(w.data(), rows, cols, importance.data(), Int4Scheme::kAwq);
  const std::vector<float> ones(cols, 1.0f);
  EXPECT_LE(error(s), error(ones));
  EXPECT_NE(s, ones);  // these columns differ enough for some α to pay
  const float top = *std::max_element(s.begin(), s.end()),
              bottom = *std::min_element(s.begin(), s.end());
  EXPECT_NEAR(top * bottom, 1.0f, 1e-5f);
  EXPECT_EQ(SearchInt4Scales(w.data(), rows, cols, uniform.data(), Int4Scheme::kAwq), ones);
}

// The whole calibrated export: the default model's next-token distributions stay close to the
// fp8 checkpoint's. A guard against gross mistakes (a scale folded the wrong way multiplies each
// down projection's terms by s², and the distributions part), not a bound: round to nearest
// measures a mean KL of 0.012 nats on the held-out text (docs/benchmarks.md).
TEST(CalibrationTest, ACalibratedExportKeepsTheModelsPredictions) {
  auto loaded = Model::Load(kDefaultModel);
  ASSERT_TRUE(loaded.ok());
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> token(2, 4000);
  std::vector<std::vector<int32_t>> windows(4, std::vector<int32_t>(128));
  for (auto& w : windows)
    for (int32_t& t : w)
      t = token(rng);
  auto importance = CollectImportance(*loaded.value(), windows);
  ASSERT_TRUE(importance.ok());
  const std::string out = testing::TempDirectory("calibrated-export") + "/m";
  Int4ExportOptions options;
  options.importance = &importance.value();
  const Status s = ExportInt4Checkpoint(kDefaultModel, out, options);
  ASSERT_TRUE(s.ok()) << s.message();
  auto quantized = Model::Load(out);
  ASSERT_TRUE(quantized.ok()) << quantized.status().message();

  // Where a norm was rescaled (written in f32), the router it feeds was rescaled the other way:
  // norm_j · router_ej is the source's, to float rounding (the dense half of each fold, exact).
  auto source = Checkpoint::Open(kDefaultModel);
  auto written = Checkpoint::Open(out);
  ASSERT_TRUE(source.ok() && written.ok());
  const ModelConfig& c = loaded.value()->config();
  int rescaled = 0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string norm = fmt::format("model.layers.{}.post_attention_layernorm.weight", layer);
    const std::string router = fmt::format("model.layers.{}.mlp.gate.weight", layer);
    if (written.value().Find(norm)->entry->dtype != DType::kF32 || !c.IsMoeLayer(layer)) continue;
    ++rescaled;
    ASSERT_EQ(written.value().Find(router)->entry->dtype, DType::kF32);
    auto n0 = ReadTensorF32(source.value(), c, norm), r0 = ReadTensorF32(source.value(), c, router);
    auto n1 = ReadTensorF32(written.value(), c, norm),
         r1 = ReadTensorF32(written.value(), c, router);
    ASSERT_TRUE(n0.ok() && r0.ok() && n1.ok() && r1.ok());
    const int64_t D = c.hidden_size;
    bool scaled = false;
    for (int64_t e = 0; e < c.n_routed_experts; ++e)
      for (int64_t j = 0; j < D; ++j) {
        const double want = double{n0.value()[j]} * r0.value()[e * D + j];
        const double got = double{n1.value()[j]} * r1.value()[e * D + j];
        EXPECT_NEAR(got, want, 4e-7 * std::abs(want)) << layer << " " << e << " " << j;
        scaled = scaled || n1.value()[j] != n0.value()[j];
      }
    EXPECT_TRUE(scaled);
  }
  EXPECT_GT(rescaled, 0);

  // One of the calibration windows (random ids): every position's distribution compared.
  const std::vector<int32_t>& ids = windows[0];
  auto logits = [&](Model& model) {
    ForwardOptions fo;
    fo.logit_rows = LogitRows::kAll;
    std::vector<float> out;
    EXPECT_TRUE(model.ForwardSequence(ids, fo, &out).ok());
    return out;
  };
  const std::vector<float> a = logits(*loaded.value()), b = logits(*quantized.value());
  const int64_t vocab = loaded.value()->config().vocab_size;
  ASSERT_EQ(a.size(), b.size());
  double kl = 0;
  int64_t rows = static_cast<int64_t>(a.size()) / vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = a.data() + r * vocab;
    const float* q = b.data() + r * vocab;
    const double pm = *std::max_element(p, p + vocab), qm = *std::max_element(q, q + vocab);
    double ps = 0, qs = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      ps += std::exp(p[i] - pm);
      qs += std::exp(q[i] - qm);
    }
    for (int64_t i = 0; i < vocab; ++i) {
      const double lp = p[i] - pm - std::log(ps), lq = q[i] - qm - std::log(qs);
      kl += std::exp(lp) * (lp - lq);
    }
  }
  EXPECT_LT(kl / rows, 0.1);
}

}  // namespace
}  // namespace sy
