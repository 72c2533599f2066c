#include "cli/common.h"

#include <cstdio>

#include "cli/verbs.h"

namespace sy {

void FailVerb(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  throw CLI::RuntimeError(1);
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

}  // namespace sy
