#include "cli/common.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
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
  if (name == "bf16" || name == "auto") return DType::kBF16;
  if (name == "f32") return DType::kF32;
  if (name == "fp8" || name == "fp8_e4m3") return DType::kF8E4M3;
  FailVerb("--kv-dtype must be bf16, f32 or fp8, not '" + name + "'");
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
                   "Speculative decoding: 'mtp' drafts with the checkpoint's MTP module, 'ngram' "
                   "looks drafts up in the request's own prompt and output (any checkpoint)")
      ->check(CLI::IsMember({"mtp", "ngram"}));
  verb->add_option("--num-speculative-tokens", args.tokens,
                   fmt::format("Draft tokens per step (mtp: {}, K > 1 chains the one module; "
                               "ngram: {})",
                               kDefaultMtpDrafts, kDefaultNgramDrafts))
      ->check(CLI::Range(1, 8));
  verb->add_option("--prompt-lookup-min", args.lookup_min,
                   fmt::format("--speculative ngram: the shortest suffix n-gram looked up (default "
                               "{}; --prompt-lookup-max when only that is given)",
                               NgramLookup{}.min_n))
      ->check(CLI::Range(1, 64));
  verb->add_option("--prompt-lookup-max", args.lookup_max,
                   fmt::format("--speculative ngram: the longest suffix n-gram looked up, tried "
                               "first (default {}; --prompt-lookup-min when only that is given)",
                               NgramLookup{}.max_n))
      ->check(CLI::Range(1, 64));
  verb->add_option("--prompt-lookup-drafts", args.lookup_drafts,
                   "--speculative ngram: how many drafts a match earns — by-match (the default: "
                   "one for the shortest match, one more per longer token, at most K) or fixed "
                   "(K, as vLLM drafts)")
      ->check(CLI::IsMember({"by-match", "fixed"}));
  verb->add_option("--speculative-config", args.config_json,
                   "vLLM's form, a JSON object: method (mtp, deepseek_mtp or ngram), "
                   "num_speculative_tokens, prompt_lookup_min, prompt_lookup_max");
}

Result<Speculation> ParseSpeculation(const SpeculativeArgs& given, bool has_mtp) {
  SpeculativeArgs args = given;
  if (!args.config_json.empty()) {
    if (!args.method.empty() || args.tokens || args.lookup_min || args.lookup_max)
      return Status::Error(
          "--speculative-config: give it alone, not with --speculative, "
          "--num-speculative-tokens or --prompt-lookup-min/max");
    const auto json = nlohmann::json::parse(args.config_json, nullptr, false);
    if (!json.is_object()) return Status::Error("--speculative-config: not a JSON object");
    auto integer = [](const nlohmann::json& value, const char* key) -> Result<int64_t> {
      if (!value.is_number_integer())
        return Status::Errorf("--speculative-config: {} must be an integer", key);
      return value.get<int64_t>();
    };
    for (const auto& [key, value] : json.items()) {
      if (key == "method" || key == "model") {
        if (!value.is_string())
          return Status::Errorf("--speculative-config: {} must be a string", key);
        const std::string method = value.get<std::string>();
        if (method == "ngram" || method == "[ngram]")
          args.method = "ngram";
        else if (method == "mtp" || method == "deepseek_mtp")
          args.method = "mtp";
        else
          return Status::Errorf(
              "--speculative-config: {} \"{}\" is not supported (mtp, deepseek_mtp or ngram)", key,
              method);
      } else if (key == "num_speculative_tokens") {
        SY_ASSIGN_OR_RETURN(args.tokens, integer(value, "num_speculative_tokens"));
      } else if (key == "prompt_lookup_min") {
        SY_ASSIGN_OR_RETURN(args.lookup_min, integer(value, "prompt_lookup_min"));
      } else if (key == "prompt_lookup_max") {
        SY_ASSIGN_OR_RETURN(args.lookup_max, integer(value, "prompt_lookup_max"));
      } else {
        return Status::Errorf(
            "--speculative-config: \"{}\" is not supported (method, num_speculative_tokens, "
            "prompt_lookup_min, prompt_lookup_max)",
            key);
      }
    }
    if (args.method.empty()) return Status::Error("--speculative-config: no method");
    if (args.tokens && (*args.tokens < 1 || *args.tokens > 8))
      return Status::Errorf("--speculative-config: num_speculative_tokens {} is not in [1, 8]",
                            *args.tokens);
    for (const auto& [name, value] : {std::pair{"prompt_lookup_min", args.lookup_min},
                                      std::pair{"prompt_lookup_max", args.lookup_max}})
      if (value && (*value < 1 || *value > 64))
        return Status::Errorf("--speculative-config: {} {} is not in [1, 64]", name, *value);
  }
  Speculation out;
  if (args.method.empty()) {
    if (args.tokens || args.lookup_min || args.lookup_max || !args.lookup_drafts.empty())
      return Status::Error(
          "--num-speculative-tokens and --prompt-lookup-min/max/drafts need --speculative "
          "mtp|ngram");
    return out;
  }
  if (args.method == "mtp") {
    if (!has_mtp)
      return Status::Error(
          "--speculative mtp: the checkpoint has no MTP module (num_nextn_predict_layers is 0); "
          "--speculative ngram needs none");
    if (args.lookup_min || args.lookup_max || !args.lookup_drafts.empty())
      return Status::Error("--prompt-lookup-min/max/drafts: only for --speculative ngram");
    out.tokens = args.tokens.value_or(kDefaultMtpDrafts);
    return out;
  }
  out.drafter = Drafter::kNgram;
  out.tokens = args.tokens.value_or(kDefaultNgramDrafts);
  // vLLM's rule: one of the two given sets both.
  if (args.lookup_min || args.lookup_max) {
    out.ngram.min_n = args.lookup_min.value_or(*args.lookup_max);
    out.ngram.max_n = args.lookup_max.value_or(*args.lookup_min);
  }
  out.ngram.drafts_by_match = args.lookup_drafts != "fixed";
  if (out.ngram.min_n > out.ngram.max_n)
    return Status::Errorf("prompt lookup: the minimum {} exceeds the maximum {}", out.ngram.min_n,
                          out.ngram.max_n);
  return out;
}

Speculation SpeculationOrFail(const SpeculativeArgs& args, const Model& model) {
  auto speculation = ParseSpeculation(args, model.has_mtp());
  if (!speculation.ok()) FailVerb(speculation.status().message());
  return *speculation;
}

}  // namespace sy
