#include "bench/accuracy_bench.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/mtp_bench.h"
#include "kernels/cpu/latent_row.h"
#include "model/model.h"
#include "tensor/packed_matrix.h"

namespace sy::bench {
namespace {

// Every passage's logits, [tokens][vocab] each, under the current weight packing.
Result<std::vector<std::vector<float>>> PassageLogits(
    const std::string& directory, const std::vector<std::vector<int32_t>>& passages,
    DType cache_dtype = DType::kF32) {
  SY_ASSIGN_OR_RETURN(auto model, Model::Load(directory));
  std::vector<std::vector<float>> out;
  for (const auto& ids : passages) {
    ForwardOptions options;
    options.logit_rows = LogitRows::kAll;
    // The form every generated token takes (prompts may take the expanded one): under
    // --int8-products it multiplies by the per-head absorbed matrices in int8 too.
    options.attention = AttentionForm::kAbsorbed;
    std::vector<float> logits;
    SY_RETURN_IF_ERROR(model->ForwardSequence(ids, options, &logits, cache_dtype));
    out.push_back(std::move(logits));
  }
  return out;
}

// log-softmax of one row, in double.
std::vector<double> LogSoftmax(const float* row, int64_t vocab) {
  const double top = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i)
    sum += std::exp(row[i] - top);
  const double log_sum = top + std::log(sum);
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    out[i] = row[i] - log_sum;
  return out;
}

// Perplexities, KL and top-1 agreement of two runs over the same passages.
Result<AccuracyReport> Score(const std::vector<std::vector<int32_t>>& passages,
                             const std::vector<std::vector<float>>& exact_logits,
                             const std::vector<std::vector<float>>& int8_logits,
                             const std::string& prompts) {
  AccuracyReport report;
  report.passages = static_cast<int64_t>(passages.size());
  double exact_nll = 0, int8_nll = 0, kl_sum = 0;
  int64_t agree = 0, exact_right = 0, int8_right = 0;
  for (size_t s = 0; s < passages.size(); ++s) {
    const auto& ids = passages[s];
    const int64_t tokens = static_cast<int64_t>(ids.size());
    const int64_t vocab = static_cast<int64_t>(exact_logits[s].size()) / tokens;
    for (int64_t t = 0; t + 1 < tokens; ++t) {
      const auto p = LogSoftmax(exact_logits[s].data() + t * vocab, vocab);
      const auto q = LogSoftmax(int8_logits[s].data() + t * vocab, vocab);
      double kl = 0;
      for (int64_t i = 0; i < vocab; ++i)
        kl += std::exp(p[i]) * (p[i] - q[i]);
      kl_sum += kl;
      report.max_kl = std::max(report.max_kl, kl);
      const int32_t next = ids[t + 1];
      exact_nll -= p[next];
      int8_nll -= q[next];
      const auto p_top = std::max_element(p.begin(), p.end()) - p.begin();
      const auto q_top = std::max_element(q.begin(), q.end()) - q.begin();
      agree += p_top == q_top;
      exact_right += p_top == next;
      int8_right += q_top == next;
      ++report.predictions;
    }
  }
  if (report.predictions == 0) return Status::Errorf("{}: passages too short to score", prompts);
  const double n = static_cast<double>(report.predictions);
  report.exact_perplexity = std::exp(exact_nll / n);
  report.int8_perplexity = std::exp(int8_nll / n);
  report.mean_kl = kl_sum / n;
  report.top1_agreement = agree / n;
  report.exact_top1_accuracy = exact_right / n;
  report.int8_top1_accuracy = int8_right / n;
  return report;
}

}  // namespace

