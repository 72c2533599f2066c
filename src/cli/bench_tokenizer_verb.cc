// switchyard bench tokenizer: encode throughput side by side with Hugging Face tokenizers.
#include <cstdio>

#include "bench/tokenizer_bench.h"
#include "cli/common.h"
#include "cli/verbs.h"

namespace sy {

void AddBenchTokenizerCommand(CLI::App& bench_app) {
  struct Args {
    bench::TokenizerBenchOptions options;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  args->options.tokenizer = std::string(SY_SOURCE_DIR) + "/tests/fixtures/tokenizer/deepseek-v3";
  args->options.corpus = std::string(SY_SOURCE_DIR) + "/tests/fixtures/tokenizer/corpus.jsonl";
  args->options.hf_python = std::string(SY_SOURCE_DIR) + "/.venv-tokenizer/bin/python";
  CLI::App* t = bench_app.add_subcommand(
      "tokenizer", "Encode throughput on one thread, side by side with Hugging Face tokenizers");
  t->add_option("--tokenizer", args->options.tokenizer,
                "tokenizer.json or its directory (default: DeepSeek-V3's, from the fixtures)");
  t->add_option("--corpus", args->options.corpus, "JSON Lines of {\"text\": ...}");
  t->add_option("--hf-python", args->options.hf_python,
                "A Python with `tokenizers` installed (default: .venv-tokenizer in the checkout)");
  t->add_option("--model", args->options.model,
                "Model whose prefill rate the long prompt is set against (default: the embedded "
                "model)");
  t->add_option("--repetitions", args->options.repetitions, "Timed repetitions (median reported)")
      ->check(CLI::Range(1, 101));
  t->add_flag("--json", args->json, "Print one JSON object");
  t->callback([args] {
    args->options.model = ResolveModelDirectory(args->options.model);
    auto report = bench::BenchTokenizer(args->options);
    if (!report.ok()) FailVerb(report.status().message());
    std::fputs((args->json ? bench::TokenizerReportJson(report.value()) + "\n"
                           : bench::TokenizerReportTable(report.value()))
                   .c_str(),
               stdout);
  });
}

}  // namespace sy
