// What the exporters (model/gguf_export.h, model/int4_export.h) share: a checkpoint's JSON files
// read as written (key order kept), and its tensors decoded to float32.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace sy {

// A checkpoint an exporter reads: config.json as written and parsed, and its tensors. An int4
// checkpoint is refused (the exporters read fp8, bf16 and f32).
struct ExportSource {
  nlohmann::ordered_json raw_config;
  ModelConfig config;
  Checkpoint checkpoint;
};
Result<ExportSource> OpenExportSource(const std::string& model_dir);

// The JSON object in `path`; an empty value when the file is absent and not `required`. Not an
// object, or not JSON: an error naming the file.
Result<nlohmann::ordered_json> ReadJsonObject(const std::string& path, bool required);

// A checkpoint tensor decoded to float32: fp8 times its block's scale (as float32 products, with
// `config`'s block size), bf16, f16 and f32 as they are. Errors name the file and the tensor.
Result<std::vector<float>> ReadTensorF32(const Checkpoint& ckpt, const ModelConfig& config,
                                         const std::string& name);

}  // namespace sy
