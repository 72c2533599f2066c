// switchyard quantize: a checkpoint directory (fp8, bf16, f32) written as a deepseek2 GGUF in
// Q4_K_M, Q8_0, ... (model/gguf_export.h) or as a Hugging Face W4A16 checkpoint directory: AWQ,
// GPTQ, compressed-tensors (model/int4_export.h).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "base/clock.h"
#include "bench/mtp_bench.h"
#include "cli/common.h"
#include "cli/verbs.h"
#include "model/calibration.h"
#include "model/gguf_export.h"
#include "model/int4_export.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace sy {
namespace {

struct QuantizeArgs {
  std::string model;
  std::string out;
  std::string to = "q4_k_m";
  std::string kv_b = "split";
  double max_shard_gb = 5;
  std::string calibrate;        // text file (or .jsonl of {"text": ...}) to measure importance on
  std::string calibrate_model;  // the model run on it (default: --model)
  int64_t calibrate_tokens = 32768;
  int64_t calibrate_length = 512;
};

// Runs the calibration text through the model (the source, or --calibrate-model) and returns what
// each linear layer's inputs weigh (model/calibration.h).
Importance Calibrate(const QuantizeArgs& args) {
  const std::string path = args.calibrate_model.empty() ? args.model : args.calibrate_model;
  const double start = NowSeconds();
  TextCodec codec = LoadTextCodecOrFail(path);
  std::vector<std::vector<int32_t>> windows;
  int64_t budget = args.calibrate_tokens;
  auto add = [&](const std::vector<int32_t>& ids) {
    for (auto& w : CalibrationWindows(ids, args.calibrate_length, budget)) {
      budget -= static_cast<int64_t>(w.size());
      windows.push_back(std::move(w));
    }
  };
  if (args.calibrate.ends_with(".jsonl")) {
    auto passages = bench::LoadPrompts(args.calibrate, codec);
    if (!passages.ok()) FailVerb(passages.status().message());
    for (const auto& ids : passages.value())
      if (budget > 0) add(ids);
  } else {
    std::ifstream in(args.calibrate, std::ios::binary);
    if (!in) FailVerb(args.calibrate + ": cannot open the calibration text");
    std::stringstream text;
    text << in.rdbuf();
    auto ids = codec.EncodePrompt(text.str());
    if (!ids.ok()) FailVerb(args.calibrate + ": " + ids.status().message());
    add(ids.value());
  }
  if (windows.empty()) FailVerb(args.calibrate + ": no text to calibrate on (two tokens at least)");
  std::unique_ptr<Model> model = LoadModelOrFail(path);
  for (const auto& w : windows)
    if (static_cast<int64_t>(w.size()) > model->config().max_position_embeddings)
      FailVerb(fmt::format("--calibrate-length {} exceeds the model's context of {}",
                           args.calibrate_length, model->config().max_position_embeddings));
  const bool terminal = isatty(fileno(stderr));
  auto importance = CollectImportance(*model, windows, [&](size_t done, size_t total) {
    if (terminal || done == total)
      std::fprintf(stderr, "%scalibrate: %zu of %zu windows%s", terminal ? "\r" : "", done, total,
                   terminal && done != total ? "" : "\n");
  });
  if (!importance.ok()) FailVerb(importance.status().message());
  std::fprintf(stderr,
               "calibrated on %lld tokens of %s with %s: %zu linear layers measured, %.1f s\n",
               static_cast<long long>(importance.value().tokens), args.calibrate.c_str(),
               path.c_str(), importance.value().mean_squares.size(), NowSeconds() - start);
  return std::move(importance).value();
}

bool IsHfInt4(const std::string& to) {
  return to == "awq-int4" || to == "gptq-int4" || to == "ct-w4a16" || to == "ct-w4a16-asym";
}

void RunQuantize(const QuantizeArgs& args) {
  if (!std::filesystem::is_directory(args.model))
    FailVerb(args.model + ": not a checkpoint directory (config.json and safetensors)");
  // GGUF's Q4_K blocks were tried with the same weighting (a scale search per 32 weights, each
  // block kept where it lowered the weighted error): no better than round to nearest on the
  // default model's held-out text (docs/benchmarks.md), so not offered.
  if (!args.calibrate.empty() && !IsHfInt4(args.to))
    FailVerb(
        "--calibrate: for the int4 formats (awq-int4, gptq-int4, ct-w4a16, ct-w4a16-asym), "
        "not " +
        args.to);
  std::optional<Importance> importance;
  if (!args.calibrate.empty()) importance = Calibrate(args);
  const double start = NowSeconds();
  // A line per tensor on a terminal (carriage return), every tenth of them elsewhere.
  const bool terminal = isatty(fileno(stderr));
  // Rate and time left from when writing began (after any calibration and scale search).
  double writing = -1;
  auto progress = [&](size_t done, size_t total, uint64_t bytes) {
    if (writing < 0) writing = NowSeconds();
    if (!terminal && done % std::max<size_t>(1, total / 10) != 0 && done != total) return;
    const double seconds = NowSeconds() - writing;
    std::fprintf(
        stderr, "%squantize: %zu of %zu tensors, %.1f MB written, %.1f MB/s, %.0f s left%s",
        terminal ? "\r" : "", done, total, bytes / 1e6, bytes / 1e6 / std::max(seconds, 1e-9),
        seconds / done * (total - done), terminal && done != total ? "" : "\n");
  };
  Status s;
  if (IsHfInt4(args.to)) {
    Int4ExportOptions options;
    options.importance = importance ? &*importance : nullptr;
    options.type = args.to;
    options.max_shard_bytes = static_cast<uint64_t>(args.max_shard_gb * 1e9);
    options.progress = progress;
    s = ExportInt4Checkpoint(args.model, args.out, options);
  } else {
    GgufExportOptions options;
    options.type = args.to;
    options.kv_b = args.kv_b;
    options.progress = progress;
    // Every form transformers keeps chat templates in (chat_template.jinja, named ones), not
    // only tokenizer_config.json's string: the GGUF is served with them.
    auto templates = LoadTokenizerConfig(args.model);
    if (!templates.ok()) FailVerb(templates.status().message());
    options.chat_template = templates->chat_template;
    options.tool_use_chat_template = templates->tool_use_chat_template;
    s = ExportGguf(args.model, args.out, options);
  }
  if (!s.ok()) FailVerb(s.message());
  std::printf("wrote %s (%s) from %s in %.1f s\n", args.out.c_str(), args.to.c_str(),
              args.model.c_str(), NowSeconds() - start);
}

}  // namespace

