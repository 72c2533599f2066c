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
  // An older default without its tokenizer goes; a complete one another process renamed in
  // meanwhile stays (then our rename fails and its copy is used).
  if (!fs::exists(directory + "/tokenizer.json", error)) fs::remove_all(directory, error);
  fs::rename(staging, directory, error);
  if (error && !fs::exists(directory + "/tokenizer.json")) {
    FailVerb(fmt::format("creating the default model: cannot move {} to {}: {}", staging, directory,
                         error.message()));
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

TextCodec LoadTextCodecOrFail(const std::string& directory, const std::string& tokenizer_path) {
  auto codec = TextCodec::Load(directory, tokenizer_path);
  if (!codec.ok()) FailVerb(codec.status().message());
  return std::move(codec).value();
}

}  // namespace sy
