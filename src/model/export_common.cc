#include "model/export_common.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "base/thread_pool.h"
#include "tensor/matrix.h"

namespace sy {

Result<nlohmann::ordered_json> ReadJsonObject(const std::string& path, bool required) {
  std::ifstream in(path);
  if (!in) {
    if (!required) return nlohmann::ordered_json();
    return Status::Errorf("{}: cannot open", path);
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Errorf("{}: not a JSON object", path);
  return j;
}

Result<ExportSource> OpenExportSource(const std::string& model_dir) {
  SY_ASSIGN_OR_RETURN(nlohmann::ordered_json raw, ReadJsonObject(model_dir + "/config.json", true));
  SY_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir + "/config.json"));
  if (config.int4.enabled())
    return Status::Errorf("{}: an int4 checkpoint; quantize reads fp8, bf16 and f32 ones",
                          model_dir);
  SY_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(model_dir));
  if (!config.wrapper_type.empty()) {
    // A multimodal wrapper (Kimi K2.5): its language model is what gets written, on its own.
    SY_RETURN_IF_ERROR(
        ckpt.UseLanguageModel(config.checkpoint_prefix, config.checkpoint_set_aside));
    nlohmann::ordered_json text = raw["text_config"];
    if (!text.contains("quantization_config") && raw.contains("quantization_config"))
      text["quantization_config"] = raw["quantization_config"];
    raw = std::move(text);
  }
  return ExportSource{std::move(raw), std::move(config), std::move(ckpt)};
}

Result<std::vector<float>> ReadTensorF32(const Checkpoint& ckpt, const ModelConfig& config,
                                         const std::string& name) {
  const CheckpointTensor* t = ckpt.Find(name);
  if (t == nullptr) return Status::Errorf("{}: tensor '{}' is missing", ckpt.directory(), name);
  const auto& shape = t->entry->shape;
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const int64_t rows = cols == 0 ? 0 : t->entry->NumElements() / cols;
  Matrix m;
  m.dtype = t->entry->dtype;
  m.rows = rows;
  m.cols = cols;
  m.data = t->data;
  std::vector<float> scales;
  if (m.dtype == DType::kF8E4M3) {
    const CheckpointTensor* s = ckpt.Find(name + "_scale_inv");
    if (s == nullptr || s->entry->dtype != DType::kF32 || shape.size() != 2)
      return Status::Errorf("{}: fp8 tensor '{}' needs a 2-D weight and an F32 {}_scale_inv",
                            *t->file, name, name);
    m.block_rows = config.weight_block_rows;
    m.block_cols = config.weight_block_cols;
    m.scale_cols = (cols + m.block_cols - 1) / m.block_cols;
    const int64_t scale_rows = (rows + m.block_rows - 1) / m.block_rows;
    if (s->entry->NumElements() != scale_rows * m.scale_cols)
      return Status::Errorf("{}: '{}_scale_inv' has {} values, not {} x {}", *s->file, name,
                            s->entry->NumElements(), scale_rows, m.scale_cols);
    scales.resize(static_cast<size_t>(scale_rows * m.scale_cols));
    std::memcpy(scales.data(), s->data, scales.size() * sizeof(float));
    m.block_scales = scales.data();
  } else if (m.dtype != DType::kF32 && m.dtype != DType::kBF16 && m.dtype != DType::kF16) {
    return Status::Errorf("{}: tensor '{}' is {}; quantize reads F32, BF16, F16 and F8_E4M3",
                          *t->file, name, DTypeName(m.dtype));
  }
  std::vector<float> out(static_cast<size_t>(rows * cols));
  ThreadPool::Global().ParallelForIf(
      rows * cols >= (1 << 16), static_cast<size_t>(rows), [&](size_t begin, size_t end) {
        for (size_t r = begin; r < end; ++r)
          m.DecodeRow(static_cast<int64_t>(r), out.data() + r * cols);
      });
  return out;
}

}  // namespace sy
