// Writes safetensors files (model/safetensors.h describes the format) and checkpoint
// directories of them. Each tensor's bytes are made only when its file is written, one tensor in
// memory at a time, so a checkpoint of hundreds of GB needs no more than its largest tensor.
// A directory is sharded as transformers' save_pretrained shards it: model.safetensors when
// everything fits one shard, else model-00001-of-0000N.safetensors ... and
// model.safetensors.index.json mapping each tensor to its file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"

namespace sy {

class SafetensorsWriter {
 public:
  // Writes the tensor's bytes (little-endian, elements × DTypeSize) when its file is written.
  using Fill = std::function<Status(uint8_t* bytes)>;
  // After each tensor: (tensors done, of all, bytes written).
  using Progress = std::function<void(size_t, size_t, uint64_t)>;

  // An error names the tensor: a repeated name, a negative dimension, a GGML dtype.
  Status AddTensor(std::string name, DType dtype, std::vector<int64_t> shape, Fill fill);

  // One file holding every tensor, written as `path`.partial and renamed when whole.
  Status WriteFile(const std::string& path, const Progress& progress = {}) const;
  // Shards of at most `max_shard_bytes` of tensor data (a larger tensor gets a shard of its own)
  // and their index, into `directory`, which must exist.
  Status WriteDirectory(const std::string& directory, uint64_t max_shard_bytes,
                        const Progress& progress = {}) const;

  uint64_t data_bytes() const { return data_bytes_; }

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t bytes = 0;
    Fill fill;
  };
  // Writes tensors_[begin, end) as one file; `done`/`written` carry the progress count on.
  Status WriteRange(const std::string& path, size_t begin, size_t end, const Progress& progress,
                    size_t& done, uint64_t& written) const;

  std::vector<Tensor> tensors_;
  std::unordered_set<std::string> names_;
  uint64_t data_bytes_ = 0;
};

}  // namespace sy
