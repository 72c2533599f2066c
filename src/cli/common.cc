#include "cli/common.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/verbs.h"
#include "kernels/cpu/fast_linear.h"
#include "model/synthetic.h"
#include "tokenizer/embedded_tokenizers.h"

namespace sy {

void FailVerb(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  throw CLI::RuntimeError(1);
}

std::string ResolveModelDirectory(const std::string& model) {
  if (!model.empty()) return model;
  // The default model is trained (tools/train_default_model.py) and committed with the checkout.
  const std::string directory = SY_DEFAULT_MODEL_DIR;
  std::error_code error;
  if (!std::filesystem::exists(directory + "/model.safetensors", error) ||
      !std::filesystem::exists(directory + "/tokenizer.json", error))
    FailVerb(fmt::format("the default model ({}) is missing from the checkout; pass --model DIR",
                         directory));
  return directory;
}

std::unique_ptr<Model> LoadModelOrFail(const std::string& directory) {
  auto model = Model::Load(directory);
  if (!model.ok()) FailVerb(model.status().message());
  return std::move(model).value();
}

DType KvDTypeOrFail(const std::string& name) {
  if (name == "bf16") return DType::kBF16;
  if (name == "f32") return DType::kF32;
  FailVerb("--kv-dtype must be bf16 or f32, not '" + name + "'");
}

TextCodec LoadTextCodecOrFail(const std::string& directory, const std::string& tokenizer_path) {
  auto codec = TextCodec::Load(directory, tokenizer_path);
  if (!codec.ok()) FailVerb(codec.status().message());
  return std::move(codec).value();
}

void AddBatchInvariantOption(CLI::App* verb, bool& flag) {
  verb->add_flag("--batch-invariant", flag,
                 "Outputs independent of batching and recomputation: products whose rows do not "
                 "depend on the batch (the bf16 dot kernel, or f32 without it) and absorbed "
                 "attention everywhere (slower prefill)");
}

void ApplyBatchInvariant(bool on, ForwardOptions& options) {
  if (!on) return;
  kernels::GlobalKernelOptions().allow_bf16_gemm = false;
  kernels::SplitKEnabled() = false;
  options.attention = AttentionForm::kAbsorbed;
}

void AddSpeculativeOptions(CLI::App* verb, SpeculativeArgs& args) {
  verb->add_option("--speculative", args.method,
                   "Speculative decoding: 'mtp' drafts with the checkpoint's MTP module")
      ->check(CLI::IsMember({"mtp"}));
  verb->add_option("--num-speculative-tokens", args.tokens,
                   "Draft tokens per step (K > 1 chains the one MTP module)")
      ->check(CLI::Range(1, 8));
}

int64_t SpeculativeTokensOrFail(const SpeculativeArgs& args, const Model& model) {
  if (args.method.empty()) return 0;
  if (!model.has_mtp())
    FailVerb("--speculative mtp: the checkpoint has no MTP module (num_nextn_predict_layers is 0)");
  return args.tokens;
}

}  // namespace sy