Result<AccuracyReport> BenchInt8Accuracy(const std::string& model_directory, const TextCodec& codec,
                                         const std::string& prompts) {
  SY_ASSIGN_OR_RETURN(auto passages, LoadPrompts(prompts, codec));
  const WeightPacking before = GlobalWeightPacking();
  GlobalWeightPacking() = WeightPacking::kExact;
  auto exact = PassageLogits(model_directory, passages);
  GlobalWeightPacking() = WeightPacking::kInt8;
  auto int8 = exact.ok() ? PassageLogits(model_directory, passages) : exact;
  GlobalWeightPacking() = before;
  if (!exact.ok()) return exact.status();
  if (!int8.ok()) return int8.status();
  return Score(passages, exact.value(), int8.value(), prompts);
}

Result<AccuracyReport> BenchAccuracyAgainst(const std::string& model, const std::string& reference,
                                            const TextCodec& codec, const std::string& prompts) {
  SY_ASSIGN_OR_RETURN(auto passages, LoadPrompts(prompts, codec));
  const WeightPacking before = GlobalWeightPacking();
  GlobalWeightPacking() = WeightPacking::kExact;
  auto exact = PassageLogits(reference, passages);
  GlobalWeightPacking() = before;
  if (!exact.ok()) return exact.status();
  SY_ASSIGN_OR_RETURN(auto candidate, PassageLogits(model, passages));
  SY_ASSIGN_OR_RETURN(AccuracyReport report, Score(passages, exact.value(), candidate, prompts));
  report.exact_label = reference;
  report.int8_label = model;
  return report;
}

Result<AccuracyReport> BenchCacheAccuracy(const std::string& model_directory,
                                          const TextCodec& codec, const std::string& prompts,
                                          DType cache_dtype) {
  SY_ASSIGN_OR_RETURN(auto passages, LoadPrompts(prompts, codec));
  const WeightPacking before = GlobalWeightPacking();
  GlobalWeightPacking() = WeightPacking::kExact;
  auto exact = PassageLogits(model_directory, passages);
  auto rounded = exact.ok() ? PassageLogits(model_directory, passages, cache_dtype) : exact;
  GlobalWeightPacking() = before;
  if (!exact.ok()) return exact.status();
  if (!rounded.ok()) return rounded.status();
  SY_ASSIGN_OR_RETURN(AccuracyReport report,
                      Score(passages, exact.value(), rounded.value(), prompts));
  report.exact_label = "f32 cache";
  report.int8_label = fmt::format("{} cache", kernels::LatentCacheDTypeName(cache_dtype));
  return report;
}

std::string AccuracyReportTable(const AccuracyReport& r) {
  return fmt::format(
      "{} passages, {} next-token predictions\n"
      "                 perplexity   top-1 = next token\n"
      "{:<16} {:10.4f}   {:6.2f}%\n"
      "{:<16} {:10.4f}   {:6.2f}%   ({:+.2f}% perplexity)\n"
      "KL(first || second): mean {:.5f} nats, max {:.5f}; top-1 agreement {:.2f}%\n",
      r.passages, r.predictions, r.exact_label, r.exact_perplexity, 100 * r.exact_top1_accuracy,
      r.int8_label, r.int8_perplexity, 100 * r.int8_top1_accuracy,
      100 * (r.int8_perplexity / r.exact_perplexity - 1), r.mean_kl, r.max_kl,
      100 * r.top1_agreement);
}

std::string AccuracyReportJson(const AccuracyReport& r) {
  nlohmann::json j = {{"passages", r.passages},
                      {"predictions", r.predictions},
                      {"exact_perplexity", r.exact_perplexity},
                      {"int8_perplexity", r.int8_perplexity},
                      {"mean_kl", r.mean_kl},
                      {"max_kl", r.max_kl},
                      {"top1_agreement", r.top1_agreement},
                      {"exact_top1_accuracy", r.exact_top1_accuracy},
                      {"int8_top1_accuracy", r.int8_top1_accuracy},
                      {"exact_label", r.exact_label},
                      {"int8_label", r.int8_label}};
  return j.dump(2);
}

}  // namespace sy::bench
