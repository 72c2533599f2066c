// Writes GGUF files (model/gguf.h describes the format): version 3, metadata in the order added,
// tensors 32-byte aligned in the order added, each tensor's bytes made only when the file is
// written (one tensor in memory at a time, so a model of hundreds of GB needs no more than its
// largest tensor). The reader in model/gguf.h reads what this writes; llama.cpp does too.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/gguf.h"

namespace sy {

class GgufWriter {
 public:
  static constexpr uint64_t kAlignment = 32;

  void AddString(std::string key, std::string value);
  void AddUint32(std::string key, uint32_t value);
  void AddFloat32(std::string key, float value);
  void AddBool(std::string key, bool value);
  void AddStrings(std::string key, std::vector<std::string> values);
  void AddInt32s(std::string key, std::vector<int32_t> values);

  // A tensor of `type` with `dims` in GGML order (dims[0] the row length); `fill` writes its
  // bytes (whole blocks of the type: GgmlTypeInfo's block_bytes per block_size values) when the
  // file is written. An error names the tensor.
  using Fill = std::function<Status(uint8_t* bytes)>;
  Status AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type, Fill fill);

  // Writes the file; `on_tensor(done, total, bytes_done)` after each tensor, for progress.
  Status Write(const std::string& path,
               const std::function<void(size_t, size_t, uint64_t)>& on_tensor = {}) const;

 private:
  struct Value {
    GgufValueType type;
    uint64_t bits = 0;                               // u32, f32 (its bits) or bool
    GgufValueType element = GgufValueType::kString;  // arrays: strings or ints
    std::string text{};
    std::vector<std::string> strings{};
    std::vector<int32_t> ints{};
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
    uint64_t offset = 0, bytes = 0;
    Fill fill{};
  };
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<Tensor> tensors_;
  uint64_t data_bytes_ = 0;
};

}  // namespace sy
