// Helpers shared by the verbs: loading a model and naming a cache dtype.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"

namespace sy {

// Loads the model or fails the verb with the loader's message.
std::unique_ptr<Model> LoadModelOrFail(const std::string& directory);

// "bf16" or "f32".
DType KvDTypeOrFail(const std::string& name);

}  // namespace sy
