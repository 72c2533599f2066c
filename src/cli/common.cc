#include "cli/common.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/verbs.h"
#include "model/synthetic.h"
#include "tokenizer/embedded_tokenizers.h"

namespace sy {

void FailVerb(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  throw CLI::RuntimeError(1);
}

std::string ResolveModelDirectory(const std::string& model) {
  if (!model.empty()) return model;
  namespace fs = std::filesystem;
  const std::string directory = SY_DEFAULT_MODEL_DIR;
  std::error_code error;
  if (fs::exists(directory + "/model.safetensors", error) &&
      fs::exists(directory + "/tokenizer.json", error))
    return directory;
  // Build it beside the final place and rename it in, so concurrent first uses (every rank of
  // an mpirun job) never see half a model.
  const std::string staging = fmt::format("{}.staging-{}", directory, ::getpid());
  fs::remove_all(staging, error);
  std::fprintf(stderr, "switchyard: writing the embedded default model to %s\n", directory.c_str());
  Status status = WriteSyntheticCheckpoint(DefaultModelConfig(), staging);
  if (status.ok()) status = WriteEmbeddedTokenizer("default", staging);
  if (!status.ok()) FailVerb("creating the default model: " + status.message());
  fs::remove_all(directory, error);  // an older default without its tokenizer
  fs::rename(staging, directory, error);
  if (error && !fs::exists(directory + "/tokenizer.json")) {
    FailVerb(fmt::format("creating the default model: cannot move {} to {}: {}", staging,
                         directory, error.message()));
  }
  fs::remove_all(staging, error);
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

Result<std::vector<int32_t>> TextCodec::EncodePrompt(const std::string& text) const {
  SY_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(text));
  if (config.add_bos_token && bos_id) ids.insert(ids.begin(), *bos_id);
  return ids;
}

Result<std::vector<int32_t>> TextCodec::EncodeChat(const std::string& user_message) const {
  auto chat = ChatTemplate::Recognize(config.chat_template, config.bos_token);
  if (!chat.ok()) return chat.status().WithContext(config.source);
  nlohmann::json messages = nlohmann::json::array();
  messages.push_back({{"role", "user"}, {"content", user_message}});
  SY_ASSIGN_OR_RETURN(std::string prompt, chat->Render(messages, ChatOptions{}));
  // The template writes BOS itself.
  return tokenizer->Encode(prompt);
}

TextCodec LoadTextCodecOrFail(const std::string& directory, const std::string& tokenizer_path) {
  TextCodec codec;
  auto tokenizer = Tokenizer::Load(tokenizer_path.empty() ? directory : tokenizer_path);
  if (!tokenizer.ok()) FailVerb(tokenizer.status().message());
  codec.tokenizer = std::make_unique<Tokenizer>(std::move(tokenizer).value());
  std::string config_directory = tokenizer_path.empty() ? directory : tokenizer_path;
  if (!std::filesystem::is_directory(config_directory))
    config_directory = std::filesystem::path(config_directory).parent_path().string();
  auto config = LoadTokenizerConfig(config_directory.empty() ? "." : config_directory);
  if (!config.ok()) FailVerb(config.status().message());
  codec.config = std::move(config).value();
  if (!codec.config.bos_token.empty()) codec.bos_id = codec.tokenizer->TokenToId(codec.config.bos_token);
  return codec;
}

}  // namespace sy
