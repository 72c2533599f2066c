// switchyard init-model: writes a synthetic (random-weight) model and its tokenizer.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/verbs.h"
#include "model/synthetic.h"
#include "tokenizer/embedded_tokenizers.h"

namespace sy {
namespace {

struct InitModelArgs {
  std::string out;
  uint64_t seed = 0;
  bool bf16 = false;
  std::string preset = "small";
  int mtp_layers = -1;       // -1: the preset's
  int64_t kv_lora_rank = 0;  // 0: the preset's
  int64_t qk_rope_head_dim = 0;
  int64_t index_topk = 0;  // > 0: DeepSeek-V3.2's sparse attention
};

void RunInitModel(const InitModelArgs& args) {
  ModelConfig config = args.preset == "bench" ? BenchModelConfig() : SmallModelConfig();
  if (args.bf16) config.fp8_weights = false;
  if (args.mtp_layers >= 0) config.num_nextn_predict_layers = args.mtp_layers;
  // Other engines' MLA kernels are built for DeepSeek-V3's latent width (vLLM's CPU build: 512 +
  // 64 only), so a side-by-side needs the bench shapes with that latent.
  if (args.kv_lora_rank > 0) config.kv_lora_rank = args.kv_lora_rank;
  if (args.qk_rope_head_dim > 0) config.qk_rope_head_dim = args.qk_rope_head_dim;
  if (args.index_topk > 0) {
    if (!config.q_lora_rank) FailVerb("--index-topk: the indexer needs a q_lora_rank preset");
    // DeepSeek-V3.2's proportions: half as many indexer heads as attention heads (64 of 128),
    // keys a quarter of the latent (128 of 512) — so the indexer costs what it costs there, a
    // seventeenth of dense attention per key.
    config.model_type = "deepseek_v32";
    config.index_topk = args.index_topk;
    config.index_n_heads = std::max<int64_t>(1, config.num_attention_heads / 2);
    config.index_head_dim = std::max<int64_t>(config.qk_rope_head_dim, config.kv_lora_rank / 4);
  }
  SyntheticOptions options;
  options.seed = args.seed;
  Status status = WriteSyntheticCheckpoint(config, args.out, options);
  if (status.ok())
    status = WriteEmbeddedTokenizer(args.preset == "bench" ? "bench" : "default", args.out);
  if (!status.ok()) FailVerb(status.message());
  std::printf("wrote the %s model (%s weights, seed %llu) and its tokenizer to %s\n",
              args.preset.c_str(), config.fp8_weights ? "fp8" : "bf16",
              static_cast<unsigned long long>(args.seed), args.out.c_str());
}

}  // namespace

void AddInitModelVerb(CLI::App& app) {
  auto args = std::make_shared<InitModelArgs>();
  CLI::App* verb = app.add_subcommand(
      "init-model", "Write a synthetic model (random weights), deterministically");
  verb->add_option("--out", args->out, "Directory to write")->required();
  verb->add_option("--seed", args->seed, "Random seed");
  verb->add_flag("--bf16", args->bf16, "Store weights in bf16 instead of fp8 blocks");
  verb->add_option("--preset", args->preset,
                   "small (the tests' model shapes) or bench (about 1 GB, for benchmarks)")
      ->check(CLI::IsMember({"small", "bench"}));
  verb->add_option(
          "--mtp-layers", args->mtp_layers,
          "MTP modules (num_nextn_predict_layers; default: the preset's, 1 small, 0 bench)")
      ->check(CLI::Range(0, 1));
  verb->add_option("--kv-lora-rank", args->kv_lora_rank,
                   "Latent cache width (kv_lora_rank; default: the preset's)")
      ->check(CLI::Range(int64_t{16}, int64_t{4096}));
  verb->add_option("--qk-rope-head-dim", args->qk_rope_head_dim,
                   "Decoupled RoPE width per head (even; default: the preset's)")
      ->check(CLI::Range(int64_t{2}, int64_t{512}));
  verb->add_option("--index-topk", args->index_topk,
                   "DeepSeek-V3.2's sparse attention (model_type deepseek_v32): every layer gets a "
                   "lightning indexer and each query attends to this many keys (V3.2: 2048; "
                   "default: dense MLA)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  verb->callback([args] { RunInitModel(*args); });
}

}  // namespace sy
