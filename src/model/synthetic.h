// Deterministic synthetic checkpoints (random weights) in the Hugging Face layout: the small
// model the tests run on and benchmark models. (The default model, models/default, is trained:
// tools/train_default_model.py.) Initialization follows the spec's test recipe (§9.2) so that
// routing and attention are far from uniform.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "model/config.h"

namespace sy {

// A small DeepSeek-V3-shaped model (MLA with q_lora, YaRN, a dense first
// layer, 32 routed experts in 4 groups, a shared expert, an MTP module, fp8 128×128 blocks).
ModelConfig SmallModelConfig();

// A larger DeepSeek-V3-shaped model (about 1 GB in fp8, ten times a 100 MB cache) for
// benchmarks that must stream weights from memory, such as the comparison with llama.cpp.
ModelConfig BenchModelConfig();

// DeepSeek-V3's own architecture (configs/deepseek-v3.json), fp8 with 128×128 blocks.
ModelConfig DeepSeekV3Config();

struct SyntheticOptions {
  uint64_t seed = 0;
};

// Writes config.json and model.safetensors into `directory` (created if needed). Weights that
// DeepSeek quantizes are stored fp8-e4m3 with block scales when config.fp8_weights, else bf16.
Status WriteSyntheticCheckpoint(const ModelConfig& config, const std::string& directory,
                                const SyntheticOptions& options = {});

}  // namespace sy
