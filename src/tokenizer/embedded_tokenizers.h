// The tokenizers of the models `init-model` writes, compiled into the binary.
#pragma once

#include <string>

#include "base/status.h"

namespace sy {

// Writes tokenizer.json and tokenizer_config.json for `preset` ("default" or "bench") into
// `directory`.
Status WriteEmbeddedTokenizer(const std::string& preset, const std::string& directory);

}  // namespace sy
