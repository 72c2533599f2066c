// Helpers shared by the verbs: finding and loading a model, its tokenizer, a cache dtype.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace sy {

// `--model` as given, or — when empty — the embedded default model under the checkout
// (models/default), written deterministically on first use.
std::string ResolveModelDirectory(const std::string& model);

// Loads the model or fails the verb with the loader's message.
std::unique_ptr<Model> LoadModelOrFail(const std::string& directory);

// "bf16" or "f32".
DType KvDTypeOrFail(const std::string& name);

// A checkpoint's text interface: tokenizer.json, and tokenizer_config.json's chat template and
// BOS when present.
struct TextCodec {
  std::unique_ptr<Tokenizer> tokenizer;
  TokenizerConfig config;
  std::optional<int32_t> bos_id;
  // Plain text → prompt ids (BOS first when the tokenizer config asks for it).
  Result<std::vector<int32_t>> EncodePrompt(const std::string& text) const;
  // A single user message rendered through the chat template.
  Result<std::vector<int32_t>> EncodeChat(const std::string& user_message) const;
};

// Loads the tokenizer of `directory` (or the file/directory `tokenizer_path` overrides it with);
// fails the verb with the loader's message.
TextCodec LoadTextCodecOrFail(const std::string& directory, const std::string& tokenizer_path = "");

}  // namespace sy
