// Helpers shared by the verbs: finding and loading a model, its tokenizer, a cache dtype.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "model/model.h"
#include "tokenizer/text_codec.h"

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

}  // namespace sy
