// `switchyard bench accuracy`: what `--int8-products` (or a rounded latent cache, or a quantized
// checkpoint) costs in quality, measured on held-out text. The model is loaded twice, exactly and
// with int8 products; every held-out passage runs through both, and the report gives each one's
// perplexity, the mean KL divergence of the int8 next-token distribution from the exact one, and
// how often their top-1 tokens agree.
#pragma once

#include <string>

#include "base/status.h"
#include "tensor/dtype.h"
#include "tokenizer/text_codec.h"

namespace sy::bench {

struct AccuracyReport {
  int64_t passages = 0, predictions = 0;  // next-token predictions scored
  double exact_perplexity = 0, int8_perplexity = 0;
  double mean_kl = 0, max_kl = 0;  // KL(exact ‖ int8), nats per prediction
  double top1_agreement = 0;       // fraction of predictions with the same argmax
  double exact_top1_accuracy = 0, int8_top1_accuracy = 0;  // argmax = the text's next token
  // What was compared (--against: the reference checkpoint and the model as it loads).
  std::string exact_label = "exact products", int8_label = "int8 products";
};

Result<AccuracyReport> BenchInt8Accuracy(const std::string& model_directory, const TextCodec& codec,
                                         const std::string& prompts);
// The same measures for `model` as it loads (a GGUF with its native quantized products, say)
// against `reference` with exact products (the fp8 checkpoint it came from).
Result<AccuracyReport> BenchAccuracyAgainst(const std::string& model, const std::string& reference,
                                            const TextCodec& codec, const std::string& prompts);
// The same measures for a latent cache of `cache_dtype` (bf16, fp8) against an f32 one, the
// products exact in both.
Result<AccuracyReport> BenchCacheAccuracy(const std::string& model_directory,
                                          const TextCodec& codec, const std::string& prompts,
                                          DType cache_dtype);
std::string AccuracyReportTable(const AccuracyReport& report);
std::string AccuracyReportJson(const AccuracyReport& report);

}  // namespace sy::bench
