// switchyard quantize: a checkpoint directory (fp8, bf16, f32) written as a deepseek2 GGUF in
// Q4_K_M, Q8_0, ... (model/gguf_export.h).
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "base/clock.h"
#include "cli/verbs.h"
#include "model/gguf_export.h"

namespace sy {
namespace {

struct QuantizeArgs {
  std::string model;
  std::string out;
  std::string to = "q4_k_m";
  std::string kv_b = "split";
};

void RunQuantize(const QuantizeArgs& args) {
  if (!std::filesystem::is_directory(args.model))
    FailVerb(args.model + ": not a checkpoint directory (config.json and safetensors)");
  GgufExportOptions options;
  options.type = args.to;
  options.kv_b = args.kv_b;
  const double start = NowSeconds();
  // A line per tensor on a terminal (carriage return), every tenth of them elsewhere.
  const bool terminal = isatty(fileno(stderr));
  options.progress = [&](size_t done, size_t total, uint64_t bytes) {
    if (!terminal && done % std::max<size_t>(1, total / 10) != 0 && done != total) return;
    const double seconds = NowSeconds() - start;
    std::fprintf(
        stderr, "%squantize: %zu of %zu tensors, %.1f MB written, %.1f MB/s, %.0f s left%s",
        terminal ? "\r" : "", done, total, bytes / 1e6, bytes / 1e6 / std::max(seconds, 1e-9),
        seconds / done * (total - done), terminal && done != total ? "" : "\n");
  };
  if (Status s = ExportGguf(args.model, args.out, options); !s.ok()) FailVerb(s.message());
  std::printf("wrote %s (%s) from %s in %.1f s\n", args.out.c_str(), args.to.c_str(),
              args.model.c_str(), NowSeconds() - start);
}

}  // namespace

void AddQuantizeVerb(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* verb = app.add_subcommand(
      "quantize",
      "Write a checkpoint (fp8, bf16, f32) as a llama.cpp deepseek2 GGUF: Q4_K_M, Q8_0...");
  verb->add_option("--model", args->model, "Checkpoint directory")->required();
  verb->add_option("--out", args->out, "GGUF file to write")->required();
  verb->add_option("--to", args->to,
                   "q4_k_m (llama.cpp's choice per tensor), q4_k_mix (Q6_K for every down "
                   "projection and the attention output too), q8_0, bf16, f16, f32")
      ->check(CLI::IsMember({"q4_k_m", "q4_k_mix", "q8_0", "bf16", "f16", "f32"}));
  verb->add_option("--kv-b", args->kv_b,
                   "kv_b_proj as attn_k_b and attn_v_b (split, what llama.cpp writes now), the "
                   "older fused attn_kv_b, or both")
      ->check(CLI::IsMember({"split", "fused", "both"}));
  verb->callback([args] { RunQuantize(*args); });
}

}  // namespace sy