void AddQuantizeVerb(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* verb = app.add_subcommand(
      "quantize",
      "Write a checkpoint (fp8, bf16, f32) as a llama.cpp deepseek2 GGUF (Q4_K_M, Q8_0...) or "
      "as a Hugging Face int4 checkpoint (AWQ, GPTQ, compressed-tensors W4A16)");
  verb->add_option("--model", args->model, "Checkpoint directory")->required();
  verb->add_option("--out", args->out,
                   "GGUF file to write, or for the int4 formats a new checkpoint directory")
      ->required();
  verb->add_option("--to", args->to,
                   "GGUF: q4_k_m (llama.cpp's choice per tensor), q4_k_mix (Q6_K for every down "
                   "projection and the attention output too), q8_0, bf16, f16, f32. Hugging "
                   "Face, 4-bit groups of 128 by round-to-nearest: awq-int4 (AutoAWQ GEMM), "
                   "gptq-int4, ct-w4a16 (compressed-tensors pack-quantized, symmetric), "
                   "ct-w4a16-asym")
      ->check(CLI::IsMember({"q4_k_m", "q4_k_mix", "q8_0", "bf16", "f16", "f32", "awq-int4",
                             "gptq-int4", "ct-w4a16", "ct-w4a16-asym"}));
  verb->add_option("--kv-b", args->kv_b,
                   "kv_b_proj as attn_k_b and attn_v_b (split, what llama.cpp writes now), the "
                   "older fused attn_kv_b, or both")
      ->check(CLI::IsMember({"split", "fused", "both"}));
  verb->add_option("--max-shard-gb", args->max_shard_gb,
                   "Int4 formats: safetensors shards of at most this many GB (1e9 bytes), as "
                   "save_pretrained's max_shard_size")
      ->check(CLI::PositiveNumber);
  verb->add_option("--calibrate", args->calibrate,
                   "Int4 formats: a text file (or .jsonl of {\"text\": ...} lines) to run the "
                   "model on first; each group's clipping is then chosen to minimize the error "
                   "weighted by its input columns' mean square activations (llama.cpp's "
                   "importance matrix, AutoAWQ's clip grid) instead of rounding to nearest");
  verb->add_option(
      "--calibrate-model", args->calibrate_model,
      "The model run on the calibration text (default: --model); any switchyard loads, "
      "e.g. a 4-bit copy of a model too large for memory in fp8");
  verb->add_option("--calibrate-tokens", args->calibrate_tokens, "Calibration tokens at most")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  verb->add_option("--calibrate-length", args->calibrate_length,
                   "Tokens per calibration window (each a prefill of its own)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  verb->callback([args] { RunQuantize(*args); });
}

}  // namespace sy
