// Helpers shared by the verbs: finding and loading a model, its tokenizer, a cache dtype.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "model/model.h"
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

// "bf16" or "f32".
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

// --speculative mtp [--num-speculative-tokens K], for generate and serve.
struct SpeculativeArgs {
  std::string method;  // "" (off) or "mtp"
  int64_t tokens = 1;
};
void AddSpeculativeOptions(CLI::App* verb, SpeculativeArgs& args);
// Draft tokens per step (0: off); fails the verb when the checkpoint has no MTP module.
int64_t SpeculativeTokensOrFail(const SpeculativeArgs& args, const Model& model);

}  // namespace sy
