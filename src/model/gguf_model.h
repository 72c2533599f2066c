// A `deepseek2` GGUF (llama.cpp's DeepSeek-V2/V3 files) as a switchyard model.
//
// The config comes from the deepseek2.* metadata the converter writes (block and expert counts,
// expert groups, gating function, lora ranks, MLA key/value lengths, RoPE and YaRN); the weights
// go into an in-memory checkpoint under the Hugging Face names LoadWeights reads, so the rest of
// the engine is unchanged: quantized types with an integer form stay GGML blocks pointing into
// the mapped file (DType::kGgml; packed for the native kernels, kernels/cpu/ggml_gemm.h), F32,
// F16 and BF16 also point into the file as they are, and the other types become float32 (every
// quantized type under GgufWeights::kDequantized). The expert tensors stacked per layer
// (ffn_*_exps, [E, rows, cols]) are cut into experts; attn_k_b (per head, transposed) and attn_v_b
// are joined back into kv_b_proj (float32, for the expanded attention form) and also kept as
// blocks, head by head the absorbed form's matrices; the older fused attn_kv_b is taken as it is.
//
// MTP layers are not in GGUF files (the converter leaves them out), so a GGUF model has none.
// An architecture, tensor or type this code does not know is an error naming it.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/safetensors.h"

namespace sy {

// A GGUF model on disk: one file, or the shards llama.cpp's converter and gguf-split write
// (NAME-00001-of-00009.gguf, ...: split.no, split.count), opened from the first — as the large
// DeepSeek files are published. Metadata is the first shard's; tensors are found in any.
class GgufShards {
 public:
  // Opens `path` and, when it is the first of several shards, the others beside it; a missing or
  // mismatched shard, or a tensor in two shards, is an error naming it.
  static Result<GgufShards> Open(const std::string& path);
  // One already-parsed file.
  static Result<GgufShards> Single(GgufFile file);
  GgufShards(GgufShards&&) = default;
  GgufShards& operator=(GgufShards&&) = default;
  GgufShards(const GgufShards&) = delete;  // the index points into files_

  const GgufFile& first() const { return files_.front(); }
  const std::vector<GgufFile>& files() const { return files_; }
  struct Located {
    const GgufFile* file = nullptr;
    const GgufTensorInfo* tensor = nullptr;
  };
  // {nullptr, nullptr} when no shard has it.
  Located FindTensor(std::string_view name) const;

 private:
  GgufShards() = default;
  Status Index();
  std::vector<GgufFile> files_;
  std::map<std::string_view, Located> index_;
};

// The ModelConfig the metadata describes, validated as config.json would be.
Result<ModelConfig> GgufModelConfig(const GgufShards& shards);
Result<ModelConfig> GgufModelConfig(const GgufFile& file);
// Opens `path` (and its other shards) and reads its config.
Result<ModelConfig> LoadGgufModelConfig(const std::string& path);

// How GGUF weights reach the kernels: quantized types with an integer form (ggml_quants.h: Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K) kept as their blocks (DType::kGgml, the mapped file read in
// place) and multiplied natively (kNative, the default), or every type dequantized to float32 at
// load (kDequantized, `--gguf-dequantize`: exact products, f32's memory). Set before loading.
enum class GgufWeights : uint8_t { kNative, kDequantized };
GgufWeights& GlobalGgufWeights();

// The tensors, dequantized, under Hugging Face names (model.layers.N.self_attn.q_a_proj.weight,
// ...); each tensor's messages name the GGUF file and tensor it came from.
// `keep_expert(layer, expert)`, when given, picks the routed experts this process holds (expert
// parallelism): the others are not decoded at all.
using ExpertFilter = std::function<bool(int64_t layer, int64_t expert)>;
Result<Checkpoint> GgufCheckpoint(const GgufShards& shards, const ModelConfig& config,
                                  const ExpertFilter& keep_expert = {});
Result<Checkpoint> GgufCheckpoint(const GgufFile& file, const ModelConfig& config);

// The GGUF name llama.cpp's converter gives a Hugging Face tensor (the table GgufCheckpoint reads
// the other way): "lm_head.weight" → "output.weight", "model.layers.3.self_attn.q_a_proj.weight"
// → "blk.3.attn_q_a.weight", and the routed experts stacked, "model.layers.3.mlp.experts.
// gate_proj.weight" → "blk.3.ffn_gate_exps.weight". Empty for a name it has none for.
std::string GgufTensorName(const std::string& hf_name);
// A layer or expert number in a tensor name (the N of "blk.N." or "model.layers.N."): up to six
// decimal digits, else -1.
int64_t ParseNameIndex(std::string_view digits);

}  // namespace sy
