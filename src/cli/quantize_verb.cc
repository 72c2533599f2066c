// switchyard quantize: a checkpoint directory (fp8, bf16, f32) written as a deepseek2 GGUF in
// Q4_K_M, Q8_0, ... (model/gguf_export.h) or as a Hugging Face W4A16 checkpoint directory: AWQ,
// GPTQ, compressed-tensors (model/int4_export.h).
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "base/clock.h"
#include "cli/verbs.h"
#include "model/gguf_export.h"
#include "model/int4_export.h"

namespace sy {
namespace {

struct QuantizeArgs {
  std::string model;
  std::string out;
  std::string to = "q4_k_m";
  std::string kv_b = "split";
  double max_shard_gb = 5;
};

bool IsHfInt4(const std::string& to) {
  return to == "awq-int4" || to == "gptq-int4" || to == "ct-w4a16" || to == "ct-w4a16-asym";
}

void RunQuantize(const QuantizeArgs& args) {
  if (!std::filesystem::is_directory(args.model))
    FailVerb(args.model + ": not a checkpoint directory (config.json and safetensors)");
  const double start = NowSeconds();
  // A line per tensor on a terminal (carriage return), every tenth of them elsewhere.
  const bool terminal = isatty(fileno(stderr));
  auto progress = [&](size_t done, size_t total, uint64_t bytes) {
    if (!terminal && done % std::max<size_t>(1, total / 10) != 0 && done != total) return;
    const double seconds = NowSeconds() - start;
    std::fprintf(
        stderr, "%squantize: %zu of %zu tensors, %.1f MB written, %.1f MB/s, %.0f s left%s",
        terminal ? "\r" : "", done, total, bytes / 1e6, bytes / 1e6 / std::max(seconds, 1e-9),
        seconds / done * (total - done), terminal && done != total ? "" : "\n");
  };
  Status s;
  if (IsHfInt4(args.to)) {
    Int4ExportOptions options;
    options.type = args.to;
    options.max_shard_bytes = static_cast<uint64_t>(args.max_shard_gb * 1e9);
    options.progress = progress;
    s = ExportInt4Checkpoint(args.model, args.out, options);
  } else {
    GgufExportOptions options;
    options.type = args.to;
    options.kv_b = args.kv_b;
    options.progress = progress;
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
  verb->callback([args] { RunQuantize(*args); });
}

}  // namespace sy
