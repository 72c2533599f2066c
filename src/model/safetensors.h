// The safetensors format: an 8-byte little-endian header length, a JSON header mapping tensor
// names to {dtype, shape, data_offsets}, then the raw data. The parser trusts nothing: every
// offset, size and overlap is checked before a tensor's bytes are handed out.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/dtype.h"
#include "tensor/ggml_quants.h"

namespace sy {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // offset within the file, past the header
  uint64_t data_end = 0;
  GgmlType ggml_type = GgmlType::kF32;  // dtype kGgml (GGUF blocks kept as they are)

  int64_t NumElements() const;
};

// Parses and validates the header of a safetensors file held in `bytes`; `source` names the
// file in messages. Entries come back sorted by data offset.
Result<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const uint8_t* bytes, size_t size,
                                                             const std::string& source);

// A tensor inside a mapped checkpoint file.
struct CheckpointTensor {
  const SafetensorsEntry* entry = nullptr;
  const uint8_t* data = nullptr;
  const std::string* file = nullptr;
};

// One tensor to write: raw little-endian bytes of `dtype` with `shape`.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  // dtype kGgml: the blocks' type. Checkpoint::FromMemory also takes bytes it need not copy:
  // `external` (external_bytes long, kept alive by external_owner — a mapped GGUF file) in place
  // of `bytes`.
  GgmlType ggml_type = GgmlType::kF32;
  const uint8_t* external = nullptr;
  size_t external_bytes = 0;
  std::shared_ptr<const void> external_owner;
};

// A checkpoint directory: one model.safetensors, or shards listed by
// model.safetensors.index.json, all memory-mapped.
class Checkpoint {
 public:
  static Result<Checkpoint> Open(const std::string& directory);
  // A checkpoint held in memory, each tensor with the name messages give for where it came from
  // (a GGUF file's tensors dequantized at load: "model.gguf: blk.0.attn_q_a.weight").
  static Checkpoint FromMemory(const std::string& name, std::vector<TensorToWrite> tensors,
                               std::vector<std::string> sources);

  // A multimodal wrapper's checkpoint (ModelConfig::checkpoint_prefix): the language model's
  // tensors are found by their names without `prefix`; those under a `set_aside` prefix (a vision
  // tower) are dropped from the listing. Errors if a name would be there twice.
  Status UseLanguageModel(const std::string& prefix, const std::vector<std::string>& set_aside);
  int64_t set_aside_count() const { return set_aside_count_; }

  // Null when the tensor is absent.
  const CheckpointTensor* Find(const std::string& name) const;
  const std::map<std::string, CheckpointTensor>& tensors() const { return tensors_; }
  const std::string& directory() const { return directory_; }

 private:
  struct Shard {
    std::shared_ptr<MappedFile> file;
    std::vector<SafetensorsEntry> entries;
    // In-memory tensors (FromMemory): their bytes, and per tensor where it came from.
    std::vector<std::vector<uint8_t>> owned;
    std::vector<std::string> sources;
    std::vector<std::shared_ptr<const void>> keep_alive;  // what external tensors point into
  };
  Status AddShard(const std::string& path);

  std::string directory_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::map<std::string, CheckpointTensor> tensors_;
  int64_t set_aside_count_ = 0;
};

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace sy
