// Helpers shared by the verbs: finding and loading a model, its tokenizer, a cache dtype.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/ngram_drafter.h"
#include "tokenizer/text_codec.h"

namespace CLI {
class App;
}

namespace sy {

// `--model` as given, or — when empty — the embedded default model under the checkout
// (models/default), written deterministically on first use.
std::string ResolveModelDirectory(const std::string& model);

// Loads the model or fails the verb with the loader's message.
std::unique_ptr<Model> LoadModelOrFail(const std::string& directory);

// The latent cache's dtypes as --kv-dtype spells them: "bf16", "f32", and "fp8" (or vLLM's
// "fp8_e4m3"): the latent as scaled e4m3, the rope part bf16 (kernels/cpu/latent_row.h).
inline const std::vector<std::string> kKvDTypeNames = {"bf16", "f32", "fp8", "fp8_e4m3"};
// The same and vLLM's "auto" (the deployed dtype, bf16), for serve's --kv-cache-dtype.
inline std::vector<std::string> KvDTypeNamesWithAuto() {
  std::vector<std::string> names = kKvDTypeNames;
  names.push_back("auto");
  return names;
}
DType KvDTypeOrFail(const std::string& name);

// Loads the tokenizer of `directory` (or the file/directory `tokenizer_path` overrides it with);
// fails the verb with the loader's message.
TextCodec LoadTextCodecOrFail(const std::string& directory, const std::string& tokenizer_path = "");

// --batch-invariant (generate and serve): every step's arithmetic the same for a row whatever
// else is in the batch — f32 products (no bf16 GEMM, no split-K; panel tiles sum in one order for
// any row count) and absorbed attention for prompts too — so a request's tokens and
// log-probabilities are bit-identical alone or among others, and after a recomputation.
void AddBatchInvariantOption(CLI::App* verb, bool& flag);
// Sets the kernels' global options and the step's attention form when `on`.
void ApplyBatchInvariant(bool on, ForwardOptions& options);

// Speculative decoding, for generate, serve and bench mtp: --speculative mtp|ngram
// [--num-speculative-tokens K] [--prompt-lookup-min N --prompt-lookup-max N]
// [--prompt-lookup-drafts by-match|fixed], or vLLM's --speculative-config JSON ({"method":
// "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, ...}).
inline constexpr int64_t kDefaultMtpDrafts = 1, kDefaultNgramDrafts = 4;
struct SpeculativeArgs {
  std::string method;  // "" (off), "mtp" or "ngram"
  std::optional<int64_t> tokens;
  std::optional<int64_t> lookup_min, lookup_max;
  std::string lookup_drafts;  // "" (by-match), "by-match" or "fixed"
  std::string config_json;
};
void AddSpeculativeOptions(CLI::App* verb, SpeculativeArgs& args);
struct Speculation {
  int64_t tokens = 0;  // drafts per step (0: off)
  Drafter drafter = Drafter::kMtp;
  NgramLookup ngram;
};
// What the options ask for, checked: the message names the option or JSON key. `has_mtp`: the
// checkpoint has an MTP module (--speculative mtp needs one).
Result<Speculation> ParseSpeculation(const SpeculativeArgs& args, bool has_mtp);
// ParseSpeculation, failing the verb on an error.
Speculation SpeculationOrFail(const SpeculativeArgs& args, const Model& model);

}  // namespace sy
